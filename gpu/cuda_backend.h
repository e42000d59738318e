// CudaBackend: the executor's copies into CUDA device memory.
//
// Staging buffers are pinned host memory (cudaHostAlloc), two per lane. Each lane owns a CUDA
// stream; a kCopy op is one cudaMemcpyAsync from pinned staging to its destination; a converting
// op (fp32 -> bf16/fp16, for lp weights) first copies the chunk's float32 bytes into the lane's
// device scratch for that slot, then a kernel rounds them into the destination with the same
// integer algorithm as reshard/view/dtype_convert.h (round to nearest even, NaN kept), so both
// backends produce identical bits. An event per (lane, slot) marks when the slot's staging may be
// refilled. Zero-fills run on their own stream with cudaMemsetAsync.
//
// Every destination pointer must be device memory of `device` (or memory CUDA can address with
// cudaMemcpyDefault). Streams, events, pinned and device buffers are owned here and released in
// the destructor. Thread safety: as CopyBackend says. Built only when the CUDA toolkit is found
// (CMake option RESHARDFS_CUDA).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gpu/copy_backend.h"

namespace reshard::gpu {

class CudaBackend final : public CopyBackend {
 public:
  explicit CudaBackend(int device = 0) : device_(device) {}
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Status Prepare(size_t lanes, uint64_t staging_bytes) override;
  uint8_t* Staging(size_t lane, int slot) override;
  Status WaitSlot(size_t lane, int slot) override;
  Status Scatter(size_t lane, int slot, const CopyOp* ops, size_t count) override;
  // `base` is device memory: device-to-device copies, and the conversion kernel reading it directly.
  Status ScatterFrom(const uint8_t* base, const CopyOp* ops, size_t count) override;
  Status Zero(void* dest, uint64_t nbytes) override;
  Status Finish() override;

 private:
  struct Lane {
    void* stream = nullptr;           // cudaStream_t
    void* events[2] = {nullptr, nullptr};  // cudaEvent_t per slot
    uint8_t* staging[2] = {nullptr, nullptr};  // pinned host
    uint8_t* scratch[2] = {nullptr, nullptr};  // device, for converting ops
  };
  void Release();

  int device_ = 0;
  uint64_t staging_bytes_ = 0;
  std::vector<Lane> lanes_;
  void* zero_stream_ = nullptr;
};

}  // namespace reshard::gpu
