#include "reshard/base/fd_cache.h"

#include <fcntl.h>
#include <sys/resource.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <utility>

namespace reshard {

FileIdentity FileIdentity::Of(const struct stat& st) {
  return FileIdentity{static_cast<uint64_t>(st.st_dev), static_cast<uint64_t>(st.st_ino),
                      static_cast<uint64_t>(st.st_size),
                      static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec};
}

size_t FdCache::DefaultCapacity() {
  constexpr size_t kMinimum = 16;
  rlimit limit{};
  if (::getrlimit(RLIMIT_NOFILE, &limit) != 0 || limit.rlim_cur == RLIM_INFINITY) return 1 << 20;
  return std::max<size_t>(kMinimum, static_cast<size_t>(limit.rlim_cur / 2));
}

Result<FdCache> FdCache::Create(const std::vector<std::string>& paths, size_t capacity) {
  FdCache out;
  out.capacity_ = std::max<size_t>(capacity, 1);
  out.identities_.reserve(paths.size());
  const bool all_fit = paths.size() <= out.capacity_;
  if (all_fit) out.pinned_.reserve(paths.size());
  size_t total = 0;
  for (const std::string& path : paths) {
    if (path.find('\0') != std::string::npos) return InvalidArgument("a file path holds a NUL byte");
    total += path.size() + 1;
  }
  std::string path_bytes;
  path_bytes.reserve(total);
  out.path_starts_.reserve(paths.size() + 1);
  for (const std::string& path : paths) {
    out.path_starts_.push_back(path_bytes.size());
    path_bytes.append(path.c_str(), path.size() + 1);
    struct stat st;
    if (all_fit) {
      UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoError(path, errno);
      if (::fstat(fd.get(), &st) != 0) return ErrnoError(path, errno);
      out.pinned_.push_back(std::move(fd));
    } else if (::stat(path.c_str(), &st) != 0) {
      return ErrnoError(path, errno);
    }
    out.identities_.push_back(FileIdentity::Of(st));
  }
  out.path_starts_.push_back(path_bytes.size());
  // Small chunks: a reopen decompresses one to read one path.
  constexpr size_t kPathChunkBytes = 4096;
  RS_ASSIGN_OR_RETURN(out.paths_, CompressedBytes::Create(path_bytes, kPathChunkBytes));
  if (!all_fit) {
    out.open_.resize(paths.size());
    out.prev_.assign(paths.size(), kNone);
    out.next_.assign(paths.size(), kNone);
  }
  return out;
}

FdCache::FdCache(FdCache&& other) noexcept = default;
FdCache& FdCache::operator=(FdCache&& other) noexcept = default;
FdCache::~FdCache() = default;

Status FdCache::CopyPath(uint32_t file, char* out, size_t capacity) const {
  const uint64_t begin = path_starts_[file];
  const uint64_t length = path_starts_[file + 1] - begin;  // NUL included
  if (length > capacity) return OutOfRange("a path of " + std::to_string(length) + " bytes");
  return paths_.Read(begin, out, static_cast<size_t>(length));
}

std::string FdCache::path(uint32_t file) const {
  std::string out(path_starts_[file + 1] - path_starts_[file], '\0');
  if (!CopyPath(file, out.data(), out.size()).ok()) return "file " + std::to_string(file);
  out.pop_back();  // the NUL
  return out;
}

void FdCache::LinkFront(uint32_t file) const {
  prev_[file] = kNone;
  next_[file] = head_;
  if (head_ != kNone) prev_[head_] = file;
  head_ = file;
  if (tail_ == kNone) tail_ = file;
}

void FdCache::Unlink(uint32_t file) const {
  if (prev_[file] != kNone) next_[prev_[file]] = next_[file];
  if (next_[file] != kNone) prev_[next_[file]] = prev_[file];
  if (head_ == file) head_ = next_[file];
  if (tail_ == file) tail_ = prev_[file];
  prev_[file] = next_[file] = kNone;
}

Result<FdCache::Lease> FdCache::Acquire(uint32_t file) const {
  Lease lease;
  if (!pinned_.empty()) {
    lease.fd_ = pinned_[file].get();
    return lease;
  }
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    if (open_[file]) {
      Unlink(file);
      LinkFront(file);
      lease.owner_ = open_[file];
      lease.fd_ = lease.owner_->get();
      return lease;
    }
  }
  // A miss: open and check outside the lock, so other files' reads never wait on this open.
  char name[PATH_MAX];
  RS_RETURN_IF_ERROR(CopyPath(file, name, sizeof name));
  UniqueFd fd(::open(name, O_RDONLY | O_CLOEXEC));
  if (!fd.valid()) return ErrnoError(path(file), errno);
  struct stat st;
  if (::fstat(fd.get(), &st) != 0) return ErrnoError(path(file), errno);
  RS_RETURN_IF_ERROR(CheckSame(file, FileIdentity::Of(st), /*same_inode_required=*/true));
  auto opened = std::make_shared<const UniqueFd>(std::move(fd));
  // The evicted descriptor (and a duplicate open lost to a racing thread) closes after unlock.
  std::shared_ptr<const UniqueFd> evicted;
  {
    std::lock_guard<std::mutex> lock(*mutex_);
    if (open_[file]) {
      Unlink(file);
      evicted = std::move(opened);
      opened = open_[file];
    } else {
      open_[file] = opened;
      ++open_count_;
      if (open_count_ > capacity_) {
        const uint32_t victim = tail_;
        Unlink(victim);
        evicted = std::move(open_[victim]);
        --open_count_;
      }
    }
    LinkFront(file);
  }
  lease.owner_ = std::move(opened);
  lease.fd_ = lease.owner_->get();
  return lease;
}

Status FdCache::CheckSame(uint32_t file, const FileIdentity& now, bool same_inode_required) const {
  const FileIdentity& then = identities_[file];
  if (same_inode_required && (now.dev != then.dev || now.ino != then.ino)) {
    return IoError(path(file) + ": replaced since it was planned (another file is at its path now); mount again to "
                   "serve the new checkpoint");
  }
  if (now.size != then.size) {
    return IoError(path(file) + ": changed since it was opened (" + std::to_string(then.size) + " bytes, now " +
                   std::to_string(now.size) + "); mount again to serve the new checkpoint");
  }
  if (now.mtime_ns != then.mtime_ns) {
    return IoError(path(file) + ": rewritten since it was opened (modification time changed); mount again to "
                   "serve the new checkpoint");
  }
  return Status::Ok();
}

Status FdCache::CheckUnchanged(uint32_t file) const {
  struct stat st;
  if (!pinned_.empty()) {
    if (::fstat(pinned_[file].get(), &st) != 0) return ErrnoError(path(file), errno);
    return CheckSame(file, FileIdentity::Of(st), /*same_inode_required=*/false);
  }
  char name[PATH_MAX];
  RS_RETURN_IF_ERROR(CopyPath(file, name, sizeof name));
  if (::stat(name, &st) != 0) return ErrnoError(path(file), errno);
  return CheckSame(file, FileIdentity::Of(st), /*same_inode_required=*/true);
}

}  // namespace reshard
