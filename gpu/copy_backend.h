// CopyBackend: where gpu::Executor's staged source bytes go, and how.
//
// The executor reads each chunk of source bytes into a staging buffer that belongs to one lane
// (one reader thread) and one of that lane's two slots, then hands the chunk's copy operations to
// the backend. A backend may run them asynchronously (the CUDA backend queues cudaMemcpyAsync and
// conversion kernels on the lane's stream); the executor calls WaitSlot before it refills a slot,
// so a lane reads chunk i+1 into one slot while chunk i's copies still drain from the other
// (double buffering). The host backend copies synchronously with memcpy.
//
// Destination pointers are whatever the backend addresses: host memory for the host backend,
// device (or host-registered) memory for the CUDA backend. Units are bytes.
//
// Threads: Prepare, ScatterFrom and Finish run on the caller's thread; Staging, WaitSlot and Scatter run on
// the lane's own thread, and never two threads for one lane; Zero runs on the caller's thread
// before any lane starts. Errors are Status values naming the failed call.
#pragma once

#include <cstddef>
#include <cstdint>

#include "reshard/base/status.h"
#include "reshard/plan/file_plan.h"

namespace reshard::gpu {

// One run of source elements: bytes [staging_offset, staging_offset + source_bytes) of the
// staged chunk become the destination bytes at `dest`, converted as `conversion` says
// (kFp32ToBf16 / kFp32ToFp16 write source_bytes / 2 bytes; kCopy writes source_bytes).
struct CopyOp {
  uint64_t staging_offset = 0;
  uint64_t source_bytes = 0;
  void* dest = nullptr;
  plan::Conversion conversion = plan::Conversion::kCopy;
};

class CopyBackend {
 public:
  virtual ~CopyBackend() = default;

  // Allocates two staging buffers of `staging_bytes` for each of `lanes` lanes (pinned host
  // memory for CUDA) and whatever else the lanes need. Called once per Run.
  virtual Status Prepare(size_t lanes, uint64_t staging_bytes) = 0;
  // The staging buffer of (lane, slot), slot 0 or 1; valid until the next Prepare.
  virtual uint8_t* Staging(size_t lane, int slot) = 0;
  // Blocks until every copy Scatter queued from (lane, slot) has finished reading its staging.
  virtual Status WaitSlot(size_t lane, int slot) = 0;
  // Performs (or queues) `count` copies out of (lane, slot)'s staging buffer.
  virtual Status Scatter(size_t lane, int slot, const CopyOp* ops, size_t count) = 0;
  // Performs `count` copies out of `base`, memory the backend addresses like its destinations (a
  // received exchange buffer), and returns once they have landed. Caller's thread.
  virtual Status ScatterFrom(const uint8_t* base, const CopyOp* ops, size_t count) = 0;
  // Whether destinations are memory the reading thread can pread into. Then a chunk whose copies
  // are all plain and disjoint is read straight into them (one preadv), with no staging and no
  // Scatter. The host backend: yes; device memory: no.
  virtual bool ReadsIntoDestinations() const { return false; }
  // Zero-fills `nbytes` at `dest` (padding).
  virtual Status Zero(void* dest, uint64_t nbytes) = 0;
  // Blocks until everything queued has landed, and reports the first asynchronous error.
  virtual Status Finish() = 0;
};

}  // namespace reshard::gpu
