#include "reshard/format/pickle_reader.h"

#include <algorithm>
#include <bit>
#include <functional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "reshard/format/pickle_opcodes.h"

namespace reshard::format {
namespace {

// A GLOBAL line is a dotted Python name. The bound keeps a missing newline from turning one
// opcode into a scan of the whole input.
constexpr size_t kMaxGlobalLineBytes = 4096;

std::string HexByte(uint8_t byte) {
  constexpr char kDigits[] = "0123456789abcdef";
  return std::string{'0', 'x', kDigits[byte >> 4], kDigits[byte & 0xF]};
}

// Index of the first byte that breaks UTF-8, or npos. Surrogate code points are accepted
// (Python writes lone surrogates with "surrogatepass"); overlong forms and values past
// U+10FFFF are not.
size_t FirstInvalidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto lead = static_cast<uint8_t>(s[i]);
    if (lead < 0x80) {
      ++i;
      continue;
    }
    size_t len = 0;
    uint32_t code_point = 0;
    uint32_t min_code_point = 0;
    if ((lead & 0xE0) == 0xC0) {
      len = 2, code_point = lead & 0x1F, min_code_point = 0x80;
    } else if ((lead & 0xF0) == 0xE0) {
      len = 3, code_point = lead & 0x0F, min_code_point = 0x800;
    } else if ((lead & 0xF8) == 0xF0) {
      len = 4, code_point = lead & 0x07, min_code_point = 0x10000;
    } else {
      return i;
    }
    if (len > s.size() - i) return i;
    for (size_t k = 1; k < len; ++k) {
      const auto cont = static_cast<uint8_t>(s[i + k]);
      if ((cont & 0xC0) != 0x80) return i;
      code_point = (code_point << 6) | (cont & 0x3F);
    }
    if (code_point < min_code_point || code_point > 0x10FFFF) return i;
    i += len;
  }
  return std::string_view::npos;
}

// Hashes and compares kStr key nodes by content, so a dict's key index stores NodeIds rather
// than copies of the keys.
struct StrKeyHash {
  const PickleTree* tree;
  size_t operator()(NodeId key) const {
    return std::hash<std::string_view>{}(tree->node(key).text);
  }
};
struct StrKeyEq {
  const PickleTree* tree;
  bool operator()(NodeId a, NodeId b) const { return tree->node(a).text == tree->node(b).text; }
};
// str key node -> position of that key in the dict's items.
using DictKeyIndex = std::unordered_map<NodeId, size_t, StrKeyHash, StrKeyEq>;

// The arena's budget for a pickle of `input_bytes` (PickleLimits::max_tree_bytes), saturating.
uint64_t TreeBudget(uint64_t input_bytes, const PickleLimits& limits) {
  const uint64_t per_input = limits.max_tree_bytes_per_input_byte;
  const uint64_t scaled = per_input != 0 && input_bytes > UINT64_MAX / per_input ? UINT64_MAX : input_bytes * per_input;
  return std::max(limits.max_tree_bytes, scaled);
}

class Unpickler {
 public:
  Unpickler(std::string_view input, const PickleLimits& limits)
      : input_(input), limits_(limits),
        tree_budget_(TreeBudget(input.size(), limits)),
        node_limit_(std::min(limits.max_nodes, tree_budget_ / kBytesPerNode)) {}

  Result<PickleTree> Run();

 private:
  // The single opcode switch.
  Status Execute();

  // ---- errors: "offset K: OPNAME: detail" ----
  Status Fail(StatusCode code, const std::string& detail) const;
  Status Underflow() const { return Fail(StatusCode::kCorrupt, "stack underflow"); }

  // ---- input ----
  uint64_t Remaining() const { return input_.size() - pos_; }
  Result<uint64_t> ReadUInt(size_t width_bytes);
  Result<uint64_t> ReadLength(size_t width_bytes, bool is_signed);
  Result<std::string_view> ReadPayload(uint64_t length, std::string_view what);
  Result<std::string_view> ReadLine();

  // ---- stack ----
  size_t Fence() const { return marks_.empty() ? 0 : marks_.back(); }
  size_t Available() const { return stack_.size() - Fence(); }
  Status Push(NodeId id);
  Result<NodeId> Pop();
  Status PopInto(size_t count, NodeId* out);
  Result<std::vector<NodeId>> PopMark();
  Result<NodeId> ExtendTarget(NodeKind container_kind);
  Result<std::vector<NodeId>*> Slots(NodeId target, NodeKind container_kind);
  Status PushMark();
  Status PopTopOrMark();

