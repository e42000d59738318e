// DiscardBackend: reads like the host backend and copies nothing. The executor still preads every
// chunk into this backend's staging buffers, on the same lanes, so a fill through it costs what
// moving the same source bytes out of the page cache (or off the disk) costs, and nothing more:
// the ceiling a host fill is measured against (scripts/bench_restore.py). Destinations are never
// written, zero fills included. Thread safety: as CopyBackend says. Not copyable.
#pragma once

#include "gpu/copy_backend.h"
#include "gpu/host_backend.h"

namespace reshard::gpu {

class DiscardBackend final : public CopyBackend {
 public:
  DiscardBackend() = default;
  DiscardBackend(const DiscardBackend&) = delete;
  DiscardBackend& operator=(const DiscardBackend&) = delete;

  Status Prepare(size_t lanes, uint64_t staging_bytes) override { return staging_.Prepare(lanes, staging_bytes); }
  uint8_t* Staging(size_t lane, int slot) override { return staging_.Staging(lane, slot); }
  Status WaitSlot(size_t, int) override { return Status(); }
  Status Scatter(size_t, int, const CopyOp*, size_t) override { return Status(); }
  Status ScatterFrom(const uint8_t*, const CopyOp*, size_t) override { return Status(); }
  Status Zero(void*, uint64_t) override { return Status(); }
  Status Finish() override { return Status(); }

 private:
  HostBackend staging_;  // its staging buffers only: the same allocation and alignment as a host fill's
};

}  // namespace reshard::gpu
