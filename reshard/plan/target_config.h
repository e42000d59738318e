// ResolveTarget: the target layout from command-line values, the resuming run's ds_config.json
// and, for whatever neither says, the source run itself.
//
// Precedence per field: an explicit override, then the target ds_config, then the source run's
// ds_config (the one recorded in the checkpoint's model-states file), then DeepSpeed's default.
//   zero_stage     zero_optimization.stage
//   tp_size        tensor_parallel.autotp_size (source: the checkpoint's TP degree)
//   dp_size        train_batch_size / (train_micro_batch_size_per_gpu * gradient_accumulation_steps)
//                  when all three are numbers (DeepSpeed's own consistency rule), divided by the
//                  AutoTP size (DeepSpeed counts every TP x DP rank there); source: its DP
//   tp_grain_size  tensor_parallel.tp_grain_size
//   lp_dtype       bf16.enabled (or "bfloat16".enabled) -> bf16, fp16.enabled -> fp16, else fp32
//   round_robin_gradients, sub_group_size   zero_optimization.*
//   bf16_optimizer bf16 + stage 1 + data_types.grad_accum_dtype fp32 without
//                  zero_optimization.offload_optimizer (engine.py's choice of BF16_Optimizer)
// Refused (kInvalidArgument naming the key): a value of the wrong type, a batch size that the
// micro batch and accumulation steps do not divide, bf16 and fp16 both enabled.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

struct TargetOverrides {
  std::optional<int> zero_stage;
  std::optional<int> tp_size;
  std::optional<int> dp_size;
  std::optional<format::DType> lp_dtype;
  std::optional<int64_t> padded_vocab_rows;
  std::string tag;
  format::DType weights_dtype = format::DType::kFloat32;  // Target::weights_dtype
};

// The model facts AutoTP's shard sizes need, from a Hugging Face config.json. A field it leaves out
// (save_pretrained writes only what differs from the config class's defaults) takes the family's
// default (layout::BuiltinModelConfigDefaults) when model_type is a listed family.
struct ModelConfig {
  std::optional<int64_t> num_kv_heads;  // num_key_value_heads, else the default, else num_attention_heads
  std::string model_type;               // e.g. "llama"; empty when absent
  bool tie_word_embeddings = false;     // absent: the family's default, false for an unlisted one
};

// Errors (kInvalidArgument naming the key): a head count that is not a positive integer, a
// model_type that is not a string, a tie_word_embeddings that is not a bool.
Result<ModelConfig> ParseModelConfig(const nlohmann::ordered_json& config);

// `ds_config`: the parsed target ds_config.json, or null when none was given.
Result<Target> ResolveTarget(const ucp::UniversalCheckpoint& checkpoint, const nlohmann::ordered_json& ds_config,
                             const TargetOverrides& overrides, const ModelConfig& model = {});

// Parses "fp32"/"float32", "bf16"/"bfloat16", "fp16"/"float16"/"half".
std::optional<format::DType> ParseLpDtype(const std::string& name);

}  // namespace reshard::plan
