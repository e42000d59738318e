#include "reshard/format/pickle_writer.h"

#include <algorithm>
#include <bit>
#include <string_view>
#include <vector>

#include "reshard/format/pickle_opcodes.h"

namespace reshard::format {
namespace {

constexpr size_t kBatchSize = 1000;  // items per APPENDS, pairs per SETITEMS (Python's batch)
constexpr uint32_t kNotMemoized = UINT32_MAX;

std::string NodeLabel(const PickleTree& tree, NodeId id) {
  return std::string(NodeKindName(tree.node(id).kind)) + " (node " + std::to_string(id) + ")";
}

bool IsObject(const Node& node) {
  return node.kind == NodeKind::kReduce || node.kind == NodeKind::kNewObj;
}

// The item count a node's kind requires, or -1 for any count. Leaves must have no items.
int RequiredItems(const Node& node) {
  switch (node.kind) {
    case NodeKind::kReduce:
    case NodeKind::kBuild: return 2;
    case NodeKind::kPersId: return 1;
    case NodeKind::kNewObj: return node.items.size() == 3 ? 3 : 2;
    case NodeKind::kTuple:
    case NodeKind::kList:
    case NodeKind::kDict:
    case NodeKind::kSet:
    case NodeKind::kFrozenSet: return -1;
    default: return 0;
  }
}

// The shape problems of one node that would make its pickle wrong, or "".
std::string ShapeError(const Node& node) {
  const int required = RequiredItems(node);
  if (required >= 0 && node.items.size() != static_cast<size_t>(required)) {
    return "has " + std::to_string(node.items.size()) + " items";
  }
  if (node.kind == NodeKind::kDict && node.items.size() % 2 != 0) return "has an odd item count";
  if (node.dict_items().size() % 2 != 0) return "has an odd dict_items count";
  const bool has_extras = !node.list_items().empty() || !node.dict_items().empty() ||
                          node.state != kNoNode;
  if (has_extras && !IsObject(node)) return "has list_items, dict_items or state";
  if (node.kind == NodeKind::kBigInt && node.text.empty()) return "has no bytes";
  return "";
}

// Scalars are cheaper to re-write than to fetch, and their identity means nothing.
bool Memoizable(const Node& node) {
  switch (node.kind) {
    case NodeKind::kNone:
    case NodeKind::kBool:
    case NodeKind::kInt:
    case NodeKind::kFloat: return false;
    case NodeKind::kTuple: return !node.items.empty();  // () is a singleton in Python
    default: return true;
  }
}

// Which child vector of a node a task walks.
enum class Part : uint8_t { kItems, kListItems, kDictItems };

const std::vector<NodeId>& Slots(const Node& node, Part part) {
  switch (part) {
    case Part::kItems: return node.items;
    case Part::kListItems: return node.list_items();
    case Part::kDictItems: return node.dict_items();
  }
  return node.items;
}

class Pickler {
 public:
  Pickler(const PickleTree& tree, const PickleWriteOptions& options)
      : tree_(tree), options_(options) {}

  Result<std::string> Run(NodeId root);

 private:
  // Work items. Writing a node's first bytes pushes what must follow them, in reverse; Run pops.
  enum class TaskKind : uint8_t {
    kVisit,  // write node `id` at `depth`
    kItems,  // visit `part` [begin, end) of `id`, one item per step
    kBatch,  // write the APPEND(S)/SETITEM(S) batch of `part` of `id` that starts at `begin`
    kOp,     // write the single opcode byte `begin`
    kClose,  // `id` is complete: it is no longer open, and is memoized if shared
  };
  struct Task {
    TaskKind kind;
    Part part;
    NodeId id;
    uint32_t depth;
    size_t begin;
    size_t end;
  };

  Status CountReferences(NodeId root);
  Status Step(const Task& task);
  Status Visit(NodeId id, uint32_t depth);
  void Open(NodeId id, PickleOp close_op);
  void OpenWithItems(NodeId id, uint32_t depth, PickleOp close_op);
  void ScheduleObjectExtras(NodeId id, uint32_t depth);
  void StartBatches(NodeId id, Part part, uint32_t depth);
  void NextBatch(const Task& task);
  void MaybeMemoize(NodeId id);

