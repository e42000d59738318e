// OpenNativeCheckpoint: a native DeepSpeed checkpoint (what engine.save_checkpoint wrote), indexed
// as the universal checkpoint ds_to_universal would write for it, without converting or copying
// anything.
//
// Accepted `path`: the save folder holding `latest` (the tag folder it names is used; a HF
// Trainer checkpoint-N/ folder is one), or a tag folder holding the rank files:
//   <tag>/mp_rank_XX_model_states.pt                       stage <= 2: one per TP rank
//   <tag>/zero_pp_rank_D_mp_rank_XX_model_states.pt        stage 3: one per (DP, TP) rank
//   <tag>/[bf16_]zero_pp_rank_D_mp_rank_XX_optim_states.pt one per (DP, TP) rank
// The result is a ucp::UniversalCheckpoint (native() true) whose parameters, in the converter's
// order, carry the converter's shapes and categories and, per state, the list of fragments of
// the DP ranks' flat partitions that make it up (ucp::StateTensor::pieces), located through the
// zip directory of each optimizer file (tensor records are stored uncompressed):
//   ZeRO-1/2, BF16_Optimizer: `param_slice_mappings[g][name]` (start, numel) inside
//     `single_partition_of_fp32_groups[g]` and `base_optimizer_state.state[g].exp_avg/_sq`, in DP
//     rank order (ds_to_universal's extract_zero_shards + _merge_zero_shards), except where the
//     mappings disagree with param_shapes' order: DeepSpeed saves a round_robin_gradients group's
//     mappings in the model's order but its flat partitions in round-robin order, and then the
//     fragments are cut from the flat buffer in param_shapes order (the converter's output is
//     wrong there; zero_to_fp32's and this are the engine's values); step.pt is the DP
//     rank 0 file's `state[g].step` (the converter asserts the ranks agree; so does this);
//     module entries without optimizer state (frozen params, buffers, tied aliases) become the
//     unlisted fp32 entries the converter writes, when the module holds them in float32.
//   ZeRO-3: per sub-group, `param_shapes` order, each parameter's ceil(numel / DP) slot in
//     `fp32_flat_groups[i]` and `optimizer_state_dict.state[i].exp_avg/_sq`, the padding-free
//     part of every rank's slot (extract_zero_shards_stage3); bare 1-D states, no step.pt.
// With TP > 1 each TP rank's states are assembled as above from its own files and shapes (its
// model-states file's param_shapes), then joined as merge_tp_slices joins them: along the
// affine_map split's dim (AutoTP; a fused split, such as Phi-3's qkv_proj, per sub-parameter:
// every rank's block of the first sub-parameter, then of the next, ...) or the category's cat_dim
// (row-parallel: dim 1; else dim 0; a row-parallel weight becomes one run per row and rank; 2
// sub-parameters along dim 0: every rank's first torch.chunk, then every rank's second), or,
// replicated, rank 0's; or, averaged (parameter_to_average_patterns), the converter's
// `sum(slices) / len(slices)` in its order of operations (float32 only): the one value not found
// in the files, so it is computed here, at open, and held in memory (StateTensor::computed; at
// most 256 MiB in all, else kResourceExhausted; these are norms and biases, a few MiB even for a
// 70B model); vocabulary rows past original_vocab_size are stripped. ZeRO-3 states are
// bare flat tensors without TP and merged dicts with it, as the converter writes them.
// zero/optimizer_state.pt's keys are read in place from the DP 0 / TP 0 optimizer file's
// `optimizer_state_dict` (UniversalCheckpoint::optimizer_state_root), and the model-states files
// are the ones the converter copies.
//
// Refused, one line each (kUnsupported unless noted): pipeline-parallel checkpoints (`layer_*`
// files, pp_degree > 1), MoE expert files (`layer_*_expert_*`, `expp_rank_*`), stage-0 checkpoints
// (no optimizer files), ZeRO-3 `ds_zero_partition_groups`, sub-parameter patterns (without an
// affine map), averaged states stored in another dtype than float32, optimizer states offloaded
// to NVMe (offload_optimizer.device 'nvme' and an empty flat partition in their place); kNotFound: a missing rank
// file (named); kCorrupt: ranks that disagree about the layout (zero_stage, partition_count, group
// count, step, shapes that do not join or, averaged, differ), fragments that do not tile a
// parameter, a truncated file (whatever TorchArchive::Open refuses).
//
// Thread safety: a plain function; the result is immutable like any UniversalCheckpoint.
// Public header: C++17.
#pragma once

#include <string>

#include "reshard/base/status.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::native {

Result<ucp::UniversalCheckpoint> OpenNativeCheckpoint(const std::string& path);

// True when `path` looks like a native checkpoint rather than a universal one: a folder whose
// own files include *_optim_states.pt, or one with `latest` and neither zero/ nor
// latest_universal. Reads directory entries only.
bool LooksNative(const std::string& path);

// The source reshardfs mounts: OpenNativeCheckpoint when LooksNative(path), else
// ucp::UniversalCheckpoint::Open.
Result<ucp::UniversalCheckpoint> OpenCheckpointSource(const std::string& path);

}  // namespace reshard::native
