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

}  // namespace

Result<layout::TpSlice> SliceParam(const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& p, int tp_size,
                                   int tp_rank, std::optional<int64_t> padded_vocab_rows) {
  if (p.categories.is_expert_param.value_or(false)) {
    return Unsupported("parameter '" + p.name + "': AutoEP expert tensors are not served yet");
  }
  if (p.bare_tensor && tp_size > 1) {
    return Unsupported("parameter '" + p.name +
                       "' is a bare tensor (a ZeRO-3 conversion without TP); a TP > 1 target needs "
                       "its AutoTP layout");
  }
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> vocab_rows, VocabRows(ckpt, p, tp_size, padded_vocab_rows));
  auto slice = layout::SliceForRank(p.full_shape, ToLayoutCategory(p.categories), nullptr, vocab_rows, tp_size,
                                    tp_rank);
  if (!slice.ok()) return slice.status().Annotate("parameter '" + p.name + "'");
  // A bare tensor is the flattened parameter; at TP 1 its slice is all of it, in the logical
  // shape param_shapes recorded (checked against the stored numel when the checkpoint was opened).
  if (p.bare_tensor && !p.tp_shapes.empty() && Numel(p.tp_shapes[0]) == Numel(slice->local_shape)) {
    slice->local_shape = p.tp_shapes[0];
  }
  return slice;
}

}  // namespace reshard::plan
