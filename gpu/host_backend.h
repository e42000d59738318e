// HostBackend: the executor's copies as memcpy and the vectorised fp32 -> bf16/fp16 conversion of
// reshard/view/dtype_convert.h into host memory. Synchronous: WaitSlot has nothing to wait for.
// It is the backend CI runs, and the reference the CUDA backend's results are checked against.
// Thread safety: as CopyBackend says (one thread per lane). Not copyable.
#pragma once

#include <memory>
#include <vector>

#include "gpu/copy_backend.h"

namespace reshard::gpu {

class HostBackend final : public CopyBackend {
 public:
  HostBackend() = default;
  HostBackend(const HostBackend&) = delete;
  HostBackend& operator=(const HostBackend&) = delete;

  Status Prepare(size_t lanes, uint64_t staging_bytes) override;
  uint8_t* Staging(size_t lane, int slot) override;
  Status WaitSlot(size_t, int) override { return Status(); }
  Status Scatter(size_t lane, int slot, const CopyOp* ops, size_t count) override;
  Status ScatterFrom(const uint8_t* base, const CopyOp* ops, size_t count) override;
  bool ReadsIntoDestinations() const override { return true; }
  Status Zero(void* dest, uint64_t nbytes) override;
  Status Finish() override { return Status(); }

 private:
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  std::vector<std::unique_ptr<uint8_t, AlignedFree>> staging_;  // lane * 2 + slot
};

}  // namespace reshard::gpu
