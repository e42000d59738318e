// PlanUniversalView: the universal checkpoint `python -m deepspeed.checkpoint.ds_to_universal`
// would write for a native source, planned as virtual files over the native files.
//
// For a source opened by native::OpenNativeCheckpoint (checkpoint.native()), under `root`
// (conventionally "<tag>_universal"):
//   <root>/zero/<param>/fp32.pt, exp_avg.pt, exp_avg_sq.pt   ZeRO-1/2: {<category keys>, 'param': tensor}
//                                                            in the converter's key order; ZeRO-3: the
//                                                            bare flat tensor; unlisted module entries:
//                                                            {'param': tensor} (fp32.pt only)
//   <root>/zero/<param>/step.pt                              ZeRO-1/2: the group's step (int or 0-d tensor)
//   <root>/zero/optimizer_state.pt                           DP 0's optimizer_state_dict without the
//                                                            sharded keys, plus param_groups (ZeRO-1/2:
//                                                            the comprehension's order, param_groups last;
//                                                            ZeRO-3: every key, param_groups appended)
// The model-states files the converter copies are the source files themselves (the caller serves
// them as they are: UniversalView::copies), and `latest_universal` beside <root> holds `root`.
// Every tensor is a view of the native files (the parameter's fragments); nothing is read here.
//
// Errors: kInvalidArgument when the checkpoint is not native (a universal source is its own
// universal checkpoint); whatever FileBuilder refuses. Plan time only, not thread-safe.
// Public header: C++17.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

struct UniversalView {
  std::vector<FilePlan> files;
  // (served path, source file): the model-states files, copied byte for byte.
  std::vector<std::pair<std::string, std::string>> copies;
};

Result<UniversalView> PlanUniversalView(const ucp::UniversalCheckpoint& checkpoint, const std::string& root,
                                        SourceTable& sources);

}  // namespace reshard::plan
