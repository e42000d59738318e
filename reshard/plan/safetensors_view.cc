#include "reshard/plan/safetensors_view.h"

#include <map>
#include <set>
#include <utility>

#include "reshard/format/pickle_query.h"
#include "reshard/format/safetensors_writer.h"
#include "reshard/format/torch_tensor.h"

namespace reshard::plan {
namespace {

using format::NodeId;

// Deep enough for every DeepSpeed file (the optimizer state nests 5 levels); bounds recursion.
constexpr int kMaxNameDepth = 64;
// A value shared by reference is named at each reference, so a small DAG (lists that each hold
// the next one twice) has exponentially many paths: the walk stops after this many values.
constexpr uint64_t kMaxVisits = uint64_t{1} << 22;

struct Found {
  std::string name;
  format::TensorRef tensor;
};

Status Collect(const format::PickleTree& tree, NodeId id, const std::string& name, int depth,
               std::set<NodeId>& open, uint64_t& visits, std::vector<Found>& out) {
  if (depth > kMaxNameDepth || open.count(id) != 0) return Status::Ok();  // too deep, or a cycle
  if (++visits > kMaxVisits) {
    return ResourceExhausted("naming its tensors reaches more than " + std::to_string(kMaxVisits) +
                             " values (values shared by reference count at each reference)");
  }
  RS_ASSIGN_OR_RETURN(std::optional<format::TensorRef> tensor, format::MatchTensor(tree, id));
  if (tensor) {
    if (!name.empty() && tensor->is_contiguous()) out.push_back({name, std::move(*tensor)});
    return Status::Ok();
  }
  auto child = [&](const std::string& key) { return name.empty() ? key : name + "." + key; };
  open.insert(id);
  if (const std::vector<NodeId>* items = format::DictItems(tree, id)) {
    for (size_t i = 0; i + 1 < items->size(); i += 2) {
      std::string key;
      if (auto s = format::AsStr(tree, (*items)[i])) {
        key = std::string(*s);
      } else if (auto n = format::AsInt(tree, (*items)[i])) {
        key = std::to_string(*n);
      } else {
        continue;
      }
      RS_RETURN_IF_ERROR(Collect(tree, (*items)[i + 1], child(key), depth + 1, open, visits, out));
    }
  } else if (const std::vector<NodeId>* seq = format::SequenceItems(tree, id)) {
    for (size_t i = 0; i < seq->size(); ++i) {
      RS_RETURN_IF_ERROR(Collect(tree, (*seq)[i], child(std::to_string(i)), depth + 1, open, visits, out));
    }
  }
  open.erase(id);
  return Status::Ok();
}

}  // namespace

Result<SafetensorsView> SafetensorsView::Create(const FilePlan& plan) {
  std::vector<Found> found;
  std::set<NodeId> open;
  uint64_t visits = 0;
  if (Status s = Collect(plan.tree, plan.tree.root(), "", 0, open, visits, found); !s.ok()) {
    return s.Annotate(plan.path);
  }
  std::map<std::string, uint32_t> storage_index;
  for (size_t i = 0; i < plan.storages.size(); ++i) storage_index[plan.storages[i].key] = static_cast<uint32_t>(i);
  SafetensorsView view;
  std::vector<format::SafetensorsTensor> tensors;
  for (const Found& f : found) {
    const auto it = storage_index.find(f.tensor.storage.key);
    if (it == storage_index.end()) return Internal(plan.path + ": tensor '" + f.name + "' names an unplanned storage");
    tensors.push_back({f.name, f.tensor.dtype, f.tensor.shape});
    view.pieces_.push_back({it->second, static_cast<uint64_t>(f.tensor.storage_offset) * format::ItemSize(f.tensor.dtype)});
  }
  view.pieces_.shrink_to_fit();
  RS_ASSIGN_OR_RETURN(format::SafetensorsLayout layout, format::LayoutSafetensors(tensors));
  view.file_ = std::move(layout.file);
  return view;
}

Result<size_t> SafetensorsView::Read(const PlannedStorages& storages, const SourceFiles& files, uint64_t offset,
                                     uint8_t* out, size_t length) const {
  auto fill = [&](uint32_t tensor, uint64_t tensor_offset, uint8_t* dest, size_t n) -> Status {
    const Piece& p = pieces_[tensor];
    return storages.Read(files, p.storage, p.byte_offset + tensor_offset, dest, n);
  };
  return file_.Read(offset, out, length, fill);
}

}  // namespace reshard::plan
