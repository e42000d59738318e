#include "reshard/view/gather.h"

#include <algorithm>

namespace reshard::view {

uint64_t NumElements(const GatherList& list) {
  uint64_t n = 0;
  for (const Gather& g : list) n += g.numel();
  return n;
}

void AppendGather(GatherList& out, const Gather& g) {
  if (g.numel() == 0) return;
  if (!out.empty()) {
    Gather& last = out.back();
    if (last.zero && g.zero) {
      last = Gather::Zeros(last.numel() + g.numel());
      return;
    }
    // Two single runs back to back in the source become one run.
    if (!last.zero && !g.zero && last.rows == 1 && g.rows == 1 && last.start + last.row_elems == g.start) {
      last = Gather::Source(last.start, last.row_elems + g.row_elems);
      return;
    }
    // Another row of the same shape and stride extends a gather.
    if (!last.zero && !g.zero && g.rows == 1 && last.row_elems == g.row_elems && last.rows >= 1) {
      const uint64_t stride = last.rows > 1 ? last.row_stride : g.start - last.start;
      if (g.start > last.start && last.start + last.rows * stride == g.start && stride >= last.row_elems) {
        last.row_stride = stride;
        last.rows += 1;
        return;
      }
    }
  }
  out.push_back(g);
}

Result<GatherList> Slice(const GatherList& list, uint64_t offset, uint64_t length) {
  const uint64_t total = NumElements(list);
  if (offset > total || length > total - offset) {
    return OutOfRange("slice [" + std::to_string(offset) + ", +" + std::to_string(length) +
                      ") of a " + std::to_string(total) + "-element gather list");
  }
  GatherList out;
  if (length == 0) return out;
  uint64_t pos = 0;  // destination element where the current piece starts
  const uint64_t end = offset + length;
  for (const Gather& g : list) {
    const uint64_t g_end = pos + g.numel();
    if (g_end <= offset) {
      pos = g_end;
      continue;
    }
    if (pos >= end) break;
    const uint64_t lo = std::max(offset, pos) - pos;  // piece-relative element range [lo, hi)
    const uint64_t hi = std::min(end, g_end) - pos;
    if (g.zero) {
      AppendGather(out, Gather::Zeros(hi - lo));
    } else {
      const uint64_t first_row = lo / g.row_elems, first_col = lo % g.row_elems;
      const uint64_t last_row = (hi - 1) / g.row_elems, last_col = (hi - 1) % g.row_elems + 1;
      auto row_start = [&](uint64_t r) { return g.start + r * g.row_stride; };
      if (first_row == last_row) {
        AppendGather(out, Gather::Source(row_start(first_row) + first_col, last_col - first_col));
      } else {
        AppendGather(out, Gather::Source(row_start(first_row) + first_col, g.row_elems - first_col));
        if (last_row > first_row + 1) {
          out.push_back(Gather::Source(row_start(first_row + 1), g.row_elems, last_row - first_row - 1,
                                       g.row_stride));
        }
        AppendGather(out, Gather::Source(row_start(last_row), last_col));
      }
    }
    pos = g_end;
  }
  return out;
}

}  // namespace reshard::view
