// The target-layout flags shared by `plan`, `materialize` and `mount`, and the one function
// that turns them (plus --ds-config) into a plan::Target. Not thread-safe (CLI setup only).
#pragma once

#include <optional>
#include <string>

#include <CLI/CLI.hpp>

#include "reshard/base/status.h"
#include "reshard/plan/target.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::fs {

struct TargetFlags {
  std::optional<int> tp;
  std::optional<int> dp;
  std::optional<int> zero_stage;
  std::string lp_dtype;   // empty: from the ds_config(s)
  std::string ds_config;  // path of the resuming run's ds_config.json, or empty
  std::string model_config;  // path of the model's Hugging Face config.json, or empty
  std::optional<int64_t> padded_vocab;
  std::string tag;
  std::string export_dtype;  // empty: float32
};

void AddTargetFlags(CLI::App* command, TargetFlags& flags);

// True when any target flag was given (commands for which the target is optional).
bool AnyTargetFlag(const TargetFlags& flags);

// Reads --ds-config (kNotFound / kInvalidArgument with the path and the JSON error) and applies
// plan::ResolveTarget.
Result<plan::Target> ResolveTargetFlags(const ucp::UniversalCheckpoint& checkpoint, const TargetFlags& flags);

}  // namespace reshard::fs
