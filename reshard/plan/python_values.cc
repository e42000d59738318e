#include "reshard/plan/python_values.h"

namespace reshard::plan {

using format::NodeId;

NodeId AddOrderedDict(format::PickleTree& tree, const std::vector<std::pair<NodeId, NodeId>>& items) {
  const NodeId cls = tree.AddGlobal("collections", "OrderedDict");
  const NodeId dict = tree.AddReduce(cls, tree.AddTuple({}));
  std::vector<NodeId> flat;
  flat.reserve(items.size() * 2);
  for (const auto& [k, v] : items) {
    flat.push_back(k);
    flat.push_back(v);
  }
  tree.mutable_node(dict).mutable_extras().dict_items = std::move(flat);
  return dict;
}

NodeId AddTorchSize(format::PickleTree& tree, const std::vector<int64_t>& dims) {
  std::vector<NodeId> items;
  for (int64_t d : dims) items.push_back(tree.AddInt(d));
  const NodeId dims_tuple = tree.AddTuple(std::move(items));
  return tree.AddReduce(tree.AddGlobal("torch", "Size"), tree.AddTuple({dims_tuple}));
}

NodeId AddZeroStageEnum(format::PickleTree& tree, int64_t stage) {
  const NodeId cls = tree.AddGlobal("deepspeed.runtime.zero.config", "ZeroStageEnum");
  return tree.AddReduce(cls, tree.AddTuple({tree.AddInt(stage)}));
}

NodeId AddFragmentAddress(format::PickleTree& tree, uint64_t numel, uint64_t start) {
  const NodeId cls = tree.AddGlobal("deepspeed.utils.tensor_fragment", "fragment_address");
  const NodeId obj = tree.AddNewObj(cls, tree.AddTuple({}));
  const NodeId state = AddStrDict(tree, {{"numel", tree.AddInt(static_cast<int64_t>(numel))},
                                         {"start", tree.AddInt(static_cast<int64_t>(start))}});
  tree.mutable_node(obj).state = state;
  return obj;
}

NodeId AddIntList(format::PickleTree& tree, const std::vector<int64_t>& values) {
  std::vector<NodeId> items;
  for (int64_t v : values) items.push_back(tree.AddInt(v));
  return tree.AddList(std::move(items));
}

NodeId AddStrDict(format::PickleTree& tree, const std::vector<std::pair<std::string, NodeId>>& items) {
  std::vector<std::pair<NodeId, NodeId>> pairs;
  for (const auto& [k, v] : items) pairs.emplace_back(tree.AddStr(k), v);
  return tree.AddDict(std::move(pairs));
}

NodeId AddJson(format::PickleTree& tree, const nlohmann::ordered_json& value) {
  switch (value.type()) {
    case nlohmann::ordered_json::value_t::object: {
      std::vector<std::pair<NodeId, NodeId>> items;
      for (const auto& [k, v] : value.items()) items.emplace_back(tree.AddStr(k), AddJson(tree, v));
      return tree.AddDict(std::move(items));
    }
    case nlohmann::ordered_json::value_t::array: {
      std::vector<NodeId> items;
      for (const auto& v : value) items.push_back(AddJson(tree, v));
      return tree.AddList(std::move(items));
    }
    case nlohmann::ordered_json::value_t::string: return tree.AddStr(value.get<std::string>());
    case nlohmann::ordered_json::value_t::boolean: return tree.AddBool(value.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer: return tree.AddInt(value.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned: {
      const uint64_t u = value.get<uint64_t>();
      return u <= static_cast<uint64_t>(INT64_MAX) ? tree.AddInt(static_cast<int64_t>(u))
                                                   : tree.AddFloat(static_cast<double>(u));
    }
    case nlohmann::ordered_json::value_t::number_float: return tree.AddFloat(value.get<double>());
    default: return tree.AddNone();
  }
}

}  // namespace reshard::plan
