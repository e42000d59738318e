#include "reshard/base/parallel_for.h"

#include <atomic>
#include <catch2/catch.hpp>
#include <vector>

namespace reshard {
namespace {

TEST_CASE("ParallelFor: runs every index once", "[base][parallel_for]") {
  for (const size_t threads : {size_t{1}, size_t{2}, size_t{7}}) {
    std::vector<std::atomic<int>> runs(1000);
    REQUIRE(ParallelFor(runs.size(), [&](size_t i) { ++runs[i]; return Status::Ok(); }, threads).ok());
    for (const auto& r : runs) CHECK(r.load() == 1);
  }
  CHECK(ParallelFor(0, [](size_t) { return Internal("never called"); }).ok());
}

TEST_CASE("ParallelFor: returns the error of the lowest failing index, as a sequential loop would", "[base][parallel_for]") {
  for (int trial = 0; trial < 50; ++trial) {
    std::atomic<size_t> calls{0};
    const Status s = ParallelFor(
        10000,
        [&](size_t i) {
          ++calls;
          if (i == 5000 || i == 5001 || i == 9000) return Corrupt("index " + std::to_string(i));
          return Status::Ok();
        },
        4);
    REQUIRE_FALSE(s.ok());
    CHECK(s.message() == "index 5000");
    CHECK(calls.load() < 10000);  // stops claiming work after an error
  }
}

}  // namespace
}  // namespace reshard
