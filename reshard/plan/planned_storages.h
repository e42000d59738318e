// PlannedStorages: the tensor storages of one planned file, each a list of extents over the
// source files, indexed so that any byte range of any storage is read with arithmetic and pread.
//
// A PlannedFile (plan/planned_file.h) is these storages plus the torch.save bytes around them;
// a file served only as safetensors (the plain weights, plan/weights_plan.h) is these storages
// alone, so no zip records or pickle are kept for it.
//
// Memory: the extents of all storages in one array and their first elements in another; a
// storage keeps only its size, dtype and position in them (a 100,000-tensor file pays no heap
// block per storage).
//
// Thread safety: immutable after Create(); reads may run concurrently from any number of
// threads. A read allocates nothing once its thread has converted a tensor before. Movable.
// Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/source_files.h"

namespace reshard::plan {

class PlannedStorages {
 public:
  // One storage as kept: StoragePlan without its extent vector and its key (16 bytes; messages
  // name a storage by its number in the plan).
  struct Storage {
    uint64_t numel = 0;
    uint32_t first_extent = 0;  // extents [first_extent, next storage's first_extent)
    format::DType dtype = format::DType::kFloat32;
    Conversion conversion = Conversion::kCopy;

    uint64_t nbytes() const { return numel * format::ItemSize(dtype); }
  };

  // `name`: the file the storages belong to, for messages. `sources`: the plan's source table.
  // Errors: kInternal when an extent names a missing source or a source of the wrong dtype for
  // its storage, when extents do not cover their storage, or past 2^32 extents in one file.
  static Result<PlannedStorages> Create(std::string name, std::vector<StoragePlan> storages,
                                        const std::vector<Source>& sources);

  size_t size() const { return storages_.size(); }
  const Storage& storage(size_t index) const { return storages_[index]; }
  // The extents of storage `index`, in destination order.
  const Extent* extents_begin(size_t index) const { return extents_.data() + storages_[index].first_extent; }
  const Extent* extents_end(size_t index) const { return extents_.data() + ExtentEnd(index); }

  // Bytes of tensor data in all storages, and how many of them come from sources.
  uint64_t storage_bytes() const { return storage_bytes_; }
  // Source bytes one full read of every storage reads (each extent once).
  uint64_t source_bytes() const { return source_bytes_; }
  // The sources the storages read (indices into the plan's source table), ascending, each once.
  const std::vector<uint32_t>& sources_read() const { return sources_read_; }

  // Copies bytes [offset, offset + length) of storage `index`, as they appear in a file, into
  // `out`. Errors: kInternal for a missing storage, kOutOfRange past its end, the first
  // SourceFiles error (naming the source file).
  Status Read(const SourceFiles& files, uint32_t index, uint64_t offset, uint8_t* out, size_t length) const;

 private:
  uint32_t ExtentEnd(size_t index) const {
    return index + 1 < storages_.size() ? storages_[index + 1].first_extent : static_cast<uint32_t>(extents_.size());
  }
  Status ReadElements(const SourceFiles& files, uint32_t index, uint64_t first, uint64_t count, uint8_t* out) const;

  std::string name_;
  std::vector<Storage> storages_;
  std::vector<Extent> extents_;
  // extent_starts_[storages_[i].first_extent + i + k]: the first element of storage i's k-th
  // extent; each storage's run ends with its numel (one entry more than its extents).
  std::vector<uint64_t> extent_starts_;
  uint64_t storage_bytes_ = 0;
  uint64_t source_bytes_ = 0;
  std::vector<uint32_t> sources_read_;
};

}  // namespace reshard::plan
