// PlanModelStatesFile: one target rank's model-states file (deepspeed_native.md §3).
//
// ZeRO-1/2: <tag>/mp_rank_XX_model_states.pt, one per TP rank. ZeRO-3:
// <tag>/zero_pp_rank_D_mp_rank_XX_model_states.pt, one per (DP, TP) rank. The file is the
// source run's own model-states file (TP rank XX's when TP is unchanged, else rank 0's), every
// key kept in order, with the values that depend on the layout replaced:
//   module          trainable params: ZeRO-1/2 the TP-local slice of fp32.pt, rounded to the lp
//                   dtype (what the saving run's lp weights are: lp = RNE(fp32 master)); ZeRO-3
//                   an empty (0,) tensor of the lp dtype (the engine saves released params).
//                   Frozen params (plan/frozen_params.h): copied as they are at the source's own
//                   TP, DP, ZeRO stage and dtype; else their source values, in the lp dtype
//                   (kCopy, or RNE from a float32 source), ZeRO-3 targets the (0,) placeholder.
//                   Everything else (buffers, the _metadata) is copied from the source file byte
//                   for byte. A tied alias (plan/frozen_params.h ModuleAliases) is its parameter's
//                   new tensor, one storage for both as in DeepSpeed's own save.
//   param_shapes    one OrderedDict name -> torch.Size per flat group, in flat order
//   dp_world_size, mp_world_size, checkpoint_parallel_dimensions.tp_degree   the target's
//   frozen_param_shapes, frozen_param_fragments   None below ZeRO-2. Else, name -> TP-local
//                   torch.Size, and name -> the value: ZeRO-2 the module entry itself (one
//                   object, as DeepSpeed's param.detach() is on the CPU), ZeRO-3 the rank's
//                   ceil partition, zero padded (layout::PartitionZero3Param). Copied from the
//                   source where the frozen params are copied as they are; an empty OrderedDict
//                   when the model has none.
//   ds_config       the target's ds_config when one was given, else the source's
// lr_scheduler, global_steps, client state, ds_version: copied.
// Refused: frozen parameters at another TP degree, except as plan/frozen_params.h allows; a frozen
// parameter stored in a dtype other than float32 or the target's lp dtype.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// One flat group's entry of `param_shapes`: names and TP-local (ZeRO-3: full) shapes in flat order.
struct ParamShapeGroup {
  std::vector<std::string> names;
  std::vector<std::vector<int64_t>> shapes;
};

Result<FilePlan> PlanModelStatesFile(const ucp::UniversalCheckpoint& checkpoint, const Target& target, int tp_rank,
                                     int dp_rank, const std::vector<ParamShapeGroup>& param_shapes,
                                     SourceTable& sources);

}  // namespace reshard::plan
