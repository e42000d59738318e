#include "fs/materialize_command.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <filesystem>
#include <memory>

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

Status WriteFile(const std::string& path, const ServedCheckpoint& served, const plan::PlannedFile& file,
                 uint8_t* buffer) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoError(path, errno);
  for (uint64_t offset = 0; offset < file.size();) {
    RS_ASSIGN_OR_RETURN(size_t n, file.Read(served.sources(), offset, buffer, kChunkBytes));
    RS_RETURN_IF_ERROR(WriteWhole(fd.get(), buffer, n, path));
    offset += n;
  }
  return Status::Ok();
}

}  // namespace

Status RunMaterialize(const MaterializeOptions& options, std::ostream& out) {
  namespace stdfs = std::filesystem;
  std::error_code ec;
  if (stdfs::exists(options.out_dir, ec) && !stdfs::is_empty(options.out_dir, ec)) {
    return InvalidArgument(options.out_dir + ": exists and is not an empty folder");
  }
  RS_ASSIGN_OR_RETURN(ServedCheckpoint served, ServedCheckpoint::Load(options.source, options.target));
  const stdfs::path root(options.out_dir);
  stdfs::create_directories(root / served.tag(), ec);
  if (ec) return IoError((root / served.tag()).string() + ": " + ec.message());
  auto buffer = std::make_unique<uint8_t[]>(kChunkBytes);
  for (const plan::PlannedFile& file : served.files()) {
    const std::string path = (root / file.path()).string();
    RS_RETURN_IF_ERROR(WriteFile(path, served, file, buffer.get()));
    out << path << " " << file.size() << "\n";
  }
  const std::string latest = (root / "latest").string();
  UniqueFd fd(::open(latest.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644));
  if (!fd.valid()) return ErrnoError(latest, errno);
  RS_RETURN_IF_ERROR(WriteWhole(fd.get(), reinterpret_cast<const uint8_t*>(served.tag().data()), served.tag().size(), latest));
  out << latest << " " << served.tag().size() << "\n";
  return Status::Ok();
}

}  // namespace reshard::fs
