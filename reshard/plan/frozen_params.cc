#include "reshard/plan/frozen_params.h"

#include <algorithm>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "reshard/base/checked_math.h"
#include "reshard/format/pickle_query.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/layout/zero_partition.h"
#include "reshard/plan/lp_weight.h"
#include "reshard/plan/param_slice.h"
#include "reshard/ucp/param_state.h"

namespace reshard::plan {
namespace {

using format::NodeId;

// The view a module entry's tensor takes of its storage, for telling aliases apart.
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

// The tensor `value` of `archive` as one source run of its elements (ucp::LocateTensor).
Result<ExtentList> ContiguousTensor(const format::TorchArchive& archive, NodeId value, const std::string& what,
                                    SourceTable& sources, format::TensorRef* out) {
  RS_ASSIGN_OR_RETURN(std::optional<format::TensorRef> tensor, format::MatchTensor(archive.tree(), value));
  if (!tensor) {
    return Unsupported(archive.path() + ": " + what + " is " + format::DescribeNode(archive.tree(), value) +
                       ", not a tensor");
  }
  if (!tensor->is_contiguous()) {
    return Unsupported(archive.path() + ": " + what + " is a non-contiguous view of its storage");
  }
  auto located = ucp::LocateTensor(archive, *tensor);
  if (!located.ok()) return std::move(located.status()).Annotate(archive.path() + ": " + what);
  ExtentList extents;
  if (located->numel() > 0) {
    const uint32_t source =
        sources.Intern(Source{located->path, located->data_offset, located->dtype, located->numel(), nullptr});
    AppendExtents(extents, source, {view::Gather::Source(0, located->numel())});
  }
  *out = *tensor;
  return extents;
}

// ZeRO-1/2 source: the module entry of TP rank `tp_rank`'s file.
Result<FrozenParam> FromModule(const format::TorchArchive& archive, NodeId module, const std::string& name,
                               SourceTable& sources) {
  FrozenParam p{name, {}, format::DType::kFloat32, {}};
  format::TensorRef ref;
  RS_ASSIGN_OR_RETURN(p.value, ContiguousTensor(archive, format::DictLookup(archive.tree(), module, name),
                                                "module entry '" + name + "'", sources, &ref));
  p.shape = ref.shape;
  p.dtype = ref.dtype;
  return p;
}

// ZeRO-3 source: the fragments of every DP rank's file for TP rank `tp_rank`, concatenated and cut
// to the parameter's size.
Result<FrozenParam> FromFragments(const std::vector<const ucp::ModelStatesFile*>& files, const std::string& name,
                                  SourceTable& sources) {
  const format::TorchArchive& first = files.front()->archive;
  const format::PickleTree& t0 = first.tree();
  const NodeId shapes = format::DictLookup(t0, t0.root(), "frozen_param_shapes");
  std::optional<std::vector<int64_t>> shape = format::AsTorchSize(t0, format::DictLookup(t0, shapes, name));
  if (!shape) {
    return Unsupported(first.path() + ": frozen parameter '" + name +
                       "' has no torch.Size in frozen_param_shapes (a ZeRO-3 source keeps its values there)");
  }
  uint64_t numel = 1;
  for (int64_t d : *shape) {
    const std::optional<uint64_t> n = d < 0 ? std::nullopt : CheckedMul(numel, static_cast<uint64_t>(d));
    if (!n) return Corrupt(first.path() + ": frozen_param_shapes['" + name + "'] is not a valid shape");
    numel = *n;
  }
  FrozenParam p{name, *shape, format::DType::kFloat32, {}};
  for (size_t d = 0; d < files.size(); ++d) {
    const format::TorchArchive& archive = files[d]->archive;
    const format::PickleTree& t = archive.tree();
    const NodeId fragments = format::DictLookup(t, t.root(), "frozen_param_fragments");
    const NodeId fragment = format::DictLookup(t, fragments, name);
    const std::string what = "frozen_param_fragments['" + name + "']";
    if (fragment == format::kNoNode) {
      return Unsupported(archive.path() + ": " + what + " is missing (a ZeRO-3 source keeps its values there)");
    }
    RS_ASSIGN_OR_RETURN(layout::Zero3ParamPart part,
                        layout::PartitionZero3Param(numel, static_cast<uint32_t>(files.size()),
                                                    static_cast<uint32_t>(d)));
    format::TensorRef ref;
    RS_ASSIGN_OR_RETURN(ExtentList extents, ContiguousTensor(archive, fragment, what, sources, &ref));
    if (ref.shape != std::vector<int64_t>{static_cast<int64_t>(part.partition_numel)} ||
        (d > 0 && ref.dtype != p.dtype)) {
      return Corrupt(archive.path() + ": " + what + " is not a 1-D " + std::to_string(part.partition_numel) +
                     "-element partition of the " + std::to_string(numel) + "-element parameter in " +
                     std::string(format::TorchName(d > 0 ? p.dtype : ref.dtype)));
    }
    p.dtype = ref.dtype;
    RS_ASSIGN_OR_RETURN(ExtentList real, SliceExtents(extents, 0, part.real_numel));
    p.value.insert(p.value.end(), real.begin(), real.end());
  }
  return p;
}

}  // namespace

std::map<std::string, std::string> ModuleAliases(const ucp::UniversalCheckpoint& ckpt, const format::PickleTree& t) {
  const std::vector<NodeId>* items = format::DictItems(t, format::DictLookup(t, t.root(), "module"));
  std::map<std::string, std::string> aliases;
  if (items == nullptr) return aliases;
  std::vector<std::pair<NodeId, std::string>> trainable;
  std::vector<std::pair<TensorView, std::string>> trainable_views;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    const std::string name(format::AsStr(t, (*items)[i]).value_or(""));
    const NodeId value = (*items)[i + 1];
    const ucp::ParamEntry* p = ckpt.FindParam(name);
    const std::optional<TensorView> view = ViewOf(t, value);
    if (p != nullptr && p->listed) {
      trainable.emplace_back(value, name);
      if (view) trainable_views.emplace_back(*view, name);
      continue;
    }
    const auto node = std::find_if(trainable.begin(), trainable.end(), [&](const auto& e) { return e.first == value; });
    if (node != trainable.end()) {
      aliases.emplace(name, node->second);
      continue;
    }
    const auto same_view = std::find_if(trainable_views.begin(), trainable_views.end(),
                                        [&](const auto& e) { return view && e.first == *view; });
    if (same_view != trainable_views.end()) aliases.emplace(name, same_view->second);
  }
  return aliases;
}

