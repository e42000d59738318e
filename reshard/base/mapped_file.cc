#include "reshard/base/mapped_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <utility>

namespace reshard {

Result<MappedFile> MappedFile::Open(const std::string& path) { return OpenAt(AT_FDCWD, path, path); }

Result<MappedFile> MappedFile::OpenAt(int dir_fd, const std::string& name, std::string path) {
  const int fd = ::openat(dir_fd, name.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) return NotFound(path + ": no such file");
    return ErrnoError(path, err);
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return InvalidArgument(path + ": not a regular file");
  }
  MappedFile file;
  file.path_ = std::move(path);
  file.size_ = static_cast<uint64_t>(st.st_size);
  if (file.size_ > 0 && file.size_ <= kReadLimit) {
    // A small file is read: mmap + munmap cost more than the copy, and both take the process's
    // memory-map lock, which serialises the threads indexing a checkpoint of many small files.
    file.owned_.reset(new uint8_t[file.size_]);
    uint64_t done = 0;
    while (done < file.size_) {
      const ssize_t n = ::pread(fd, file.owned_.get() + done, file.size_ - done, static_cast<off_t>(done));
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        const int err = n < 0 ? errno : 0;
        ::close(fd);
        if (err != 0) return ErrnoError(file.path_, err);
        return IoError(file.path_ + ": ended at byte " + std::to_string(done) + " of " + std::to_string(file.size_) +
                       " while read (changed while opened?)");
      }
      done += static_cast<uint64_t>(n);
    }
    file.data_ = file.owned_.get();
  } else if (file.size_ > 0) {
    void* p = ::mmap(nullptr, file.size_, PROT_READ, MAP_PRIVATE, fd, 0);
    if (p == MAP_FAILED) {
      const int err = errno;
      ::close(fd);
      return ErrnoError(file.path_ + ": mmap", err);
    }
    file.data_ = static_cast<const uint8_t*>(p);
    // Indexing touches a few pages per file (zip directory, pickle). Without this hint every
    // fault reads the pages around it too, and a cold mount read most of the checkpoint's bytes
    // (724 MB of a 1.2 GB checkpoint, measured with scripts/bench.sh). Advice only: ignore errors.
    ::madvise(p, file.size_, MADV_RANDOM);
  }
  // The mapping keeps its own reference to the file; the descriptor is not needed any more.
  ::close(fd);
  return file;
}

MappedFile::~MappedFile() { Reset(); }

MappedFile::MappedFile(MappedFile&& other) noexcept
    : data_(std::exchange(other.data_, nullptr)),
      size_(std::exchange(other.size_, 0)),
      path_(std::move(other.path_)),
      owned_(std::move(other.owned_)) {}

MappedFile& MappedFile::operator=(MappedFile&& other) noexcept {
  if (this != &other) {
    Reset();
    data_ = std::exchange(other.data_, nullptr);
    size_ = std::exchange(other.size_, 0);
    path_ = std::move(other.path_);
    owned_ = std::move(other.owned_);
  }
  return *this;
}

void MappedFile::Reset() {
  if (owned_) {
    owned_.reset();
  } else if (data_ != nullptr) {
    ::munmap(const_cast<uint8_t*>(data_), size_);
  }
  data_ = nullptr;
  size_ = 0;
}

}  // namespace reshard
