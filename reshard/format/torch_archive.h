// TorchArchive: a torch.save zip file, opened for reading without loading tensor data.
//
// Open() maps the file, reads the zip directory (zip_reader.h), parses `<prefix>/data.pkl` into
// an inert PickleTree (pickle_reader.h) and matches every tensor in it (torch_tensor.h). The
// result says, for each tensor, which bytes of the file hold its storage: tensor bytes are
// never copied or touched here.
//
// Refused with a Status that names the file: a legacy (non-zip) torch.save file, a TorchScript
// archive (constants.pkl), records under more than one top-level folder, a missing data.pkl or
// version record, a storage whose record is missing or whose size differs from the persistent
// id's numel * itemsize, one storage key used with two different dtypes or sizes, and
// everything the zip and pickle readers refuse.
//
// Thread safety: immutable after Open(); const access from several threads is safe.
// Public header: C++17.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "reshard/base/mapped_file.h"
#include "reshard/base/status.h"
#include "reshard/format/pickle_reader.h"
#include "reshard/format/pickle_value.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/format/zip_reader.h"

namespace reshard::format {

// One storage record of the archive.
struct ArchiveStorage {
  StorageRef ref;         // as the persistent id names it
  std::string record;     // full record name, "<prefix>/data/<key>"
  uint64_t data_offset;   // absolute byte offset of the record's data in the file
};

class TorchArchive {
 public:
  static Result<TorchArchive> Open(const std::string& path, const PickleLimits& limits = {});
  // The same for a file opened already (MappedFile::OpenAt); messages name file.path().
  static Result<TorchArchive> FromFile(MappedFile file, const PickleLimits& limits = {});

  const std::string& path() const { return file_.path(); }
  const MappedFile& file() const { return file_; }
  const std::string& prefix() const { return prefix_; }
  const std::vector<ZipRecord>& records() const { return records_; }
  const PickleTree& tree() const { return tree_; }
  // Every distinct storage named by a persistent id, by key; storage_order() lists the keys in
  // order of first appearance in the pickle (the order torch.save writes their records).
  const std::map<std::string, ArchiveStorage>& storages() const { return storages_; }
  const std::vector<std::string>& storage_order() const { return storage_order_; }
  // Every tensor rebuild MatchTensor interprets, in depth-first order of first appearance.
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  // The bytes of the storage `key` inside the mapping.
  const uint8_t* StorageData(const ArchiveStorage& storage) const {
    return file_.data() + storage.data_offset;
  }

 private:
  MappedFile file_;
  std::string prefix_;
  std::vector<ZipRecord> records_;
  PickleTree tree_;
  std::map<std::string, ArchiveStorage> storages_;
  std::vector<std::string> storage_order_;
  std::vector<TensorRef> tensors_;
};

}  // namespace reshard::format
