// Executor: fills destination buffers from a plan's storage plans, reading each source byte once.
//
// Create() turns the plan into a read schedule (plan time, no I/O besides open/fstat): every
// extent run becomes a piece (file, byte offset, length, destination, conversion); pieces are
// sorted by file and offset, split at `chunk_bytes`, and pieces that lie within `max_gap_bytes`
// of each other are merged into one sequential read (a chunk). Bytes that two destinations need
// (a parameter's fp32 partition and its lp weight) are read once and scattered twice. Zero
// extents become zero-fill operations.
//
// Run() executes the schedule on `lanes` reader threads: each lane takes the next chunk, preads
// it into one of its two staging slots and hands the chunk's copies to the backend, then reads
// the next chunk into its other slot while those copies drain (double buffering). A chunk of
// plain, disjoint copies is read with one preadv straight into its destinations instead when the
// backend's destinations are host memory (HostBackend): no staging copy. It returns
// once the backend has finished everything, or with the first error (the destinations then hold
// an unspecified mix).
//
// Ownership: the Executor owns the source fds. Destinations are borrowed: each must hold the
// storage's nbytes() and outlive Run(). Thread safety: Run() is const and may run concurrently
// only with distinct backends and disjoint destinations; backends are not shared between runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu/copy_backend.h"
#include "gpu/read_schedule.h"
#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"

namespace reshard::gpu {

struct Destination {
  const plan::StoragePlan* storage = nullptr;  // borrowed; its extents index the sources given to Create
  void* data = nullptr;                        // storage->nbytes() bytes, as the backend addresses them
};

struct ExecutorOptions {
  size_t lanes = 4;                          // reader threads, >= 1
  uint64_t chunk_bytes = uint64_t{8} << 20;  // staging buffer size; a multiple of 64, >= 64
  uint64_t max_gap_bytes = uint64_t{256} << 10;  // unneeded bytes a chunk may read to avoid a seek
};

struct ExecutorStats {
  uint64_t chunks = 0;
  uint64_t bytes_read = 0;      // source bytes read, gaps included
  uint64_t bytes_read_direct = 0;  // of those, read straight into the destinations (no staging copy)
  uint64_t bytes_copied = 0;    // source bytes scattered (counted once per destination)
  uint64_t bytes_zeroed = 0;
  double seconds = 0;
};

class Executor {
 public:
  // Errors: kInvalidArgument (bad options, a destination without data or storage, and those of
  // AppendPieces), kIoError (a source file that cannot be opened), kCorrupt (a source file shorter
  // than its source needs).
  static Result<Executor> Create(const std::vector<plan::Source>& sources, const std::vector<Destination>& dests,
                                 const ExecutorOptions& options = {});

  // Runs the schedule through `backend` (see the file comment). Errors: the backend's, and
  // kIoError naming the file and offset when a read fails or comes up short.
  Result<ExecutorStats> Run(CopyBackend& backend) const;

  // What Run() will read and copy, for plans and benchmarks.
  uint64_t chunk_count() const { return work_.size(); }
  uint64_t bytes_to_read() const { return bytes_to_read_; }
  uint64_t bytes_to_copy() const { return bytes_to_copy_; }
  // The sequential reads Run() makes (file indices name files()), in schedule order.
  const std::vector<ChunkWork>& chunks() const { return work_; }
  const SourceFileTable& files() const { return files_; }

 private:
  struct ZeroOp {
    void* dest = nullptr;
    uint64_t nbytes = 0;
  };

  Executor() = default;

  ExecutorOptions options_;
  SourceFileTable files_;
  std::vector<CopyOp> ops_;      // grouped by chunk; work_ points into it (stable: never resized after Create)
  std::vector<ChunkWork> work_;
  std::vector<ZeroOp> zeros_;
  uint64_t bytes_to_read_ = 0;
  uint64_t bytes_direct_ = 0;  // bytes of direct chunks (ChunkWork::direct)
  uint64_t bytes_to_copy_ = 0;
  uint64_t bytes_to_zero_ = 0;
};

}  // namespace reshard::gpu
