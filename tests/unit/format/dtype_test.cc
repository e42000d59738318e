#include "reshard/format/dtype.h"

#include <catch2/catch.hpp>

namespace reshard::format {
namespace {

TEST_CASE("dtype table rows are indexed by their enum and names round-trip", "[format]") {
  for (int k = 0; k <= static_cast<int>(DType::kFloat8E8M0FNU); ++k) {
    const auto dtype = static_cast<DType>(k);
    const DTypeInfo& info = Info(dtype);
    CHECK(info.dtype == dtype);
    CHECK(info.itemsize > 0);
    CHECK(DTypeFromTorchName(info.torch_name) == dtype);
    if (!info.storage_class.empty()) CHECK(DTypeFromStorageClass(info.storage_class) == dtype);
    if (!info.safetensors.empty()) CHECK(DTypeFromSafetensors(info.safetensors) == dtype);
  }
  CHECK(DTypeFromStorageClass("BFloat16Storage") == DType::kBFloat16);
  CHECK(ItemSize(DType::kBFloat16) == 2);
  CHECK_FALSE(DTypeFromStorageClass("NoSuchStorage").has_value());
  CHECK_FALSE(DTypeFromStorageClass("").has_value());
}

}  // namespace
}  // namespace reshard::format
