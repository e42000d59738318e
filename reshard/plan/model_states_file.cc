#include "reshard/plan/model_states_file.h"

#include <algorithm>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reshard/format/pickle_query.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/plan/file_builder.h"
#include "reshard/plan/lp_weight.h"
#include "reshard/plan/python_values.h"

namespace reshard::plan {
namespace {

using format::NodeId;

// The source file whose non-layout values the target file repeats.
const ucp::ModelStatesFile& SourceFile(const ucp::UniversalCheckpoint& ckpt, const Target& target, int tp_rank) {
  const int src = target.tp_size == ckpt.tp_degree() ? tp_rank : 0;
  return *ckpt.ModelStatesForTp(src);
}

bool LayoutChanged(const ucp::UniversalCheckpoint& ckpt, const Target& target) {
  return target.tp_size != ckpt.tp_degree() || target.dp_size != ckpt.dp_world_size() ||
         (target.zero_stage == 3) != (ckpt.zero_stage() == 3);
}

// A module entry for a trainable parameter.
Result<NodeId> LpTensor(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const Target& target,
                        const ucp::ParamEntry& p, int tp_rank, SourceTable& sources) {
  if (target.zero_stage == 3) return b.AddTensor(target.lp_dtype, {0}, {}, Conversion::kCopy);
  RS_ASSIGN_OR_RETURN(LpWeight lp, PlanLpWeight(ckpt, p, target, tp_rank, sources));
  return b.AddTensor(target.lp_dtype, lp.shape, std::move(lp.extents), lp.conversion);
}

Result<NodeId> Module(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const Target& target,
                      const format::TorchArchive& src, NodeId module, int tp_rank, SourceTable& sources) {
  const format::PickleTree& t = src.tree();
  const std::vector<NodeId>* items = format::DictItems(t, module);
  if (items == nullptr) {
    return Corrupt(src.path() + ": 'module' is " + format::DescribeNode(t, module) + ", not a state dict");
  }
  std::vector<std::pair<NodeId, NodeId>> entries;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    const NodeId key = (*items)[i];
    const NodeId value = (*items)[i + 1];
    const std::optional<std::string_view> name = format::AsStr(t, key);
    const ucp::ParamEntry* p = name ? ckpt.FindParam(*name) : nullptr;
    RS_ASSIGN_OR_RETURN(NodeId k, b.Import(src, key));
    if (p != nullptr && p->listed) {
      RS_ASSIGN_OR_RETURN(NodeId v, LpTensor(b, ckpt, target, *p, tp_rank, sources));
      b.Substitute(src, value, v);  // a tied alias later in the dict is the same tensor
      entries.emplace_back(k, v);
    } else {
      RS_ASSIGN_OR_RETURN(NodeId v, b.Import(src, value));
      entries.emplace_back(k, v);
    }
  }
  const NodeId out = AddOrderedDict(b.tree(), entries);
  const NodeId metadata = t.node(module).state;
  if (metadata != format::kNoNode) {
    RS_ASSIGN_OR_RETURN(NodeId state, b.Import(src, metadata));
    b.tree().mutable_node(out).state = state;
  }
  return out;
}

NodeId ParamShapes(format::PickleTree& tree, const std::vector<ParamShapeGroup>& groups) {
  std::vector<NodeId> list;
  for (const ParamShapeGroup& g : groups) {
    std::vector<std::pair<NodeId, NodeId>> items;
    for (size_t i = 0; i < g.names.size(); ++i) {
      items.emplace_back(tree.AddStr(g.names[i]), AddTorchSize(tree, g.shapes[i]));
    }
    list.push_back(AddOrderedDict(tree, items));
  }
  return tree.AddList(std::move(list));
}

bool IsEmptyOrNone(const format::PickleTree& t, NodeId id) {
  if (format::IsNone(t, id)) return true;
  const std::vector<NodeId>* items = format::DictItems(t, id);
  return items != nullptr && items->empty();
}

// The view a module entry's tensor takes of its storage, for telling aliases apart: torch.save writes
// a tied parameter's state_dict entries as separate tensor objects over one storage.
struct TensorView {
  std::string storage;
  int64_t offset = 0;
  std::vector<int64_t> shape;
  std::vector<int64_t> stride;

  bool operator==(const TensorView& o) const {
    return storage == o.storage && offset == o.offset && shape == o.shape && stride == o.stride;
  }
};

std::optional<TensorView> ViewOf(const format::PickleTree& t, NodeId value) {
  auto tensor = format::MatchTensor(t, value);
  if (!tensor.ok() || !*tensor) return std::nullopt;
  const format::TensorRef& r = **tensor;
  return TensorView{r.storage.key, r.storage_offset, r.shape, r.stride};
}

// The module entries that are frozen parameters: neither a listed (trainable) parameter, nor a
// buffer, nor an alias of a listed parameter (the same pickled tensor object, or the same view of
// the same storage: a tied lm_head.weight).
std::vector<std::string> FrozenParams(const ucp::UniversalCheckpoint& ckpt, const format::PickleTree& t) {
  const NodeId module = format::DictLookup(t, t.root(), "module");
  const std::vector<NodeId>* items = format::DictItems(t, module);
  std::vector<std::string> buffers =
      format::AsStrSequence(t, format::DictLookup(t, t.root(), "buffer_names")).value_or(std::vector<std::string>{});
  std::vector<NodeId> trainable;
  std::vector<TensorView> trainable_views;
  std::vector<std::string> frozen;
  if (items == nullptr) return frozen;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    const std::string name(format::AsStr(t, (*items)[i]).value_or(""));
    const NodeId value = (*items)[i + 1];
    const ucp::ParamEntry* p = ckpt.FindParam(name);
    const std::optional<TensorView> view = ViewOf(t, value);
    if (p != nullptr && p->listed) {
      trainable.push_back(value);
      if (view) trainable_views.push_back(*view);
      continue;
    }
    const bool same_node = std::find(trainable.begin(), trainable.end(), value) != trainable.end();
    const bool same_view =
        view && std::find(trainable_views.begin(), trainable_views.end(), *view) != trainable_views.end();
    const bool alias = same_node || same_view;
    if (!alias && std::find(buffers.begin(), buffers.end(), name) == buffers.end()) frozen.push_back(name);
  }
  return frozen;
}

