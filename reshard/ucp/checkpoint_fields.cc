#include "reshard/ucp/checkpoint_fields.h"

#include <algorithm>
#include <map>

#include "reshard/format/pickle_query.h"

namespace reshard::ucp {

using format::DescribeNode;
using format::kNoNode;
using format::NodeId;
using format::PickleTree;

// Python's str.strip(): the whitespace DeepSpeed's `fd.read().strip()` removes.
std::string StripWhitespace(const std::string& s) {
  constexpr std::string_view kSpace = " \t\n\r\f\v";
  const size_t b = s.find_first_not_of(kSpace);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

// zero_stage: a plain int, or deepspeed.runtime.zero.config.ZeroStageEnum by value or by name.
// Python 3.11+ may pickle the enum by name, older Pythons (and 0.19.8's files) by value;
// both mean the same stage. An unknown member name is refused rather than guessed.
Result<std::optional<int32_t>> ParseZeroStage(const PickleTree& tree, NodeId value) {
  if (value == kNoNode) return std::optional<int32_t>();
  std::optional<int64_t> stage = format::AsInt(tree, value);
  if (!stage) {
    const auto member = format::AsEnumMember(tree, value, "deepspeed.runtime.zero.config", "ZeroStageEnum");
    if (member && member->value) {
      stage = member->value;
    } else if (member) {
      static const std::map<std::string, int64_t> kByName = {
          {"disabled", 0}, {"optimizer_states", 1}, {"gradients", 2}, {"weights", 3}, {"max_stage", 3}};
      const auto it = kByName.find(member->name);
      if (it == kByName.end())
        return Corrupt("'zero_stage' names an unknown ZeroStageEnum member '" + member->name + "'");
      stage = it->second;
    }
  }
  if (!stage || *stage < 0 || *stage > 3) {
    return Corrupt("'zero_stage' must be 0-3 or a ZeroStageEnum, got " + DescribeNode(tree, value));
  }
  return std::optional<int32_t>(static_cast<int32_t>(*stage));
}

// Both universal loaders restore hyper-parameters from these groups, so they are required; the
// groups themselves stay inert nodes for the planner to re-emit.
Result<std::vector<ParamGroup>> ParseParamGroups(const PickleTree& tree, NodeId value) {
  const std::vector<NodeId>* groups = format::SequenceItems(tree, value);
  if (groups == nullptr) return Corrupt("'param_groups' must be a list, got " + DescribeNode(tree, value));
  std::vector<ParamGroup> out;
  for (NodeId g : *groups) {
    const std::string where = "param_groups[" + std::to_string(out.size()) + "]";
    if (format::DictItems(tree, g) == nullptr) return Corrupt(where + " must be a dict, got " + DescribeNode(tree, g));
    auto params = format::AsIntSequence(tree, format::DictLookup(tree, g, "params"));
    if (!params) return Corrupt(where + " has no 'params' list of int");
    out.push_back(ParamGroup{g, std::move(*params)});
  }
  return out;
}

Result<GroupShapes> ParseParamShapes(const PickleTree& tree, NodeId value) {
  const std::vector<NodeId>* groups = format::SequenceItems(tree, value);
  if (groups == nullptr) return Corrupt("'param_shapes' must be a list, got " + DescribeNode(tree, value));
  GroupShapes out;
  for (NodeId g : *groups) {
    const std::vector<NodeId>* items = format::DictItems(tree, g);
    if (items == nullptr) return Corrupt("'param_shapes' entries must be dicts, got " + DescribeNode(tree, g));
    auto& group = out.emplace_back();
    for (size_t k = 0; k + 1 < items->size(); k += 2) {
      const auto name = format::AsStr(tree, (*items)[k]);
      if (!name) return Corrupt("'param_shapes' has a non-str name: " + DescribeNode(tree, (*items)[k]));
      // DeepSpeed stores torch.Size; a plain tuple or list of ints is the same shape.
      auto shape = format::AsTorchSize(tree, (*items)[k + 1]);
      if (!shape) shape = format::AsIntSequence(tree, (*items)[k + 1]);
      if (!shape || std::any_of(shape->begin(), shape->end(), [](int64_t d) { return d < 0; })) {
        return Corrupt("'param_shapes' entry '" + std::string(*name) +
                       "' is not a shape: " + DescribeNode(tree, (*items)[k + 1]));
      }
      group.emplace_back(std::string(*name), std::move(*shape));
    }
  }
  return out;
}

}  // namespace reshard::ucp
