// zip_format.h: the zip structures torch.save archives use, shared by zip_reader and zip_writer.
//
// All integers are little-endian; offsets are absolute file offsets. A torch.save archive is
// (PKWARE APPNOTE 6.3, as written by PyTorchStreamWriter + PyTorch's miniz, torch_format.md §2):
//
//   [local header 0][data 0][descriptor 0] ... [local header n-1][data n-1][descriptor n-1]
//   [central entry 0] ... [central entry n-1][zip64 EOCD][zip64 locator][EOCD]
//
// Local file header (30 bytes + name + extra):
//   +0  u32 signature 50 4B 03 04        +14 u32 CRC-32 (0 when flag bit 3 is set)
//   +4  u16 version needed               +18 u32 compressed size (0 when bit 3 is set)
//   +6  u16 flags                        +22 u32 uncompressed size (0 when bit 3 is set)
//   +8  u16 method (0 = stored)          +26 u16 name length
//   +10 u16 time, +12 u16 date           +28 u16 extra length
//   +30 name, then extra fields: [zip64 extra] [FB padding: 46 42, u16 n, n x 'Z']
//
// Data descriptor (after the data, when flag bit 3 is set and the record is not empty):
//   +0 u32 signature 50 4B 07 08   +4 u32 CRC-32
//   +8 u32 compressed, +12 u32 uncompressed             (16 bytes)
//   +8 u64 compressed, +16 u64 uncompressed             (24 bytes, records with a zip64 extra)
//
// Central directory entry (46 bytes + name + extra + comment):
//   +0  u32 signature 50 4B 01 02        +24 u32 uncompressed size (0xFFFFFFFF: see zip64)
//   +4  u16 version made by              +28 u16 name length
//   +6  u16 version needed               +30 u16 extra length
//   +8  u16 flags                        +32 u16 comment length
//   +10 u16 method                       +34 u16 disk number start (0xFFFF: see zip64)
//   +12 u16 time, +14 u16 date           +36 u16 internal attributes
//   +16 u32 CRC-32                       +38 u32 external attributes
//   +20 u32 compressed size (0xFFFFFFFF: see zip64)   +42 u32 local header offset (0xFFFFFFFF)
//   +46 name, extra, comment
//
// Zip64 extended information extra field (id 0x0001), in the central directory:
//   +0 u16 id 0x0001, +2 u16 data length, then only the fields whose 32-bit (16-bit) value above
//   is the 0xFFFFFFFF (0xFFFF) marker, in this order: u64 uncompressed, u64 compressed,
//   u64 local header offset, u32 disk start.
//   In a local header miniz writes u64 size, u64 0 (compressed, unknown before the data) when
//   the size needs zip64, then u64 local header offset when the offset needs it.
//
// Zip64 end of central directory record (56 bytes; "zip64 EOCD"):
//   +0  u32 signature 50 4B 06 06        +24 u64 entries on this disk
//   +4  u64 size of the rest (44)        +32 u64 entries in total
//   +12 u16 version made by              +40 u64 central directory size
//   +14 u16 version needed               +48 u64 central directory offset
//   +16 u32 this disk, +20 u32 disk with the central directory
//
// Zip64 end of central directory locator (20 bytes):
//   +0 u32 signature 50 4B 06 07   +4 u32 disk with the zip64 EOCD
//   +8 u64 offset of the zip64 EOCD   +16 u32 total number of disks
//
// End of central directory record (22 bytes + comment; "EOCD"):
//   +0  u32 signature 50 4B 05 06        +10 u16 entries in total (0xFFFF: see zip64)
//   +4  u16 this disk                    +12 u32 central directory size (0xFFFFFFFF)
//   +6  u16 disk with the central dir    +16 u32 central directory offset (0xFFFFFFFF)
//   +8  u16 entries on this disk         +20 u16 comment length, then the comment
//
// Public header: C++17. Everything here is constexpr or inline and has no state.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace reshard::format::zip {

// Markers meaning "the real value is in the zip64 structures". miniz switches to zip64 when a
// value is >= the marker (not only >), and so do we.
inline constexpr uint32_t kMarker32 = 0xFFFFFFFF;
inline constexpr uint16_t kMarker16 = 0xFFFF;

// General-purpose flags and methods.
inline constexpr uint16_t kFlagEncrypted = 0x0001;
inline constexpr uint16_t kFlagDataDescriptor = 0x0008;
inline constexpr uint16_t kFlagUtf8 = 0x0800;
inline constexpr uint16_t kMethodStored = 0;

// Local file header.
inline constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
inline constexpr size_t kLocalHeaderSize = 30;
inline constexpr size_t kLocalFlags = 6;
inline constexpr size_t kLocalMethod = 8;
inline constexpr size_t kLocalNameLength = 26;
inline constexpr size_t kLocalExtraLength = 28;

