#include "reshard/format/pickle_value.h"

#include <new>
#include <utility>

namespace reshard::format {

std::string_view NodeKindName(NodeKind kind) {
  switch (kind) {
    case NodeKind::kNone: return "none";
    case NodeKind::kBool: return "bool";
    case NodeKind::kInt: return "int";
    case NodeKind::kBigInt: return "bigint";
    case NodeKind::kFloat: return "float";
    case NodeKind::kStr: return "str";
    case NodeKind::kBytes: return "bytes";
    case NodeKind::kByteArray: return "bytearray";
    case NodeKind::kTuple: return "tuple";
    case NodeKind::kList: return "list";
    case NodeKind::kDict: return "dict";
    case NodeKind::kSet: return "set";
    case NodeKind::kFrozenSet: return "frozenset";
    case NodeKind::kGlobal: return "global";
    case NodeKind::kReduce: return "reduce";
    case NodeKind::kNewObj: return "newobj";
    case NodeKind::kBuild: return "build";
    case NodeKind::kPersId: return "persid";
  }
  return "?";
}

PickleTree::~PickleTree() { Clear(); }

PickleTree::PickleTree(const PickleTree& other) : root_(other.root_) {
  for (size_t id = 0; id < other.size_; ++id) Add(other.node(static_cast<NodeId>(id)));
}

PickleTree& PickleTree::operator=(const PickleTree& other) {
  if (this != &other) *this = PickleTree(other);
  return *this;
}

PickleTree::PickleTree(PickleTree&& other) noexcept
    : chunks_(std::move(other.chunks_)), size_(other.size_), root_(other.root_) {
  other.chunks_.clear();
  other.size_ = 0;
  other.root_ = kNoNode;
}

PickleTree& PickleTree::operator=(PickleTree&& other) noexcept {
  if (this != &other) {
    Clear();
    chunks_ = std::move(other.chunks_);
    size_ = other.size_;
    root_ = other.root_;
    other.chunks_.clear();
    other.size_ = 0;
    other.root_ = kNoNode;
  }
  return *this;
}

void PickleTree::Clear() {
  for (size_t id = 0; id < size_; ++id) Slot(id).~Node();
  chunks_.clear();
  size_ = 0;
}

NodeId PickleTree::Add(Node n) {
  const size_t chunk = ChunkOf(size_);
  if (chunk == chunks_.size()) {
    std::unique_ptr<Node, ChunkFree> fresh(static_cast<Node*>(::operator new(ChunkCapacity(chunk) * sizeof(Node))));
    chunks_.push_back(std::move(fresh));
  }
  new (&Slot(size_)) Node(std::move(n));
  return static_cast<NodeId>(size_++);
}

NodeId PickleTree::AddNone() { return Add(Node{}); }

NodeId PickleTree::AddBool(bool v) {
  Node n;
  n.kind = NodeKind::kBool;
  n.b = v;
  return Add(std::move(n));
}

NodeId PickleTree::AddInt(int64_t v) {
  Node n;
  n.kind = NodeKind::kInt;
  n.i = v;
  return Add(std::move(n));
}

NodeId PickleTree::AddLong(std::string_view le) {
  // Strip redundant sign-extension bytes so each value has one canonical encoding.
  size_t len = le.size();
  while (len > 1) {
    const auto last = static_cast<uint8_t>(le[len - 1]);
    const auto prev = static_cast<uint8_t>(le[len - 2]);
    if ((last == 0x00 && (prev & 0x80) == 0) || (last == 0xFF && (prev & 0x80) != 0)) {
      --len;
    } else {
      break;
    }
  }
  if (len == 0) return AddInt(0);
  if (len <= 8) {
    uint64_t u = 0;
    for (size_t k = 0; k < len; ++k) u |= static_cast<uint64_t>(static_cast<uint8_t>(le[k])) << (8 * k);
    const bool negative = (static_cast<uint8_t>(le[len - 1]) & 0x80) != 0;
    if (negative && len < 8) u |= ~uint64_t{0} << (8 * len);
    return AddInt(static_cast<int64_t>(u));
  }
  Node n;
  n.kind = NodeKind::kBigInt;
  n.text.assign(le.data(), len);
  return Add(std::move(n));
}

NodeId PickleTree::AddFloat(double v) {
  Node n;
  n.kind = NodeKind::kFloat;
  n.f = v;
  return Add(std::move(n));
}

namespace {
Node TextNode(NodeKind kind, std::string v) {
  Node n;
  n.kind = kind;
  n.text = std::move(v);
  return n;
}
Node ItemsNode(NodeKind kind, std::vector<NodeId> items) {
  Node n;
  n.kind = kind;
  n.items = std::move(items);
  return n;
}
}  // namespace

NodeId PickleTree::AddStr(std::string v) { return Add(TextNode(NodeKind::kStr, std::move(v))); }
NodeId PickleTree::AddBytes(std::string v) { return Add(TextNode(NodeKind::kBytes, std::move(v))); }
NodeId PickleTree::AddByteArray(std::string v) {
  return Add(TextNode(NodeKind::kByteArray, std::move(v)));
}
NodeId PickleTree::AddTuple(std::vector<NodeId> items) {
  return Add(ItemsNode(NodeKind::kTuple, std::move(items)));
}
NodeId PickleTree::AddList(std::vector<NodeId> items) {
  return Add(ItemsNode(NodeKind::kList, std::move(items)));
}
NodeId PickleTree::AddDict(std::vector<std::pair<NodeId, NodeId>> items) {
  Node n;
  n.kind = NodeKind::kDict;
  n.items.reserve(items.size() * 2);
  for (const auto& [k, v] : items) {
    n.items.push_back(k);
    n.items.push_back(v);
  }
  return Add(std::move(n));
}
NodeId PickleTree::AddSet(std::vector<NodeId> items) {
  return Add(ItemsNode(NodeKind::kSet, std::move(items)));
}
NodeId PickleTree::AddFrozenSet(std::vector<NodeId> items) {
  return Add(ItemsNode(NodeKind::kFrozenSet, std::move(items)));
}
NodeId PickleTree::AddGlobal(std::string module, std::string name) {
  Node n = TextNode(NodeKind::kGlobal, std::move(module));
  n.mutable_extras().name = std::move(name);
  return Add(std::move(n));
}
NodeId PickleTree::AddReduce(NodeId callable, NodeId args) {
  return Add(ItemsNode(NodeKind::kReduce, {callable, args}));
}
NodeId PickleTree::AddNewObj(NodeId cls, NodeId args) {
  return Add(ItemsNode(NodeKind::kNewObj, {cls, args}));
}
NodeId PickleTree::AddNewObjEx(NodeId cls, NodeId args, NodeId kwargs) {
  return Add(ItemsNode(NodeKind::kNewObj, {cls, args, kwargs}));
}
NodeId PickleTree::AddBuild(NodeId object, NodeId state) {
  return Add(ItemsNode(NodeKind::kBuild, {object, state}));
}
NodeId PickleTree::AddPersId(NodeId pid) { return Add(ItemsNode(NodeKind::kPersId, {pid})); }

void PickleTree::DictSet(NodeId dict, NodeId key, NodeId value) {
  Node& d = Slot(dict);
  if (Slot(key).kind == NodeKind::kStr) {
    for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
      const Node& existing = Slot(d.items[k]);
      if (existing.kind == NodeKind::kStr && existing.text == Slot(key).text) {
        d.items[k + 1] = value;
        return;
      }
    }
  }
  d.items.push_back(key);
  d.items.push_back(value);
}

void PickleTree::Append(NodeId container, NodeId item) { Slot(container).items.push_back(item); }

bool PickleTree::IsGlobal(NodeId id, std::string_view module, std::string_view name) const {
  if (!valid(id)) return false;
  const Node& n = Slot(id);
  return n.kind == NodeKind::kGlobal && n.text == module && n.global_name() == name;
}

NodeId PickleTree::DictGet(NodeId dict, std::string_view key) const {
  if (!valid(dict) || Slot(dict).kind != NodeKind::kDict) return kNoNode;
  const Node& d = Slot(dict);
  for (size_t k = 0; k + 1 < d.items.size(); k += 2) {
    const Node& kn = Slot(d.items[k]);
    if (kn.kind == NodeKind::kStr && kn.text == key) return d.items[k + 1];
  }
  return kNoNode;
}

}  // namespace reshard::format
