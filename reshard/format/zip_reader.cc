#include "reshard/format/zip_reader.h"

#include <cstdio>
#include <string_view>

#include "reshard/base/checked_math.h"
#include "reshard/format/zip_format.h"

namespace reshard::format {
namespace {

using zip::LoadLe16;
using zip::LoadLe32;
using zip::LoadLe64;

std::string Hex(uint32_t value, int digits) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%0*x", digits, static_cast<unsigned>(value));
  return buf;
}

// Names come from the file: quote them, escape non-printable bytes and cap the length so that a
// hostile name cannot garble a log line.
std::string Quoted(std::string_view name) {
  constexpr size_t kMaxShown = 200;
  std::string out = "'";
  for (size_t i = 0; i < name.size() && i < kMaxShown; ++i) {
    const auto c = static_cast<unsigned char>(name[i]);
    if (c < 0x20 || c >= 0x7F || c == '\'' || c == '\\') {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out.push_back(static_cast<char>(c));
    }
  }
  if (name.size() > kMaxShown) out += "...";
  out += "'";
  return out;
}

std::string RecordName(std::string_view name) { return "record " + Quoted(name); }

// Where the central directory is, from the EOCD and, when present, the zip64 end records.
struct DirectoryBounds {
  uint64_t entries = 0;
  uint64_t cd_offset = 0;
  uint64_t cd_size = 0;
  uint64_t end_records = 0;  // offset of the first end record (zip64 EOCD or EOCD)
};

// Scans back from the end for an EOCD signature whose comment length fits in the file. The first
// match from the end wins, as in miniz; a comment that itself contains the signature would need
// a forged length to be mistaken for the record.
Result<uint64_t> FindEocd(const uint8_t* data, uint64_t size) {
  const uint64_t lowest = size > zip::kMaxEocdScan ? size - zip::kMaxEocdScan : 0;
  for (uint64_t pos = size - zip::kEocdSize;; --pos) {
    if (LoadLe32(data + pos) == zip::kEocdSignature &&
        LoadLe16(data + pos + zip::kEocdCommentLength) <= size - pos - zip::kEocdSize) {
      return pos;
    }
    if (pos == lowest) break;
  }
  return Corrupt("no end of central directory record (50 4B 05 06) in the last " +
                 std::to_string(size - lowest) + " bytes of the " + std::to_string(size) +
                 "-byte file");
}

Result<DirectoryBounds> ReadEndRecords(const uint8_t* data, uint64_t size) {
  RS_ASSIGN_OR_RETURN(const uint64_t eocd, FindEocd(data, size));
  const uint8_t* e = data + eocd;
  DirectoryBounds b;
  const bool zip64 = eocd >= zip::kZip64LocatorSize &&
                     LoadLe32(data + eocd - zip::kZip64LocatorSize) == zip::kZip64LocatorSignature;
  if (!zip64) {
    const uint16_t disk = LoadLe16(e + zip::kEocdThisDisk);
    const uint16_t cd_disk = LoadLe16(e + zip::kEocdCdDisk);
    const uint16_t on_disk = LoadLe16(e + zip::kEocdEntriesOnDisk);
    b.entries = LoadLe16(e + zip::kEocdEntries);
    if (disk != 0 || cd_disk != 0 || on_disk != b.entries) {
      return Unsupported("multi-disk archive: end of central directory names disk " +
                         std::to_string(disk) + ", directory disk " + std::to_string(cd_disk) +
                         ", " + std::to_string(on_disk) + " of " + std::to_string(b.entries) +
                         " entries on this disk");
    }
    b.cd_size = LoadLe32(e + zip::kEocdCdSize);
    b.cd_offset = LoadLe32(e + zip::kEocdCdOffset);
    b.end_records = eocd;
  } else {
    const uint64_t locator = eocd - zip::kZip64LocatorSize;
    const uint8_t* l = data + locator;
    const uint32_t eocd_disk = LoadLe32(l + zip::kZip64LocatorEocdDisk);
    const uint32_t disks = LoadLe32(l + zip::kZip64LocatorTotalDisks);
    if (eocd_disk != 0 || disks > 1) {
      return Unsupported("multi-disk archive: zip64 locator names disk " +
                         std::to_string(eocd_disk) + " of " + std::to_string(disks));
    }
    const uint64_t z64 = LoadLe64(l + zip::kZip64LocatorEocdOffset);
    if (z64 > locator || zip::kZip64EocdSize > locator - z64) {
      return Corrupt("zip64 end of central directory at offset " + std::to_string(z64) +
                     " (56 bytes) does not end before its locator at " +
                     std::to_string(locator));
    }
    const uint8_t* z = data + z64;
    if (LoadLe32(z) != zip::kZip64EocdSignature) {
      return Corrupt("zip64 end of central directory at offset " + std::to_string(z64) +
                     " has signature " + Hex(LoadLe32(z), 8) + " (expected " +
                     Hex(zip::kZip64EocdSignature, 8) + ")");
    }
    const uint32_t disk = LoadLe32(z + zip::kZip64EocdThisDisk);
    const uint32_t cd_disk = LoadLe32(z + zip::kZip64EocdCdDisk);
    const uint64_t on_disk = LoadLe64(z + zip::kZip64EocdEntriesOnDisk);
    b.entries = LoadLe64(z + zip::kZip64EocdEntries);
    if (disk != 0 || cd_disk != 0 || on_disk != b.entries) {
      return Unsupported("multi-disk archive: zip64 end of central directory names disk " +
                         std::to_string(disk) + ", directory disk " + std::to_string(cd_disk) +
                         ", " + std::to_string(on_disk) + " of " + std::to_string(b.entries) +
                         " entries on this disk");
    }
    // Like miniz, take all counts and offsets from the zip64 record once it exists: the EOCD's
    // 16/32-bit copies are clamped markers for large archives.
    b.cd_size = LoadLe64(z + zip::kZip64EocdCdSize);
    b.cd_offset = LoadLe64(z + zip::kZip64EocdCdOffset);
    b.end_records = z64;
  }
  if (b.cd_offset > b.end_records || b.cd_size > b.end_records - b.cd_offset) {
    return Corrupt("central directory at offset " + std::to_string(b.cd_offset) + " of " +
                   std::to_string(b.cd_size) + " bytes runs past the end records at " +
                   std::to_string(b.end_records));
  }
  // Every entry takes at least 46 bytes; this also bounds the vector reserved below.
  const std::optional<uint64_t> min_size = CheckedMul(b.entries, zip::kCentralHeaderSize);
  if (!min_size || *min_size > b.cd_size) {
    return Corrupt("central directory of " + std::to_string(b.cd_size) +
                   " bytes cannot hold the " + std::to_string(b.entries) +
                   " entries declared (46 bytes each at least)");
  }
  return b;
}

// Sizes and offset of a central entry after applying its zip64 extra field.
struct EntryFields {
  uint64_t size = 0;
  uint64_t compressed_size = 0;
  uint64_t local_header_offset = 0;
  uint32_t disk_start = 0;
};

// Walks the extra fields [p, end) of a central entry and replaces every marker value in `f` by
// its zip64 counterpart, in the order APPNOTE 4.5.3 fixes.
Status ApplyZip64Extra(const std::string& name, const uint8_t* p, const uint8_t* end,
                       bool size_marker, bool compressed_marker, bool offset_marker,
                       bool disk_marker, EntryFields& f) {
  bool found = false;
  while (p != end) {
    if (zip::kExtraHeaderSize > static_cast<uint64_t>(end - p)) {
      return Corrupt(RecordName(name) + ": extra field header truncated (" +
                     std::to_string(end - p) + " bytes left of the extra area)");
    }
    const uint16_t id = LoadLe16(p);
    const uint16_t len = LoadLe16(p + 2);
    p += zip::kExtraHeaderSize;
    if (len > static_cast<uint64_t>(end - p)) {
      return Corrupt(RecordName(name) + ": extra field " + Hex(id, 4) + " of " +
                     std::to_string(len) + " bytes runs past the extra area (" +
                     std::to_string(end - p) + " bytes left)");
    }
    if (id == zip::kZip64ExtraId && !found) {
      found = true;
      const uint8_t* q = p;
      const uint8_t* q_end = p + len;
      auto take = [&](bool marker, size_t width, const char* what, uint64_t& value) -> Status {
        if (!marker) return Status::Ok();
        if (width > static_cast<uint64_t>(q_end - q)) {
          return Corrupt(RecordName(name) + ": zip64 extra field of " + std::to_string(len) +
                         " bytes lacks the " + what);
        }
        value = width == 8 ? LoadLe64(q) : LoadLe32(q);
        q += width;
        return Status::Ok();
      };
      uint64_t disk = f.disk_start;
      RS_RETURN_IF_ERROR(take(size_marker, 8, "uncompressed size", f.size));
      RS_RETURN_IF_ERROR(take(compressed_marker, 8, "compressed size", f.compressed_size));
      RS_RETURN_IF_ERROR(take(offset_marker, 8, "local header offset", f.local_header_offset));
      RS_RETURN_IF_ERROR(take(disk_marker, 4, "disk start", disk));
      f.disk_start = static_cast<uint32_t>(disk);
    }
    p += len;
  }
  if ((size_marker || compressed_marker || offset_marker || disk_marker) && !found) {
    return Corrupt(RecordName(name) +
                   ": central entry holds a zip64 marker (0xFFFFFFFF/0xFFFF) but no zip64 "
                   "extra field");
  }
  return Status::Ok();
}

// Parses the central entry at `pos` (inside [.., cd_end)) and its local header; advances `pos`.
Result<ZipRecord> ReadEntry(const uint8_t* data, const DirectoryBounds& b, uint64_t index,
                            uint64_t& pos) {
  const uint64_t cd_end = b.cd_offset + b.cd_size;  // in bounds: checked by ReadEndRecords
  if (zip::kCentralHeaderSize > cd_end - pos) {
    return Corrupt("central directory entry #" + std::to_string(index) + " at offset " +
                   std::to_string(pos) + " runs past the directory end " +
                   std::to_string(cd_end) + " (" + std::to_string(b.entries) +
                   " entries declared)");
  }
  const uint8_t* c = data + pos;
  if (LoadLe32(c) != zip::kCentralHeaderSignature) {
    return Corrupt("central directory entry #" + std::to_string(index) + " at offset " +
                   std::to_string(pos) + " has signature " + Hex(LoadLe32(c), 8) +
                   " (expected " + Hex(zip::kCentralHeaderSignature, 8) + ")");
  }
  const uint16_t name_len = LoadLe16(c + zip::kCentralNameLength);
  const uint16_t extra_len = LoadLe16(c + zip::kCentralExtraLength);
  const uint16_t comment_len = LoadLe16(c + zip::kCentralCommentLength);
  const uint64_t variable = uint64_t{name_len} + extra_len + comment_len;
  if (variable > cd_end - pos - zip::kCentralHeaderSize) {
    return Corrupt("central directory entry #" + std::to_string(index) + " at offset " +
                   std::to_string(pos) + ": name, extra and comment (" +
                   std::to_string(name_len) + "+" + std::to_string(extra_len) + "+" +
                   std::to_string(comment_len) + " bytes) run past the directory end " +
                   std::to_string(cd_end));
  }
  ZipRecord r;
  r.name.assign(reinterpret_cast<const char*>(c + zip::kCentralHeaderSize), name_len);
  r.crc32 = LoadLe32(c + zip::kCentralCrc32);
  const uint16_t flags = LoadLe16(c + zip::kCentralFlags);
  const uint16_t method = LoadLe16(c + zip::kCentralMethod);
  const uint32_t size32 = LoadLe32(c + zip::kCentralUncompressedSize);
  const uint32_t compressed32 = LoadLe32(c + zip::kCentralCompressedSize);
  const uint32_t offset32 = LoadLe32(c + zip::kCentralLocalHeaderOffset);
  const uint16_t disk16 = LoadLe16(c + zip::kCentralDiskStart);
  EntryFields f{size32, compressed32, offset32, disk16};
  const uint8_t* extra = c + zip::kCentralHeaderSize + name_len;
  RS_RETURN_IF_ERROR(ApplyZip64Extra(r.name, extra, extra + extra_len, size32 == zip::kMarker32,
                                     compressed32 == zip::kMarker32, offset32 == zip::kMarker32,
                                     disk16 == zip::kMarker16, f));
  pos += zip::kCentralHeaderSize + variable;

  // Refusals come after the zip64 fields are known, so that sizes in messages are the real ones.
  if (flags & zip::kFlagEncrypted) {
    return Unsupported(RecordName(r.name) + " is encrypted (flags " + Hex(flags, 4) + ")");
  }
  if (method != zip::kMethodStored) {
    return Unsupported(RecordName(r.name) + " is compressed (method " + std::to_string(method) +
                       ")");
  }
  if (f.compressed_size != f.size) {
    return Corrupt(RecordName(r.name) + " is stored but its compressed size " +
                   std::to_string(f.compressed_size) + " differs from its size " +
                   std::to_string(f.size));
  }
  if (f.disk_start != 0) {
    return Unsupported(RecordName(r.name) + " starts on disk " + std::to_string(f.disk_start) +
                       " (multi-disk archives are unsupported)");
  }
  r.size = f.size;
  r.local_header_offset = f.local_header_offset;

  // Local header and data must lie in the record area [0, cd_offset): torch.load takes the data
  // offset from the local header's own name and extra lengths (the 'FB' padding lives there).
  const uint64_t lho = f.local_header_offset;
  const uint64_t area = b.cd_offset;
  if (lho > area || zip::kLocalHeaderSize > area - lho) {
    return Corrupt(RecordName(r.name) + ": local header offset " + std::to_string(lho) +
                   " (30 bytes) is outside the record area [0, " + std::to_string(area) + ")");
  }
  const uint8_t* l = data + lho;
  if (LoadLe32(l) != zip::kLocalHeaderSignature) {
    return Corrupt(RecordName(r.name) + ": local header at offset " + std::to_string(lho) +
                   " has signature " + Hex(LoadLe32(l), 8) + " (expected " +
                   Hex(zip::kLocalHeaderSignature, 8) + ")");
  }
  const uint16_t local_name_len = LoadLe16(l + zip::kLocalNameLength);
  const uint16_t local_extra_len = LoadLe16(l + zip::kLocalExtraLength);
  const uint64_t local_variable = uint64_t{local_name_len} + local_extra_len;
  if (local_variable > area - lho - zip::kLocalHeaderSize) {
    return Corrupt(RecordName(r.name) + ": local header at offset " + std::to_string(lho) +
                   " with " + std::to_string(local_name_len) + "-byte name and " +
                   std::to_string(local_extra_len) + "-byte extra runs past the record area [0, " +
                   std::to_string(area) + ")");
  }
  // Python's zipfile refuses a local name that differs from the central one; checking it too
  // catches a directory whose offsets point into the wrong header.
  const std::string_view local_name(reinterpret_cast<const char*>(l + zip::kLocalHeaderSize),
                                    local_name_len);
  if (local_name != r.name) {
    return Corrupt(RecordName(r.name) + ": local header at offset " + std::to_string(lho) +
                   " names " + Quoted(local_name));
  }
  r.data_offset = lho + zip::kLocalHeaderSize + local_variable;  // < area: checked above
  if (r.size > area - r.data_offset) {
    return Corrupt(RecordName(r.name) + ": data of " + std::to_string(r.size) +
                   " bytes at offset " + std::to_string(r.data_offset) +
                   " runs past the record area [0, " + std::to_string(area) + ")");
  }
  return r;
}

}  // namespace

