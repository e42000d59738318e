#include "reshard/plan/target.h"

#include <cstdio>

namespace reshard::plan {
namespace {

std::string MpRank(int tp_rank) {
  char buf[16];
  std::snprintf(buf, sizeof buf, "mp_rank_%02d", tp_rank);
  return buf;
}

}  // namespace

std::string ModelStatesFileName(const Target& target, int tp_rank, int dp_rank) {
  if (target.zero_stage == 3) {
    return "zero_pp_rank_" + std::to_string(dp_rank) + "_" + MpRank(tp_rank) + "_model_states.pt";
  }
  return MpRank(tp_rank) + "_model_states.pt";
}

std::string OptimStatesFileName(const Target& target, int tp_rank, int dp_rank) {
  const char* prefix = target.lp_dtype == format::DType::kBFloat16 ? "bf16_" : "";
  return std::string(prefix) + "zero_pp_rank_" + std::to_string(dp_rank) + "_" + MpRank(tp_rank) +
         "_optim_states.pt";
}

}  // namespace reshard::plan
