// PlanRankState: the optimizer and weight tensors one target rank's live DeepSpeed engine holds,
// as storage plans a filler (gpu/executor.h) writes straight into the engine's buffers.
//
// It is the native files' plan without the files: the same PlanZero12Rank / PlanZero3Rank
// partitions that the optimizer-states files serve, and the same PlanLpWeight slices that the
// model-states files serve, so the restore path and the mount agree by construction.
//
//   ZeRO-1/2   one FlatState per optimizer param group: the rank's flat fp32 partition
//              (DeepSpeedZeroOptimizer.single_partition_of_fp32_groups[g]) and its exp_avg /
//              exp_avg_sq, padding included; one LpParam per trainable parameter: its TP-local
//              lp weight (the module parameter, a view into bit16_groups_flat[g]).
//   ZeRO-3     one FlatState per sub-group (fp32_partitioned_groups_flat[s] and its states);
//              no LpParam: ZeRO-3's lp partitions are re-derived from fp32 by the engine.
//
// Refused: BF16_Optimizer targets (kUnsupported: its flat buffers are laid out differently and
// are not restored yet), and every refusal of the partition and slice rules. Plain values,
// immutable once planned; share freely between threads. Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

struct FlatState {
  size_t param_group = 0;                          // the optimizer param group it belongs to
  std::vector<std::string> param_names;            // its params, in flat order
  std::vector<std::vector<int64_t>> local_shapes;  // their TP-local shapes, same order
  StoragePlan fp32, exp_avg, exp_avg_sq;           // float32, kCopy, equal numel
};

struct LpParam {
  std::string name;
  size_t param_group = 0;
  std::vector<int64_t> shape;  // TP-local
  StoragePlan weight;          // the target lp dtype, converted from fp32
};

struct RankStatePlan {
  Target target;
  int tp_rank = 0;
  int dp_rank = 0;
  std::vector<Source> sources;  // every extent's `source` indexes this
  std::vector<FlatState> flats;
  std::vector<LpParam> lp_params;  // ZeRO-1/2 only, in param-group then flat order
};

Result<RankStatePlan> PlanRankState(const ucp::UniversalCheckpoint& checkpoint, const Target& target, int tp_rank,
                                    int dp_rank);

}  // namespace reshard::plan
