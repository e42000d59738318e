#include <catch2/catch.hpp>
#include <chrono>
#include <cstdio>
#include <memory>
#include <string>

#include "fs/progress_meter.h"

namespace reshard::fs {
namespace {

using Clock = ProgressMeter::Clock;
using std::chrono::milliseconds;
using std::chrono::seconds;

// A temporary stream and everything written to it so far.
class CapturedStream {
 public:
  CapturedStream() : file_(std::tmpfile(), &std::fclose) { REQUIRE(file_ != nullptr); }
  std::FILE* get() const { return file_.get(); }
  std::string text() const {
    std::fflush(file_.get());
    std::string out(static_cast<size_t>(std::ftell(file_.get())), '\0');
    std::rewind(file_.get());
    REQUIRE(std::fread(out.data(), 1, out.size(), file_.get()) == out.size());
    return out;
  }

 private:
  std::unique_ptr<std::FILE, decltype(&std::fclose)> file_;
};

constexpr uint64_t kMiB = uint64_t{1} << 20;

TEST_CASE("ProgressMeter::FormatBytes picks the largest binary unit below the value") {
  CHECK(ProgressMeter::FormatBytes(0) == "0 B");
  CHECK(ProgressMeter::FormatBytes(1023) == "1023 B");
  CHECK(ProgressMeter::FormatBytes(1536) == "1.5 KiB");
  CHECK(ProgressMeter::FormatBytes(3.0 * (uint64_t{1} << 30)) == "3.0 GiB");
}

TEST_CASE("ProgressMeter in line mode prints at most every 10 s, then a final line") {
  CapturedStream stream;
  const Clock::time_point t0{};
  ProgressMeter meter("materialize", 100 * kMiB, ProgressMeter::Mode::kLines, stream.get(), t0);
  meter.AdvanceAt(10 * kMiB, t0 + seconds(1));
  CHECK(stream.text().empty());
  meter.AdvanceAt(15 * kMiB, t0 + seconds(10));  // 25 MiB in 10 s: 2.5 MiB/s, 75 MiB left
  meter.AdvanceAt(5 * kMiB, t0 + seconds(12));   // within 10 s of the last line: nothing
  meter.AdvanceAt(70 * kMiB, t0 + seconds(20));  // everything: 5 MiB/s
  meter.FinishAt(t0 + seconds(20));
  CHECK(stream.text() ==
        "materialize: 25.0 MiB of 100.0 MiB (25%), 2.5 MiB/s, ETA 30s\n"
        "materialize: 100.0 MiB of 100.0 MiB (100%), 5.0 MiB/s, ETA 0s\n"
        "materialize: 100.0 MiB in 20s (5.0 MiB/s)\n");
}

TEST_CASE("ProgressMeter on a terminal redraws one line in place and ends it") {
  CapturedStream stream;
  const Clock::time_point t0{};
  ProgressMeter meter("materialize", 4 * kMiB, ProgressMeter::Mode::kTerminal, stream.get(), t0);
  meter.AdvanceAt(kMiB, t0 + milliseconds(100));  // before the first 200 ms: nothing
  meter.AdvanceAt(kMiB, t0 + seconds(2));
  meter.AdvanceAt(2 * kMiB, t0 + seconds(125));
  meter.FinishAt(t0 + seconds(125));
  CHECK(stream.text() ==
        "\rmaterialize: 2.0 MiB of 4.0 MiB (50%), 1.0 MiB/s, ETA 2s\033[K"
        "\rmaterialize: 4.0 MiB of 4.0 MiB (100%), 32.8 KiB/s, ETA 0s\033[K"
        "\rmaterialize: 4.0 MiB in 2m05s (32.8 KiB/s)\033[K\n");
}

TEST_CASE("ProgressMeter in quiet mode prints nothing") {
  CapturedStream stream;
  ProgressMeter meter("materialize", kMiB, ProgressMeter::ModeFor(true, stream.get()), stream.get());
  meter.AdvanceAt(kMiB, Clock::now() + seconds(60));
  meter.Finish();
  CHECK(stream.text().empty());
}

TEST_CASE("ProgressMeter::ModeFor prints lines to a stream that is not a terminal") {
  CapturedStream stream;
  CHECK(ProgressMeter::ModeFor(false, stream.get()) == ProgressMeter::Mode::kLines);
}

}  // namespace
}  // namespace reshard::fs
