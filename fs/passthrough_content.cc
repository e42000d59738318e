#include "fs/passthrough_content.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <string>
#include <utility>

namespace reshard::fs {

Result<std::shared_ptr<const PassthroughContent>> PassthroughContent::Create(std::string path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) {
    const int err = errno;
    if (err == ENOENT) return NotFound(path + ": no such file");
    return ErrnoError(path, err);
  }
  struct stat st {};
  if (::fstat(fd.get(), &st) != 0) {
    const int err = errno;
    return ErrnoError(path, err);
  }
  if (!S_ISREG(st.st_mode)) return InvalidArgument(path + ": not a regular file");
  const auto size_bytes = static_cast<uint64_t>(st.st_size);
  // The constructor is private, so std::make_shared cannot reach it.
  return std::shared_ptr<const PassthroughContent>(
      new PassthroughContent(std::move(path), std::move(fd), size_bytes));
}

Result<size_t> PassthroughContent::Read(uint64_t offset, uint8_t* out, size_t length) const {
  if (offset >= size_bytes_) return size_t{0};
  const size_t count = std::min<uint64_t>(length, size_bytes_ - offset);
  size_t done = 0;
  // pread may return fewer bytes than asked without being at the end (signals, some
  // filesystems), so loop until the count is reached or the file really ends.
  while (done < count) {
    const ssize_t n = ::pread(fd_.get(), out + done, count - done, static_cast<off_t>(offset + done));
    if (n < 0) {
      const int err = errno;
      if (err == EINTR) continue;
      return ErrnoError(path_ + ": pread at offset " + std::to_string(offset + done), err);
    }
    if (n == 0) {
      return IoError(path_ + ": file shrank while served: no bytes at offset " +
                     std::to_string(offset + done) + " of the " + std::to_string(size_bytes_) +
                     " it had when opened");
    }
    done += static_cast<size_t>(n);
  }
  return count;
}

}  // namespace reshard::fs
