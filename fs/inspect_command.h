// `reshardfs inspect FILE [--json]`: shows a torch.save file as reshardfs reads it.
//
// Text mode prints the pickle tree in a Python-like notation with each tensor summarised as
// dtype, shape and bytes; --json prints the archive's records, storages and the tree in the
// encoding of reshard/format/tree_json.h. Tensor data is never read.
#pragma once

#include <ostream>
#include <string>

#include "reshard/base/status.h"

namespace reshard::fs {

struct InspectOptions {
  std::string path;
  bool json = false;
};

// Writes the report to `out`; returns the error that stopped it (nothing is written then).
Status RunInspect(const InspectOptions& options, std::ostream& out);

}  // namespace reshard::fs
