#include "reshard/view/dtype_convert.h"

#include <cstring>

namespace reshard::view {
namespace {

inline uint32_t Bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}

inline float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t ToBFloat16(uint32_t u) {
  // Adding 0x7FFF plus the lowest kept bit rounds the dropped 16 bits to nearest, ties to even;
  // a carry into the exponent is the correct rounding up (to infinity at the top). NaN would be
  // rounded into infinity or another NaN, so it is selected separately: the canonical quiet NaN
  // of c10::BFloat16's scalar constructor (torch's AVX2 path writes 0xFFFF instead; both are
  // NaN, and an lp weight that is NaN has no bits worth keeping).
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  const bool nan = (u & 0x7FFFFFFFu) > 0x7F800000u;
  return static_cast<uint16_t>(nan ? 0x7FC0u : rounded);
}

inline uint16_t ToFloat16(float f) {
  // The float unit does the rounding: scaling |f| by 2^112 then 2^-110 rounds once to 11
  // significant bits at the exponent fp16 will use (and overflows large values to infinity);
  // adding a power of two aligned to that exponent (never below fp16's subnormal step) moves the
  // rounded significand into the low bits, from where exponent and mantissa are read off.
  const uint32_t w = Bits(f);
  const uint32_t shl1_w = w + w;
  const uint32_t sign = w & 0x80000000u;
  float base = (__builtin_fabsf(f) * 0x1.0p+112f) * 0x1.0p-110f;
  uint32_t bias = shl1_w & 0xFF000000u;
  bias = bias < 0x71000000u ? 0x71000000u : bias;
  base = FromBits((bias >> 1) + 0x07800000u) + base;
  const uint32_t bits = Bits(base);
  const uint32_t exp_bits = (bits >> 13) & 0x00007C00u;
  const uint32_t mantissa_bits = bits & 0x00000FFFu;
  const uint32_t nonsign = exp_bits + mantissa_bits;
  return static_cast<uint16_t>((sign >> 16) | (shl1_w > 0xFF000000u ? 0x7E00u : nonsign));
}

}  // namespace

// The bulk loops are compiled twice, for AVX2 and for the x86-64 baseline (SSE2), and the loader
// picks one for the CPU it runs on (GCC/Clang function multiversioning via ifunc): the baseline
// build alone converted at 12 GB/s and was 28% of the daemon's CPU time serving bf16 weights.
// Both clones are the same integer arithmetic, so the bits are the same.
// Sanitizer builds keep one version: their runtimes are not ready when ifunc resolvers run.
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define RESHARD_SANITIZED 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__)
#define RESHARD_SANITIZED 1
#endif
#if defined(__x86_64__) && !defined(RESHARD_SANITIZED)
#define RESHARD_MULTIVERSION __attribute__((target_clones("avx2", "default")))
#else
#define RESHARD_MULTIVERSION
#endif

RESHARD_MULTIVERSION void Float32ToBFloat16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = ToBFloat16(Bits(in[i]));
}

RESHARD_MULTIVERSION void Float32ToFloat16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = ToFloat16(in[i]);
}

uint16_t Float32ToBFloat16(float value) { return ToBFloat16(Bits(value)); }
uint16_t Float32ToFloat16(float value) { return ToFloat16(value); }

}  // namespace reshard::view
