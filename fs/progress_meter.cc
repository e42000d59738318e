#include "fs/progress_meter.h"

#include <unistd.h>

#include <array>
#include <cmath>
#include <utility>

namespace reshard::fs {
namespace {

constexpr std::chrono::milliseconds kTerminalInterval{200};
constexpr std::chrono::seconds kLinesInterval{10};

double Seconds(ProgressMeter::Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string FormatDuration(double seconds) {
  const long s = std::lround(seconds);
  char text[32];
  if (s >= 3600) {
    std::snprintf(text, sizeof(text), "%ldh%02ldm", s / 3600, s / 60 % 60);
  } else if (s >= 60) {
    std::snprintf(text, sizeof(text), "%ldm%02lds", s / 60, s % 60);
  } else {
    std::snprintf(text, sizeof(text), "%lds", s);
  }
  return text;
}

}  // namespace

ProgressMeter::Mode ProgressMeter::ModeFor(bool quiet, std::FILE* stream) {
  if (quiet) return Mode::kQuiet;
  return ::isatty(::fileno(stream)) ? Mode::kTerminal : Mode::kLines;
}

ProgressMeter::ProgressMeter(std::string what, uint64_t total_bytes, Mode mode, std::FILE* stream,
                             Clock::time_point start)
    : what_(std::move(what)),
      total_(total_bytes),
      mode_(mode),
      stream_(stream),
      start_(start),
      next_print_(start + (mode == Mode::kTerminal ? Clock::duration(kTerminalInterval) : kLinesInterval)) {}

std::string ProgressMeter::FormatBytes(double bytes) {
  static constexpr std::array<const char*, 6> kUnits = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  size_t unit = 0;
  while (bytes >= 1024 && unit + 1 < kUnits.size()) {
    bytes /= 1024;
    ++unit;
  }
  char text[32];
  std::snprintf(text, sizeof(text), unit == 0 ? "%.0f %s" : "%.1f %s", bytes, kUnits[unit]);
  return text;
}

void ProgressMeter::AdvanceAt(uint64_t bytes, Clock::time_point now) {
  done_ += bytes;
  if (mode_ == Mode::kQuiet || now < next_print_) return;
  Print(now, false);
  next_print_ = now + (mode_ == Mode::kTerminal ? Clock::duration(kTerminalInterval) : kLinesInterval);
}

void ProgressMeter::FinishAt(Clock::time_point now) {
  if (mode_ != Mode::kQuiet) Print(now, true);
}

void ProgressMeter::Print(Clock::time_point now, bool final_line) {
  const double elapsed = Seconds(now - start_);
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0;
  std::string line = what_ + ": " + FormatBytes(static_cast<double>(done_));
  if (final_line) {
    line += " in " + FormatDuration(elapsed);
    if (rate > 0) line += " (" + FormatBytes(rate) + "/s)";
  } else {
    const double percent = total_ > 0 ? 100.0 * static_cast<double>(done_) / static_cast<double>(total_) : 100.0;
    char part[32];
    std::snprintf(part, sizeof(part), " (%.0f%%)", std::floor(percent));
    line += " of " + FormatBytes(static_cast<double>(total_)) + part;
    if (rate > 0) {
      line += ", " + FormatBytes(rate) + "/s, ETA " +
              FormatDuration(static_cast<double>(total_ > done_ ? total_ - done_ : 0) / rate);
    }
  }
  if (mode_ == Mode::kTerminal) {
    // "\033[K" clears what a longer previous line left to the right.
    std::fprintf(stream_, "\r%s\033[K%s", line.c_str(), final_line ? "\n" : "");
  } else {
    std::fprintf(stream_, "%s\n", line.c_str());
  }
  std::fflush(stream_);
}

}  // namespace reshard::fs
