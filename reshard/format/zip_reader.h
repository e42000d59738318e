// zip_reader: the record directory of a torch.save zip archive (stored records only).
//
// ReadZipDirectory() parses the archive tail and central directory of a whole file held in
// memory (usually a MappedFile) and returns where each record's bytes are; it copies no record
// data. It accepts what torch.save writes (zip64 end records, zip64 extras, the 'FB' padding
// extra in local headers) and, more generally, any single-disk archive of stored, unencrypted
// records. Layout details are in zip_format.h.
//
// What it checks, in order (first failure wins):
//   - the file starts with a local header signature (50 4B 03 04), as torch.load requires;
//   - an EOCD whose comment fits in the file lies within the last 65557 bytes (scanning back);
//   - when a zip64 locator precedes the EOCD, the zip64 EOCD it points to is in bounds and
//     signed, and its counts, size and offset replace the EOCD's;
//   - single disk: every disk number is 0 and entries-on-disk == entries;
//   - the central directory lies inside the file before the end records, and is large enough
//     for the declared entry count (46 bytes per entry at least);
//   - each of the declared entries: signature, lengths inside the directory, zip64 extra fields
//     present for every 0xFFFFFFFF/0xFFFF marker, no encryption (flag bit 0), method 0 (stored),
//     compressed size == size, disk start 0;
//   - the directory holds exactly the declared entries (no bytes left after the last one);
//   - each local header: in bounds, signed, and naming the same record as its central entry;
//     the record data [data_offset, data_offset + size) ends before the central directory.
//
// Not checked: CRC-32 (torch.load never checks it either, and tensor records written with
// torch.serialization.set_crc32_options(False), or by reshardfs, carry CRC 0); overlapping
// records; duplicate names; the 'archive/'-style prefix (the caller's business).
//
// Errors are Status values: kCorrupt for bytes that violate the format (truncation, bad
// signatures, counts, offsets or lengths out of bounds), kUnsupported for well-formed archives
// this reader does not handle (compressed or encrypted records, several disks). Messages name
// the record (or structure) and the offending values. All arithmetic on file values is checked.
//
// Thread safety: a pure function of its input; the result owns its strings. Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"

namespace reshard::format {

struct ZipRecord {
  std::string name;              // the full name, e.g. "archive/data/0"
  uint64_t data_offset = 0;      // absolute offset of the record's first data byte
  uint64_t size = 0;             // bytes (stored, so compressed == uncompressed)
  uint32_t crc32 = 0;            // as recorded in the central directory; never verified
  uint64_t local_header_offset = 0;
};

// Reads the directory of the zip archive `data[0, size)` (the whole file). Records come in
// central-directory order. `data` is only read during the call; it may be null when size is 0.
Result<std::vector<ZipRecord>> ReadZipDirectory(const uint8_t* data, uint64_t size);

}  // namespace reshard::format
