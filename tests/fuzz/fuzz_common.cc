#include "tests/fuzz/fuzz_common.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "reshard/native/native_checkpoint.h"
#include "reshard/plan/checkpoint_plan.h"
#include "reshard/plan/planned_file.h"
#include "reshard/plan/source_files.h"

namespace reshard::fuzz {
namespace fs = std::filesystem;

namespace {

[[noreturn]] void Die(const std::string& what) {
  std::fprintf(stderr, "fuzz harness set-up failed: %s\n", what.c_str());
  std::abort();
}

void WriteFile(const fs::path& path, const char* bytes, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes, static_cast<std::streamsize>(size));
  if (!out) Die("cannot write " + path.string());
}

std::string ReadFile(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes(fs::file_size(path), '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!in) Die("cannot read " + path.string());
  return bytes;
}

}  // namespace

ScratchCheckpoint::ScratchCheckpoint(const std::string& template_dir) : template_dir_(template_dir) {
  // /dev/shm when there is one: every input rewrites a file, and a disk would make that the bottleneck.
  std::string base = fs::is_directory("/dev/shm") ? "/dev/shm" : fs::temp_directory_path().string();
  std::string pattern = base + "/reshardfs-fuzz-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) Die("mkdtemp " + pattern);
  root_ = pattern;
  std::error_code error;
  fs::copy(template_dir_, root_, fs::copy_options::recursive, error);
  if (error) Die("copy " + template_dir_ + ": " + error.message());
  for (const auto& entry : fs::recursive_directory_iterator(root_)) {
    if (entry.is_regular_file()) files_.push_back(fs::relative(entry.path(), root_).string());
  }
  std::sort(files_.begin(), files_.end());
  if (files_.empty()) Die(template_dir_ + " holds no files");
  for (const std::string& name : files_) template_bytes_.push_back(ReadFile(fs::path(template_dir_) / name));
}

ScratchCheckpoint::~ScratchCheckpoint() {
  std::error_code ignored;
  fs::remove_all(root_, ignored);
}

void ScratchCheckpoint::Replace(size_t index, const uint8_t* bytes, size_t size) {
  Restore();
  replaced_ = index % files_.size();
  WriteFile(fs::path(root_) / files_[replaced_], reinterpret_cast<const char*>(bytes), size);
}

void ScratchCheckpoint::Restore() {
  if (replaced_ == SIZE_MAX) return;
  const std::string& bytes = template_bytes_[replaced_];
  WriteFile(fs::path(root_) / files_[replaced_], bytes.data(), bytes.size());
  replaced_ = SIZE_MAX;
}

std::string SourcePath(const std::string& relative) { return RESHARDFS_SOURCE_DIR "/" + relative; }
std::string TinyUcp() { return SourcePath("examples/tiny/universal"); }
std::string Zero3Ucp() { return SourcePath("tests/fixtures/tiny_zero3/universal"); }
std::string LlamaUcp() { return SourcePath("examples/tiny_llama_tp2/universal"); }
std::string TinyNative() { return SourcePath("examples/tiny/native"); }
std::string Zero3Native() {
  return SourcePath("tests/goldens/load_universal-tiny_zero3-z3-dp2-fp32/native_resaved");
}
std::string LlamaNative() { return SourcePath("examples/tiny_llama_tp2/native"); }

Status PlanAndReadAll(const std::string& ucp, const nlohmann::ordered_json& ds_config,
                      const plan::TargetOverrides& overrides, const plan::ModelConfig& model, int64_t max_ranks) {
  RS_ASSIGN_OR_RETURN(ucp::UniversalCheckpoint checkpoint, native::OpenCheckpointSource(ucp));
  return PlanAndReadAll(checkpoint, ds_config, overrides, model, max_ranks);
}

Status PlanAndReadAll(const ucp::UniversalCheckpoint& checkpoint, const nlohmann::ordered_json& ds_config,
                      const plan::TargetOverrides& overrides, const plan::ModelConfig& model, int64_t max_ranks) {
  RS_ASSIGN_OR_RETURN(plan::Target target, plan::ResolveTarget(checkpoint, ds_config, overrides, model));
  if (int64_t{target.tp_size} * target.dp_size > max_ranks) return Status::Ok();
  std::vector<plan::PlannedFile> files;
  auto lay_out = [&](size_t, plan::FilePlan f, const std::vector<plan::Source>& sources) -> Status {
    RS_ASSIGN_OR_RETURN(plan::PlannedFile file, plan::PlannedFile::Create(std::move(f), sources));
    files.push_back(std::move(file));
    return Status::Ok();
  };
  RS_ASSIGN_OR_RETURN(plan::CheckpointPlan planned, plan::PlanCheckpoint(checkpoint, target, lay_out));
  // A native source's universal view and the weights are planned files too: read them all.
  std::vector<plan::FilePlan> rest = std::move(planned.universal.files);
  if (planned.weights) rest.push_back(std::move(*planned.weights));
  for (plan::FilePlan& f : rest) RS_RETURN_IF_ERROR(lay_out(0, std::move(f), planned.sources));
  RS_ASSIGN_OR_RETURN(plan::SourceFiles sources, plan::SourceFiles::Open(planned.sources));
  std::vector<uint8_t> buffer(1 << 16);
  for (const plan::PlannedFile& file : files) {
    for (uint64_t offset = 0; offset < file.size();) {
      RS_ASSIGN_OR_RETURN(size_t n, file.Read(sources, offset, buffer.data(), buffer.size()));
      if (n == 0) std::abort();  // Read() promised min(length, size - offset) bytes
      offset += n;
    }
  }
  return Status::Ok();
}

}  // namespace reshard::fuzz
