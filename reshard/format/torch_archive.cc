#include "reshard/format/torch_archive.h"

#include <string_view>
#include <unordered_map>

#include "reshard/base/checked_math.h"

namespace reshard::format {
namespace {

// torch.load takes the prefix from the first central-directory entry and refuses archives whose
// records do not all live under it.
Result<std::string> CommonPrefix(const std::vector<ZipRecord>& records) {
  if (records.empty()) return Corrupt("empty zip archive");
  const std::string& first = records.front().name;
  const size_t slash = first.find('/');
  if (slash == std::string::npos || slash == 0) {
    return Corrupt("record '" + first + "' is not inside a top-level folder");
  }
  std::string prefix = first.substr(0, slash);
  for (const ZipRecord& r : records) {
    if (r.name.size() <= slash || r.name.compare(0, slash + 1, prefix + "/") != 0) {
      return Corrupt("record '" + r.name + "' is outside the archive folder '" + prefix + "/'");
    }
  }
  return prefix;
}

using RecordIndex = std::unordered_map<std::string_view, const ZipRecord*>;

const ZipRecord* FindRecord(const RecordIndex& index, const std::string& name) {
  const auto it = index.find(name);
  return it == index.end() ? nullptr : it->second;
}

}  // namespace

Result<TorchArchive> TorchArchive::Open(const std::string& path, const PickleLimits& limits) {
  RS_ASSIGN_OR_RETURN(MappedFile file, MappedFile::Open(path));
  return FromFile(std::move(file), limits);
}

Result<TorchArchive> TorchArchive::FromFile(MappedFile file, const PickleLimits& limits) {
  TorchArchive a;
  a.file_ = std::move(file);
  const std::string& path = a.file_.path();
  auto annotate = [&](Status s) { return std::move(s).Annotate(path); };

  static constexpr std::string_view kZipMagic = "PK\x03\x04";
  if (a.file_.size() < kZipMagic.size() ||
      std::string_view(reinterpret_cast<const char*>(a.file_.data()), kZipMagic.size()) != kZipMagic) {
    return annotate(Unsupported("not a zip archive (wrong magic; legacy torch.save files are not supported)"));
  }
  auto records = ReadZipDirectory(a.file_.data(), a.file_.size());
  if (!records.ok()) return annotate(records.status());
  a.records_ = std::move(records).value();
  auto prefix = CommonPrefix(a.records_);
  if (!prefix.ok()) return annotate(prefix.status());
  a.prefix_ = std::move(prefix).value();
  const std::string base = a.prefix_ + "/";
  RecordIndex index;
  for (const ZipRecord& r : a.records_) index.emplace(r.name, &r);

  if (FindRecord(index, base + "constants.pkl") != nullptr) {
    return annotate(Unsupported("a TorchScript archive (constants.pkl), not a torch.save file"));
  }
  if (FindRecord(index, base + "version") == nullptr &&
      FindRecord(index, base + ".data/version") == nullptr) {
    return annotate(Corrupt("no '" + base + "version' record"));
  }
  const ZipRecord* pkl = FindRecord(index, base + "data.pkl");
  if (pkl == nullptr) return annotate(NotFound("no '" + base + "data.pkl' record"));
  const std::string_view pkl_bytes(reinterpret_cast<const char*>(a.file_.data() + pkl->data_offset),
                                   pkl->size);
  auto tree = ParsePickle(pkl_bytes, limits);
  if (!tree.ok()) return annotate(tree.status().Annotate("data.pkl"));
  a.tree_ = std::move(tree).value();

  auto tensors = CollectTensors(a.tree_);
  if (!tensors.ok()) return annotate(tensors.status().Annotate("data.pkl"));
  a.tensors_ = std::move(tensors).value();

  auto storages = CollectStorages(a.tree_);
  if (!storages.ok()) return annotate(storages.status().Annotate("data.pkl"));
  for (StorageRef& ref : storages.value()) {
    ArchiveStorage s;
    s.record = base + "data/" + ref.key;
    const ZipRecord* rec = FindRecord(index, s.record);
    if (rec == nullptr) return annotate(NotFound("no record '" + s.record + "' for a tensor storage"));
    if (rec->size != ref.nbytes) {
      return annotate(Corrupt("record '" + s.record + "' holds " + std::to_string(rec->size) +
                              " bytes but its storage needs " + std::to_string(ref.nbytes)));
    }
    s.data_offset = rec->data_offset;
    s.ref = std::move(ref);
    a.storage_order_.push_back(s.ref.key);
    a.storages_.emplace(s.ref.key, std::move(s));
  }
  return a;
}

}  // namespace reshard::format