std::vector<std::string> FrozenParamNames(const ucp::UniversalCheckpoint& ckpt, const format::PickleTree& t) {
  const std::vector<NodeId>* items = format::DictItems(t, format::DictLookup(t, t.root(), "module"));
  const std::vector<std::string> buffers =
      format::AsStrSequence(t, format::DictLookup(t, t.root(), "buffer_names")).value_or(std::vector<std::string>{});
  const std::map<std::string, std::string> aliases = ModuleAliases(ckpt, t);
  std::vector<std::string> frozen;
  if (items == nullptr) return frozen;
  for (size_t i = 0; i + 1 < items->size(); i += 2) {
    const std::string name(format::AsStr(t, (*items)[i]).value_or(""));
    const ucp::ParamEntry* p = ckpt.FindParam(name);
    if ((p != nullptr && p->listed) || aliases.count(name) > 0) continue;
    if (std::find(buffers.begin(), buffers.end(), name) == buffers.end()) frozen.push_back(name);
  }
  return frozen;
}

Result<std::vector<FrozenParam>> PlanFrozenParams(const ucp::UniversalCheckpoint& ckpt, const Target& target,
                                                  int tp_rank, SourceTable& sources) {
  const bool same_tp = target.tp_size == ckpt.tp_degree();
  const ucp::ModelStatesFile* file = ckpt.ModelStatesForTp(same_tp ? tp_rank : 0);
  if (file == nullptr) return Internal("no model-states file for source TP rank " + std::to_string(tp_rank));
  const format::PickleTree& t = file->archive.tree();
  const std::vector<std::string> names = FrozenParamNames(ckpt, t);
  std::vector<FrozenParam> out;
  if (names.empty()) return out;
  if (!same_tp) {
    // Only a ZeRO-1/2 checkpoint saved without TP holds them whole (the converter's zero/<name>/fp32.pt);
    // the target's AutoTP layout then cuts them as it cuts the trainable weights.
    if (ckpt.tp_degree() != 1 || ckpt.zero_stage() == 3) {
      return Unsupported(file->archive.path() + ": frozen parameters (" + names.front() +
                         ", ...) cannot be re-cut from TP " + std::to_string(ckpt.tp_degree()) + " to TP " +
                         std::to_string(target.tp_size) +
                         ": only a ZeRO-1/2 checkpoint saved without TP holds them whole; serve it at its own "
                         "TP degree");
    }
    for (const std::string& name : names) {
      const ucp::ParamEntry* p = ckpt.FindParam(name);
      if (p == nullptr) {
        return Unsupported(ckpt.dir() + "/zero/" + name + ": missing; a frozen parameter re-cut for TP " +
                           std::to_string(target.tp_size) + " is read from the converter's fp32.pt");
      }
      RS_ASSIGN_OR_RETURN(std::optional<layout::AutoTpRestoreMeta> meta, TargetAutoTpMeta(ckpt, *p, target));
      if (!meta) {
        return Unsupported("frozen parameter '" + name + "': its cut at TP " + std::to_string(target.tp_size) +
                           " is known only from the model's AutoTP layout (an AutoTP target with --model-config)");
      }
      RS_ASSIGN_OR_RETURN(LpWeight lp, PlanLpWeight(ckpt, *p, target, tp_rank, sources));
      out.push_back(FrozenParam{name, std::move(lp.shape), format::DType::kFloat32, std::move(lp.extents)});
    }
    return out;
  }
  std::vector<const ucp::ModelStatesFile*> dp_files;  // ZeRO-3: the TP rank's files by DP rank
  if (ckpt.zero_stage() == 3) {
    for (const ucp::ModelStatesFile& f : ckpt.model_states()) {
      if (f.tp_rank == tp_rank) dp_files.push_back(&f);
    }
    for (size_t d = 0; d < dp_files.size(); ++d) {
      if (dp_files[d]->dp_rank != static_cast<int32_t>(d)) {
        return Corrupt(ckpt.dir() + ": no ZeRO-3 model-states file for TP rank " + std::to_string(tp_rank) +
                       ", DP rank " + std::to_string(d));
      }
    }
  }
  for (const std::string& name : names) {
    if (dp_files.empty()) {
      RS_ASSIGN_OR_RETURN(FrozenParam p, FromModule(file->archive, format::DictLookup(t, t.root(), "module"), name,
                                                    sources));
      out.push_back(std::move(p));
    } else {
      RS_ASSIGN_OR_RETURN(FrozenParam p, FromFragments(dp_files, name, sources));
      out.push_back(std::move(p));
    }
  }
  return out;
}

}  // namespace reshard::plan
