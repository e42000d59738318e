// Frozen parameters: the module parameters no optimizer owns (requires_grad=False, or zero
// elements: DeepSpeed's is_optimized_parameter is false), and where a universal checkpoint keeps
// their values.
//
// ds_to_universal gives them no optimizer state. Their values exist only in the copied
// model-states files, in the source's lp dtype:
//   ZeRO-1/2 source   the module entry of every mp_rank_XX file (the TP-local tensor);
//   ZeRO-3 source     frozen_param_fragments[name] of every zero_pp_rank_D_mp_rank_XX file (DP rank
//                     D's ceil partition, layout::PartitionZero3Param, zero padded), with the
//                     TP-local shape in frozen_param_shapes[name].
// (The converter's zero/<name>/fp32.pt for a ZeRO-1/2 frozen parameter holds TP rank 0's tensor
// only, so it is not used.) A frozen parameter never changes in training, so at another DP degree or
// ZeRO stage it is the same TP-local tensor; its TP cut is recorded nowhere, so nothing here
// re-cuts it for another TP degree.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/format/pickle_value.h"
#include "reshard/plan/extent.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// The names of the frozen parameters among the `module` entries of model-states tree `t`, in module
// order: entries that are neither a listed (trainable) parameter, nor a buffer (`buffer_names`),
// nor an alias of a listed parameter (the same pickled tensor object, or the same view of the same
// storage: torch.save writes a tied lm_head.weight as its own tensor over the embedding's storage).
std::vector<std::string> FrozenParamNames(const ucp::UniversalCheckpoint& checkpoint, const format::PickleTree& t);

struct FrozenParam {
  std::string name;
  std::vector<int64_t> shape;  // TP-local shape
  format::DType dtype = format::DType::kFloat32;  // as the source stores it (its lp dtype)
  ExtentList value;            // prod(shape) elements of `dtype`, row-major
};

// The frozen parameters of source TP rank `tp_rank` (FrozenParamNames of its model-states file),
// in module order, with their values as extents over the source's model-states files; `sources`
// receives those files' storages. Errors (kUnsupported unless said, naming the file): a ZeRO-1/2
// module entry that is not a tensor or not contiguous; a ZeRO-3 source without a
// frozen_param_shapes / frozen_param_fragments entry for the parameter, a fragment that is not a
// contiguous 1-D tensor of the partition size or whose dtype differs between DP ranks (kCorrupt);
// a missing (tp, dp) file (kCorrupt).
Result<std::vector<FrozenParam>> PlanFrozenParams(const ucp::UniversalCheckpoint& checkpoint, int tp_rank,
                                                  SourceTable& sources);

}  // namespace reshard::plan
