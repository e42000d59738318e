// MappedFile: the bytes of a whole file, read-only, owned by RAII: a private mmap, or for a file
// of at most kReadLimit bytes a heap copy read at Open (cheaper than mapping and unmapping it,
// and no contention on the process's memory-map lock when many small files are indexed at once).
//
// This is the only way reshard/ reads source bytes at mount time: parsing headers and pickles
// touches a few pages of a large file; its tensor bytes are never copied here. Movable, not
// copyable. Reading data() from several threads is safe (the bytes are immutable). If a mapped
// file is truncated after mapping, touching the lost pages raises SIGBUS; fs/ reads tensor bytes
// with pread for that reason, never through this object.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "reshard/base/status.h"

namespace reshard {

class MappedFile {
 public:
  // Larger files are mapped.
  static constexpr uint64_t kReadLimit = 64 * 1024;

  // Opens and maps (or reads) `path`. An empty file maps to an empty span.
  static Result<MappedFile> Open(const std::string& path);
  // The same for `name` inside the folder open as `dir_fd` (AT_FDCWD: the working folder), named
  // `path` in messages and by path(). A folder of many small files is read with one path lookup
  // each, of one component.
  static Result<MappedFile> OpenAt(int dir_fd, const std::string& name, std::string path);

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
  std::unique_ptr<uint8_t[]> owned_;  // the bytes of a read (not mapped) file
};

}  // namespace reshard
