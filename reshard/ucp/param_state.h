// ParamEntry: one parameter folder zero/<name>/ of a universal checkpoint, indexed without
// loading tensor data.
//
// DeepSpeed's ds_to_universal writes, per trainable parameter, `fp32.pt`, `exp_avg.pt`,
// `exp_avg_sq.pt` and (stage <= 2 only) `step.pt` (deepspeed_universal.md §1.4). A state file is
// either a dict {'param': full tensor, <category keys>} or, on the ZeRO-3 TP=1 path, a bare
// flattened 1-D tensor. IndexParamFolder opens every state file with format::TorchArchive,
// reads its pickle and records, for each tensor, the file and the absolute byte offset of its
// element 0: the tensor bytes are [data_offset, data_offset + nbytes) in C order, little
// endian. Only the 4 or 8 bytes of a 0-d `step` tensor are read (its value); no other tensor
// data is touched, and no mapping is kept once the folder is indexed.
//
// Which files are states: DeepSpeed's ZeRO-1/2 loader (universal_checkpoint.py
// load_hp_checkpoint_state) takes every directory entry that `re.search(r'(.+).pt', name)`
// matches as the state `<group 1>` and loads `<group 1>.pt`; `step` is the step, every other key
// an optimizer state. This index does the same: a regular file `<key>.pt` is the state `<key>`;
// an entry the regex ignores (no "pt" after the first character) is ignored; an entry the regex
// matches that is not itself a regular `<key>.pt` file (`fc1.pt.bak` without `fc1.pt`,
// `receipt`, a folder `x.pt`) is refused, because DeepSpeed's loader would crash on it. The
// ZeRO-3 loader reads only fp32/exp_avg/exp_avg_sq; the planner picks the states it needs.
//
// Errors (each message starts with the file or folder path):
//   kNotFound     no fp32.pt; the folder cannot be opened
//   kIoError      the folder opens but cannot be listed (getdents64 fails)
//   kUnsupported  an unknown key in a state dict (or `folding`, AutoEP+AutoTP metadata); a
//                 tensor that is not contiguous; a dtype other than float32/bfloat16/float16/
//                 float64; a `step` that is neither an int nor a 0-d float32/float64 tensor
//   kCorrupt      a state that is neither a dict with a 'param' tensor nor a tensor; category
//                 values of the wrong type or out of range; state files of one parameter that
//                 disagree on their format (dict vs bare), shape or category keys; an entry
//                 DeepSpeed's loader would misread (see above)
//   anything format::TorchArchive::Open refuses.
// Thread safety: IndexParamFolder has no shared state; concurrent calls are safe. The structs
// are plain values. Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/format/torch_archive.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/ucp/checkpoint_info.h"

namespace reshard::ucp {

// A contiguous run of a state tensor's elements inside one file.
struct TensorPiece {
  std::string path;
  uint64_t data_offset = 0;  // absolute byte offset of the run's first element
  uint64_t numel = 0;        // elements in the run, > 0
};

// One state tensor of a parameter, in C order: stored whole in one file (a universal
// checkpoint's state file: `path`/`data_offset`), or, for a native source, the concatenation of
// `pieces` (the parameter's fragments of the DP ranks' flat partitions, in rank order), or, for a
// native source's TP-averaged parameter, `computed` bytes held in memory.
struct StateTensor {
  std::string path;          // the .pt file, as built from the path given to Open (native: the first piece's;
                             // computed: a description of what it was computed from, not a file)
  uint64_t data_offset = 0;  // absolute byte offset of element 0 in `path` (computed: in `computed`, 0)
  format::DType dtype = format::DType::kFloat32;
  std::vector<int64_t> shape;  // elements per dimension; contiguous (C order), checked
  uint64_t nbytes = 0;         // numel * itemsize, checked against the storage record
  bool requires_grad = false;  // as pickled (fp32 masters carry True); re-emitted by the universal view
  // Empty: the tensor is [data_offset, data_offset + nbytes) of `path`. Otherwise its elements
  // are these runs in order; their numel sum to numel() (checked by the reader that built them).
  std::vector<TensorPiece> pieces;
  // Set: the tensor's nbytes bytes, computed when the source was opened (the mean of a native
  // source's TP slices, as ds_to_universal computes it); `pieces` is then empty. Shared and
  // immutable: every plan made from the tensor keeps it alive.
  std::shared_ptr<const std::string> computed;

