// PassthroughContent: a real file served read-only, byte for byte.
//
// Create() opens the file once and records its size (fstat); every Read() is a pread on that
// one descriptor, which the object owns until it is destroyed. Consequences, by design:
// - A file removed or renamed while mounted keeps being served through the open descriptor.
// - A file that grows is served at the size it had at Create(); the extra bytes are not shown.
// - A file that shrinks makes reads of the lost range fail with an IoError naming the path
//   (the server answers EIO); reads before the new end still succeed.
// - A file rewritten in place is served with its new bytes: nothing is cached here.
//
// Thread safety: immutable after Create(); Read() is safe from any number of threads (pread has
// no shared file offset).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>

#include "fs/file_content.h"
#include "reshard/base/unique_fd.h"

namespace reshard::fs {

class PassthroughContent final : public FileContent {
 public:
  // Opens `path` read-only. NotFound if it does not exist, InvalidArgument if it is not a
  // regular file, IoError for other failures; each message names the path.
  static Result<std::shared_ptr<const PassthroughContent>> Create(std::string path);

  PassthroughContent(const PassthroughContent&) = delete;
  PassthroughContent& operator=(const PassthroughContent&) = delete;

  uint64_t size() const override { return size_bytes_; }
  // IoError "<path>: ..." when pread fails or the file ended before the size seen at Create().
  Result<size_t> Read(uint64_t offset, uint8_t* out, size_t length) const override;

  const std::string& path() const { return path_; }

 private:
  PassthroughContent(std::string path, UniqueFd fd, uint64_t size_bytes)
      : path_(std::move(path)), fd_(std::move(fd)), size_bytes_(size_bytes) {}

  const std::string path_;
  const UniqueFd fd_;
  const uint64_t size_bytes_;
};

}  // namespace reshard::fs