  // ---- nodes ----
  Status ChargePayload(uint64_t length);
  uint64_t DepthOver(const NodeId* items, size_t count) const;
  Status Adopt(NodeId id, uint64_t depth);
  Status Extend(NodeId container, NodeId item);
  Status PushBinInt(size_t width_bytes);
  Status PushText(NodeKind kind, size_t length_width, bool signed_length = false);
  Status PushLong(size_t length_width);
  Status PushBinFloat();
  Status PushItems(NodeKind kind, std::vector<NodeId> items);
  Status PushMarked(NodeKind kind);
  Status PushTupleOf(size_t count);
  Status PushRecord(NodeKind kind, size_t operand_count);
  Status PushGlobal();
  Status PushStackGlobal();
  Status Build();

  // ---- containers ----
  Status Append(NodeKind container_kind, bool marked);
  Status SetItem(NodeId target, NodeId key, NodeId value);
  Status SetPairs(NodeId target, const std::vector<NodeId>& pairs);
  Status SetItems(bool marked);
  Status PushDict();

  // ---- memo ----
  Status MemoPut(size_t id_width);
  Status MemoGet(size_t id_width);

  Status CheckProto();
  Status SkipFrame();
  Status Stop();
  Status Rejected(std::string_view why) const;

  std::string_view input_;
  const PickleLimits& limits_;
  size_t pos_ = 0;        // next byte to read
  size_t op_offset_ = 0;  // offset of the opcode being executed
  uint8_t op_ = 0;
  bool stopped_ = false;

  PickleTree tree_;
  std::vector<uint32_t> depth_;  // per node of tree_, see PickleLimits::max_depth
  // What a node costs in the arena and depth_ (its child lists and payload are bounded by the
  // input's size, not by the node count).
  static constexpr uint64_t kBytesPerNode = sizeof(Node) + sizeof(uint32_t);
  const uint64_t tree_budget_;  // bytes the arena may take (PickleLimits::max_tree_bytes)
  const uint64_t node_limit_;   // max_nodes, lowered to what tree_budget_ holds
  std::vector<NodeId> stack_;
  std::vector<size_t> marks_;  // stack_.size() at each open MARK
  std::unordered_map<uint32_t, NodeId> memo_;
  std::unordered_map<NodeId, DictKeyIndex> dict_keys_;  // per SETITEM target with str keys
  uint64_t payload_bytes_ = 0;
};

Result<PickleTree> Unpickler::Run() {
  if (input_.empty()) return Corrupt("empty input: a pickle needs at least PROTO and STOP");
  const auto first = static_cast<uint8_t>(input_[0]);
  if (first != static_cast<uint8_t>(PickleOp::kProto)) {
    std::string found = PickleOpName(first).empty() ? "byte" : std::string(PickleOpName(first));
    return Unsupported("offset 0: expected PROTO (protocols 2 to 5), found " + found + " " +
                       HexByte(first) + " (protocols 0 and 1 are not supported)");
  }
  // Every opcode that makes a node takes at least one byte, so no pickle makes more nodes than
  // it has bytes: reserving that many (within the limit) means depth_ never reallocates.
  const uint64_t most_nodes = std::min<uint64_t>(node_limit_ + 1, input_.size());
  depth_.reserve(static_cast<size_t>(most_nodes));
  while (!stopped_) {
    if (pos_ >= input_.size()) {
      return Corrupt("offset " + std::to_string(pos_) + ": truncated: input ends before STOP");
    }
    op_offset_ = pos_;
    op_ = static_cast<uint8_t>(input_[pos_++]);
    RS_RETURN_IF_ERROR(Execute());
  }
  tree_.set_root(stack_.front());
  return std::move(tree_);
}

