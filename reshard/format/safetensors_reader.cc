#include "reshard/format/safetensors_reader.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include <nlohmann/json.hpp>

#include "reshard/base/checked_math.h"

namespace reshard::format {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100'000'000;  // what the safetensors readers accept

Result<SafetensorsEntry> ParseEntry(const std::string& name, const nlohmann::json& value) {
  const std::string where = "safetensors tensor '" + name + "': ";
  if (!value.is_object()) return Corrupt(where + "not an object");
  const auto dtype_it = value.find("dtype");
  const auto shape_it = value.find("shape");
  const auto offsets_it = value.find("data_offsets");
  if (dtype_it == value.end() || shape_it == value.end() || offsets_it == value.end() || value.size() != 3) {
    return Corrupt(where + "needs exactly dtype, shape and data_offsets");
  }
  if (!dtype_it->is_string()) return Corrupt(where + "dtype is not a string");
  const std::optional<DType> dtype = DTypeFromSafetensors(dtype_it->get<std::string>());
  if (!dtype) return Corrupt(where + "unknown dtype " + dtype_it->get<std::string>());
  SafetensorsEntry entry;
  entry.name = name;
  entry.dtype = *dtype;
  if (!shape_it->is_array()) return Corrupt(where + "shape is not a list");
  uint64_t numel = 1;
  for (const nlohmann::json& dim : *shape_it) {
    if (!dim.is_number_unsigned()) return Corrupt(where + "shape holds a value that is not a non-negative integer");
    const uint64_t d = dim.get<uint64_t>();
    const std::optional<uint64_t> product = CheckedMul(numel, d);
    if (!product || d > static_cast<uint64_t>(INT64_MAX)) return Corrupt(where + "shape overflows");
    numel = *product;
    entry.shape.push_back(static_cast<int64_t>(d));
  }
  if (!offsets_it->is_array() || offsets_it->size() != 2 || !(*offsets_it)[0].is_number_unsigned() ||
      !(*offsets_it)[1].is_number_unsigned()) {
    return Corrupt(where + "data_offsets is not [begin, end]");
  }
  entry.begin = (*offsets_it)[0].get<uint64_t>();
  entry.end = (*offsets_it)[1].get<uint64_t>();
  const std::optional<uint64_t> nbytes = CheckedMul(numel, ItemSize(entry.dtype));
  if (entry.end < entry.begin || !nbytes || entry.end - entry.begin != *nbytes) {
    return Corrupt(where + "data_offsets [" + std::to_string(entry.begin) + ", " + std::to_string(entry.end) +
                   ") do not hold its " + std::to_string(numel) + " elements");
  }
  return entry;
}

}  // namespace

Result<uint64_t> SafetensorsHeaderLength(std::string_view prefix) {
  if (prefix.size() < 8) return Corrupt("safetensors: shorter than its 8-byte length prefix");
  uint8_t bytes[8];
  std::memcpy(bytes, prefix.data(), 8);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
  return n;
}

Result<SafetensorsHeader> ParseSafetensorsHeader(std::string_view prefix, uint64_t file_size) {
  RS_ASSIGN_OR_RETURN(const uint64_t length, SafetensorsHeaderLength(prefix));
  if (length > kMaxHeaderBytes) {
    return Corrupt("safetensors: header of " + std::to_string(length) + " bytes, above the 100000000 readers accept");
  }
  if (8 + length > file_size || 8 + length > prefix.size()) {
    return Corrupt("safetensors: header of " + std::to_string(length) + " bytes runs past the file's " +
                   std::to_string(file_size));
  }
  const nlohmann::json doc = nlohmann::json::parse(prefix.substr(8, length), nullptr, /*allow_exceptions=*/false);
  if (!doc.is_object()) return Corrupt("safetensors: the header is not a JSON object");
  SafetensorsHeader header;
  header.data_start = 8 + length;
  for (const auto& [name, value] : doc.items()) {
    if (name == "__metadata__") {
      if (!value.is_object() ||
          !std::all_of(value.begin(), value.end(), [](const nlohmann::json& v) { return v.is_string(); })) {
        return Corrupt("safetensors: __metadata__ is not a map of strings");
      }
      continue;
    }
    RS_ASSIGN_OR_RETURN(SafetensorsEntry entry, ParseEntry(name, value));
    header.tensors.push_back(std::move(entry));
  }
  std::sort(header.tensors.begin(), header.tensors.end(), [](const SafetensorsEntry& a, const SafetensorsEntry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t covered = 0;
  for (const SafetensorsEntry& t : header.tensors) {
    if (t.begin != covered) {
      return Corrupt("safetensors tensor '" + t.name + "': starts at " + std::to_string(t.begin) + ", not at " +
                     std::to_string(covered) + " (a hole or an overlap)");
    }
    covered = t.end;
  }
  if (file_size - header.data_start != covered) {
    return Corrupt("safetensors: the tensors end at " + std::to_string(covered) + " but the byte buffer holds " +
                   std::to_string(file_size - header.data_start));
  }
  return header;
}

}  // namespace reshard::format
