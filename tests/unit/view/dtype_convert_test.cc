#include "reshard/view/dtype_convert.h"

#include <cstring>
#include <vector>

#include <catch2/catch.hpp>

namespace {

using reshard::view::Float32ToBFloat16;
using reshard::view::Float32ToFloat16;

float FromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

struct Golden {
  uint32_t fp32;
  uint16_t bf16;
  uint16_t fp16;
};

// Printed by torch 2.9.1: torch.tensor([v]).to(torch.bfloat16 / torch.float16), as bits. Ties to
// even (1 + 2^-8), overflow (FLT_MAX, 65520), fp16 subnormals and underflow, signed zeros.
constexpr Golden kGoldens[] = {
    {0x3F800000u, 0x3F80, 0x3C00}, {0x3F808000u, 0x3F80, 0x3C04}, {0x3F818000u, 0x3F82, 0x3C0C},
    {0xC0200000u, 0xC020, 0xC100}, {0x7F7FC99Eu, 0x7F80, 0x7C00}, {0x477FE000u, 0x4780, 0x7BFF},
    {0x477FF000u, 0x4780, 0x7C00}, {0x322BCC77u, 0x322C, 0x0000}, {0x337FFAE5u, 0x3380, 0x0001},
    {0x32FFFAE5u, 0x3300, 0x0000}, {0x387FDA40u, 0x3880, 0x03FF}, {0x7F800000u, 0x7F80, 0x7C00},
    {0xFF800000u, 0xFF80, 0xFC00}, {0x00000000u, 0x0000, 0x0000}, {0x80000000u, 0x8000, 0x8000},
    {0x00800000u, 0x0080, 0x0000}, {0x3DCCCCCDu, 0x3DCD, 0x2E66}, {0xBEAAAAAAu, 0xBEAB, 0xB555},
};

// An independent bf16 reference: exact rounding decided on the dropped half-word.
uint16_t ReferenceBFloat16(uint32_t u) {
  if ((u & 0x7FFFFFFFu) > 0x7F800000u) return 0x7FC0;
  const uint32_t kept = u >> 16;
  const uint32_t dropped = u & 0xFFFFu;
  const bool up = dropped > 0x8000u || (dropped == 0x8000u && (kept & 1u));
  return static_cast<uint16_t>(kept + (up ? 1u : 0u));
}

}  // namespace

TEST_CASE("fp32 -> bf16 and fp16 match torch on the goldens", "[view][dtype_convert]") {
  for (const Golden& g : kGoldens) {
    INFO("fp32 bits " << std::hex << g.fp32);
    CHECK(Float32ToBFloat16(FromBits(g.fp32)) == g.bf16);
    CHECK(Float32ToFloat16(FromBits(g.fp32)) == g.fp16);
  }
}

TEST_CASE("NaN stays NaN", "[view][dtype_convert]") {
  for (uint32_t u : {0x7FC00000u, 0x7F800001u, 0xFFC00000u, 0x7FFFFFFFu, 0xFF800001u}) {
    INFO("fp32 bits " << std::hex << u);
    CHECK(Float32ToBFloat16(FromBits(u)) == 0x7FC0);
    const uint16_t h = Float32ToFloat16(FromBits(u));
    CHECK(h == ((u >> 31) ? 0xFE00 : 0x7E00));
  }
}

TEST_CASE("the array form equals the scalar form and an independent bf16 reference", "[view][dtype_convert]") {
  // A sweep with a stride co-prime to 2^32 visits every exponent and many mantissa patterns,
  // including the tie cases, in a few million steps.
  constexpr size_t kCount = 1u << 22;
  std::vector<float> in(kCount);
  uint32_t u = 0;
  for (size_t i = 0; i < kCount; ++i, u += 0x00000FFFu * 257u + 1u) in[i] = FromBits(u);
  std::vector<uint16_t> bf16(kCount), fp16(kCount);
  Float32ToBFloat16(in.data(), bf16.data(), kCount);
  Float32ToFloat16(in.data(), fp16.data(), kCount);
  size_t bf16_mismatch = 0, fp16_mismatch = 0;
  for (size_t i = 0; i < kCount; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &in[i], sizeof bits);
    bf16_mismatch += bf16[i] != ReferenceBFloat16(bits) || bf16[i] != Float32ToBFloat16(in[i]);
    fp16_mismatch += fp16[i] != Float32ToFloat16(in[i]);
  }
  CHECK(bf16_mismatch == 0);
  CHECK(fp16_mismatch == 0);
}
