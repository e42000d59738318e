// NullContent: a file of a fixed pattern that costs nothing to produce.
//
// Used by `reshardfs serve-null` to measure the FUSE transport alone: Read() copies from one
// static, precomputed buffer, so a read costs one memcpy into the server's reply buffer and
// nothing else. That is the ceiling a computed file is measured against.
//
// Byte k of every NullContent is PatternByte(k) = k % 251. The period is prime, so it does not
// line up with pages or request sizes and a read served from the wrong offset shows.
//
// Immutable; Read() is safe from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>

#include "fs/file_content.h"

namespace reshard::fs {

class NullContent final : public FileContent {
 public:
  static constexpr uint64_t kPatternPeriod = 251;
  static constexpr uint8_t PatternByte(uint64_t offset) {
    return static_cast<uint8_t>(offset % kPatternPeriod);
  }

  explicit NullContent(uint64_t size_bytes) : size_bytes_(size_bytes) {}

  uint64_t size() const override { return size_bytes_; }
  // Never fails.
  Result<size_t> Read(uint64_t offset, uint8_t* out, size_t length) const override;

 private:
  const uint64_t size_bytes_;
};

}  // namespace reshard::fs
