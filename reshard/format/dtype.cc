#include "reshard/format/dtype.h"

#include <array>

namespace reshard::format {
namespace {

// Storage class names follow torch/storage.py's _dtype_to_storage_type_map; the dtypes without
// one (uint16/32/64, complex32, float8_*) are the "new" dtypes that torch pickles through
// _rebuild_tensor_v3 with an UntypedStorage. safetensors codes follow its Dtype enum.
constexpr std::array<DTypeInfo, 21> kTable = {{
    {DType::kFloat64, 8, "float64", "DoubleStorage", "F64"},
    {DType::kFloat32, 4, "float32", "FloatStorage", "F32"},
    {DType::kFloat16, 2, "float16", "HalfStorage", "F16"},
    {DType::kBFloat16, 2, "bfloat16", "BFloat16Storage", "BF16"},
    {DType::kInt64, 8, "int64", "LongStorage", "I64"},
    {DType::kInt32, 4, "int32", "IntStorage", "I32"},
    {DType::kInt16, 2, "int16", "ShortStorage", "I16"},
    {DType::kInt8, 1, "int8", "CharStorage", "I8"},
    {DType::kUInt8, 1, "uint8", "ByteStorage", "U8"},
    {DType::kBool, 1, "bool", "BoolStorage", "BOOL"},
    {DType::kComplex128, 16, "complex128", "ComplexDoubleStorage", ""},
    {DType::kComplex64, 8, "complex64", "ComplexFloatStorage", "C64"},
    {DType::kComplex32, 4, "complex32", "", ""},
    {DType::kUInt16, 2, "uint16", "", "U16"},
    {DType::kUInt32, 4, "uint32", "", "U32"},
    {DType::kUInt64, 8, "uint64", "", "U64"},
    {DType::kFloat8E4M3FN, 1, "float8_e4m3fn", "", "F8_E4M3"},
    {DType::kFloat8E5M2, 1, "float8_e5m2", "", "F8_E5M2"},
    {DType::kFloat8E4M3FNUZ, 1, "float8_e4m3fnuz", "", "F8_E4M3FNUZ"},
    {DType::kFloat8E5M2FNUZ, 1, "float8_e5m2fnuz", "", "F8_E5M2FNUZ"},
    {DType::kFloat8E8M0FNU, 1, "float8_e8m0fnu", "", "F8_E8M0"},
}};

template <typename Field>
std::optional<DType> Find(std::string_view name, Field field) {
  if (name.empty()) return std::nullopt;
  for (const DTypeInfo& row : kTable) {
    if (row.*field == name) return row.dtype;
  }
  return std::nullopt;
}

}  // namespace

const DTypeInfo& Info(DType dtype) { return kTable[static_cast<size_t>(dtype)]; }

std::optional<DType> DTypeFromStorageClass(std::string_view s) {
  return Find(s, &DTypeInfo::storage_class);
}
std::optional<DType> DTypeFromTorchName(std::string_view s) { return Find(s, &DTypeInfo::torch_name); }
std::optional<DType> DTypeFromSafetensors(std::string_view s) {
  return Find(s, &DTypeInfo::safetensors);
}

}  // namespace reshard::format
