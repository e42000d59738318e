// `reshardfs verify SRC [target flags] [--json]`: the check a cautious user runs before pointing a
// long job at a mount.
//
// Always, on the source: it opens as a universal checkpoint (every refusal of
// UniversalCheckpoint::Open is a problem), and ucp::CheckSource finds no missing optimizer state,
// no tensor outside its file and no NaN or infinite value; it reads every tensor byte once.
// With any target flag, also on the target: every file `mount` would serve (the torch.save files
// and their safetensors views) is computed twice and the two reads are byte-identical, and each
// parses (format::TorchArchive for .pt files, format::ParseSafetensorsHeader for .safetensors).
// Each served file is held in an anonymous memory file (memfd) while it is checked, so memory
// grows with the largest served file.
//
// Prints a summary table (or, with --json, one JSON document) to `out`; returns an error saying
// how many problems were found when there were any (the list is in the report), so the command
// exits non-zero.
#pragma once

#include <ostream>
#include <string>

#include "fs/target_flags.h"
#include "reshard/base/status.h"

namespace reshard::fs {

struct VerifyOptions {
  std::string source;
  TargetFlags target;
  bool json = false;
};

Status RunVerify(const VerifyOptions& options, std::ostream& out);

}  // namespace reshard::fs
