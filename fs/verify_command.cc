#include "fs/verify_command.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include <nlohmann/json.hpp>

#include "fs/served_checkpoint.h"
#include "reshard/base/unique_fd.h"
#include "reshard/format/safetensors_reader.h"
#include "reshard/format/torch_archive.h"
#include "reshard/native/native_checkpoint.h"
#include "reshard/ucp/source_check.h"

namespace reshard::fs {
namespace {

constexpr size_t kChunkBytes = size_t{8} << 20;

using ReadFn = std::function<Result<size_t>(uint64_t offset, uint8_t* out, size_t length)>;

struct FileCheck {
  std::string path;
  uint64_t size = 0;
  uint64_t tensors = 0;
  std::string problem;  // empty: read twice identically and parsed
};

// Where one served file is kept while it is checked: an anonymous memory file, emptied for each
// file, that the archive reader can map through /proc/self/fd like any file.
class ScratchFile {
 public:
  static Result<ScratchFile> Create() {
    UniqueFd fd(::memfd_create("reshardfs-verify", MFD_CLOEXEC));
    if (!fd.valid()) return ErrnoError("memfd_create", errno);
    return ScratchFile(std::move(fd));
  }
  int fd() const { return fd_.get(); }
  std::string path() const { return "/proc/self/fd/" + std::to_string(fd_.get()); }

