// `reshardfs plan SRC [target flags] [--json]`: what a mount at that layout would serve, without
// serving it: the resolved target, every file with its size, and per target rank the source
// bytes it reads against the tensor bytes it gets (read amplification; 1.0 means each rank
// reads exactly its own bytes, 2.0 for bf16 weights derived from fp32 masters).
#pragma once

#include <ostream>
#include <string>

#include "fs/target_flags.h"
#include "reshard/base/status.h"

namespace reshard::fs {

struct PlanOptions {
  std::string source;
  TargetFlags target;
  bool json = false;
};

Status RunPlan(const PlanOptions& options, std::ostream& out);

}  // namespace reshard::fs
