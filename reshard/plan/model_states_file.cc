#include "reshard/plan/model_states_file.h"

#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reshard/format/pickle_query.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/layout/zero_partition.h"
#include "reshard/plan/file_builder.h"
#include "reshard/plan/frozen_params.h"
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

// The target's frozen parameters (plan/frozen_params.h), when they are not copied as they are.
// Their module entries, and the frozen_param_shapes / frozen_param_fragments of a ZeRO-2/3 target, are
// built from the source values; nodes are shared where DeepSpeed's objects are (a ZeRO-2 fragment is
// the parameter itself).
struct FrozenEntries {
  std::vector<FrozenParam> params;
  std::map<std::string, NodeId, std::less<>> module_values;  // name -> its module entry
  std::vector<NodeId> fragments;  // per param: its frozen_param_fragments entry (ZeRO-2/3 targets)
};

// The module entry built for frozen parameter `name`, or kNoNode when `name` is not one.
NodeId FrozenModuleValue(const FrozenEntries& frozen, std::string_view name) {
  const auto it = frozen.module_values.find(name);
  return it == frozen.module_values.end() ? format::kNoNode : it->second;
}

// A module entry for a trainable parameter.
Result<NodeId> LpTensor(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const Target& target,
                        const ucp::ParamEntry& p, int tp_rank, SourceTable& sources) {
  if (target.zero_stage == 3) return b.AddTensor(target.lp_dtype, {0}, {}, Conversion::kCopy);
  RS_ASSIGN_OR_RETURN(LpWeight lp, PlanLpWeight(ckpt, p, target, tp_rank, sources));
  return b.AddTensor(target.lp_dtype, lp.shape, std::move(lp.extents), lp.conversion);
}

