#include "reshard/plan/planned_file.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <utility>

#include "reshard/format/torch_archive_writer.h"
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

std::string BaseName(const std::string& path) {
  std::string name = path.substr(path.rfind('/') + 1);
  if (const size_t dot = name.rfind('.'); dot != std::string::npos && dot > 0) name.resize(dot);
  return name;
}

}  // namespace

Result<PlannedFile> PlannedFile::Create(FilePlan plan, const std::vector<Source>& sources) {
  PlannedFile out;
  out.path_ = plan.path;
  std::vector<format::ArchiveStorageSpec> specs;
  for (const StoragePlan& s : plan.storages) {
    specs.push_back({s.key, s.nbytes()});
    out.storage_bytes_ += s.nbytes();
    std::vector<uint64_t> starts;
    uint64_t pos = 0;
    for (const Extent& e : s.extents) {
      starts.push_back(pos);
      pos += e.gather.numel();
      if (e.gather.zero) continue;
      if (e.source >= sources.size()) return Internal(plan.path + ": an extent names a missing source");
      const format::DType want = s.conversion == Conversion::kCopy ? s.dtype : format::DType::kFloat32;
      if (sources[e.source].dtype != want) {
        return Internal(plan.path + ": storage " + s.key + " reads " + sources[e.source].path + " as the wrong dtype");
      }
      out.source_bytes_ += e.gather.numel() * format::ItemSize(sources[e.source].dtype);
      out.sources_read_.push_back(e.source);
    }
    if (pos != s.numel) return Internal(plan.path + ": storage " + s.key + " extents do not cover it");
    starts.push_back(pos);
    out.extent_starts_.push_back(std::move(starts));
  }
  std::sort(out.sources_read_.begin(), out.sources_read_.end());
  out.sources_read_.erase(std::unique(out.sources_read_.begin(), out.sources_read_.end()), out.sources_read_.end());
  RS_ASSIGN_OR_RETURN(format::TorchArchiveLayout layout,
                      format::LayoutTorchArchive(plan.tree, specs, 64, BaseName(plan.path)));
  out.file_ = std::move(layout.zip.file);
  out.first_storage_entry_ = layout.first_storage_entry;
  out.storages_ = std::move(plan.storages);
  return out;
}

Result<size_t> PlannedFile::Read(const SourceFiles& files, uint64_t offset, uint8_t* out, size_t length) const {
  auto fill = [&](uint32_t record, uint64_t record_offset, uint8_t* dest, size_t n) -> Status {
    return ReadStorage(files, record - first_storage_entry_, record_offset, dest, n);
  };
  return file_.Read(offset, out, length, fill);
}

Status PlannedFile::ReadStorage(const SourceFiles& files, uint32_t index, uint64_t offset, uint8_t* out,
                                size_t length) const {
  if (index >= storages_.size()) return Internal(path_ + ": no storage " + std::to_string(index));
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

Status PlannedFile::ReadElements(const SourceFiles& files, uint32_t index, uint64_t first, uint64_t count,
                                 uint8_t* out) const {
  const StoragePlan& s = storages_[index];
  const std::vector<uint64_t>& starts = extent_starts_[index];
  if (first > s.numel || count > s.numel - first) return OutOfRange(path_ + ": read past storage " + s.key);
  const uint64_t item = format::ItemSize(s.dtype);
  size_t i = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), first) - starts.begin()) - 1;
  while (count > 0) {
    const view::Gather& g = s.extents[i].gather;
    const uint64_t local = first - starts[i];
    uint64_t row = local / g.row_elems;
    uint64_t col = local % g.row_elems;
    for (; count > 0 && row < g.rows; ++row, col = 0) {
      const uint64_t n = std::min(g.row_elems - col, count);
      if (g.zero) {
        std::memset(out, 0, n * item);
      } else if (s.conversion == Conversion::kCopy) {
        RS_RETURN_IF_ERROR(files.ReadElements(s.extents[i].source, g.start + row * g.row_stride + col, n, out));
      } else {
        Staging& staging = ThreadStaging();
        uint64_t src = g.start + row * g.row_stride + col;
        for (uint64_t done = 0; done < n;) {
          const uint64_t step = std::min<uint64_t>(n - done, kStagingElems);
          RS_RETURN_IF_ERROR(files.ReadElements(s.extents[i].source, src, step,
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
