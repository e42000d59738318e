// TP partition: which elements of a universal tensor TP rank t of a TP=T target holds.
//
// This is the single implementation of DeepSpeed's tensor-parallel slicing rules for loading a
// universal checkpoint (deepspeed_universal.md §3.2, §3.3; DeepSpeed 0.19.8
// checkpoint/universal_checkpoint.py:load_hp_checkpoint_state, _resolve_autotp_partition,
// _narrow_sub_params, checkpoint/affine.py:ParamAffineMap.extract, and
// module_inject/tp_shard.py:get_shard_size). Everything here is a pure function of its
// arguments: no I/O, no global state.
//
// Input: the universal tensor's full shape (row-major, contiguous: zero/<name>/<state>.pt's
// `param`), its category (the keys stored beside `param`), optionally the AutoTP restore
// metadata of the TARGET parameter, and (T, t). Output: a TpSlice, the rank's local shape plus a
// view::GatherList that lists, in the row-major order of the local tensor, which universal
// elements (or zeros, for vocab padding) it consists of. SliceForRank(...).gather is exactly
// DeepSpeed's `tp_hp_slice` (flattened) for that state file; the ZeRO DP cut is applied later, by
// zero_partition, on top of it. AutoEP expert tensors are EP-sliced on dim 0 before these rules;
// that slice is the caller's (pass the expert-local shape, then rebase the gathers).
//
// Rule selection, in DeepSpeed's order:
//   1. AutoTP metadata present (`meta != nullptr`): unsupported_reason refuses; an affine map
//      that names rank t (and whose logical numel equals the tensor's) is applied; `replicated`
//      gives the whole tensor; partition_dim + logical_shape give the sub-parameter (per-rank
//      widths), partition_sizes (uneven) or even-chunk split. Otherwise fall through to 3,
//      WITHOUT the replicated shortcut and WITHOUT vocab padding (DeepSpeed disables both as soon
//      as the parameter carries metadata).
//   2. No metadata: replicated categories (see IsReplicatedCategory) are served whole; vocab
//      tensors are zero-padded at the end of dim 0 to `padded_vocab_rows` rows first.
//   3. Category rules: sub_param_shape (per-sub-parameter chunk), else param_n_sub_params > 1
//      (chunk each of the n parts), else chunk on cat_dim (default 0). Every split must divide
//      evenly: DeepSpeed asserts `full numel == T * local numel`, which holds on every rank only
//      for even splits (there is no uneven support outside AutoTP metadata).
//
// How "replicated" is recognised (decision). DeepSpeed compares the universal tensor's shape to
// the target parameter's shape (`F.shape == p.shape`) and, if equal, loads the whole tensor. The
// FUSE has no target model, so it decides from the checkpoint instead: a state dict with none of
// cat_dim / param_n_sub_params > 1 / sub_param_shape / vocab_tensor was written by the converter's
// replicated or averaged branch (every split branch writes one of those keys), so it is served
// whole at its full shape. That agrees with DeepSpeed whenever the target model is laid out like
// the source. Two consequences the caller must know:
//   - DeepSpeed 0.19.8's affine-map converter branch also writes no category keys. Such a
//     parameter is only restorable correctly through the target's AutoTP metadata; without it
//     this function (like DeepSpeed, when the shapes happen to match) serves it whole.
//   - The shape shortcut can also fire for a vocab tensor: when padded_vocab_rows == rows * T the
//     target's local shape equals the universal shape, and DeepSpeed then gives EVERY rank the
//     whole unpadded tensor. SliceForRank reproduces that.
//
// Units: every shape, size, width and offset is in ELEMENTS (of the tensor's dtype, which this
// layer never needs). Shapes are at most kMaxTensorDims dims, sizes are int64 >= 0, and all
// arithmetic is overflow-checked.
//
// Errors (never exceptions): kInvalidArgument for a request or metadata that cannot describe a
// split (T < 1, t out of range, "T=3 does not divide dim 0 of size 8 (cat_dim 0)", widths that do
// not sum to their sub-parameter, a dim out of range); kCorrupt for a category that contradicts
// the tensor (a sub_param_shape that does not view its numel); kUnsupported for inputs DeepSpeed
// itself refuses or that are not a pure gather (unsupported_reason, a scaled affine piece, a
// non-2-D vocab tensor, more than kMaxTensorDims dims); kOutOfRange for int64 overflow;
// kResourceExhausted when a slice would need more than kMaxGatherPieces gather pieces. Messages
// name the values involved. Stricter than DeepSpeed: partition_sizes must tile their dim and
// affine pieces must tile the shard exactly (DeepSpeed would load partial or uninitialised data),
// and an even split is checked for every rank (DeepSpeed asserts only on the failing ranks).
//
// Thread safety: all functions are pure and reentrant; the structs are plain values.
// Public header: C++17.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/view/gather.h"

