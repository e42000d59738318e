#include "reshard/layout/zero_partition.h"

#include <algorithm>
#include <numeric>
#include <optional>
#include <string_view>
#include <unordered_set>

#include "reshard/base/checked_math.h"

namespace reshard::layout {
namespace {

Status CheckRank(uint32_t dp_size, uint32_t dp_rank) {
  if (dp_size == 0) return InvalidArgument("dp_size must be > 0, got 0");
  if (dp_rank >= dp_size) {
    return InvalidArgument("dp_rank " + std::to_string(dp_rank) + " is not below dp_size " +
                           std::to_string(dp_size));
  }
  return Status::Ok();
}

Status Overflow(std::string_view what, uint64_t a, uint64_t b) {
  return OutOfRange(std::string(what) + " overflows uint64 (" + std::to_string(a) + ", " +
                    std::to_string(b) + ")");
}

// Appends the part of a param at flat [offset, offset + numel) that lies in the window
// [start, end), if any. This is the overlap test of _init_lp_to_hp_mapping
// ("start <= offset < end or offset < start < offset + numel") for numel > 0, followed by
// get_hp_fragment_mapping's clamp. The caller guarantees offset + numel does not overflow.
void AppendOverlap(size_t param, uint64_t offset, uint64_t numel, uint64_t start, uint64_t end,
                   std::vector<Fragment>* out) {
  const uint64_t lo = std::max(offset, start);
  const uint64_t hi = std::min(offset + numel, end);
  if (lo < hi) out->push_back(Fragment{param, lo - offset, lo - start, hi - lo});
}

}  // namespace

// Only buckets that received a param exist in _round_robin_reorder, which is the same as skipping
// empty ones here.
std::vector<size_t> RoundRobin(const std::vector<size_t>& order, uint32_t dp_size) {
  std::vector<size_t> out;
  out.reserve(order.size());
  for (size_t bucket = 0; bucket < dp_size && bucket < order.size(); ++bucket) {
    for (size_t i = bucket; i < order.size(); i += dp_size) out.push_back(order[i]);
  }
  return out;
}

uint64_t ParamAlignmentElems(bool enabled, uint64_t lp_itemsize) {
  if (!enabled) return 1;
  // 16-byte aligned starts in elements of the lp dtype (DeepSpeedZeroOptimizer.__init__).
  return 16 / std::gcd(uint64_t{16}, lp_itemsize);
}

Result<Zero12Partition> PartitionZero12(const std::vector<FlatParam>& params, uint32_t dp_size,
                                        uint32_t dp_rank, const Zero12Options& options) {
  RS_RETURN_IF_ERROR(CheckRank(dp_size, dp_rank));
  const bool is_bf16 = options.flavor == Zero12Flavor::kBf16Optimizer;
  if (options.nccl_start_alignment_factor == 0) {
    return InvalidArgument("nccl_start_alignment_factor must be > 0, got 0");
  }
  // BF16_Optimizer has neither option; its flat buffer is the plain client-order concat.
  const uint64_t param_align = is_bf16 ? 1 : options.param_alignment_elems;
  const bool round_robin = !is_bf16 && options.round_robin_gradients;
  if (param_align == 0) return InvalidArgument("param_alignment_elems must be > 0, got 0");

  std::vector<size_t> bit16;  // kept params, client order (DeepSpeed's bit16_groups[i])
  for (size_t i = 0; i < params.size(); ++i) {
    if (IsOptimized(params[i])) bit16.push_back(i);
  }
  if (bit16.empty()) {
    return InvalidArgument("param group of " + std::to_string(params.size()) +
                           " params keeps no trainable param with numel > 0; DeepSpeed cannot "
                           "build a ZeRO-1/2 or BF16 flat group from it");
  }

  Zero12Partition part;
  part.flat_order = round_robin ? RoundRobin(bit16, dp_size) : bit16;
  const size_t kept = part.flat_order.size();
  part.flat_offsets.resize(kept);
  part.param_alignment_gaps.resize(kept);
  uint64_t cursor = 0;
  for (size_t k = 0; k < kept; ++k) {
    const uint64_t numel = params[part.flat_order[k]].numel;
    part.flat_offsets[k] = cursor;
    std::optional<uint64_t> sum = CheckedAdd(cursor, numel);
    if (!sum) return Overflow("flat offset", cursor, numel);
    cursor = *sum;
    part.group_numel += numel;  // <= cursor, so it cannot overflow either
    // DeepSpeed pads after every param but the last, so the buffer ends at the last param's end
    // before the DP alignment is applied.
    const uint64_t gap = (k + 1 == kept) ? 0 : (param_align - cursor % param_align) % param_align;
    part.param_alignment_gaps[k] = gap;
    sum = CheckedAdd(cursor, gap);
    if (!sum) return Overflow("flat offset", cursor, gap);
    cursor = *sum;
  }
  part.content_numel = cursor;

  const std::optional<uint64_t> alignment =
      CheckedMul(options.nccl_start_alignment_factor, dp_size);
  if (!alignment) return Overflow("flat alignment", options.nccl_start_alignment_factor, dp_size);
  const std::optional<uint64_t> padded = CheckedAlignUp(part.content_numel, *alignment);
  if (!padded) return Overflow("padded group numel", part.content_numel, *alignment);
  part.padded_numel = *padded;
  // get_data_parallel_partitions gives the first numel % D ranks one extra element; the
  // alignment above makes that remainder 0, so every partition is padded_numel / D.
  part.partition_numel = part.padded_numel / dp_size;
  part.partition_start = part.partition_numel * dp_rank;  // <= padded_numel, cannot overflow
  const uint64_t start = part.partition_start;
  const uint64_t end = start + part.partition_numel;

  if (is_bf16) {
    part.group_padding = (dp_rank + 1 == dp_size) ? part.padded_numel - part.group_numel : 0;
  } else if (part.content_numel <= start) {
    part.group_padding = part.partition_numel;
  } else if (part.content_numel < end) {
    part.group_padding = end - part.content_numel;
  }

  for (size_t k = 0; k < kept && part.flat_offsets[k] < end; ++k) {
    AppendOverlap(part.flat_order[k], part.flat_offsets[k], params[part.flat_order[k]].numel, start,
                  end, &part.fragments);
  }

  // _link_all_hp_params passes the real offsets only when some gap is non-zero; otherwise
  // _init_lp_to_hp_mapping re-derives them by cumulative numel in client order, which is wrong
  // whenever round robin changed the order. Reproduce that, since it is what the file records.
  const bool any_gap =
      std::any_of(part.param_alignment_gaps.begin(), part.param_alignment_gaps.end(),
                  [](uint64_t g) { return g != 0; });
  part.recorded_matches_layout = any_gap || part.flat_order == bit16;
  std::vector<uint64_t> offset_of(params.size(), 0);
  if (any_gap) {
    for (size_t k = 0; k < kept; ++k) offset_of[part.flat_order[k]] = part.flat_offsets[k];
  } else {
    uint64_t running = 0;  // bounded by group_numel, already checked
    for (size_t i : bit16) {
      offset_of[i] = running;
      running += params[i].numel;
    }
  }
  for (size_t i : bit16) {
    AppendOverlap(i, offset_of[i], params[i].numel, start, end, &part.recorded_fragments);
  }
  return part;
}

Result<std::vector<SliceMapping>> ParamSliceMappings(const std::vector<FlatParam>& params,
                                                     const Zero12Partition& partition) {
  std::vector<SliceMapping> out;
  out.reserve(partition.recorded_fragments.size());
  std::unordered_set<std::string_view> seen;
  for (const Fragment& f : partition.recorded_fragments) {
    if (f.param >= params.size()) {
      return InvalidArgument("fragment names param " + std::to_string(f.param) + " of a group of " +
                             std::to_string(params.size()));
    }
    const std::string& name = params[f.param].name;
    if (!seen.insert(name).second) {
      return InvalidArgument("param name '" + name + "' is mapped twice in one param group");
    }
    out.push_back(SliceMapping{name, f.numel, f.hp_start});
  }
  return out;
}

Result<Zero3ParamPart> PartitionZero3Param(uint64_t numel, uint32_t dp_size, uint32_t dp_rank) {
  RS_RETURN_IF_ERROR(CheckRank(dp_size, dp_rank));
  Zero3ParamPart part;
  // _aligned_size // world == ceil(numel / world), written without the overflowing add.
  part.partition_numel = numel / dp_size + (numel % dp_size != 0 ? 1 : 0);
  const std::optional<uint64_t> src_start = CheckedMul(part.partition_numel, dp_rank);
  if (!src_start) return Overflow("zero-3 partition start", part.partition_numel, dp_rank);
  part.src_start = *src_start;
  if (part.src_start < numel) {
    part.real_numel = std::min(part.partition_numel, numel - part.src_start);
  }
  return part;
}

Result<std::vector<Zero3SubGroup>> PartitionZero3(
    const std::vector<std::vector<FlatParam>>& param_groups, uint32_t dp_size, uint32_t dp_rank,
    uint64_t sub_group_size) {
  RS_RETURN_IF_ERROR(CheckRank(dp_size, dp_rank));
  std::vector<Zero3SubGroup> sub_groups;
  for (size_t g = 0; g < param_groups.size(); ++g) {
    const std::vector<FlatParam>& params = param_groups[g];
    size_t last_kept = params.size();
    for (size_t i = 0; i < params.size(); ++i) {
      if (IsOptimized(params[i])) last_kept = i;
    }
    if (last_kept == params.size()) continue;  // _get_trainable_parameter_groups drops it

    // _create_fp16_sub_groups first returns one sub-group when sub_group_size >= the group's
    // total partition numel. The loop below yields the same single sub-group in that case (the
    // running sum reaches the size at the last param at the earliest), so it needs no branch.
    Zero3SubGroup current;
    current.param_group = g;
    for (size_t i = 0; i <= last_kept; ++i) {
      if (!IsOptimized(params[i])) continue;
      RS_ASSIGN_OR_RETURN(Zero3ParamPart part,
                          PartitionZero3Param(params[i].numel, dp_size, dp_rank));
      part.param = i;
      part.flat_offset = current.flat_numel;
      const std::optional<uint64_t> sum = CheckedAdd(current.flat_numel, part.partition_numel);
      if (!sum) return Overflow("zero-3 sub-group numel", current.flat_numel, part.partition_numel);
      current.flat_numel = *sum;
      current.parts.push_back(part);
      if (current.flat_numel >= sub_group_size || i == last_kept) {
        sub_groups.push_back(std::move(current));
        current = Zero3SubGroup{};
        current.param_group = g;
      }
    }
  }
  return sub_groups;
}

Result<std::vector<std::vector<size_t>>> Zero3ParamGroupSubGroups(
    const std::vector<Zero3SubGroup>& sub_groups, size_t num_param_groups) {
  std::vector<std::vector<size_t>> out(num_param_groups);
  for (size_t s = 0; s < sub_groups.size(); ++s) {
    const size_t g = sub_groups[s].param_group;
    if (g >= num_param_groups) {
      return InvalidArgument("sub-group " + std::to_string(s) + " comes from param group " +
                             std::to_string(g) + " of " + std::to_string(num_param_groups));
    }
    out[g].push_back(s);
  }
  return out;
}

}  // namespace reshard::layout
