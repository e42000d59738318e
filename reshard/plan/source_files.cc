#include "reshard/plan/source_files.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <map>

#include "reshard/base/checked_math.h"

namespace reshard::plan {
namespace {

int64_t MtimeNs(const struct stat& st) {
  return static_cast<int64_t>(st.st_mtim.tv_sec) * 1'000'000'000 + st.st_mtim.tv_nsec;
}

}  // namespace

Result<SourceFiles> SourceFiles::Open(const std::vector<Source>& sources) {
  SourceFiles out;
  std::map<std::string, uint32_t> opened;
  for (const Source& s : sources) {
    auto [it, inserted] = opened.try_emplace(s.path, static_cast<uint32_t>(out.files_.size()));
    if (inserted) {
      UniqueFd fd(::open(s.path.c_str(), O_RDONLY | O_CLOEXEC));
      if (!fd.valid()) return ErrnoError(s.path, errno);
      struct stat st;
      if (::fstat(fd.get(), &st) != 0) return ErrnoError(s.path, errno);
      out.files_.push_back(std::move(fd));
      out.paths_.push_back(s.path);
      out.states_.push_back(FileState{static_cast<uint64_t>(st.st_size), MtimeNs(st)});
    }
    const uint32_t itemsize = format::ItemSize(s.dtype);
    const std::optional<uint64_t> bytes = CheckedMul(s.numel, itemsize);
    if (!bytes || !RangeFits(s.data_offset, *bytes, out.states_[it->second].size)) {
      return Corrupt(s.path + ": holds " + std::to_string(out.states_[it->second].size) + " bytes, a tensor at offset " +
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

Status SourceFiles::CheckUnchanged(const std::vector<uint32_t>& sources) const {
  uint32_t last_file = UINT32_MAX;  // sources of one file are usually neighbours: fstat it once
  for (const uint32_t source : sources) {
    if (source >= entries_.size()) return OutOfRange("no source " + std::to_string(source));
    const uint32_t file = entries_[source].file;
    if (file == last_file) continue;
    last_file = file;
    struct stat st;
    if (::fstat(files_[file].get(), &st) != 0) return ErrnoError(paths_[file], errno);
    const FileState& then = states_[file];
    if (static_cast<uint64_t>(st.st_size) != then.size) {
      return IoError(paths_[file] + ": changed since it was opened (" + std::to_string(then.size) + " bytes, now " +
                     std::to_string(st.st_size) + "); mount again to serve the new checkpoint");
    }
    if (MtimeNs(st) != then.mtime_ns) {
      return IoError(paths_[file] + ": rewritten since it was opened (modification time changed); mount again to "
                     "serve the new checkpoint");
    }
  }
  return Status::Ok();
}

}  // namespace reshard::plan
