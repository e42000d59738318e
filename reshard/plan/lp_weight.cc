#include "reshard/plan/lp_weight.h"

#include <string>
#include <utility>

#include "reshard/plan/param_slice.h"
#include "reshard/plan/state_extents.h"

namespace reshard::plan {

Result<Conversion> LpConversion(format::DType lp) {
  switch (lp) {
    case format::DType::kFloat32: return Conversion::kCopy;
    case format::DType::kBFloat16: return Conversion::kFp32ToBf16;
    case format::DType::kFloat16: return Conversion::kFp32ToFp16;
    default: return InvalidArgument("lp dtype " + std::string(format::TorchName(lp)) + " is not fp32, bf16 or fp16");
  }
}

Result<LpWeight> PlanLpWeight(const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& p, const Target& target,
                              int tp_rank, SourceTable& sources) {
  LpWeight out;
  RS_ASSIGN_OR_RETURN(out.conversion, LpConversion(target.lp_dtype));
  RS_ASSIGN_OR_RETURN(layout::TpSlice slice, SliceParam(ckpt, p, target, tp_rank));
  const ucp::StateTensor& fp32 = p.states.at("fp32");
  if (fp32.dtype != format::DType::kFloat32) {
    return Unsupported(fp32.path + ": the lp weights are derived from float32 masters, this one is " +
                       std::string(format::TorchName(fp32.dtype)));
  }
  RS_RETURN_IF_ERROR(AppendStateExtents(out.extents, sources, fp32, slice.gather));
  out.shape = std::move(slice.local_shape);
  return out;
}

}  // namespace reshard::plan
