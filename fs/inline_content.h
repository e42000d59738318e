// InlineContent: a served file whose bytes are held in memory (e.g. the checkpoint's `latest`).
//
// Owns a copy of its bytes; immutable, so Read() is safe from any number of threads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <utility>

#include "fs/file_content.h"

namespace reshard::fs {

class InlineContent final : public FileContent {
 public:
  explicit InlineContent(std::string bytes) : bytes_(std::move(bytes)) {}

  uint64_t size() const override { return bytes_.size(); }
  // Never fails.
  Result<size_t> Read(uint64_t offset, uint8_t* out, size_t length) const override;

 private:
  const std::string bytes_;
};

}  // namespace reshard::fs