Status Unpickler::Execute() {
  switch (static_cast<PickleOp>(op_)) {
    case PickleOp::kProto: return CheckProto();
    case PickleOp::kFrame: return SkipFrame();
    case PickleOp::kStop: return Stop();
    case PickleOp::kMark: return PushMark();
    case PickleOp::kPop: return PopTopOrMark();
    case PickleOp::kPopMark: return PopMark().status();
    case PickleOp::kDup: return Available() == 0 ? Underflow() : Push(stack_.back());

    case PickleOp::kNone: return Adopt(tree_.AddNone(), 1);
    case PickleOp::kNewTrue: return Adopt(tree_.AddBool(true), 1);
    case PickleOp::kNewFalse: return Adopt(tree_.AddBool(false), 1);
    case PickleOp::kBinInt: return PushBinInt(4);
    case PickleOp::kBinInt1: return PushBinInt(1);
    case PickleOp::kBinInt2: return PushBinInt(2);
    case PickleOp::kLong1: return PushLong(1);
    case PickleOp::kLong4: return PushLong(4);
    case PickleOp::kBinFloat: return PushBinFloat();

    case PickleOp::kShortBinUnicode: return PushText(NodeKind::kStr, 1);
    case PickleOp::kBinUnicode: return PushText(NodeKind::kStr, 4);
    case PickleOp::kBinUnicode8: return PushText(NodeKind::kStr, 8);
    case PickleOp::kShortBinString: return PushText(NodeKind::kStr, 1);
    case PickleOp::kBinString: return PushText(NodeKind::kStr, 4, /*signed_length=*/true);
    case PickleOp::kShortBinBytes: return PushText(NodeKind::kBytes, 1);
    case PickleOp::kBinBytes: return PushText(NodeKind::kBytes, 4);
    case PickleOp::kBinBytes8: return PushText(NodeKind::kBytes, 8);
    case PickleOp::kByteArray8: return PushText(NodeKind::kByteArray, 8);

    case PickleOp::kEmptyTuple: return Adopt(tree_.AddTuple({}), 1);
    case PickleOp::kTuple1: return PushTupleOf(1);
    case PickleOp::kTuple2: return PushTupleOf(2);
    case PickleOp::kTuple3: return PushTupleOf(3);
    case PickleOp::kTuple: return PushMarked(NodeKind::kTuple);
    case PickleOp::kEmptyList: return Adopt(tree_.AddList(), 1);
    case PickleOp::kList: return PushMarked(NodeKind::kList);
    case PickleOp::kAppend: return Append(NodeKind::kList, /*marked=*/false);
    case PickleOp::kAppends: return Append(NodeKind::kList, /*marked=*/true);
    case PickleOp::kEmptyDict: return Adopt(tree_.AddDict(), 1);
    case PickleOp::kDict: return PushDict();
    case PickleOp::kSetItem: return SetItems(/*marked=*/false);
    case PickleOp::kSetItems: return SetItems(/*marked=*/true);
    case PickleOp::kEmptySet: return Adopt(tree_.AddSet(), 1);
    case PickleOp::kAddItems: return Append(NodeKind::kSet, /*marked=*/true);
    case PickleOp::kFrozenSet: return PushMarked(NodeKind::kFrozenSet);

    case PickleOp::kGlobal: return PushGlobal();
    case PickleOp::kStackGlobal: return PushStackGlobal();
    case PickleOp::kReduce: return PushRecord(NodeKind::kReduce, 2);
    case PickleOp::kNewObj: return PushRecord(NodeKind::kNewObj, 2);
    case PickleOp::kNewObjEx: return PushRecord(NodeKind::kNewObj, 3);
    case PickleOp::kBinPersId: return PushRecord(NodeKind::kPersId, 1);
    case PickleOp::kBuild: return Build();

    case PickleOp::kBinGet: return MemoGet(1);
    case PickleOp::kLongBinGet: return MemoGet(4);
    case PickleOp::kBinPut: return MemoPut(1);
    case PickleOp::kLongBinPut: return MemoPut(4);
    case PickleOp::kMemoize: return MemoPut(0);

    case PickleOp::kInt:
    case PickleOp::kLong:
    case PickleOp::kString:
    case PickleOp::kUnicode:
    case PickleOp::kFloat:
    case PickleOp::kGet:
    case PickleOp::kPut:
    case PickleOp::kPersId:
    case PickleOp::kInst:
    case PickleOp::kObj: return Rejected("opcode of the text protocols 0 and 1");
    case PickleOp::kExt1:
    case PickleOp::kExt2:
    case PickleOp::kExt4: return Rejected("extension-registry opcode");
    case PickleOp::kNextBuffer:
    case PickleOp::kReadOnlyBuffer: return Rejected("out-of-band buffer opcode");
  }
  return Corrupt("offset " + std::to_string(op_offset_) + ": unknown opcode " + HexByte(op_));
}

