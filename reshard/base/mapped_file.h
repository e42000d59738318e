// MappedFile: a read-only, private mmap of a whole file, owned by RAII.
//
// The mapping is the only way reshard/ reads source bytes at mount time: parsing headers and
// pickles touches a few pages; tensor bytes are never copied here. Movable, not copyable.
// Reading bytes() from several threads is safe (the mapping is immutable). If the file is
// truncated after mapping, touching the lost pages raises SIGBUS; fs/ reads tensor bytes with
// pread for that reason, never through this mapping.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "reshard/base/status.h"

namespace reshard {

class MappedFile {
 public:
  // Opens and maps `path`. An empty file maps to an empty span.
  static Result<MappedFile> Open(const std::string& path);

  MappedFile() = default;
  ~MappedFile();
  MappedFile(MappedFile&& other) noexcept;
  MappedFile& operator=(MappedFile&& other) noexcept;
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  void Reset();

  const uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  std::string path_;
};

}  // namespace reshard