 private:
  explicit ScratchFile(UniqueFd fd) : fd_(std::move(fd)) {}
  UniqueFd fd_;
};

Status WriteAt(int fd, const uint8_t* data, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t w = ::pwrite(fd, data, n, static_cast<off_t>(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) return ErrnoError("writing the verify scratch file", errno);
    data += w;
    n -= static_cast<size_t>(w);
    offset += static_cast<uint64_t>(w);
  }
  return Status::Ok();
}

Status ReadAt(int fd, uint8_t* out, size_t n, uint64_t offset) {
  while (n > 0) {
    const ssize_t r = ::pread(fd, out, n, static_cast<off_t>(offset));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return ErrnoError("reading the verify scratch file", r < 0 ? errno : EIO);
    out += r;
    n -= static_cast<size_t>(r);
    offset += static_cast<uint64_t>(r);
  }
  return Status::Ok();
}

// Reads the served file twice, the first copy into `scratch`. A Status error only when the
// scratch file fails; a problem with the served bytes is the returned string (empty: none).
Result<std::string> ReadTwice(const ReadFn& read, uint64_t size, const ScratchFile& scratch, uint8_t* first,
                              uint8_t* second) {
  if (::ftruncate(scratch.fd(), 0) != 0) return ErrnoError("emptying the verify scratch file", errno);
  for (uint64_t offset = 0; offset < size;) {
    const Result<size_t> n = read(offset, first, kChunkBytes);
    if (!n.ok()) return "first read at offset " + std::to_string(offset) + ": " + n.status().message();
    if (*n == 0) return "first read ends at " + std::to_string(offset) + " of " + std::to_string(size) + " bytes";
    RS_RETURN_IF_ERROR(WriteAt(scratch.fd(), first, *n, offset));
    offset += *n;
  }
  for (uint64_t offset = 0; offset < size;) {
    const Result<size_t> n = read(offset, second, kChunkBytes);
    if (!n.ok()) return "second read at offset " + std::to_string(offset) + ": " + n.status().message();
    if (*n == 0) return "second read ends at " + std::to_string(offset) + " of " + std::to_string(size) + " bytes";
    RS_RETURN_IF_ERROR(ReadAt(scratch.fd(), first, *n, offset));
    if (std::memcmp(first, second, *n) != 0) {
      return "two reads differ in bytes [" + std::to_string(offset) + ", +" + std::to_string(*n) + ")";
    }
    offset += *n;
  }
  return std::string();
}

// The reader's message names the scratch file; the user knows the served path.
std::string Rename(std::string message, const std::string& scratch_path, const std::string& path) {
  for (size_t at = message.find(scratch_path); at != std::string::npos; at = message.find(scratch_path, at)) {
    message.replace(at, scratch_path.size(), path);
    at += path.size();
  }
  return message;
}

Result<FileCheck> CheckTorchFile(const plan::PlannedFile& file, const plan::SourceFiles& sources,
                                 const ScratchFile& scratch, uint8_t* first, uint8_t* second) {
  FileCheck check{file.path(), file.size(), 0, {}};
  const ReadFn read = [&](uint64_t offset, uint8_t* out, size_t n) { return file.Read(sources, offset, out, n); };
  RS_ASSIGN_OR_RETURN(check.problem, ReadTwice(read, file.size(), scratch, first, second));
  if (!check.problem.empty()) return check;
  const Result<format::TorchArchive> archive = format::TorchArchive::Open(scratch.path());
  if (!archive.ok()) {
    check.problem = Rename(archive.status().message(), scratch.path(), file.path());
  } else {
    check.tensors = archive->tensors().size();
  }
  return check;
}

Result<FileCheck> CheckSafetensorsFile(const plan::SafetensorsView& view, const std::string& path,
                                       const plan::PlannedFile& file, const plan::SourceFiles& sources,
                                       const ScratchFile& scratch, uint8_t* first, uint8_t* second) {
  FileCheck check{path, view.size(), 0, {}};
  const ReadFn read = [&](uint64_t offset, uint8_t* out, size_t n) {
    return view.Read(file.storages(), sources, offset, out, n);
  };
  RS_ASSIGN_OR_RETURN(check.problem, ReadTwice(read, view.size(), scratch, first, second));
  if (!check.problem.empty()) return check;
  std::string prefix(std::min<uint64_t>(8, view.size()), '\0');
  RS_RETURN_IF_ERROR(ReadAt(scratch.fd(), reinterpret_cast<uint8_t*>(prefix.data()), prefix.size(), 0));
  const Result<uint64_t> length = format::SafetensorsHeaderLength(prefix);
  if (length.ok() && *length <= view.size() - 8) {
    prefix.resize(8 + *length);
    RS_RETURN_IF_ERROR(ReadAt(scratch.fd(), reinterpret_cast<uint8_t*>(prefix.data()) + 8, *length, 8));
  }
  const Result<format::SafetensorsHeader> header = format::ParseSafetensorsHeader(prefix, view.size());
  if (!header.ok()) {
    check.problem = header.status().message();
  } else {
    check.tensors = header->tensors.size();
  }
  return check;
}

std::string TargetLine(const plan::Target& t) {
  return "tp " + std::to_string(t.tp_size) + ", dp " + std::to_string(t.dp_size) + ", ZeRO stage " +
         std::to_string(t.zero_stage) + ", lp " + std::string(format::TorchName(t.lp_dtype)) + ", tag " + t.tag;
}

void PrintText(const nlohmann::json& doc, const std::optional<ucp::SourceReport>& source,
               const std::vector<FileCheck>& files, std::ostream& out) {
  char line[1024];
  out << "source: " << doc["source"].get<std::string>() << "\n";
  if (source) {
    std::snprintf(line, sizeof line, "  parameters: %llu (%llu trained, %llu fp32 only)\n",
                  static_cast<unsigned long long>(source->params), static_cast<unsigned long long>(source->listed_params),
                  static_cast<unsigned long long>(source->params - source->listed_params));
    out << line;
    std::snprintf(line, sizeof line, "  %-14s %8s %14s %16s %11s\n", "state", "tensors", "elements", "bytes",
                  "non-finite");
    out << line;
    for (const auto& [key, s] : source->states) {
      std::snprintf(line, sizeof line, "  %-14s %8llu %14llu %16llu %11llu\n", key.c_str(),
                    static_cast<unsigned long long>(s.tensors), static_cast<unsigned long long>(s.elements),
                    static_cast<unsigned long long>(s.bytes), static_cast<unsigned long long>(s.non_finite));
      out << line;
    }
  }
  if (doc.contains("target")) {
    out << "target: " << doc["target"].get<std::string>() << "\n";
    int width = 26;
    for (const FileCheck& f : files) width = std::max(width, static_cast<int>(f.path.size()));
    if (!files.empty()) {
      std::snprintf(line, sizeof line, "  %-*s %14s %8s  %s\n", width, "file (read twice, parsed)", "bytes", "tensors",
                    "result");
      out << line;
    }
    for (const FileCheck& f : files) {
      std::snprintf(line, sizeof line, "  %-*s %14llu %8llu  %s\n", width, f.path.c_str(),
                    static_cast<unsigned long long>(f.size), static_cast<unsigned long long>(f.tensors),
                    f.problem.empty() ? "ok" : "PROBLEM");
      out << line;
    }
  }
  const auto& problems = doc["problems"];
  if (problems.empty()) {
    out << "problems: none\n";
    return;
  }
  out << "problems: " << problems.size() << "\n";
  for (const auto& p : problems) out << "  - " << p.get<std::string>() << "\n";
}

}  // namespace

Status RunVerify(const VerifyOptions& options, std::ostream& out) {
  nlohmann::json doc;
  doc["source"] = options.source;
  doc["problems"] = nlohmann::json::array();
  std::optional<ucp::SourceReport> source;
  std::vector<FileCheck> files;

  // One Open of the source serves both halves: the target is planned from the same index.
  std::shared_ptr<const ucp::UniversalCheckpoint> checkpoint;
  if (Result<ucp::UniversalCheckpoint> opened = native::OpenCheckpointSource(options.source); opened.ok()) {
    checkpoint = std::make_shared<const ucp::UniversalCheckpoint>(std::move(*opened));
  } else {
    doc["problems"].push_back(opened.status().message());
  }
  std::optional<ServedCheckpoint> served;
  if (checkpoint != nullptr && AnyTargetFlag(options.target)) {
    if (Result<ServedCheckpoint> planned = ServedCheckpoint::Plan(checkpoint, options.target); planned.ok()) {
      served.emplace(std::move(*planned));
    } else {
      doc["problems"].push_back(planned.status().message());
    }
  }

  if (checkpoint != nullptr) {
    doc["source"] = checkpoint->dir();
    RS_ASSIGN_OR_RETURN(ucp::SourceReport report, ucp::CheckSource(*checkpoint));
    nlohmann::json states = nlohmann::json::object();
    for (const auto& [key, s] : report.states) {
      states[key] = {{"tensors", s.tensors}, {"elements", s.elements}, {"bytes", s.bytes}, {"non_finite", s.non_finite}};
    }
    doc["parameters"] = {{"total", report.params}, {"trained", report.listed_params}};
    doc["states"] = std::move(states);
    for (const std::string& p : report.problems) doc["problems"].push_back(p);
    source = std::move(report);
  }

  if (served) {
    doc["target"] = TargetLine(served->target());
    RS_ASSIGN_OR_RETURN(ScratchFile scratch, ScratchFile::Create());
    auto first = std::make_unique<uint8_t[]>(kChunkBytes);
    auto second = std::make_unique<uint8_t[]>(kChunkBytes);
    for (size_t i = 0; i < served->files().size(); ++i) {
      const plan::PlannedFile& file = served->files()[i];
      RS_ASSIGN_OR_RETURN(FileCheck torch, CheckTorchFile(file, served->sources(), scratch, first.get(), second.get()));
      files.push_back(std::move(torch));
      RS_ASSIGN_OR_RETURN(FileCheck view, CheckSafetensorsFile(served->views()[i], served->view_paths()[i], file,
                                                               served->sources(), scratch, first.get(), second.get()));
      files.push_back(std::move(view));
    }
    for (const FileCheck& f : files) {
      doc["files"].push_back({{"path", f.path}, {"size", f.size}, {"tensors", f.tensors}, {"ok", f.problem.empty()}});
      if (!f.problem.empty()) doc["problems"].push_back(f.path + ": " + f.problem);
    }
  }

  if (options.json) {
    out << doc.dump(2) << "\n";
  } else {
    PrintText(doc, source, files, out);
  }
  const size_t problems = doc["problems"].size();
  if (problems == 0) return Status::Ok();
  return Corrupt("verify found " + std::to_string(problems) + (problems == 1 ? " problem" : " problems") +
                 " in " + doc["source"].get<std::string>() + " (listed above)");
}

}  // namespace reshard::fs
