#include "reshard/format/torch_tensor.h"

#include <string>
#include <unordered_map>

#include "reshard/base/checked_math.h"

namespace reshard::format {
namespace {

constexpr std::string_view kUtils = "torch._utils";

const Node* Get(const PickleTree& tree, NodeId id, NodeKind kind) {
  if (!tree.valid(id)) return nullptr;
  const Node& n = tree.node(id);
  return n.kind == kind ? &n : nullptr;
}

Status Bad(std::string_view what) { return Corrupt("tensor rebuild: " + std::string(what)); }

Result<std::vector<int64_t>> IntTuple(const PickleTree& tree, NodeId id, std::string_view what) {
  const Node* t = Get(tree, id, NodeKind::kTuple);
  if (t == nullptr) return Bad(std::string(what) + " is not a tuple");
  if (t->items.size() > kMaxTensorRank) {
    return Unsupported("tensor rebuild: rank " + std::to_string(t->items.size()) +
                       " exceeds the limit " + std::to_string(kMaxTensorRank));
  }
  std::vector<int64_t> out;
  out.reserve(t->items.size());
  for (NodeId item : t->items) {
    const Node* v = Get(tree, item, NodeKind::kInt);
    if (v == nullptr || v->i < 0) return Bad(std::string(what) + " holds a non-integer or negative value");
    out.push_back(v->i);
  }
  return out;
}

}  // namespace

// ('storage', <storage class>, key, location, numel) -> StorageRef.
Result<StorageRef> MatchStorage(const PickleTree& tree, NodeId persid) {
  const Node* p = Get(tree, persid, NodeKind::kPersId);
  if (p == nullptr || p->items.size() != 1) return Bad("first argument is not a persistent id");
  const Node* t = Get(tree, p->items[0], NodeKind::kTuple);
  if (t == nullptr || t->items.size() != 5) return Bad("persistent id is not a 5-tuple");
  const Node* tag = Get(tree, t->items[0], NodeKind::kStr);
  const Node* cls = Get(tree, t->items[1], NodeKind::kGlobal);
  const Node* key = Get(tree, t->items[2], NodeKind::kStr);
  const Node* loc = Get(tree, t->items[3], NodeKind::kStr);
  const Node* numel = Get(tree, t->items[4], NodeKind::kInt);
  if (tag == nullptr || tag->text != "storage") return Bad("persistent id does not start with 'storage'");
  if (cls == nullptr || key == nullptr || loc == nullptr || numel == nullptr || numel->i < 0) {
    return Bad("persistent id fields have the wrong types");
  }
  StorageRef s;
  s.key = key->text;
  s.location = loc->text;
  if (cls->global_name() == "UntypedStorage" && (cls->text == "torch.storage" || cls->text == "torch")) {
    s.untyped = true;
    s.dtype = DType::kUInt8;
    s.nbytes = static_cast<uint64_t>(numel->i);
    return s;
  }
  std::optional<DType> dtype;
  if (cls->text == "torch") dtype = DTypeFromStorageClass(cls->global_name());
  if (!dtype) return Unsupported("tensor rebuild: unknown storage class " + cls->text + "." + cls->global_name());
  s.dtype = *dtype;
  const auto nbytes = CheckedMul(static_cast<uint64_t>(numel->i), ItemSize(*dtype));
  if (!nbytes) return Bad("storage size overflows");
  s.nbytes = *nbytes;
  return s;
}

namespace {

// The byte just past the last element the view touches must lie inside the storage.
Status CheckViewFits(const TensorRef& t) {
  if (t.shape.size() != t.stride.size()) return Bad("size and stride have different ranks");
  uint64_t numel = 1;
  for (int64_t d : t.shape) {
    const auto n = CheckedMul(numel, static_cast<uint64_t>(d));
    if (!n) return Bad("element count overflows");
    numel = *n;
  }
  if (numel == 0) return Status::Ok();
  uint64_t last = static_cast<uint64_t>(t.storage_offset);
  for (size_t k = 0; k < t.shape.size(); ++k) {
    const auto step = CheckedMul(static_cast<uint64_t>(t.shape[k] - 1), static_cast<uint64_t>(t.stride[k]));
    const auto sum = step ? CheckedAdd(last, *step) : std::nullopt;
    if (!sum) return Bad("view extent overflows");
    last = *sum;
  }
  const auto end_elems = CheckedAdd(last, 1);
  const auto end_bytes = end_elems ? CheckedMul(*end_elems, ItemSize(t.dtype)) : std::nullopt;
  if (!end_bytes || *end_bytes > t.storage.nbytes) {
    return Corrupt("tensor rebuild: view of storage '" + t.storage.key + "' ends past its " +
                   std::to_string(t.storage.nbytes) + " bytes");
  }
  return Status::Ok();
}

}  // namespace

uint64_t TensorRef::numel() const {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);  // checked by MatchTensor
  return n;
}

