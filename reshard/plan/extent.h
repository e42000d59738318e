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
#include <tuple>
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
// named with. Not thread-safe (plan-time only).
class SourceTable {
 public:
  uint32_t Intern(const Source& source);
  const std::vector<Source>& sources() const { return sources_; }

 private:
  std::vector<Source> sources_;
  std::map<std::tuple<std::string, uint64_t, format::DType>, uint32_t> index_;
};

// Total elements of a list.
uint64_t NumElements(const ExtentList& list);

// Appends `gathers` from `source`, merging contiguous runs of the same source.
void AppendExtents(ExtentList& out, uint32_t source, const view::GatherList& gathers);
void AppendZeros(ExtentList& out, uint64_t numel);

// Elements [offset, offset + length) of `list`, in order. kOutOfRange past its end.
Result<ExtentList> SliceExtents(const ExtentList& list, uint64_t offset, uint64_t length);

}  // namespace reshard::plan
