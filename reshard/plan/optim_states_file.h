// The optimizer-states file of one target (TP, DP) rank: {B}zero_pp_rank_D_mp_rank_XX_optim_states.pt
// (deepspeed_native.md §4), {'optimizer_state_dict': payload, 'ds_config', 'ds_version'}.
//
// ZeRO-1/2 payload (DeepSpeedZeroOptimizer.state_dict): loss_scaler, dynamic_loss_scale,
// overflow, clip_grad, base_optimizer_state (torch optimizer state: per flat group its step,
// exp_avg, exp_avg_sq partitions of length ps, and the group's hyper-parameters with params
// [g]), single_partition_of_fp32_groups (the fp32 partitions without their tail padding),
// zero_stage, group_paddings, param_alignment_paddings (DeepSpeed >= 0.19.8), partition_count,
// ds_version, param_slice_mappings.
// BF16_Optimizer payload (bf16 + ZeRO-1 + fp32 gradient accumulation, BF16_Optimizer.state_dict):
// clip_grad, base_optimizer_state, single_partition_of_fp32_groups (WITH their tail padding),
// group_paddings (all on the last rank), partition_count, ds_version, param_slice_mappings.
// ZeRO-3 payload (DeepSpeedZeroOptimizer_Stage3._rigid_state_dict): zero_stage, loss_scaler,
// dynamic_loss_scale, overflow, partition_count (an int), optimizer_state_dict (per sub-group
// step, exp_avg, exp_avg_sq; param_groups listing their sub-groups), fp32_flat_groups.
//
// Hyper-parameters, the loss scaler and the step come from zero/optimizer_state.pt and step.pt
// (so a checkpoint of either stage serves a target of either stage). Tensors are extents over
// the universal state files: nothing is read at plan time. Public header: C++17.
#pragma once

#include <vector>

#include "reshard/base/status.h"
#include "reshard/plan/extent.h"
#include "reshard/plan/file_plan.h"
#include "reshard/plan/target.h"
#include "reshard/plan/zero12_partition_plan.h"
#include "reshard/plan/zero3_partition_plan.h"
#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::plan {

// `groups`: PlanZero12Rank's result for (tp_rank, dp_rank).
Result<FilePlan> PlanZero12OptimFile(const ucp::UniversalCheckpoint& checkpoint, const Target& target, int tp_rank,
                                     int dp_rank, const std::vector<RankGroupPartition>& groups, SourceTable& sources);

// `sub_groups`: PlanZero3Rank's result for dp_rank.
Result<FilePlan> PlanZero3OptimFile(const ucp::UniversalCheckpoint& checkpoint, const Target& target, int tp_rank,
                                    int dp_rank, const std::vector<RankSubGroup>& sub_groups, SourceTable& sources);

}  // namespace reshard::plan
