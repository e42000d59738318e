// Target: the layout a served checkpoint is planned for, and the file names DeepSpeed gives it.
//
// A target is what the resuming run will be: TP and DP degrees, ZeRO stage, the dtype of its
// low-precision (module) weights, and the options that change how DeepSpeed cuts the optimizer
// state. Defaults describe DeepSpeed's defaults; plan/target_config.h fills one from flags and
// the run's own ds_config.json. Plain value. Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "reshard/format/dtype.h"

namespace reshard::plan {

struct Target {
  int zero_stage = 1;  // 1, 2 or 3
  int tp_size = 1;
  int dp_size = 1;
  // The module weights' dtype: bf16 (bf16.enabled), fp16 (fp16.enabled) or fp32. Also decides
  // the optimizer files' "bf16_" prefix, which DeepSpeed derives from bf16.enabled alone.
  format::DType lp_dtype = format::DType::kFloat32;
  bool round_robin_gradients = false;       // zero_optimization.round_robin_gradients (ZeRO-1/2)
  // DeepSpeed runs BF16_Optimizer instead of its ZeRO-1 optimizer: bf16 with ZeRO stage 1,
  // data_types.grad_accum_dtype fp32 and no optimizer offload. Its files have their own layout.
  bool bf16_optimizer = false;
  uint64_t sub_group_size = 1000000000;     // zero_optimization.sub_group_size (ZeRO-3)
  // Rows of a vocab tensor summed over TP ranks in the target model (its padded vocab size);
  // unset: universal_checkpoint_info's padded_vocab_size.
  std::optional<int64_t> padded_vocab_rows;
  // AutoTP's shard sizes (layout::GetShardSize) for checkpoints with an affine_map: the model's
  // num_key_value_heads (HF config.json) and tensor_parallel.tp_grain_size.
  std::optional<int64_t> num_kv_heads;
  int64_t tp_grain_size = 1;
  // The target runs AutoTP: its ds_config sets tensor_parallel.autotp_size > 1. A checkpoint
  // saved without TP then needs the model's AutoTP layout (model_type below) to be split.
  bool autotp = false;
  // The model config's model_type and tie_word_embeddings: with a checkpoint saved without TP,
  // a non-empty model_type selects layout::BuiltinAutoTpRule for every parameter at TP > 1.
  std::string model_type;
  bool tied_word_embeddings = false;
  // The checkpoint tag the files are served under; empty: the universal tag without its
  // "_universal" suffix (global_step3_universal -> global_step3).
  std::string tag;
  // The dtype of the trained parameters in <tag>/model.safetensors (plan/weights_plan.h): float32
  // (zero_to_fp32's), or bf16/fp16 rounded to nearest even from the masters (--export-dtype).
  format::DType weights_dtype = format::DType::kFloat32;
  // The resuming run's ds_config (a JSON object), written as the files' `ds_config` as that run
  // would save it; null: the source run's is kept.
  nlohmann::ordered_json ds_config;
};

// File names, as DeepSpeed 0.19.8's engine builds them (engine.py _get_ckpt_name,
// _get_zero_ckpt_name): XX is the TP rank on two digits, D the DP rank.
std::string ModelStatesFileName(const Target& target, int tp_rank, int dp_rank);  // stage 3 uses dp_rank
std::string OptimStatesFileName(const Target& target, int tp_rank, int dp_rank);

}  // namespace reshard::plan
