// libFuzzer harness: the safetensors header reader (format/safetensors_reader.h) on arbitrary bytes taken as a
// whole file, then its contract checked: an accepted header's tensors tile the byte buffer, which ends where the
// file does, and each holds exactly numel * itemsize bytes.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "reshard/format/safetensors_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view file(reinterpret_cast<const char*>(data), size);
  auto header = reshard::format::ParseSafetensorsHeader(file, size);
  if (!header.ok()) return 0;
  if (header->data_start > size) std::abort();
  uint64_t covered = 0;
  for (const reshard::format::SafetensorsEntry& t : header->tensors) {
    if (t.begin != covered || t.end < t.begin) std::abort();
    uint64_t numel = 1;
    for (const int64_t d : t.shape) numel *= static_cast<uint64_t>(d);
    if (t.end - t.begin != numel * reshard::format::ItemSize(t.dtype)) std::abort();
    covered = t.end;
  }
  if (covered != size - header->data_start) std::abort();
  return 0;
}