Status Unpickler::Fail(StatusCode code, const std::string& detail) const {
  return Status(code, "offset " + std::to_string(op_offset_) + ": " +
                          std::string(PickleOpName(op_)) + ": " + detail);
}

Status Unpickler::Rejected(std::string_view why) const {
  return Fail(StatusCode::kUnsupported,
              std::string(why) + " " + HexByte(op_) + " is not supported (protocols 2 to 5 only)");
}

Status Unpickler::CheckProto() {
  // Picklers write PROTO once, first; a later one means spliced or garbled input.
  if (op_offset_ != 0) return Fail(StatusCode::kCorrupt, "PROTO is only valid as the first opcode");
  RS_ASSIGN_OR_RETURN(const uint64_t version, ReadUInt(1));
  if (version < 2 || version > 5) {
    return Fail(StatusCode::kUnsupported,
                "protocol " + std::to_string(version) + " (supported: 2 to 5)");
  }
  return Status::Ok();
}

// Frames only batch reads; the length is checked and the content read as usual.
Status Unpickler::SkipFrame() {
  RS_ASSIGN_OR_RETURN(const uint64_t length, ReadUInt(8));
  if (length > Remaining()) {
    return Fail(StatusCode::kCorrupt, "frame length " + std::to_string(length) +
                                          " exceeds remaining " + std::to_string(Remaining()) +
                                          " bytes");
  }
  return Status::Ok();
}

Status Unpickler::Stop() {
  if (!marks_.empty()) {
    return Fail(StatusCode::kCorrupt, std::to_string(marks_.size()) + " MARK(s) still open");
  }
  if (stack_.size() != 1) {
    return Fail(StatusCode::kCorrupt,
                std::to_string(stack_.size()) + " values on the stack, expected exactly 1");
  }
  stopped_ = true;
  return Status::Ok();
}

// ---- input ----

Result<uint64_t> Unpickler::ReadUInt(size_t width_bytes) {
  if (width_bytes > Remaining()) {
    return Fail(StatusCode::kCorrupt, "truncated: needs " + std::to_string(width_bytes) +
                                          " argument bytes, " + std::to_string(Remaining()) +
                                          " remain");
  }
  uint64_t value = 0;
  for (size_t k = 0; k < width_bytes; ++k) {
    value |= static_cast<uint64_t>(static_cast<uint8_t>(input_[pos_ + k])) << (8 * k);
  }
  pos_ += width_bytes;
  return value;
}

// BINSTRING and LONG4 carry a signed 32-bit length; Python rejects a negative one.
Result<uint64_t> Unpickler::ReadLength(size_t width_bytes, bool is_signed) {
  RS_ASSIGN_OR_RETURN(const uint64_t raw, ReadUInt(width_bytes));
  if (!is_signed) return raw;
  const auto length = static_cast<int32_t>(static_cast<uint32_t>(raw));
  if (length < 0) return Fail(StatusCode::kCorrupt, "negative length " + std::to_string(length));
  return static_cast<uint64_t>(length);
}

Result<std::string_view> Unpickler::ReadPayload(uint64_t length, std::string_view what) {
  if (length > Remaining()) {
    return Fail(StatusCode::kCorrupt, std::string(what) + " length " + std::to_string(length) +
                                          " exceeds remaining " + std::to_string(Remaining()) +
                                          " bytes");
  }
  const std::string_view payload = input_.substr(pos_, static_cast<size_t>(length));
  pos_ += static_cast<size_t>(length);
  return payload;
}

Result<std::string_view> Unpickler::ReadLine() {
  const std::string_view rest = input_.substr(pos_);
  const size_t newline = rest.substr(0, kMaxGlobalLineBytes + 1).find('\n');
  if (newline == std::string_view::npos) {
    if (rest.size() > kMaxGlobalLineBytes) {
      return Fail(StatusCode::kCorrupt,
                  "line longer than " + std::to_string(kMaxGlobalLineBytes) + " bytes");
    }
    return Fail(StatusCode::kCorrupt, "truncated: no newline in the last " +
                                          std::to_string(rest.size()) + " bytes");
  }
  const std::string_view line = rest.substr(0, newline);
  if (const size_t bad = FirstInvalidUtf8(line); bad != std::string_view::npos) {
    return Fail(StatusCode::kCorrupt, "invalid UTF-8 at byte " + std::to_string(bad) + " of name");
  }
  pos_ += newline + 1;
  return line;
}

