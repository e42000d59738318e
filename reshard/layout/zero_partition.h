// ZeRO data-parallel cuts: the one implementation of how DeepSpeed splits an optimizer param
// group across D data-parallel ranks. Pure functions, no I/O; every size and offset is in
// ELEMENTS of the flattened TP-local tensors (the planner composes these numbers with TP
// gathers and multiplies by an item size once).
//
// Three wrappers, as DeepSpeed 0.19.8 builds them (sources read, and ground truth taken from the
// real constructors, see tests/unit/layout/zero_partition_test.cc):
//
//   ZeRO-1/2  runtime/zero/stage_1_and_2.py  DeepSpeedZeroOptimizer.__init__, _round_robin_reorder,
//             get_data_parallel_partitions, _link_all_hp_params, _create_param_mapping, state_dict
//   BF16      runtime/bf16_optimizer.py      BF16_Optimizer._setup_for_real_optimizer
//   ZeRO-3    runtime/zero/stage3.py         _get_trainable_parameter_groups,
//                                            _create_fp16_sub_groups
//             runtime/zero/partition_parameters.py  _partition_param, _padding_size
//
// Which params a wrapper owns: DeepSpeed's `is_optimized_parameter` keeps a param only when it
// requires grad AND has at least one element. Frozen and zero-element params are left out of the
// flat buffers, `param_shapes`, `param_slice_mappings` and `param_alignment_paddings` entirely
// (the engine saves them under `frozen_param_shapes` / `frozen_param_fragments`). The functions
// below apply that filter themselves, so callers pass every param of the optimizer param group.
//
// ZeRO-1/2 and BF16, per param group (N = sum of kept numels, D = dp_size, r = dp_rank):
//
//   flat_order   the kept params, reordered round robin when round_robin_gradients is on
//                (stable buckets by index % D, buckets 0..D-1 concatenated; ZeRO-1 and ZeRO-2)
//   flat buffer  concat(param, gap) over flat_order, where gap is the parameter_alignment padding
//                (0 unless zero_optimization.parameter_alignment; never after the last param),
//                then zeros up to padded_numel = ceil(content_numel / (2*D)) * (2*D)
//   partition    rank r owns flat[r*ps, (r+1)*ps), ps = padded_numel / D (all equal, even)
//   fragments    the pieces of params inside that window; a rank may hold only padding
//
// DeepSpeed also records a mapping (`param_slice_mappings`) that is NOT always the true layout:
// it walks the params in client (bit16) order and, unless some parameter_alignment gap is
// non-zero, assigns offsets by cumulative numel in THAT order. When round robin actually
// reorders (D > 1 and more than D params) those recorded offsets disagree with the buffer. Both
// views are returned: `fragments` (what the bytes are) and `recorded_fragments` (what the
// checkpoint says); serve bytes from the former and the `param_slice_mappings` key from the latter.
//
// Public header: C++17.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "reshard/base/status.h"

namespace reshard::layout {

// One parameter of an optimizer param group, in the group's (client) order.
struct FlatParam {
  std::string name;           // the engine's name for it (first alias in named_parameters())
  uint64_t numel = 0;         // TP-local element count (ds_numel / ds_shape under ZeRO-3)
  bool requires_grad = true;  // false: frozen, left out of every optimizer structure
};

// DeepSpeed's `is_optimized_parameter`: trainable and non-empty.
inline bool IsOptimized(const FlatParam& p) { return p.requires_grad && p.numel > 0; }

// --------------------------------------------------------------------------------------------
// ZeRO-1/2 (DeepSpeedZeroOptimizer) and BF16_Optimizer
// --------------------------------------------------------------------------------------------

enum class Zero12Flavor {
  kZeroOptimizer,  // zero_optimization.stage 1 or 2
  kBf16Optimizer,  // BF16_Optimizer (bf16, ZeRO stage 1, fp32 gradient accumulation): no round robin, no param alignment
};

struct Zero12Options {
  Zero12Flavor flavor = Zero12Flavor::kZeroOptimizer;
  // zero_optimization.round_robin_gradients (default false). Honoured for ZeRO-1 and ZeRO-2;
  // ignored for kBf16Optimizer, which has no such option.
  bool round_robin_gradients = false;
  // Elements each param start is aligned to inside the flat buffer: 1 when
  // zero_optimization.parameter_alignment is off (the default), else ParamAlignmentElems().
  // Ignored for kBf16Optimizer.
  uint64_t param_alignment_elems = 1;
  // nccl_start_alignment_factor; the flat buffer is padded to a multiple of factor * dp_size.
  // DeepSpeed hard-codes 2.
  uint64_t nccl_start_alignment_factor = 2;
};

// The parameter_alignment unit DeepSpeed derives from the lp dtype's item size:
// 16 / gcd(16, lp_itemsize) elements (8 for fp16/bf16, 4 for fp32), or 1 when `enabled` is false.
// Precondition: lp_itemsize > 0.
uint64_t ParamAlignmentElems(bool enabled, uint64_t lp_itemsize);

// A piece of one parameter that lies in one rank's partition.
struct Fragment {
  size_t param = 0;       // index into the `params` vector passed in
  uint64_t lp_start = 0;  // offset inside the param's flattened TP-local tensor
  uint64_t hp_start = 0;  // offset inside the rank's partition
  uint64_t numel = 0;     // > 0

