#include "reshard/plan/optim_states_file.h"

#include <cstdio>
#include <string>
#include <utility>

#include "reshard/format/pickle_query.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/plan/file_builder.h"
#include "reshard/plan/optimizer_groups.h"
#include "reshard/plan/python_values.h"

namespace reshard::plan {
namespace {

using format::NodeId;

constexpr const char* kMomentStates[] = {"exp_avg", "exp_avg_sq"};

const format::TorchArchive& OptimizerState(const ucp::UniversalCheckpoint& ckpt) { return ckpt.optimizer_state(); }

const format::TorchArchive& FirstModelStates(const ucp::UniversalCheckpoint& ckpt) {
  return ckpt.model_states().front().archive;
}

// The value of `key` in zero/optimizer_state.pt, or kNoNode.
NodeId OptimValue(const ucp::UniversalCheckpoint& ckpt, std::string_view key) {
  return format::DictLookup(OptimizerState(ckpt).tree(), ckpt.optimizer_state_root(), key);
}

// Copies optimizer_state.pt[key] when present, else builds `fallback`.
template <typename F>
Result<NodeId> OptimValueOr(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, std::string_view key, F fallback) {
  const NodeId v = OptimValue(ckpt, key);
  if (v != format::kNoNode) return b.Import(OptimizerState(ckpt), v);
  return fallback();
}

// The copied model-states file's top-level `key` (ds_config, ds_version), or None.
Result<NodeId> ModelStatesValue(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, std::string_view key) {
  const format::TorchArchive& src = FirstModelStates(ckpt);
  const NodeId v = format::DictLookup(src.tree(), src.tree().root(), key);
  if (v == format::kNoNode) return b.tree().AddNone();
  return b.Import(src, v);
}

Result<NodeId> LossScaler(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt) {
  return OptimValueOr(b, ckpt, "loss_scaler", [&]() -> Result<NodeId> {
    // bf16 and fp32 runs keep a static LossScaler(scale=1.0) (runtime/fp16/loss_scaler.py).
    format::PickleTree& t = b.tree();
    const NodeId obj = t.AddNewObj(t.AddGlobal("deepspeed.runtime.fp16.loss_scaler", "LossScaler"), t.AddTuple({}));
    t.mutable_node(obj).state = AddStrDict(t, {{"cur_scale", t.AddFloat(1.0)}, {"dynamic", t.AddBool(false)}});
    return obj;
  });
}

// The hyper-parameter dict of param group `g` with `params` replaced.
Result<NodeId> HyperParams(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, size_t g,
                           const std::vector<int64_t>& params) {
  if (g >= ckpt.param_groups().size()) {
    return Corrupt(OptimizerState(ckpt).path() + ": no param_groups[" + std::to_string(g) + "]");
  }
  RS_ASSIGN_OR_RETURN(NodeId dict, b.Import(OptimizerState(ckpt), ckpt.param_groups()[g].node));
  b.tree().DictSet(dict, b.tree().AddStr("params"), AddIntList(b.tree(), params));
  return dict;
}

// The optimizer step of param group `g`: step.pt of its first parameter (ZeRO-1/2
// conversions), else the state of the group's first sub-group in optimizer_state.pt (ZeRO-3).
Result<NodeId> Step(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& first, size_t g) {
  if (first.step) {
    const ucp::Step& step = *first.step;
    if (!step.is_tensor) return b.tree().AddInt(step.int_value);
    const ucp::StateTensor& t = step.tensor;
    ExtentList extents;
    AppendExtents(extents, b.sources().Intern(Source{t.path, t.data_offset, t.dtype, 1, nullptr}), {view::Gather::Source(0, 1)});
    return b.AddTensor(t.dtype, {}, std::move(extents), Conversion::kCopy);
  }
  const format::TorchArchive& optim = OptimizerState(ckpt);
  const format::PickleTree& t = optim.tree();
  const NodeId osd = format::DictLookup(t, ckpt.optimizer_state_root(), "optimizer_state_dict");
  const NodeId state = format::DictLookup(t, osd, "state");
  const std::vector<NodeId>* items = format::DictItems(t, state);
  if (g < ckpt.param_groups().size() && !ckpt.param_groups()[g].params.empty() && items != nullptr) {
    const int64_t sub = ckpt.param_groups()[g].params.front();
    for (size_t i = 0; i + 1 < items->size(); i += 2) {
      if (format::AsInt(t, (*items)[i]) != sub) continue;
      const NodeId step = format::DictLookup(t, (*items)[i + 1], "step");
      if (step == format::kNoNode) continue;
      RS_ASSIGN_OR_RETURN(std::optional<format::TensorRef> tensor, format::MatchTensor(t, step));
      if (!tensor) return b.Import(optim, step);  // an int step
      // A new tensor per state: a source that shares one step tensor between sub-groups must not
      // make the resumed optimizer share it too (torch would then count every step once per
      // sub-group). DeepSpeed's own re-save after a universal load has one per state as well.
      const format::ArchiveStorage& record = optim.storages().at(tensor->storage.key);
      const uint32_t source = b.sources().Intern(
          Source{optim.path(), record.data_offset + static_cast<uint64_t>(tensor->storage_offset) *
                                                        format::ItemSize(tensor->dtype),
                 tensor->dtype, 1, nullptr});
      if (tensor->numel() != 1) return Corrupt(optim.path() + ": a step tensor with " + std::to_string(tensor->numel()) + " elements");
      ExtentList extents;
      AppendExtents(extents, source, {view::Gather::Source(0, 1)});
      return b.AddTensor(tensor->dtype, tensor->shape, std::move(extents), Conversion::kCopy);
    }
  }
  return NotFound(first.dir + ": no step.pt, and " + optim.path() + " holds no step for param group " +
                  std::to_string(g));
}

// A flat fp32 tensor: an Adam state partition, or (requires_grad) an fp32 master partition,
// which DeepSpeed pickles with requires_grad=True because it is the optimizer's parameter.
Result<NodeId> PlannedTensor(FileBuilder& b, const ExtentList& extents, bool requires_grad = false) {
  return b.AddTensor(format::DType::kFloat32, {static_cast<int64_t>(NumElements(extents))}, extents,
                     Conversion::kCopy, requires_grad);
}

// loss_scaler, dynamic_loss_scale and overflow, as both ZeRO wrappers save them.
Status AddLossScaling(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt,
                      std::vector<std::pair<std::string, NodeId>>& payload) {
  format::PickleTree& t = b.tree();
  RS_ASSIGN_OR_RETURN(NodeId loss_scaler, LossScaler(b, ckpt));
  payload.emplace_back("loss_scaler", loss_scaler);
  RS_ASSIGN_OR_RETURN(NodeId dynamic, OptimValueOr(b, ckpt, "dynamic_loss_scale", [&] { return t.AddBool(false); }));
  payload.emplace_back("dynamic_loss_scale", dynamic);
  RS_ASSIGN_OR_RETURN(NodeId overflow, OptimValueOr(b, ckpt, "overflow", [&] { return t.AddBool(false); }));
  payload.emplace_back("overflow", overflow);
  return Status::Ok();
}

// One torch Adam/AdamW state entry {'step', 'exp_avg', 'exp_avg_sq'} of a flat group or
// sub-group whose first parameter is `first` and whose param group is `g`.
Result<NodeId> AdamState(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const ucp::ParamEntry& first, size_t g,
                         const std::map<std::string, ExtentList>& states) {
  std::vector<std::pair<std::string, NodeId>> entries;
  RS_ASSIGN_OR_RETURN(NodeId step, Step(b, ckpt, first, g));
  entries.emplace_back("step", step);
  for (const char* key : kMomentStates) {
    RS_ASSIGN_OR_RETURN(NodeId tensor, PlannedTensor(b, states.at(key)));
    entries.emplace_back(key, tensor);
  }
  return AddStrDict(b.tree(), entries);
}

Status CheckStatesServed(const std::vector<const ucp::ParamEntry*>& params) {
  for (const ucp::ParamEntry* p : params) {
    for (const auto& [key, tensor] : p->states) {
      if (key != "fp32" && key != "exp_avg" && key != "exp_avg_sq") {
        return Unsupported(tensor.path + ": optimizer state '" + key +
                           "' is not served (only Adam's exp_avg and exp_avg_sq are)");
      }
      if (tensor.dtype != format::DType::kFloat32) {
        return Unsupported(tensor.path + ": state tensors must be float32, this one is " +
                           std::string(format::TorchName(tensor.dtype)));
      }
    }
  }
  return Status::Ok();
}

// "0.19.8" -> true when at least major.minor.patch; anything unparsable -> false.
bool VersionAtLeast(std::string_view version, int major, int minor, int patch) {
  int v[3] = {0, 0, 0};
  if (std::sscanf(std::string(version).c_str(), "%d.%d.%d", &v[0], &v[1], &v[2]) < 2) return false;
  if (v[0] != major) return v[0] > major;
  if (v[1] != minor) return v[1] > minor;
  return v[2] >= patch;
}

std::string DsVersion(const ucp::UniversalCheckpoint& ckpt) {
  const format::PickleTree& t = FirstModelStates(ckpt).tree();
  return std::string(format::AsStr(t, format::DictLookup(t, t.root(), "ds_version")).value_or(""));
}

Result<FilePlan> Wrap(FileBuilder b, const ucp::UniversalCheckpoint& ckpt, const Target& target, NodeId payload) {
  NodeId ds_config = format::kNoNode;
  if (target.ds_config.is_null()) {
    RS_ASSIGN_OR_RETURN(ds_config, ModelStatesValue(b, ckpt, "ds_config"));
  } else {
    ds_config = AddJson(b.tree(), target.ds_config);
  }
  RS_ASSIGN_OR_RETURN(NodeId ds_version, ModelStatesValue(b, ckpt, "ds_version"));
  b.tree().set_root(AddStrDict(b.tree(), {{"optimizer_state_dict", payload},
                                          {"ds_config", ds_config},
                                          {"ds_version", ds_version}}));
  return std::move(b).Finish();
}

}  // namespace

Result<FilePlan> PlanZero12OptimFile(const ucp::UniversalCheckpoint& ckpt, const Target& target, int tp_rank,
                                     int dp_rank, const std::vector<RankGroupPartition>& groups, SourceTable& sources) {
  RS_ASSIGN_OR_RETURN(auto params, OptimizerGroups(ckpt));
  FileBuilder b(target.tag + "/" + OptimStatesFileName(target, tp_rank, dp_rank), sources);
  format::PickleTree& t = b.tree();
  // BF16_Optimizer.state_dict has no loss scaling, zero_stage or param_alignment_paddings, and
  // keeps its fp32 partitions with their tail padding.
  const bool bf16_optimizer = target.bf16_optimizer;
  std::vector<std::pair<std::string, NodeId>> payload;
  if (!bf16_optimizer) RS_RETURN_IF_ERROR(AddLossScaling(b, ckpt, payload));
  RS_ASSIGN_OR_RETURN(NodeId clip, OptimValueOr(b, ckpt, "clip_grad", [&] { return t.AddFloat(0.0); }));
  payload.emplace_back("clip_grad", clip);

  std::vector<std::pair<NodeId, NodeId>> state;
  std::vector<NodeId> hyper, fp32, paddings, alignment, mappings;
  for (size_t g = 0; g < groups.size(); ++g) {
    const RankGroupPartition& part = groups[g];
    RS_RETURN_IF_ERROR(CheckStatesServed(params[g]));
    RS_ASSIGN_OR_RETURN(NodeId entry, AdamState(b, ckpt, *params[g].front(), g, part.states));
    state.emplace_back(t.AddInt(static_cast<int64_t>(g)), entry);
    RS_ASSIGN_OR_RETURN(NodeId h, HyperParams(b, ckpt, g, {static_cast<int64_t>(g)}));
    hyper.push_back(h);
  }
  for (size_t g = 0; g < groups.size(); ++g) {
    const layout::Zero12Partition& layout = groups[g].layout;
    const uint64_t kept = bf16_optimizer ? layout.partition_numel : layout.partition_numel - layout.group_padding;
    RS_ASSIGN_OR_RETURN(ExtentList lean, SliceExtents(groups[g].states.at("fp32"), 0, kept));
    RS_ASSIGN_OR_RETURN(NodeId tensor, PlannedTensor(b, lean, /*requires_grad=*/true));
    fp32.push_back(tensor);
    paddings.push_back(t.AddInt(static_cast<int64_t>(layout.group_padding)));
    std::vector<int64_t> gaps(layout.param_alignment_gaps.begin(), layout.param_alignment_gaps.end());
    alignment.push_back(AddIntList(t, gaps));
    std::vector<std::pair<NodeId, NodeId>> mapping;
    for (const layout::Fragment& f : layout.recorded_fragments) {
      mapping.emplace_back(t.AddStr(groups[g].param_names[f.param]), AddFragmentAddress(t, f.numel, f.hp_start));
    }
    mappings.push_back(AddOrderedDict(t, mapping));
  }
  payload.emplace_back("base_optimizer_state",
                       AddStrDict(t, {{"state", t.AddDict(std::move(state))}, {"param_groups", t.AddList(hyper)}}));
  payload.emplace_back("single_partition_of_fp32_groups", t.AddList(fp32));
  if (!bf16_optimizer) payload.emplace_back("zero_stage", AddZeroStageEnum(t, target.zero_stage));
  payload.emplace_back("group_paddings", t.AddList(paddings));
  if (!bf16_optimizer && VersionAtLeast(DsVersion(ckpt), 0, 19, 8)) {
    payload.emplace_back("param_alignment_paddings", t.AddList(alignment));
  }
  payload.emplace_back("partition_count", AddIntList(t, std::vector<int64_t>(groups.size(), target.dp_size)));
  RS_ASSIGN_OR_RETURN(NodeId ds_version, ModelStatesValue(b, ckpt, "ds_version"));
  payload.emplace_back("ds_version", ds_version);
  payload.emplace_back("param_slice_mappings", t.AddList(mappings));
  return Wrap(std::move(b), ckpt, target, AddStrDict(t, payload));
}

Result<FilePlan> PlanZero3OptimFile(const ucp::UniversalCheckpoint& ckpt, const Target& target, int tp_rank,
                                    int dp_rank, const std::vector<RankSubGroup>& subs, SourceTable& sources) {
  RS_ASSIGN_OR_RETURN(auto params, OptimizerGroups(ckpt));
  FileBuilder b(target.tag + "/" + OptimStatesFileName(target, tp_rank, dp_rank), sources);
  format::PickleTree& t = b.tree();
  std::vector<std::pair<std::string, NodeId>> payload;
  payload.emplace_back("zero_stage", AddZeroStageEnum(t, 3));
  RS_RETURN_IF_ERROR(AddLossScaling(b, ckpt, payload));
  payload.emplace_back("partition_count", t.AddInt(target.dp_size));

  std::vector<std::pair<NodeId, NodeId>> state;
  std::vector<std::vector<int64_t>> group_subs(params.size());
  for (size_t s = 0; s < subs.size(); ++s) {
    const RankSubGroup& sub = subs[s];
    RS_RETURN_IF_ERROR(CheckStatesServed(params[sub.param_group]));
    group_subs[sub.param_group].push_back(static_cast<int64_t>(s));
    RS_ASSIGN_OR_RETURN(NodeId entry, AdamState(b, ckpt, *params[sub.param_group].front(), sub.param_group, sub.states));
    state.emplace_back(t.AddInt(static_cast<int64_t>(s)), entry);
  }
  std::vector<NodeId> hyper;
  for (size_t g = 0; g < params.size(); ++g) {
    RS_ASSIGN_OR_RETURN(NodeId h, HyperParams(b, ckpt, g, group_subs[g]));
    hyper.push_back(h);
  }
  std::vector<NodeId> fp32;
  for (const RankSubGroup& sub : subs) {
    RS_ASSIGN_OR_RETURN(NodeId tensor, PlannedTensor(b, sub.states.at("fp32"), /*requires_grad=*/true));
    fp32.push_back(tensor);
  }
  payload.emplace_back("optimizer_state_dict",
                       AddStrDict(t, {{"state", t.AddDict(std::move(state))}, {"param_groups", t.AddList(hyper)}}));
  payload.emplace_back("fp32_flat_groups", t.AddList(fp32));
  return Wrap(std::move(b), ckpt, target, AddStrDict(t, payload));
}

}  // namespace reshard::plan
