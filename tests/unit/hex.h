// Hex helpers for the unit tests: golden bytes are pasted as hex strings.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace reshard::testing {

// "80 02" style input without spaces: "8002" -> "\x80\x02". Input must be even-length hex.
inline std::string FromHex(std::string_view hex) {
  auto nibble = [](char c) { return c <= '9' ? c - '0' : (c | 0x20) - 'a' + 10; };
  std::string out;
  for (size_t k = 0; k + 1 < hex.size(); k += 2) {
    out.push_back(static_cast<char>(nibble(hex[k]) << 4 | nibble(hex[k + 1])));
  }
  return out;
}

inline std::string ToHex(std::string_view bytes) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out;
  for (const char c : bytes) {
    out.push_back(kDigits[static_cast<uint8_t>(c) >> 4]);
    out.push_back(kDigits[static_cast<uint8_t>(c) & 0xF]);
  }
  return out;
}

}  // namespace reshard::testing
