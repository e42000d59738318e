// PlanWeights: the model's plain weights, full fp32 masters under the module's own state_dict
// names, as DeepSpeed's zero_to_fp32 (get_fp32_state_dict_from_zero_checkpoint) returns them,
// planned as one file whose root is {name: tensor} (served as safetensors by SafetensorsView).
//
// In zero_to_fp32's order: the model-states file's buffers (`buffer_names` entries of `module`,
// as stored), the frozen parameters (plan/frozen_params.h: the module entries, or the ZeRO-3
// fragments, in their stored dtype), the trainable parameters (every listed parameter's fp32
// state, whole, in its logical shape), then every `shared_params` alias as its canonical
// tensor. One difference, documented: a ZeRO-1 source's frozen parameters are included
// (zero_to_fp32 reads them from frozen_param_fragments, which ZeRO-1 does not write, and drops
// them). The values are views of the source files; nothing is read.
//
// Errors (kUnsupported, the caller serves no weights file and says why): a floating buffer
// stored in bf16/fp16 (zero_to_fp32 upcasts it; reshardfs converts only fp32 -> bf16/fp16 so
// far); a source saved with TP > 1 that has frozen parameters (each TP rank holds a slice of
// them, merged by no rule reshardfs knows). Plan time only, not thread-safe. Public header: C++17.
#pragma once

#include <string>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// `dtype`: of the trained parameters (float32; bf16/fp16 rounded to nearest even from the fp32
// masters); buffers and frozen parameters stay as stored.
Result<FilePlan> PlanWeights(const ucp::UniversalCheckpoint& checkpoint, const std::string& path,
                             format::DType dtype, SourceTable& sources);

}  // namespace reshard::plan
