// CheckpointPlan: every file of the target layout's native checkpoint, planned from a universal
// checkpoint without reading tensor data.
//
//   <tag>/mp_rank_XX_model_states.pt                     ZeRO-1/2, one per TP rank
//   <tag>/zero_pp_rank_D_mp_rank_XX_model_states.pt      ZeRO-3, one per (DP, TP) rank
//   <tag>/{bf16_}zero_pp_rank_D_mp_rank_XX_optim_states.pt   one per (DP, TP) rank
// in that order (model states by TP rank, then DP rank; optimizer states by TP rank, then DP
// rank). `latest` (the tag) is the caller's to serve. The one implementation of every rule is
// below this: layout/ (TP and ZeRO cuts) through plan/zero12_partition_plan.h and
// plan/zero3_partition_plan.h; the FUSE server, `materialize`, the GPU path and the tests all
// run the resulting plan.
//
// Errors: a target the checkpoint cannot take (kInvalidArgument: TP/DP < 1, a ZeRO stage other
// than 1-3, a TP split that does not divide, a vocab tensor without a padded size), inputs not
// served yet (kUnsupported, naming the parameter or file), and inconsistent checkpoints
// (kCorrupt). Immutable once built; share it freely between threads.
// Public header: C++17.
#pragma once

#include <cstddef>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/target.h"
#include "reshard/plan/universal_view_plan.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// Where PlanCheckpoint hands each target file as soon as it is planned, so that the caller can lay
// it out (PlannedFile::Create) and drop its pickle tree before the next file is planned: planning
// then holds one file's tree at a time rather than all of them (at 100,000 parameters those trees
// were most of the peak memory). `index` is the file's place in the order above, 0 to
// TargetFileCount(target) - 1, each exactly once; the calls come in planning order, which
// interleaves model-states and optimizer files. `sources` is the source table so far: it holds every
// source the file's extents name. An error the sink returns ends planning and is returned.
using FileSink = std::function<Status(size_t index, FilePlan file, const std::vector<Source>& sources)>;

struct CheckpointPlan {
  Target target;                 // as planned (tag resolved)
  std::vector<Source> sources;   // every universal file region the files read (the target files' too)
  // A native source only (plan/universal_view_plan.h): the universal checkpoint ds_to_universal
  // would write, under UniversalViewRoot(checkpoint); empty for a universal source.
  UniversalView universal;
  // The plain weights (plan/weights_plan.h), path "<tag>/model.safetensors" (served through a
  // SafetensorsView); unset when they cannot be served (any error of PlanWeights: the target
  // files are still served), with the reason in weights_unavailable.
  std::optional<FilePlan> weights;
  std::string weights_unavailable;
};

// Plans every target file, handing each to `sink`, then the universal view and the weights.
Result<CheckpointPlan> PlanCheckpoint(const ucp::UniversalCheckpoint& checkpoint, const Target& target,
                                      const FileSink& sink);

// The number of target files: TP model-states files (ZeRO-1/2) or TP x DP (ZeRO-3), plus TP x DP
// optimizer files.
size_t TargetFileCount(const Target& target);

// The tag a target is served under: target.tag, or the universal tag without "_universal".
std::string ServedTag(const ucp::UniversalCheckpoint& checkpoint, const Target& target);

// Where a native source's universal view is served: "<source tag>_universal" (the name
// ds_to_universal's usual --output_folder takes, and what `latest_universal` holds).
std::string UniversalViewRoot(const ucp::UniversalCheckpoint& checkpoint);

}  // namespace reshard::plan
