// ParamSlice: the TP-local slice of one universal parameter for one target TP rank, with the
// checkpoint's categories applied (layout::SliceForRank is the rule; this adapts a ucp entry to
// it). Used for every target tensor that holds a whole TP-local parameter (the module's lp
// weights) and, cut further by the ZeRO rules, for the flat optimizer partitions.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>

#include "reshard/base/status.h"
#include "reshard/layout/tp_partition.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// `padded_vocab_rows`: see Target::padded_vocab_rows. A bare-tensor entry (a ZeRO-3 conversion
// without TP, stored flattened) gets the logical shape the source run recorded in param_shapes.
// Errors (naming the parameter): AutoEP expert tensors (kUnsupported), a bare tensor at
// tp_size > 1 (kUnsupported: it needs the target's AutoTP layout), a vocab tensor without a
// padded vocab size T divides (kInvalidArgument), and every refusal of SliceForRank.
Result<layout::TpSlice> SliceParam(const ucp::UniversalCheckpoint& checkpoint, const ucp::ParamEntry& param,
                                   int tp_size, int tp_rank, std::optional<int64_t> padded_vocab_rows);

}  // namespace reshard::plan
