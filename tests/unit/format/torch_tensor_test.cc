#include "reshard/format/torch_tensor.h"

#include <catch2/catch.hpp>

namespace reshard::format {
namespace {

TensorRef Float32Matrix(const std::string& key) {
  TensorRef t;
  t.dtype = DType::kFloat32;
  t.storage.key = key;
  t.storage.dtype = DType::kFloat32;
  t.storage.nbytes = 2 * 3 * 4;
  t.shape = {2, 3};
  t.stride = {3, 1};
  return t;
}

TEST_CASE("AddTensor then MatchTensor gives back the same view (v2 form)", "[format]") {
  PickleTree tree;
  TensorRef in = Float32Matrix("0");
  in.stride = {1, 2};  // a transposed view of the same 6 elements
  in.requires_grad = true;
  auto id = AddTensor(tree, in);
  REQUIRE(id.ok());
  auto out = MatchTensor(tree, *id);
  REQUIRE(out.ok());
  REQUIRE(out->has_value());
  const TensorRef& t = **out;
  CHECK_FALSE(t.v3);
  CHECK(t.dtype == DType::kFloat32);
  CHECK(t.shape == std::vector<int64_t>{2, 3});
  CHECK(t.stride == std::vector<int64_t>{1, 2});
  CHECK(t.requires_grad);
  CHECK(t.storage.key == "0");
  CHECK(t.storage.nbytes == 24);
  CHECK(t.numel() == 6);
  CHECK(t.span_bytes() == 24);
  CHECK_FALSE(t.is_contiguous());
  CHECK(tree.IsGlobal(tree.node(*id).items[0], "torch._utils", "_rebuild_tensor_v2"));
}

TEST_CASE("dtypes without a storage class use the v3 form with byte-counted storages", "[format]") {
  PickleTree tree;
  TensorRef in;
  in.dtype = DType::kUInt16;
  in.storage = StorageRef{"7", "cpu", DType::kUInt8, true, 10};
  in.shape = {5};
  in.stride = {1};
  auto id = AddTensor(tree, in);
  REQUIRE(id.ok());
  CHECK(tree.IsGlobal(tree.node(*id).items[0], "torch._utils", "_rebuild_tensor_v3"));
  auto out = MatchTensor(tree, *id);
  REQUIRE(out.ok());
  REQUIRE(out->has_value());
  CHECK((*out)->v3);
  CHECK((*out)->dtype == DType::kUInt16);
  CHECK((*out)->storage.untyped);
  CHECK((*out)->storage.nbytes == 10);
}

TEST_CASE("MatchTensor ignores nodes that are not tensor rebuilds", "[format]") {
  PickleTree tree;
  const NodeId reduce = tree.AddReduce(tree.AddGlobal("collections", "OrderedDict"), tree.AddTuple({}));
  auto out = MatchTensor(tree, reduce);
  REQUIRE(out.ok());
  CHECK_FALSE(out->has_value());
  auto on_int = MatchTensor(tree, tree.AddInt(3));
  REQUIRE(on_int.ok());
  CHECK_FALSE(on_int->has_value());
}

TEST_CASE("MatchTensor refuses a view that reaches past its storage", "[format]") {
  PickleTree tree;
  TensorRef in = Float32Matrix("0");
  in.storage_offset = 1;  // the last element would be element 6 of a 6-element storage
  auto id = AddTensor(tree, in);
  REQUIRE(id.ok());
  auto out = MatchTensor(tree, *id);
  REQUIRE_FALSE(out.ok());
  CHECK(out.status().code() == StatusCode::kCorrupt);
  CHECK_THAT(out.status().message(), Catch::Contains("ends past"));
}

TEST_CASE("MatchTensor refuses malformed rebuild arguments", "[format]") {
  PickleTree tree;
  const NodeId fn = tree.AddGlobal("torch._utils", "_rebuild_tensor_v2");
  SECTION("too few arguments") {
    auto out = MatchTensor(tree, tree.AddReduce(fn, tree.AddTuple({tree.AddInt(0)})));
    REQUIRE_FALSE(out.ok());
    CHECK_THAT(out.status().message(), Catch::Contains("wrong number of arguments"));
  }
  SECTION("unknown storage class") {
    const NodeId pid = tree.AddPersId(tree.AddTuple({tree.AddStr("storage"), tree.AddGlobal("torch", "EvilStorage"),
                                                     tree.AddStr("0"), tree.AddStr("cpu"), tree.AddInt(1)}));
    const NodeId args = tree.AddTuple({pid, tree.AddInt(0), tree.AddTuple({tree.AddInt(1)}),
                                       tree.AddTuple({tree.AddInt(1)}), tree.AddBool(false), tree.AddNone()});
    auto out = MatchTensor(tree, tree.AddReduce(fn, args));
    REQUIRE_FALSE(out.ok());
    CHECK(out.status().code() == StatusCode::kUnsupported);
  }
  SECTION("negative size") {
    const NodeId pid = tree.AddPersId(tree.AddTuple({tree.AddStr("storage"), tree.AddGlobal("torch", "FloatStorage"),
                                                     tree.AddStr("0"), tree.AddStr("cpu"), tree.AddInt(4)}));
    const NodeId args = tree.AddTuple({pid, tree.AddInt(0), tree.AddTuple({tree.AddInt(-1)}),
                                       tree.AddTuple({tree.AddInt(1)}), tree.AddBool(false), tree.AddNone()});
    auto out = MatchTensor(tree, tree.AddReduce(fn, args));
    REQUIRE_FALSE(out.ok());
    CHECK(out.status().code() == StatusCode::kCorrupt);
  }
}

TEST_CASE("CollectTensors walks shared nodes once, in emission order", "[format]") {
  PickleTree tree;
  auto a = AddTensor(tree, Float32Matrix("0"));
  auto b = AddTensor(tree, Float32Matrix("1"));
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  const NodeId list = tree.AddList({*b, *a, *b});
  tree.set_root(tree.AddDict({{tree.AddStr("x"), list}}));
  auto tensors = CollectTensors(tree);
  REQUIRE(tensors.ok());
  REQUIRE(tensors->size() == 2);
  CHECK((*tensors)[0].storage.key == "1");
  CHECK((*tensors)[1].storage.key == "0");
}

}  // namespace
}  // namespace reshard::format
