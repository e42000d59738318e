#include "reshard/plan/rank_state_plan.h"

#include <map>
#include <utility>

#include "reshard/plan/lp_weight.h"
#include "reshard/plan/zero12_partition_plan.h"
#include "reshard/plan/zero3_partition_plan.h"

namespace reshard::plan {
namespace {

Result<StoragePlan> Fp32Storage(std::map<std::string, ExtentList>& states, const char* key) {
  auto it = states.find(key);
  if (it == states.end()) return Internal(std::string("a planned partition without ") + key);
  return MakeStoragePlan(key, format::DType::kFloat32, Conversion::kCopy, std::move(it->second));
}

Result<FlatState> MakeFlat(size_t param_group, std::vector<std::string> names,
                           std::vector<std::vector<int64_t>> shapes, std::map<std::string, ExtentList> states) {
  FlatState f;
  f.param_group = param_group;
  f.param_names = std::move(names);
  f.local_shapes = std::move(shapes);
  RS_ASSIGN_OR_RETURN(f.fp32, Fp32Storage(states, "fp32"));
  RS_ASSIGN_OR_RETURN(f.exp_avg, Fp32Storage(states, "exp_avg"));
  RS_ASSIGN_OR_RETURN(f.exp_avg_sq, Fp32Storage(states, "exp_avg_sq"));
  if (f.exp_avg.numel != f.fp32.numel || f.exp_avg_sq.numel != f.fp32.numel) {
    return Internal("planned states of one flat partition differ in size");
  }
  return f;
}

}  // namespace

Result<RankStatePlan> PlanRankState(const ucp::UniversalCheckpoint& ckpt, const Target& target, int tp_rank,
                                    int dp_rank) {
  if (target.bf16_optimizer) {
    return Unsupported("restoring a BF16_Optimizer engine (bf16 + ZeRO-1 + fp32 gradient accumulation) is not "
                       "supported yet; mount the checkpoint and use engine.load_checkpoint instead");
  }
  if (tp_rank < 0 || tp_rank >= target.tp_size) {
    return InvalidArgument("TP rank " + std::to_string(tp_rank) + " outside [0, " + std::to_string(target.tp_size) + ")");
  }
  RankStatePlan out;
  out.target = target;
  out.tp_rank = tp_rank;
  out.dp_rank = dp_rank;
  SourceTable sources;
  if (target.zero_stage == 3) {
    RS_ASSIGN_OR_RETURN(std::vector<RankSubGroup> subs, PlanZero3Rank(ckpt, target, tp_rank, dp_rank, sources));
    for (RankSubGroup& s : subs) {
      RS_ASSIGN_OR_RETURN(FlatState f, MakeFlat(s.param_group, std::move(s.param_names), std::move(s.local_shapes),
                                                std::move(s.states)));
      out.flats.push_back(std::move(f));
    }
  } else {
    RS_ASSIGN_OR_RETURN(std::vector<RankGroupPartition> groups, PlanZero12Rank(ckpt, target, tp_rank, dp_rank, sources));
    for (size_t g = 0; g < groups.size(); ++g) {
      for (const std::string& name : groups[g].param_names) {
        const ucp::ParamEntry* p = ckpt.FindParam(name);
        if (p == nullptr) return Internal("planned parameter '" + name + "' is not in the checkpoint");
        RS_ASSIGN_OR_RETURN(LpWeight lp, PlanLpWeight(ckpt, *p, target, tp_rank, sources));
        LpParam param;
        param.name = name;
        param.param_group = g;
        param.shape = std::move(lp.shape);
        param.weight = MakeStoragePlan(name, target.lp_dtype, lp.conversion, std::move(lp.extents));
        out.lp_params.push_back(std::move(param));
      }
      RS_ASSIGN_OR_RETURN(FlatState f, MakeFlat(g, std::move(groups[g].param_names), std::move(groups[g].local_shapes),
                                                std::move(groups[g].states)));
      out.flats.push_back(std::move(f));
    }
  }
  out.sources = sources.sources();
  return out;
}

}  // namespace reshard::plan
