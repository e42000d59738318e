// zip_writer: the byte layout of a torch.save zip archive, planned without tensor data.
//
// LayoutZip() computes, from names and sizes alone, every byte of a zip archive that torch.load
// accepts except the data of "data records" (tensor storages), and returns it as a VirtualFile
// whose kData segments ask the caller for those bytes on read. The layout is exactly the one
// PyTorchStreamWriter + PyTorch's miniz write (torch_format.md §2), so for the same records in
// the same order the file is byte-identical to torch.save's, CRC fields aside (see below):
//
//   - records in input order, each: local header (flags 0x0808, or 0x0800 when empty; method 0;
//     time, date, CRC and sizes 0), [zip64 extra], 'FB' padding extra filled with 'Z' so that
//     the data starts at a multiple of `alignment`, the data, then a data descriptor (16 bytes,
//     or 24 when the local header has a zip64 extra; none for an empty record);
//   - the central directory, zip64 end of central directory, zip64 locator and EOCD, always;
//   - zip64 extras when a size or local header offset is >= 0xFFFFFFFF (>=, as miniz does).
//
// CRC-32 choice. A metadata record (ZipEntry::content set: data.pkl, byteorder, version, ...)
// gets its real CRC-32 in its descriptor and central entry, so that zipfile-based tools (pickle
// scanners) can read it. A data record gets CRC 0, as torch.save writes under
// torch.serialization.set_crc32_options(False): a real CRC would need every tensor's bytes before
// the central directory could be served. Consequence: torch.load (Python, C++, weights_only,
// mmap) never checks CRCs and loads the file; generic readers that verify CRCs at the end of a
// member (Python zipfile reading a tensor record to its end, testzip(), `unzip -t`, Rust `zip`)
// report a bad CRC for tensor records.
//
// Thread safety: a pure function; the result owns everything it refers to. Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/view/virtual_file.h"

namespace reshard::format {

struct ZipEntry {
  // The full record name, prefix included ("archive/data/0"). UTF-8, non-empty, < 65536 bytes.
  std::string name;
  // Record size in bytes. For a metadata record it must equal content->size().
  uint64_t size = 0;
  // Set for metadata records: the bytes, known at layout time (placed inline, CRC computed).
  // Unset for data records: the bytes come from the DataFill at read time, CRC written as 0.
  std::optional<std::string> content;
};

struct ZipLayout {
  uint64_t file_size = 0;  // == file.size()
  // Per input entry index: absolute offsets of its local header and first data byte (the data
  // offset is a multiple of the alignment), and the CRC-32 written for it (0 for data records).
  std::vector<uint64_t> local_header_offsets;
  std::vector<uint64_t> data_offsets;
  std::vector<uint32_t> crc32s;
  // The central directory [central_directory_offset, + central_directory_size); the 98 bytes of
  // end records follow it.
  uint64_t central_directory_offset = 0;
  uint64_t central_directory_size = 0;
  // The archive. Each non-empty data record i is one kData segment with index i and source
  // offsets [0, size); everything else (headers, padding, metadata content, descriptors,
  // directory, end records) is kInline. Adjacent inline bytes share one segment.
  view::VirtualFile file;
};

// Plans the archive of `entries`, in that order, with data aligned to `alignment` bytes.
// Errors (kInvalidArgument, naming the entry): alignment outside [1, 65536]; an empty name; a
// name of 65536 bytes or more; two names equal ignoring ASCII case (torch's miniz looks names up
// case-insensitively); content whose size differs from `size`; more than 2^32 - 1 entries; a
// padding that does not fit the 65535-byte extra field (only possible with alignment > 65504);
// offsets past UINT64_MAX.
Result<ZipLayout> LayoutZip(const std::vector<ZipEntry>& entries, uint32_t alignment = 64);

}  // namespace reshard::format
