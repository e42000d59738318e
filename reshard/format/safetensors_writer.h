// safetensors_writer: the byte layout of a safetensors file, planned without tensor data.
//
// A safetensors file is
//
//   +0      u64 LE  N: header length in bytes
//   +8      N bytes: UTF-8 JSON header, padded with trailing spaces (0x20) so that N % 8 == 0
//   +8+N    the byte buffer: every tensor's data, row-major little-endian, back to back
//
// with the header
//
//   {"__metadata__":{"format":"pt"},"b":{"dtype":"F32","shape":[2,3],"data_offsets":[0,24]},...}
//
// where data_offsets are [begin, end) relative to the byte buffer. Readers require the offsets
// to tile the buffer with no holes or overlaps, end - begin == numel * itemsize, and the file to
// end exactly at the last end (torch_format.md §8). Nothing depends on tensor values, so the
// whole layout is known at mount time.
//
// LayoutSafetensors() writes what the official writer (huggingface/safetensors `prepare` +
// serde_json) writes for the same tensors and metadata: tensors ordered by dtype rank descending
// (the order of the safetensors Dtype enum: U64, I64, F64, C64, F32, U32, I32, BF16, F16, U16,
// I16, F8_E5M2FNUZ, F8_E4M3FNUZ, F8_E8M0, F8_E4M3, F8_E5M2, I8, U8, BOOL), then by name
// (byte-wise); compact JSON with "__metadata__" first (its keys sorted, because a std::map
// iterates that way), then the tensors in data order, each as dtype, shape, data_offsets; JSON
// escaping as serde_json does it; trailing-space padding to a multiple of 8. Since every dtype's
// item size divides 8 and larger dtypes come first, each tensor starts naturally aligned.
//
// Thread safety: a pure function; the result owns everything it refers to. Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/view/virtual_file.h"

namespace reshard::format {

struct SafetensorsTensor {
  std::string name;            // UTF-8, non-empty, not "__metadata__"
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;  // elements per dimension, each >= 0; {} is a 0-d tensor
};

struct SafetensorsLayout {
  uint64_t file_size = 0;    // == file.size()
  uint64_t header_size = 0;  // N: JSON plus padding, a multiple of 8
  uint64_t data_start = 0;   // 8 + N: absolute offset of the byte buffer
  // Per input tensor index: absolute offset of its first data byte, and its size in bytes.
  std::vector<uint64_t> data_offsets;
  std::vector<uint64_t> byte_sizes;
  // Input tensor indices in the order their data appears in the file.
  std::vector<uint32_t> file_order;
  // The file: one kInline segment (blob 0: the length prefix and the header), then one kData
  // segment per non-empty tensor, in file order, with index = the INPUT index of the tensor and
  // source offsets [0, byte size), so callers supply bytes by their own indices.
  view::VirtualFile file;
};

// Plans the safetensors file of `tensors` with the string map `metadata` as "__metadata__"
// (omitted entirely when `metadata` is empty). Errors:
//   kUnsupported: a dtype without a safetensors code (complex128, complex32);
//   kInvalidArgument: an empty, reserved ("__metadata__") or duplicate name; a name, metadata
//     key or value that is not valid UTF-8; a negative dimension; numel * itemsize or the total
//     past UINT64_MAX; more than 2^32 - 1 tensors; a header above the 100,000,000 bytes that
//     safetensors readers accept.
Result<SafetensorsLayout> LayoutSafetensors(
    const std::vector<SafetensorsTensor>& tensors,
    const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

}  // namespace reshard::format
