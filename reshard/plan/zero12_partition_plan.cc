#include "reshard/plan/zero12_partition_plan.h"

#include "reshard/layout/tp_partition.h"
#include "reshard/plan/optimizer_groups.h"
#include "reshard/plan/param_slice.h"
#include "reshard/plan/state_extents.h"

namespace reshard::plan {
namespace {

constexpr const char* kStates[] = {"fp32", "exp_avg", "exp_avg_sq"};

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
    RS_ASSIGN_OR_RETURN(view::GatherList piece, view::Slice(slices[f.param].gather, f.lp_start, f.numel));
    RS_RETURN_IF_ERROR(AppendStateExtents(out, sources, it->second, piece));
    filled = f.hp_start + f.numel;
  }
  if (filled > part.partition_numel) return Internal("fragments run past the partition");
  AppendZeros(out, part.partition_numel - filled);
  return out;
}

}  // namespace

Result<std::vector<RankGroupPartition>> PlanZero12Rank(const ucp::UniversalCheckpoint& ckpt,
                                                       const Target& target, int tp_rank,
                                                       int dp_rank, SourceTable& sources) {
  if (target.dp_size < 1 || dp_rank < 0 || dp_rank >= target.dp_size) {
    return InvalidArgument("DP rank " + std::to_string(dp_rank) + " outside [0, " +
                           std::to_string(target.dp_size) + ")");
  }
  RS_ASSIGN_OR_RETURN(auto groups, OptimizerGroups(ckpt));
  layout::Zero12Options options;
  options.flavor = target.bf16_optimizer ? layout::Zero12Flavor::kBf16Optimizer : layout::Zero12Flavor::kZeroOptimizer;
  options.round_robin_gradients = target.round_robin_gradients;
  std::vector<RankGroupPartition> out;
  for (const auto& params : groups) {
    RankGroupPartition g;
    std::vector<layout::TpSlice> slices;
    std::vector<layout::FlatParam> flat;
    for (const ucp::ParamEntry* p : params) {
      RS_ASSIGN_OR_RETURN(layout::TpSlice slice,
                          SliceParam(ckpt, *p, target, tp_rank));
      flat.push_back(layout::FlatParam{p->name, Numel(slice.local_shape), true});
      g.param_names.push_back(p->name);
      g.local_shapes.push_back(slice.local_shape);
      slices.push_back(std::move(slice));
    }
    RS_ASSIGN_OR_RETURN(g.layout, layout::PartitionZero12(flat, static_cast<uint32_t>(target.dp_size),
                                                          static_cast<uint32_t>(dp_rank), options));
    for (const char* state : kStates) {
      RS_ASSIGN_OR_RETURN(g.states[state], StateExtents(params, slices, g.layout, state, sources));
    }
    out.push_back(std::move(g));
  }
  return out;
}

}  // namespace reshard::plan