  void Op(PickleOp op) { out_.push_back(static_cast<char>(op)); }
  void PushOp(PickleOp op) {
    tasks_.push_back({TaskKind::kOp, Part::kItems, kNoNode, 0, static_cast<size_t>(op), 0});
  }
  void PushVisit(NodeId id, uint32_t depth) {
    tasks_.push_back({TaskKind::kVisit, Part::kItems, id, depth, 0, 0});
  }
  void PutLittleEndian(uint64_t value, size_t width_bytes);
  void WriteInt(int64_t value);
  Status WriteLong(std::string_view le_bytes);
  void WriteFloat(double value);
  Status WriteStr(std::string_view utf8);
  Status WriteGlobal(std::string_view module, std::string_view name);
  Status WriteBytesValue(std::string_view bytes);

  const PickleTree& tree_;
  const PickleWriteOptions& options_;
  std::string out_;
  std::vector<Task> tasks_;
  std::vector<uint8_t> refs_;   // references from the root, saturating at 2
  std::vector<uint32_t> memo_;  // memo index of a written shared node, or kNotMemoized
  std::vector<uint8_t> open_;   // 1 from a compound node's first byte to its memo store
  uint32_t next_memo_ = 0;
};

Result<std::string> Pickler::Run(NodeId root) {
  RS_RETURN_IF_ERROR(CountReferences(root));
  memo_.assign(tree_.size(), kNotMemoized);
  open_.assign(tree_.size(), 0);
  Op(PickleOp::kProto);
  out_.push_back(2);
  PushVisit(root, 1);
  while (!tasks_.empty()) {
    const Task task = tasks_.back();
    tasks_.pop_back();
    RS_RETURN_IF_ERROR(Step(task));
  }
  Op(PickleOp::kStop);
  return std::move(out_);
}

// Counts the references to every node reachable from `root` (each child slot counts, and the
// root counts one), and validates ids and node shapes before anything is written.
Status Pickler::CountReferences(NodeId root) {
  if (!tree_.valid(root)) {
    return InvalidArgument("pickle writer: root " + std::to_string(root) + " is not a node");
  }
  refs_.assign(tree_.size(), 0);
  std::vector<uint8_t> seen(tree_.size(), 0);
  std::vector<NodeId> pending = {root};
  refs_[root] = 1;
  seen[root] = 1;
  while (!pending.empty()) {
    const NodeId id = pending.back();
    pending.pop_back();
    const Node& node = tree_.node(id);
    if (const std::string error = ShapeError(node); !error.empty()) {
      return InvalidArgument("pickle writer: " + NodeLabel(tree_, id) + " " + error);
    }
    NodeId bad_child = kNoNode;
    ForEachChild(node, [&](NodeId child) {
      if (!tree_.valid(child)) {
        bad_child = child;
        return;
      }
      if (refs_[child] < 2) ++refs_[child];
      if (!seen[child]) {
        seen[child] = 1;
        pending.push_back(child);
      }
    });
    if (bad_child != kNoNode) {
      return InvalidArgument("pickle writer: " + NodeLabel(tree_, id) + " refers to node " +
                             std::to_string(bad_child) + ", which does not exist");
    }
  }
  return Status::Ok();
}

Status Pickler::Step(const Task& task) {
  switch (task.kind) {
    case TaskKind::kVisit: return Visit(task.id, task.depth);
    case TaskKind::kItems: {
      if (task.begin + 1 < task.end) {
        Task rest = task;
        rest.begin = task.begin + 1;
        tasks_.push_back(rest);
      }
      PushVisit(Slots(tree_.node(task.id), task.part)[task.begin], task.depth + 1);
      return Status::Ok();
    }
    case TaskKind::kBatch: NextBatch(task); return Status::Ok();
    case TaskKind::kOp: out_.push_back(static_cast<char>(task.begin)); return Status::Ok();
    case TaskKind::kClose: {
      open_[task.id] = 0;
      MaybeMemoize(task.id);
      return Status::Ok();
    }
  }
  return Internal("pickle writer: unknown task");
}

Status Pickler::Visit(NodeId id, uint32_t depth) {
  if (depth > options_.max_depth) {
    return ResourceExhausted("pickle writer: " + NodeLabel(tree_, id) + " at nesting depth " +
                             std::to_string(depth) + " exceeds limit " +
                             std::to_string(options_.max_depth));
  }
  if (memo_[id] != kNotMemoized) {
    const uint32_t index = memo_[id];
    Op(index < 256 ? PickleOp::kBinGet : PickleOp::kLongBinGet);
    PutLittleEndian(index, index < 256 ? 1 : 4);
    return Status::Ok();
  }
  // Shared lists, dicts and objects are memoized before their items or extras, so a cycle
  // back to them is a BINGET; reaching an open node means a cycle through its operands.
  if (open_[id]) {
    return Unsupported("pickle writer: cycle through a " + NodeLabel(tree_, id) +
                       ", which protocol 2 cannot express");
  }
  const Node& node = tree_.node(id);
  switch (node.kind) {
    case NodeKind::kNone: Op(PickleOp::kNone); return Status::Ok();
    case NodeKind::kBool:
      Op(node.b ? PickleOp::kNewTrue : PickleOp::kNewFalse);
      return Status::Ok();
    case NodeKind::kInt: WriteInt(node.i); return Status::Ok();
    case NodeKind::kFloat: WriteFloat(node.f); return Status::Ok();
    case NodeKind::kBigInt: RS_RETURN_IF_ERROR(WriteLong(node.text)); break;
    case NodeKind::kStr: RS_RETURN_IF_ERROR(WriteStr(node.text)); break;
    case NodeKind::kGlobal: RS_RETURN_IF_ERROR(WriteGlobal(node.text, node.global_name())); break;
    case NodeKind::kBytes: RS_RETURN_IF_ERROR(WriteBytesValue(node.text)); break;
    case NodeKind::kByteArray: {
      RS_RETURN_IF_ERROR(WriteGlobal("__builtin__", "bytearray"));
      if (node.text.empty()) {
        Op(PickleOp::kEmptyTuple);
      } else {
        RS_RETURN_IF_ERROR(WriteBytesValue(node.text));
        Op(PickleOp::kTuple1);
      }
      Op(PickleOp::kReduce);
      break;
    }
    case NodeKind::kTuple: {
      const size_t n = node.items.size();
      if (n == 0) {
        Op(PickleOp::kEmptyTuple);
        return Status::Ok();
      }
      if (n > 3) Op(PickleOp::kMark);
      constexpr PickleOp kSmall[] = {PickleOp::kTuple1, PickleOp::kTuple2, PickleOp::kTuple3};
      OpenWithItems(id, depth, n > 3 ? PickleOp::kTuple : kSmall[n - 1]);
      return Status::Ok();
    }
    case NodeKind::kList:
    case NodeKind::kDict: {
      Op(node.kind == NodeKind::kList ? PickleOp::kEmptyList : PickleOp::kEmptyDict);
      MaybeMemoize(id);
      StartBatches(id, Part::kItems, depth);
      return Status::Ok();
    }
    case NodeKind::kSet:
    case NodeKind::kFrozenSet: {
      // Python below protocol 4 reduces a set to set(list_of_items).
      RS_RETURN_IF_ERROR(
          WriteGlobal("__builtin__", node.kind == NodeKind::kSet ? "set" : "frozenset"));
      Op(PickleOp::kEmptyList);
      Open(id, PickleOp::kReduce);
      PushOp(PickleOp::kTuple1);
      StartBatches(id, Part::kItems, depth);
      return Status::Ok();
    }
    case NodeKind::kBuild: OpenWithItems(id, depth, PickleOp::kBuild); return Status::Ok();
    case NodeKind::kPersId: OpenWithItems(id, depth, PickleOp::kBinPersId); return Status::Ok();
    case NodeKind::kReduce:
    case NodeKind::kNewObj: {
      if (node.items.size() == 3) {
        return Unsupported("pickle writer: " + NodeLabel(tree_, id) +
                           " has kwargs (NEWOBJ_EX), which protocol 2 cannot express");
      }
      ScheduleObjectExtras(id, depth);
      OpenWithItems(id, depth,
                    node.kind == NodeKind::kReduce ? PickleOp::kReduce : PickleOp::kNewObj);
      return Status::Ok();
    }
  }
  MaybeMemoize(id);
  return Status::Ok();
}

// Schedules `close_op`, then the memo store, after whatever the caller pushes next. Until the
// store, `id` is open: reaching it again is a cycle protocol 2 cannot express.
void Pickler::Open(NodeId id, PickleOp close_op) {
  open_[id] = 1;
  tasks_.push_back({TaskKind::kClose, Part::kItems, id, 0, 0, 0});
  PushOp(close_op);
}

void Pickler::OpenWithItems(NodeId id, uint32_t depth, PickleOp close_op) {
  Open(id, close_op);
  tasks_.push_back({TaskKind::kItems, Part::kItems, id, depth, 0, tree_.node(id).items.size()});
}

// What Python's save_reduce writes after the object and its memo store: APPEND(S) of the list
// items, SETITEM(S) of the dict items, then the state and BUILD. Pushed first, so runs last.
void Pickler::ScheduleObjectExtras(NodeId id, uint32_t depth) {
  const Node& node = tree_.node(id);
  if (node.state != kNoNode) {
    PushOp(PickleOp::kBuild);
    PushVisit(node.state, depth + 1);
  }
  StartBatches(id, Part::kDictItems, depth);
  StartBatches(id, Part::kListItems, depth);
}

void Pickler::StartBatches(NodeId id, Part part, uint32_t depth) {
  if (!Slots(tree_.node(id), part).empty()) {
    tasks_.push_back({TaskKind::kBatch, part, id, depth, 0, 0});
  }
}

// One batch: MARK, items, APPENDS / SETITEMS, or, for a single entry, no MARK and APPEND /
// SETITEM. The next batch is scheduled after this one, so the task stack stays short.
// CPython's C pickler writes a single entry only for a list or dict of exactly one entry, but
// for every one-entry batch of an object's list_items/dict_items (it iterates those).
void Pickler::NextBatch(const Task& task) {
  const Node& node = tree_.node(task.id);
  const std::vector<NodeId>& items = Slots(node, task.part);
  const bool pairs = task.part == Part::kDictItems ||
                     (task.part == Part::kItems && node.kind == NodeKind::kDict);
  const size_t per_entry = pairs ? 2 : 1;
  const size_t end = std::min(items.size(), task.begin + kBatchSize * per_entry);
  if (end < items.size()) {
    Task next = task;
    next.begin = end;
    tasks_.push_back(next);
  }
  const bool single = end - task.begin == per_entry &&
                      (task.part != Part::kItems || items.size() == per_entry);
  if (pairs) {
    PushOp(single ? PickleOp::kSetItem : PickleOp::kSetItems);
  } else {
    PushOp(single ? PickleOp::kAppend : PickleOp::kAppends);
  }
  tasks_.push_back({TaskKind::kItems, task.part, task.id, task.depth, task.begin, end});
  if (!single) Op(PickleOp::kMark);
}

void Pickler::MaybeMemoize(NodeId id) {
  if (refs_[id] < 2 || !Memoizable(tree_.node(id))) return;
  const uint32_t index = next_memo_++;
  memo_[id] = index;
  Op(index < 256 ? PickleOp::kBinPut : PickleOp::kLongBinPut);
  PutLittleEndian(index, index < 256 ? 1 : 4);
}

// ---- value encodings ----

void Pickler::PutLittleEndian(uint64_t value, size_t width_bytes) {
  for (size_t k = 0; k < width_bytes; ++k) out_.push_back(static_cast<char>(value >> (8 * k)));
}

void Pickler::WriteInt(int64_t value) {
  if (value >= 0 && value <= 0xFF) {
    Op(PickleOp::kBinInt1);
    PutLittleEndian(static_cast<uint64_t>(value), 1);
  } else if (value >= 0 && value <= 0xFFFF) {
    Op(PickleOp::kBinInt2);
    PutLittleEndian(static_cast<uint64_t>(value), 2);
  } else if (value >= INT32_MIN && value <= INT32_MAX) {
    Op(PickleOp::kBinInt);
    PutLittleEndian(static_cast<uint64_t>(value), 4);
  } else {
    // The shortest two's complement: drop top bytes that only repeat the sign of the next one.
    const auto bits = static_cast<uint64_t>(value);
    size_t length = 8;
    while (length > 1) {
      const auto top = static_cast<uint8_t>(bits >> (8 * (length - 1)));
      const auto next = static_cast<uint8_t>(bits >> (8 * (length - 2)));
      const bool redundant = (top == 0x00 && next < 0x80) || (top == 0xFF && next >= 0x80);
      if (!redundant) break;
      --length;
    }
    Op(PickleOp::kLong1);
    out_.push_back(static_cast<char>(length));
    PutLittleEndian(bits, length);
  }
}

Status Pickler::WriteLong(std::string_view le_bytes) {
  if (le_bytes.size() < 256) {
    Op(PickleOp::kLong1);
    PutLittleEndian(le_bytes.size(), 1);
  } else if (le_bytes.size() <= INT32_MAX) {
    Op(PickleOp::kLong4);
    PutLittleEndian(le_bytes.size(), 4);
  } else {
    return Unsupported("pickle writer: int of " + std::to_string(le_bytes.size()) +
                       " bytes exceeds LONG4");
  }
  out_.append(le_bytes);
  return Status::Ok();
}

void Pickler::WriteFloat(double value) {
  Op(PickleOp::kBinFloat);
  const auto bits = std::bit_cast<uint64_t>(value);
  for (int shift = 56; shift >= 0; shift -= 8) out_.push_back(static_cast<char>(bits >> shift));
}

Status Pickler::WriteStr(std::string_view utf8) {
  if (utf8.size() > UINT32_MAX) {
    return Unsupported("pickle writer: str of " + std::to_string(utf8.size()) +
                       " bytes exceeds BINUNICODE's 4-byte length");
  }
  Op(PickleOp::kBinUnicode);
  PutLittleEndian(utf8.size(), 4);
  out_.append(utf8);
  return Status::Ok();
}

Status Pickler::WriteGlobal(std::string_view module, std::string_view name) {
  if (module.find('\n') != std::string_view::npos || name.find('\n') != std::string_view::npos) {
    return Unsupported("pickle writer: GLOBAL name contains a newline");
  }
  Op(PickleOp::kGlobal);
  out_.append(module);
  out_.push_back('\n');
  out_.append(name);
  out_.push_back('\n');
  return Status::Ok();
}

// Protocol 2 has no bytes opcode; Python 3 writes `_codecs.encode(text, "latin1")`, where each
// byte is the code point of one char of `text`.
Status Pickler::WriteBytesValue(std::string_view bytes) {
  if (bytes.empty()) {
    RS_RETURN_IF_ERROR(WriteGlobal("__builtin__", "bytes"));
    Op(PickleOp::kEmptyTuple);
    Op(PickleOp::kReduce);
    return Status::Ok();
  }
  std::string text;
  text.reserve(bytes.size() * 2);
  for (const char c : bytes) {
    const auto byte = static_cast<uint8_t>(c);
    if (byte < 0x80) {
      text.push_back(c);
    } else {
      text.push_back(static_cast<char>(0xC0 | (byte >> 6)));
      text.push_back(static_cast<char>(0x80 | (byte & 0x3F)));
    }
  }
  RS_RETURN_IF_ERROR(WriteGlobal("_codecs", "encode"));
  RS_RETURN_IF_ERROR(WriteStr(text));
  RS_RETURN_IF_ERROR(WriteStr("latin1"));
  Op(PickleOp::kTuple2);
  Op(PickleOp::kReduce);
  return Status::Ok();
}

}  // namespace

Result<std::string> WritePickle(const PickleTree& tree, NodeId root,
                                const PickleWriteOptions& options) {
  return Pickler(tree, options).Run(root);
}

}  // namespace reshard::format
