// ParseSafetensorsHeader: a safetensors file's header, read and checked against the file size.
//
// The layout is in safetensors_writer.h. This reader checks what the safetensors readers check
// before they hand out a tensor: the length prefix and the header lie inside the file and the
// header is at most 100,000,000 bytes; the header is a JSON object whose "__metadata__" (if any)
// maps strings to strings and whose other members each hold a known "dtype", a "shape" of
// non-negative integers and "data_offsets" [begin, end) with end - begin == numel * itemsize;
// sorted by begin, the tensors tile the byte buffer with no hole or overlap, and the file ends
// exactly where the buffer does. Tensor data is never read.
//
// Thread safety: a pure function. Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"

namespace reshard::format {

struct SafetensorsEntry {
  std::string name;
  DType dtype = DType::kFloat32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // [begin, end) relative to the byte buffer
  uint64_t end = 0;
};

struct SafetensorsHeader {
  uint64_t data_start = 0;  // 8 + header length: absolute offset of the byte buffer
  std::vector<SafetensorsEntry> tensors;  // in data order
};

// `prefix` holds at least the file's first 8 + header-length bytes (more is ignored);
// `file_size` is the whole file's size. Errors: kCorrupt with what is wrong (and the tensor's
// name where one is at fault).
Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size);

// The header length the 8-byte prefix of a safetensors file announces (little endian), or
// kCorrupt when the prefix is shorter than 8 bytes.
Result<uint64_t> SafetensorsHeaderLength(std::string_view prefix);

}  // namespace reshard::format
