#include "gpu/cuda_backend.h"

#include <cuda_runtime.h>

#include <string>

namespace reshard::gpu {
namespace {

Status CudaCheck(cudaError_t e, const char* what) {
  if (e == cudaSuccess) return Status();
  return IoError(std::string("CUDA ") + what + ": " + cudaGetErrorString(e));
}

#define RS_CUDA(call) RS_RETURN_IF_ERROR(CudaCheck((call), #call))

// The integer algorithms of reshard/view/dtype_convert.cc, on the device. The float steps of the
// fp16 rounding use explicitly rounded intrinsics so no compiler flag (fast math, FTZ) changes them.
__device__ inline uint16_t ToBFloat16(uint32_t u) {
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

__device__ inline uint16_t ToFloat16(float f) {
  const uint32_t w = __float_as_uint(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  float base = __fmul_rn(__fmul_rn(fabsf(f), 0x1.0p+112f), 0x1.0p-110f);
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = __fadd_rn(__uint_as_float((bias >> 1) + 0x07800000u), base);
  const uint32_t bits = __float_as_uint(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

__global__ void ConvertKernel(const float* in, uint16_t* out, uint64_t n, bool bf16) {
  for (uint64_t i = blockIdx.x * static_cast<uint64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<uint64_t>(gridDim.x) * blockDim.x) {
    out[i] = bf16 ? ToBFloat16(__float_as_uint(in[i])) : ToFloat16(in[i]);
  }
}

// Rounds `source_bytes` of float32 at device address `in` into `out` on `stream`.
Status LaunchConvert(cudaStream_t stream, const uint8_t* in, void* out, uint64_t source_bytes, plan::Conversion c) {
  const uint64_t n = source_bytes / 4;
  const unsigned blocks = static_cast<unsigned>(n / 256 + 1 < 4096 ? n / 256 + 1 : 4096);
  ConvertKernel<<<blocks, 256, 0, stream>>>(reinterpret_cast<const float*>(in), static_cast<uint16_t*>(out), n,
                                            c == plan::Conversion::kFp32ToBf16);
  return CudaCheck(cudaGetLastError(), "ConvertKernel launch");
}

}  // namespace

CudaBackend::~CudaBackend() { Release(); }

void CudaBackend::Release() {
  cudaSetDevice(device_);
  for (Lane& l : lanes_) {
    if (l.stream != nullptr) cudaStreamSynchronize(static_cast<cudaStream_t>(l.stream));
    for (int s = 0; s < 2; ++s) {
      if (l.events[s] != nullptr) cudaEventDestroy(static_cast<cudaEvent_t>(l.events[s]));
      if (l.staging[s] != nullptr) cudaFreeHost(l.staging[s]);
      if (l.scratch[s] != nullptr) cudaFree(l.scratch[s]);
    }
    if (l.stream != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(l.stream));
  }
  lanes_.clear();
  if (zero_stream_ != nullptr) {
    cudaStreamSynchronize(static_cast<cudaStream_t>(zero_stream_));
    cudaStreamDestroy(static_cast<cudaStream_t>(zero_stream_));
    zero_stream_ = nullptr;
  }
}

Status CudaBackend::Prepare(size_t lanes, uint64_t staging_bytes) {
  Release();
  RS_CUDA(cudaSetDevice(device_));
  staging_bytes_ = staging_bytes;
  cudaStream_t zero_stream = nullptr;
  RS_CUDA(cudaStreamCreateWithFlags(&zero_stream, cudaStreamNonBlocking));
  zero_stream_ = zero_stream;
  lanes_.resize(lanes);
  for (Lane& l : lanes_) {
    cudaStream_t stream = nullptr;
    RS_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
    l.stream = stream;
    for (int s = 0; s < 2; ++s) {
      cudaEvent_t event = nullptr;
      RS_CUDA(cudaEventCreateWithFlags(&event, cudaEventDisableTiming));
      l.events[s] = event;
      RS_CUDA(cudaHostAlloc(reinterpret_cast<void**>(&l.staging[s]), staging_bytes, cudaHostAllocDefault));
      RS_CUDA(cudaMalloc(reinterpret_cast<void**>(&l.scratch[s]), staging_bytes));
    }
  }
  return Status();
}

uint8_t* CudaBackend::Staging(size_t lane, int slot) { return lanes_[lane].staging[slot]; }

Status CudaBackend::WaitSlot(size_t lane, int slot) {
  RS_CUDA(cudaSetDevice(device_));  // each lane thread starts without a current device
  RS_CUDA(cudaEventSynchronize(static_cast<cudaEvent_t>(lanes_[lane].events[slot])));
  return Status();
}

Status CudaBackend::Scatter(size_t lane, int slot, const CopyOp* ops, size_t count) {
  Lane& l = lanes_[lane];
  auto stream = static_cast<cudaStream_t>(l.stream);
  const uint8_t* staging = l.staging[slot];
  uint8_t* scratch = l.scratch[slot];
  for (size_t i = 0; i < count; ++i) {
    const CopyOp& op = ops[i];
    if (op.conversion == plan::Conversion::kCopy) {
      RS_CUDA(cudaMemcpyAsync(op.dest, staging + op.staging_offset, op.source_bytes, cudaMemcpyDefault, stream));
      continue;
    }
    RS_CUDA(cudaMemcpyAsync(scratch + op.staging_offset, staging + op.staging_offset, op.source_bytes,
                            cudaMemcpyHostToDevice, stream));
    RS_RETURN_IF_ERROR(LaunchConvert(stream, scratch + op.staging_offset, op.dest, op.source_bytes, op.conversion));
  }
  RS_CUDA(cudaEventRecord(static_cast<cudaEvent_t>(l.events[slot]), stream));
  return Status();
}

Status CudaBackend::ScatterFrom(const uint8_t* base, const CopyOp* ops, size_t count) {
  RS_CUDA(cudaSetDevice(device_));
  auto stream = static_cast<cudaStream_t>(zero_stream_);
  for (size_t i = 0; i < count; ++i) {
    const CopyOp& op = ops[i];
    if (op.conversion == plan::Conversion::kCopy) {
      RS_CUDA(cudaMemcpyAsync(op.dest, base + op.staging_offset, op.source_bytes, cudaMemcpyDefault, stream));
      continue;
    }
    RS_RETURN_IF_ERROR(LaunchConvert(stream, base + op.staging_offset, op.dest, op.source_bytes, op.conversion));
  }
  RS_CUDA(cudaStreamSynchronize(stream));
  return Status();
}

Status CudaBackend::Zero(void* dest, uint64_t nbytes) {
  RS_CUDA(cudaMemsetAsync(dest, 0, nbytes, static_cast<cudaStream_t>(zero_stream_)));
  return Status();
}

Status CudaBackend::Finish() {
  RS_CUDA(cudaSetDevice(device_));
  for (Lane& l : lanes_) RS_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(l.stream)));
  RS_CUDA(cudaStreamSynchronize(static_cast<cudaStream_t>(zero_stream_)));
  return Status();
}

}  // namespace reshard::gpu
