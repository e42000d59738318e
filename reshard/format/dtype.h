// DType: every element type torch.save can write, with its names in each format.
//
// One table maps a dtype to its item size, its torch name ("bfloat16"), the storage class the
// pickle names for it (legacy typed storages, e.g. torch.BFloat16Storage, for the dtypes of
// _rebuild_tensor_v2; torch.UntypedStorage plus a torch.<dtype> GLOBAL for the "new" dtypes of
// _rebuild_tensor_v3), and its safetensors code ("BF16"). Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string_view>

namespace reshard::format {

enum class DType : uint8_t {
  kFloat64,
  kFloat32,
  kFloat16,
  kBFloat16,
  kInt64,
  kInt32,
  kInt16,
  kInt8,
  kUInt8,
  kBool,
  kComplex128,
  kComplex64,
  kComplex32,
  kUInt16,
  kUInt32,
  kUInt64,
  kFloat8E4M3FN,
  kFloat8E5M2,
  kFloat8E4M3FNUZ,
  kFloat8E5M2FNUZ,
  kFloat8E8M0FNU,
};

struct DTypeInfo {
  DType dtype;
  uint32_t itemsize;                 // bytes per element
  std::string_view torch_name;       // "float32": the attribute of the torch module
  std::string_view storage_class;    // "FloatStorage", or "" for dtypes saved via _rebuild_tensor_v3
  std::string_view safetensors;      // "F32", or "" when safetensors has no code for it
};

// The table row of `dtype` (always defined).
const DTypeInfo& Info(DType dtype);
inline uint32_t ItemSize(DType dtype) { return Info(dtype).itemsize; }
inline std::string_view TorchName(DType dtype) { return Info(dtype).torch_name; }

// Lookups by name; std::nullopt for an unknown name.
std::optional<DType> DTypeFromStorageClass(std::string_view storage_class);  // "HalfStorage"
std::optional<DType> DTypeFromTorchName(std::string_view torch_name);        // "float16"
std::optional<DType> DTypeFromSafetensors(std::string_view code);            // "F16"

}  // namespace reshard::format
