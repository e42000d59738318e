// Extent: a run of a target tensor's elements taken from one universal state tensor.
//
// The planner describes every target tensor (a flat fp32 partition, an Adam state partition, an
// lp weight) as an ExtentList: gathers (view/gather.h) over numbered sources, in destination
// order, with zero gathers for padding. Sources are universal state tensors on disk
// (zero/<param>/<state>.pt): a file and the byte offset of element 0. Units are elements of the
// source dtype. Lists are built at plan time and read-only afterwards.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_set>
#include <utility>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/view/gather.h"

namespace reshard::plan {

struct Source {
  std::string path;          // the .pt file (computed: what the bytes were computed from, not a file)
  uint64_t data_offset = 0;  // absolute byte offset of element 0 (computed: the offset in `computed`)
  format::DType dtype = format::DType::kFloat32;
  uint64_t numel = 0;
  // Set: the source's bytes are held in memory (ucp::StateTensor::computed), not read from `path`.
  std::shared_ptr<const std::string> computed;
};

struct Extent {
  uint32_t source = 0;  // index into the plan's sources; ignored for zero gathers
  view::Gather gather;
};

using ExtentList = std::vector<Extent>;

// Interns sources so each (file, offset, dtype) appears once, spanning the longest numel it was
// named with. The index holds positions in the table rather than copies of the keys, so each path
// is stored once. Not thread-safe (plan-time only).
class SourceTable {
 public:
  SourceTable() = default;
  // The index points at this object's table, so a SourceTable stays where it was made.
  SourceTable(const SourceTable&) = delete;
  SourceTable& operator=(const SourceTable&) = delete;

  uint32_t Intern(const Source& source);
  const std::vector<Source>& sources() const { return sources_; }
  // Hands over the table; the SourceTable is left empty.
  std::vector<Source> Release() &&;

 private:
  struct KeyHash {
    const std::vector<Source>* sources;
    size_t operator()(uint32_t i) const;
  };
  struct KeyEqual {
    const std::vector<Source>* sources;
    bool operator()(uint32_t a, uint32_t b) const;
  };

  std::vector<Source> sources_;
  std::unordered_set<uint32_t, KeyHash, KeyEqual> index_{0, KeyHash{&sources_}, KeyEqual{&sources_}};
};

uint64_t NumElements(const ExtentList& list);

// Appends `gathers` from `source`, merging contiguous runs of the same source.
void AppendExtents(ExtentList& out, uint32_t source, const view::GatherList& gathers);
void AppendZeros(ExtentList& out, uint64_t numel);

// Elements [offset, offset + length) of `list`, in order. kOutOfRange past its end.
Result<ExtentList> SliceExtents(const ExtentList& list, uint64_t offset, uint64_t length);

}  // namespace reshard::plan
