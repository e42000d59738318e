#include "reshard/plan/source_files.h"

#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <unordered_map>

#include "reshard/base/checked_math.h"

namespace reshard::plan {

Result<SourceFiles> SourceFiles::Open(const std::vector<Source>& sources, size_t max_open_files) {
  // Sources of one file (a state dict's tensors) share its descriptor: number the distinct paths.
  std::unordered_map<std::string_view, uint32_t> numbers;
  std::vector<std::string> paths;
  std::vector<Entry> entries;
  std::vector<std::shared_ptr<const std::string>> computed;
  entries.reserve(sources.size());
  for (const Source& s : sources) {
    const auto itemsize = static_cast<uint32_t>(format::ItemSize(s.dtype));
    if (s.computed) {
      if (computed.size() >= kComputedBit) return Internal("more computed sources than a plan can number");
      entries.push_back(Entry{kComputedBit | static_cast<uint32_t>(computed.size()), itemsize, s.data_offset, s.numel});
      computed.push_back(s.computed);
      continue;
    }
    if (paths.size() >= kComputedBit) return Internal("more source files than a plan can number");
    const auto [it, inserted] = numbers.try_emplace(s.path, static_cast<uint32_t>(paths.size()));
    if (inserted) paths.push_back(s.path);
    entries.push_back(Entry{it->second, itemsize, s.data_offset, s.numel});
  }
  numbers.clear();
  RS_ASSIGN_OR_RETURN(FdCache files,
                      FdCache::Create(paths, max_open_files ? max_open_files : FdCache::DefaultCapacity()));
  for (size_t k = 0; k < sources.size(); ++k) {
    const Source& s = sources[k];
    const uint64_t file_size = s.computed ? s.computed->size() : files.identity(entries[k].file).size;
    const std::optional<uint64_t> bytes = CheckedMul(s.numel, entries[k].itemsize);
    if (!bytes || !RangeFits(s.data_offset, *bytes, file_size)) {
      return Corrupt(s.path + ": holds " + std::to_string(file_size) + " bytes, a tensor at offset " +
                     std::to_string(s.data_offset) + " needs " + std::to_string(s.numel) + " x " +
                     std::to_string(entries[k].itemsize) + " bytes more");
    }
  }
  computed.shrink_to_fit();
  return SourceFiles(std::move(files), std::move(entries), std::move(computed));
}

Status SourceFiles::ReadElements(uint32_t source, uint64_t first, uint64_t count, uint8_t* out) const {
  if (source >= entries_.size()) return OutOfRange("no source " + std::to_string(source));
  const Entry& e = entries_[source];
  if (first > e.numel || count > e.numel - first) {
    return OutOfRange(((e.file & kComputedBit) ? "computed source " + std::to_string(source) : files_.path(e.file)) +
                      ": elements [" + std::to_string(first) + ", +" + std::to_string(count) + ") past the tensor's " +
                      std::to_string(e.numel));
  }
  if (e.file & kComputedBit) {  // in range: checked against the bytes at Open
    const std::string& bytes = *computed_[e.file & ~kComputedBit];
    std::memcpy(out, bytes.data() + e.data_offset + first * e.itemsize, count * e.itemsize);
    return Status::Ok();
  }
  RS_ASSIGN_OR_RETURN(const FdCache::Lease lease, files_.Acquire(e.file));
  uint64_t offset = e.data_offset + first * e.itemsize;  // in range: checked against the file at Open
  size_t left = count * e.itemsize;
  while (left > 0) {
    const ssize_t n = ::pread(lease.fd(), out, left, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(files_.path(e.file) + " at offset " + std::to_string(offset), errno);
    }
    if (n == 0) {
      return IoError(files_.path(e.file) + ": ends before offset " + std::to_string(offset + left) +
                     " (truncated while served?)");
    }
    out += n;
    offset += static_cast<uint64_t>(n);
    left -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SourceFiles::CheckUnchanged(const std::vector<uint32_t>& sources) const {
  uint32_t last_file = UINT32_MAX;  // sources of one file are usually neighbours: check it once
  for (const uint32_t source : sources) {
    if (source >= entries_.size()) return OutOfRange("no source " + std::to_string(source));
    const uint32_t file = entries_[source].file;
    if (file == last_file || (file & kComputedBit)) continue;  // computed bytes cannot change
    last_file = file;
    RS_RETURN_IF_ERROR(files_.CheckUnchanged(file));
  }
  return Status::Ok();
}

}  // namespace reshard::plan
