// CheckSource: the consistency checks `reshardfs verify` runs over an opened universal checkpoint,
// beyond what UniversalCheckpoint::Open already refuses.
//
// Open() stops at the first malformed file (a truncated zip, a tensor past its file's end, state
// files of one parameter that disagree). On a checkpoint it accepts, CheckSource looks for the
// problems that are not malformations but would still break or poison a resume, and lists all of
// them rather than the first:
// - a parameter listed in `param_shapes` without an optimizer state the ZeRO loaders need
//   (exp_avg, exp_avg_sq);
// - a state tensor whose byte range no longer lies inside its file (the file shrank since Open,
//   or was replaced);
// - non-finite values (NaN, +-Inf) in any state tensor: every element is read, in 8 MiB chunks.
//
// Cost: reads every byte of tensor data once (pread); memory is one chunk buffer.
// Thread safety: a pure function of the checkpoint and the files it names.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::ucp {

// Totals over every parameter's state `key` ("fp32", "exp_avg", "exp_avg_sq", "step", ...).
struct StateTotals {
  uint64_t tensors = 0;
  uint64_t elements = 0;
  uint64_t bytes = 0;
  uint64_t non_finite = 0;  // NaN or +-Inf elements
};

struct SourceReport {
  uint64_t params = 0;
  uint64_t listed_params = 0;  // in param_shapes (trained); the rest are fp32-only folders
  std::map<std::string, StateTotals> states;  // by state key
  // One line per problem, each naming the parameter and the file it concerns. Empty: none found.
  std::vector<std::string> problems;
};

// Checks every state tensor of `checkpoint`. A Status error only when the checks themselves
// cannot run (out of memory for the chunk buffer); problems with the checkpoint are in the report.
Result<SourceReport> CheckSource(const UniversalCheckpoint& checkpoint);

}  // namespace reshard::ucp
