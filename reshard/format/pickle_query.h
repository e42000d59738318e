// Read-only queries over an inert PickleTree: the small vocabulary that interpreters of
// torch.save files (ucp/, plan/) use to pull plain values out of a pickle without executing it.
//
// A pickle tree keeps Python's objects as records (pickle_value.h), so a value the program
// thinks of as "a dict" may be a kDict (a literal {}) or an OrderedDict() REDUCE whose entries
// SETITEMS stored in dict_items; "an int" may be an IntEnum member pickled as
// REDUCE(Enum, (1,)) or, by name, as REDUCE(getattr, (Enum, 'optimizer_states')). These
// helpers recognise exactly those forms and nothing else: they never guess a type, never
// coerce (a bool is not an int, an int is not a float unless the helper says so), and report
// "no match" with std::nullopt, nullptr or kNoNode. Callers turn that into a Status that names
// their file and field; DescribeNode() gives the "got ..." part of such messages.
//
// Ids outside the tree are treated as "no match", so chained lookups need no validity checks.
// All functions are pure, allocation-light (vectors are returned by pointer into the tree)
// and safe to call from several threads on a const tree. Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reshard/format/pickle_value.h"

namespace reshard::format {

// ---- containers ----

// The alternating key/value ids (k0, v0, k1, v1, ...) of a dict-like node: a kDict, or an
// object made by REDUCE(collections.OrderedDict, ()) (what torch state dicts and DeepSpeed's
// param_shapes are). nullptr for any other node. A BUILD state on an OrderedDict (torch's
// `_metadata`) is not an entry and is not included.
const std::vector<NodeId>* DictItems(const PickleTree& tree, NodeId id);

// The value stored under the str key `key` in a dict-like node (see DictItems), or kNoNode
// when the node is not dict-like or has no such key. Non-str keys are skipped.
NodeId DictLookup(const PickleTree& tree, NodeId dict, std::string_view key);

// The items of a kTuple or kList; nullptr for any other node.
const std::vector<NodeId>* SequenceItems(const PickleTree& tree, NodeId id);

// ---- scalars (exact kinds only) ----

bool IsNone(const PickleTree& tree, NodeId id);
std::optional<bool> AsBool(const PickleTree& tree, NodeId id);     // kBool
std::optional<int64_t> AsInt(const PickleTree& tree, NodeId id);   // kInt (not kBool, not kBigInt)
std::optional<double> AsFloat(const PickleTree& tree, NodeId id);  // kFloat
// A Python number: kFloat, or a kInt converted to double (exact up to 2^53).
std::optional<double> AsNumber(const PickleTree& tree, NodeId id);
// The text of a kStr. The view points into the tree and lives as long as the node.
std::optional<std::string_view> AsStr(const PickleTree& tree, NodeId id);

// ---- homogeneous sequences ----

// A tuple or list whose items are all kInt / all kStr; std::nullopt otherwise (an empty
// sequence matches both).
std::optional<std::vector<int64_t>> AsIntSequence(const PickleTree& tree, NodeId id);
std::optional<std::vector<std::string>> AsStrSequence(const PickleTree& tree, NodeId id);

// torch.Size as torch pickles it: REDUCE(GLOBAL torch.Size, (tuple_of_ints,)). Returns the
// dimensions; std::nullopt for any other node (including a plain tuple).
std::optional<std::vector<int64_t>> AsTorchSize(const PickleTree& tree, NodeId id);

// ---- objects of named classes ----

// The GLOBAL a constructed object names: the callable of a kReduce, the class of a kNewObj,
// or, for a kBuild node, that of the object it built. kNoNode for anything else.
NodeId ObjectClass(const PickleTree& tree, NodeId id);

// True when `id` is an object (see ObjectClass) of class module.name.
bool IsObjectOf(const PickleTree& tree, NodeId id, std::string_view module, std::string_view name);

// The state BUILD gave an object: Node::state of a kReduce/kNewObj, items[1] of a kBuild;
// kNoNode when there is none (NEWOBJ without BUILD) or the node is no object.
NodeId ObjectState(const PickleTree& tree, NodeId id);

// A member of a Python Enum class module.name, in the two forms pickle writes it:
//   by value: REDUCE(GLOBAL module.name, (value,))            -> value set, name empty
//   by name:  REDUCE(GLOBAL builtins.getattr, (GLOBAL module.name, 'member'))
//             (protocol 2 spells the module `__builtin__`)      -> name set, no value
// std::nullopt for any other node. Only int values are recognised by value (IntEnum).
struct EnumMember {
  std::optional<int64_t> value;
  std::string name;
};
std::optional<EnumMember> AsEnumMember(const PickleTree& tree, NodeId id, std::string_view module,
                                       std::string_view name);

// ---- messages ----

// A short description for error messages: "int 3", "bool True", "float 0.5", "str 'abc'"
// (truncated past 40 bytes), "list of 2", "dict of 3 entries", "OrderedDict of 3 entries",
// "object of deepspeed...LossScaler", "global torch.Size", "none", "no value" (kNoNode or
// an invalid id), or the kind name for everything else.
std::string DescribeNode(const PickleTree& tree, NodeId id);

}  // namespace reshard::format
