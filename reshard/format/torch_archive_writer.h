// LayoutTorchArchive: a torch.save zip planned from metadata alone, served lazily.
//
// Given a pickle tree whose tensors name storages by key (torch_tensor.h) and the byte size of
// each storage, this computes the whole file: records
// (`archive` is `archive_name`; torch.save uses the file's base name without extension)
//   archive/data.pkl            the protocol-2 pickle (pickle_writer.h), real CRC-32
//   archive/byteorder           "little", real CRC-32
//   archive/data/<key>          one per storage, in the order given, bytes supplied on read
//   archive/version             "3\n", real CRC-32
// laid out exactly as torch's own writer does (zip_writer.h: 64-byte aligned data, data
// descriptors, zip64 end records). No `.format_version` record is written, so torch.load reads
// each record's offset from its local header instead of recomputing torch's own layout.
//
// CRC-32 of storage records: 0, as torch.save(..., compute_crc32=False) writes them. torch.load
// (Python, weights_only, mmap, LibTorch) never verifies CRCs, so every torch loader accepts the
// files. A generic zip tool that reads a tensor member to its end (`unzip -t`, Python zipfile's
// read()/testzip()) reports a CRC mismatch on those members; the metadata members read cleanly.
// A real CRC would need every tensor byte before the central directory could be served.
//
// The result is immutable and its VirtualFile is safe to Read() from many threads.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"
#include "reshard/format/zip_writer.h"

namespace reshard::format {

struct ArchiveStorageSpec {
  std::string key;  // the persistent-id key; the record is archive/data/<key>
  uint64_t nbytes;  // exact record size: numel * itemsize of the storage
};

struct TorchArchiveLayout {
  ZipLayout zip;
  // kData segments of zip.file name zip entries; storage k is entry first_storage_entry + k.
  uint32_t first_storage_entry = 0;
};

// Errors: the pickle writer's; kInvalidArgument when a key is empty, repeated, or contains '/',
// when the tree's tensors name a key missing from `storages` or with another size, or when a
// storage is not referenced by any tensor; when `archive_name` is empty or contains '/'.
Result<TorchArchiveLayout> LayoutTorchArchive(const PickleTree& tree,
                                              const std::vector<ArchiveStorageSpec>& storages,
                                              uint32_t alignment = 64,
                                              const std::string& archive_name = "archive");

}  // namespace reshard::format
