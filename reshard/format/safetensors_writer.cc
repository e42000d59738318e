#include "reshard/format/safetensors_writer.h"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>
#include <string_view>
#include <unordered_set>
#include <utility>

#include "reshard/base/checked_math.h"

namespace reshard::format {
namespace {

// safetensors readers refuse longer headers (SafeTensorError::HeaderTooLarge).
constexpr uint64_t kMaxHeaderSize = 100'000'000;
constexpr std::string_view kMetadataKey = "__metadata__";

// The declaration order of the safetensors Dtype enum ("increasing alignment order"), which
// its writer sorts by, descending. Codes of equal size are not ordered by size, so the rank is
// needed to reproduce the official byte layout, not just natural alignment.
constexpr std::array<std::string_view, 22> kDtypeRank = {
    "BOOL", "F4",  "F6_E2M3", "F6_E3M2", "U8",  "I8",  "F8_E5M2", "F8_E4M3",
    "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16", "F16", "BF16", "I32",
    "U32", "F32", "C64", "F64", "I64", "U64",
};

std::optional<size_t> DtypeRank(std::string_view code) {
  for (size_t i = 0; i < kDtypeRank.size(); ++i) {
    if (kDtypeRank[i] == code) return i;
  }
  return std::nullopt;
}

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), as a Rust String
// requires; it also keeps nlohmann::json::dump() from throwing on invalid input.
bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<unsigned char>(s[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t continuation = 0;  // bytes after the lead byte
    uint32_t min_code_point = 0;
    uint32_t code_point = 0;
    if ((lead & 0xE0) == 0xC0) {
      continuation = 1;
      min_code_point = 0x80;
      code_point = lead & 0x1F;
    } else if ((lead & 0xF0) == 0xE0) {
      continuation = 2;
      min_code_point = 0x800;
      code_point = lead & 0x0F;
    } else if ((lead & 0xF8) == 0xF0) {
      continuation = 3;
      min_code_point = 0x10000;
      code_point = lead & 0x07;
    } else {
      return false;
    }
    if (continuation > s.size() - i - 1) return false;
    for (size_t k = 1; k <= continuation; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      code_point = (code_point << 6) | (c & 0x3F);
    }
    if (code_point < min_code_point || code_point > 0x10FFFF ||
        (code_point >= 0xD800 && code_point <= 0xDFFF)) {
      return false;
    }
    i += continuation + 1;
  }
  return true;
}

// A JSON string literal, escaped as serde_json escapes (", \, and control characters; no
// escaping of '/' or non-ASCII). Precondition: valid UTF-8, so dump() cannot throw.
std::string JsonString(std::string_view s) { return nlohmann::json(std::string(s)).dump(); }

struct Planned {
  uint32_t input_index = 0;
  size_t rank = 0;
  std::string_view code;
  uint64_t bytes = 0;
};

Result<std::vector<Planned>> PlanTensors(const std::vector<SafetensorsTensor>& tensors) {
  if (tensors.size() >= UINT32_MAX) {
    return InvalidArgument(std::to_string(tensors.size()) +
                           " tensors exceed the 4294967294 a record id can name");
  }
  std::vector<Planned> planned;
  planned.reserve(tensors.size());
  std::unordered_set<std::string_view> names;
  names.reserve(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) {
    const SafetensorsTensor& t = tensors[i];
    const std::string label = "tensor " + std::to_string(i) + " '" + t.name + "'";
    if (t.name.empty()) return InvalidArgument("tensor " + std::to_string(i) + " has no name");
    if (t.name == kMetadataKey) return InvalidArgument(label + ": the name is reserved");
    if (!IsValidUtf8(t.name)) return InvalidArgument(label + ": the name is not valid UTF-8");
    if (!names.insert(t.name).second) return InvalidArgument(label + ": duplicate name");
    const DTypeInfo& info = Info(t.dtype);
    if (info.safetensors.empty()) {
      return Unsupported(label + ": dtype " + std::string(info.torch_name) +
                         " has no safetensors code");
    }
    const std::optional<size_t> rank = DtypeRank(info.safetensors);
    if (!rank) {
      return Internal(label + ": safetensors code " + std::string(info.safetensors) +
                      " has no writer rank");
    }
    std::optional<uint64_t> bytes = info.itemsize;
    for (const int64_t dim : t.shape) {
      if (dim < 0) {
        return InvalidArgument(label + ": negative dimension " + std::to_string(dim));
      }
      if (bytes) bytes = CheckedMul(*bytes, static_cast<uint64_t>(dim));
    }
    if (!bytes) return InvalidArgument(label + ": numel * itemsize overflows 64 bits");
    planned.push_back({static_cast<uint32_t>(i), *rank, info.safetensors, *bytes});
  }
  std::sort(planned.begin(), planned.end(), [&](const Planned& a, const Planned& b) {
    if (a.rank != b.rank) return a.rank > b.rank;
    return tensors[a.input_index].name < tensors[b.input_index].name;  // byte-wise, like Rust
  });
  return planned;
}

Result<std::string> MetadataJson(const std::map<std::string, std::string>& metadata) {
  std::string out = "{";
  for (const auto& [key, value] : metadata) {
    if (!IsValidUtf8(key) || !IsValidUtf8(value)) {
      return InvalidArgument("metadata entry '" + key + "' is not valid UTF-8");
    }
    if (out.size() > 1) out += ',';
    out += JsonString(key);
    out += ':';
    out += JsonString(value);
  }
  out += '}';
  return out;
}

}  // namespace

