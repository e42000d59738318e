// PlanLpWeight: one trainable parameter's low-precision (module) weight at a target TP rank, as
// ZeRO-1/2 engines hold it: the TP-local slice of the universal fp32 master (plan/param_slice.h),
// rounded to the target's lp dtype (lp = RNE(fp32), what the saving run's weights were).
//
// The one rule for it: the model-states file's module entries (plan/model_states_file.h) and the
// live-engine restore plan (plan/rank_state_plan.h) both use it. Nothing is read; extents are
// numbers and file offsets. Public header: C++17.
#pragma once

#include <cstdint>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

struct LpWeight {
  std::vector<int64_t> shape;  // TP-local shape
  Conversion conversion = Conversion::kCopy;
  ExtentList extents;          // float32 source elements, destination (row-major) order
};

// Errors: those of SliceParam, an lp dtype LpConversion refuses, and a non-float32 master
// (kUnsupported, naming the file). `sources` receives the fp32 file.
Result<LpWeight> PlanLpWeight(const ucp::UniversalCheckpoint& checkpoint, const ucp::ParamEntry& param,
                              const Target& target, int tp_rank, SourceTable& sources);

// The conversion from the universal checkpoint's fp32 to `lp` (kCopy for fp32); kInvalidArgument
// for any other dtype.
Result<Conversion> LpConversion(format::DType lp);

}  // namespace reshard::plan
