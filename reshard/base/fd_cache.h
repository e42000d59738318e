// FdCache: read-only descriptors for a fixed list of files, at most `capacity` of them open.
//
// A universal checkpoint has three or four files per parameter: 400,000 for a model of 100,000
// parameters, more than any usual RLIMIT_NOFILE. When every file fits in the budget, all are
// opened by Create() and stay open: reads take no lock, and a file renamed over or deleted
// while served goes on being read through the descriptor opened here (the bytes that were
// planned). Otherwise Create() only stat(2)s each file, and Acquire() opens on demand, keeping
// the most recently used ones open (LRU). A file reopened this way must still be what Create()
// saw (same device, inode, size and modification time): a file replaced or rewritten since is
// an error, never other bytes.
//
// Thread safety: Acquire() and CheckUnchanged() may run concurrently from any number of threads;
// the LRU is guarded by one mutex that is never held across a system call. A Lease keeps its
// descriptor open after eviction until it is destroyed, so the number of open descriptors can
// exceed `capacity` by the number of leases alive. Movable, not copyable. Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "reshard/base/compressed_bytes.h"
#include "reshard/base/status.h"
#include "reshard/base/unique_fd.h"

struct stat;

namespace reshard {

// What stat(2) says about a file, as far as "is it still the file we planned from" goes.
struct FileIdentity {
  uint64_t dev = 0;
  uint64_t ino = 0;
  uint64_t size = 0;      // bytes
  int64_t mtime_ns = 0;   // modification time, nanoseconds since the epoch

  static FileIdentity Of(const struct stat& st);
};

class FdCache {
 public:
  // A descriptor lent by Acquire(); valid while the Lease lives.
  class Lease {
   public:
    int fd() const { return fd_; }

   private:
    friend class FdCache;
    int fd_ = -1;
    std::shared_ptr<const UniqueFd> owner_;  // null when the file is pinned open for good
  };

  // The descriptor budget used when none is given: half the soft RLIMIT_NOFILE (the other half
  // is left to the process: FUSE, outputs, a training job's loaders), at least 16.
  static size_t DefaultCapacity();

  // Opens (if all fit in `capacity`) or stats every file of `paths`, in order.
  // Errors: kIoError naming the file (open/stat failed, e.g. ENOENT or EMFILE);
  // kInvalidArgument for a path holding a NUL byte (no file has such a name).
  static Result<FdCache> Create(const std::vector<std::string>& paths, size_t capacity);

  FdCache(FdCache&& other) noexcept;
  FdCache& operator=(FdCache&& other) noexcept;
  FdCache(const FdCache&) = delete;
  FdCache& operator=(const FdCache&) = delete;
  ~FdCache();

  size_t size() const { return identities_.size(); }
  // The path of file `file` as given to Create() (a copy, for messages).
  std::string path(uint32_t file) const;
  // The file as Create() saw it.
  const FileIdentity& identity(uint32_t file) const { return identities_[file]; }
  // True when every file stays open (no reopening, no lock).
  bool all_open() const { return !pinned_.empty() || identities_.empty(); }

  // A descriptor of file `file` (< size()). Errors: kIoError naming the file when it cannot be
  // reopened, or when the file now at its path is not the one Create() saw.
  Result<Lease> Acquire(uint32_t file) const;

  // OK when file `file` still has the size and modification time Create() saw (and, when it is
  // not pinned open, the same device and inode at its path). Otherwise kIoError naming the file
  // and what changed.
  Status CheckUnchanged(uint32_t file) const;

 private:
  FdCache() = default;

  Status CheckSame(uint32_t file, const FileIdentity& now, bool same_inode_required) const;
  // Copies file `file`'s path and its NUL to `out`, which holds `capacity` bytes (PATH_MAX do:
  // Create() opened or stat'ed every path, so none is longer). OutOfRange if it does not fit.
  Status CopyPath(uint32_t file, char* out, size_t capacity) const;
  void LinkFront(uint32_t file) const;  // callers hold mutex_
  void Unlink(uint32_t file) const;     // callers hold mutex_

  static constexpr uint32_t kNone = UINT32_MAX;

  // Every path, each ending in a NUL, in one compressed string. A string object per path cost its
  // header, a heap block and the block's overhead, 300,000 times for 100,000 parameters; and the
  // paths of one folder differ only in their last component, so they compress ~16x (3.5 MB to
  // 0.21 MB for 10,002 parameters). Read back only to reopen a file past the budget (a few
  // microseconds beside the open itself) and for messages.
  CompressedBytes paths_;
  std::vector<uint64_t> path_starts_;  // of each path in paths_
  std::vector<FileIdentity> identities_;
  size_t capacity_ = 0;
  std::vector<UniqueFd> pinned_;  // all files, when they fit; empty otherwise

  // The LRU of open descriptors (used only when pinned_ is empty), guarded by mutex_.
  std::unique_ptr<std::mutex> mutex_ = std::make_unique<std::mutex>();
  mutable std::vector<std::shared_ptr<const UniqueFd>> open_;
  mutable std::vector<uint32_t> prev_;
  mutable std::vector<uint32_t> next_;
  mutable uint32_t head_ = kNone;  // most recently used
  mutable uint32_t tail_ = kNone;  // least recently used
  mutable size_t open_count_ = 0;
};

}  // namespace reshard
