// PickleTree: the inert value tree a pickle parses to, and that the pickle writer emits.
//
// Nothing in a PickleTree executes. A GLOBAL stays a (module, name) pair; REDUCE, NEWOBJ and
// BUILD stay records of what the pickle asked for. So an unknown class (argparse.Namespace,
// a DeepSpeed LossScaler, numpy state) survives parse -> tree -> write unchanged, and
// interpretation (which REDUCE is a tensor) is a separate, allow-listed step (torch_tensor.h).
//
// Storage: all nodes live in one arena (std::vector<Node>); children are NodeIds (indices).
// The same NodeId may appear under several parents (pickle memo sharing), so the graph is a DAG,
// and mutable containers (list, dict, set) may even form cycles, as in Python. Consumers that
// recurse (the writer, printers) bound their depth and detect cycles themselves.
//
// Ownership and threads: a PickleTree owns its nodes; NodeIds are only meaningful for the tree
// that issued them. Const access from several threads is safe; mutation is not synchronised.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace reshard::format {

using NodeId = uint32_t;
inline constexpr NodeId kNoNode = UINT32_MAX;

enum class NodeKind : uint8_t {
  kNone,
  kBool,       // b
  kInt,        // i: a value that fits int64
  kBigInt,     // text: two's-complement little-endian bytes (LONG1/LONG4), beyond int64
  kFloat,      // f (BINFLOAT is big-endian IEEE double on the wire)
  kStr,        // text: UTF-8 (BINUNICODE*, and BINSTRING/SHORT_BINSTRING decoded as text)
  kBytes,      // text: raw bytes (BINBYTES*); protocol-2 `_codecs.encode(s, 'latin1')` stays a REDUCE
  kByteArray,  // text: raw bytes (BYTEARRAY8)
  kTuple,      // items
  kList,       // items
  kDict,       // items as k0, v0, k1, v1, ... in insertion order
  kSet,        // items
  kFrozenSet,  // items
  kGlobal,     // text = module, text2 = name (GLOBAL or STACK_GLOBAL)
  kReduce,     // items = {callable, args}
  kNewObj,     // items = {cls, args} (NEWOBJ) or {cls, args, kwargs} (NEWOBJ_EX)
  kBuild,      // items = {object, state}: BUILD on a node that is not a kReduce/kNewObj
  kPersId,     // items = {pid} (BINPERSID)
};

// Returns "none", "bool", ..., "persid".
std::string_view NodeKindName(NodeKind kind);

struct Node {
  NodeKind kind = NodeKind::kNone;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string text;   // str/bytes payload, big-int bytes, or the GLOBAL module
  std::string text2;  // the GLOBAL name
  std::vector<NodeId> items;
  // Only for kReduce and kNewObj: what the pickle did to the object after creating it, in the
  // shape of Python's 5-tuple __reduce__ (listitems, dictitems, state). SETITEMS on an
  // OrderedDict() result lands in dict_items (k0, v0, k1, v1, ...), APPENDS on a list subclass
  // in list_items, and BUILD's argument in `state`. They live on the object node itself, so
  // every memo reference to the object sees them, as in Python. The writer re-emits them in
  // Python's order: object, [memo], APPENDS, SETITEMS, BUILD.
  std::vector<NodeId> list_items;
  std::vector<NodeId> dict_items;
  NodeId state = UINT32_MAX;
};

// Calls f(child) for every child of `n` in emission order: items, list_items, dict_items, state.
template <typename F>
void ForEachChild(const Node& n, F&& f) {
  for (NodeId c : n.items) f(c);
  for (NodeId c : n.list_items) f(c);
  for (NodeId c : n.dict_items) f(c);
  if (n.state != kNoNode) f(n.state);
}

class PickleTree {
 public:
  PickleTree() = default;

  // ---- access ----
  const Node& node(NodeId id) const { return nodes_[id]; }
  Node& mutable_node(NodeId id) { return nodes_[id]; }
  size_t size() const { return nodes_.size(); }
  bool valid(NodeId id) const { return id < nodes_.size(); }
  NodeId root() const { return root_; }
  // Room for `count` nodes without moving the arena (std::vector::reserve: pages are touched
  // only as nodes are added).
  void Reserve(size_t count) { nodes_.reserve(count); }
  void set_root(NodeId id) { root_ = id; }

  // ---- builders: each appends one node and returns its id ----
  NodeId AddNone();
  NodeId AddBool(bool v);
  NodeId AddInt(int64_t v);
  // Little-endian two's complement bytes as LONG1 carries them; normalised to kInt when the
  // value fits int64 (so equal values compare equal whatever their wire width).
  NodeId AddLong(std::string_view le_bytes);
  NodeId AddFloat(double v);
  NodeId AddStr(std::string v);
  NodeId AddBytes(std::string v);
  NodeId AddByteArray(std::string v);
  NodeId AddTuple(std::vector<NodeId> items);
  NodeId AddList(std::vector<NodeId> items = {});
  NodeId AddDict(std::vector<std::pair<NodeId, NodeId>> items = {});
  NodeId AddSet(std::vector<NodeId> items = {});
  NodeId AddFrozenSet(std::vector<NodeId> items);
  NodeId AddGlobal(std::string module, std::string name);
  NodeId AddReduce(NodeId callable, NodeId args);
  NodeId AddNewObj(NodeId cls, NodeId args);
  NodeId AddNewObjEx(NodeId cls, NodeId args, NodeId kwargs);
  NodeId AddBuild(NodeId object, NodeId state);
  NodeId AddPersId(NodeId pid);

  // Appends a (key, value) entry to a kDict, or replaces the value of an existing entry whose
  // key is the same str. Items of a kList/kSet are appended with Append().
  void DictSet(NodeId dict, NodeId key, NodeId value);
  void Append(NodeId container, NodeId item);

  // ---- queries used by matchers ----
  bool IsGlobal(NodeId id, std::string_view module, std::string_view name) const;
  // For a kDict: the value of the first str key equal to `key`, or kNoNode.
  NodeId DictGet(NodeId dict, std::string_view key) const;

 private:
  NodeId Add(Node n);

  std::vector<Node> nodes_;
  NodeId root_ = kNoNode;
};

}  // namespace reshard::format
