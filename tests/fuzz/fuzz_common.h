// Shared by the libFuzzer harnesses: a scratch copy of a committed universal checkpoint in which one file at a
// time is replaced by the fuzzer's bytes, and the whole plan-and-read pipeline that `materialize` runs.
//
// Not thread-safe (libFuzzer runs one input at a time per process). Aborts, as a harness may, when its own
// set-up (the template checkpoint, the scratch folder) fails: that is no finding.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "reshard/plan/target_config.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::fuzz {

// A copy of `template_dir` (a folder holding latest_universal) under a fresh temporary folder. The template's
// bytes are read once and kept in memory, so restoring a replaced file costs one write, not a read of the
// source tree per input.
class ScratchCheckpoint {
 public:
  explicit ScratchCheckpoint(const std::string& template_dir);
  ~ScratchCheckpoint();
  ScratchCheckpoint(const ScratchCheckpoint&) = delete;
  ScratchCheckpoint& operator=(const ScratchCheckpoint&) = delete;

  const std::string& root() const { return root_; }
  // Every regular file of the copy, relative to root(), sorted.
  const std::vector<std::string>& files() const { return files_; }
  // Replaces files()[index] with `bytes`; Restore() puts the template's bytes back.
  void Replace(size_t index, const uint8_t* bytes, size_t size);
  void Restore();

 private:
  std::string template_dir_;
  std::string root_;
  std::vector<std::string> files_;
  std::vector<std::string> template_bytes_;  // parallel to files_
  size_t replaced_ = SIZE_MAX;
};

// `relative` (a path inside the source tree) as an absolute path.
std::string SourcePath(const std::string& relative);
// The committed checkpoints the harnesses start from.
std::string TinyUcp();
std::string Zero3Ucp();
std::string LlamaUcp();
// Native checkpoints real DeepSpeed saved: ZeRO-1 at DP 2, ZeRO-3 at DP 2, AutoTP TP 2 ZeRO-1
// (native/native_checkpoint.h).
std::string TinyNative();
std::string Zero3Native();
std::string LlamaNative();

// Opens `ucp`, resolves the target from `ds_config`, `overrides` and `model`, plans every file and reads every
// byte of it, as `reshardfs materialize` does; returns the first error. Any crash, leak or sanitizer report on
// the way is a finding. A target of more than `max_ranks` TP x DP ranks is resolved but not planned: a valid
// config may ask for 10^6 ranks, and planning them is slow, not wrong (the harness's bound, not the reader's).
Status PlanAndReadAll(const std::string& ucp, const nlohmann::ordered_json& ds_config,
                      const plan::TargetOverrides& overrides, const plan::ModelConfig& model = {},
                      int64_t max_ranks = 16);
// The same over a checkpoint opened once (harnesses that vary only the target).
Status PlanAndReadAll(const ucp::UniversalCheckpoint& checkpoint, const nlohmann::ordered_json& ds_config,
                      const plan::TargetOverrides& overrides, const plan::ModelConfig& model = {},
                      int64_t max_ranks = 16);

}  // namespace reshard::fuzz
