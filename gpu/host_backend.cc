#include "gpu/host_backend.h"

#include <cstdlib>
#include <cstring>
#include <string>

#include "reshard/view/dtype_convert.h"

namespace reshard::gpu {

void HostBackend::AlignedFree::operator()(uint8_t* p) const { std::free(p); }

Status HostBackend::Prepare(size_t lanes, uint64_t staging_bytes) {
  staging_.clear();
  // 64-byte alignment keeps every float32 element the executor stages 4-byte aligned (it starts
  // chunks on 64-byte file offsets, and torch archives align tensor data to 64).
  const uint64_t bytes = (staging_bytes + 63) / 64 * 64;
  for (size_t i = 0; i < lanes * 2; ++i) {
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, bytes));
    if (p == nullptr) return ResourceExhausted("host staging: cannot allocate " + std::to_string(bytes) + " bytes");
    staging_.emplace_back(p);
  }
  return Status();
}

uint8_t* HostBackend::Staging(size_t lane, int slot) { return staging_[lane * 2 + static_cast<size_t>(slot)].get(); }

Status HostBackend::Scatter(size_t lane, int slot, const CopyOp* ops, size_t count) {
  return ScatterFrom(Staging(lane, slot), ops, count);
}

Status HostBackend::ScatterFrom(const uint8_t* base, const CopyOp* ops, size_t count) {
  for (size_t i = 0; i < count; ++i) {
    const CopyOp& op = ops[i];
    const uint8_t* src = base + op.staging_offset;
    switch (op.conversion) {
      case plan::Conversion::kCopy:
        std::memcpy(op.dest, src, op.source_bytes);
        break;
      case plan::Conversion::kFp32ToBf16:
        view::Float32ToBFloat16(reinterpret_cast<const float*>(src), static_cast<uint16_t*>(op.dest),
                                op.source_bytes / 4);
        break;
      case plan::Conversion::kFp32ToFp16:
        view::Float32ToFloat16(reinterpret_cast<const float*>(src), static_cast<uint16_t*>(op.dest),
                               op.source_bytes / 4);
        break;
    }
  }
  return Status();
}

Status HostBackend::Zero(void* dest, uint64_t nbytes) {
  std::memset(dest, 0, nbytes);
  return Status();
}

}  // namespace reshard::gpu
