// Exact float32 -> bfloat16 / float16 conversion, as torch's `.to()` rounds on CPU.
//
// Both round to nearest, ties to even, with overflow to infinity and (fp16) gradual underflow
// to subnormals, exactly like c10::BFloat16 / c10::Half construction from float. NaN stays NaN:
// bf16 gives the canonical 0x7FC0 (c10::BFloat16's scalar constructor), fp16 the quiet NaN
// 0x7E00 with the input's sign (c10's fp16_ieee_from_fp32_value). The loops
// are branch-free over 32-bit integers so the compiler vectorises them; they need IEEE float
// semantics (no -ffast-math, default rounding mode), which the project's flags guarantee.
//
// Units: `n` counts elements. `in` and `out` must not overlap. Thread-safe (pure functions).
// Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>

namespace reshard::view {

// out[i] = bfloat16 bits of in[i].
void Float32ToBFloat16(const float* in, uint16_t* out, size_t n);
// out[i] = IEEE binary16 bits of in[i].
void Float32ToFloat16(const float* in, uint16_t* out, size_t n);

// Single-element forms, for tests and odd edges.
uint16_t Float32ToBFloat16(float value);
uint16_t Float32ToFloat16(float value);

}  // namespace reshard::view