  bool operator==(const Fragment& o) const {
    return param == o.param && lp_start == o.lp_start && hp_start == o.hp_start && numel == o.numel;
  }
};

struct Zero12Partition {
  uint64_t group_numel = 0;      // N: sum of the kept params' numel
  uint64_t content_numel = 0;    // N plus the parameter_alignment gaps (== N by default)
  uint64_t padded_numel = 0;     // Npad: flat buffer length, a multiple of factor * dp_size
  uint64_t partition_numel = 0;  // ps = Npad / D; every rank's fp32 partition and state length
  uint64_t partition_start = 0;  // r * ps, offset of this rank's window in the flat buffer

  // `group_paddings[i]` as this rank's optimizer file records it.
  //   ZeRO-1/2: the tail of the window past content_numel, clamped to [0, ps]
  //             (ps - group_padding is the "lean" length of single_partition_of_fp32_groups).
  //   BF16:     padded_numel - N on the last rank, 0 on every other rank, even when the
  //             padding spans several partitions.
  uint64_t group_padding = 0;

  // Kept param indices in flat-buffer order (== `param_shapes` order in the model states file),
  // with each one's offset in the flat buffer and the parameter_alignment gap that follows it.
  // `param_alignment_gaps` is the group's entry of the `param_alignment_paddings` key that
  // ZeRO-1/2 files carry since 0.19.8: all zeros by default (BF16 files have no such key).
  std::vector<size_t> flat_order;
  std::vector<uint64_t> flat_offsets;
  std::vector<uint64_t> param_alignment_gaps;

  // The true content of this rank's window, ascending hp_start. Elements of the window that no
  // fragment covers are zeros (parameter_alignment gaps and the tail padding).
  std::vector<Fragment> fragments;

  // DeepSpeed's own mapping for this rank (lp._hp_mapping), in client order of the kept params:
  // the source of `param_slice_mappings`. Equals `fragments` up to order when
  // `recorded_matches_layout`; otherwise its offsets are the upstream round-robin inconsistency.
  std::vector<Fragment> recorded_fragments;
  bool recorded_matches_layout = true;
};

// DeepSpeedZeroOptimizer._round_robin_reorder of `order` (stable buckets by position % dp_size,
// emitted in bucket order): the flat order of a ZeRO-1/2 group with round_robin_gradients.
std::vector<size_t> RoundRobin(const std::vector<size_t>& order, uint32_t dp_size);

// Computes rank `dp_rank`'s partition of one param group among `dp_size` ranks.
// `params` are ALL params of the optimizer param group in client order (frozen and zero-element
// ones are skipped as DeepSpeed skips them). O(params.size()).
// Errors: InvalidArgument when dp_size == 0, dp_rank >= dp_size, an alignment is 0, or the group
// keeps no param (DeepSpeed itself fails on such a group: IndexError in ZeRO-1/2, torch.cat of an
// empty list in BF16); OutOfRange when a size overflows uint64.
Result<Zero12Partition> PartitionZero12(const std::vector<FlatParam>& params, uint32_t dp_size,
                                        uint32_t dp_rank, const Zero12Options& options = {});

// One entry of `param_slice_mappings[i]`: name -> fragment_address(numel, start), start being the
// offset inside the rank's partition.
struct SliceMapping {
  std::string name;
  uint64_t numel = 0;
  uint64_t start = 0;

