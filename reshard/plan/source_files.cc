#include "reshard/plan/source_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <map>

#include "reshard/base/checked_math.h"

namespace reshard::plan {

Result<SourceFiles> SourceFiles::Open(const std::vector<Source>& sources) {
  SourceFiles out;
  std::map<std::string, uint32_t> opened;
  std::vector<uint64_t> sizes;
  for (const Source& s : sources) {
    auto [it, inserted] = opened.try_emplace(s.path, static_cast<uint32_t>(out.files_.size()));
    if (inserted) {
      UniqueFd fd(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoError(s.path, errno);
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return ErrnoError(s.path, errno);
      out.files_.push_back(std::move(fd));
      out.paths_.push_back(s.path);
      sizes.push_back(static_cast<uint64_t>(st.st_size));
    }
    const uint32_t itemsize = format::ItemSize(s.dtype);
    const std::optional<uint64_t> bytes = CheckedMul(s.numel, itemsize);
    if (!bytes || !RangeFits(s.data_offset, *bytes, sizes[it->second])) {
      return Corrupt(s.path + ": holds " + std::to_string(sizes[it->second]) + " bytes, a tensor at offset " +
                     std::to_string(s.data_offset) + " needs " + std::to_string(s.numel) + " x " +
                     std::to_string(itemsize) + " bytes more");
    }
    out.entries_.push_back(Entry{it->second, s.data_offset, itemsize, s.numel});
  }
  return out;
}

Status SourceFiles::ReadElements(uint32_t source, uint64_t first, uint64_t count, uint8_t* out) const {
  if (source >= entries_.size()) return OutOfRange("no source " + std::to_string(source));
  const Entry& e = entries_[source];
  if (first > e.numel || count > e.numel - first) {
    return OutOfRange(paths_[e.file] + ": elements [" + std::to_string(first) + ", +" + std::to_string(count) +
                      ") past the tensor's " + std::to_string(e.numel));
  }
  uint64_t offset = e.data_offset + first * e.itemsize;  // in range: checked against the file at Open
  size_t left = count * e.itemsize;
  while (left > 0) {
    const ssize_t n = ::pread(files_[e.file].get(), out, left, static_cast<off_t>(offset));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(paths_[e.file] + " at offset " + std::to_string(offset), errno);
    }
    if (n == 0) {
      return IoError(paths_[e.file] + ": ends before offset " + std::to_string(offset + left) +
                     " (truncated while served?)");
    }
    out += n;
    offset += static_cast<uint64_t>(n);
    left -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace reshard::plan
