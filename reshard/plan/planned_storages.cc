#include "reshard/plan/planned_storages.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <memory>
#include <utility>

#include "reshard/view/dtype_convert.h"

namespace reshard::plan {
namespace {

// Elements converted per step: 256 KiB of fp32 in, 128 KiB of 16-bit out, per thread.
constexpr size_t kStagingElems = size_t{1} << 16;

struct Staging {
  std::unique_ptr<float[]> in{new float[kStagingElems]};
  std::unique_ptr<uint16_t[]> out{new uint16_t[kStagingElems]};
};

Staging& ThreadStaging() {
  thread_local Staging staging;
  return staging;
}

}  // namespace

Result<PlannedStorages> PlannedStorages::Create(std::string name, std::vector<StoragePlan> storages,
                                                const std::vector<Source>& sources) {
  PlannedStorages out;
  out.name_ = std::move(name);
  size_t total_extents = 0;
  for (const StoragePlan& s : storages) total_extents += s.extents.size();
  if (total_extents >= std::numeric_limits<uint32_t>::max()) {
    return Internal(out.name_ + ": " + std::to_string(total_extents) + " extents in one file");
  }
  out.storages_.reserve(storages.size());
  out.extents_.reserve(total_extents);
  out.extent_starts_.reserve(total_extents + storages.size());
  for (const StoragePlan& s : storages) {
    out.storages_.push_back({s.numel, static_cast<uint32_t>(out.extents_.size()), s.dtype, s.conversion});
    const Storage& kept = out.storages_.back();
    const auto storage_name = [&] { return "storage " + std::to_string(out.storages_.size() - 1); };
    out.storage_bytes_ += kept.nbytes();
    const format::DType want = s.conversion == Conversion::kCopy ? s.dtype : format::DType::kFloat32;
    uint64_t pos = 0;
    for (const Extent& e : s.extents) {
      out.extent_starts_.push_back(pos);
      out.extents_.push_back(e);
      pos += e.gather.numel();
      if (e.gather.zero) continue;
      if (e.source >= sources.size()) return Internal(out.name_ + ": an extent names a missing source");
      if (sources[e.source].dtype != want) {
        return Internal(out.name_ + ": " + storage_name() + " reads " + sources[e.source].path + " as the wrong dtype");
      }
      out.source_bytes_ += e.gather.numel() * format::ItemSize(sources[e.source].dtype);
      out.sources_read_.push_back(e.source);
    }
    if (pos != s.numel) return Internal(out.name_ + ": " + storage_name() + " extents do not cover it");
    out.extent_starts_.push_back(pos);
  }
  std::sort(out.sources_read_.begin(), out.sources_read_.end());
  out.sources_read_.erase(std::unique(out.sources_read_.begin(), out.sources_read_.end()), out.sources_read_.end());
  out.sources_read_.shrink_to_fit();
  return out;
}

Status PlannedStorages::Read(const SourceFiles& files, uint32_t index, uint64_t offset, uint8_t* out,
                             size_t length) const {
  if (index >= storages_.size()) return Internal(name_ + ": no storage " + std::to_string(index));
  const uint64_t item = format::ItemSize(storages_[index].dtype);
  while (length > 0) {
    const uint64_t elem = offset / item;
    const uint64_t within = offset % item;
    if (within != 0 || length < item) {
      // A read that starts or ends inside an element: compute that element whole.
      uint8_t one[16];
      RS_RETURN_IF_ERROR(ReadElements(files, index, elem, 1, one));
      const size_t n = static_cast<size_t>(std::min<uint64_t>(item - within, length));
      std::memcpy(out, one + within, n);
      out += n;
      offset += n;
      length -= n;
      continue;
    }
    const uint64_t count = length / item;
    RS_RETURN_IF_ERROR(ReadElements(files, index, elem, count, out));
    out += count * item;
    offset += count * item;
    length -= static_cast<size_t>(count * item);
  }
  return Status::Ok();
}

Status PlannedStorages::ReadElements(const SourceFiles& files, uint32_t index, uint64_t first, uint64_t count,
                                     uint8_t* out) const {
  const Storage& s = storages_[index];
  if (first > s.numel || count > s.numel - first) return OutOfRange(name_ + ": read past storage " + std::to_string(index));
  const uint64_t item = format::ItemSize(s.dtype);
  // Storage i's starts begin after the extents of the storages before it plus one closing
  // entry for each of them.
  const uint64_t* starts = extent_starts_.data() + s.first_extent + index;
  const uint64_t* starts_end = starts + (ExtentEnd(index) - s.first_extent) + 1;
  size_t i = static_cast<size_t>(std::upper_bound(starts, starts_end, first) - starts) - 1;
  const Extent* extents = extents_.data() + s.first_extent;
  while (count > 0) {
    const view::Gather& g = extents[i].gather;
    const uint64_t local = first - starts[i];
    uint64_t row = local / g.row_elems;
    uint64_t col = local % g.row_elems;
    for (; count > 0 && row < g.rows; ++row, col = 0) {
      const uint64_t n = std::min(g.row_elems - col, count);
      if (g.zero) {
        std::memset(out, 0, n * item);
      } else if (s.conversion == Conversion::kCopy) {
        RS_RETURN_IF_ERROR(files.ReadElements(extents[i].source, g.start + row * g.row_stride + col, n, out));
      } else {
        Staging& staging = ThreadStaging();
        uint64_t src = g.start + row * g.row_stride + col;
        for (uint64_t done = 0; done < n;) {
          const uint64_t step = std::min<uint64_t>(n - done, kStagingElems);
          RS_RETURN_IF_ERROR(files.ReadElements(extents[i].source, src, step,
                                                reinterpret_cast<uint8_t*>(staging.in.get())));
          // Converted straight into the reply buffer when it is 2-byte aligned (always, but for a
          // read that starts at an odd offset): one copy of the output bytes less.
          uint8_t* dest = out + done * item;
          const bool aligned = reinterpret_cast<uintptr_t>(dest) % alignof(uint16_t) == 0;
          uint16_t* converted = aligned ? reinterpret_cast<uint16_t*>(dest) : staging.out.get();
          if (s.conversion == Conversion::kFp32ToBf16) {
            view::Float32ToBFloat16(staging.in.get(), converted, step);
          } else {
            view::Float32ToFloat16(staging.in.get(), converted, step);
          }
          if (!aligned) std::memcpy(dest, staging.out.get(), step * item);
          done += step;
          src += step;
        }
      }
      out += n * item;
      first += n;
      count -= n;
    }
    ++i;
  }
  return Status::Ok();
}

}  // namespace reshard::plan
