#include "reshard/plan/state_extents.h"

#include <algorithm>
#include <vector>

#include "reshard/base/checked_math.h"

namespace reshard::plan {
namespace {

// The pieces of a fragmented tensor with their first logical element, for the binary search.
struct PieceIndex {
  std::vector<uint64_t> starts;  // starts[i]: logical element of pieces[i]'s first element
  std::vector<uint32_t> sources;

  // The piece holding logical element `e` (< numel).
  size_t Find(uint64_t e) const {
    return static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), e) - starts.begin()) - 1;
  }
};

// The last element (exclusive) a gather reads, or nullopt on overflow.
std::optional<uint64_t> GatherEnd(const view::Gather& g) {
  const auto last_row = CheckedMul(g.rows - 1, g.row_stride);
  const auto start = last_row ? CheckedAdd(g.start, *last_row) : std::nullopt;
  return start ? CheckedAdd(*start, g.row_elems) : std::nullopt;
}

}  // namespace

Status AppendStateExtents(ExtentList& out, SourceTable& sources, const ucp::StateTensor& tensor,
                          const view::GatherList& gathers) {
  const uint64_t numel = tensor.numel();
  for (const view::Gather& g : gathers) {
    if (g.zero || g.numel() == 0) continue;
    const auto end = GatherEnd(g);
    if (!end || *end > numel) {
      return OutOfRange(tensor.path + ": a view reads past the " + std::to_string(numel) + " elements of its tensor");
    }
  }
  if (tensor.pieces.empty()) {
    AppendExtents(out, sources.Intern(Source{tensor.path, tensor.data_offset, tensor.dtype, numel, tensor.computed}),
                  gathers);
    return Status::Ok();
  }
  PieceIndex index;
  uint64_t at = 0;
  for (const ucp::TensorPiece& p : tensor.pieces) {
    index.starts.push_back(at);
    index.sources.push_back(sources.Intern(Source{p.path, p.data_offset, tensor.dtype, p.numel, nullptr}));
    at += p.numel;  // the reader checked that the pieces sum to numel
  }
  auto piece_end = [&](size_t i) { return i + 1 < index.starts.size() ? index.starts[i + 1] : at; };
  for (const view::Gather& g : gathers) {
    if (g.zero) {
      AppendZeros(out, g.numel());
      continue;
    }
    uint64_t r = 0;
    while (r < g.rows) {
      const uint64_t s = g.start + r * g.row_stride;
      size_t i = index.Find(s);
      const uint64_t pstart = index.starts[i], pend = piece_end(i);
      if (s + g.row_elems <= pend) {
        // Rows r, r+1, ... that end inside this piece form one strided gather of it.
        uint64_t k = 1;
        if (g.rows - r > 1) k = std::min(g.rows - r, (pend - g.row_elems - s) / g.row_stride + 1);
        AppendExtents(out, index.sources[i], {view::Gather::Source(s - pstart, g.row_elems, k, g.row_stride)});
        r += k;
        continue;
      }
      // A row across a piece boundary: one run per piece it touches.
      uint64_t pos = s, left = g.row_elems;
      while (left > 0) {
        const uint64_t take = std::min(left, piece_end(i) - pos);
        AppendExtents(out, index.sources[i], {view::Gather::Source(pos - index.starts[i], take)});
        pos += take;
        left -= take;
        ++i;
      }
      ++r;
    }
  }
  return Status::Ok();
}

}  // namespace reshard::plan
