// UNIVERSAL_CHECKPOINT_INFO and SubparamShape: the model-level conversion schema of a universal
// checkpoint, read out of an inert pickle tree.
//
// `universal_checkpoint_info` is a plain dict stored in the copied model-states files
// (deepspeed_universal.md §2). DeepSpeed's converter reads it from the first model-states file
// only; the loaders never read it (they read the per-file keys of zero/<param>/<state>.pt,
// param_state.h). reshardfs keeps it for the planner (AutoTP sub-parameter widths, vocab size,
// pattern sanity) and to refuse what it cannot serve faithfully.
//
// SubparamShape is DeepSpeed's dataclass {patterns, shape, partition_dim}. It appears as a
// plain dict in `parameter_with_sub_params` and as a pickled object (NEWOBJ + BUILD of that
// dict) under the `sub_param_shape` key of zero/<param>/<state>.pt. Both parse to the struct
// below, which keeps the view spec exactly as pickled (tuple vs list, tuple vs int at each
// dimension) so a planner can re-emit it and apply DeepSpeed's rules to it.
//
// Errors: the parse functions return kCorrupt for a value of the wrong type or shape and
// kUnsupported for what reshardfs refuses by design; messages name the key and the value but
// not the file (callers Annotate() with the file path). Pure functions; thread-compatible.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"

namespace reshard::ucp {

// The newest universal_checkpoint_version reshardfs understands: DeepSpeed 0.19.8's
// UNIVERSAL_CHECKPOINT_VERSION_VALUE. A checkpoint that records a larger one is refused.
inline constexpr double kMaxUniversalCheckpointVersion = 0.4;

// One dimension of a SubparamShape view spec: a tuple of physical sub-parameter sizes, or a
// single int (a size, -1 = inferred; legacy metadata used an int at partition_dim as a count).
struct SubparamDim {
  bool is_tuple = false;
  int64_t size = 0;                // when !is_tuple
  std::vector<int64_t> sub_sizes;  // when is_tuple (elements, in order)

  bool operator==(const SubparamDim& o) const {
    return is_tuple == o.is_tuple && size == o.size && sub_sizes == o.sub_sizes;
  }
  bool operator!=(const SubparamDim& o) const { return !(*this == o); }
};

struct SubparamShape {
  std::vector<std::string> patterns;  // regexes (Python `re.match` semantics), as written
  std::vector<SubparamDim> shape;     // the view spec of the full parameter
  bool shape_is_tuple = false;        // `shape` pickled as a tuple (else a list)
  int64_t partition_dim = 0;          // 0 <= partition_dim < shape.size() (checked)

  bool operator==(const SubparamShape& o) const {
    return patterns == o.patterns && shape == o.shape && shape_is_tuple == o.shape_is_tuple &&
           partition_dim == o.partition_dim;
  }
  bool operator!=(const SubparamShape& o) const { return !(*this == o); }
};

// Parses the fields {'patterns': [str], 'shape': list|tuple of (int | tuple of ints),
// 'partition_dim': int} from a dict-like node. Exactly these three keys are accepted.
Result<SubparamShape> ParseSubparamShapeFields(const format::PickleTree& tree, format::NodeId dict);

// Parses a pickled deepspeed.checkpoint.universal_checkpoint.SubparamShape object (NEWOBJ with
// a BUILD state dict, as pickle writes a dataclass). kCorrupt for any other node.
Result<SubparamShape> ParseSubparamShapeObject(const format::PickleTree& tree, format::NodeId id);

// One entry of `affine_map['params']` (DeepSpeed 0.19.8 AutoTP), reduced to the split it
// describes: how the SOURCE ranks held the parameter. Accepted: every rank holds the whole tensor,
// or every rank holds blocks cut along one dim, one block (a plain split) or one per sub-parameter
// of a fused layout ([Q, K, V] along dim 0: each rank holds its slice of each sub-parameter). The
// dim, and the sub-parameters, are what a target of any TP degree splits again (with AutoTP's own
// shard sizes).
struct AffineSplit {
  std::string pattern;                // the regex key, e.g. ^model\.layers\.0\.self_attn\.q_proj\.weight$
  std::vector<int64_t> logical_shape;
  std::optional<int> partition_dim;   // unset: every source rank held the whole tensor (replicated)
  // A fused layout's sub-parameter sizes along partition_dim, in order (they sum to its extent);
  // empty for a plain split.
  std::vector<int64_t> sub_param_sizes;
  // With sub_param_sizes: each source rank's block of each sub-parameter along partition_dim,
  // [sub-parameter][rank] (a rank's shard is its blocks of every sub-parameter, in order).
  std::vector<std::vector<int64_t>> sub_param_rank_widths;
};

// The parsed universal_checkpoint_info of a checkpoint. Lists are empty when the key is absent.
struct UniversalCheckpointInfo {
  // False when the model-states file has no `universal_checkpoint_info` (or holds None): a
  // plain DeepSpeed run converted with --inject_missing_state, whose copied files keep none.
  bool present = false;
  format::NodeId node = format::kNoNode;  // the dict, in the first model-states file's tree

  // `universal_checkpoint_version` as recorded; DeepSpeed's converter reads a missing one as 0.0.
  std::optional<double> version;
  std::optional<int64_t> original_vocab_size;
  std::optional<int64_t> padded_vocab_size;  // informational (Megatron)
  std::vector<std::string> vocabulary_parameter_patterns;
  std::vector<std::string> pipeline_replicated_parameter_patterns;
  std::vector<std::string> tp_replicated_parameter_patterns;
  std::vector<std::string> parameter_to_average_patterns;
  std::vector<std::string> parameter_with_row_parallelism_patterns;
  std::vector<std::string> parameter_with_2_sub_params_cat_dim_0;
  std::vector<SubparamShape> parameter_with_sub_params;
  // pattern -> per sub-parameter -> per *source* TP rank width (elements along partition_dim).
  std::map<std::string, std::vector<std::vector<int64_t>>> sub_param_shard_widths;
  std::vector<std::string> expert_parameter_patterns;
  // `affine_map` (version 1), one entry per parameter pattern, in the map's order.
  std::vector<AffineSplit> affine_splits;
  // `ds_autoep_layers` (or legacy `autoep_layers`): AutoEP layer metadata, kept inert.
  format::NodeId autoep_layers = format::kNoNode;

  // The version DeepSpeed's converter compares against: `version`, or 0.0 when absent.
  double effective_version() const { return version.value_or(0.0); }
};

// Parses `info` (a dict-like node, None, or kNoNode for "absent") and refuses, with
// kUnsupported:
//   - universal_checkpoint_version > kMaxUniversalCheckpointVersion
//     ("unsupported universal checkpoint version 0.5 (reshardfs supports up to 0.4)");
//   - a key outside the list above;
//   - an `affine_map` of another version than 1, or with a map AffineSplit cannot describe (a
//     scale, strides other than row-major, blocks cut along several dims or not tiling the dim);
//   - a non-empty `autotp_unsupported_parameter_patterns` (DeepSpeed's converter refuses it too).
// kCorrupt for a known key with a value of the wrong type, a sub_param_shard_widths entry
// whose widths are negative, or a negative vocab size.
Result<UniversalCheckpointInfo> ParseUniversalCheckpointInfo(const format::PickleTree& tree, format::NodeId info);

// "0.4", "0.5", "1": the shortest decimal that reads back as `version` (for messages).
std::string FormatVersion(double version);

}  // namespace reshard::ucp
