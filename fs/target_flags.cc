#include "fs/target_flags.h"

#include <fstream>

#include <nlohmann/json.hpp>

#include "reshard/plan/target_config.h"

namespace reshard::fs {

void AddTargetFlags(CLI::App* command, TargetFlags& flags) {
  command->add_option("--tp", flags.tp, "Target tensor-parallel degree (default: tensor_parallel.autotp_size, else the source's)")
      ->check(CLI::Range(1, 99));
  command->add_option("--dp", flags.dp, "Target data-parallel degree (default: from the ds_config's batch sizes, else the source's)")
      ->check(CLI::PositiveNumber);
  command->add_option("--zero-stage", flags.zero_stage, "Target ZeRO stage 1, 2 or 3 (default: the ds_config's, else the source's)")
      ->check(CLI::Range(1, 3));
  command->add_option("--lp-dtype", flags.lp_dtype, "Module weight dtype: fp32, bf16 or fp16 (default: the ds_config's)")
      ->check(CLI::IsMember({"fp32", "float32", "bf16", "bfloat16", "fp16", "float16", "half"}));
  command->add_option("--ds-config", flags.ds_config, "The resuming run's DeepSpeed config (JSON)");
  command->add_option("--padded-vocab", flags.padded_vocab, "Target vocab rows summed over TP ranks (vocab-padded tensors)")
      ->check(CLI::PositiveNumber);
  command->add_option("--tag", flags.tag, "Checkpoint tag to serve (default: the universal tag without _universal)");
}

Result<plan::Target> ResolveTargetFlags(const ucp::UniversalCheckpoint& ckpt, const TargetFlags& flags) {
  nlohmann::ordered_json config;
  if (!flags.ds_config.empty()) {
    std::ifstream in(flags.ds_config);
    if (!in) return NotFound(flags.ds_config + ": cannot open the ds_config");
    config = nlohmann::ordered_json::parse(in, nullptr, /*allow_exceptions=*/false, /*ignore_comments=*/true);
    if (config.is_discarded()) return InvalidArgument(flags.ds_config + ": not valid JSON");
    if (!config.is_object()) return InvalidArgument(flags.ds_config + ": a ds_config must be a JSON object");
  }
  plan::TargetOverrides o;
  o.zero_stage = flags.zero_stage;
  o.tp_size = flags.tp;
  o.dp_size = flags.dp;
  if (!flags.lp_dtype.empty()) o.lp_dtype = plan::ParseLpDtype(flags.lp_dtype);
  o.padded_vocab_rows = flags.padded_vocab;
  o.tag = flags.tag;
  return plan::ResolveTarget(ckpt, config, o);
}

}  // namespace reshard::fs
