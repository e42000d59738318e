#include "reshard/plan/extent.h"

#include <catch2/catch.hpp>

namespace reshard::plan {
namespace {

TEST_CASE("SourceTable interns each file offset once", "[plan]") {
  SourceTable table;
  const uint32_t a = table.Intern(Source{"a.pt", 64, format::DType::kFloat32, 10, nullptr});
  const uint32_t b = table.Intern(Source{"b.pt", 64, format::DType::kFloat32, 10, nullptr});
  CHECK(table.Intern(Source{"a.pt", 64, format::DType::kFloat32, 10, nullptr}) == a);
  CHECK(a != b);
  CHECK(table.sources().size() == 2);
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
