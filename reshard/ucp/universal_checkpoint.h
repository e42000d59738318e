// UniversalCheckpoint: a DeepSpeed universal checkpoint (UCP) folder, opened and indexed without
// loading tensor data. This is the one logical source the planner reads: Open() indexes a UCP
// folder that ds_to_universal wrote; native::OpenNativeCheckpoint (reshard/native/) indexes a
// native checkpoint as the UCP ds_to_universal *would* write for it (the same parameters, order,
// shapes, categories and optimizer state, each state a view over the native files' fragments),
// so no slicing rule is written twice. native::OpenCheckpointSource takes either and tells them
// apart.
//
// A UCP is what `ds_to_universal` writes (deepspeed_universal.md §1):
//   <tag>/zero/<param>/{fp32,exp_avg,exp_avg_sq[,step]}.pt   one folder per parameter (param_state.h)
//   <tag>/zero/optimizer_state.pt                            common optimizer state
//   <tag>/mp_rank_XX_model_states.pt                         stage <= 2: one per source TP rank
//   <tag>/zero_pp_rank_D_mp_rank_XX_model_states.pt          stage 3: one per source (DP, TP) rank
//   <parent>/latest_universal                                the tag's name
// Open() indexes all of it: every state file's location (never its data), the parsed
// universal_checkpoint_info, the source layout, and the optimizer_state.pt and model-states
// files as TorchArchives whose inert pickle trees the planner re-emits (param_groups, loss
// scaler, lr_scheduler, global_steps, client state, buffers, ds_config, ...).
//
// Parameter order: the source flat order, i.e. the order of `param_shapes` in the source TP rank
// 0 model-states file (one OrderedDict per param group for stage <= 2, per ZeRO-3 sub-group for
// stage 3), group after group. Then every zero/ folder that `param_shapes` does not list (the
// converter's fp32-only folders for frozen params, buffers and tied aliases), sorted by name
// (bytewise), with listed == false and source_group == -1.
//
// Errors (one Status, the message starts with the path it concerns):
//   kInvalidArgument  `path` is not a UCP: neither a zero/ folder nor a latest_universal file;
//                     no model-states file next to zero/
//   kNotFound         latest_universal names a folder that does not exist (or is empty); no
//                     zero/optimizer_state.pt; a parameter in param_shapes has no zero/ folder;
//                     everything IndexParamFolder returns as kNotFound (no fp32.pt)
//   kUnsupported      universal_checkpoint_version > 0.4; an unknown universal_checkpoint_info
//                     key; an affine_map that is not a plain split (checkpoint_info.h); autotp_unsupported_parameter_patterns non-empty;
//                     pipeline parallelism (pp_degree > 1); and IndexParamFolder's refusals
//                     (unknown state-dict key, non-contiguous tensor, ...)
//   kCorrupt          inconsistent layout metadata: a zero_stage that disagrees with the kind of
//                     model-states files, a missing (tp, dp) file, tp/dp degrees that disagree
//                     with the file count, malformed param_shapes or param_groups, a parameter
//                     listed twice or not on every TP rank, a TP=1 fp32.pt whose element count
//                     is not what param_shapes records (vocab and expert params excepted),
//                     state files that disagree
//   plus whatever format::TorchArchive::Open refuses in any file.
//
// Ownership and threads: the object owns its archives (read-only mappings) and is immutable
// after Open(); const access from several threads is safe. Movable, not copyable. The source
// files must not change while it is used (reads of changed files are the reader's problem:
// offsets here were valid when indexed). Public header: C++17.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/pickle_value.h"
#include "reshard/format/torch_archive.h"
#include "reshard/ucp/checkpoint_info.h"
#include "reshard/ucp/param_state.h"

namespace reshard::native {
class NativeReader;
}

namespace reshard::ucp {

// One copied model-states file of the source run.
struct ModelStatesFile {
  std::string name;  // file name, e.g. "mp_rank_00_model_states.pt"
  int32_t tp_rank = 0;
  int32_t dp_rank = -1;  // stage 3 files only (zero_pp_rank_<dp>_...); -1 for mp_rank_XX files
  format::TorchArchive archive;
};

// One optimizer param group of zero/optimizer_state.pt's top-level `param_groups`.
struct ParamGroup {
  format::NodeId node = format::kNoNode;  // the hyper-parameter dict (lr, betas, eps, ...), inert
  // Its `params` list: parameter indices within the group's flat buffer for stage <= 2 (DeepSpeed
  // writes [g]), ZeRO-3 sub-group ids for stage 3.
  std::vector<int64_t> params;
};

class UniversalCheckpoint {
 public:
  // `path`: the tag folder (…/global_step3_universal, the one holding zero/) or its parent that
  // holds `latest_universal` (read like DeepSpeed does: whitespace-stripped folder name).
  static Result<UniversalCheckpoint> Open(const std::string& path);

