// OptimizerGroups: a universal checkpoint's parameters per optimizer param group, in client order.
// Public header: C++17.
#pragma once

#include <vector>

#include "reshard/base/status.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// The checkpoint's params per optimizer param group, in flat order: for a ZeRO-3 source the
// sub-groups each param group lists (zero/optimizer_state.pt param_groups[g]['params']), for a
// ZeRO-1/2 source the model-states param_shapes group, in the client order the engine builds it
// in: param_shapes lists a round_robin_gradients run's groups in their round-robin flat order,
// which is undone (to the module order, when round robin of that at the source's DP degree is the
// listed order). Folders param_shapes does not list (tied aliases, frozen parameters) are in
// none. Errors: a listed parameter in no group.
Result<std::vector<std::vector<const ucp::ParamEntry*>>> OptimizerGroups(const ucp::UniversalCheckpoint& checkpoint);

}  // namespace reshard::plan
