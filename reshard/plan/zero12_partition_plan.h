// PlanZero12Rank: what DeepSpeed's ZeRO-1/2 universal loader puts into one target rank's flat
// optimizer partitions, as extents over the universal checkpoint's files.
//
// For target TP rank t and DP rank r, and each optimizer param group g of the checkpoint (the
// params listed in the model-states `param_shapes[g]`, in that order):
//   1. each param's TP-local slice (layout::SliceForRank, the universal loader's rules);
//   2. the flat group of those slices and this rank's window of it (layout::PartitionZero12:
//      2*D alignment, zero padding, fragments);
//   3. for each state (fp32, exp_avg, exp_avg_sq): the window's elements as extents over
//      zero/<param>/<state>.pt, zeros where no parameter lies (alignment gaps, tail padding),
//      as DeepSpeed's map_to_flat_opt_states zero-fills them.
// Nothing is read: the result is numbers and file offsets. It is what the native optimizer file
// of that rank holds (single_partition_of_fp32_groups, base_optimizer_state exp_avg/exp_avg_sq),
// and what tests compare with DeepSpeed's own load_universal, bit for bit.
//
// Refused (kUnsupported / kInvalidArgument with the parameter named): AutoEP expert tensors, a
// bare-tensor checkpoint (ZeRO-3 conversion without TP) at a target TP > 1 without a parameter
// layout, a vocab tensor without the target's padded vocab size, parameters in no param group,
// and every refusal of the TP and ZeRO rules. Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/layout/zero_partition.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

struct RankGroupPartition {
  std::vector<std::string> param_names;         // the group's params, in param-group order
  std::vector<std::vector<int64_t>> local_shapes;  // their TP-local shapes, same order
  layout::Zero12Partition layout;               // sizes, padding, fragments
  std::map<std::string, ExtentList> states;     // "fp32", "exp_avg", "exp_avg_sq": ps elements each
};

// One entry per optimizer param group, in group order. Reads the target's TP and DP sizes,
// round_robin_gradients and what SliceParam reads. `sources` receives the files read.
Result<std::vector<RankGroupPartition>> PlanZero12Rank(const ucp::UniversalCheckpoint& checkpoint,
                                                       const Target& target, int tp_rank,
                                                       int dp_rank, SourceTable& sources);

}  // namespace reshard::plan
