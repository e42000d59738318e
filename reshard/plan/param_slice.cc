#include "reshard/plan/param_slice.h"

#include <string>
#include <utility>
#include <vector>

#include "reshard/layout/autotp_rules.h"
#include "reshard/view/gather.h"

namespace reshard::plan {
namespace {

layout::UcpCategory ToLayoutCategory(const ucp::ParamCategories& c) {
  layout::UcpCategory out;
  if (c.cat_dim) out.cat_dim = static_cast<int>(*c.cat_dim);
  out.n_sub_params = c.param_n_sub_params.value_or(1);
  if (c.sub_param_shape) {
    layout::SubParamShape s;
    s.partition_dim = static_cast<int>(c.sub_param_shape->partition_dim);
    for (const ucp::SubparamDim& d : c.sub_param_shape->shape) {
      s.shape.push_back(d.is_tuple ? d.sub_sizes : std::vector<int64_t>{d.size});
    }
    out.sub_param_shape = std::move(s);
  }
  out.vocab_tensor = c.vocab_tensor.value_or(false);
  return out;
}

Result<std::optional<int64_t>> VocabRows(const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& p,
                                         int tp_size, std::optional<int64_t> padded_vocab_rows) {
  if (!p.categories.vocab_tensor.value_or(false)) return std::optional<int64_t>();
  if (padded_vocab_rows) return padded_vocab_rows;
  const auto& padded = ckpt.info().padded_vocab_size;
  if (padded && *padded % tp_size == 0) return padded;
  return InvalidArgument("vocab parameter '" + p.name +
                         "' needs the target model's padded vocab size (its local rows times TP)");
}

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// The logical shape of a parameter: a bare tensor is stored flattened and param_shapes has its
// shape (checked against the stored numel when the checkpoint was opened).
std::vector<int64_t> LogicalShape(const ucp::ParamEntry& p) {
  if (p.bare_tensor && !p.tp_shapes.empty()) return p.tp_shapes[0];
  return p.full_shape;
}

// The restore metadata of an AutoTP layer that holds `p` whole (no `dim`) or split along `dim`; a
// fused layout (`sub_param_sizes`, more than one) is split sub-parameter by sub-parameter, as
// AutoTP's sub-parameter layers do (layers.py:_subparam_shard_widths).
Result<layout::AutoTpRestoreMeta> SplitMeta(const ucp::ParamEntry& p, const std::vector<int64_t>& logical_shape,
                                            std::optional<int> dim, const Target& target,
                                            const std::vector<int64_t>& sub_param_sizes = {}) {
  layout::AutoTpRestoreMeta meta;
  if (!dim) {
    meta.replicated = true;
    return meta;
  }
  if (*dim < 0 || static_cast<size_t>(*dim) >= logical_shape.size()) {
    return Unsupported("parameter '" + p.name + "' has " + std::to_string(logical_shape.size()) +
                       " dims; AutoTP splits it along dim " + std::to_string(*dim));
  }
  if (target.tp_size > 1 && !target.num_kv_heads) {
    return InvalidArgument("parameter '" + p.name + "' is split by AutoTP: a TP " + std::to_string(target.tp_size) +
                           " target needs the model's num_key_value_heads (pass --model-config config.json)");
  }
  // AutoTP names the layer, not the parameter: "model.layers.0.mlp.up_proj" for ".weight".
  const std::string layer = p.name.substr(0, p.name.rfind('.'));
  meta.partition_dim = *dim;
  meta.logical_shape = logical_shape;
  if (sub_param_sizes.size() > 1) {
    RS_ASSIGN_OR_RETURN(meta.sub_param_shard_widths,
                        layout::SubParamShardWidths(sub_param_sizes, target.tp_size, layer, target.num_kv_heads,
                                                    target.tp_grain_size));
    meta.sub_param_sizes = sub_param_sizes;
    return meta;
  }
  RS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                      layout::GetShardSizeList(logical_shape[static_cast<size_t>(*dim)], target.tp_size, layer,
                                               target.num_kv_heads, target.tp_grain_size));
  meta.partition_sizes = std::move(sizes);
  return meta;
}

// A bare tensor's slice is reported in its logical shape when it is the whole tensor.
void UseLogicalShape(const ucp::ParamEntry& p, layout::TpSlice& slice) {
  const std::vector<int64_t> logical = LogicalShape(p);
  if (p.bare_tensor && Numel(logical) == Numel(slice.local_shape)) slice.local_shape = logical;
}

}  // namespace

