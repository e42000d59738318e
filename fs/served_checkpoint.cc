#include "fs/served_checkpoint.h"

#include <memory>
#include <utility>

#include "reshard/native/native_checkpoint.h"

namespace reshard::fs {

Result<ServedCheckpoint> ServedCheckpoint::Load(const std::string& source, const TargetFlags& flags) {
  RS_ASSIGN_OR_RETURN(ucp::UniversalCheckpoint ckpt, native::OpenCheckpointSource(source));
  return Plan(std::make_shared<const ucp::UniversalCheckpoint>(std::move(ckpt)), flags);
}

Result<ServedCheckpoint> ServedCheckpoint::Plan(std::shared_ptr<const ucp::UniversalCheckpoint> checkpoint,
                                                const TargetFlags& flags) {
  const ucp::UniversalCheckpoint& ckpt = *checkpoint;
  RS_ASSIGN_OR_RETURN(plan::Target target, ResolveTargetFlags(ckpt, flags));
  // Each target file is laid out as soon as it is planned, and its pickle tree dropped then.
  const size_t count = plan::TargetFileCount(target);
  auto files = std::make_shared<std::vector<plan::PlannedFile>>(count);
  auto views = std::make_shared<std::vector<plan::SafetensorsView>>(count);
  const std::string tag = plan::ServedTag(ckpt, target);
  ServedCheckpoint out;
  out.view_paths_.resize(count);
  auto lay_out = [&](size_t index, plan::FilePlan f, const std::vector<plan::Source>& sources) -> Status {
    if (index >= count) return Internal(f.path + ": planned as target file " + std::to_string(index));
    RS_ASSIGN_OR_RETURN((*views)[index], plan::SafetensorsView::Create(f));
    const std::string name = f.path.substr(f.path.rfind('/') + 1);
    out.view_paths_[index] = tag + "/safetensors/" + name.substr(0, name.rfind(".pt")) + ".safetensors";
    RS_ASSIGN_OR_RETURN((*files)[index], plan::PlannedFile::Create(std::move(f), sources));
    return Status::Ok();
  };
  RS_ASSIGN_OR_RETURN(plan::CheckpointPlan plan, plan::PlanCheckpoint(ckpt, target, lay_out));
  RS_ASSIGN_OR_RETURN(plan::SourceFiles sources, plan::SourceFiles::Open(plan.sources));
  auto universal = std::make_shared<std::vector<plan::PlannedFile>>();
  for (plan::FilePlan& f : plan.universal.files) {
    RS_ASSIGN_OR_RETURN(plan::PlannedFile file, plan::PlannedFile::Create(std::move(f), plan.sources));
    universal->push_back(std::move(file));
  }
  if (ckpt.native()) out.universal_root_ = plan::UniversalViewRoot(ckpt);
  if (plan.weights) {
    out.weights_path_ = plan.weights->path;
    RS_ASSIGN_OR_RETURN(plan::SafetensorsView view, plan::SafetensorsView::Create(*plan.weights));
    RS_ASSIGN_OR_RETURN(plan::PlannedStorages storages,
                        plan::PlannedStorages::Create(plan.weights->path, std::move(plan.weights->storages),
                                                      plan.sources));
    out.weights_view_ = std::make_shared<const plan::SafetensorsView>(std::move(view));
    out.weights_storages_ = std::make_shared<const plan::PlannedStorages>(std::move(storages));
    plan.weights.reset();  // its pickle tree was only needed for the view's names
  }
  out.weights_unavailable_ = std::move(plan.weights_unavailable);
  out.universal_files_ = std::move(universal);
  out.universal_copies_ = std::move(plan.universal.copies);
  out.target_ = plan.target;
  out.checkpoint_ = std::move(checkpoint);
  out.files_ = std::move(files);
  out.views_ = std::move(views);
  out.sources_ = std::make_shared<const plan::SourceFiles>(std::move(sources));
  return out;
}

}  // namespace reshard::fs
