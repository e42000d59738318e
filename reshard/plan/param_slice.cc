#include "reshard/plan/param_slice.h"

#include <string>
#include <utility>
#include <vector>

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

// The restore metadata the target's AutoTP layer would carry for an affine-mapped parameter.
Result<layout::AutoTpRestoreMeta> TargetAutoTpMeta(const ucp::AffineSplit& split, const ucp::ParamEntry& p,
                                                   const Target& target) {
  layout::AutoTpRestoreMeta meta;
  if (!split.partition_dim) {
    meta.replicated = true;
    return meta;
  }
  const int dim = *split.partition_dim;
  if (target.tp_size > 1 && !target.num_kv_heads) {
    return InvalidArgument("parameter '" + p.name + "' is split by AutoTP: a TP " + std::to_string(target.tp_size) +
                           " target needs the model's num_key_value_heads (pass --model-config config.json)");
  }
  // AutoTP names the layer, not the parameter: "model.layers.0.mlp.up_proj" for ".weight".
  const std::string layer = p.name.substr(0, p.name.rfind('.'));
  RS_ASSIGN_OR_RETURN(std::vector<int64_t> sizes,
                      layout::GetShardSizeList(split.logical_shape[static_cast<size_t>(dim)], target.tp_size, layer,
                                               target.num_kv_heads, target.tp_grain_size));
  meta.partition_dim = dim;
  meta.logical_shape = split.logical_shape;
  meta.partition_sizes = std::move(sizes);
  return meta;
}

}  // namespace

Result<layout::TpSlice> SliceParam(const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& p,
                                   const Target& target, int tp_rank) {
  const int tp_size = target.tp_size;
  if (p.categories.is_expert_param.value_or(false)) {
    return Unsupported("parameter '" + p.name + "': AutoEP expert tensors are not served yet");
  }
  if (p.bare_tensor && tp_size > 1) {
    return Unsupported("parameter '" + p.name +
                       "' is a bare tensor (a ZeRO-3 conversion without TP); a TP > 1 target needs "
                       "its AutoTP layout");
  }
  std::optional<layout::AutoTpRestoreMeta> meta;
  if (const ucp::AffineSplit* split = ckpt.FindAffineSplit(p.name)) {
    RS_ASSIGN_OR_RETURN(meta, TargetAutoTpMeta(*split, p, target));
  }
  std::optional<int64_t> vocab_rows;
  if (!meta) {  // DeepSpeed pads vocab tensors only when the target parameter has no AutoTP metadata
    RS_ASSIGN_OR_RETURN(vocab_rows, VocabRows(ckpt, p, tp_size, target.padded_vocab_rows));
  }
  auto slice = layout::SliceForRank(p.full_shape, ToLayoutCategory(p.categories), meta ? &*meta : nullptr,
                                    vocab_rows, tp_size, tp_rank);
  if (!slice.ok()) return slice.status().Annotate("parameter '" + p.name + "'");
  // A bare tensor is the flattened parameter; at TP 1 its slice is all of it, in the logical
  // shape param_shapes recorded (checked against the stored numel when the checkpoint was opened).
  if (p.bare_tensor && !p.tp_shapes.empty() && Numel(p.tp_shapes[0]) == Numel(slice->local_shape)) {
    slice->local_shape = p.tp_shapes[0];
  }
  return slice;
}

}  // namespace reshard::plan
