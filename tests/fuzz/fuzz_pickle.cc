// libFuzzer harness: the pickle reader (format/pickle_reader.h) on arbitrary bytes, under tight limits so
// that the fuzzer reaches the limit checks (depth, nodes, memo, stack, payload) as well as the opcodes.
// Every tree that parses is also rendered as JSON (tree_json.h), the walk `inspect` does, and when its root is
// a dict with a `universal_checkpoint_info` (a model-states pickle), that is parsed as Open() parses it
// (ucp/checkpoint_info.h: versions, TP patterns, sub-parameter shapes, affine maps).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "reshard/format/pickle_query.h"
#include "reshard/format/pickle_reader.h"
#include "reshard/format/tree_json.h"
#include "reshard/ucp/checkpoint_info.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  reshard::format::PickleLimits limits;
  limits.max_depth = 64;
  limits.max_nodes = 1 << 16;
  limits.max_memo_entries = 1 << 12;
  limits.max_stack = 1 << 12;
  limits.max_payload_bytes = 1 << 20;
  auto tree = reshard::format::ParsePickle(std::string_view(reinterpret_cast<const char*>(data), size), limits);
  if (!tree.ok()) return 0;
  reshard::format::TreeJsonLimits json_limits;
  json_limits.max_depth = 64;
  json_limits.max_nodes = 1 << 16;
  (void)reshard::format::TreeToJson(*tree, tree->root(), json_limits);
  const reshard::format::NodeId info = reshard::format::DictLookup(*tree, tree->root(), "universal_checkpoint_info");
  if (info != reshard::format::kNoNode) (void)reshard::ucp::ParseUniversalCheckpointInfo(*tree, info);
  return 0;
}