// ---- stack ----

Status Unpickler::Push(NodeId id) {
  if (stack_.size() >= limits_.max_stack) {
    return Fail(StatusCode::kResourceExhausted,
                "stack limit " + std::to_string(limits_.max_stack) + " exceeded");
  }
  stack_.push_back(id);
  return Status::Ok();
}

Result<NodeId> Unpickler::Pop() {
  if (Available() == 0) return Underflow();
  const NodeId id = stack_.back();
  stack_.pop_back();
  return id;
}

// Pops `count` values into out[0..count) in stack order (the deepest first).
Status Unpickler::PopInto(size_t count, NodeId* out) {
  if (Available() < count) return Underflow();
  std::copy(stack_.end() - static_cast<std::ptrdiff_t>(count), stack_.end(), out);
  stack_.resize(stack_.size() - count);
  return Status::Ok();
}

Result<std::vector<NodeId>> Unpickler::PopMark() {
  if (marks_.empty()) return Fail(StatusCode::kCorrupt, "no MARK on the stack");
  const size_t mark = marks_.back();
  marks_.pop_back();
  std::vector<NodeId> items(stack_.begin() + static_cast<std::ptrdiff_t>(mark), stack_.end());
  stack_.resize(mark);
  return items;
}

Status Unpickler::PushMark() {
  if (marks_.size() >= limits_.max_stack) {
    return Fail(StatusCode::kResourceExhausted,
                "open MARK limit " + std::to_string(limits_.max_stack) + " exceeded");
  }
  marks_.push_back(stack_.size());
  return Status::Ok();
}

// CPython's POP removes the top mark when no value lies above it; pickle.py does the same.
Status Unpickler::PopTopOrMark() {
  if (!marks_.empty() && marks_.back() == stack_.size()) {
    marks_.pop_back();
    return Status::Ok();
  }
  return Pop().status();
}

// ---- nodes ----

Status Unpickler::ChargePayload(uint64_t length) {
  if (length > limits_.max_payload_bytes - payload_bytes_) {
    return Fail(StatusCode::kResourceExhausted,
                "payload of " + std::to_string(length) + " bytes exceeds the remaining budget (" +
                    std::to_string(payload_bytes_) + " of " +
                    std::to_string(limits_.max_payload_bytes) + " bytes used)");
  }
  payload_bytes_ += length;
  return Status::Ok();
}

uint64_t Unpickler::DepthOver(const NodeId* items, size_t count) const {
  uint32_t deepest = 0;
  for (size_t k = 0; k < count; ++k) deepest = std::max(deepest, depth_[items[k]]);
  return uint64_t{1} + deepest;
}

// Records the depth of the node just added and pushes it. Every node added to tree_ passes
// through here, so depth_ stays parallel to the arena and the node count is checked once.
Status Unpickler::Adopt(NodeId id, uint64_t depth) {
  if (tree_.size() > node_limit_) {
    return Fail(StatusCode::kResourceExhausted,
                "node limit " + std::to_string(node_limit_) + " exceeded" +
                    (node_limit_ < limits_.max_nodes
                         ? " (the tree's " + std::to_string(tree_budget_) + "-byte budget)"
                         : ""));
  }
  if (depth > limits_.max_depth) {
    return Fail(StatusCode::kResourceExhausted, "nesting depth " + std::to_string(depth) +
                                                    " exceeds limit " +
                                                    std::to_string(limits_.max_depth));
  }
  depth_.push_back(static_cast<uint32_t>(depth));
  return Push(id);
}

// Raises a container's depth for an item added after it was built.
Status Unpickler::Extend(NodeId container, NodeId item) {
  const uint64_t depth = uint64_t{1} + depth_[item];
  if (depth <= depth_[container]) return Status::Ok();
  if (depth > limits_.max_depth) {
    return Fail(StatusCode::kResourceExhausted, "nesting depth " + std::to_string(depth) +
                                                    " exceeds limit " +
                                                    std::to_string(limits_.max_depth));
  }
  depth_[container] = static_cast<uint32_t>(depth);
  return Status::Ok();
}

