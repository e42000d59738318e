// PlanZero3Rank: what DeepSpeed's ZeRO-3 universal loader puts into one target DP rank's
// sub-group flats (fp32_partitioned_groups_flat and their Adam states), as extents.
//
// For each optimizer param group, its params (in the checkpoint's order; for a ZeRO-3 source the
// param group's sub-groups in order) are partitioned per parameter: DP rank r owns elements
// [r*pn, (r+1)*pn) of the flattened TP-local tensor (SliceParamZero3: the whole tensor at TP 1,
// the target's AutoTP slice at TP > 1), pn = ceil(numel / D), zero padded at the end; parts are
// grouped into sub-groups by sub_group_size (layout::PartitionZero3).
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

struct RankSubGroup {
  size_t param_group = 0;
  std::vector<std::string> param_names;      // in flat order
  std::vector<std::vector<int64_t>> local_shapes;  // their TP-local shapes (ZeRO-3's ds_shape), same order
  uint64_t flat_numel = 0;                   // sum of the params' pn
  std::map<std::string, ExtentList> states;  // "fp32", "exp_avg", "exp_avg_sq": flat_numel each
};

// Reads the target's TP and DP sizes, sub_group_size and what SliceParamZero3 reads.
Result<std::vector<RankSubGroup>> PlanZero3Rank(const ucp::UniversalCheckpoint& checkpoint, const Target& target,
                                                int tp_rank, int dp_rank, SourceTable& sources);

}  // namespace reshard::plan
