#include "reshard/plan/zero3_partition_plan.h"

#include "reshard/layout/zero_partition.h"
#include "reshard/plan/optimizer_groups.h"

namespace reshard::plan {

Result<std::vector<RankSubGroup>> PlanZero3Rank(const ucp::UniversalCheckpoint& ckpt, const Zero3Target& target,
                                                int dp_rank, SourceTable& sources) {
  if (target.tp_size != 1) {
    return Unsupported("a ZeRO-3 target with TP " + std::to_string(target.tp_size) +
                       " needs the model's AutoTP layout, which is not planned yet");
  }
  if (target.dp_size < 1 || dp_rank < 0 || dp_rank >= target.dp_size) {
    return InvalidArgument("DP rank " + std::to_string(dp_rank) + " outside [0, " + std::to_string(target.dp_size) + ")");
  }
  RS_ASSIGN_OR_RETURN(auto groups, OptimizerGroups(ckpt));
  std::vector<std::vector<layout::FlatParam>> flat(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    for (const ucp::ParamEntry* p : groups[g]) {
      const auto it = p->states.find("fp32");
      if (it == p->states.end()) return NotFound("parameter '" + p->name + "' has no fp32.pt");
      flat[g].push_back(layout::FlatParam{p->name, it->second.numel(), true});
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
      rs.param_names.push_back(p.name);
      for (const char* state : {"fp32", "exp_avg", "exp_avg_sq"}) {
        const auto it = p.states.find(state);
        if (it == p.states.end()) return NotFound("parameter '" + p.name + "' has no " + state + ".pt");
        const ucp::StateTensor& t = it->second;
        const uint32_t source = sources.Intern(Source{t.path, t.data_offset, t.dtype, t.numel()});
        ExtentList& list = rs.states[state];
        // The flattened universal tensor is contiguous: this rank's real part is one run.
        AppendExtents(list, source, {view::Gather::Source(part.src_start, part.real_numel)});
        AppendZeros(list, part.partition_numel - part.real_numel);
      }
    }
    out.push_back(std::move(rs));
  }
  return out;
}

}  // namespace reshard::plan
