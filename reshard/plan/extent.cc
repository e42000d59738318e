#include "reshard/plan/extent.h"

#include <algorithm>
#include <functional>
#include <string>
#include <utility>

namespace reshard::plan {

size_t SourceTable::KeyHash::operator()(uint32_t i) const {
  const Source& s = (*sources)[i];
  size_t h = std::hash<std::string>{}(s.path);
  h ^= std::hash<uint64_t>{}(s.data_offset) + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h ^ static_cast<size_t>(s.dtype);
}

bool SourceTable::KeyEqual::operator()(uint32_t a, uint32_t b) const {
  const Source& x = (*sources)[a];
  const Source& y = (*sources)[b];
  return x.data_offset == y.data_offset && x.dtype == y.dtype && x.path == y.path;
}

uint32_t SourceTable::Intern(const Source& source) {
  // The candidate goes into the table first so that the index can hash and compare it like any
  // other entry; it is taken back out when it was there already.
  const auto candidate = static_cast<uint32_t>(sources_.size());
  sources_.push_back(source);
  const auto [it, inserted] = index_.insert(candidate);
  if (inserted) return candidate;
  sources_.pop_back();
  // The same start may be named with different lengths (a parameter's fragment at the start
  // of a flat partition, and the whole partition copied into another file): the source spans
  // the longest, so every gather over it stays in range.
  Source& existing = sources_[*it];
  existing.numel = std::max(existing.numel, source.numel);
  return *it;
}

std::vector<Source> SourceTable::Release() && {
  index_.clear();
  return std::move(sources_);
}

uint64_t NumElements(const ExtentList& list) {
  uint64_t n = 0;
  for (const Extent& e : list) n += e.gather.numel();
  return n;
}

void AppendExtents(ExtentList& out, uint32_t source, const view::GatherList& gathers) {
  for (const view::Gather& g : gathers) {
    if (g.zero) {
      AppendZeros(out, g.numel());
      continue;
    }
    // Merge with the previous extent when it reads the same source (AppendGather decides whether
    // the two gathers are contiguous).
    if (!out.empty() && !out.back().gather.zero && out.back().source == source) {
      view::GatherList merged = {out.back().gather};
      view::AppendGather(merged, g);
      if (merged.size() == 1) {
        out.back().gather = merged[0];
        continue;
      }
    }
    if (g.numel() > 0) out.push_back(Extent{source, g});
  }
}

void AppendZeros(ExtentList& out, uint64_t numel) {
  if (numel == 0) return;
  if (!out.empty() && out.back().gather.zero) {
    out.back().gather = view::Gather::Zeros(out.back().gather.numel() + numel);
    return;
  }
  out.push_back(Extent{0, view::Gather::Zeros(numel)});
}

Result<ExtentList> SliceExtents(const ExtentList& list, uint64_t offset, uint64_t length) {
  ExtentList out;
  uint64_t pos = 0;  // first element of the current extent
  for (const Extent& e : list) {
    if (length == 0) break;
    const uint64_t n = e.gather.numel();
    if (offset < pos + n) {
      const uint64_t begin = offset - pos;
      const uint64_t take = std::min(n - begin, length);
      RS_ASSIGN_OR_RETURN(view::GatherList piece, view::Slice({e.gather}, begin, take));
      AppendExtents(out, e.source, piece);
      offset += take;
      length -= take;
    }
    pos += n;
  }
  if (length != 0) return OutOfRange("extent slice past the end of the list");
  return out;
}

}  // namespace reshard::plan
