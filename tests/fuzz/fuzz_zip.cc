// libFuzzer harness: the zip directory reader (format/zip_reader.h) on arbitrary bytes, then every record it
// returns is checked against the buffer the way TorchArchive uses them (its data must lie inside the input).
#include <cstddef>
#include <cstdint>
#include <cstdlib>

#include "reshard/format/zip_reader.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto records = reshard::format::ReadZipDirectory(data, size);
  if (!records.ok()) return 0;
  for (const reshard::format::ZipRecord& record : *records) {
    // The reader's contract: an accepted record's data lies inside the buffer.
    if (record.data_offset > size || record.size > size - record.data_offset) std::abort();
  }
  return 0;
}
