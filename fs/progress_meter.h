// Progress of a long command over a known number of bytes, written to a stream (stderr):
//   kTerminal  one line redrawn in place ("\r"): bytes done of the total, percent, rate, ETA;
//              at most every 200 ms, and a final line with a newline
//   kLines     a plain line at most every 10 s (logs, pipes, CI), and the final line
//   kQuiet     nothing
// The caller reports bytes as they are done; the meter only looks at the clock when it might
// print. Not thread-safe: one command's loop drives it.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>

namespace reshard::fs {

class ProgressMeter {
 public:
  enum class Mode { kQuiet, kTerminal, kLines };
  using Clock = std::chrono::steady_clock;

  // kQuiet when `quiet`, else kTerminal when `stream` is a terminal, else kLines.
  static Mode ModeFor(bool quiet, std::FILE* stream);

  // `what` starts every line ("materialize"); `total_bytes` is what Advance will add up to.
  // `stream` must outlive the meter.
  ProgressMeter(std::string what, uint64_t total_bytes, Mode mode, std::FILE* stream,
                Clock::time_point start = Clock::now());

  // `bytes` more are done (at `now`).
  void Advance(uint64_t bytes) { AdvanceAt(bytes, Clock::now()); }
  void AdvanceAt(uint64_t bytes, Clock::time_point now);

  // The final line: everything done, total time and mean rate. Call once, after the last Advance.
  void Finish() { FinishAt(Clock::now()); }
  void FinishAt(Clock::time_point now);

  // "1.5 GiB", "512 B": the unit the display uses.
  static std::string FormatBytes(double bytes);

 private:
  void Print(Clock::time_point now, bool final_line);

  std::string what_;
  uint64_t total_;
  uint64_t done_ = 0;
  Mode mode_;
  std::FILE* stream_;
  Clock::time_point start_;
  Clock::time_point next_print_;
};

}  // namespace reshard::fs
