#include "fs/target_flags.h"

#include <cstdint>
#include <fstream>

#include <nlohmann/json.hpp>

#include "reshard/plan/target_config.h"

namespace reshard::fs {

void AddTargetFlags(CLI::App* command, TargetFlags& flags) {
  command->add_option("--tp", flags.tp, "Target tensor-parallel degree (default: tensor_parallel.autotp_size, else the source's)")
      ->check(CLI::Range(1, 99));
  command->add_option("--dp", flags.dp, "Target data-parallel degree (default: from the ds_config's batch sizes, else the source's)")
      ->check(CLI::Range(1, 1 << 20));
  command->add_option("--zero-stage", flags.zero_stage, "Target ZeRO stage 1, 2 or 3 (default: the ds_config's, else the source's)")
      ->check(CLI::Range(1, 3));
  command->add_option("--lp-dtype", flags.lp_dtype, "Module weight dtype: fp32, bf16 or fp16 (default: the ds_config's)")
      ->check(CLI::IsMember({"fp32", "float32", "bf16", "bfloat16", "fp16", "float16", "half"}));
  command->add_option("--ds-config", flags.ds_config, "The resuming run's DeepSpeed config (JSON)");
  command->add_option("--model-config", flags.model_config,
                      "The model's Hugging Face config.json (KV heads for AutoTP shard sizes; model_type for the "
                      "built-in AutoTP rules a checkpoint saved without TP needs at TP > 1)");
  command->add_option("--padded-vocab", flags.padded_vocab, "Target vocab rows summed over TP ranks (vocab-padded tensors)")
      ->check(CLI::Range(int64_t{1}, int64_t{1} << 40));
  command->add_option("--tag", flags.tag, "Checkpoint tag to serve (default: the universal tag without _universal)");
  command->add_option("--export-dtype", flags.export_dtype,
                      "dtype of the trained parameters in <tag>/model.safetensors: fp32 (default), bf16 or fp16")
      ->check(CLI::IsMember({"fp32", "float32", "bf16", "bfloat16", "fp16", "float16", "half"}));
}

bool AnyTargetFlag(const TargetFlags& flags) {
  return flags.tp || flags.dp || flags.zero_stage || !flags.lp_dtype.empty() || !flags.ds_config.empty() ||
         !flags.model_config.empty() || flags.padded_vocab || !flags.tag.empty() || !flags.export_dtype.empty();
}

namespace {

// A JSON object from `path`; null when `path` is empty. `what` names the file in messages.
Result<nlohmann::ordered_json> ReadJsonObject(const std::string& path, const char* what) {
  if (path.empty()) return nlohmann::ordered_json();
  std::ifstream in(path);
  if (!in) return NotFound(path + ": cannot open the " + what);
  auto config = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
  if (config.is_discarded()) return InvalidArgument(path + ": not valid JSON");
  if (!config.is_object()) return InvalidArgument(path + ": a " + what + " must be a JSON object");
  return config;
}

}  // namespace

Result<plan::Target> ResolveTargetFlags(const ucp::UniversalCheckpoint& ckpt, const TargetFlags& flags) {
  RS_ASSIGN_OR_RETURN(nlohmann::ordered_json config, ReadJsonObject(flags.ds_config, "ds_config"));
  RS_ASSIGN_OR_RETURN(nlohmann::ordered_json model_json, ReadJsonObject(flags.model_config, "model config"));
  plan::ModelConfig model;
  if (!model_json.is_null()) {
    auto parsed = plan::ParseModelConfig(model_json);
    if (!parsed.ok()) return parsed.status().Annotate(flags.model_config);
    model = *parsed;
  }
  plan::TargetOverrides o;
  o.zero_stage = flags.zero_stage;
  o.tp_size = flags.tp;
  o.dp_size = flags.dp;
  if (!flags.lp_dtype.empty()) o.lp_dtype = plan::ParseLpDtype(flags.lp_dtype);
  o.padded_vocab_rows = flags.padded_vocab;
  o.tag = flags.tag;
  if (!flags.export_dtype.empty()) o.weights_dtype = *plan::ParseLpDtype(flags.export_dtype);
  return plan::ResolveTarget(ckpt, config, o, model);
}

}  // namespace reshard::fs