Result<std::vector<ZipRecord>> ReadZipDirectory(const uint8_t* data, uint64_t size) {
  if (size < zip::kEocdSize) {
    return Corrupt("file of " + std::to_string(size) +
                   " bytes is too short to be a zip archive (at least 22 bytes)");
  }
  // torch.load takes the zip path only for files starting with a local header; anything else is
  // a legacy pickle (or not a checkpoint), so we refuse it here with the bytes we saw.
  if (LoadLe32(data) != zip::kLocalHeaderSignature) {
    return Corrupt("not a zip archive: file starts with " + Hex(LoadLe32(data), 8) +
                   " instead of the local header signature 50 4B 03 04");
  }
  RS_ASSIGN_OR_RETURN(const DirectoryBounds b, ReadEndRecords(data, size));
  std::vector<ZipRecord> records;
  records.reserve(b.entries);  // bounded by cd_size / 46 <= size / 46
  uint64_t pos = b.cd_offset;
  for (uint64_t i = 0; i < b.entries; ++i) {
    RS_ASSIGN_OR_RETURN(ZipRecord r, ReadEntry(data, b, i, pos));
    records.push_back(std::move(r));
  }
  const uint64_t cd_end = b.cd_offset + b.cd_size;
  if (pos != cd_end) {
    return Corrupt("central directory has " + std::to_string(cd_end - pos) +
                   " bytes left after the " + std::to_string(b.entries) +
                   " entries declared (entry count mismatch)");
  }
  return records;
}

}  // namespace reshard::format
