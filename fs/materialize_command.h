// `reshardfs materialize SRC OUT_DIR [target flags]`: writes the target layout's checkpoint to
// disk (OUT_DIR/latest, OUT_DIR/<tag>/... and the safetensors views in OUT_DIR/<tag>/safetensors/),
// byte for byte what `mount` serves (run-folder files, which mount passes through, are not copied). For users
// without FUSE, and for tests that compare the served bytes with DeepSpeed's own files.
//
// A run that fails (a full disk, a source that cannot be read) leaves nothing that looks complete:
// each file is written under a temporary name (".<name>.partial") and renamed to its own name
// only once all its bytes are written, the partial file is removed on an error, and `latest`,
// which makes the folder a checkpoint to DeepSpeed, is written last.
#pragma once

#include <cstdio>
#include <ostream>
#include <string>

#include "fs/target_flags.h"
#include "reshard/base/status.h"

namespace reshard::fs {

struct MaterializeOptions {
  std::string source;
  std::string out_dir;  // must not exist, or be an empty folder
  TargetFlags target;
  bool quiet = false;  // no file list, no progress
};

// Prints one line per file written ("PATH SIZE") to `out`, and the progress (bytes, rate, ETA;
// fs/progress_meter.h) to `progress`, a terminal or not; neither when options.quiet.
Status RunMaterialize(const MaterializeOptions& options, std::ostream& out, std::FILE* progress);

}  // namespace reshard::fs
