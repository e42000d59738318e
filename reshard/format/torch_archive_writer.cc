#include "reshard/format/torch_archive_writer.h"

#include <map>

#include "reshard/format/pickle_writer.h"
#include "reshard/format/torch_tensor.h"

namespace reshard::format {
namespace {


// Every storage the tree names must be listed with its exact size, and every listed storage
// must be named by the pickle: a loader would otherwise fail (missing record) or hold dead bytes.
Status CheckStorages(const PickleTree& tree, const std::vector<ArchiveStorageSpec>& storages) {
  std::map<std::string, uint64_t> listed;
  for (const ArchiveStorageSpec& s : storages) {
    if (s.key.empty() || s.key.find('/') != std::string::npos) {
      return InvalidArgument("storage key '" + s.key + "' is empty or contains '/'");
    }
    if (!listed.emplace(s.key, s.nbytes).second) return InvalidArgument("storage key '" + s.key + "' repeated");
  }
  RS_ASSIGN_OR_RETURN(std::vector<StorageRef> named, CollectStorages(tree));
  std::map<std::string, bool> used;
  for (const StorageRef& ref : named) {
    const auto it = listed.find(ref.key);
    if (it == listed.end()) return InvalidArgument("the pickle names unlisted storage '" + ref.key + "'");
    if (it->second != ref.nbytes) {
      return InvalidArgument("storage '" + ref.key + "' is listed with " + std::to_string(it->second) +
                             " bytes but the pickle names " + std::to_string(ref.nbytes));
    }
    used[ref.key] = true;
  }
  for (const ArchiveStorageSpec& s : storages) {
    if (!used.count(s.key)) return InvalidArgument("storage '" + s.key + "' is not used by any tensor");
  }
  return Status::Ok();
}

}  // namespace

Result<TorchArchiveLayout> LayoutTorchArchive(const PickleTree& tree,
                                              const std::vector<ArchiveStorageSpec>& storages,
                                              uint32_t alignment, const std::string& archive_name) {
  if (archive_name.empty() || archive_name.find('/') != std::string::npos) {
    return InvalidArgument("archive name '" + archive_name + "' must be one non-empty path component");
  }
  const std::string prefix = archive_name + "/";
  RS_RETURN_IF_ERROR(CheckStorages(tree, storages));
  RS_ASSIGN_OR_RETURN(std::string pickle, WritePickle(tree, tree.root()));

  std::vector<ZipEntry> entries;
  entries.reserve(storages.size() + 3);
  auto add_inline = [&](const char* name, std::string content) {
    const uint64_t size = content.size();
    entries.push_back(ZipEntry{prefix + name, size, std::move(content)});
  };
  add_inline("data.pkl", std::move(pickle));
  add_inline("byteorder", "little");
  TorchArchiveLayout layout;
  layout.first_storage_entry = static_cast<uint32_t>(entries.size());
  for (const ArchiveStorageSpec& s : storages) {
    entries.push_back(ZipEntry{prefix + "data/" + s.key, s.nbytes, std::nullopt});
  }
  add_inline("version", "3\n");
  RS_ASSIGN_OR_RETURN(layout.zip, LayoutZip(entries, alignment));
  return layout;
}

}  // namespace reshard::format
