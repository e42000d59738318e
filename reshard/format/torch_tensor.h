// Tensors inside a torch.save pickle: the allow-listed matcher and the builder.
//
// torch pickles a CPU tensor as
//   REDUCE(torch._utils._rebuild_tensor_v2,
//          (BINPERSID(('storage', torch.<X>Storage, key, location, numel_elements)),
//           storage_offset, size, stride, requires_grad, OrderedDict()[, metadata]))
// and a tensor of a "new" dtype (uint16/32/64, float8_*, complex32) as
//   REDUCE(torch._utils._rebuild_tensor_v3,
//          (BINPERSID(('storage', torch.storage.UntypedStorage, key, location, numel_bytes)),
//           storage_offset, size, stride, requires_grad, OrderedDict(), torch.<dtype>[, metadata]))
// Sizes, strides and storage_offset count elements of the tensor's dtype. Wrappers such as
// _rebuild_parameter(tensor, ...) or _rebuild_from_type_v2(func, type, args, state) stay
// ordinary REDUCE nodes around the tensor: MatchTensor only recognises the two forms above.
//
// Everything here is a pure function of a PickleTree; no I/O. Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "reshard/base/status.h"
#include "reshard/format/dtype.h"
#include "reshard/format/pickle_value.h"

namespace reshard::format {

// Highest rank accepted from a file (torch itself allows 64 dimensions).
inline constexpr size_t kMaxTensorRank = 64;

// A storage as its persistent id names it.
struct StorageRef {
  std::string key;       // record name under "<prefix>/data/"
  std::string location;  // "cpu", "cuda:0", ... (informational: reshardfs serves CPU tensors)
  DType dtype = DType::kUInt8;
  bool untyped = false;  // true for torch.storage.UntypedStorage (the v3 form)
  uint64_t nbytes = 0;   // size of the storage record in bytes (numel * itemsize, checked)
};

// A tensor: a strided view of one storage.
struct TensorRef {
  NodeId node = kNoNode;  // the REDUCE node that rebuilds it
  StorageRef storage;
  DType dtype = DType::kUInt8;
  std::vector<int64_t> shape;   // elements per dimension
  std::vector<int64_t> stride;  // elements between neighbours of each dimension
  int64_t storage_offset = 0;   // elements of `dtype` from the storage start
  bool requires_grad = false;
  bool v3 = false;  // rebuilt by _rebuild_tensor_v3

  // Number of elements (product of shape); shapes were checked for overflow when matched.
  uint64_t numel() const;
  // Bytes from the first to one past the last element the view touches (0 when empty).
  uint64_t span_bytes() const;
  bool is_contiguous() const;
};

// MatchTensor, and also a plain torch.Tensor that carries Python attributes, which torch pickles
// as REDUCE(torch._tensor._rebuild_from_type_v2, (_rebuild_tensor_v2|v3, torch.Tensor, args,
// {attr: value})) — DeepSpeed's ZeRO-3 fp32_flat_groups (attribute ds_id). The attributes do not
// change the data; the TensorRef's node is the outer call. For readers that locate tensor data;
// the walkers and writers keep MatchTensor's narrower view (such calls stay opaque there).
Result<std::optional<TensorRef>> MatchTensorWithAttributes(const PickleTree& tree, NodeId id);

// Matches a persistent id node (BINPERSID of ('storage', class, key, location, numel)).
// Errors as for MatchTensor.
Result<StorageRef> MatchStorage(const PickleTree& tree, NodeId persid);

// Every storage named by a persistent id reachable from tree.root(), in order of first
// appearance, once per key, including storages of tensors that MatchTensor does not interpret
// (a tensor with Python attributes goes through _rebuild_from_type_v2, a conj/neg view carries
// a metadata argument). kCorrupt when one key is named with two different classes or sizes.
Result<std::vector<StorageRef>> CollectStorages(const PickleTree& tree);

// Matches `id` against the two tensor forms (exactly 6 arguments for v2, 7 for v3: a tensor
// whose rebuild carries a metadata argument, e.g. a conj view, stays an opaque REDUCE). Returns std::nullopt when the node is not a tensor
// rebuild at all, and an error (kCorrupt/kUnsupported) when it names a tensor rebuild function
// but its arguments are malformed: wrong arity, unknown storage class or dtype, negative sizes,
// rank over kMaxTensorRank, or a view that reaches past the end of its storage.
Result<std::optional<TensorRef>> MatchTensor(const PickleTree& tree, NodeId id);

// Every tensor rebuild reachable from tree.root(), in depth-first order of first appearance
// (children in emission order; a tensor's own subtree is not searched). Errors: those of
// MatchTensor for the first malformed rebuild.
Result<std::vector<TensorRef>> CollectTensors(const PickleTree& tree);

// Appends the nodes that rebuild `tensor` (the v2 form for dtypes with a storage class, the v3
// form otherwise) and returns the REDUCE node. `tensor.storage` must describe the storage as
// it will be written (key, dtype, nbytes); `tensor.node` is ignored.
Result<NodeId> AddTensor(PickleTree& tree, const TensorRef& tensor);

}  // namespace reshard::format
