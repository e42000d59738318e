// Gather: how a target tensor's bytes come from a universal tensor, without copying anything.
//
// A universal tensor is stored row-major and contiguous (zero/<param>/<state>.pt). Every target
// tensor reshardfs serves (a TP slice, a DP partition of a flat group, a sub-param split) is the
// concatenation, in destination order, of pieces of one of two kinds:
//
//   source gather: `rows` runs of `row_elems` contiguous source elements, the first starting at
//                  element `start` of the source tensor and each next one `row_stride` elements
//                  after the previous (narrowing dim d of a row-major tensor is exactly this:
//                  rows = prod(shape[:d]), row_elems = len * inner, row_stride = shape[d] * inner)
//   zero:          `rows * row_elems` zero elements (vocab padding, ZeRO alignment padding)
//
// Units are ELEMENTS of the source dtype; a consumer multiplies by the item size once. A
// GatherList is a plain vector: built at plan time, then read-only, so concurrent reads are safe.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <vector>

#include "reshard/base/status.h"

namespace reshard::view {

struct Gather {
  bool zero = false;        // true: zeros, `start` and `row_stride` unused
  uint64_t start = 0;       // first source element
  uint64_t row_elems = 0;   // contiguous elements per row, > 0
  uint64_t rows = 0;        // number of rows, > 0
  uint64_t row_stride = 0;  // elements from one row start to the next (>= row_elems when rows > 1)

  uint64_t numel() const { return row_elems * rows; }
  bool operator==(const Gather& o) const {
    return zero == o.zero && start == o.start && row_elems == o.row_elems && rows == o.rows &&
           row_stride == o.row_stride;
  }

  static Gather Source(uint64_t start, uint64_t row_elems, uint64_t rows = 1, uint64_t row_stride = 0) {
    Gather g;
    g.start = start;
    g.row_elems = row_elems;
    g.rows = rows;
    g.row_stride = rows > 1 ? row_stride : row_elems;
    return g;
  }
  static Gather Zeros(uint64_t numel) {
    Gather g;
    g.zero = true;
    g.row_elems = numel;
    g.rows = 1;
    g.row_stride = numel;
    return g;
  }
};

using GatherList = std::vector<Gather>;

// Total elements of a list.
uint64_t NumElements(const GatherList& list);

// Appends `g` to `out`, merging it into the last piece when the two are contiguous in the
// source (or both zero), so plain copies stay one long run. Pieces with numel 0 are dropped.
void AppendGather(GatherList& out, const Gather& g);

// The pieces that produce destination elements [offset, offset + length) of `list`, in order
// (a row cut mid-way becomes up to three pieces). kOutOfRange if the range exceeds the list.
Result<GatherList> Slice(const GatherList& list, uint64_t offset, uint64_t length);

// Visits the contiguous runs of `list` in destination order: f(dest_elem, src_elem, elems,
// zero). Used by materialisers and tests; the FUSE read path walks the same runs lazily.
template <typename F>
void ForEachRun(const GatherList& list, F&& f) {
  uint64_t dest = 0;
  for (const Gather& g : list) {
    for (uint64_t r = 0; r < g.rows; ++r) {
      f(dest, g.zero ? 0 : g.start + r * g.row_stride, g.row_elems, g.zero);
      dest += g.row_elems;
    }
  }
}

}  // namespace reshard::view
