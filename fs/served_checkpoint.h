// ServedCheckpoint: a universal checkpoint opened and planned for one target layout, with every
// target file laid out and every source file open: what `mount`, `materialize` and `plan` serve.
//
// Load() does all the work that depends on metadata (index, plan, pickles, zip directories);
// afterwards reading any byte of any file is arithmetic plus pread. Immutable after Load();
// Read() of files is safe from any number of threads. Movable, not copyable.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/checkpoint_plan.h"
#include "reshard/plan/planned_file.h"
#include "reshard/plan/planned_storages.h"
#include "reshard/plan/safetensors_view.h"
#include "reshard/plan/source_files.h"
#include "reshard/ucp/universal_checkpoint.h"
#include "fs/target_flags.h"

namespace reshard::fs {

class ServedCheckpoint {
 public:
  static Result<ServedCheckpoint> Load(const std::string& source, const TargetFlags& flags);
  // The same from a checkpoint opened already.
  static Result<ServedCheckpoint> Plan(std::shared_ptr<const ucp::UniversalCheckpoint> checkpoint,
                                       const TargetFlags& flags);

  const plan::Target& target() const { return target_; }
  const ucp::UniversalCheckpoint& checkpoint() const { return *checkpoint_; }
  // The tag string `latest` holds.
  const std::string& tag() const { return target_.tag; }
  const std::vector<plan::PlannedFile>& files() const { return *files_; }
  // views()[i] is files()[i] as safetensors, served at view_paths()[i]:
  // "<tag>/safetensors/<file name without .pt>.safetensors".
  const std::vector<plan::SafetensorsView>& views() const { return *views_; }
  const std::vector<std::string>& view_paths() const { return view_paths_; }
  const plan::SourceFiles& sources() const { return *sources_; }
  // A native source's universal view (plan/universal_view_plan.h): its planned files, and the
  // model-states files it shows as they are (served path, source path). Empty otherwise.
  const std::vector<plan::PlannedFile>& universal_files() const { return *universal_files_; }
  const std::vector<std::pair<std::string, std::string>>& universal_copies() const { return universal_copies_; }
  // The folder of the universal view ("" when there is none): what `latest_universal` holds.
  const std::string& universal_root() const { return universal_root_; }
  std::shared_ptr<const std::vector<plan::PlannedFile>> shared_universal_files() const { return universal_files_; }
  // The plain weights: the storages weights_storages() served through weights_view() at
  // weights_path() ("<tag>/model.safetensors"); both null when they cannot be served, for
  // weights_unavailable(). Only the view is served, so no torch.save layout is kept for them.
  std::shared_ptr<const plan::PlannedStorages> weights_storages() const { return weights_storages_; }
  std::shared_ptr<const plan::SafetensorsView> weights_view() const { return weights_view_; }
  const std::string& weights_path() const { return weights_path_; }
  const std::string& weights_unavailable() const { return weights_unavailable_; }
  // Shared ownership for consumers that outlive this object's scope (the FUSE contents).
  std::shared_ptr<const std::vector<plan::PlannedFile>> shared_files() const { return files_; }
  std::shared_ptr<const std::vector<plan::SafetensorsView>> shared_views() const { return views_; }
  std::shared_ptr<const plan::SourceFiles> shared_sources() const { return sources_; }

 private:
  plan::Target target_;
  std::shared_ptr<const ucp::UniversalCheckpoint> checkpoint_;
  std::shared_ptr<const std::vector<plan::PlannedFile>> files_;
  std::shared_ptr<const std::vector<plan::SafetensorsView>> views_;
  std::vector<std::string> view_paths_;
  std::shared_ptr<const plan::SourceFiles> sources_;
  std::shared_ptr<const std::vector<plan::PlannedFile>> universal_files_;
  std::vector<std::pair<std::string, std::string>> universal_copies_;
  std::string universal_root_;
  std::shared_ptr<const plan::PlannedStorages> weights_storages_;
  std::shared_ptr<const plan::SafetensorsView> weights_view_;
  std::string weights_path_;
  std::string weights_unavailable_;
};

}  // namespace reshard::fs
