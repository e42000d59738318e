#include "reshard/view/gather.h"

#include <catch2/catch.hpp>
#include <random>

namespace reshard::view {
namespace {

// Expands a list into the source element index of every destination element (-1 for zeros).
std::vector<int64_t> Expand(const GatherList& list) {
  std::vector<int64_t> out;
  ForEachRun(list, [&](uint64_t, uint64_t src, uint64_t n, bool zero) {
    for (uint64_t k = 0; k < n; ++k) out.push_back(zero ? -1 : static_cast<int64_t>(src + k));
  });
  return out;
}

TEST_CASE("AppendGather merges contiguous runs, rows of one stride, and zeros", "[view]") {
  GatherList list;
  AppendGather(list, Gather::Source(0, 4));
  AppendGather(list, Gather::Source(4, 4));
  REQUIRE(list.size() == 1);
  CHECK(list[0] == Gather::Source(0, 8));
  AppendGather(list, Gather::Source(16, 8));  // starts a stride-16 gather of 8-element rows
  AppendGather(list, Gather::Source(32, 8));
  REQUIRE(list.size() == 1);
  CHECK(list[0] == Gather::Source(0, 8, 3, 16));
  AppendGather(list, Gather::Zeros(3));
  AppendGather(list, Gather::Zeros(2));
  AppendGather(list, Gather::Zeros(0));
  REQUIRE(list.size() == 2);
  CHECK(list[1] == Gather::Zeros(5));
  CHECK(NumElements(list) == 29);
}

TEST_CASE("Slice equals the same range of the expanded list, for random lists and ranges", "[view]") {
  std::mt19937_64 rng(42);
  for (int trial = 0; trial < 200; ++trial) {
    GatherList list;
    const int pieces = 1 + static_cast<int>(rng() % 5);
    for (int p = 0; p < pieces; ++p) {
      const uint64_t row = 1 + rng() % 6, rows = 1 + rng() % 4;
      if (rng() % 4 == 0) {
        list.push_back(Gather::Zeros(row * rows));
      } else {
        list.push_back(Gather::Source(rng() % 50, row, rows, row + rng() % 5));
      }
    }
    const std::vector<int64_t> all = Expand(list);
    const uint64_t offset = rng() % (all.size() + 1);
    const uint64_t length = rng() % (all.size() - offset + 1);
    auto sliced = Slice(list, offset, length);
    REQUIRE(sliced.ok());
    const std::vector<int64_t> expected(all.begin() + static_cast<int64_t>(offset),
                                        all.begin() + static_cast<int64_t>(offset + length));
    REQUIRE(Expand(*sliced) == expected);
  }
}

TEST_CASE("Slice refuses ranges past the end", "[view]") {
  const GatherList list = {Gather::Source(0, 4, 2, 8)};
  CHECK(Slice(list, 0, 8).ok());
  CHECK(Slice(list, 8, 0).ok());
  auto bad = Slice(list, 5, 4);
  REQUIRE_FALSE(bad.ok());
  CHECK(bad.status().code() == StatusCode::kOutOfRange);
  CHECK_FALSE(Slice(list, 9, 0).ok());
}

}  // namespace
}  // namespace reshard::view