namespace reshard::layout {

inline constexpr int kMaxTensorDims = 8;
// Largest TP degree accepted (bounds the per-rank vectors a caller can make us allocate).
inline constexpr int kMaxTpSize = 1 << 16;
// Largest GatherList (or affine run list) one slice may need. A split on dim d > 0 into several
// blocks needs one piece per block per row of the dims before d; this caps pathological shapes.
inline constexpr uint64_t kMaxGatherPieces = uint64_t{1} << 22;
// UNIVERSAL_CHECKPOINT_VERSION_VALUE of DeepSpeed 0.19.8; what AutoTP layers record.
inline constexpr double kAutoTpMetaVersion = 0.4;

// `SubparamShape` as pickled in `sub_param_shape` (a view spec of the FULL tensor). One entry per
// dim of the view: an entry with one value is an int (a size, or -1 = inferred from the numel; at
// most one -1, never at partition_dim); an entry with several values is a tuple whose sum is that
// dim's size. At partition_dim the entry's values are the sub-parameter sizes (an int there is a
// single sub-parameter spanning the dim). E.g. qkv [16, 4] with q/k/v = 8/4/4:
// {{{8, 4, 4}, {4}}, 0}.
struct SubParamShape {
  std::vector<std::vector<int64_t>> shape;
  int partition_dim = 0;  // may be negative (counts from the end, as torch does)
};

// The category keys of a `zero/<name>/<state>.pt` dict (deepspeed_universal.md §1.4).
struct UcpCategory {
  std::optional<int> cat_dim;                    // `cat_dim`; DeepSpeed's default is 0
  int64_t n_sub_params = 1;                      // `param_n_sub_params`; <= 1 means none
  std::optional<SubParamShape> sub_param_shape;  // `sub_param_shape`
  bool vocab_tensor = false;                     // `vocab_tensor`
};

// True for a category written by the converter's replicated / averaged branches: no cat_dim,
// n_sub_params <= 1, no sub_param_shape, not a vocab tensor. Such a tensor is served whole.
bool IsReplicatedCategory(const UcpCategory& category);

// One piece of checkpoint/affine.py:AffinePiece: `shape` elements read from the flat full tensor
// with torch.as_strided(source_offset, source_strides) and written to the flat shard with
// (dest_offset, dest_strides). `scale` != 1 multiplies values and so cannot be served as a gather.
struct AffinePiece {
  std::vector<int64_t> shape;
  int64_t source_offset = 0;
  std::vector<int64_t> source_strides;
  int64_t dest_offset = 0;
  std::vector<int64_t> dest_strides;
  double scale = 1.0;
};

struct AffineShard {
  std::vector<int64_t> shard_shape;  // the rank's local shape
  std::vector<AffinePiece> pieces;   // must tile [0, numel(shard_shape)) exactly, no overlap
};

// ParamAffineMap.to_dict(): conversion.affine_map of the TARGET parameter.
struct AffineMap {
  std::vector<int64_t> logical_shape;
  std::map<int, AffineShard> ranks;  // by TP rank; ranks not listed fall through (as DeepSpeed)
};

// The restore metadata AutoTP attaches to a TARGET parameter (`ds_autotp_universal_checkpoint_meta`,
// layers.py:_build_param_uc_restore_meta), computed for the target T. It is not in the checkpoint:
// the planner derives it from the model config (see GetShardSizeList / SubParamShardWidths).
struct AutoTpRestoreMeta {
  // `universal_checkpoint_version`. Below 0.4 the widths are ignored and every sub-parameter must
  // split evenly. DeepSpeed reads a missing key as 0.0; layers always write 0.4, hence the default.
  double version = kAutoTpMetaVersion;
  std::string unsupported_reason;                     // conversion.unsupported_reason; non-empty refuses
  std::optional<AffineMap> affine_map;                // conversion.affine_map; wins over everything below
  bool replicated = false;                            // whole tensor; partition_dim must then be unset
  std::optional<int> partition_dim;                   // unset (or logical_shape unset): category rules apply
  std::optional<std::vector<int64_t>> logical_shape;  // full shape viewed (one -1 allowed)
  // Physical sub-parameter sizes along partition_dim (`sub_param_sizes`); when unset, the entry
  // of `sub_param_shape` at partition_dim is used instead (a legacy count such as (3, -1) then
  // names a single size of 3 and is refused unless the dim is 3, exactly as DeepSpeed does).
  std::optional<std::vector<int64_t>> sub_param_sizes;
  std::optional<std::vector<std::vector<int64_t>>> sub_param_shape;
  std::vector<std::vector<int64_t>> sub_param_shard_widths;  // [sub-parameter][rank], version >= 0.4
  std::optional<std::vector<int64_t>> partition_sizes;       // [rank] along partition_dim
};

// A rank's TP-local tensor: its shape, and its elements in row-major order as gathers over the
// universal tensor (zero pieces for vocab padding). NumElements(gather) == prod(local_shape);
// pieces with no elements are never emitted, so a zero-width rank has an empty list.
struct TpSlice {
  std::vector<int64_t> local_shape;
  view::GatherList gather;
};

// The TP slice of rank `tp_rank` of a `tp_size`-way target for the universal tensor of shape
// `full_shape` and category `category`. `autotp_meta` is the target parameter's AutoTP restore
// metadata, or null when it has none. `padded_vocab_rows` is used only for a vocab tensor without
// metadata: the target's padded vocabulary size, i.e. local rows * tp_size (DeepSpeed derives it
// as `p.shape[0] * T`); it must be a multiple of tp_size and at least the stored rows. When unset
// the smallest such multiple is used (10 rows at T=4 -> 12; rows 10 and 11 read as zeros).
// The local shape is given in the coordinates of `full_shape` (the vocab-padded shape for a vocab
// tensor; the view's coordinates only when a sub_param_shape / logical_shape view of another rank
// cannot be mapped back onto one dim of `full_shape`).
Result<TpSlice> SliceForRank(const std::vector<int64_t>& full_shape, const UcpCategory& category,
                             const AutoTpRestoreMeta* autotp_meta, std::optional<int64_t> padded_vocab_rows,
                             int tp_size, int tp_rank);

// tp_shard.py:get_shard_size: how many of `total` units along a split dim rank `rank` of a
// `tp_size`-way AutoTP group holds. `num_kv_heads` and `tp_grain_size` are the model's
// AutoTPMeta fields (kv heads from the HF config; grain from `tensor_parallel.tp_grain_size`,
// 1 for training). `name` is the layer name AutoTP passes (empty = Python None); only substring
// tests on it matter: when num_kv_heads is set, divides total, and the name contains neither
// "mlp" nor any of gate_proj/up_proj/down_proj/w1/w2/w3 and is not exactly "lm_head" or
// "embed_out", the split follows kv-head boundaries (ranks may get 0); otherwise it is near-even
// in units of tp_grain_size, the remainder below one grain going to the last rank.
// kInvalidArgument for total < 0, tp_size outside [1, kMaxTpSize], rank outside [0, tp_size),
// num_kv_heads < 1 or tp_grain_size < 1.
Result<int64_t> GetShardSize(int64_t total, int tp_size, std::string_view name, int rank,
                             std::optional<int64_t> num_kv_heads, int64_t tp_grain_size = 1);

// tp_shard.py:get_shard_size_list: GetShardSize for ranks 0..tp_size-1 (they always sum to
// `total`; checked anyway, as DeepSpeed asserts it).
Result<std::vector<int64_t>> GetShardSizeList(int64_t total, int tp_size, std::string_view name,
                                              std::optional<int64_t> num_kv_heads, int64_t tp_grain_size = 1);

// layers.py:_subparam_shard_widths: GetShardSizeList of every sub-parameter size, i.e. the
// `sub_param_shard_widths` ([sub-parameter][rank]) an AutoTP sub-parameter layer records.
Result<std::vector<std::vector<int64_t>>> SubParamShardWidths(const std::vector<int64_t>& sizes, int tp_size,
                                                              std::string_view name,
                                                              std::optional<int64_t> num_kv_heads,
                                                              int64_t tp_grain_size = 1);

}  // namespace reshard::layout