  uint64_t numel() const;  // product of `shape` (1 for a 0-d tensor); overflow ruled out when indexed
};

// Where the bytes of the contiguous tensor `t` of `archive` live in its file. Errors: a
// non-contiguous view or a dtype other than float32/bfloat16/float16/float64 (kUnsupported), a
// tensor past the end of the file (kCorrupt).
Result<StateTensor> LocateTensor(const format::TorchArchive& archive, const format::TensorRef& t);

// The optimizer step stored in step.pt: a Python int (DeepSpeed FusedAdam, DeepSpeedCPUAdam)
// or a 0-d float tensor (torch.optim.Adam/AdamW).
struct Step {
  bool is_tensor = false;
  int64_t int_value = 0;  // when !is_tensor
  double value = 0.0;     // the step as a number: int_value, or the tensor's one element
  StateTensor tensor;     // when is_tensor: float32 (4 bytes) or float64 (8 bytes), shape {}
};

// The step `node` of `archive` holds: an int, or a 0-d float32/float64 tensor (its value read
// from the file). kUnsupported for anything else; messages start with the archive's path.
Result<Step> ParseStep(const format::TorchArchive& archive, format::NodeId node);

// The category keys of a dict-format state file (§1.4 and §2.3 of the reference), as written.
// All unset for bare tensors. Equal across the states of one parameter (checked).
struct ParamCategories {
  std::optional<int64_t> cat_dim;             // 0 <= cat_dim < rank of `param`
  std::optional<int64_t> param_n_sub_params;  // >= 1 (DeepSpeed writes 2)
  std::optional<SubparamShape> sub_param_shape;
  std::optional<bool> vocab_tensor;
  std::optional<bool> is_expert_param;
  std::optional<int64_t> ep_num_experts;  // >= 1

  bool operator==(const ParamCategories& o) const {
    return cat_dim == o.cat_dim && param_n_sub_params == o.param_n_sub_params && sub_param_shape == o.sub_param_shape &&
           vocab_tensor == o.vocab_tensor && is_expert_param == o.is_expert_param && ep_num_experts == o.ep_num_experts;
  }
  bool operator!=(const ParamCategories& o) const { return !(*this == o); }
};

struct ParamEntry {
  std::string name;  // the folder name under zero/ (DeepSpeed's parameter name, verbatim)
  std::string dir;   // the folder path
  // Shape of `param` in fp32.pt; for bare tensors their stored shape (1-D: their length; the
  // logical shape is in tp_shapes).
  std::vector<int64_t> full_shape;
  bool bare_tensor = false;  // ZeRO-3 TP=1 conversion: bare tensors, not dicts
  ParamCategories categories;
  // Every state file but step.pt, by key: "fp32" (always), "exp_avg", "exp_avg_sq", and any
  // other `<key>.pt` DeepSpeed's ZeRO-1/2 loader would take as an optimizer state.
  std::map<std::string, StateTensor> states;
  std::optional<Step> step;  // step.pt; absent on the ZeRO-3 path

  // ---- where the source run kept it (filled by UniversalCheckpoint::Open) ----
  // True when the parameter is listed in the model-states files' `param_shapes`; false for a
  // folder the converter added for a module entry without optimizer state (a frozen param, a
  // buffer, a tied alias: fp32.pt only).
  bool listed = false;
  // Index into `param_shapes`: the param group (stage <= 2) or ZeRO-3 sub-group; -1 if unlisted.
  int32_t source_group = -1;
  // Per source TP rank, the TP-local shape `param_shapes` records; empty when unlisted.
  std::vector<std::vector<int64_t>> tp_shapes;
};

// Indexes the parameter folder `dir` (…/zero/<name>). Fills everything above the "where the
// source run kept it" block. Errors: see the file comment.
Result<ParamEntry> IndexParamFolder(const std::string& dir, const std::string& name);
// The same for the folder open as `dir_fd` (O_RDONLY | O_DIRECTORY; the caller keeps it, and it is
// listed from its current position, so a fresh descriptor): its files are opened relative to it,
// `dir` names them in messages and in the StateTensor paths.
Result<ParamEntry> IndexParamFolder(int dir_fd, const std::string& dir, const std::string& name);

// The state key DeepSpeed's loader derives from a directory entry name: the group of
// `re.search(r'(.+).pt', name)` (greedy, from the first character), or std::nullopt when the
// regex does not match. "fp32.pt" -> "fp32", "a.pt.bak" -> "a", "receipt" -> "rece", "x" -> none.
std::optional<std::string> DeepSpeedStateKey(const std::string& entry_name);

}  // namespace reshard::ucp
