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
// A frozen parameter never changes in training, so at another DP degree or ZeRO stage it is the same
// TP-local tensor. Its TP cut is recorded nowhere: at another TP degree it is known only when the
// checkpoint was saved without TP (ZeRO-1/2: the converter's zero/<name>/fp32.pt holds the whole
// tensor, upcast exactly to float32; at TP > 1 that file holds TP rank 0's slice only) and the target's
// AutoTP layout names it (plan/param_slice.h TargetAutoTpMeta): AutoTP cuts a frozen layer as it cuts
// a trainable one.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/format/pickle_value.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// The `module` entries of model-states tree `t` that alias a listed (trainable) parameter, name ->
// that parameter's name: the same pickled tensor object, or the same view of the same storage
// (torch.save writes a tied lm_head.weight as its own tensor over the embedding's storage). Only
// entries after the parameter they alias are found.
std::map<std::string, std::string> ModuleAliases(const ucp::UniversalCheckpoint& checkpoint,
                                                 const format::PickleTree& t);

// The names of the frozen parameters among the `module` entries of model-states tree `t`, in module
// order: entries that are neither a listed parameter, nor a buffer (`buffer_names`), nor an alias.
std::vector<std::string> FrozenParamNames(const ucp::UniversalCheckpoint& checkpoint, const format::PickleTree& t);

struct FrozenParam {
  std::string name;
  std::vector<int64_t> shape;  // TP-local shape
  format::DType dtype = format::DType::kFloat32;  // as the source stores it (its lp dtype)
  ExtentList value;            // prod(shape) elements of `dtype`, row-major
};

// The frozen parameters (FrozenParamNames of the source's model-states file) as target TP rank
// `tp_rank` holds them, in module order, with their values as extents over the source files;
// `sources` receives those files. At the source's TP degree: the TP rank's module entries (ZeRO-1/2)
// or fragments (ZeRO-3), in the source dtype. At another: the AutoTP slice of zero/<name>/fp32.pt,
// float32. Errors (kUnsupported unless said, naming the file): a TP change from a checkpoint saved
// with TP or at ZeRO-3, or for a parameter without a folder or an AutoTP layout (and those of
// PlanLpWeight); a ZeRO-1/2 module entry that is not a tensor or not contiguous; a ZeRO-3 source
// without a frozen_param_shapes / frozen_param_fragments entry for the parameter; a fragment that is
// not a contiguous 1-D tensor of the partition size or whose dtype differs between DP ranks, a
// missing (tp, dp) file, a tensor outside its storage (kCorrupt).
Result<std::vector<FrozenParam>> PlanFrozenParams(const ucp::UniversalCheckpoint& checkpoint, const Target& target,
                                                  int tp_rank, SourceTable& sources);

}  // namespace reshard::plan