Result<NodeId> Module(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const Target& target,
                      const format::TorchArchive& src, NodeId module, int tp_rank,
                      const std::optional<FrozenEntries>& frozen, SourceTable& sources) {
  const format::PickleTree& t = src.tree();
  const std::vector<NodeId>* items = format::DictItems(t, module);
  if (items == nullptr) {
    return Corrupt(src.path() + ": 'module' is " + format::DescribeNode(t, module) + ", not a state dict");
  }
  // A tied alias (lm_head.weight over the embedding's storage) is the planned parameter's tensor, as
  // DeepSpeed's own save shares one storage between the two.
  const std::map<std::string, std::string> aliases = ModuleAliases(ckpt, t);
  std::map<std::string, NodeId, std::less<>> planned;  // listed parameter -> its new tensor
  std::vector<std::pair<NodeId, NodeId>> entries;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    const NodeId key = (*items)[i];
    const NodeId value = (*items)[i + 1];
    const std::optional<std::string_view> name = format::AsStr(t, key);
    const ucp::ParamEntry* p = name ? ckpt.FindParam(*name) : nullptr;
    const auto alias = name ? aliases.find(std::string(*name)) : aliases.end();
    RS_ASSIGN_OR_RETURN(NodeId k, b.Import(src, key));
    if (p != nullptr && p->listed) {
      RS_ASSIGN_OR_RETURN(NodeId v, LpTensor(b, ckpt, target, *p, tp_rank, sources));
      b.Substitute(src, value, v);  // any other reference to this object in the file is the new tensor
      planned.emplace(p->name, v);
      entries.emplace_back(k, v);
    } else if (alias != aliases.end() && planned.count(alias->second) > 0) {
      entries.emplace_back(k, planned.at(alias->second));
    } else if (const NodeId f = frozen && name ? FrozenModuleValue(*frozen, *name) : format::kNoNode;
               f != format::kNoNode) {
      entries.emplace_back(k, f);
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

// DeepSpeed keeps a frozen parameter in the module's lp dtype: a float32 source is rounded like the
// trainable weights; another source dtype is served only as itself.
Result<Conversion> FrozenConversion(const std::string& where, const FrozenParam& p, const Target& target) {
  if (p.dtype == target.lp_dtype) return Conversion::kCopy;
  if (p.dtype == format::DType::kFloat32) return LpConversion(target.lp_dtype);
  return Unsupported(where + ": frozen parameter '" + p.name + "' is stored as " +
                     std::string(format::TorchName(p.dtype)) + "; it can be served only as that dtype, not as " +
                     std::string(format::TorchName(target.lp_dtype)));
}

Result<FrozenEntries> BuildFrozenEntries(FileBuilder& b, const std::string& where, std::vector<FrozenParam> params,
                                         const Target& target, int dp_rank) {
  FrozenEntries out;
  for (const FrozenParam& p : params) {
    RS_ASSIGN_OR_RETURN(Conversion conversion, FrozenConversion(where, p, target));
    if (target.zero_stage != 3) {
      RS_ASSIGN_OR_RETURN(NodeId v, b.AddTensor(target.lp_dtype, p.shape, p.value, conversion));
      out.module_values.emplace(p.name, v);
      out.fragments.push_back(v);
      continue;
    }
    // ZeRO-3: the module holds the released (0,) placeholder, the fragment the rank's partition.
    RS_ASSIGN_OR_RETURN(NodeId placeholder, b.AddTensor(target.lp_dtype, {0}, {}, Conversion::kCopy));
    RS_ASSIGN_OR_RETURN(layout::Zero3ParamPart part,
                        layout::PartitionZero3Param(NumElements(p.value), static_cast<uint32_t>(target.dp_size),
                                                    static_cast<uint32_t>(dp_rank)));
    RS_ASSIGN_OR_RETURN(ExtentList extents, SliceExtents(p.value, part.src_start, part.real_numel));
    AppendZeros(extents, part.partition_numel - part.real_numel);
    RS_ASSIGN_OR_RETURN(NodeId fragment,
                        b.AddTensor(target.lp_dtype, {static_cast<int64_t>(part.partition_numel)}, std::move(extents),
                                    conversion));
    out.module_values.emplace(p.name, placeholder);
    out.fragments.push_back(fragment);
  }
  out.params = std::move(params);
  return out;
}

// Whether the source's frozen entries may be copied as they are: same TP, DP and ZeRO stage, and not
// ZeRO-3, whose fragments differ per DP rank while the file is planned from DP rank 0's. (Their dtype
// must also be the target's.)
bool FrozenLayoutKept(const ucp::UniversalCheckpoint& ckpt, const Target& target) {
  return !LayoutChanged(ckpt, target) && target.zero_stage == ckpt.zero_stage() && target.zero_stage != 3;
}

// frozen_param_shapes / frozen_param_fragments: None below ZeRO-2 (DeepSpeed saves them from
// stage 2 on); rebuilt when the frozen parameters were re-planned; else copied from the source (an
// empty OrderedDict when the model has no frozen parameters).
Result<NodeId> FrozenValue(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt, const Target& target,
                           const format::TorchArchive& src, NodeId value, bool fragments,
                           const std::optional<FrozenEntries>& frozen) {
  const format::PickleTree& t = src.tree();
  if (target.zero_stage < 2) return b.tree().AddNone();
  if (frozen) {
    std::vector<std::pair<NodeId, NodeId>> items;
    for (size_t i = 0; i < frozen->params.size(); ++i) {
      const FrozenParam& p = frozen->params[i];
      items.emplace_back(b.tree().AddStr(p.name),
                         fragments ? frozen->fragments[i] : AddTorchSize(b.tree(), p.shape));
    }
    return AddOrderedDict(b.tree(), items);
  }
  if (IsEmptyOrNone(t, value) && FrozenParamNames(ckpt, t).empty()) return AddOrderedDict(b.tree(), {});
  if (!format::IsNone(t, value)) return b.Import(src, value);
  return Unsupported(src.path() + ": " + (fragments ? "frozen_param_fragments" : "frozen_param_shapes") +
                     " of the source's frozen parameters are missing; a ZeRO-2/3 target needs them");
}

// The frozen parameters re-planned for the target, or nullopt when they are copied as they are.
Result<std::optional<FrozenEntries>> PlanFrozen(FileBuilder& b, const ucp::UniversalCheckpoint& ckpt,
                                                const Target& target, const format::TorchArchive& src, int tp_rank,
                                                int dp_rank) {
  if (FrozenParamNames(ckpt, src.tree()).empty()) return std::optional<FrozenEntries>();
  if (FrozenLayoutKept(ckpt, target)) {
    // Only a dtype change makes them be rebuilt: check it without interning sources the file won't read.
    SourceTable scratch;
    RS_ASSIGN_OR_RETURN(std::vector<FrozenParam> probe, PlanFrozenParams(ckpt, target, tp_rank, scratch));
    if (std::all_of(probe.begin(), probe.end(), [&](const FrozenParam& p) { return p.dtype == target.lp_dtype; })) {
      return std::optional<FrozenEntries>();
    }
  }
  RS_ASSIGN_OR_RETURN(std::vector<FrozenParam> params, PlanFrozenParams(ckpt, target, tp_rank, b.sources()));
  RS_ASSIGN_OR_RETURN(FrozenEntries entries, BuildFrozenEntries(b, src.path(), std::move(params), target, dp_rank));
  return std::optional<FrozenEntries>(std::move(entries));
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
  FileBuilder b(target.tag + "/" + ModelStatesFileName(target, tp_rank, dp_rank), sources);
  format::PickleTree& out = b.tree();
  RS_ASSIGN_OR_RETURN(std::optional<FrozenEntries> frozen, PlanFrozen(b, ckpt, target, src, tp_rank, dp_rank));
  std::vector<std::pair<NodeId, NodeId>> entries;
  for (size_t i = 0; i + 1 < root->size(); i += 2) {
    const NodeId key = (*root)[i];
    const NodeId value = (*root)[i + 1];
    const std::string name(format::AsStr(t, key).value_or(""));
    RS_ASSIGN_OR_RETURN(NodeId k, b.Import(src, key));
    NodeId v = format::kNoNode;
    if (name == "module") {
      RS_ASSIGN_OR_RETURN(v, Module(b, ckpt, target, src, value, tp_rank, frozen, sources));
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
      RS_ASSIGN_OR_RETURN(v, FrozenValue(b, ckpt, target, src, value, name == "frozen_param_fragments", frozen));
    } else {
      RS_ASSIGN_OR_RETURN(v, b.Import(src, value));
    }
    entries.emplace_back(k, v);
  }
  out.set_root(out.AddDict(std::move(entries)));
  return std::move(b).Finish();
}

}  // namespace reshard::plan
