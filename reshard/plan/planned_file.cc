#include "reshard/plan/planned_file.h"

#include <utility>

#include "reshard/format/torch_archive_writer.h"

namespace reshard::plan {
namespace {

std::string BaseName(const std::string& path) {
  std::string name = path.substr(path.rfind('/') + 1);
  if (const size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0) name.resize(dot);
  return name;
}

}  // namespace

Result<PlannedFile> PlannedFile::Create(FilePlan plan, const std::vector<Source>& sources) {
  PlannedFile out;
  out.path_ = plan.path;
  std::vector<format::ArchiveStorageSpec> specs;
  specs.reserve(plan.storages.size());
  for (const StoragePlan& s : plan.storages) specs.push_back({s.key, s.nbytes()});
  RS_ASSIGN_OR_RETURN(out.storages_, PlannedStorages::Create(plan.path, std::move(plan.storages), sources));
  RS_ASSIGN_OR_RETURN(format::TorchArchiveLayout layout,
                      format::LayoutTorchArchive(plan.tree, specs, 64, BaseName(plan.path)));
  out.file_ = std::move(layout.zip.file);
  out.first_storage_entry_ = layout.first_storage_entry;
  return out;
}

Result<size_t> PlannedFile::Read(const SourceFiles& files, uint64_t offset, uint8_t* out, size_t length) const {
  auto fill = [&](uint32_t record, uint64_t record_offset, uint8_t* dest, size_t n) -> Status {
    return storages_.Read(files, record - first_storage_entry_, record_offset, dest, n);
  };
  return file_.Read(offset, out, length, fill);
}

}  // namespace reshard::plan
