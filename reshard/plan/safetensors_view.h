// SafetensorsView: the tensors of one planned torch.save file, served as a safetensors file,
// for loaders that are not torch.load (safetensors.safe_open, numpy, other languages).
//
// The view holds every tensor reachable from the file's root through dict keys (str or int)
// and list/tuple positions, named by the dotted path: "module.fc1.weight",
// "optimizer_state_dict.base_optimizer_state.state.0.exp_avg",
// "optimizer_state_dict.single_partition_of_fp32_groups.1". Values inside other objects (a loss
// scaler) are not tensors a safetensors reader could use and are left out; so are tensors that
// are not contiguous. A tensor reached twice (a tied weight) appears under each name. The
// header's __metadata__ is {"format": "pt"}. Bytes are the planned file's own storage bytes
// (PlannedStorages::Read): nothing is copied at plan time.
//
// Immutable after Create(); Read() is thread-safe. Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/planned_storages.h"
#include "reshard/plan/source_files.h"
#include "reshard/view/virtual_file.h"

namespace reshard::plan {

class SafetensorsView {
 public:
  // The view of the file `plan` describes; made before the plan's storages are handed to
  // PlannedFile::Create or PlannedStorages::Create (which take them), so nothing is copied.
  // Errors: a tensor whose storage the plan does not hold (kInternal); whatever
  // LayoutSafetensors refuses.
  static Result<SafetensorsView> Create(const FilePlan& plan);

  uint64_t size() const { return file_.size(); }

  // `storages` must be made from the storages of the plan given to Create (PlannedFile::storages()
  // of its PlannedFile, or PlannedStorages::Create of them): the view reads them by plan number.
  Result<size_t> Read(const PlannedStorages& storages, const SourceFiles& files, uint64_t offset, uint8_t* out,
                      size_t length) const;

 private:
  struct Piece {
    uint32_t storage = 0;      // index into the planned file's storages
    uint64_t byte_offset = 0;  // of the tensor's first element in its storage
  };

  view::VirtualFile file_;
  std::vector<Piece> pieces_;  // per tensor, in the order given to LayoutSafetensors
};

}  // namespace reshard::plan
