// Overflow-checked arithmetic for every length and offset that comes from a file.
//
// Bounds are written as `n > size - off` (after checking off <= size), never `off + n > size`.
// These helpers return std::nullopt on overflow; callers turn that into a Status that names the
// field. Header-only, constexpr, C++17.
#pragma once

#include <cstdint>
#include <optional>

namespace reshard {

constexpr std::optional<uint64_t> CheckedAdd(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_add_overflow(a, b, &r)) return std::nullopt;
  return r;
}

constexpr std::optional<uint64_t> CheckedMul(uint64_t a, uint64_t b) {
  uint64_t r = 0;
  if (__builtin_mul_overflow(a, b, &r)) return std::nullopt;
  return r;
}

// True when [offset, offset + length) lies inside [0, size).
constexpr bool RangeFits(uint64_t offset, uint64_t length, uint64_t size) {
  return offset <= size && length <= size - offset;
}

// Rounds `value` up to a multiple of `alignment` (a power of two or any positive value);
// std::nullopt on overflow.
constexpr std::optional<uint64_t> CheckedAlignUp(uint64_t value, uint64_t alignment) {
  if (alignment == 0) return std::nullopt;
  const uint64_t rem = value % alignment;
  if (rem == 0) return value;
  return CheckedAdd(value, alignment - rem);
}

}  // namespace reshard
