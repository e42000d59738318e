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
  RS_ASSIGN_OR_RETURN(plan::CheckpointPlan plan, plan::PlanCheckpoint(ckpt, target));
  RS_ASSIGN_OR_RETURN(plan::SourceFiles sources, plan::SourceFiles::Open(plan.sources));
  auto files = std::make_shared<std::vector<plan::PlannedFile>>();
  auto views = std::make_shared<std::vector<plan::SafetensorsView>>();
  ServedCheckpoint out;
  for (plan::FilePlan& f : plan.files) {
    RS_ASSIGN_OR_RETURN(plan::SafetensorsView view, plan::SafetensorsView::Create(f));
    const std::string name = f.path.substr(f.path.rfind('/') + 1);
    out.view_paths_.push_back(plan.target.tag + "/safetensors/" + name.substr(0, name.rfind(".pt")) + ".safetensors");
    RS_ASSIGN_OR_RETURN(plan::PlannedFile file, plan::PlannedFile::Create(std::move(f), plan.sources));
    files->push_back(std::move(file));
    views->push_back(std::move(view));
  }
  auto universal = std::make_shared<std::vector<plan::PlannedFile>>();
  for (plan::FilePlan& f : plan.universal.files) {
    RS_ASSIGN_OR_RETURN(plan::PlannedFile file, plan::PlannedFile::Create(std::move(f), plan.sources));
    universal->push_back(std::move(file));
  }
  if (ckpt.native()) out.universal_root_ = plan::UniversalViewRoot(ckpt);
  auto weights_files = std::make_shared<std::vector<plan::PlannedFile>>();
  auto weights_views = std::make_shared<std::vector<plan::SafetensorsView>>();
  if (plan.weights) {
    out.weights_path_ = plan.weights->path;
    RS_ASSIGN_OR_RETURN(plan::SafetensorsView view, plan::SafetensorsView::Create(*plan.weights));
    RS_ASSIGN_OR_RETURN(plan::PlannedFile file, plan::PlannedFile::Create(std::move(*plan.weights), plan.sources));
    weights_files->push_back(std::move(file));
    weights_views->push_back(std::move(view));
  }
  out.weights_files_ = std::move(weights_files);
  out.weights_views_ = std::move(weights_views);
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
