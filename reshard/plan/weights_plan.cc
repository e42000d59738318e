#include "reshard/plan/weights_plan.h"

#include <algorithm>
#include <utility>
#include <vector>

#include "reshard/format/pickle_query.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/plan/file_builder.h"
#include "reshard/plan/frozen_params.h"
#include "reshard/plan/lp_weight.h"
#include "reshard/plan/state_extents.h"
#include "reshard/plan/target.h"

namespace reshard::plan {

using format::NodeId;

Result<FilePlan> PlanWeights(const ucp::UniversalCheckpoint& ckpt, const std::string& path, format::DType dtype,
                             SourceTable& sources) {
  RS_ASSIGN_OR_RETURN(const Conversion conversion, LpConversion(dtype));
  const ucp::ModelStatesFile* first = ckpt.ModelStatesForTp(0);
  if (first == nullptr) return Internal(ckpt.dir() + ": no model-states file for TP rank 0");
  const format::TorchArchive& src = first->archive;
  const format::PickleTree& t = src.tree();
  const NodeId module = format::DictLookup(t, t.root(), "module");
  FileBuilder b(path, sources);
  format::PickleTree& out = b.tree();
  std::vector<std::pair<std::string, NodeId>> entries;

  const std::vector<std::string> buffers =
      format::AsStrSequence(t, format::DictLookup(t, t.root(), "buffer_names")).value_or(std::vector<std::string>{});
  if (const std::vector<NodeId>* items = format::DictItems(t, module)) {
    for (size_t i = 0; i + 1 < items->size(); i += 2) {
      const std::string name(format::AsStr(t, (*items)[i]).value_or(""));
      if (std::find(buffers.begin(), buffers.end(), name) == buffers.end()) continue;
      RS_ASSIGN_OR_RETURN(std::optional<format::TensorRef> ref, format::MatchTensor(t, (*items)[i + 1]));
      if (ref && (ref->dtype == format::DType::kBFloat16 || ref->dtype == format::DType::kFloat16)) {
        return Unsupported(src.path() + ": buffer '" + name + "' is stored in " +
                           std::string(format::TorchName(ref->dtype)) +
                           " and zero_to_fp32 upcasts it; reshardfs does not convert to float32 yet");
      }
      RS_ASSIGN_OR_RETURN(NodeId v, b.Import(src, (*items)[i + 1]));
      entries.emplace_back(name, v);
    }
  }

  Target source_layout;
  source_layout.zero_stage = ckpt.zero_stage();
  source_layout.tp_size = ckpt.tp_degree();
  source_layout.dp_size = ckpt.dp_world_size();
  RS_ASSIGN_OR_RETURN(std::vector<FrozenParam> frozen, PlanFrozenParams(ckpt, source_layout, 0, sources));
  if (!frozen.empty() && ckpt.tp_degree() > 1) {
    return Unsupported(src.path() + ": frozen parameters (" + frozen.front().name + ", ...) of a checkpoint saved with TP " +
                       std::to_string(ckpt.tp_degree()) + " are held in TP slices no rule merges");
  }
  for (FrozenParam& f : frozen) {
    RS_ASSIGN_OR_RETURN(NodeId v, b.AddTensor(f.dtype, f.shape, std::move(f.value), Conversion::kCopy));
    entries.emplace_back(f.name, v);
  }

  for (const ucp::ParamEntry& p : ckpt.params()) {
    if (!p.listed) continue;
    const ucp::StateTensor& fp32 = p.states.at("fp32");
    // The logical shape: a ZeRO-3 conversion stores it flat; a TP-merged one is its full shape.
    const std::vector<int64_t>& shape = p.bare_tensor && !p.tp_shapes.empty() ? p.tp_shapes[0] : p.full_shape;
    ExtentList extents;
    RS_RETURN_IF_ERROR(AppendStateExtents(extents, sources, fp32, {view::Gather::Source(0, fp32.numel())}));
    if (fp32.numel() == 0) extents.clear();
    if (conversion != Conversion::kCopy && fp32.dtype != format::DType::kFloat32) {
      return Unsupported(fp32.path + ": '" + p.name + "' has a " + std::string(format::TorchName(fp32.dtype)) +
                         " master; --export-dtype converts float32 masters");
    }
    RS_ASSIGN_OR_RETURN(NodeId v, b.AddTensor(conversion == Conversion::kCopy ? fp32.dtype : dtype, shape,
                                              std::move(extents), conversion));
    entries.emplace_back(p.name, v);
  }

  // shared_params {alias: canonical}: zero_to_fp32 sets state_dict[alias] = state_dict[canonical].
  const NodeId shared = format::DictLookup(t, t.root(), "shared_params");
  if (const std::vector<NodeId>* items = format::DictItems(t, shared)) {
    for (size_t i = 0; i + 1 < items->size(); i += 2) {
      const auto alias = format::AsStr(t, (*items)[i]);
      const auto canonical = format::AsStr(t, (*items)[i + 1]);
      if (!alias || !canonical) continue;
      const auto c = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == *canonical; });
      if (c == entries.end()) continue;
      const NodeId value = c->second;
      const auto a = std::find_if(entries.begin(), entries.end(), [&](const auto& e) { return e.first == *alias; });
      if (a != entries.end()) {
        a->second = value;
      } else {
        entries.emplace_back(std::string(*alias), value);
      }
    }
  }
  std::vector<std::pair<NodeId, NodeId>> dict;
  for (auto& [name, v] : entries) dict.emplace_back(out.AddStr(name), v);
  out.set_root(out.AddDict(std::move(dict)));
  return std::move(b).Finish();
}

}  // namespace reshard::plan
