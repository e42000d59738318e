#include "reshard/plan/file_builder.h"

#include <unordered_map>

#include "reshard/format/torch_tensor.h"

namespace reshard::plan {
namespace {

using format::Node;
using format::NodeId;
using format::NodeKind;

// Deeper than any tree the pickle writer accepts (its max_depth is 512): a source tree that
// nests further could not be written anyway, and this bounds the recursion.
constexpr int kMaxImportDepth = 512;

// Placeholder keys cannot collide with final ones ("0", "1", ...): they start with a letter.
std::string PlaceholderKey(size_t index) { return "s" + std::to_string(index); }

}  // namespace

FileBuilder::FileBuilder(std::string path, SourceTable& sources) : sources_(sources) {
  plan_.path = std::move(path);
}

Result<NodeId> FileBuilder::Import(const format::TorchArchive& source, NodeId id) {
  return ImportNode(source, id, 0);
}

void FileBuilder::Substitute(const format::TorchArchive& source, NodeId id, NodeId copy) {
  memo_[{&source, id}] = copy;
}

Result<NodeId> FileBuilder::ImportNode(const format::TorchArchive& source, NodeId id, int depth) {
  const format::PickleTree& src = source.tree();
  if (!src.valid(id)) return Internal(source.path() + ": import of a node outside the tree");
  if (const auto it = memo_.find({&source, id}); it != memo_.end()) return it->second;
  if (depth > kMaxImportDepth) {
    return ResourceExhausted(source.path() + ": value nested deeper than " + std::to_string(kMaxImportDepth));
  }
  const Node& n = src.node(id);
  if (n.kind == NodeKind::kPersId) {
    RS_ASSIGN_OR_RETURN(NodeId copy, ImportPersId(source, id));
    memo_[{&source, id}] = copy;
    return copy;
  }
  // Containers are registered before their children are copied, so a cycle (a list holding
  // itself) closes on the copy instead of recursing forever; children are filled in afterwards.
  Node shell = n;
  shell.items.clear();
  if (shell.extras) {  // keeps a global's name; the object's items are imported below
    shell.extras->list_items.clear();
    shell.extras->dict_items.clear();
  }
  shell.state = format::kNoNode;
  format::PickleTree& out = plan_.tree;
  const NodeId copy = out.AddNone();  // becomes `shell`: same kind and scalar payload
  out.mutable_node(copy) = std::move(shell);
  memo_[{&source, id}] = copy;
  auto copy_all = [&](const std::vector<NodeId>& from, std::vector<NodeId>& to) -> Status {
    for (NodeId child : from) {
      RS_ASSIGN_OR_RETURN(NodeId c, ImportNode(source, child, depth + 1));
      to.push_back(c);
    }
    return Status::Ok();
  };
  std::vector<NodeId> items, list_items, dict_items;
  RS_RETURN_IF_ERROR(copy_all(n.items, items));
  RS_RETURN_IF_ERROR(copy_all(n.list_items(), list_items));
  RS_RETURN_IF_ERROR(copy_all(n.dict_items(), dict_items));
  NodeId state = format::kNoNode;
  if (n.state != format::kNoNode) {
    RS_ASSIGN_OR_RETURN(state, ImportNode(source, n.state, depth + 1));
  }
  Node& filled = out.mutable_node(copy);  // re-fetched: the arena may have grown
  filled.items = std::move(items);
  if (!list_items.empty() || !dict_items.empty()) {
    filled.mutable_extras().list_items = std::move(list_items);
    filled.mutable_extras().dict_items = std::move(dict_items);
  }
  filled.state = state;
  return copy;
}

Result<NodeId> FileBuilder::ImportPersId(const format::TorchArchive& source, NodeId id) {
  RS_ASSIGN_OR_RETURN(format::StorageRef ref, format::MatchStorage(source.tree(), id));
  const auto found = source.storages().find(ref.key);
  if (found == source.storages().end()) {
    return Corrupt(source.path() + ": storage '" + ref.key + "' has no record");
  }
  auto [it, inserted] = imported_storages_.try_emplace({&source, ref.key});
  if (inserted) {
    const format::ArchiveStorage& record = found->second;
    const uint64_t numel = ref.nbytes / format::ItemSize(ref.dtype);
    StoragePlan storage;
    storage.dtype = ref.dtype;
    storage.numel = numel;
    storage.conversion = Conversion::kCopy;
    const uint32_t s = sources_.Intern(Source{source.path(), record.data_offset, ref.dtype, numel, nullptr});
    if (numel > 0) AppendExtents(storage.extents, s, {view::Gather::Source(0, numel)});
    it->second = NewStorage(std::move(storage));
  }
  // The persistent id is a tuple ('storage', class, key, location, numel): copy it with the new
  // key, everything else as it was.
  const format::PickleTree& src = source.tree();
  const Node& tuple = src.node(src.node(id).items.at(0));
  std::vector<NodeId> fields;
  for (size_t i = 0; i < tuple.items.size(); ++i) {
    if (i == 2) {
      fields.push_back(plan_.tree.AddStr(it->second));
    } else {
      RS_ASSIGN_OR_RETURN(NodeId c, ImportNode(source, tuple.items[i], 1));
      fields.push_back(c);
    }
  }
  return plan_.tree.AddPersId(plan_.tree.AddTuple(std::move(fields)));
}

std::string FileBuilder::NewStorage(StoragePlan storage) {
  storage.key = PlaceholderKey(plan_.storages.size());
  plan_.storages.push_back(std::move(storage));
  return plan_.storages.back().key;
}

Result<NodeId> FileBuilder::AddTensor(format::DType dtype, const std::vector<int64_t>& shape, ExtentList extents,
                                      Conversion conversion, bool requires_grad) {
  uint64_t numel = 1;
  for (int64_t d : shape) numel *= static_cast<uint64_t>(d);
  if (NumElements(extents) != numel) {
    return Internal(plan_.path + ": a planned tensor has " + std::to_string(NumElements(extents)) +
                    " source elements for " + std::to_string(numel) + " stored ones");
  }
  const bool converts_ok = conversion == Conversion::kCopy ||
                           (conversion == Conversion::kFp32ToBf16 && dtype == format::DType::kBFloat16) ||
                           (conversion == Conversion::kFp32ToFp16 && dtype == format::DType::kFloat16);
  if (!converts_ok) return Internal(plan_.path + ": a conversion that does not produce the tensor's dtype");
  StoragePlan storage;
  storage.dtype = dtype;
  storage.numel = numel;
  storage.conversion = conversion;
  storage.extents = std::move(extents);
  format::TensorRef t;
  t.storage.key = NewStorage(std::move(storage));
  t.storage.location = "cpu";
  t.storage.dtype = dtype;
  t.storage.nbytes = numel * format::ItemSize(dtype);
  t.dtype = dtype;
  t.requires_grad = requires_grad;
  t.shape = shape;
  t.stride.assign(shape.size(), 1);
  for (size_t i = shape.size(); i-- > 1;) t.stride[i - 1] = t.stride[i] * shape[i];
  return format::AddTensor(plan_.tree, t);
}

Result<FilePlan> FileBuilder::Finish() && {
  RS_ASSIGN_OR_RETURN(std::vector<format::StorageRef> order, format::CollectStorages(plan_.tree));
  std::unordered_map<std::string, size_t> position;  // placeholder -> index in plan_.storages
  for (size_t i = 0; i < plan_.storages.size(); ++i) position[plan_.storages[i].key] = i;
  if (order.size() != plan_.storages.size()) {
    return Internal(plan_.path + ": " + std::to_string(plan_.storages.size()) + " storages planned, " +
                    std::to_string(order.size()) + " named by the pickle");
  }
  std::unordered_map<std::string, std::string> rename;
  std::vector<StoragePlan> sorted;
  for (size_t k = 0; k < order.size(); ++k) {
    const auto it = position.find(order[k].key);
    if (it == position.end()) return Internal(plan_.path + ": the pickle names an unplanned storage");
    rename[order[k].key] = std::to_string(k);
    sorted.push_back(std::move(plan_.storages[it->second]));
    sorted.back().key = std::to_string(k);
  }
  // Every persistent id ('storage', class, key, ...) gets its final key.
  for (NodeId id = 0; id < plan_.tree.size(); ++id) {
    const Node& n = plan_.tree.node(id);
    if (n.kind != NodeKind::kPersId || n.items.empty()) continue;
    const Node& tuple = plan_.tree.node(n.items[0]);
    if (tuple.kind != NodeKind::kTuple || tuple.items.size() < 3) continue;
    Node& key = plan_.tree.mutable_node(tuple.items[2]);
    if (key.kind != NodeKind::kStr) continue;
    if (const auto it = rename.find(key.text); it != rename.end()) key.text = it->second;
  }
  plan_.storages = std::move(sorted);
  return std::move(plan_);
}

}  // namespace reshard::plan
