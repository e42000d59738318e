// ParsePickle: pickle bytes (protocols 2 to 5) -> an inert PickleTree, under hard limits.
//
// The reader is a stack machine over the binary opcodes that torch.save, DeepSpeed and Python's
// pickler emit at protocols 2-5 (the full list is in pickle_reader.cc's single opcode switch).
// Nothing is imported or executed: GLOBAL/STACK_GLOBAL become kGlobal nodes, REDUCE, NEWOBJ,
// NEWOBJ_EX, BUILD and BINPERSID become records of their operands (pickle_value.h). It never
// recurses, never throws for bad input, and checks every length it reads against the bytes that
// remain before it allocates, so hostile input costs at most what PickleLimits allows.
//
// Semantics follow Python's Unpickler where they matter for the tree:
//   - Memo (BINPUT, LONG_BINPUT, MEMOIZE) stores the NodeId at the top of the stack. Containers
//     are therefore shared by id: a SETITEMS or APPENDS on a list or dict fetched with BINGET
//     is visible wherever that id occurs, and cycles (a list that contains itself) are possible.
//   - An object made by REDUCE, NEWOBJ or NEWOBJ_EX is mutated in place, like Python's object:
//     APPEND(S) on it fill its list_items (a list subclass), SETITEM(S) its dict_items (an
//     OrderedDict, as every torch state dict is), and the first BUILD on it sets its `state`
//     and leaves it on the stack. Memo references to the object see all of these.
//   - BUILD on anything else (or a second BUILD) replaces the top of the stack with a new
//     kBuild {object, state} node; a memo entry stored before that BUILD keeps pointing at the
//     pre-BUILD node, so a later BINGET yields the object, not the kBuild node.
//   - Dict entries (items of a kDict, dict_items of an object) with a str key equal to an
//     existing str key replace that entry's value, as Python's dict does; other key kinds are
//     appended as found. Set items are appended as found (Python never writes duplicates).
//   - BINSTRING/SHORT_BINSTRING are decoded as UTF-8 text (torch.load's encoding) into kStr.
//     All str payloads and GLOBAL names must be valid UTF-8; encoded surrogates (U+D800-U+DFFF)
//     are accepted because Python writes lone surrogates with "surrogatepass".
//   - Module names are kept as written: a protocol-2 `__builtin__.set` stays `__builtin__`,
//     and protocol-2 bytes (`_codecs.encode(text, "latin1")`) stay a kReduce.
//   - POP on a stack whose top is a mark removes the mark, as CPython's unpickler does.
// Stricter than Python, because no pickler writes otherwise:
//   - the first opcode must be PROTO with a version from 2 to 5; PROTO anywhere else is Corrupt;
//   - STOP needs exactly one value on the stack and no open MARK;
//   - APPEND(S) need a kList, SETITEM(S) a kDict (or, both, a REDUCE/NEWOBJ object as above),
//     ADDITEMS a kSet, and STACK_GLOBAL two kStr operands.
// Bytes after STOP are ignored, as Python does (torch never writes any).
// FRAME (protocol 4+) is checked to fit in the input and then ignored: frames only batch reads.
//
// Errors (all non-OK results):
//   kCorrupt           truncated input, a length past the end, stack underflow, a missing MARK,
//                      a type mismatch (SETITEMS on a list), an odd key/value count, BINGET of
//                      an id never stored, invalid UTF-8, an unknown opcode byte, a PROTO
//                      that is not the first opcode, empty input.
//   kUnsupported       known opcodes this reader does not take: the text-protocol opcodes
//                      (INT, LONG, STRING, UNICODE, FLOAT, GET, PUT, PERSID, INST, OBJ), EXT1/2/4
//                      (extension registry), NEXT_BUFFER/READONLY_BUFFER (out-of-band buffers);
//                      a first opcode that is not PROTO (protocols 0 and 1), and a PROTO
//                      version outside 2 to 5.
//   kResourceExhausted a PickleLimits bound was exceeded.
// Messages start with the offset of the opcode and its name, e.g.
//   "offset 17: LONG_BINPUT: id 4294967295: memo limit 1048576 exceeded".
// Callers prefix the file name with Status::Annotate ("data.pkl: offset 17: ...").
//
// Thread safety: ParsePickle has no shared state; concurrent calls are safe. The result owns
// all of its data (no views into `bytes`). Public header: C++17.
#pragma once

#include <cstdint>
#include <string_view>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"

namespace reshard::format {

struct PickleLimits {
  // Longest chain of nested values: a scalar has depth 1, a container or record 1 + the largest
  // depth among its items. Computed when a node is built or extended (APPEND, SETITEM, ...);
  // a container extended after it was placed in another does not update the outer one, so
  // consumers that walk the tree must still bound their own recursion (cycles are possible).
  uint32_t max_depth = 512;
  // Nodes in the resulting tree (every pushed value, including intermediate ones).
  uint64_t max_nodes = uint64_t{1} << 24;
  // Memory the node arena may take: the node limit is also the budget / (bytes per node, 84 on
  // LP64). The budget is max_tree_bytes (128 MiB: some 1,600,000 nodes) or, for a larger pickle,
  // max_tree_bytes_per_input_byte times its length: a model-states file lists every parameter
  // (about 26 nodes and 240 pickle bytes each, so 9 tree bytes per pickle byte), and one of
  // 62,000 parameters needs more than 128 MiB. A pickle of 1-byte opcodes makes one node per
  // byte; with this bound its tree costs at most 64 times its own size. The arena grows in
  // chunks and never copies itself, so a hostile pickle is refused when its nodes reach the
  // budget, before it costs more.
  uint64_t max_tree_bytes = uint64_t{128} << 20;
  uint64_t max_tree_bytes_per_input_byte = 64;
  // Distinct memo ids stored. Ids may be sparse (LONG_BINPUT 4294967295 costs one entry).
  uint32_t max_memo_entries = uint32_t{1} << 20;
  // Items on the value stack; also bounds the number of open MARKs.
  uint64_t max_stack = uint64_t{1} << 20;
  // Sum of the lengths of all str, bytes, bytearray, big-int and GLOBAL name payloads, in bytes,
  // plus sizeof(NodeExtras) (pickle_value.h) for every GLOBAL and every object that APPEND(S) or
  // SETITEM(S) extend.
  uint64_t max_payload_bytes = uint64_t{1} << 30;
};

// Parses one pickle from `bytes` (which must hold the whole pickle). On success the tree's
// root() is the value STOP returned. `bytes` is only read during the call.
Result<PickleTree> ParsePickle(std::string_view bytes, const PickleLimits& limits = {});

}  // namespace reshard::format