// Data descriptor.
inline constexpr uint32_t kDataDescriptorSignature = 0x08074b50;
inline constexpr size_t kDataDescriptorSize = 16;
inline constexpr size_t kDataDescriptorZip64Size = 24;

// Central directory entry.
inline constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
inline constexpr size_t kCentralHeaderSize = 46;
inline constexpr size_t kCentralFlags = 8;
inline constexpr size_t kCentralMethod = 10;
inline constexpr size_t kCentralCrc32 = 16;
inline constexpr size_t kCentralCompressedSize = 20;
inline constexpr size_t kCentralUncompressedSize = 24;
inline constexpr size_t kCentralNameLength = 28;
inline constexpr size_t kCentralExtraLength = 30;
inline constexpr size_t kCentralCommentLength = 32;
inline constexpr size_t kCentralDiskStart = 34;
inline constexpr size_t kCentralLocalHeaderOffset = 42;

// Extra fields: every one starts with u16 id, u16 data length.
inline constexpr size_t kExtraHeaderSize = 4;
inline constexpr uint16_t kZip64ExtraId = 0x0001;
// PyTorchStreamWriter's alignment padding: id 'F','B' (0x4246 little-endian), filled with 'Z'.
inline constexpr uint16_t kPaddingExtraId = 0x4246;
inline constexpr uint8_t kPaddingByte = 'Z';
// The u16 extra-length field caps the local extra (zip64 extra + FB field + padding).
inline constexpr uint32_t kMaxExtraLength = 0xFFFF;

// Zip64 end of central directory record.
inline constexpr uint32_t kZip64EocdSignature = 0x06064b50;
inline constexpr size_t kZip64EocdSize = 56;
inline constexpr uint64_t kZip64EocdRemainingSize = kZip64EocdSize - 12;  // the "44" field
inline constexpr uint16_t kZip64VersionMadeBy = 0x031E;  // Unix, spec 3.0, as miniz writes
inline constexpr uint16_t kZip64VersionNeeded = 0x002D;  // 4.5: zip64
inline constexpr size_t kZip64EocdThisDisk = 16;
inline constexpr size_t kZip64EocdCdDisk = 20;
inline constexpr size_t kZip64EocdEntriesOnDisk = 24;
inline constexpr size_t kZip64EocdEntries = 32;
inline constexpr size_t kZip64EocdCdSize = 40;
inline constexpr size_t kZip64EocdCdOffset = 48;

// Zip64 end of central directory locator.
inline constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
inline constexpr size_t kZip64LocatorSize = 20;
inline constexpr size_t kZip64LocatorEocdDisk = 4;
inline constexpr size_t kZip64LocatorEocdOffset = 8;
inline constexpr size_t kZip64LocatorTotalDisks = 16;

// End of central directory record.
inline constexpr uint32_t kEocdSignature = 0x06054b50;
inline constexpr size_t kEocdSize = 22;
inline constexpr size_t kEocdThisDisk = 4;
inline constexpr size_t kEocdCdDisk = 6;
inline constexpr size_t kEocdEntriesOnDisk = 8;
inline constexpr size_t kEocdEntries = 10;
inline constexpr size_t kEocdCdSize = 12;
inline constexpr size_t kEocdCdOffset = 16;
inline constexpr size_t kEocdCommentLength = 20;
// The EOCD sits within the last 22 + 65535 (the longest comment) bytes of the file.
inline constexpr size_t kMaxEocdScan = kEocdSize + 0xFFFF;

// Little-endian loads from unaligned bytes. The caller has bounds-checked `p`.
inline uint16_t LoadLe16(const uint8_t* p) {
  return static_cast<uint16_t>(p[0] | (p[1] << 8));
}
inline uint32_t LoadLe32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
inline uint64_t LoadLe64(const uint8_t* p) {
  return static_cast<uint64_t>(LoadLe32(p)) | (static_cast<uint64_t>(LoadLe32(p + 4)) << 32);
}

// Little-endian appends to a byte string.
inline void AppendLe16(std::string& out, uint16_t v) {
  out.push_back(static_cast<char>(v & 0xFF));
  out.push_back(static_cast<char>(v >> 8));
}
inline void AppendLe32(std::string& out, uint32_t v) {
  AppendLe16(out, static_cast<uint16_t>(v & 0xFFFF));
  AppendLe16(out, static_cast<uint16_t>(v >> 16));
}
inline void AppendLe64(std::string& out, uint64_t v) {
  AppendLe32(out, static_cast<uint32_t>(v & 0xFFFFFFFF));
  AppendLe32(out, static_cast<uint32_t>(v >> 32));
}

}  // namespace reshard::format::zip