// frozen_param_shapes / frozen_param_fragments: None below ZeRO-2 (DeepSpeed saves them from
// stage 2 on); copied when the source has them and the layout keeps them valid; an empty
// OrderedDict when the model has no frozen parameters.
Result<NodeId> FrozenValue(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const Target& target,
                           const format::TorchArchive& src, NodeId value, bool fragments) {
  const format::PickleTree& t = src.tree();
  if (target.zero_stage < 2) return b.tree().AddNone();
  if (IsEmptyOrNone(t, value) && FrozenParams(ckpt, t).empty()) return AddOrderedDict(b.tree(), {});
  if (!format::IsNone(t, value) && (!fragments || !LayoutChanged(ckpt, target))) return b.Import(src, value);
  const std::vector<std::string> frozen = FrozenParams(ckpt, t);
  const std::string whose = frozen.empty() ? std::string("the source's frozen parameters")
                                           : "frozen parameters (" + frozen.front() + ", ...)";
  const std::string why = format::IsNone(t, value)
                              ? " are missing; a ZeRO-2/3 target needs them"
                              : " cannot be re-partitioned yet; serve this checkpoint at its own TP, DP and ZeRO stage";
  return Unsupported(src.path() + ": " + (fragments ? "frozen_param_fragments" : "frozen_param_shapes") + " of " +
                     whose + why);
}

}  // namespace

Result<FilePlan> PlanModelStatesFile(const ucp::UniversalCheckpoint& ckpt, const Target& target, int tp_rank,
                                     int dp_rank, const std::vector<ParamShapeGroup>& param_shapes,
                                     SourceTable& sources) {
  const ucp::ModelStatesFile& file = SourceFile(ckpt, target, tp_rank);
  const format::TorchArchive& src = file.archive;
  const format::PickleTree& t = src.tree();
  const std::vector<NodeId>* root = format::DictItems(t, t.root());
  if (root == nullptr || t.node(t.root()).kind != format::NodeKind::kDict) {
    return Corrupt(src.path() + ": the top level is " + format::DescribeNode(t, t.root()) + ", not a dict");
  }
  // A frozen parameter's module entry is copied from the source file as it is: right only where the
  // layout is the source's own.
  if (const std::vector<std::string> frozen = FrozenParams(ckpt, t); !frozen.empty() && LayoutChanged(ckpt, target)) {
    return Unsupported(src.path() + ": frozen parameters (" + frozen.front() +
                       ", ...) cannot be re-partitioned yet; serve this checkpoint at its own TP, DP and ZeRO stage");
  }
  FileBuilder b(target.tag + "/" + ModelStatesFileName(target, tp_rank, dp_rank), sources);
  format::PickleTree& out = b.tree();
  std::vector<std::pair<NodeId, NodeId>> entries;
  for (size_t i = 0; i + 1 < root->size(); i += 2) {
    const NodeId key = (*root)[i];
    const NodeId value = (*root)[i + 1];
    const std::string name(format::AsStr(t, key).value_or(""));
    RS_ASSIGN_OR_RETURN(NodeId k, b.Import(src, key));
    NodeId v = format::kNoNode;
    if (name == "module") {
      RS_ASSIGN_OR_RETURN(v, Module(b, ckpt, target, src, value, tp_rank, sources));
    } else if (name == "param_shapes") {
      v = ParamShapes(out, param_shapes);
    } else if (name == "dp_world_size") {
      v = out.AddInt(target.dp_size);
    } else if (name == "mp_world_size") {
      v = out.AddInt(target.tp_size);
    } else if (name == "checkpoint_parallel_dimensions" && format::DictItems(t, value) != nullptr) {
      RS_ASSIGN_OR_RETURN(v, b.Import(src, value));
      out.DictSet(v, out.AddStr("tp_degree"), out.AddInt(target.tp_size));
    } else if (name == "ds_config" && !target.ds_config.is_null()) {
      v = AddJson(out, target.ds_config);
    } else if (name == "frozen_param_shapes" || name == "frozen_param_fragments") {
      RS_ASSIGN_OR_RETURN(v, FrozenValue(b, ckpt, target, src, value, name == "frozen_param_fragments"));
    } else {
      RS_ASSIGN_OR_RETURN(v, b.Import(src, value));
    }
    entries.emplace_back(k, v);
  }
  out.set_root(out.AddDict(std::move(entries)));
  return std::move(b).Finish();
}

}  // namespace reshard::plan