// BININT is a signed int32; BININT1 and BININT2 are unsigned.
Status Unpickler::PushBinInt(size_t width_bytes) {
  RS_ASSIGN_OR_RETURN(const uint64_t raw, ReadUInt(width_bytes));
  const int64_t value = width_bytes == 4 ? static_cast<int32_t>(static_cast<uint32_t>(raw))
                                         : static_cast<int64_t>(raw);
  return Adopt(tree_.AddInt(value), 1);
}

Status Unpickler::PushText(NodeKind kind, size_t length_width, bool signed_length) {
  RS_ASSIGN_OR_RETURN(const uint64_t length, ReadLength(length_width, signed_length));
  RS_ASSIGN_OR_RETURN(const std::string_view payload,
                      ReadPayload(length, kind == NodeKind::kStr ? "string" : "bytes"));
  RS_RETURN_IF_ERROR(ChargePayload(length));
  if (kind == NodeKind::kStr) {
    if (const size_t bad = FirstInvalidUtf8(payload); bad != std::string_view::npos) {
      return Fail(StatusCode::kCorrupt, "invalid UTF-8 at byte " + std::to_string(bad) +
                                            " of a " + std::to_string(length) + "-byte string");
    }
    return Adopt(tree_.AddStr(std::string(payload)), 1);
  }
  if (kind == NodeKind::kBytes) return Adopt(tree_.AddBytes(std::string(payload)), 1);
  return Adopt(tree_.AddByteArray(std::string(payload)), 1);
}

// LONG1 has an unsigned 1-byte length, LONG4 a signed 4-byte one.
Status Unpickler::PushLong(size_t length_width) {
  RS_ASSIGN_OR_RETURN(const uint64_t length, ReadLength(length_width, length_width == 4));
  RS_ASSIGN_OR_RETURN(const std::string_view payload, ReadPayload(length, "long"));
  RS_RETURN_IF_ERROR(ChargePayload(length));
  return Adopt(tree_.AddLong(payload), 1);
}

// BINFLOAT is the one big-endian argument in the protocol.
Status Unpickler::PushBinFloat() {
  RS_ASSIGN_OR_RETURN(const uint64_t little_endian, ReadUInt(8));
  return Adopt(tree_.AddFloat(std::bit_cast<double>(__builtin_bswap64(little_endian))), 1);
}

Status Unpickler::PushItems(NodeKind kind, std::vector<NodeId> items) {
  const uint64_t depth = DepthOver(items.data(), items.size());
  NodeId id = kNoNode;
  if (kind == NodeKind::kTuple) {
    id = tree_.AddTuple(std::move(items));
  } else if (kind == NodeKind::kList) {
    id = tree_.AddList(std::move(items));
  } else {
    id = tree_.AddFrozenSet(std::move(items));
  }
  return Adopt(id, depth);
}

Status Unpickler::PushMarked(NodeKind kind) {
  RS_ASSIGN_OR_RETURN(std::vector<NodeId> items, PopMark());
  return PushItems(kind, std::move(items));
}

Status Unpickler::PushTupleOf(size_t count) {
  std::vector<NodeId> items(count);
  RS_RETURN_IF_ERROR(PopInto(count, items.data()));
  return PushItems(NodeKind::kTuple, std::move(items));
}

// REDUCE {callable, args}, NEWOBJ {cls, args}, NEWOBJ_EX {cls, args, kwargs}, BINPERSID {pid}.
Status Unpickler::PushRecord(NodeKind kind, size_t operand_count) {
  NodeId ops[3] = {kNoNode, kNoNode, kNoNode};
  RS_RETURN_IF_ERROR(PopInto(operand_count, ops));
  const uint64_t depth = DepthOver(ops, operand_count);
  NodeId id = kNoNode;
  if (kind == NodeKind::kReduce) {
    id = tree_.AddReduce(ops[0], ops[1]);
  } else if (kind == NodeKind::kPersId) {
    id = tree_.AddPersId(ops[0]);
  } else if (operand_count == 2) {
    id = tree_.AddNewObj(ops[0], ops[1]);
  } else {
    id = tree_.AddNewObjEx(ops[0], ops[1], ops[2]);
  }
  return Adopt(id, depth);
}

