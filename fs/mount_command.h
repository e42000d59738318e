// `reshardfs mount SRC MOUNTPOINT [target flags] [serve flags]`: serves the universal checkpoint
// SRC as the native checkpoint of the target layout, computed on read:
//
//   MOUNTPOINT/latest                 the tag (no newline, as DeepSpeed writes it)
//   MOUNTPOINT/<tag>/...              every target rank's model-states and optimizer-states file
//   MOUNTPOINT/<tag>/safetensors/<name>.safetensors   each of those files' tensors as safetensors
//                                     (plan/safetensors_view.h), for loaders other than torch.load
//   MOUNTPOINT/<file>                 every other regular file beside the universal checkpoint in
//                                     its run folder (trainer_state.json, scheduler.pt, configs),
//                                     passed through read-only; `latest` and `latest_universal`
//                                     excepted, folders not entered
//
// Everything is planned before mounting: a refusal prints one error line, exits non-zero and
// mounts nothing.
#pragma once

#include <string>

#include "fs/fuse_server.h"
#include "fs/target_flags.h"
#include "reshard/base/status.h"

namespace reshard::fs {

struct MountOptions {
  std::string source;
  TargetFlags target;
  ServeOptions serve;  // serve.mountpoint is the MOUNTPOINT positional
};

Status RunMount(const MountOptions& options);

}  // namespace reshard::fs
