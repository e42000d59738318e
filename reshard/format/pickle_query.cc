#include "reshard/format/pickle_query.h"

#include <cstdio>

namespace reshard::format {
namespace {

const Node* Get(const PickleTree& tree, NodeId id) { return tree.valid(id) ? &tree.node(id) : nullptr; }

const Node* GetKind(const PickleTree& tree, NodeId id, NodeKind kind) {
  const Node* n = Get(tree, id);
  return n != nullptr && n->kind == kind ? n : nullptr;
}

// True for the module names Python uses for builtins at each protocol.
bool IsBuiltinsModule(std::string_view module) { return module == "builtins" || module == "__builtin__"; }

// An OrderedDict() REDUCE: the callable is collections.OrderedDict and the arguments are an
// empty tuple (torch writes `OrderedDict, (), REDUCE` and then SETITEMS).
bool IsOrderedDictObject(const PickleTree& tree, const Node& n) {
  if (n.kind != NodeKind::kReduce || n.items.size() != 2) return false;
  if (!tree.IsGlobal(n.items[0], "collections", "OrderedDict")) return false;
  const Node* args = GetKind(tree, n.items[1], NodeKind::kTuple);
  return args != nullptr && args->items.empty() && n.list_items().empty();
}

std::string GlobalName(const Node& g) { return g.text + "." + g.global_name(); }

}  // namespace

// torch writes every state dict, and DeepSpeed its param_shapes, as OrderedDict objects; the
// converter's own dicts are literals. Consumers should not care which.
const std::vector<NodeId>* DictItems(const PickleTree& tree, NodeId id) {
  const Node* n = Get(tree, id);
  if (n == nullptr) return nullptr;
  if (n->kind == NodeKind::kDict) return &n->items;
  if (IsOrderedDictObject(tree, *n)) return &n->dict_items();
  return nullptr;
}

NodeId DictLookup(const PickleTree& tree, NodeId dict, std::string_view key) {
  const std::vector<NodeId>* items = DictItems(tree, dict);
  if (items == nullptr) return kNoNode;
  for (size_t k = 0; k + 1 < items->size(); k += 2) {
    const Node* kn = GetKind(tree, (*items)[k], NodeKind::kStr);
    if (kn != nullptr && kn->text == key) return (*items)[k + 1];
  }
  return kNoNode;
}

const std::vector<NodeId>* SequenceItems(const PickleTree& tree, NodeId id) {
  const Node* n = Get(tree, id);
  if (n == nullptr || (n->kind != NodeKind::kTuple && n->kind != NodeKind::kList)) return nullptr;
  return &n->items;
}

bool IsNone(const PickleTree& tree, NodeId id) { return GetKind(tree, id, NodeKind::kNone) != nullptr; }

std::optional<bool> AsBool(const PickleTree& tree, NodeId id) {
  const Node* n = GetKind(tree, id, NodeKind::kBool);
  if (n == nullptr) return std::nullopt;
  return n->b;
}

std::optional<int64_t> AsInt(const PickleTree& tree, NodeId id) {
  const Node* n = GetKind(tree, id, NodeKind::kInt);
  if (n == nullptr) return std::nullopt;
  return n->i;
}

std::optional<double> AsFloat(const PickleTree& tree, NodeId id) {
  const Node* n = GetKind(tree, id, NodeKind::kFloat);
  if (n == nullptr) return std::nullopt;
  return n->f;
}

std::optional<double> AsNumber(const PickleTree& tree, NodeId id) {
  if (auto f = AsFloat(tree, id)) return f;
  if (auto i = AsInt(tree, id)) return static_cast<double>(*i);
  return std::nullopt;
}

std::optional<std::string_view> AsStr(const PickleTree& tree, NodeId id) {
  const Node* n = GetKind(tree, id, NodeKind::kStr);
  if (n == nullptr) return std::nullopt;
  return std::string_view(n->text);
}

// All-or-nothing: a sequence with one non-int item is not an int sequence (no partial results).
std::optional<std::vector<int64_t>> AsIntSequence(const PickleTree& tree, NodeId id) {
  const std::vector<NodeId>* items = SequenceItems(tree, id);
  if (items == nullptr) return std::nullopt;
  std::vector<int64_t> out;
  out.reserve(items->size());
  for (NodeId item : *items) {
    const auto v = AsInt(tree, item);
    if (!v) return std::nullopt;
    out.push_back(*v);
  }
  return out;
}

std::optional<std::vector<std::string>> AsStrSequence(const PickleTree& tree, NodeId id) {
  const std::vector<NodeId>* items = SequenceItems(tree, id);
  if (items == nullptr) return std::nullopt;
  std::vector<std::string> out;
  out.reserve(items->size());
  for (NodeId item : *items) {
    const auto v = AsStr(tree, item);
    if (!v) return std::nullopt;
    out.emplace_back(*v);
  }
  return out;
}

// torch.Size.__reduce__ is (torch.Size, (tuple(self),)): exactly one tuple argument.
std::optional<std::vector<int64_t>> AsTorchSize(const PickleTree& tree, NodeId id) {
  const Node* n = GetKind(tree, id, NodeKind::kReduce);
  if (n == nullptr || n->items.size() != 2 || !tree.IsGlobal(n->items[0], "torch", "Size")) return std::nullopt;
  const Node* args = GetKind(tree, n->items[1], NodeKind::kTuple);
  if (args == nullptr || args->items.size() != 1) return std::nullopt;
  if (GetKind(tree, args->items[0], NodeKind::kTuple) == nullptr) return std::nullopt;
  return AsIntSequence(tree, args->items[0]);
}

NodeId ObjectClass(const PickleTree& tree, NodeId id) {
  const Node* n = Get(tree, id);
  // A second BUILD wraps the first: walk down (iteratively; the chain is as long as the pickle
  // made it; a hand-built tree could even loop, hence the step bound) to the object itself.
  for (size_t steps = 0; n != nullptr && n->kind == NodeKind::kBuild; ++steps) {
    n = n->items.size() == 2 && steps < tree.size() ? Get(tree, n->items[0]) : nullptr;
  }
  if (n == nullptr) return kNoNode;
  if (n->kind != NodeKind::kReduce && n->kind != NodeKind::kNewObj) return kNoNode;
  if (n->items.empty() || GetKind(tree, n->items[0], NodeKind::kGlobal) == nullptr) return kNoNode;
  return n->items[0];
}

bool IsObjectOf(const PickleTree& tree, NodeId id, std::string_view module, std::string_view name) {
  const NodeId cls = ObjectClass(tree, id);
  return cls != kNoNode && tree.IsGlobal(cls, module, name);
}

NodeId ObjectState(const PickleTree& tree, NodeId id) {
  const Node* n = Get(tree, id);
  if (n == nullptr) return kNoNode;
  if (n->kind == NodeKind::kBuild) return n->items.size() == 2 ? n->items[1] : kNoNode;
  if (n->kind == NodeKind::kReduce || n->kind == NodeKind::kNewObj) return n->state;
  return kNoNode;
}

std::optional<EnumMember> AsEnumMember(const PickleTree& tree, NodeId id, std::string_view module,
                                       std::string_view name) {
  const Node* n = GetKind(tree, id, NodeKind::kReduce);
  if (n == nullptr || n->items.size() != 2) return std::nullopt;
  // A member is immutable: anything SETITEMS/APPENDS/BUILD added means it is not one.
  if (!n->list_items().empty() || !n->dict_items().empty() || n->state != kNoNode) return std::nullopt;
  const Node* args = GetKind(tree, n->items[1], NodeKind::kTuple);
  if (args == nullptr) return std::nullopt;
  // IntEnum pickled by value: cls(value), which Enum's metaclass turns into the member.
  if (tree.IsGlobal(n->items[0], module, name)) {
    if (args->items.size() != 1) return std::nullopt;
    const auto v = AsInt(tree, args->items[0]);
    if (!v) return std::nullopt;
    return EnumMember{*v, ""};
  }
  // Enum.__reduce_ex__ on newer Pythons: (getattr, (cls, name)).
  const Node* fn = GetKind(tree, n->items[0], NodeKind::kGlobal);
  if (fn == nullptr || !IsBuiltinsModule(fn->text) || fn->global_name() != "getattr") return std::nullopt;
  if (args->items.size() != 2 || !tree.IsGlobal(args->items[0], module, name)) return std::nullopt;
  const auto member = AsStr(tree, args->items[1]);
  if (!member) return std::nullopt;
  return EnumMember{std::nullopt, std::string(*member)};
}

// Messages quote file contents; long strings are cut so one bad value cannot flood a log line.
std::string DescribeNode(const PickleTree& tree, NodeId id) {
  const Node* n = Get(tree, id);
  if (n == nullptr) return "no value";
  switch (n->kind) {
    case NodeKind::kNone:
      return "none";
    case NodeKind::kBool:
      return n->b ? "bool True" : "bool False";
    case NodeKind::kInt:
      return "int " + std::to_string(n->i);
    case NodeKind::kFloat: {
      char buf[40];
      std::snprintf(buf, sizeof(buf), "float %.17g", n->f);
      return buf;
    }
    case NodeKind::kStr: {
      constexpr size_t kMaxShown = 40;
      if (n->text.size() <= kMaxShown) return "str '" + n->text + "'";
      return "str '" + n->text.substr(0, kMaxShown) + "...'";
    }
    case NodeKind::kTuple:
      return "tuple of " + std::to_string(n->items.size());
    case NodeKind::kList:
      return "list of " + std::to_string(n->items.size());
    case NodeKind::kDict:
      return "dict of " + std::to_string(n->items.size() / 2) + " entries";
    case NodeKind::kGlobal:
      return "global " + GlobalName(*n);
    case NodeKind::kReduce:
    case NodeKind::kNewObj:
    case NodeKind::kBuild: {
      if (IsOrderedDictObject(tree, *n)) {
        return "OrderedDict of " + std::to_string(n->dict_items().size() / 2) + " entries";
      }
      const NodeId cls = ObjectClass(tree, id);
      if (cls == kNoNode) return std::string(NodeKindName(n->kind));
      return "object of " + GlobalName(tree.node(cls));
    }
    default:
      return std::string(NodeKindName(n->kind));
  }
}

}  // namespace reshard::format