Status Unpickler::PushGlobal() {
  RS_ASSIGN_OR_RETURN(const std::string_view module, ReadLine());
  RS_ASSIGN_OR_RETURN(const std::string_view name, ReadLine());
  RS_RETURN_IF_ERROR(ChargePayload(module.size() + name.size() + sizeof(NodeExtras)));
  return Adopt(tree_.AddGlobal(std::string(module), std::string(name)), 1);
}

Status Unpickler::PushStackGlobal() {
  NodeId ops[2] = {kNoNode, kNoNode};
  RS_RETURN_IF_ERROR(PopInto(2, ops));
  const Node& module = tree_.node(ops[0]);
  const Node& name = tree_.node(ops[1]);
  if (module.kind != NodeKind::kStr || name.kind != NodeKind::kStr) {
    return Fail(StatusCode::kCorrupt, "operands must be str, got " +
                                          std::string(NodeKindName(module.kind)) + " and " +
                                          std::string(NodeKindName(name.kind)));
  }
  RS_RETURN_IF_ERROR(ChargePayload(module.text.size() + name.text.size() + sizeof(NodeExtras)));
  return Adopt(tree_.AddGlobal(module.text, name.text), 1);
}

// On an object from REDUCE/NEWOBJ, BUILD records the state on the object node itself, which
// stays on the stack (and in the memo). Anything else, or a second BUILD, is wrapped in a kBuild
// node that replaces the object on the stack; memo entries keep the pre-BUILD id.
Status Unpickler::Build() {
  RS_ASSIGN_OR_RETURN(const NodeId state, Pop());
  if (Available() == 0) return Underflow();
  const NodeId object = stack_.back();
  Node& node = tree_.mutable_node(object);
  const bool is_object = node.kind == NodeKind::kReduce || node.kind == NodeKind::kNewObj;
  if (is_object && node.state == kNoNode) {
    node.state = state;
    return Extend(object, state);
  }
  stack_.pop_back();
  const NodeId ops[2] = {object, state};
  return Adopt(tree_.AddBuild(object, state), DepthOver(ops, 2));
}

// ---- containers ----

// APPEND(S) extend a kList, or the list_items of an object from REDUCE/NEWOBJ (a list
// subclass); SETITEM(S) a kDict, or such an object's dict_items (an OrderedDict); ADDITEMS
// a kSet. Python would call .append/.__setitem__/.add on anything; torch and DeepSpeed
// pickles need no more than this.
Result<NodeId> Unpickler::ExtendTarget(NodeKind container_kind) {
  if (Available() == 0) return Underflow();
  const NodeKind actual = tree_.node(stack_.back()).kind;
  const bool objects_too = container_kind != NodeKind::kSet;
  const bool is_object = actual == NodeKind::kReduce || actual == NodeKind::kNewObj;
  if (actual != container_kind && !(objects_too && is_object)) {
    return Fail(StatusCode::kCorrupt, "target is a " + std::string(NodeKindName(actual)) +
                                          ", not a " + std::string(NodeKindName(container_kind)) +
                                          (objects_too ? " or an object" : ""));
  }
  return stack_.back();
}

// The vector an ExtendTarget result grows (nodes never move, so the pointer stays valid). An object's
// items live in its NodeExtras, allocated on its first APPEND or SETITEM and charged to the
// payload budget like a GLOBAL's (so they too are bounded by the input's size).
Result<std::vector<NodeId>*> Unpickler::Slots(NodeId target, NodeKind container_kind) {
  Node& node = tree_.mutable_node(target);
  if (node.kind == container_kind) return &node.items;
  if (!node.extras) RS_RETURN_IF_ERROR(ChargePayload(sizeof(NodeExtras)));
  NodeExtras& extras = node.mutable_extras();
  return container_kind == NodeKind::kList ? &extras.list_items : &extras.dict_items;
}

