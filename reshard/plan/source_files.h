// SourceFiles: the universal checkpoint's files a plan reads, read with pread (and the computed
// sources a plan holds in memory, copied from there).
//
// Tensor bytes are read with pread(2), never through a mapping: a source file truncated while
// served then fails one read with an error (EIO at the FUSE boundary) instead of killing the
// process with SIGBUS. Descriptors come from a base::FdCache (O_RDONLY | O_CLOEXEC): when the
// distinct files fit in its budget (half the soft open-file limit by default) each is opened
// once at Open and stays open; past it they are opened on demand, the most recently used kept.
//
// Thread safety: immutable after Open() but for the descriptor cache, which is thread-safe;
// ReadElements may run concurrently from any number of threads. Movable, not copyable. Public
// header: C++17.
//
// A source changed after Open: a file renamed over or deleted goes on being read through the
// descriptor opened here while it is open (the bytes the plan was made from); one reopened past
// the budget must be the same inode with the same size and modification time, or its reads fail.
// A file rewritten in place (the same inode: truncated, or written with other bytes, as
// torch.save over an existing path does) is caught by CheckUnchanged, which compares its size and
// modification time with Open's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "reshard/base/fd_cache.h"
#include "reshard/base/status.h"
#include "reshard/plan/extent.h"

namespace reshard::plan {

class SourceFiles {
 public:
  // Opens every source's file and checks that it still holds the source's bytes
  // (data_offset + numel * itemsize <= file size). Errors: kIoError (open/fstat, with errno),
  // kCorrupt (a file shorter than its source needs). `max_open_files`: the descriptor budget
  // (0: FdCache::DefaultCapacity()).
  static Result<SourceFiles> Open(const std::vector<Source>& sources, size_t max_open_files = 0);

  size_t size() const { return entries_.size(); }
  uint32_t itemsize(uint32_t source) const { return entries_[source].itemsize; }
  // Distinct files, and whether all of them stay open (see the file comment).
  size_t num_files() const { return files_.size(); }
  bool all_open() const { return files_.all_open(); }

  // Copies elements [first, first + count) of source `source` to `out` (count * itemsize
  // bytes). Errors: kOutOfRange past the source's end; kIoError naming the file and offset when
  // pread fails or the file ends early (it was truncated after Open).
  Status ReadElements(uint32_t source, uint64_t first, uint64_t count, uint8_t* out) const;

  // OK when every file holding one of `sources` still has the size and modification time it had
  // at Open (one fstat or stat per distinct file). Otherwise kIoError naming the first file that changed
  // and how: the bytes it now holds are not what the plan was made from. Thread-safe.
  Status CheckUnchanged(const std::vector<uint32_t>& sources) const;

 private:
  // Entry::file of a source held in memory: this bit, and its index in computed_.
  static constexpr uint32_t kComputedBit = uint32_t{1} << 31;

  // 24 bytes: a plan of 100,000 parameters has 300,000 of them.
  struct Entry {
    uint32_t file = 0;  // index into files_, or kComputedBit | index into computed_
    uint32_t itemsize = 0;
    uint64_t data_offset = 0;
    uint64_t numel = 0;
  };

  SourceFiles(FdCache files, std::vector<Entry> entries, std::vector<std::shared_ptr<const std::string>> computed)
      : files_(std::move(files)), entries_(std::move(entries)), computed_(std::move(computed)) {}

  FdCache files_;
  std::vector<Entry> entries_;
  std::vector<std::shared_ptr<const std::string>> computed_;  // the bytes of the computed sources
};

}  // namespace reshard::plan
