#include "reshard/plan/zero12_partition_plan.h"

#include "reshard/layout/tp_partition.h"
#include "reshard/plan/optimizer_groups.h"

namespace reshard::plan {
namespace {

constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};

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

Result<std::optional<int64_t>> VocabRows(const ucp::UniversalCheckpoint& ckpt, const Zero12Target& target,
                                         const ucp::ParamEntry& p) {
  if (!p.categories.vocab_tensor.value_or(false)) return std::optional<int64_t>();
  if (target.padded_vocab_rows) return target.padded_vocab_rows;
  const auto& padded = ckpt.info().padded_vocab_size;
  if (padded && *padded % target.tp_size == 0) return padded;
  return InvalidArgument("vocab parameter '" + p.name +
                         "' needs the target model's padded vocab size (its local rows times TP)");
}

Result<layout::TpSlice> SliceParam(const ucp::UniversalCheckpoint& ckpt, const Zero12Target& target,
                                   const ucp::ParamEntry& p, int tp_rank) {
  if (p.categories.is_expert_param.value_or(false)) {
    return Unsupported("parameter '" + p.name + "': AutoEP expert tensors are not served yet");
  }
  if (p.bare_tensor && target.tp_size > 1) {
    return Unsupported("parameter '" + p.name +
                       "' is a bare tensor (a ZeRO-3 conversion without TP); a TP > 1 target needs "
                       "its AutoTP layout");
  }
  RS_ASSIGN_OR_RETURN(std::optional<int64_t> vocab_rows, VocabRows(ckpt, target, p));
  auto slice = layout::SliceForRank(p.full_shape, ToLayoutCategory(p.categories), nullptr, vocab_rows,
                                    target.tp_size, tp_rank);
  if (!slice.ok()) return slice.status().Annotate("parameter '" + p.name + "'");
  return slice;
}

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // shapes were checked by SliceForRank
  return n;
}

// The window's elements for one state: fragments in hp order, zeros in between and after.
Result<ExtentList> StateExtents(const std::vector<const ucp::ParamEntry*>& params,
                                const std::vector<layout::TpSlice>& slices,
                                const layout::Zero12Partition& part, const char* state, SourceTable& sources) {
  ExtentList out;
  uint64_t filled = 0;  // elements of the window produced so far
  for (const layout::Fragment& f : part.fragments) {
    if (f.hp_start < filled) return Internal("fragments overlap or are out of order");
    AppendZeros(out, f.hp_start - filled);
    const ucp::ParamEntry& p = *params[f.param];
    const auto it = p.states.find(state);
    if (it == p.states.end()) return NotFound("parameter '" + p.name + "' has no " + state + ".pt");
    const ucp::StateTensor& t = it->second;
    const uint32_t source = sources.Intern(Source{t.path, t.data_offset, t.dtype, t.numel()});
    RS_ASSIGN_OR_RETURN(view::GatherList piece, view::Slice(slices[f.param].gather, f.lp_start, f.numel));
    AppendExtents(out, source, piece);
    filled = f.hp_start + f.numel;
  }
  if (filled > part.partition_numel) return Internal("fragments run past the partition");
  AppendZeros(out, part.partition_numel - filled);
  return out;
}

}  // namespace

Result<std::vector<RankGroupPartition>> PlanZero12Rank(const ucp::UniversalCheckpoint& ckpt,
                                                       const Zero12Target& target, int tp_rank,
                                                       int dp_rank, SourceTable& sources) {
  if (target.dp_size < 1 || dp_rank < 0 || dp_rank >= target.dp_size) {
    return InvalidArgument("DP rank " + std::to_string(dp_rank) + " outside [0, " +
                           std::to_string(target.dp_size) + ")");
  }
  RS_ASSIGN_OR_RETURN(auto groups, OptimizerGroups(ckpt));
  std::vector<RankGroupPartition> out;
  for (const auto& params : groups) {
    RankGroupPartition g;
    std::vector<layout::TpSlice> slices;
    std::vector<layout::FlatParam> flat;
    for (const ucp::ParamEntry* p : params) {
      RS_ASSIGN_OR_RETURN(layout::TpSlice slice, SliceParam(ckpt, target, *p, tp_rank));
      flat.push_back(layout::FlatParam{p->name, Numel(slice.local_shape), true});
      g.param_names.push_back(p->name);
      g.local_shapes.push_back(slice.local_shape);
      slices.push_back(std::move(slice));
    }
    RS_ASSIGN_OR_RETURN(g.layout, layout::PartitionZero12(flat, static_cast<uint32_t>(target.dp_size),
                                                          static_cast<uint32_t>(dp_rank), target.options));
    for (const char* state : kStates) {
      RS_ASSIGN_OR_RETURN(g.states[state], StateExtents(params, slices, g.layout, state, sources));
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace reshard::plan