// APPEND (one item), APPENDS and ADDITEMS (the items above the top MARK).
Status Unpickler::Append(NodeKind container_kind, bool marked) {
  std::vector<NodeId> items;
  if (marked) {
    RS_ASSIGN_OR_RETURN(items, PopMark());
  } else {
    RS_ASSIGN_OR_RETURN(const NodeId item, Pop());
    items.push_back(item);
  }
  RS_ASSIGN_OR_RETURN(const NodeId target, ExtendTarget(container_kind));
  for (const NodeId item : items) RS_RETURN_IF_ERROR(Extend(target, item));
  RS_ASSIGN_OR_RETURN(std::vector<NodeId>* const slots, Slots(target, container_kind));
  slots->insert(slots->end(), items.begin(), items.end());
  return Status::Ok();
}

// Python's dict keeps one entry per key; str keys are compared here (through an index, so a
// large dict costs O(1) per entry), other key kinds cannot be compared without Python.
Status Unpickler::SetItem(NodeId target, NodeId key, NodeId value) {
  RS_RETURN_IF_ERROR(Extend(target, key));
  RS_RETURN_IF_ERROR(Extend(target, value));
  RS_ASSIGN_OR_RETURN(std::vector<NodeId>* const slots, Slots(target, NodeKind::kDict));
  std::vector<NodeId>& items = *slots;
  if (tree_.node(key).kind == NodeKind::kStr) {
    auto index_it = dict_keys_.find(target);
    if (index_it == dict_keys_.end()) {
      index_it =
          dict_keys_.emplace(target, DictKeyIndex(0, StrKeyHash{&tree_}, StrKeyEq{&tree_})).first;
    }
    const auto [it, inserted] = index_it->second.try_emplace(key, items.size());
    if (!inserted) {
      items[it->second + 1] = value;
      return Status::Ok();
    }
  }
  items.push_back(key);
  items.push_back(value);
  return Status::Ok();
}

Status Unpickler::SetPairs(NodeId target, const std::vector<NodeId>& pairs) {
  if (pairs.size() % 2 != 0) {
    return Fail(StatusCode::kCorrupt,
                "odd number of items (" + std::to_string(pairs.size()) + ") after MARK");
  }
  for (size_t k = 0; k < pairs.size(); k += 2) {
    RS_RETURN_IF_ERROR(SetItem(target, pairs[k], pairs[k + 1]));
  }
  return Status::Ok();
}

Status Unpickler::SetItems(bool marked) {
  std::vector<NodeId> pairs(2);
  if (marked) {
    RS_ASSIGN_OR_RETURN(pairs, PopMark());
  } else {
    RS_RETURN_IF_ERROR(PopInto(2, pairs.data()));
  }
  RS_ASSIGN_OR_RETURN(const NodeId target, ExtendTarget(NodeKind::kDict));
  return SetPairs(target, pairs);
}

Status Unpickler::PushDict() {
  RS_ASSIGN_OR_RETURN(const std::vector<NodeId> pairs, PopMark());
  const NodeId dict = tree_.AddDict();
  RS_RETURN_IF_ERROR(Adopt(dict, 1));
  return SetPairs(dict, pairs);
}

// ---- memo ----

// `id_width` is the width of the id argument, or 0 for MEMOIZE, whose id is the memo's size.
Status Unpickler::MemoPut(size_t id_width) {
  uint64_t id = memo_.size();
  if (id_width > 0) {
    RS_ASSIGN_OR_RETURN(id, ReadUInt(id_width));
  }
  if (Available() == 0) return Underflow();
  const auto key = static_cast<uint32_t>(id);
  const auto it = memo_.find(key);
  if (it != memo_.end()) {
    it->second = stack_.back();  // Python overwrites, too
    return Status::Ok();
  }
  if (memo_.size() >= limits_.max_memo_entries) {
    return Fail(StatusCode::kResourceExhausted,
                "id " + std::to_string(id) + ": memo limit " +
                    std::to_string(limits_.max_memo_entries) + " exceeded");
  }
  memo_.emplace(key, stack_.back());
  return Status::Ok();
}

Status Unpickler::MemoGet(size_t id_width) {
  RS_ASSIGN_OR_RETURN(const uint64_t id, ReadUInt(id_width));
  const auto it = memo_.find(static_cast<uint32_t>(id));
  if (it == memo_.end()) {
    return Fail(StatusCode::kCorrupt, "id " + std::to_string(id) + " was never stored");
  }
  return Push(it->second);
}

}  // namespace

Result<PickleTree> ParsePickle(std::string_view bytes, const PickleLimits& limits) {
  return Unpickler(bytes, limits).Run();
}

}  // namespace reshard::format
