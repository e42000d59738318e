#include "reshard/plan/universal_view_plan.h"

#include <string_view>

#include "reshard/format/pickle_query.h"
#include "reshard/plan/file_builder.h"
#include "reshard/plan/python_values.h"
#include "reshard/plan/state_extents.h"

namespace reshard::plan {
namespace {

using format::NodeId;

// The state tensor as a new contiguous tensor of its full shape.
Result<NodeId> WholeTensor(FileBuilder& b, const ucp::StateTensor& t) {
  ExtentList extents;
  RS_RETURN_IF_ERROR(AppendStateExtents(extents, b.sources(), t, {view::Gather::Source(0, t.numel())}));
  if (t.numel() == 0) extents.clear();
  return b.AddTensor(t.dtype, t.shape, std::move(extents), Conversion::kCopy, t.requires_grad);
}

// One zero/<param>/<key>.pt file, as merge_tp_slices (ZeRO-1/2) or merge_zero3_slices writes it.
Result<FilePlan> StateFile(const ucp::ParamEntry& p, const std::string& key, const ucp::StateTensor& t,
                           const std::string& dir, SourceTable& sources) {
  FileBuilder b(dir + "/" + key + ".pt", sources);
  format::PickleTree& tree = b.tree();
  RS_ASSIGN_OR_RETURN(NodeId tensor, WholeTensor(b, t));
  if (p.bare_tensor) {
    tree.set_root(tensor);
    return std::move(b).Finish();
  }
  // ckpt_dict's insertion order in the converter: the category keys as its branches add them,
  // the vocabulary flag, then 'param'.
  std::vector<std::pair<std::string, NodeId>> entries;
  const ucp::ParamCategories& c = p.categories;
  if (c.cat_dim) entries.emplace_back("cat_dim", tree.AddInt(*c.cat_dim));
  if (c.param_n_sub_params) entries.emplace_back("param_n_sub_params", tree.AddInt(*c.param_n_sub_params));
  if (c.vocab_tensor) entries.emplace_back("vocab_tensor", tree.AddBool(*c.vocab_tensor));
  entries.emplace_back("param", tensor);
  tree.set_root(AddStrDict(tree, entries));
  return std::move(b).Finish();
}

Result<FilePlan> StepFile(const ucp::Step& step, const std::string& dir, SourceTable& sources) {
  FileBuilder b(dir + "/step.pt", sources);
  if (!step.is_tensor) {
    b.tree().set_root(b.tree().AddInt(step.int_value));
  } else {
    RS_ASSIGN_OR_RETURN(NodeId tensor, WholeTensor(b, step.tensor));
    b.tree().set_root(tensor);
  }
  return std::move(b).Finish();
}

// zero/optimizer_state.pt (_save_optimizer_state / _save_optimizer_state_stage3).
Result<FilePlan> OptimizerStateFile(const ucp::UniversalCheckpoint& ckpt, const std::string& root,
                                    SourceTable& sources) {
  const format::TorchArchive& src = ckpt.optimizer_state();
  const format::PickleTree& t = src.tree();
  const NodeId osd = ckpt.optimizer_state_root();
  const std::vector<NodeId>* items = format::DictItems(t, osd);
  if (items == nullptr) return Corrupt(src.path() + ": optimizer_state_dict is not a dict");
  const bool zero3 = ckpt.zero_stage() == 3;
  const NodeId groups = format::DictLookup(
      t, format::DictLookup(t, osd, zero3 ? "optimizer_state_dict" : "base_optimizer_state"), "param_groups");
  FileBuilder b(root + "/zero/optimizer_state.pt", sources);
  std::vector<std::pair<NodeId, NodeId>> entries;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    const std::string_view key = format::AsStr(t, (*items)[i]).value_or("");
    if (!zero3 && (key == "base_optimizer_state" || key == "param_slice_mappings" ||
                   key == "single_partition_of_fp32_groups")) {
      continue;
    }
    if (key == "param_groups") continue;  // the converter (re)sets it last
    RS_ASSIGN_OR_RETURN(NodeId k, b.Import(src, (*items)[i]));
    RS_ASSIGN_OR_RETURN(NodeId v, b.Import(src, (*items)[i + 1]));
    entries.emplace_back(k, v);
  }
  RS_ASSIGN_OR_RETURN(NodeId g, b.Import(src, groups));
  entries.emplace_back(b.tree().AddStr("param_groups"), g);
  b.tree().set_root(b.tree().AddDict(std::move(entries)));
  return std::move(b).Finish();
}

}  // namespace

Result<UniversalView> PlanUniversalView(const ucp::UniversalCheckpoint& ckpt, const std::string& root,
                                        SourceTable& sources) {
  if (!ckpt.native()) return InvalidArgument(ckpt.dir() + ": a universal source is its own universal checkpoint");
  UniversalView view;
  for (const ucp::ParamEntry& p : ckpt.params()) {
    const std::string dir = root + "/zero/" + p.name;
    for (const auto& [key, tensor] : p.states) {
      RS_ASSIGN_OR_RETURN(FilePlan f, StateFile(p, key, tensor, dir, sources));
      view.files.push_back(std::move(f));
    }
    if (p.step) {
      RS_ASSIGN_OR_RETURN(FilePlan f, StepFile(*p.step, dir, sources));
      view.files.push_back(std::move(f));
    }
  }
  RS_ASSIGN_OR_RETURN(FilePlan optim, OptimizerStateFile(ckpt, root, sources));
  view.files.push_back(std::move(optim));
  for (const ucp::ModelStatesFile& m : ckpt.model_states()) {
    view.copies.emplace_back(root + "/" + m.name, m.archive.path());
  }
  return view;
}

}  // namespace reshard::plan
