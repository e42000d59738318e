// TreeToJson: a PickleTree as JSON, for `reshardfs inspect --json` and the tests.
//
// Encoding (every node, recursively; shared nodes are expanded where they occur):
//   None -> null, bool -> true/false, int (fits int64) -> number, str -> string, list -> array;
//   {"int": "<decimal>"} for ints beyond int64, {"int_bytes": "<hex>"} (little-endian two's
//   complement, as pickled) for those longer than kMaxDecimalBytes; {"float": x} ("nan", "inf", "-inf" as strings);
//   {"bytes": "<hex>"}, {"bytearray": "<hex>"}, {"tuple": [...]}, {"dict": [[k, v], ...]},
//   {"set": [...]}, {"frozenset": [...]}, {"global": [module, name]},
//   {"reduce": [callable, args]} / {"newobj": [cls, args(, kwargs)]}, plus "listitems",
//   "dictitems" and "state" keys on that object when the pickle added them,
//   {"build": [object, state]}, {"persid": pid};
//   a tensor rebuild (torch_tensor.h) -> {"tensor": {"dtype", "shape", "stride",
//   "storage_offset", "storage", "requires_grad"}}.
//
// Expansion is bounded: nesting deeper than `max_depth`, more than `max_nodes` emitted nodes or
// more than `max_bytes` of estimated JSON (a DAG can expand exponentially, and one shared bytes
// object printed at each of its references multiplies its hex) is kResourceExhausted; a cycle is
// kUnsupported.
// Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>

#include <nlohmann/json.hpp>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"

namespace reshard::format {

// The longest int printed in decimal: 1024 bytes, about 2,470 digits (the conversion is quadratic;
// Python refuses str() past 4,300 digits).
inline constexpr size_t kMaxDecimalBytes = 1024;

struct TreeJsonLimits {
  uint32_t max_depth = 512;
  uint64_t max_nodes = 1u << 24;
  // Estimated memory of the JSON: 128 bytes per emitted node plus the text it holds (strings,
  // names, decimal ints, bytes as hex).
  uint64_t max_bytes = uint64_t{96} << 20;
};

Result<nlohmann::ordered_json> TreeToJson(const PickleTree& tree, NodeId root,
                                          const TreeJsonLimits& limits = {});

// The decimal text of a kBigInt node's little-endian two's-complement bytes.
std::string BigIntToDecimal(const std::string& le_bytes);

}  // namespace reshard::format