  // True when this index was built from a native checkpoint (reshard/native/).
  bool native() const { return native_; }

  UniversalCheckpoint(UniversalCheckpoint&&) = default;
  UniversalCheckpoint& operator=(UniversalCheckpoint&&) = default;
  UniversalCheckpoint(const UniversalCheckpoint&) = delete;
  UniversalCheckpoint& operator=(const UniversalCheckpoint&) = delete;

  // ---- where ----
  const std::string& dir() const { return dir_; }  // the tag folder, as built from `path`
  const std::string& tag() const { return tag_; }  // its last path component

  // ---- parameters ----
  // In source flat order, then unlisted folders (see the file comment).
  const std::vector<ParamEntry>& params() const { return params_; }
  // The entry named `name`, or nullptr. O(1) on average.
  const ParamEntry* FindParam(std::string_view name) const;
  // Number of groups in `param_shapes` (param groups for stage <= 2, sub-groups for stage 3).
  int32_t num_source_groups() const { return num_source_groups_; }

  // ---- source layout ----
  // `checkpoint_parallel_dimensions.tp_degree`, or the number of TP ranks among the files.
  int32_t tp_degree() const { return tp_degree_; }
  // Source DP world size: the model-states files' `dp_world_size` (checked against the file
  // grid for stage 3).
  int32_t dp_world_size() const { return dp_world_size_; }
  // optimizer_state.pt's `zero_stage` (int, or ZeroStageEnum by value or by name); 1 when absent
  // (BF16_Optimizer files have none; DeepSpeed's converter takes 1 as well).
  int32_t zero_stage() const { return zero_stage_; }
  bool zero_stage_recorded() const { return zero_stage_recorded_; }

  // ---- metadata ----
  // Parsed from the first model-states file (DeepSpeed's converter reads only that one).
  const UniversalCheckpointInfo& info() const { return info_; }
  // zero/optimizer_state.pt: loss scaler, clip_grad, ds_version, ... (stage 3: also
  // optimizer_state_dict with rank 0's state and fp32_flat_groups) as an inert tree.
  const format::TorchArchive& optimizer_state() const { return optimizer_state_; }
  // The dict in optimizer_state()'s tree that holds what zero/optimizer_state.pt holds: its root
  // for a UCP; the rank-0 optimizer file's `optimizer_state_dict` for a native source (the keys
  // the converter copies from there are read in place; those it drops are never looked up).
  format::NodeId optimizer_state_root() const { return optimizer_state_root_; }
  const std::vector<ParamGroup>& param_groups() const { return param_groups_; }
  // Stage <= 2: mp_rank files ordered by TP rank. Stage 3: ordered by (tp_rank, dp_rank).
  const std::vector<ModelStatesFile>& model_states() const { return model_states_; }
  // The model-states file of source TP rank `tp_rank` (for stage 3: its DP rank 0 file), or
  // nullptr when out of range.
  const ModelStatesFile* ModelStatesForTp(int32_t tp_rank) const;
  // The affine_map split whose pattern matches parameter `name` (the first, in map order), or
  // nullptr when the checkpoint has no affine_map or no pattern matches.
  const AffineSplit* FindAffineSplit(std::string_view name) const;

 private:
  friend class native::NativeReader;
  UniversalCheckpoint() = default;

  // The steps of Open(), in order; each fills the members it names and returns the first error.
  Status LoadOptimizerState(const std::string& optim_path);  // zero stage, param groups
  Status LoadModelStates();                                  // model_states_ and the rank grid (tp_degree_, stage-3 dp)
  Status LoadSourceLayout();                                 // tp_degree_, dp_world_size_, info_ from the first file
  Status IndexParams(const std::string& zero_dir);           // params_, num_source_groups_
  Status CheckParamGroups() const;
  Status MatchAffineSplits();  // affine_split_index_
  Status CheckStoredNumel(const ParamEntry& entry, const std::vector<int64_t>& recorded) const;

  std::string dir_;
  std::string tag_;
  std::vector<ParamEntry> params_;
  std::unordered_map<std::string, size_t> param_index_;  // name -> position in params_
  std::unordered_map<std::string, size_t> affine_split_index_;  // param name -> info_.affine_splits index
  int32_t num_source_groups_ = 0;
  int32_t tp_degree_ = 1;
  int32_t dp_world_size_ = 1;
  int32_t zero_stage_ = 1;
  bool zero_stage_recorded_ = false;
  UniversalCheckpointInfo info_;
  format::TorchArchive optimizer_state_;
  format::NodeId optimizer_state_root_ = format::kNoNode;
  bool native_ = false;
  std::vector<ParamGroup> param_groups_;
  std::vector<ModelStatesFile> model_states_;
};

}  // namespace reshard::ucp
