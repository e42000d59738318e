#include "reshard/plan/checkpoint_plan.h"

#include <utility>

#include "reshard/plan/model_states_file.h"
#include "reshard/plan/optim_states_file.h"
#include "reshard/plan/optimizer_groups.h"
#include "reshard/plan/zero12_partition_plan.h"
#include "reshard/plan/weights_plan.h"
#include "reshard/plan/zero3_partition_plan.h"

namespace reshard::plan {
namespace {

constexpr std::string_view kUniversalSuffix = "_universal";

Status CheckTarget(const Target& t) {
  if (t.zero_stage < 1 || t.zero_stage > 3) {
    return InvalidArgument("ZeRO stage " + std::to_string(t.zero_stage) + " is not served (1, 2 or 3)");
  }
  if (t.tp_size < 1 || t.dp_size < 1) {
    return InvalidArgument("TP " + std::to_string(t.tp_size) + " x DP " + std::to_string(t.dp_size) +
                           ": both must be at least 1");
  }
  if (t.tp_size >= 100) return InvalidArgument("TP must stay below 100 (DeepSpeed sorts mp_rank_XX names as text)");
  return Status::Ok();
}

// Hands `file` to the sink at `index`.
Status Emit(const FileSink& sink, size_t index, Result<FilePlan> file, const SourceTable& sources) {
  if (!file.ok()) return std::move(file).status();
  return sink(index, std::move(file).value(), sources.sources());
}

Status PlanZero12(const ucp::UniversalCheckpoint& ckpt, const Target& target, SourceTable& sources,
                  const FileSink& sink) {
  const auto tp = static_cast<size_t>(target.tp_size), dp = static_cast<size_t>(target.dp_size);
  for (int t = 0; t < target.tp_size; ++t) {
    for (int r = 0; r < target.dp_size; ++r) {
      RS_ASSIGN_OR_RETURN(std::vector<RankGroupPartition> groups, PlanZero12Rank(ckpt, target, t, r, sources));
      if (r == 0) {
        std::vector<ParamShapeGroup> shapes;
        for (const RankGroupPartition& g : groups) {
          ParamShapeGroup s;
          for (size_t i : g.layout.flat_order) {
            s.names.push_back(g.param_names[i]);
            s.shapes.push_back(g.local_shapes[i]);
          }
          shapes.push_back(std::move(s));
        }
        RS_RETURN_IF_ERROR(
            Emit(sink, static_cast<size_t>(t), PlanModelStatesFile(ckpt, target, t, 0, shapes, sources), sources));
      }
      const size_t optim_index = tp + static_cast<size_t>(t) * dp + static_cast<size_t>(r);
      RS_RETURN_IF_ERROR(
          Emit(sink, optim_index, PlanZero12OptimFile(ckpt, target, t, r, groups, sources), sources));
    }
  }
  return Status::Ok();
}

// ZeRO-3 writes one model-states and one optimizer file per TP x DP rank.
Status PlanZero3(const ucp::UniversalCheckpoint& ckpt, const Target& target, SourceTable& sources,
                 const FileSink& sink) {
  const auto tp = static_cast<size_t>(target.tp_size), dp = static_cast<size_t>(target.dp_size);
  for (int t = 0; t < target.tp_size; ++t) {
    for (int r = 0; r < target.dp_size; ++r) {
      RS_ASSIGN_OR_RETURN(std::vector<RankSubGroup> subs, PlanZero3Rank(ckpt, target, t, r, sources));
      std::vector<ParamShapeGroup> shapes;
      for (const RankSubGroup& sub : subs) {
        shapes.push_back(ParamShapeGroup{sub.param_names, sub.local_shapes});
      }
      const size_t rank = static_cast<size_t>(t) * dp + static_cast<size_t>(r);
      RS_RETURN_IF_ERROR(Emit(sink, rank, PlanModelStatesFile(ckpt, target, t, r, shapes, sources), sources));
      RS_RETURN_IF_ERROR(Emit(sink, tp * dp + rank, PlanZero3OptimFile(ckpt, target, t, r, subs, sources), sources));
    }
  }
  return Status::Ok();
}

}  // namespace

std::string ServedTag(const ucp::UniversalCheckpoint& ckpt, const Target& target) {
  if (!target.tag.empty()) return target.tag;
  std::string tag = ckpt.tag();
  if (tag.size() > kUniversalSuffix.size() &&
      tag.compare(tag.size() - kUniversalSuffix.size(), kUniversalSuffix.size(), kUniversalSuffix) == 0) {
    tag.resize(tag.size() - kUniversalSuffix.size());
  }
  return tag;
}

std::string UniversalViewRoot(const ucp::UniversalCheckpoint& ckpt) { return ckpt.tag() + std::string(kUniversalSuffix); }

size_t TargetFileCount(const Target& target) {
  const auto tp = static_cast<size_t>(target.tp_size), dp = static_cast<size_t>(target.dp_size);
  return (target.zero_stage == 3 ? tp * dp : tp) + tp * dp;
}

Result<CheckpointPlan> PlanCheckpoint(const ucp::UniversalCheckpoint& ckpt, const Target& requested,
                                      const FileSink& sink) {
  RS_RETURN_IF_ERROR(CheckTarget(requested));
  CheckpointPlan plan;
  plan.target = requested;
  plan.target.tag = ServedTag(ckpt, requested);
  if (plan.target.tag.empty() || plan.target.tag.find('/') != std::string::npos || plan.target.tag == "." ||
      plan.target.tag == "..") {
    return InvalidArgument("tag '" + plan.target.tag + "' is not a single folder name");
  }
  SourceTable sources;
  if (plan.target.zero_stage == 3) {
    RS_RETURN_IF_ERROR(PlanZero3(ckpt, plan.target, sources, sink));
  } else {
    RS_RETURN_IF_ERROR(PlanZero12(ckpt, plan.target, sources, sink));
  }
  if (ckpt.native()) {
    RS_ASSIGN_OR_RETURN(plan.universal, PlanUniversalView(ckpt, UniversalViewRoot(ckpt), sources));
  }
  // The weights are an extra view: a source whose target files plan is served even when they
  // cannot be (the reason is logged where they would be).
  Result<FilePlan> weights =
      PlanWeights(ckpt, plan.target.tag + "/model.safetensors", plan.target.weights_dtype, sources);
  if (weights.ok()) {
    plan.weights = std::move(weights).value();
  } else {
    plan.weights_unavailable = weights.status().message();
  }
  plan.sources = std::move(sources).Release();
  return plan;
}

}  // namespace reshard::plan