Result<SafetensorsLayout> LayoutSafetensors(const std::vector<SafetensorsTensor>& tensors,
                                            const std::map<std::string, std::string>& metadata) {
  RS_ASSIGN_OR_RETURN(const std::vector<Planned> planned, PlanTensors(tensors));

  // The JSON is assembled from escaped pieces rather than by a JSON object, because the key
  // order is part of the byte layout (nlohmann::json would sort keys alphabetically).
  std::string blob(8, '\0');  // the length prefix, filled in below
  blob += '{';
  bool first_key = true;
  if (!metadata.empty()) {
    RS_ASSIGN_OR_RETURN(const std::string meta, MetadataJson(metadata));
    blob += JsonString(kMetadataKey);
    blob += ':';
    blob += meta;
    first_key = false;
  }
  uint64_t buffer_offset = 0;
  std::vector<uint64_t> relative_offsets(tensors.size());
  for (const Planned& p : planned) {
    const SafetensorsTensor& t = tensors[p.input_index];
    const std::optional<uint64_t> end = CheckedAdd(buffer_offset, p.bytes);
    if (!end) {
      return InvalidArgument("tensor '" + t.name + "': data offsets pass UINT64_MAX");
    }
    if (!first_key) blob += ',';
    first_key = false;
    blob += JsonString(t.name);
    blob += ":{\"dtype\":\"";
    blob += p.code;
    blob += "\",\"shape\":[";
    for (size_t d = 0; d < t.shape.size(); ++d) {
      if (d > 0) blob += ',';
      blob += std::to_string(t.shape[d]);
    }
    blob += "],\"data_offsets\":[";
    blob += std::to_string(buffer_offset);
    blob += ',';
    blob += std::to_string(*end);
    blob += "]}";
    relative_offsets[p.input_index] = buffer_offset;
    buffer_offset = *end;
  }
  blob += '}';
  // Trailing spaces (never leading: older readers require the header to begin with '{').
  blob.append((8 - blob.size() % 8) % 8, ' ');
  const uint64_t header_size = blob.size() - 8;
  if (header_size > kMaxHeaderSize) {
    return InvalidArgument("safetensors header of " + std::to_string(header_size) +
                           " bytes exceeds the 100000000 bytes readers accept");
  }
  for (int k = 0; k < 8; ++k) blob[k] = static_cast<char>((header_size >> (8 * k)) & 0xFF);

  const uint64_t data_start = blob.size();
  const std::optional<uint64_t> file_size = CheckedAdd(data_start, buffer_offset);
  if (!file_size) {
    return InvalidArgument("safetensors file of " + std::to_string(buffer_offset) +
                           " data bytes passes UINT64_MAX");
  }

  std::vector<view::Segment> segments;
  segments.reserve(planned.size() + 1);
  segments.push_back({0, data_start, view::Segment::Kind::kInline, 0, 0});
  SafetensorsLayout layout;
  layout.file_order.reserve(planned.size());
  for (const Planned& p : planned) {
    layout.file_order.push_back(p.input_index);
    if (p.bytes == 0) continue;  // empty tensors own no bytes and no segment
    segments.push_back({data_start + relative_offsets[p.input_index], p.bytes,
                        view::Segment::Kind::kData, p.input_index, 0});
  }
  std::vector<std::string> blobs;
  blobs.push_back(std::move(blob));
  RS_ASSIGN_OR_RETURN(layout.file, view::VirtualFile::Create(std::move(segments),
                                                             std::move(blobs)));
  layout.file_size = *file_size;
  layout.header_size = header_size;
  layout.data_start = data_start;
  layout.data_offsets.resize(tensors.size());
  layout.byte_sizes.resize(tensors.size());
  for (const Planned& p : planned) {
    layout.data_offsets[p.input_index] = data_start + relative_offsets[p.input_index];
    layout.byte_sizes[p.input_index] = p.bytes;
  }
  return layout;
}

}  // namespace reshard::format
