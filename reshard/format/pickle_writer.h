// WritePickle: a PickleTree -> protocol-2 pickle bytes, deterministically.
//
// Protocol 2 is what torch.save writes and the only protocol every torch reader accepts (the
// weights_only unpickler, the C++ unpickler, and Python's). The output is what Python 3's
// pickle.dumps(obj, protocol=2) writes for the same object graph after pickletools.optimize()
// (that is, without memo stores nobody reads), except that the helper GLOBALs and the "latin1"
// of the bytes and set encodings below are written again each time rather than memo-shared.
// It loads in Python and, when every GLOBAL is on torch's allow-list, with
// torch.load(weights_only=True). Same tree and root, same bytes.
//
// Encodings (opcode names as in pickle_opcodes.h):
//   None NONE; bool NEWTRUE/NEWFALSE; int BININT1 (0..255), BININT2 (256..65535), BININT
//   (int32), else LONG1 with the shortest two's-complement bytes; big int LONG1, or LONG4 from
//   256 bytes; float BINFLOAT; str BINUNICODE.
//   bytes: `_codecs.encode(<bytes as latin-1 text>, "latin1")` (protocol 2 has no bytes
//   opcode), or `__builtin__.bytes()` when empty; bytearray: `__builtin__.bytearray(<bytes>)`.
//   tuple EMPTY_TUPLE, TUPLE1/2/3, or MARK ... TUPLE; list EMPTY_LIST, then APPEND when it has
//   one item, else MARK ... APPENDS per batch of 1000 items (even a last batch of one); dict
//   likewise with EMPTY_DICT, SETITEM, SETITEMS and batches of 1000 pairs; set/frozenset
//   `__builtin__.set([items])` / `__builtin__.frozenset([items])` (a REDUCE).
//   global GLOBAL; build object, state, BUILD; persid pid, BINPERSID.
//   reduce callable, args, REDUCE (newobj: cls, args, NEWOBJ), then, as Python's save_reduce
//   does: the memo store if shared, list_items as APPEND(S), dict_items as SETITEM(S) (batches
//   of 1000, where any batch of one entry is a single APPEND / SETITEM), then state and BUILD.
//
// Sharing: a node referenced more than once from `root` (counting every child slot) is written
// once and stored with BINPUT (LONG_BINPUT from memo index 256); later references are BINGET
// (LONG_BINGET). Memo indices are assigned 0, 1, 2, ... in output order. None, bool, int,
// float and the empty tuple are re-written instead (as Python does). A list, a dict, and a
// reduce/newobj object before its list_items, dict_items and state, are stored in the memo
// before those items are written, so they may contain themselves, as in Python.
//
// Errors:
//   kInvalidArgument   `root` or a child id is not a node of `tree`; a node has the wrong
//                      item count for its kind (dict or dict_items odd, reduce/build not 2,
//                      persid not 1, a leaf with items); list_items, dict_items or state on a
//                      node that is not a reduce/newobj; a kBigInt with no bytes.
//   kUnsupported       not representable in protocol 2: a kNewObj with kwargs (NEWOBJ_EX), a
//                      GLOBAL module or name containing '\n', a str over 4 GiB - 1 bytes; and a
//                      cycle that passes through a tuple, set, build or persid, or through the
//                      callable/args of a reduce or newobj.
//   kResourceExhausted the nesting depth (root = 1) exceeds options.max_depth.
//
// The writer keeps an explicit work stack, so deep trees do not use the C++ stack. Memory is
// O(tree.size()) for per-node bookkeeping plus the output. Thread safety: reads `tree` only;
// concurrent calls on the same const tree are safe. Public header: C++17.
#pragma once

#include <cstdint>
#include <string>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"

namespace reshard::format {

struct PickleWriteOptions {
  // Longest chain of nested nodes from the root (the root alone has depth 1).
  uint32_t max_depth = 512;
};

// Returns the pickle of the value at `root` of `tree`.
Result<std::string> WritePickle(const PickleTree& tree, NodeId root,
                                const PickleWriteOptions& options = {});

}  // namespace reshard::format
