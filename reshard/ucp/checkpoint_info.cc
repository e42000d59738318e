#include "reshard/ucp/checkpoint_info.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "reshard/base/checked_math.h"
#include "reshard/format/pickle_query.h"

namespace reshard::ucp {
namespace {

using format::DescribeNode;
using format::kNoNode;
using format::NodeId;
using format::NodeKind;
using format::PickleTree;

constexpr std::string_view kSubparamShapeModule = "deepspeed.checkpoint.universal_checkpoint";
constexpr std::string_view kSubparamShapeClass = "SubparamShape";

Status WrongType(std::string_view key, std::string_view expected, const PickleTree& tree, NodeId id) {
  return Corrupt("'" + std::string(key) + "' must be " + std::string(expected) + ", got " + DescribeNode(tree, id));
}

// Every key of a dict-like node must be a str; returns them in order. DeepSpeed only ever uses
// str keys here, so anything else is a file this parser does not understand.
Result<std::vector<std::pair<std::string, NodeId>>> StrKeyedEntries(const PickleTree& tree, NodeId dict,
                                                                    std::string_view what) {
  const std::vector<NodeId>* items = format::DictItems(tree, dict);
  if (items == nullptr) return Corrupt(std::string(what) + " must be a dict, got " + DescribeNode(tree, dict));
  std::vector<std::pair<std::string, NodeId>> out;
  for (size_t k = 0; k + 1 < items->size(); k += 2) {
    const auto key = format::AsStr(tree, (*items)[k]);
    if (!key) return Corrupt(std::string(what) + " has a non-str key: " + DescribeNode(tree, (*items)[k]));
    out.emplace_back(std::string(*key), (*items)[k + 1]);
  }
  return out;
}

Result<std::vector<std::string>> StrList(const PickleTree& tree, NodeId id, std::string_view key) {
  auto v = format::AsStrSequence(tree, id);
  if (!v) return WrongType(key, "a list of str", tree, id);
  return std::move(*v);
}

Result<SubparamDim> ParseSubparamDim(const PickleTree& tree, NodeId id) {
  SubparamDim d;
  if (const auto size = format::AsInt(tree, id)) {
    d.size = *size;
    return d;
  }
  // DeepSpeed tests `isinstance(d, tuple)`: a list here would be taken for a size and fail, so
  // only a tuple of ints counts as sub-parameter sizes.
  if (tree.valid(id) && tree.node(id).kind == NodeKind::kTuple) {
    auto sizes = format::AsIntSequence(tree, id);
    if (sizes) {
      for (int64_t s : *sizes) {
        if (s < 0) return Corrupt("SubparamShape 'shape' has a negative sub-parameter size " + std::to_string(s));
      }
      d.is_tuple = true;
      d.sub_sizes = std::move(*sizes);
      return d;
    }
  }
  return WrongType("shape", "a sequence of int or tuple of int", tree, id);
}

// universal_checkpoint_info keys reshardfs reads (constants.py of DeepSpeed 0.19.8).
constexpr std::string_view kVersion = "universal_checkpoint_version";
constexpr std::string_view kOriginalVocab = "original_vocab_size";
constexpr std::string_view kPaddedVocab = "padded_vocab_size";
constexpr std::string_view kVocabPatterns = "vocabulary_parameter_patterns";
constexpr std::string_view kPipelinePatterns = "pipeline_replicated_parameter_patterns";
constexpr std::string_view kTpReplicatedPatterns = "tp_replicated_parameter_patterns";
constexpr std::string_view kAveragePatterns = "parameter_to_average_patterns";
constexpr std::string_view kRowPatterns = "parameter_with_row_parallelism_patterns";
constexpr std::string_view kTwoSubParams = "parameter_with_2_sub_params_cat_dim_0";
constexpr std::string_view kSubParams = "parameter_with_sub_params";
constexpr std::string_view kShardWidths = "sub_param_shard_widths";
constexpr std::string_view kUnsupportedPatterns = "autotp_unsupported_parameter_patterns";
constexpr std::string_view kExpertPatterns = "expert_parameter_patterns";
constexpr std::string_view kAutoEpLayers = "ds_autoep_layers";
constexpr std::string_view kAutoEpLayersLegacy = "autoep_layers";
// Defined by DeepSpeed but never written or read: accepted and ignored, as DeepSpeed does.
constexpr std::string_view kUnusedSubParamsShape = "sub_params_shape";
constexpr std::string_view kAffineMap = "affine_map";

// AutoTP marks layouts it cannot describe (Yuan shared-QK, codegen, bigcode fused QKV) here;
// the converter refuses the whole checkpoint, so a UCP carrying them was made some other way
// and its merged tensors cannot be trusted. The message lists every pattern and reason.
Status RefuseUnsupportedPatterns(const PickleTree& tree, NodeId id) {
  const std::vector<NodeId>* items = format::DictItems(tree, id);
  if (items == nullptr) return WrongType(kUnsupportedPatterns, "a dict", tree, id);
  if (items->empty()) return Status::Ok();
  std::string list;
  for (size_t k = 0; k + 1 < items->size(); k += 2) {
    if (!list.empty()) list += "; ";
    const auto pattern = format::AsStr(tree, (*items)[k]);
    const auto reason = format::AsStr(tree, (*items)[k + 1]);
    list += pattern ? std::string(*pattern) : DescribeNode(tree, (*items)[k]);
    list += ": ";
    list += reason ? std::string(*reason) : DescribeNode(tree, (*items)[k + 1]);
  }
  return Unsupported("'" + std::string(kUnsupportedPatterns) +
                     "' lists AutoTP layouts that cannot be converted (DeepSpeed refuses them too): " + list);
}

Result<std::vector<int64_t>> IntList(const PickleTree& tree, NodeId id, const std::string& what) {
  auto v = format::AsIntSequence(tree, id);
  if (!v) return Corrupt(what + " must be a list of int, got " + DescribeNode(tree, id));
  return std::move(*v);
}

// A shape read from an affine map: non-negative dims whose row-major strides (every suffix product)
// fit in int64, so that offsets computed from them cannot overflow.
Result<std::vector<int64_t>> AffineShape(const PickleTree& tree, NodeId id, const std::string& what) {
  RS_ASSIGN_OR_RETURN(std::vector<int64_t> shape, IntList(tree, id, what));
  uint64_t product = 1;
  for (size_t i = shape.size(); i-- > 0;) {
    const std::optional<uint64_t> next =
        shape[i] < 0 ? std::nullopt : CheckedMul(product, static_cast<uint64_t>(std::max<int64_t>(shape[i], 1)));
    if (!next || *next > static_cast<uint64_t>(INT64_MAX)) {
      return Corrupt(what + " must hold non-negative dims whose product fits in int64");
    }
    product = *next;
  }
  return shape;
}

std::vector<int64_t> RowMajorStrides(const std::vector<int64_t>& shape) {
  std::vector<int64_t> strides(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(shape[i], 1);
  return strides;
}

// One piece of a rank's shard as the block of the full tensor it copies: `width` indices from
// `start` along the split dim, every index of the other dims.
struct AffineBlock {
  int64_t dest_offset = 0;
  int64_t start = 0;
  int64_t width = 0;
};

// One parameter's ParamAffineMap.to_dict(): {'logical_shape', 'ranks': {rank: {'shard_shape',
// 'pieces': [{'shape', 'source': (offset, strides), 'dest': (offset, strides), 'locations'[,
// 'scale']}]}}}. Accepted when every rank's shard is the whole tensor, or the concatenation along
// one dim (the same for all ranks) of blocks of it, read with the full tensor's row-major strides:
// one block per rank (a plain split), or one per sub-parameter (a fused layout such as [Q, K, V]),
// where the ranks' j-th blocks, in rank order, tile sub-parameter j and the sub-parameters tile the
// dim in order.
Result<AffineSplit> ParseAffineSplit(const PickleTree& tree, const std::string& pattern, NodeId map) {
  const std::string what = "affine_map['" + pattern + "']";
  AffineSplit split;
  split.pattern = pattern;
  RS_ASSIGN_OR_RETURN(split.logical_shape, AffineShape(tree, format::DictLookup(tree, map, "logical_shape"),
                                                       what + "['logical_shape']"));
  const std::vector<int64_t>& full = split.logical_shape;
  const std::vector<int64_t> full_strides = RowMajorStrides(full);
  const std::vector<NodeId>* ranks = format::DictItems(tree, format::DictLookup(tree, map, "ranks"));
  if (ranks == nullptr || ranks->empty()) return Corrupt(what + "['ranks'] must be a non-empty dict");
  auto not_plain = [&](const std::string& why) {
    return Unsupported(what + " is not a split of one dim into blocks (" + why +
                       "); such AutoTP layouts are not served yet");
  };
  std::vector<std::vector<AffineBlock>> by_rank;  // in the map's (sorted) rank order
  bool whole = false;
  for (size_t k = 0; k + 1 < ranks->size(); k += 2) {
    const NodeId shard = (*ranks)[k + 1];
    RS_ASSIGN_OR_RETURN(std::vector<int64_t> shard_shape,
                        AffineShape(tree, format::DictLookup(tree, shard, "shard_shape"), what + " shard_shape"));
    const std::vector<NodeId>* pieces = format::SequenceItems(tree, format::DictLookup(tree, shard, "pieces"));
    if (pieces == nullptr) return Corrupt(what + ": a rank without a 'pieces' list");
    if (shard_shape.size() != full.size()) return not_plain("a shard of another rank");
    const std::vector<int64_t> shard_strides = RowMajorStrides(shard_shape);
    std::vector<AffineBlock>& blocks = by_rank.emplace_back();
    for (const NodeId piece : *pieces) {
      if (const NodeId scale = format::DictLookup(tree, piece, "scale");
          scale != format::kNoNode && format::AsNumber(tree, scale) != 1.0) {
        return not_plain("a scaled piece");
      }
      RS_ASSIGN_OR_RETURN(std::vector<int64_t> shape,
                          AffineShape(tree, format::DictLookup(tree, piece, "shape"), what + " piece shape"));
      const std::vector<NodeId>* source = format::SequenceItems(tree, format::DictLookup(tree, piece, "source"));
      const std::vector<NodeId>* dest = format::SequenceItems(tree, format::DictLookup(tree, piece, "dest"));
      if (source == nullptr || source->size() != 2 || dest == nullptr || dest->size() != 2) {
        return Corrupt(what + ": a piece without (offset, strides) source and dest");
      }
      RS_ASSIGN_OR_RETURN(std::vector<int64_t> strides, IntList(tree, (*source)[1], what + " source strides"));
      RS_ASSIGN_OR_RETURN(std::vector<int64_t> dest_strides, IntList(tree, (*dest)[1], what + " dest strides"));
      const std::optional<int64_t> offset = format::AsInt(tree, (*source)[0]);
      const std::optional<int64_t> dest_offset = format::AsInt(tree, (*dest)[0]);
      if (!offset || !dest_offset || *offset < 0 || *dest_offset < 0) {
        return Corrupt(what + ": a piece offset that is not a non-negative int");
      }
      if (shape.size() != full.size()) return not_plain("a piece of another rank");
      if (strides != full_strides) return not_plain("source strides other than the full tensor's");
      if (dest_strides != shard_strides) return not_plain("dest strides other than the shard's");
      std::vector<int> cut;
      for (size_t d = 0; d < shape.size(); ++d) {
        if (shape[d] != full[d]) cut.push_back(static_cast<int>(d));
      }
      if (cut.size() > 1) return not_plain("a piece cut along several dims");
      if (cut.empty()) {
        if (pieces->size() != 1 || *offset != 0 || shard_shape != full) return not_plain("a whole tensor among pieces");
        whole = true;
        continue;
      }
      if (split.partition_dim && *split.partition_dim != cut[0]) return not_plain("pieces cut along different dims");
      const auto dim = static_cast<size_t>(cut[0]);
      split.partition_dim = cut[0];
      // The block starts at index offset / stride along the split dim and at 0 along every other.
      if (*offset % full_strides[dim] != 0 || (dim > 0 && *offset >= full_strides[dim - 1])) {
        return not_plain("a piece that does not start at a whole index of the split dim");
      }
      const int64_t start = *offset / full_strides[dim];
      if (!RangeFits(static_cast<uint64_t>(start), static_cast<uint64_t>(shape[dim]),
                     static_cast<uint64_t>(full[dim]))) {
        return not_plain("a piece outside the tensor");
      }
      blocks.push_back({*dest_offset, start, shape[dim]});
    }
    std::sort(blocks.begin(), blocks.end(),
              [](const AffineBlock& a, const AffineBlock& b) { return a.dest_offset < b.dest_offset; });
    // The shard is the blocks' concatenation along the split dim, in dest order.
    if (split.partition_dim) {
      const auto dim = static_cast<size_t>(*split.partition_dim);
      int64_t along = 0;
      for (const AffineBlock& b : blocks) {
        // along <= shard_shape[dim], so the product stays within the shard's numel (checked above).
        if (along > shard_shape[dim] || b.dest_offset != along * shard_strides[dim]) {
          return not_plain("pieces that do not tile the shard");
        }
        along += b.width;
      }
      if (along != shard_shape[dim]) return not_plain("pieces that do not fill the shard");
    }
  }
  if (!split.partition_dim) return split;  // every rank holds the whole tensor
  if (whole) return not_plain("some ranks hold the whole tensor, others a block");
  const size_t num_sub = by_rank.front().size();
  for (const auto& blocks : by_rank) {
    if (blocks.size() != num_sub) return not_plain("ranks with different numbers of pieces");
  }
  int64_t next = 0;
  std::vector<int64_t> sizes;
  std::vector<std::vector<int64_t>> widths(num_sub);
  for (size_t j = 0; j < num_sub; ++j) {
    const int64_t begin = next;
    for (const auto& blocks : by_rank) {
      if (blocks[j].start != next) return not_plain("blocks that do not tile the split dim in rank order");
      next += blocks[j].width;
      widths[j].push_back(blocks[j].width);
    }
    sizes.push_back(next - begin);
  }
  if (next != full[static_cast<size_t>(*split.partition_dim)]) return not_plain("blocks that do not cover the dim");
  if (num_sub > 1) {
    split.sub_param_sizes = std::move(sizes);
    split.sub_param_rank_widths = std::move(widths);
  }
  return split;
}

Result<std::vector<AffineSplit>> ParseAffineSplits(const PickleTree& tree, NodeId value) {
  const NodeId version = format::DictLookup(tree, value, "version");
  if (format::AsInt(tree, version) != 1) {
    return Unsupported("affine_map version " + DescribeNode(tree, version) + " (reshardfs reads version 1)");
  }
  RS_ASSIGN_OR_RETURN(auto params, StrKeyedEntries(tree, format::DictLookup(tree, value, "params"),
                                                   "affine_map['params']"));
  std::vector<AffineSplit> out;
  for (const auto& [pattern, map] : params) {
    RS_ASSIGN_OR_RETURN(AffineSplit split, ParseAffineSplit(tree, pattern, map));
    out.push_back(std::move(split));
  }
  return out;
}

// Widths are only shape-checked here; whether they sum to the sub-parameter sizes and match the
// source TP degree is the planner's check, where both numbers are at hand.
Result<std::vector<std::vector<int64_t>>> ParseWidths(const PickleTree& tree, NodeId id, const std::string& pattern) {
  const std::string what = std::string(kShardWidths) + "['" + pattern + "']";
  const std::vector<NodeId>* per_sub = format::SequenceItems(tree, id);
  if (per_sub == nullptr) return WrongType(what, "a list of lists of int", tree, id);
  std::vector<std::vector<int64_t>> out;
  for (NodeId sub : *per_sub) {
    auto widths = format::AsIntSequence(tree, sub);
    if (!widths) return WrongType(what, "a list of lists of int", tree, sub);
    for (int64_t w : *widths) {
      if (w < 0) return Corrupt(what + " has a negative width " + std::to_string(w));
    }
    out.push_back(std::move(*widths));
  }
  return out;
}

}  // namespace

// The dataclass has exactly these fields; an extra one means a newer DeepSpeed whose
// SubparamShape carries something this parser would silently drop.
Result<SubparamShape> ParseSubparamShapeFields(const PickleTree& tree, NodeId dict) {
  RS_ASSIGN_OR_RETURN(auto entries, StrKeyedEntries(tree, dict, "SubparamShape"));
  SubparamShape out;
  bool have_patterns = false, have_shape = false, have_dim = false;
  for (const auto& [key, value] : entries) {
    if (key == "patterns") {
      RS_ASSIGN_OR_RETURN(out.patterns, StrList(tree, value, "patterns"));
      have_patterns = true;
    } else if (key == "shape") {
      const std::vector<NodeId>* dims = format::SequenceItems(tree, value);
      if (dims == nullptr) return WrongType("shape", "a list or tuple", tree, value);
      out.shape_is_tuple = tree.node(value).kind == NodeKind::kTuple;
      for (NodeId d : *dims) {
        RS_ASSIGN_OR_RETURN(auto dim, ParseSubparamDim(tree, d));
        out.shape.push_back(std::move(dim));
      }
      have_shape = true;
    } else if (key == "partition_dim") {
      const auto dim = format::AsInt(tree, value);
      if (!dim) return WrongType("partition_dim", "an int", tree, value);
      out.partition_dim = *dim;
      have_dim = true;
    } else {
      return Unsupported("SubparamShape has an unknown field '" + key + "'");
    }
  }
  if (!have_patterns || !have_shape || !have_dim) {
    return Corrupt("SubparamShape needs the fields 'patterns', 'shape' and 'partition_dim'");
  }
  if (out.partition_dim < 0 || static_cast<uint64_t>(out.partition_dim) >= out.shape.size()) {
    return Corrupt("SubparamShape partition_dim " + std::to_string(out.partition_dim) + " is outside its " +
                   std::to_string(out.shape.size()) + "-dimensional shape");
  }
  return out;
}

Result<SubparamShape> ParseSubparamShapeObject(const PickleTree& tree, NodeId id) {
  if (!tree.valid(id) || tree.node(id).kind != NodeKind::kNewObj ||
      !format::IsObjectOf(tree, id, kSubparamShapeModule, kSubparamShapeClass)) {
    return Corrupt("expected a SubparamShape object, got " + DescribeNode(tree, id));
  }
  // A dataclass pickles as cls.__new__(cls) followed by BUILD with its __dict__.
  const NodeId state = format::ObjectState(tree, id);
  if (state == kNoNode) return Corrupt("SubparamShape object has no state");
  return ParseSubparamShapeFields(tree, state);
}

Result<UniversalCheckpointInfo> ParseUniversalCheckpointInfo(const PickleTree& tree, NodeId info) {
  UniversalCheckpointInfo out;
  if (info == kNoNode || format::IsNone(tree, info)) return out;
  RS_ASSIGN_OR_RETURN(auto entries, StrKeyedEntries(tree, info, "universal_checkpoint_info"));
  out.present = true;
  out.node = info;
  // The version goes first so that a newer checkpoint is refused for its version, not for the
  // first new key it happens to carry.
  for (const auto& [key, value] : entries) {
    if (key != kVersion) continue;
    const auto version = format::AsNumber(tree, value);
    if (!version || !std::isfinite(*version)) return WrongType(key, "a finite number", tree, value);
    if (*version > kMaxUniversalCheckpointVersion) {
      return Unsupported("unsupported universal checkpoint version " + FormatVersion(*version) +
                         " (reshardfs supports up to " + FormatVersion(kMaxUniversalCheckpointVersion) + ")");
    }
    out.version = *version;
  }
  // Patterns stay uncompiled strings: the category of every stored parameter is already in its
  // own file, and the planner only needs them to cross-check AutoTP metadata.
  for (const auto& [key, value] : entries) {
    auto optional_size = [&](std::optional<int64_t>& field) -> Status {
      const auto v = format::AsInt(tree, value);
      if (!v || *v < 0) return WrongType(key, "a non-negative int", tree, value);
      field = *v;
      return Status::Ok();
    };
    auto patterns = [&](std::vector<std::string>& field) -> Status {
      auto v = StrList(tree, value, key);
      if (!v.ok()) return v.status();
      field = std::move(v).value();
      return Status::Ok();
    };
    if (key == kVersion || key == kUnusedSubParamsShape) {
      continue;
    } else if (key == kOriginalVocab) {
      RS_RETURN_IF_ERROR(optional_size(out.original_vocab_size));
    } else if (key == kPaddedVocab) {
      RS_RETURN_IF_ERROR(optional_size(out.padded_vocab_size));
    } else if (key == kVocabPatterns) {
      RS_RETURN_IF_ERROR(patterns(out.vocabulary_parameter_patterns));
    } else if (key == kPipelinePatterns) {
      RS_RETURN_IF_ERROR(patterns(out.pipeline_replicated_parameter_patterns));
    } else if (key == kTpReplicatedPatterns) {
      RS_RETURN_IF_ERROR(patterns(out.tp_replicated_parameter_patterns));
    } else if (key == kAveragePatterns) {
      RS_RETURN_IF_ERROR(patterns(out.parameter_to_average_patterns));
    } else if (key == kRowPatterns) {
      RS_RETURN_IF_ERROR(patterns(out.parameter_with_row_parallelism_patterns));
    } else if (key == kTwoSubParams) {
      RS_RETURN_IF_ERROR(patterns(out.parameter_with_2_sub_params_cat_dim_0));
    } else if (key == kExpertPatterns) {
      RS_RETURN_IF_ERROR(patterns(out.expert_parameter_patterns));
    } else if (key == kSubParams) {
      const std::vector<NodeId>* list = format::SequenceItems(tree, value);
      if (list == nullptr) return WrongType(key, "a list of dicts", tree, value);
      for (NodeId entry : *list) {
        auto shape = ParseSubparamShapeFields(tree, entry);
        if (!shape.ok()) return shape.status().Annotate(key);
        out.parameter_with_sub_params.push_back(std::move(shape).value());
      }
    } else if (key == kShardWidths) {
      RS_ASSIGN_OR_RETURN(auto widths, StrKeyedEntries(tree, value, std::string(kShardWidths)));
      for (const auto& [pattern, per_sub] : widths) {
        RS_ASSIGN_OR_RETURN(out.sub_param_shard_widths[pattern], ParseWidths(tree, per_sub, pattern));
      }
    } else if (key == kUnsupportedPatterns) {
      RS_RETURN_IF_ERROR(RefuseUnsupportedPatterns(tree, value));
    } else if (key == kAutoEpLayers || key == kAutoEpLayersLegacy) {
      out.autoep_layers = value;
    } else if (key == kAffineMap) {
      // DeepSpeed 0.19.8's converter rebuilds affine-mapped params from the map and writes them
      // without category keys, so the map is the only record of how each one was split.
      RS_ASSIGN_OR_RETURN(out.affine_splits, ParseAffineSplits(tree, value));
    } else {
      return Unsupported("unknown key '" + key + "' in universal_checkpoint_info");
    }
  }
  return out;
}

// Shortest round-trip decimal, so 0.4 prints as "0.4" and not "0.40000000000000002".
std::string FormatVersion(double version) {
  char buf[40];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof(buf), "%.*g", digits, version);
    if (std::strtod(buf, nullptr) == version) break;
  }
  return buf;
}

}  // namespace reshard::ucp
