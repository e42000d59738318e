#include "reshard/plan/zero3_partition_plan.h"

#include <utility>

#include "reshard/layout/tp_partition.h"
#include "reshard/layout/zero_partition.h"
#include "reshard/plan/optimizer_groups.h"
#include "reshard/plan/param_slice.h"
#include "reshard/plan/state_extents.h"

namespace reshard::plan {
namespace {

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // shapes were checked by SliceForRank
  return n;
}

}  // namespace

Result<std::vector<RankSubGroup>> PlanZero3Rank(const ucp::UniversalCheckpoint& ckpt, const Target& target,
                                                int tp_rank, int dp_rank, SourceTable& sources) {
  if (target.dp_size < 1 || dp_rank < 0 || dp_rank >= target.dp_size) {
    return InvalidArgument("DP rank " + std::to_string(dp_rank) + " outside [0, " + std::to_string(target.dp_size) + ")");
  }
  RS_ASSIGN_OR_RETURN(auto groups, OptimizerGroups(ckpt));
  std::vector<std::vector<layout::FlatParam>> flat(groups.size());
  std::vector<std::vector<layout::TpSlice>> slices(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const ucp::ParamEntry* p : groups[g]) {
      RS_ASSIGN_OR_RETURN(layout::TpSlice slice, SliceParamZero3(ckpt, *p, target, tp_rank));
      flat[g].push_back(layout::FlatParam{p->name, Numel(slice.local_shape), true});
      slices[g].push_back(std::move(slice));
    }
  }
  RS_ASSIGN_OR_RETURN(std::vector<layout::Zero3SubGroup> subs,
                      layout::PartitionZero3(flat, static_cast<uint32_t>(target.dp_size),
                                             static_cast<uint32_t>(dp_rank), target.sub_group_size));
  std::vector<RankSubGroup> out;
  for (const layout::Zero3SubGroup& sub : subs) {
    RankSubGroup rs;
    rs.param_group = sub.param_group;
    rs.flat_numel = sub.flat_numel;
    for (const layout::Zero3ParamPart& part : sub.parts) {
      const ucp::ParamEntry& p = *groups[sub.param_group][part.param];
      const layout::TpSlice& slice = slices[sub.param_group][part.param];
      rs.param_names.push_back(p.name);
      rs.local_shapes.push_back(slice.local_shape);
      view::GatherList piece;  // empty for a rank past the end of a small parameter (src_start >= numel)
      if (part.real_numel > 0) {
        RS_ASSIGN_OR_RETURN(piece, view::Slice(slice.gather, part.src_start, part.real_numel));
      }
      for (const char* state : {"fp32", "exp_avg", "exp_avg_sq"}) {
        const auto it = p.states.find(state);
        if (it == p.states.end()) return NotFound("parameter '" + p.name + "' has no " + state + ".pt");
        ExtentList& list = rs.states[state];
        RS_RETURN_IF_ERROR(AppendStateExtents(list, sources, it->second, piece));
        AppendZeros(list, part.partition_numel - part.real_numel);
      }
    }
    out.push_back(std::move(rs));
  }
  return out;
}

}  // namespace reshard::plan
