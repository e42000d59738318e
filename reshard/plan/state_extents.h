// AppendStateExtents: the one place a view of a logical state tensor becomes extents over the
// files that hold it.
//
// The planner cuts every state tensor (a TP slice, a ZeRO fragment, an lp weight) as gathers
// over the tensor's own elements (view/gather.h), whatever source it came from. A universal
// checkpoint stores each state whole in one file, so its gathers address that file directly. A
// native checkpoint stores it as fragments of several ranks' flat partitions
// (ucp::StateTensor::pieces); this composes the two levels: each gather row is mapped onto the
// pieces, rows that lie inside one piece stay strided gathers of that piece, and a row that
// crosses a piece boundary is split there. Nothing is copied; the cost is one binary search per
// run of rows and one extent per crossing.
// Thread safety: plan time only (SourceTable is not thread-safe). Public header: C++17.
#pragma once

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/ucp/param_state.h"
#include "reshard/view/gather.h"

namespace reshard::plan {

// Appends the elements `gathers` select from `tensor` (in destination order; zero gathers stay
// zeros) to `out`, interning the files they come from in `sources`. kOutOfRange when a gather
// reads past the tensor's numel().
Status AppendStateExtents(ExtentList& out, SourceTable& sources, const ucp::StateTensor& tensor,
                          const view::GatherList& gathers);

}  // namespace reshard::plan
