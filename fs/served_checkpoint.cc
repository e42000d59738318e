#include "fs/served_checkpoint.h"

#include <utility>

namespace reshard::fs {

Result<ServedCheckpoint> ServedCheckpoint::Load(const std::string& source, const TargetFlags& flags) {
  RS_ASSIGN_OR_RETURN(ucp::UniversalCheckpoint ckpt, ucp::UniversalCheckpoint::Open(source));
  RS_ASSIGN_OR_RETURN(plan::Target target, ResolveTargetFlags(ckpt, flags));
  RS_ASSIGN_OR_RETURN(plan::CheckpointPlan plan, plan::PlanCheckpoint(ckpt, target));
  RS_ASSIGN_OR_RETURN(plan::SourceFiles sources, plan::SourceFiles::Open(plan.sources));
  auto files = std::make_shared<std::vector<plan::PlannedFile>>();
  for (plan::FilePlan& f : plan.files) {
    RS_ASSIGN_OR_RETURN(plan::PlannedFile file, plan::PlannedFile::Create(std::move(f), plan.sources));
    files->push_back(std::move(file));
  }
  ServedCheckpoint out;
  out.target_ = plan.target;
  out.checkpoint_ = std::make_shared<const ucp::UniversalCheckpoint>(std::move(ckpt));
  out.files_ = std::move(files);
  out.sources_ = std::make_shared<const plan::SourceFiles>(std::move(sources));
  return out;
}

}  // namespace reshard::fs
