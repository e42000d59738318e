// pickle_query: each helper on the forms it must recognise and on near misses it must not.
#include "reshard/format/pickle_query.h"

#include <catch2/catch.hpp>

#include "reshard/format/pickle_reader.h"

namespace reshard::format {
namespace {

// An OrderedDict() REDUCE filled as SETITEMS fills it.
NodeId AddOrderedDict(PickleTree& t, std::vector<std::pair<std::string, NodeId>> entries) {
  const NodeId od = t.AddReduce(t.AddGlobal("collections", "OrderedDict"), t.AddTuple({}));
  for (auto& [k, v] : entries) {
    const NodeId key = t.AddStr(k);  // before mutable_node(): adding may move the node arena
    t.mutable_node(od).mutable_extras().dict_items.push_back(key);
    t.mutable_node(od).mutable_extras().dict_items.push_back(v);
  }
  return od;
}

TEST_CASE("DictItems and DictLookup read dicts and OrderedDict objects alike", "[format]") {
  PickleTree t;
  const NodeId one = t.AddInt(1);
  const NodeId d = t.AddDict({{t.AddStr("a"), one}, {t.AddInt(7), t.AddInt(2)}});
  const NodeId od = AddOrderedDict(t, {{"b", t.AddStr("x")}});
  CHECK(DictItems(t, d)->size() == 4);
  CHECK(DictLookup(t, d, "a") == one);
  CHECK(DictLookup(t, d, "7") == kNoNode);  // non-str keys are skipped
  CHECK(AsStr(t, DictLookup(t, od, "b")) == std::optional<std::string_view>("x"));
  CHECK(DictLookup(t, od, "a") == kNoNode);

  // An OrderedDict called with arguments, or another class, is not a dict.
  const NodeId od_args = t.AddReduce(t.AddGlobal("collections", "OrderedDict"), t.AddTuple({t.AddList()}));
  const NodeId other = t.AddReduce(t.AddGlobal("collections", "Counter"), t.AddTuple({}));
  CHECK(DictItems(t, od_args) == nullptr);
  CHECK(DictItems(t, other) == nullptr);
  CHECK(DictItems(t, t.AddList()) == nullptr);
  CHECK(DictLookup(t, kNoNode, "a") == kNoNode);
  CHECK(DictLookup(t, 999999, "a") == kNoNode);
}

TEST_CASE("Scalar helpers match exact kinds only", "[format]") {
  PickleTree t;
  const NodeId i = t.AddInt(-5), b = t.AddBool(true), f = t.AddFloat(0.25), s = t.AddStr("hi"), n = t.AddNone();
  CHECK(AsInt(t, i) == -5);
  CHECK_FALSE(AsInt(t, b));  // a bool is not an int
  CHECK_FALSE(AsInt(t, f));
  CHECK(AsBool(t, b) == true);
  CHECK_FALSE(AsBool(t, i));
  CHECK(AsFloat(t, f) == 0.25);
  CHECK_FALSE(AsFloat(t, i));
  CHECK(AsNumber(t, i) == -5.0);
  CHECK(AsNumber(t, f) == 0.25);
  CHECK_FALSE(AsNumber(t, s));
  CHECK(AsStr(t, s) == std::optional<std::string_view>("hi"));
  CHECK(IsNone(t, n));
  CHECK_FALSE(IsNone(t, kNoNode));
  const NodeId big = t.AddLong(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9));
  CHECK_FALSE(AsInt(t, big));
}

TEST_CASE("Sequences and torch.Size", "[format]") {
  PickleTree t;
  const NodeId ints = t.AddTuple({t.AddInt(3), t.AddInt(4)});
  const NodeId strs = t.AddList({t.AddStr("a"), t.AddStr("b")});
  const NodeId mixed = t.AddList({t.AddInt(1), t.AddStr("b")});
  CHECK(AsIntSequence(t, ints) == std::vector<int64_t>{3, 4});
  CHECK(AsStrSequence(t, strs) == std::vector<std::string>{"a", "b"});
  CHECK_FALSE(AsIntSequence(t, mixed));
  CHECK_FALSE(AsStrSequence(t, mixed));
  CHECK(AsIntSequence(t, t.AddList()) == std::vector<int64_t>{});
  CHECK(SequenceItems(t, t.AddDict()) == nullptr);

  const NodeId size = t.AddReduce(t.AddGlobal("torch", "Size"), t.AddTuple({ints}));
  CHECK(AsTorchSize(t, size) == std::vector<int64_t>{3, 4});
  CHECK_FALSE(AsTorchSize(t, ints));  // a plain tuple is not a torch.Size
  const NodeId size_of_list = t.AddReduce(t.AddGlobal("torch", "Size"), t.AddTuple({t.AddList({t.AddInt(2)})}));
  CHECK_FALSE(AsTorchSize(t, size_of_list));
  const NodeId not_size = t.AddReduce(t.AddGlobal("torch", "Shape"), t.AddTuple({ints}));
  CHECK_FALSE(AsTorchSize(t, not_size));
}

TEST_CASE("Objects: class and BUILD state of NEWOBJ, REDUCE and kBuild nodes", "[format]") {
  PickleTree t;
  const NodeId cls = t.AddGlobal("deepspeed.runtime.fp16.loss_scaler", "LossScaler");
  const NodeId obj = t.AddNewObj(cls, t.AddTuple({}));
  const NodeId state = t.AddDict({{t.AddStr("cur_scale"), t.AddFloat(1.0)}});
  t.mutable_node(obj).state = state;
  CHECK(ObjectClass(t, obj) == cls);
  CHECK(IsObjectOf(t, obj, "deepspeed.runtime.fp16.loss_scaler", "LossScaler"));
  CHECK_FALSE(IsObjectOf(t, obj, "deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"));
  CHECK(ObjectState(t, obj) == state);
  CHECK(DescribeNode(t, obj) == "object of deepspeed.runtime.fp16.loss_scaler.LossScaler");

  // A second BUILD wraps the object in a kBuild node; the class is still found through it.
  const NodeId second_state = t.AddDict();
  const NodeId build = t.AddBuild(obj, second_state);
  CHECK(ObjectClass(t, build) == cls);
  CHECK(ObjectState(t, build) == second_state);
  CHECK(ObjectClass(t, t.AddBuild(build, t.AddDict())) == cls);

  CHECK(ObjectClass(t, t.AddDict()) == kNoNode);
  CHECK(ObjectState(t, t.AddNewObj(cls, t.AddTuple({}))) == kNoNode);
  // A hand-built BUILD that wraps itself ends the walk instead of looping.
  const NodeId loop = t.AddBuild(obj, state);
  t.mutable_node(loop).items[0] = loop;
  CHECK(ObjectClass(t, loop) == kNoNode);
}

TEST_CASE("AsEnumMember reads an IntEnum pickled by value and by name", "[format]") {
  constexpr std::string_view kModule = "deepspeed.runtime.zero.config", kClass = "ZeroStageEnum";
  PickleTree t;
  const NodeId by_value =
      t.AddReduce(t.AddGlobal(std::string(kModule), std::string(kClass)), t.AddTuple({t.AddInt(3)}));
  const auto v = AsEnumMember(t, by_value, kModule, kClass);
  REQUIRE(v);
  CHECK(v->value == 3);
  CHECK(v->name.empty());

  for (const char* builtins : {"__builtin__", "builtins"}) {
    const NodeId by_name =
        t.AddReduce(t.AddGlobal(builtins, "getattr"),
                    t.AddTuple({t.AddGlobal(std::string(kModule), std::string(kClass)), t.AddStr("optimizer_states")}));
    const auto m = AsEnumMember(t, by_name, kModule, kClass);
    REQUIRE(m);
    CHECK_FALSE(m->value);
    CHECK(m->name == "optimizer_states");
  }
  // Other classes, other callables and other argument shapes are no member.
  const NodeId other_class = t.AddReduce(t.AddGlobal("x", "Other"), t.AddTuple({t.AddInt(3)}));
  const NodeId other_fn =
      t.AddReduce(t.AddGlobal("__builtin__", "setattr"),
                  t.AddTuple({t.AddGlobal(std::string(kModule), std::string(kClass)), t.AddStr("a")}));
  const NodeId str_value =
      t.AddReduce(t.AddGlobal(std::string(kModule), std::string(kClass)), t.AddTuple({t.AddStr("3")}));
  CHECK_FALSE(AsEnumMember(t, other_class, kModule, kClass));
  CHECK_FALSE(AsEnumMember(t, other_fn, kModule, kClass));
  CHECK_FALSE(AsEnumMember(t, str_value, kModule, kClass));
  CHECK_FALSE(AsEnumMember(t, t.AddInt(3), kModule, kClass));
}

TEST_CASE("AsEnumMember on a real protocol-2 pickle", "[format]") {
  using namespace std::string_literals;
  // pickle.dumps(getattr-reduced ZeroStageEnum.weights, protocol=2): GLOBAL '__builtin__ getattr',
  // GLOBAL 'deepspeed.runtime.zero.config ZeroStageEnum', BINUNICODE 'weights', TUPLE2, REDUCE.
  const std::string bytes =
      "\x80\x02"
      "c__builtin__\ngetattr\n"
      "cdeepspeed.runtime.zero.config\nZeroStageEnum\n"
      "X\x07\x00\x00\x00weights"
      "\x86R."s;
  auto tree = ParsePickle(bytes);
  REQUIRE(tree.ok());
  const auto m = AsEnumMember(*tree, tree->root(), "deepspeed.runtime.zero.config", "ZeroStageEnum");
  REQUIRE(m);
  CHECK(m->name == "weights");
}

TEST_CASE("DescribeNode names kinds and values for messages", "[format]") {
  PickleTree t;
  CHECK(DescribeNode(t, kNoNode) == "no value");
  CHECK(DescribeNode(t, t.AddNone()) == "none");
  CHECK(DescribeNode(t, t.AddInt(3)) == "int 3");
  CHECK(DescribeNode(t, t.AddBool(false)) == "bool False");
  CHECK(DescribeNode(t, t.AddFloat(0.5)) == "float 0.5");
  CHECK(DescribeNode(t, t.AddStr("abc")) == "str 'abc'");
  CHECK(DescribeNode(t, t.AddStr(std::string(50, 'x'))) == "str '" + std::string(40, 'x') + "...'");
  CHECK(DescribeNode(t, t.AddList({t.AddInt(1), t.AddInt(2)})) == "list of 2");
  CHECK(DescribeNode(t, t.AddDict({{t.AddStr("a"), t.AddInt(1)}})) == "dict of 1 entries");
  CHECK(DescribeNode(t, AddOrderedDict(t, {{"a", t.AddInt(1)}})) == "OrderedDict of 1 entries");
  CHECK(DescribeNode(t, t.AddGlobal("torch", "Size")) == "global torch.Size");
  CHECK(DescribeNode(t, t.AddBytes("x")) == "bytes");
}

}  // namespace
}  // namespace reshard::format