  bool operator==(const SliceMapping& o) const {
    return name == o.name && numel == o.numel && start == o.start;
  }
};

// The `param_slice_mappings[i]` OrderedDict of `partition` (its recorded_fragments, in order).
// `params` must be the vector the partition was computed from.
// Errors: InvalidArgument when a fragment's param index is out of range or two mapped params share
// a name (an OrderedDict keyed by name could not hold both).
Result<std::vector<SliceMapping>> ParamSliceMappings(const std::vector<FlatParam>& params,
                                                     const Zero12Partition& partition);

// --------------------------------------------------------------------------------------------
// ZeRO-3 (DeepSpeedZeroOptimizer_Stage3)
// --------------------------------------------------------------------------------------------

// One rank's slice of one param: elements [src_start, src_start + real_numel) of the flattened
// param, followed by partition_numel - real_numel elements of padding. DeepSpeed leaves that
// padding uninitialised (torch.empty); reshardfs serves zeros.
struct Zero3ParamPart {
  size_t param = 0;              // index into the param group's vector
  uint64_t partition_numel = 0;  // pn = ceil(numel / D), the same on every rank
  uint64_t src_start = 0;        // r * pn (may be >= numel, then real_numel is 0)
  uint64_t real_numel = 0;       // min(pn, numel - r*pn) clamped at 0
  uint64_t flat_offset = 0;      // offset of this part inside the sub-group's flat

  bool operator==(const Zero3ParamPart& o) const {
    return param == o.param && partition_numel == o.partition_numel && src_start == o.src_start &&
           real_numel == o.real_numel && flat_offset == o.flat_offset;
  }
};

// Rank r's part of one param of `numel` elements among `dp_size` ranks (`param` and
// `flat_offset` left 0). Also what `frozen_param_fragments` holds for a frozen ZeRO-3 param.
// Errors: InvalidArgument when dp_size == 0 or dp_rank >= dp_size.
Result<Zero3ParamPart> PartitionZero3Param(uint64_t numel, uint32_t dp_size, uint32_t dp_rank);

// One optimizer sub-group: `fp32_flat_groups[s]` and state index s of the optimizer file.
struct Zero3SubGroup {
  size_t param_group = 0;             // the optimizer param group it came from
  std::vector<Zero3ParamPart> parts;  // in client order; flat = concat of parts, no extra padding
  uint64_t flat_numel = 0;            // sum of the parts' partition_numel
};

// Splits every param group into sub-groups and cuts rank `dp_rank`'s parts. Sub-groups are
// numbered across groups in order. Within a group the kept params are walked in order summing
// partition_numel (NOT numel); a sub-group closes when the sum reaches `sub_group_size` (`>=`) or
// at the group's last kept param. Because pn = ceil(numel/D), the boundaries move with D. A group
// that keeps no param yields no sub-group (its torch param_group still exists, with params []).
// All params are assumed to share one ZeRO process group (AutoEP expert groups, which DeepSpeed
// splits further by process group, are out of scope).
// Errors: InvalidArgument when dp_size == 0 or dp_rank >= dp_size; OutOfRange on overflow.
Result<std::vector<Zero3SubGroup>> PartitionZero3(
    const std::vector<std::vector<FlatParam>>& param_groups, uint32_t dp_size, uint32_t dp_rank,
    uint64_t sub_group_size);

// `optimizer_state_dict['param_groups'][g]['params']` of a ZeRO-3 file: the indices of the
// sub-groups that came from param group g, for g in [0, num_param_groups).
// Errors: InvalidArgument when a sub-group names a param group >= num_param_groups.
Result<std::vector<std::vector<size_t>>> Zero3ParamGroupSubGroups(
    const std::vector<Zero3SubGroup>& sub_groups, size_t num_param_groups);

}  // namespace reshard::layout
