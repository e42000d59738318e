// PlannedFile: a FilePlan laid out as the exact bytes of its torch.save file, computed on read.
//
// Create() writes the pickle and the zip directory once (format/torch_archive_writer.h) and
// indexes each storage's extents by destination element (plan/planned_storages.h).
// Read(offset, length) then only does arithmetic and copies: inline segments from memory,
// storage bytes with pread from the universal files (plan/source_files.h) straight into `out`,
// zeros with memset, and fp32 -> bf16/fp16 through a fixed per-thread staging buffer
// (view/dtype_convert.h). A read does not allocate once its thread has read a converted tensor
// before, and takes no lock.
//
// Thread safety: immutable after Create(); Read() may run concurrently from any number of
// threads. Movable. Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/planned_storages.h"
#include "reshard/plan/source_files.h"
#include "reshard/view/virtual_file.h"

namespace reshard::plan {

class PlannedFile {
 public:
  // `sources`: the plan's source table (CheckpointPlan::sources). Errors: kInternal when an
  // extent names a missing source or a source of the wrong dtype for its storage; everything
  // LayoutTorchArchive refuses.
  static Result<PlannedFile> Create(FilePlan plan, const std::vector<Source>& sources);

  const std::string& path() const { return path_; }
  uint64_t size() const { return file_.size(); }
  // Bytes of tensor data (storage records) in the file, and how many of them come from sources.
  uint64_t storage_bytes() const { return storages_.storage_bytes(); }
  // Source bytes one full read of the file reads (each extent once).
  uint64_t source_bytes() const { return storages_.source_bytes(); }
  // The sources the file reads (indices into the plan's source table), ascending, each once:
  // what SourceFiles::CheckUnchanged is given before the file is served.
  const std::vector<uint32_t>& sources_read() const { return storages_.sources_read(); }

  // Copies min(length, size() - offset) bytes at `offset` into `out`; returns the count.
  // Errors: the first SourceFiles error (naming the source file).
  Result<size_t> Read(const SourceFiles& files, uint64_t offset, uint8_t* out, size_t length) const;

  // Every storage, numbered as in the plan, for consumers that read storages directly
  // (the file's safetensors view).
  const PlannedStorages& storages() const { return storages_; }

 private:
  std::string path_;
  view::VirtualFile file_;
  uint32_t first_storage_entry_ = 0;
  PlannedStorages storages_;
};

}  // namespace reshard::plan
