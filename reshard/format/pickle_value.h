// PickleTree: the inert value tree a pickle parses to, and that the pickle writer emits.
//
// Nothing in a PickleTree executes. A GLOBAL stays a (module, name) pair; REDUCE, NEWOBJ and
// BUILD stay records of what the pickle asked for. So an unknown class (argparse.Namespace,
// a DeepSpeed LossScaler, numpy state) survives parse -> tree -> write unchanged, and
// interpretation (which REDUCE is a tensor) is a separate, allow-listed step (torch_tensor.h).
//
// Storage: all nodes live in one arena of chunks that double in size (64, 64, 128, 256, ...
// nodes), never moved once added; children are NodeIds (indices).
// The same NodeId may appear under several parents (pickle memo sharing), so the graph is a DAG,
// and mutable containers (list, dict, set) may even form cycles, as in Python. Consumers that
// recurse (the writer, printers) bound their depth and detect cycles themselves.
//
// Ownership and threads: a PickleTree owns its nodes; NodeIds are only meaningful for the tree
// that issued them. Const access from several threads is safe; mutation is not synchronised.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <cstring>
#include <memory>
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
  kGlobal,     // text = module, global_name() = name (GLOBAL or STACK_GLOBAL)
  kReduce,     // items = {callable, args}
  kNewObj,     // items = {cls, args} (NEWOBJ) or {cls, args, kwargs} (NEWOBJ_EX)
  kBuild,      // items = {object, state}: BUILD on a node that is not a kReduce/kNewObj
  kPersId,     // items = {pid} (BINPERSID)
};

// Returns "none", "bool", ..., "persid".
std::string_view NodeKindName(NodeKind kind);

// Fields only a few kinds use, kept out of Node so that the common node stays small (a model-states file of
// 100,000 parameters parses to millions of nodes).
struct NodeExtras {
  std::string name;  // kGlobal: the GLOBAL name (Node::text holds the module)
  // Only for kReduce and kNewObj: what the pickle did to the object after creating it, in the
  // shape of Python's 5-tuple __reduce__ (listitems, dictitems, state). SETITEMS on an
  // OrderedDict() result lands in dict_items (k0, v0, k1, v1, ...), APPENDS on a list subclass
  // in list_items, and BUILD's argument in Node::state. They live on the object node itself, so
  // every memo reference to the object sees them, as in Python. The writer re-emits them in
  // Python's order: object, [memo], APPENDS, SETITEMS, BUILD.
  std::vector<NodeId> list_items;
  std::vector<NodeId> dict_items;
};

// One value. 80 bytes on LP64: the kind's scalar, its text or its items, and the rare fields behind a pointer
// that stays null for every node that does not need them. Copies copy the extras.
struct Node {
  NodeKind kind = NodeKind::kNone;
  bool b = false;
  NodeId state = kNoNode;  // kReduce/kNewObj: the first BUILD's argument (see NodeExtras)
  union {
    int64_t i = 0;  // kInt
    double f;       // kFloat
  };
  std::string text;  // str/bytes payload, big-int bytes, or the GLOBAL module
  std::vector<NodeId> items;
  std::unique_ptr<NodeExtras> extras;  // null unless global_name, list_items or dict_items is set

  Node() = default;
  Node(Node&&) noexcept = default;
  Node& operator=(Node&&) noexcept = default;
  Node(const Node& o)
      : kind(o.kind), b(o.b), state(o.state), text(o.text), items(o.items),
        extras(o.extras ? std::make_unique<NodeExtras>(*o.extras) : nullptr) {
    std::memcpy(&i, &o.i, sizeof(i));  // whichever of i and f is in use
  }
  Node& operator=(const Node& o) {
    if (this != &o) *this = Node(o);
    return *this;
  }

  // The rare fields; empty when unset.
  const std::string& global_name() const { return extras ? extras->name : Empty().name; }
  const std::vector<NodeId>& list_items() const { return extras ? extras->list_items : Empty().list_items; }
  const std::vector<NodeId>& dict_items() const { return extras ? extras->dict_items : Empty().dict_items; }
  // Set or grow them (allocates the extras on first use).
  NodeExtras& mutable_extras() {
    if (!extras) extras = std::make_unique<NodeExtras>();
    return *extras;
  }

 private:
  static const NodeExtras& Empty() {
    static const NodeExtras empty;
    return empty;
  }
};
// A model-states pickle of 100,000 parameters is millions of nodes: a field added here costs that many times.
static_assert(sizeof(Node) <= 80, "keep rarely used fields in NodeExtras");

// Calls f(child) for every child of `n` in emission order: items, list_items, dict_items, state.
template <typename F>
void ForEachChild(const Node& n, F&& f) {
  for (NodeId c : n.items) f(c);
  for (NodeId c : n.list_items()) f(c);
  for (NodeId c : n.dict_items()) f(c);
  if (n.state != kNoNode) f(n.state);
}

class PickleTree {
 public:
  PickleTree() = default;
  ~PickleTree();
  PickleTree(const PickleTree& other);
  PickleTree& operator=(const PickleTree& other);
  PickleTree(PickleTree&& other) noexcept;
  PickleTree& operator=(PickleTree&& other) noexcept;

  // ---- access ----
  // References stay valid while nodes are added (the arena never moves a node).
  const Node& node(NodeId id) const { return Slot(id); }
  Node& mutable_node(NodeId id) { return Slot(id); }
  size_t size() const { return size_; }
  bool valid(NodeId id) const { return id < size_; }
  NodeId root() const { return root_; }
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
  // Chunk 0 holds ids [0, 64) and chunk c >= 1 holds [64 * 2^(c-1), 64 * 2^c): the arena grows
  // without the copy a growing vector makes, and so without the moment it holds the old and the
  // new array (1.5 times the tree; the model-states tree of 100,000 parameters is hundreds of
  // MB). A chunk is raw memory whose nodes are constructed as they are added, so the pages of its
  // unused tail are never touched.
  static constexpr unsigned kFirstChunkBits = 6;
  static size_t ChunkOf(size_t id) {
    const uint64_t high = uint64_t{id} >> kFirstChunkBits;
    return high == 0 ? 0 : static_cast<size_t>(64 - __builtin_clzll(high));
  }
  static size_t ChunkStart(size_t chunk) { return chunk == 0 ? 0 : size_t{1} << (kFirstChunkBits + chunk - 1); }
  static size_t ChunkCapacity(size_t chunk) { return size_t{1} << (kFirstChunkBits + (chunk == 0 ? 0 : chunk - 1)); }
  Node& Slot(size_t id) const {
    const size_t chunk = ChunkOf(id);
    return chunks_[chunk].get()[id - ChunkStart(chunk)];
  }
  void Clear();

  struct ChunkFree {
    void operator()(Node* p) const { ::operator delete(static_cast<void*>(p)); }
  };

  NodeId Add(Node n);

  std::vector<std::unique_ptr<Node, ChunkFree>> chunks_;
  size_t size_ = 0;
  NodeId root_ = kNoNode;
};

}  // namespace reshard::format
