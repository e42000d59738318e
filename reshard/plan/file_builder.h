// FileBuilder: assembles one FilePlan: a new pickle tree, values copied from the checkpoint's
// own files, and tensors planned over the universal state files.
//
// Two ways a tensor enters the file:
//   - Import(): a value of a source archive (model-states or optimizer_state.pt file) is copied
//     into the new tree, memoised per source node, so shared objects (tied weights, one storage
//     behind many views) stay shared. Every storage the copied value names becomes a storage of
//     the new file that copies the source record's bytes unchanged (buffers, client state).
//   - AddTensor(): a fresh contiguous tensor whose storage is computed from extents (a TP slice
//     of a parameter, a DP partition of a flat group), optionally converted to bf16/fp16.
// Finish() renumbers storage keys "0", "1", ... in the order the pickle names them, as
// torch.save does, and returns the plan.
//
// Not thread-safe (plan time only). The source archives must outlive the builder.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/format/pickle_value.h"
#include "reshard/format/torch_archive.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"

namespace reshard::plan {

class FileBuilder {
 public:
  FileBuilder(std::string path, SourceTable& sources);

  format::PickleTree& tree() { return plan_.tree; }
  SourceTable& sources() { return sources_; }

  // Copies `id` of `source`'s tree (and everything below it) into the new tree; returns the
  // copy. The same (source, id) always yields the same copy. Errors: a persistent id that is not
  // a storage of the archive (kCorrupt), a cycle deeper than the pickle reader's bound.
  Result<format::NodeId> Import(const format::TorchArchive& source, format::NodeId id);

  // Makes `copy` the copy of (`source`, `id`): later imports of that node (an alias of a tied
  // parameter, a second reference to the same object) reuse it instead of copying the original.
  void Substitute(const format::TorchArchive& source, format::NodeId id, format::NodeId copy);

  // Adds a contiguous tensor of `shape` and `dtype` whose elements are `extents` (source
  // elements, converted per `conversion`); `requires_grad` is pickled as given (DeepSpeed's fp32
  // partitions are optimizer params and carry True). Errors: kInternal when the extents do not
  // hold exactly prod(shape) elements, or the conversion does not produce `dtype`.
  Result<format::NodeId> AddTensor(format::DType dtype, const std::vector<int64_t>& shape,
                                   ExtentList extents, Conversion conversion, bool requires_grad = false);

  // The finished plan (keys renumbered in pickling order). The builder is spent afterwards.
  Result<FilePlan> Finish() &&;

 private:
  Result<format::NodeId> ImportNode(const format::TorchArchive& source, format::NodeId id, int depth);
  Result<format::NodeId> ImportPersId(const format::TorchArchive& source, format::NodeId id);
  // Registers a storage whose key node is `key_node`; returns its placeholder key.
  std::string NewStorage(StoragePlan storage);

  FilePlan plan_;
  SourceTable& sources_;
  std::map<std::pair<const format::TorchArchive*, format::NodeId>, format::NodeId> memo_;
  std::map<std::pair<const format::TorchArchive*, std::string>, std::string> imported_storages_;
};

}  // namespace reshard::plan
