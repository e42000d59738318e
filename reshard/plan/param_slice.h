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
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// A bare-tensor entry (a ZeRO-3 conversion without TP, stored flattened) gets the logical shape
// the source run recorded in param_shapes.
//
// A parameter the checkpoint's affine_map describes (DeepSpeed 0.19.8 AutoTP) is sliced as the
// target's AutoTP layer would restore it: the AutoTP restore metadata is rebuilt for the target
// from the map's split dim, with AutoTP's shard sizes (layout::GetShardSizeList over the layer
// name, the model's KV heads and tp_grain_size); a parameter every source rank held whole stays
// whole.
//
// Errors (naming the parameter): AutoEP expert tensors (kUnsupported), a bare tensor at
// tp_size > 1 (kUnsupported: it needs the target's AutoTP layout), a vocab tensor without a
// padded vocab size T divides (kInvalidArgument), an affine-mapped split at tp_size > 1 without
// the model's KV head count (kInvalidArgument: pass the model config), and every refusal of
// SliceForRank.
Result<layout::TpSlice> SliceParam(const ucp::UniversalCheckpoint& checkpoint, const ucp::ParamEntry& param,
                                   const Target& target, int tp_rank);

}  // namespace reshard::plan
