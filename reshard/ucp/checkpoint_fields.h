// Fields of DeepSpeed checkpoint files that both source readers parse (the universal reader in
// universal_checkpoint.cc and the native reader in reshard/native/): the ZeRO stage, optimizer
// param groups, `param_shapes`, and the tag text of a `latest` file. Each returns kCorrupt with a
// message naming the field (callers prefix the file). Thread safety: pure functions.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::ucp {

// Python's str.strip(): the whitespace DeepSpeed's `fd.read().strip()` removes from `latest`.
std::string StripWhitespace(const std::string& s);

// `zero_stage`: a plain int, or deepspeed.runtime.zero.config.ZeroStageEnum by value or by name;
// std::nullopt when `value` is kNoNode (absent).
Result<std::optional<int32_t>> ParseZeroStage(const format::PickleTree& tree, format::NodeId value);

// `param_groups`: a list of dicts, each with a `params` list of int.
Result<std::vector<ParamGroup>> ParseParamGroups(const format::PickleTree& tree, format::NodeId value);

// One rank's `param_shapes`: per group (a dict), (name, shape) in order; shapes are torch.Size or
// tuples/lists of non-negative ints.
using GroupShapes = std::vector<std::vector<std::pair<std::string, std::vector<int64_t>>>>;
Result<GroupShapes> ParseParamShapes(const format::PickleTree& tree, format::NodeId value);

}  // namespace reshard::ucp
