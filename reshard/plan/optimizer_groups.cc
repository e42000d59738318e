#include "reshard/plan/optimizer_groups.h"

#include <algorithm>
#include <string>
#include <unordered_map>

#include "reshard/format/pickle_query.h"
#include "reshard/layout/zero_partition.h"

namespace reshard::plan {
namespace {

using Group = std::vector<const ucp::ParamEntry*>;

// The saved run's zero_optimization.round_robin_gradients (the model-states file's ds_config).
bool SavedWithRoundRobin(const ucp::UniversalCheckpoint& ckpt) {
  if (ckpt.model_states().empty()) return false;
  const format::PickleTree& t = ckpt.model_states().front().archive.tree();
  const format::NodeId zero =
      format::DictLookup(t, format::DictLookup(t, t.root(), "ds_config"), "zero_optimization");
  return format::AsBool(t, format::DictLookup(t, zero, "round_robin_gradients")).value_or(false);
}

// Each module entry's position in the model-states file's `module` state dict: the engine's
// named_parameters order, which DeepSpeed's param groups follow.
std::unordered_map<std::string, size_t> ModuleOrder(const ucp::UniversalCheckpoint& ckpt) {
  std::unordered_map<std::string, size_t> order;
  if (ckpt.model_states().empty()) return order;
  const format::PickleTree& t = ckpt.model_states().front().archive.tree();
  const std::vector<format::NodeId>* items = format::DictItems(t, format::DictLookup(t, t.root(), "module"));
  if (items == nullptr) return order;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    if (const auto name = format::AsStr(t, (*items)[i])) order.emplace(std::string(*name), order.size());
  }
  return order;
}

// A ZeRO-1/2 run with round_robin_gradients lists each group in param_shapes in its flat
// (round-robin) order, but builds the group, at any DP degree, in client order: a target needs
// that order, or its own round robin starts from the wrong list. Restored as the module order
// when, and only when, round-robin of the module order at the source's DP degree is exactly the
// listed order (a group whose client order is not the module order stays as listed).
void RestoreClientOrder(Group& group, const std::unordered_map<std::string, size_t>& module, uint32_t dp) {
  Group client = group;
  for (const ucp::ParamEntry* p : client) {
    if (!module.count(p->name)) return;
  }
  std::stable_sort(client.begin(), client.end(),
                   [&](const ucp::ParamEntry* a, const ucp::ParamEntry* b) { return module.at(a->name) < module.at(b->name); });
  std::vector<size_t> order(client.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  const std::vector<size_t> flat = layout::RoundRobin(order, dp);
  for (size_t i = 0; i < flat.size(); ++i) {
    if (client[flat[i]] != group[i]) return;
  }
  group = std::move(client);
}

}  // namespace

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
  if (ckpt.zero_stage() != 3) {
    if (ckpt.dp_world_size() > 1 && SavedWithRoundRobin(ckpt)) {
      const auto module = ModuleOrder(ckpt);
      for (Group& group : by_source) RestoreClientOrder(group, module, static_cast<uint32_t>(ckpt.dp_world_size()));
    }
    return by_source;
  }
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