uint64_t TensorRef::span_bytes() const {
  if (numel() == 0) return 0;
  uint64_t last = 0;
  for (size_t k = 0; k < shape.size(); ++k) {
    last += static_cast<uint64_t>(shape[k] - 1) * static_cast<uint64_t>(stride[k]);
  }
  return (last + 1) * ItemSize(dtype);
}

bool TensorRef::is_contiguous() const {
  int64_t expected = 1;
  for (size_t k = shape.size(); k-- > 0;) {
    if (shape[k] != 1 && stride[k] != expected) return false;
    expected *= shape[k];
  }
  return true;
}

namespace {

// The tensor `id` stands for when it calls `fn` with `args_id`: a _rebuild_tensor_v2/v3 call.
Result<std::optional<TensorRef>> MatchRebuildCall(const PickleTree& tree, NodeId id, NodeId fn, NodeId args_id) {
  const bool v2 = tree.IsGlobal(fn, kUtils, "_rebuild_tensor_v2");
  const bool v3 = tree.IsGlobal(fn, kUtils, "_rebuild_tensor_v3");
  if (!v2 && !v3) return std::optional<TensorRef>();

  const Node* args = Get(tree, args_id, NodeKind::kTuple);
  const size_t arity = v3 ? 7 : 6;
  if (args == nullptr || args->items.size() < arity) {
    return Bad(std::string(v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2") +
               " has the wrong number of arguments");
  }
  // A trailing metadata argument (conj/neg bits) changes what the tensor means: leave the call
  // opaque so it is re-emitted unchanged; its storage is still found by CollectStorages.
  if (args->items.size() > arity) return std::optional<TensorRef>();
  TensorRef t;
  t.node = id;
  t.v3 = v3;
  RS_ASSIGN_OR_RETURN(t.storage, MatchStorage(tree, args->items[0]));
  const Node* offset = Get(tree, args->items[1], NodeKind::kInt);
  if (offset == nullptr || offset->i < 0) return Bad("storage_offset is not a non-negative int");
  t.storage_offset = offset->i;
  RS_ASSIGN_OR_RETURN(t.shape, IntTuple(tree, args->items[2], "size"));
  RS_ASSIGN_OR_RETURN(t.stride, IntTuple(tree, args->items[3], "stride"));
  const Node* grad = Get(tree, args->items[4], NodeKind::kBool);
  if (grad == nullptr) return Bad("requires_grad is not a bool");
  t.requires_grad = grad->b;
  if (v3) {
    const Node* dt = Get(tree, args->items[6], NodeKind::kGlobal);
    std::optional<DType> dtype;
    if (dt != nullptr && dt->text == "torch") dtype = DTypeFromTorchName(dt->global_name());
    if (!dtype) return Unsupported("tensor rebuild: _rebuild_tensor_v3 names an unknown dtype");
    t.dtype = *dtype;
  } else {
    if (t.storage.untyped) return Bad("_rebuild_tensor_v2 over an UntypedStorage");
    t.dtype = t.storage.dtype;
  }
  RS_RETURN_IF_ERROR(CheckViewFits(t));
  return std::optional<TensorRef>(std::move(t));
}

}  // namespace

Result<std::optional<TensorRef>> MatchTensor(const PickleTree& tree, NodeId id) {
  const Node* reduce = Get(tree, id, NodeKind::kReduce);
  if (reduce == nullptr || reduce->items.size() != 2) return std::optional<TensorRef>();
  return MatchRebuildCall(tree, id, reduce->items[0], reduce->items[1]);
}

Result<std::optional<TensorRef>> MatchTensorWithAttributes(const PickleTree& tree, NodeId id) {
  RS_ASSIGN_OR_RETURN(std::optional<TensorRef> plain, MatchTensor(tree, id));
  if (plain) return plain;
  const Node* reduce = Get(tree, id, NodeKind::kReduce);
  if (reduce == nullptr || reduce->items.size() != 2 ||
      !tree.IsGlobal(reduce->items[0], "torch._tensor", "_rebuild_from_type_v2")) {
    return std::optional<TensorRef>();
  }
  const Node* call = Get(tree, reduce->items[1], NodeKind::kTuple);
  // (func, type, args, state): only a plain torch.Tensor whose state is its attribute dict.
  if (call == nullptr || call->items.size() != 4 || !tree.IsGlobal(call->items[1], "torch", "Tensor") ||
      Get(tree, call->items[3], NodeKind::kDict) == nullptr) {
    return std::optional<TensorRef>();
  }
  return MatchRebuildCall(tree, id, call->items[0], call->items[2]);
}

Result<NodeId> AddTensor(PickleTree& tree, const TensorRef& t) {
  const DTypeInfo& info = Info(t.dtype);
  const bool v3 = info.storage_class.empty();
  if (t.shape.size() != t.stride.size()) return InvalidArgument("AddTensor: size/stride rank mismatch");
  if (!v3 && t.storage.nbytes % info.itemsize != 0) {
    return InvalidArgument("AddTensor: storage bytes not a multiple of the item size");
  }
  const uint64_t numel = v3 ? t.storage.nbytes : t.storage.nbytes / info.itemsize;
  if (numel > static_cast<uint64_t>(INT64_MAX)) return InvalidArgument("AddTensor: storage too large");

  const NodeId cls = v3 ? tree.AddGlobal("torch.storage", "UntypedStorage")
                        : tree.AddGlobal("torch", std::string(info.storage_class));
  const NodeId pid_tuple = tree.AddTuple({tree.AddStr("storage"), cls, tree.AddStr(t.storage.key),
                                          tree.AddStr("cpu"), tree.AddInt(static_cast<int64_t>(numel))});
  std::vector<NodeId> shape, stride;
  for (int64_t d : t.shape) shape.push_back(tree.AddInt(d));
  for (int64_t s : t.stride) stride.push_back(tree.AddInt(s));
  const NodeId hooks = tree.AddReduce(tree.AddGlobal("collections", "OrderedDict"), tree.AddTuple({}));
  std::vector<NodeId> args = {tree.AddPersId(pid_tuple), tree.AddInt(t.storage_offset),
                              tree.AddTuple(std::move(shape)), tree.AddTuple(std::move(stride)),
                              tree.AddBool(t.requires_grad), hooks};
  if (v3) args.push_back(tree.AddGlobal("torch", std::string(info.torch_name)));
  const NodeId fn = tree.AddGlobal(std::string(kUtils), v3 ? "_rebuild_tensor_v3" : "_rebuild_tensor_v2");
  return tree.AddReduce(fn, tree.AddTuple(std::move(args)));
}

namespace {

// Visits every node reachable from the root once, depth first, children in emission order (the
// tree may share nodes and contain cycles). visit(id) returns Result<bool>: descend or not.
template <typename Visit>
Status WalkOnce(const PickleTree& tree, Visit&& visit) {
  if (!tree.valid(tree.root())) return Status::Ok();
  std::vector<bool> seen(tree.size(), false);
  std::vector<NodeId> stack = {tree.root()};
  std::vector<NodeId> children;
  while (!stack.empty()) {
    const NodeId id = stack.back();
    stack.pop_back();
    if (seen[id]) continue;
    seen[id] = true;
    RS_ASSIGN_OR_RETURN(const bool descend, visit(id));
    if (!descend) continue;
    children.clear();
    ForEachChild(tree.node(id), [&](NodeId c) { children.push_back(c); });
    for (size_t k = children.size(); k-- > 0;) {  // reversed, so they pop in emission order
      if (!tree.valid(children[k])) return Internal("pickle tree refers to a missing node");
      stack.push_back(children[k]);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::vector<TensorRef>> CollectTensors(const PickleTree& tree) {
  std::vector<TensorRef> out;
  RS_RETURN_IF_ERROR(WalkOnce(tree, [&](NodeId id) -> Result<bool> {
    RS_ASSIGN_OR_RETURN(std::optional<TensorRef> tensor, MatchTensor(tree, id));
    if (!tensor) return true;
    out.push_back(std::move(*tensor));
    return false;
  }));
  return out;
}

Result<std::vector<StorageRef>> CollectStorages(const PickleTree& tree) {
  std::vector<StorageRef> out;
  std::unordered_map<std::string, size_t> index;  // key -> position in `out`
  RS_RETURN_IF_ERROR(WalkOnce(tree, [&](NodeId id) -> Result<bool> {
    if (tree.node(id).kind != NodeKind::kPersId) return true;
    RS_ASSIGN_OR_RETURN(StorageRef s, MatchStorage(tree, id));
    const auto [it, inserted] = index.try_emplace(s.key, out.size());
    if (inserted) {
      out.push_back(std::move(s));
      return false;
    }
    const StorageRef& prior = out[it->second];
    if (prior.nbytes != s.nbytes || prior.untyped != s.untyped || prior.dtype != s.dtype) {
      return Corrupt("storage '" + s.key + "' is named with two different types or sizes");
    }
    return false;
  }));
  return out;
}

}  // namespace reshard::format
