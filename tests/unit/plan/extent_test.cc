#include "reshard/plan/extent.h"

#include <catch2/catch.hpp>
#include <utility>
#include <vector>

namespace reshard::plan {
namespace {

TEST_CASE("SourceTable interns each file offset once", "[plan]") {
  SourceTable table;
  const uint32_t a = table.Intern(Source{"a.pt", 64, format::DType::kFloat32, 10, nullptr});
  const uint32_t b = table.Intern(Source{"b.pt", 64, format::DType::kFloat32, 10, nullptr});
  CHECK(table.Intern(Source{"a.pt", 64, format::DType::kFloat32, 10, nullptr}) == a);
  CHECK(a != b);
  CHECK(table.sources().size() == 2);
  // The key is (file, offset, dtype): a change in any one of them is another source.
  const uint32_t c = table.Intern(Source{"a.pt", 128, format::DType::kFloat32, 10, nullptr});
  const uint32_t d = table.Intern(Source{"a.pt", 64, format::DType::kBFloat16, 10, nullptr});
  CHECK(c != a);
  CHECK(d != a);
  CHECK(d != c);
  // Named again with more elements, the source spans the longest; fewer changes nothing.
  CHECK(table.Intern(Source{"a.pt", 64, format::DType::kFloat32, 30, nullptr}) == a);
  CHECK(table.Intern(Source{"a.pt", 64, format::DType::kFloat32, 5, nullptr}) == a);
  const std::vector<Source> sources = std::move(table).Release();
  REQUIRE(sources.size() == 4);
  CHECK(sources[a].path == "a.pt");
  CHECK(sources[a].numel == 30);
  CHECK(sources[b].path == "b.pt");
  CHECK(sources[c].data_offset == 128);
  CHECK(sources[d].dtype == format::DType::kBFloat16);
}

TEST_CASE("AppendExtents merges contiguous runs of one source, never across sources", "[plan]") {
  ExtentList list;
  AppendExtents(list, 0, {view::Gather::Source(0, 4)});
  AppendExtents(list, 0, {view::Gather::Source(4, 4)});
  REQUIRE(list.size() == 1);
  CHECK(list[0].gather == view::Gather::Source(0, 8));
  AppendExtents(list, 1, {view::Gather::Source(8, 4)});  // contiguous offsets, other file
  REQUIRE(list.size() == 2);
  AppendZeros(list, 3);
  AppendExtents(list, 1, {view::Gather::Zeros(2)});
  REQUIRE(list.size() == 3);
  CHECK(list[2].gather == view::Gather::Zeros(5));
  AppendZeros(list, 0);
  CHECK(list.size() == 3);
  CHECK(NumElements(list) == 17);
}

}  // namespace
}  // namespace reshard::plan
