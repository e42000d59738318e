#include "reshard/base/status.h"

#include <catch2/catch.hpp>

#include "reshard/base/checked_math.h"

namespace reshard {
namespace {

Result<int> Half(int v) {
  if (v % 2 != 0) return InvalidArgument("odd value " + std::to_string(v));
  return v / 2;
}

Result<int> Quarter(int v) {
  RS_ASSIGN_OR_RETURN(int h, Half(v));
  RS_ASSIGN_OR_RETURN(int q, Half(h));
  return q;
}

TEST_CASE("Status: OK carries no message, errors carry code and annotated message", "[base]") {
  Status ok;
  CHECK(ok.ok());
  CHECK(ok.ToString() == "ok");
  Status err = Corrupt("bad magic");
  CHECK_FALSE(err.ok());
  CHECK(err.code() == StatusCode::kCorrupt);
  err.Annotate("file.pt");
  CHECK(err.message() == "file.pt: bad magic");
  CHECK(err.ToString() == "corrupt: file.pt: bad magic");
}

TEST_CASE("Result: values and errors propagate through RS_ASSIGN_OR_RETURN", "[base]") {
  REQUIRE(Quarter(8).ok());
  CHECK(*Quarter(8) == 2);
  Result<int> r = Quarter(6);
  REQUIRE_FALSE(r.ok());
  CHECK(r.status().message() == "odd value 3");
  Result<int> from_ok_status = Status();
  CHECK(from_ok_status.status().code() == StatusCode::kInternal);
}

TEST_CASE("checked math: overflow is detected, not wrapped", "[base]") {
  CHECK(CheckedAdd(1, 2) == 3u);
  CHECK_FALSE(CheckedAdd(UINT64_MAX, 1).has_value());
  CHECK_FALSE(CheckedMul(uint64_t{1} << 33, uint64_t{1} << 31).has_value());
  CHECK(RangeFits(10, 0, 10));
  CHECK_FALSE(RangeFits(11, 0, 10));
  CHECK_FALSE(RangeFits(5, UINT64_MAX, 10));
  CHECK(CheckedAlignUp(65, 64) == 128u);
  CHECK(CheckedAlignUp(128, 64) == 128u);
  CHECK_FALSE(CheckedAlignUp(UINT64_MAX, 64).has_value());
}

}  // namespace
}  // namespace reshard
