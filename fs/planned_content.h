// PlannedContent and SafetensorsContent: a target file of the served checkpoint (a
// plan::PlannedFile), and its safetensors view, as FUSE files. Reads are the planned file's reads
// over the shared source files: arithmetic, pread and memcpy, no lock. An open fails (EIO) once a
// source file the planned file reads was rewritten in place since the mount
// (SourceFiles::CheckUnchanged); handles opened before go on reading the current bytes. Immutable; thread-safe.
// They share ownership of the planned files and sources, so they stay valid as long as the
// Namespace holding them.
#pragma once

#include <memory>
#include <vector>

#include "fs/file_content.h"
#include "reshard/plan/planned_file.h"
#include "reshard/plan/planned_storages.h"
#include "reshard/plan/safetensors_view.h"
#include "reshard/plan/source_files.h"

namespace reshard::fs {

class PlannedContent final : public FileContent {
 public:
  PlannedContent(std::shared_ptr<const std::vector<plan::PlannedFile>> files, size_t index,
                 std::shared_ptr<const plan::SourceFiles> sources)
      : files_(std::move(files)), file_(&(*files_)[index]), sources_(std::move(sources)) {}

  uint64_t size() const override { return file_->size(); }
  Result<size_t> Read(uint64_t offset, uint8_t* out, size_t length) const override {
    return file_->Read(*sources_, offset, out, length);
  }
  Status CheckOpen() const override { return sources_->CheckUnchanged(file_->sources_read()); }

 private:
  std::shared_ptr<const std::vector<plan::PlannedFile>> files_;
  const plan::PlannedFile* file_;
  std::shared_ptr<const plan::SourceFiles> sources_;
};

class SafetensorsContent final : public FileContent {
 public:
  // `storages` and `view` may alias a larger object they belong to (a vector of planned files
  // or views, through shared_ptr's aliasing constructor): they keep it alive.
  SafetensorsContent(std::shared_ptr<const plan::PlannedStorages> storages,
                     std::shared_ptr<const plan::SafetensorsView> view,
                     std::shared_ptr<const plan::SourceFiles> sources)
      : storages_(std::move(storages)), view_(std::move(view)), sources_(std::move(sources)) {}

  uint64_t size() const override { return view_->size(); }
  Result<size_t> Read(uint64_t offset, uint8_t* out, size_t length) const override {
    return view_->Read(*storages_, *sources_, offset, out, length);
  }
  Status CheckOpen() const override { return sources_->CheckUnchanged(storages_->sources_read()); }

 private:
  std::shared_ptr<const plan::PlannedStorages> storages_;
  std::shared_ptr<const plan::SafetensorsView> view_;
  std::shared_ptr<const plan::SourceFiles> sources_;
};

}  // namespace reshard::fs
