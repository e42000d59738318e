// PlanZero3Rank: what DeepSpeed's ZeRO-3 universal loader puts into one target DP rank's
// sub-group flats (fp32_partitioned_groups_flat and their Adam states), as extents.
//
// For each optimizer param group, its params (in the checkpoint's order; for a ZeRO-3 source the
// param group's sub-groups in order) are partitioned per parameter: rank r owns elements
// [r*pn, (r+1)*pn) of the flattened universal tensor, pn = ceil(numel / D), zero padded at the
// end; parts are grouped into sub-groups by sub_group_size (layout::PartitionZero3). The
// universal loader applies no TP slicing without AutoTP metadata, so only TP = 1 targets are
// planned here (a TP > 1 ZeRO-3 target needs the AutoTP layout and is refused).
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

struct Zero3Target {
  int tp_size = 1;
  int dp_size = 1;
  uint64_t sub_group_size = 1000000000;  // zero_optimization.sub_group_size (DeepSpeed's default)
};

struct RankSubGroup {
  size_t param_group = 0;
  std::vector<std::string> param_names;      // in flat order
  uint64_t flat_numel = 0;                   // sum of the params' pn
  std::map<std::string, ExtentList> states;  // "fp32", "exp_avg", "exp_avg_sq": flat_numel each
};

Result<std::vector<RankSubGroup>> PlanZero3Rank(const ucp::UniversalCheckpoint& checkpoint,
                                                const Zero3Target& target, int dp_rank, SourceTable& sources);

}  // namespace reshard::plan
