#include "reshard/plan/optimizer_groups.h"

#include <string>

namespace reshard::plan {

Result<std::vector<std::vector<const ucp::ParamEntry*>>> OptimizerGroups(const ucp::UniversalCheckpoint& ckpt) {
  const auto num_source = static_cast<size_t>(ckpt.num_source_groups());
  std::vector<std::vector<const ucp::ParamEntry*>> by_source(num_source);
  for (const ucp::ParamEntry& p : ckpt.params()) {
    // A folder param_shapes does not list (a tied alias such as lm_head.weight, a frozen parameter:
    // the converter adds one for every module entry) had no optimizer state in the source run, and
    // DeepSpeed's loaders never read it: it belongs to no group.
    if (!p.listed) continue;
    if (p.source_group < 0 || static_cast<size_t>(p.source_group) >= num_source) {
      return Unsupported("parameter '" + p.name + "' is in no param group of the model-states file");
    }
    by_source[static_cast<size_t>(p.source_group)].push_back(&p);
  }
  if (ckpt.zero_stage() != 3) return by_source;
  // ZeRO-3 sources record sub-groups; the optimizer's param groups list which ones they hold.
  std::vector<std::vector<const ucp::ParamEntry*>> groups;
  for (const ucp::ParamGroup& g : ckpt.param_groups()) {
    std::vector<const ucp::ParamEntry*> params;
    for (int64_t sub : g.params) {
      if (sub < 0 || static_cast<size_t>(sub) >= num_source) {
        return Corrupt("zero/optimizer_state.pt: param group lists sub-group " + std::to_string(sub) +
                       " of " + std::to_string(num_source));
      }
      params.insert(params.end(), by_source[static_cast<size_t>(sub)].begin(), by_source[static_cast<size_t>(sub)].end());
    }
    groups.push_back(std::move(params));
  }
  return groups;
}

}  // namespace reshard::plan
