// FileContent: what one served file holds, as the FUSE server sees it.
//
// The server knows nothing about checkpoints: a caller builds a Namespace of FileContents
// (fs/namespace.h) and hands it to Serve() (fs/fuse_server.h). Implementations here:
// InlineContent (bytes in memory), PassthroughContent (a real file, read-only) and NullContent
// (a fixed pattern, for measuring the FUSE transport alone); a planned virtual file is another.
//
// Contract for implementations:
// - Immutable after construction. size() never changes while the file is served, which is what
//   lets the server hand out long attribute timeouts and keep the kernel page cache.
// - Read() is called concurrently from the FUSE worker threads, with no lock held, so it must be
//   thread-safe (const and free of shared mutable state, or synchronised inside).
// - Read() writes only into `out`; it never allocates per call on the hot path.
#pragma once

#include <cstddef>
#include <cstdint>

#include "reshard/base/status.h"

namespace reshard::fs {

class FileContent {
 public:
  virtual ~FileContent() = default;

  // The file's length in bytes, known without reading any data.
  virtual uint64_t size() const = 0;

  // Copies min(length, size() - offset) bytes starting at byte `offset` into `out`, which holds
  // at least `length` bytes, and returns that count: 0 at or after the end of the file. A non-OK
  // status fails only this read: the server answers EIO and logs one warning line naming the
  // file's path and the status message, so the message need not repeat the served path.
  virtual Result<size_t> Read(uint64_t offset, uint8_t* out, size_t length) const = 0;

  // Called at each open() of the file; a non-OK status fails that open with EIO and the server
  // logs one warning line naming the path and the message. For contents computed from files
  // that may change underneath the mount (a source rewritten in place): the check that they
  // still hold what the contents were planned from. Thread-safe, like Read().
  virtual Status CheckOpen() const { return Status::Ok(); }
};

}  // namespace reshard::fs
