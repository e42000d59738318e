#include "fs/materialize_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <memory>

#include "fs/progress_meter.h"
#include "fs/served_checkpoint.h"
#include "reshard/base/unique_fd.h"

namespace reshard::fs {
namespace {

constexpr size_t kChunkBytes = size_t{8} << 20;

Status WriteWhole(int fd, const uint8_t* data, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, data, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(path, errno);
    }
    data += w;
    n -= static_cast<size_t>(w);
  }
  return Status::Ok();
}

// Writes the `size` bytes that `read(offset, out, length)` produces to `partial`, a new file.
template <typename Read>
Status WriteBytes(const std::string& partial, uint64_t size, Read read, uint8_t* buffer, ProgressMeter& meter) {
  UniqueFd fd(::open(partial.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoError(partial, errno);
  for (uint64_t offset = 0; offset < size;) {
    RS_ASSIGN_OR_RETURN(size_t n, read(offset, buffer, kChunkBytes));
    RS_RETURN_IF_ERROR(WriteWhole(fd.get(), buffer, n, partial));
    offset += n;
    meter.Advance(n);
  }
  // close() is where some filesystems (NFS, quota) first report a failed write.
  if (::close(fd.release()) != 0) return ErrnoError(partial, errno);
  return Status::Ok();
}

// Writes the file at `path` through ".<name>.partial" beside it, renamed once complete and
// removed on any error, so `path` exists only with all its bytes.
template <typename Read>
Status WriteFile(const std::string& path, uint64_t size, Read read, uint8_t* buffer, ProgressMeter& meter) {
  const std::filesystem::path final_path(path);
  const std::string partial = (final_path.parent_path() / ("." + final_path.filename().string() + ".partial")).string();
  Status status = WriteBytes(partial, size, read, buffer, meter);
  if (status.ok() && ::rename(partial.c_str(), path.c_str()) != 0) status = ErrnoError(path, errno);
  if (!status.ok()) ::unlink(partial.c_str());
  return status;
}

}  // namespace

Status RunMaterialize(const MaterializeOptions& options, std::ostream& out, std::FILE* progress) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  if (stdfs::exists(options.out_dir, ec) && !stdfs::is_empty(options.out_dir, ec)) {
    return InvalidArgument(options.out_dir + ": exists and is not an empty folder");
  }
  RS_ASSIGN_OR_RETURN(ServedCheckpoint served, ServedCheckpoint::Load(options.source, options.target));
  const stdfs::path root(options.out_dir);
  stdfs::create_directories(root / served.tag() / "safetensors", ec);
  if (ec) return IoError((root / served.tag()).string() + ": " + ec.message());
  auto buffer = std::make_unique<uint8_t[]>(kChunkBytes);
  uint64_t total_bytes = served.tag().size();
  for (const plan::PlannedFile& file : served.files()) total_bytes += file.size();
  for (const plan::SafetensorsView& view : served.views()) total_bytes += view.size();
  if (served.weights_view()) total_bytes += served.weights_view()->size();
  ProgressMeter meter("materialize", total_bytes, ProgressMeter::ModeFor(options.quiet, progress), progress);
  for (size_t i = 0; i < served.files().size(); ++i) {
    const plan::PlannedFile& file = served.files()[i];
    const std::string path = (root / file.path()).string();
    RS_RETURN_IF_ERROR(WriteFile(path, file.size(), [&](uint64_t offset, uint8_t* to, size_t n) {
      return file.Read(served.sources(), offset, to, n);
    }, buffer.get(), meter));
    if (!options.quiet) out << path << " " << file.size() << "\n";
  }
  for (size_t i = 0; i < served.views().size(); ++i) {
    const plan::SafetensorsView& view = served.views()[i];
    const std::string path = (root / served.view_paths()[i]).string();
    RS_RETURN_IF_ERROR(WriteFile(path, view.size(), [&](uint64_t offset, uint8_t* to, size_t n) {
      return view.Read(served.files()[i].storages(), served.sources(), offset, to, n);
    }, buffer.get(), meter));
    if (!options.quiet) out << path << " " << view.size() << "\n";
  }
  if (served.weights_view()) {
    const plan::SafetensorsView& view = *served.weights_view();
    const plan::PlannedStorages& storages = *served.weights_storages();
    const std::string path = (root / served.weights_path()).string();
    RS_RETURN_IF_ERROR(WriteFile(path, view.size(), [&](uint64_t offset, uint8_t* to, size_t n) {
      return view.Read(storages, served.sources(), offset, to, n);
    }, buffer.get(), meter));
    if (!options.quiet) out << path << " " << view.size() << "\n";
  }
  const std::string latest = (root / "latest").string();
  const std::string& tag = served.tag();
  RS_RETURN_IF_ERROR(WriteFile(latest, tag.size(), [&](uint64_t offset, uint8_t* to, size_t n) -> Result<size_t> {
    const size_t count = std::min<uint64_t>(n, tag.size() - offset);
    std::memcpy(to, tag.data() + offset, count);
    return count;
  }, buffer.get(), meter));
  if (!options.quiet) out << latest << " " << tag.size() << "\n";
  meter.Finish();
  return Status::Ok();
}

}  // namespace reshard::fs
