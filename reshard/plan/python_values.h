// Builders for the Python values DeepSpeed's checkpoint files hold, in the exact pickled form
// torch.save gives them (deepspeed_native.md §2): OrderedDict, torch.Size, ZeroStageEnum,
// fragment_address, lists of ints. Each appends nodes to `tree` and returns the value's node.
// Plan time only; not thread-safe on one tree. Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "reshard/format/pickle_value.h"

namespace reshard::plan {

// collections.OrderedDict() with `items` (key, value) set in order: REDUCE(OrderedDict, ()) +
// SETITEMS, as torch pickles state dicts and DeepSpeed's param_shapes.
format::NodeId AddOrderedDict(format::PickleTree& tree,
                              const std::vector<std::pair<format::NodeId, format::NodeId>>& items);

// torch.Size(dims): REDUCE(torch.Size, ((d0, d1, ...),)).
format::NodeId AddTorchSize(format::PickleTree& tree, const std::vector<int64_t>& dims);

// deepspeed.runtime.zero.config.ZeroStageEnum(stage), by value (the form DeepSpeed's own files
// in this project's pinned version use).
format::NodeId AddZeroStageEnum(format::PickleTree& tree, int64_t stage);

// deepspeed.utils.tensor_fragment.fragment_address(numel=, start=): NEWOBJ with an empty tuple,
// then BUILD {'numel': n, 'start': s} (a dataclass pickled by protocol 2).
format::NodeId AddFragmentAddress(format::PickleTree& tree, uint64_t numel, uint64_t start);

// [v0, v1, ...] of Python ints.
format::NodeId AddIntList(format::PickleTree& tree, const std::vector<int64_t>& values);

// A str-keyed dict literal {k: v, ...} in order.
format::NodeId AddStrDict(format::PickleTree& tree,
                          const std::vector<std::pair<std::string, format::NodeId>>& items);

// A JSON value as Python's json.load would give it: dict (key order kept), list, str, int
// (an unsigned one beyond int64 becomes a float, where Python would keep an int), float, bool,
// None.
format::NodeId AddJson(format::PickleTree& tree, const nlohmann::ordered_json& value);

}  // namespace reshard::plan