Result<std::optional<layout::AutoTpRestoreMeta>> TargetAutoTpMeta(const ucp::UniversalCheckpoint& ckpt,
                                                                  const ucp::ParamEntry& p, const Target& target) {
  using Meta = std::optional<layout::AutoTpRestoreMeta>;
  if (const ucp::AffineSplit* split = ckpt.FindAffineSplit(p.name)) {
    RS_ASSIGN_OR_RETURN(layout::AutoTpRestoreMeta meta,
                        SplitMeta(p, split->logical_shape, split->partition_dim, target, split->sub_param_sizes));
    return Meta(std::move(meta));
  }
  // A checkpoint saved at TP 1 says nothing about a TP split: the converter's cat_dim 0 is a
  // default, and bare tensors have no category at all.
  if (ckpt.tp_degree() != 1 || target.tp_size == 1) return Meta();
  if (target.model_type.empty()) {
    if (!target.autotp && !p.bare_tensor) return Meta();  // a non-AutoTP target: the categories decide
    return InvalidArgument("parameter '" + p.name + "': the checkpoint was saved without TP, so its split at TP " +
                           std::to_string(target.tp_size) +
                           " must come from the model's AutoTP layout (pass --model-config config.json)");
  }
  RS_ASSIGN_OR_RETURN(layout::AutoTpRole role,
                      layout::BuiltinAutoTpRule(target.model_type, p.name, target.tied_word_embeddings));
  std::optional<int> dim;
  if (role != layout::AutoTpRole::kReplicated) dim = layout::SplitDim(role);
  RS_ASSIGN_OR_RETURN(layout::AutoTpRestoreMeta meta, SplitMeta(p, LogicalShape(p), dim, target));
  return Meta(std::move(meta));
}

Result<layout::TpSlice> SliceParam(const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& p,
                                   const Target& target, int tp_rank) {
  const int tp_size = target.tp_size;
  if (p.categories.is_expert_param.value_or(false)) {
    return Unsupported("parameter '" + p.name + "': AutoEP expert tensors are not served yet");
  }
  RS_ASSIGN_OR_RETURN(std::optional<layout::AutoTpRestoreMeta> meta, TargetAutoTpMeta(ckpt, p, target));
  if (p.bare_tensor && tp_size > 1 && !meta) {
    return Unsupported("parameter '" + p.name +
                       "' is a bare tensor (a ZeRO-3 conversion without TP); a TP > 1 target needs "
                       "its AutoTP layout");
  }
  std::optional<int64_t> vocab_rows;
  if (!meta) {  // DeepSpeed pads vocab tensors only when the target parameter has no AutoTP metadata
    RS_ASSIGN_OR_RETURN(vocab_rows, VocabRows(ckpt, p, tp_size, target.padded_vocab_rows));
  }
  auto slice = layout::SliceForRank(p.full_shape, ToLayoutCategory(p.categories), meta ? &*meta : nullptr,
                                    vocab_rows, tp_size, tp_rank);
  if (!slice.ok()) return slice.status().Annotate("parameter '" + p.name + "'");
  UseLogicalShape(p, *slice);
  return slice;
}

Result<layout::TpSlice> SliceParamZero3(const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& p,
                                        const Target& target, int tp_rank) {
  if (p.categories.is_expert_param.value_or(false)) {
    return Unsupported("parameter '" + p.name + "': AutoEP expert tensors are not served yet");
  }
  RS_ASSIGN_OR_RETURN(std::optional<layout::AutoTpRestoreMeta> meta, TargetAutoTpMeta(ckpt, p, target));
  if (!meta) {
    if (target.tp_size > 1) {
      return Unsupported("parameter '" + p.name + "': a ZeRO-3 target with TP " + std::to_string(target.tp_size) +
                         " splits only parameters with an AutoTP layout, and this one has none");
    }
    layout::TpSlice whole;
    whole.local_shape = LogicalShape(p);
    view::AppendGather(whole.gather, view::Gather::Source(0, Numel(whole.local_shape)));
    return whole;
  }
  auto slice = layout::SliceForRank(p.full_shape, layout::UcpCategory{}, &*meta, std::nullopt, target.tp_size, tp_rank);
  if (!slice.ok()) return slice.status().Annotate("parameter '" + p.name + "'");
  UseLogicalShape(p, *slice);
  return slice;
}

}  // namespace reshard::plan
