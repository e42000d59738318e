#include "fs/null_content.h"

#include <algorithm>
#include <cstring>
#include <vector>

namespace reshard::fs {
namespace {

// Largest run copied per memcpy; FUSE requests are at most 1 MiB, so one copy per request.
constexpr size_t kChunkBytes = size_t{1} << 20;

// kChunkBytes of pattern plus one period, so any run can start at any phase of the pattern:
// bytes [offset % period, offset % period + kChunkBytes) of the table equal the file's bytes
// [offset, offset + kChunkBytes). Built once, on first use (thread-safe static init).
const uint8_t* PatternTable() {
  static const std::vector<uint8_t> table = [] {
    std::vector<uint8_t> bytes(kChunkBytes + NullContent::kPatternPeriod);
    for (size_t k = 0; k < bytes.size(); ++k) bytes[k] = NullContent::PatternByte(k);
    return bytes;
  }();
  return table.data();
}

}  // namespace

Result<size_t> NullContent::Read(uint64_t offset, uint8_t* out, size_t length) const {
  if (offset >= size_bytes_) return size_t{0};
  const size_t count = std::min<uint64_t>(length, size_bytes_ - offset);
  const uint8_t* table = PatternTable();
  for (size_t done = 0; done < count;) {
    const size_t run = std::min(count - done, kChunkBytes);
    std::memcpy(out + done, table + (offset + done) % kPatternPeriod, run);
    done += run;
  }
  return count;
}

}  // namespace reshard::fs
