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

// The AutoTP restore metadata the target's layer carries for `param` (what DeepSpeed's
// _resolve_autotp_partition reads), or nullopt when the target parameter has none:
//   - a parameter the checkpoint's affine_map describes (DeepSpeed 0.19.8 AutoTP): the map's
//     split dim, re-cut with AutoTP's shard sizes for the target (layout::GetShardSizeList over
//     the layer name, the model's KV heads and tp_grain_size; for a fused layout, each
//     sub-parameter so, layout::SubParamShardWidths); whole if every source rank held
//     it whole;
//   - a checkpoint saved without TP (TP degree 1), at a target TP > 1 that names its model_type:
//     the role layout::BuiltinAutoTpRule gives the parameter, cut the same way;
//   - otherwise none (the checkpoint's categories decide, as in DeepSpeed's generic path).
// Errors (naming the parameter): a split at TP > 1 without the model's KV head count
// (kInvalidArgument: pass the model config); an AutoTP target (Target::autotp) or a bare tensor
// at TP > 1 from a checkpoint saved without TP and no model_type (kInvalidArgument: pass the
// model config); every refusal of BuiltinAutoTpRule.
Result<std::optional<layout::AutoTpRestoreMeta>> TargetAutoTpMeta(const ucp::UniversalCheckpoint& checkpoint,
                                                                  const ucp::ParamEntry& param, const Target& target);

// The TP-local tensor DeepSpeed's ZeRO-1/2 universal loader gives TP rank `tp_rank`: the
// target's AutoTP metadata (TargetAutoTpMeta) if any, else the checkpoint's categories
// (layout::SliceForRank). A bare-tensor entry (a ZeRO-3 conversion without TP, stored flattened)
// gets the logical shape the source run recorded in param_shapes.
// Errors (naming the parameter): AutoEP expert tensors (kUnsupported), a bare tensor at
// tp_size > 1 without an AutoTP layout (kUnsupported), a vocab tensor without a padded vocab
// size T divides (kInvalidArgument), those of TargetAutoTpMeta and every refusal of SliceForRank.
Result<layout::TpSlice> SliceParam(const ucp::UniversalCheckpoint& checkpoint, const ucp::ParamEntry& param,
                                   const Target& target, int tp_rank);

// The TP-local tensor DeepSpeed's ZeRO-3 universal loader gives TP rank `tp_rank`: the target's
// AutoTP slice (TargetAutoTpMeta) if any, else the whole tensor in its logical shape; ZeRO-3
// applies no category rule (no cat_dim, no vocab padding). Unlike DeepSpeed 0.19.8, which skips
// the AutoTP slice for bare tensors and then fails, a bare tensor is sliced like any other.
// Errors: AutoEP expert tensors (kUnsupported), a parameter without an AutoTP layout at
// tp_size > 1 (kUnsupported), those of TargetAutoTpMeta and of SliceForRank.
Result<layout::TpSlice> SliceParamZero3(const ucp::UniversalCheckpoint& checkpoint, const ucp::ParamEntry& param,
                                        const Target& target, int tp_rank);

}  // namespace reshard::plan
