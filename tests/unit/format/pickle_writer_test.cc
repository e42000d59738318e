#include "reshard/format/pickle_writer.h"

#include <cstring>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "reshard/format/pickle_reader.h"

#include "tests/unit/format/pickle_goldens.h"
#include "tests/unit/hex.h"

namespace reshard::format {
namespace {

using reshard::testing::FromHex;
using reshard::testing::kMixed2;
using reshard::testing::ToHex;

// ---- helpers ----

std::string MustWrite(const PickleTree& tree, NodeId root, const PickleWriteOptions& options = {}) {
  Result<std::string> bytes = WritePickle(tree, root, options);
  INFO(bytes.status().ToString());
  REQUIRE(bytes.ok());
  return std::move(bytes).value();
}

Status WriteError(const PickleTree& tree, NodeId root, const PickleWriteOptions& options = {}) {
  Result<std::string> bytes = WritePickle(tree, root, options);
  REQUIRE_FALSE(bytes.ok());
  return bytes.status();
}

bool IsScalar(const Node& n) {
  switch (n.kind) {
    case NodeKind::kNone:
    case NodeKind::kBool:
    case NodeKind::kInt:
    case NodeKind::kFloat: return true;
    case NodeKind::kTuple: return n.items.empty();
    default: return false;
  }
}

// True when the graph at `a` in `ta` equals the one at `b` in `tb`: same kinds, values and
// shape, and the same sharing (a bijection between non-scalar nodes, so cycles and shared
// nodes must match too). Scalars are compared by value: the writer re-writes them.
bool SameGraph(const PickleTree& ta, NodeId a, const PickleTree& tb, NodeId b) {
  std::unordered_map<NodeId, NodeId> a_to_b;
  std::unordered_map<NodeId, NodeId> b_to_a;
  std::vector<std::pair<NodeId, NodeId>> pending = {{a, b}};
  while (!pending.empty()) {
    const auto [x, y] = pending.back();
    pending.pop_back();
    const Node& nx = ta.node(x);
    const Node& ny = tb.node(y);
    if (!IsScalar(nx)) {
      const auto it = a_to_b.find(x);
      if (it != a_to_b.end()) {
        if (it->second != y) return false;
        continue;
      }
      if (b_to_a.count(y)) return false;
      a_to_b[x] = y;
      b_to_a[y] = x;
    }
    const bool same_values = nx.kind == ny.kind && nx.b == ny.b && nx.i == ny.i &&
                             std::memcmp(&nx.f, &ny.f, sizeof nx.f) == 0 &&
                             nx.text == ny.text && nx.global_name() == ny.global_name();
    const bool same_shape = nx.items.size() == ny.items.size() &&
                            nx.list_items().size() == ny.list_items().size() &&
                            nx.dict_items().size() == ny.dict_items().size() &&
                            (nx.state == kNoNode) == (ny.state == kNoNode);
    if (!same_values || !same_shape) return false;
    std::vector<NodeId> cx;
    std::vector<NodeId> cy;
    ForEachChild(nx, [&](NodeId c) { cx.push_back(c); });
    ForEachChild(ny, [&](NodeId c) { cy.push_back(c); });
    for (size_t k = 0; k < cx.size(); ++k) pending.emplace_back(cx[k], cy[k]);
  }
  return true;
}

// Writes `root`, parses the bytes back, and checks the graphs are equal.
void CheckRoundTrip(const PickleTree& tree, NodeId root) {
  const std::string bytes = MustWrite(tree, root);
  Result<PickleTree> back = ParsePickle(bytes);
  INFO(ToHex(bytes) << ": " << back.status().ToString());
  REQUIRE(back.ok());
  CHECK(SameGraph(tree, root, *back, back->root()));
}

std::string Bytes(const char* data, size_t size) { return std::string(data, size); }

// ---- exact bytes, from pickletools.optimize(pickle.dumps(obj, protocol=2)).hex() ----

struct ExactCase {
  const char* python;  // the object, as Python source
  std::function<NodeId(PickleTree&)> build;
  const char* hex;
};

NodeId OrderedDictWithMetadata(PickleTree& t) {
  const NodeId od = t.AddReduce(t.AddGlobal("collections", "OrderedDict"), t.AddTuple({}));
  t.mutable_node(od).mutable_extras().dict_items = {t.AddStr("w"), t.AddInt(1), t.AddStr("b"), t.AddInt(2)};
  const NodeId version = t.AddDict({{t.AddStr("version"), t.AddInt(1)}});
  const NodeId inner = t.AddDict({{t.AddStr(""), version}});
  t.mutable_node(od).state = t.AddDict({{t.AddStr("_metadata"), inner}});
  return od;
}

TEST_CASE("pickle writer: exact bytes equal Python's protocol 2", "[format]") {
  const std::vector<ExactCase> cases = {
      {R"({"a": 1, "b": [1, 2]})",
       [](PickleTree& t) {
         return t.AddDict({{t.AddStr("a"), t.AddInt(1)},
                           {t.AddStr("b"), t.AddList({t.AddInt(1), t.AddInt(2)})}});
       },
       "80027d285801000000614b015801000000625d284b014b0265752e"},
      {"(1,)", [](PickleTree& t) { return t.AddTuple({t.AddInt(1)}); }, "80024b01852e"},
      {"(1, 2, 3, 4)",
       [](PickleTree& t) {
         return t.AddTuple({t.AddInt(1), t.AddInt(2), t.AddInt(3), t.AddInt(4)});
       },
       "8002284b014b024b034b04742e"},
      {"()", [](PickleTree& t) { return t.AddTuple({}); }, "8002292e"},
      {"True", [](PickleTree& t) { return t.AddBool(true); }, "8002882e"},
      {"None", [](PickleTree& t) { return t.AddNone(); }, "80024e2e"},
      {"[7]", [](PickleTree& t) { return t.AddList({t.AddInt(7)}); }, "80025d4b07612e"},
      {R"({"k": 1})", [](PickleTree& t) { return t.AddDict({{t.AddStr("k"), t.AddInt(1)}}); },
       "80027d58010000006b4b01732e"},
      {"2**40", [](PickleTree& t) { return t.AddInt(int64_t{1} << 40); }, "80028a060000000000012e"},
      {"-1", [](PickleTree& t) { return t.AddInt(-1); }, "80024affffffff2e"},
      {"255", [](PickleTree& t) { return t.AddInt(255); }, "80024bff2e"},
      {"256", [](PickleTree& t) { return t.AddInt(256); }, "80024d00012e"},
      {"65536", [](PickleTree& t) { return t.AddInt(65536); }, "80024a000001002e"},
      {"-2**31", [](PickleTree& t) { return t.AddInt(INT32_MIN); }, "80024a000000802e"},
      {"-2**31 - 1", [](PickleTree& t) { return t.AddInt(int64_t{INT32_MIN} - 1); },
       "80028a05ffffff7fff2e"},
      {"2**31", [](PickleTree& t) { return t.AddInt(int64_t{1} << 31); }, "80028a0500000080002e"},
      {"2**63 - 1", [](PickleTree& t) { return t.AddInt(INT64_MAX); },
       "80028a08ffffffffffffff7f2e"},
      {"-2**63", [](PickleTree& t) { return t.AddInt(INT64_MIN); }, "80028a0800000000000000802e"},
      {"2**64", [](PickleTree& t) { return t.AddLong(Bytes("\0\0\0\0\0\0\0\0\1", 9)); },
       "80028a090000000000000000012e"},
      {"-2**64", [](PickleTree& t) { return t.AddLong(Bytes("\0\0\0\0\0\0\0\0\xff", 9)); },
       "80028a090000000000000000ff2e"},
      {"1.5", [](PickleTree& t) { return t.AddFloat(1.5); }, "8002473ff80000000000002e"},
      {"-0.0", [](PickleTree& t) { return t.AddFloat(-0.0); }, "80024780000000000000002e"},
      {R"("é")", [](PickleTree& t) { return t.AddStr("\xc3\xa9"); }, "80025802000000c3a92e"},
      {R"(b"\x00\xff")", [](PickleTree& t) { return t.AddBytes(Bytes("\0\xff", 2)); },
       "8002635f636f646563730a656e636f64650a580300000000c3bf58060000006c6174696e3186522e"},
      {R"(b"")", [](PickleTree& t) { return t.AddBytes(""); },
       "8002635f5f6275696c74696e5f5f0a62797465730a29522e"},
      {R"(bytearray(b"xy"))", [](PickleTree& t) { return t.AddByteArray("xy"); },
       "8002635f5f6275696c74696e5f5f0a6279746561727261790a635f636f646563730a656e636f64650a58020000"
       "00787958060000006c6174696e31865285522e"},
      {"bytearray()", [](PickleTree& t) { return t.AddByteArray(""); },
       "8002635f5f6275696c74696e5f5f0a6279746561727261790a29522e"},
      {"{1, 2}", [](PickleTree& t) { return t.AddSet({t.AddInt(1), t.AddInt(2)}); },
       "8002635f5f6275696c74696e5f5f0a7365740a5d284b014b026585522e"},
      {"frozenset({3})", [](PickleTree& t) { return t.AddFrozenSet({t.AddInt(3)}); },
       "8002635f5f6275696c74696e5f5f0a66726f7a656e7365740a5d4b036185522e"},
      {"x = [5]; (x, x)",
       [](PickleTree& t) {
         const NodeId x = t.AddList({t.AddInt(5)});
         return t.AddTuple({x, x});
       },
       "80025d71004b05616800862e"},
      {"l = []; l.append(l)",
       [](PickleTree& t) {
         const NodeId l = t.AddList();
         t.Append(l, l);
         return l;
       },
       "80025d71006800612e"},
      {"OrderedDict w=1, b=2 with _metadata", OrderedDictWithMetadata,
       "800263636f6c6c656374696f6e730a4f726465726564446963740a2952285801000000774b01580100000062"
       "4b02757d58090000005f6d657461646174617d58000000007d580700000076657273696f6e4b01737373622e"},
  };
  for (const ExactCase& c : cases) {
    PickleTree tree;
    const NodeId root = c.build(tree);
    INFO(c.python);
    CHECK(ToHex(MustWrite(tree, root)) == c.hex);
  }
}

TEST_CASE("pickle writer: batches of 1000, and single entries as Python's C pickler writes them",
          "[format]") {
  PickleTree t;
  std::vector<NodeId> ints;
  std::vector<std::pair<NodeId, NodeId>> pairs;
  for (int k = 0; k <= 1000; ++k) {
    ints.push_back(t.AddInt(k));
    pairs.emplace_back(ints.back(), ints.back());
  }
  const NodeId list = t.AddList(ints);
  const std::string bytes = ToHex(MustWrite(t, list));
  // list(range(1001)): MARK 0..999 APPENDS, MARK 1000 APPENDS (a batch of one keeps its MARK).
  CHECK(bytes.substr(0, 12) == "80025d284b00");
  CHECK(bytes.substr(bytes.size() - 16) == "0365284de803652e");

  // An OrderedDict's dict_items are iterated: a last batch of one is a bare SETITEM.
  const NodeId od = t.AddReduce(t.AddGlobal("collections", "OrderedDict"), t.AddTuple({}));
  for (const auto& [k, v] : pairs) {
    t.mutable_node(od).mutable_extras().dict_items.push_back(k);
    t.mutable_node(od).mutable_extras().dict_items.push_back(v);
  }
  const std::string od_hex = ToHex(MustWrite(t, od));
  CHECK(od_hex.substr(od_hex.size() - 24) == "4de703754de8034de803732e");
  const std::string dict_hex = ToHex(MustWrite(t, t.AddDict(pairs)));
  CHECK(dict_hex.substr(dict_hex.size() - 24) == "e70375284de8034de803752e");
}

// Python 3.11, protocol 2: the same dict as pickle_reader_test's kMixed2, and torch.save's
// data.pkl of OrderedDict(w=torch.zeros(2, 3), n=7). Parsed and re-written, each must equal
// pickletools.optimize() of the original: the same bytes minus the memo stores never read.
constexpr std::string_view kMixed2Optimized =
    "80027d285801000000615d284b014b024b034740120000000000004e8765580100000073635f5f6275696c74696e"
    "5f5f0a7365740a5d4b0761855258020000006673635f5f6275696c74696e5f5f0a66726f7a656e7365740a5d4b08"
    "618552580100000062635f636f646563730a656e636f64650a7100580300000000c3bf58060000006c6174696e31"
    "7101865258020000006261635f5f6275696c74696e5f5f0a6279746561727261790a680058020000007879680186"
    "5285525801000000748858010000006689580100000065295801000000755802000000c3a9752e";
constexpr std::string_view kTorchDataPkl =
    "800263636f6c6c656374696f6e730a4f726465726564446963740a71002952710128580100000077710263746f72"
    "63682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71032828580700000073746f7261676571"
    "0463746f7263680a466c6f617453746f726167650a71055801000000307106580300000063707571074b06747108"
    "514b004b024b038671094b034b0186710a8968002952710b74710c52710d58010000006e710e4b07752e";
constexpr std::string_view kTorchDataPklOptimized =
    "800263636f6c6c656374696f6e730a4f726465726564446963740a710029522858010000007763746f7263682e5f"
    "7574696c730a5f72656275696c645f74656e736f725f76320a2828580700000073746f7261676563746f7263680a"
    "466c6f617453746f726167650a58010000003058030000006370754b0674514b004b024b03864b034b0186896800"
    "2952745258010000006e4b07752e";

TEST_CASE("pickle writer: re-writing Python and torch pickles gives Python's bytes", "[format]") {
  for (const auto& [original, optimized] : {std::pair{kMixed2, kMixed2Optimized},
                                            std::pair{kTorchDataPkl, kTorchDataPklOptimized}}) {
    Result<PickleTree> tree = ParsePickle(FromHex(original));
    REQUIRE(tree.ok());
    CHECK(ToHex(MustWrite(*tree, tree->root())) == optimized);
  }
}

TEST_CASE("pickle writer: every node kind round-trips through the reader", "[format]") {
  PickleTree t;
  const NodeId obj = t.AddReduce(t.AddGlobal("m", "C"), t.AddTuple({t.AddStr("arg")}));
  t.mutable_node(obj).mutable_extras().list_items = {t.AddInt(1)};
  t.mutable_node(obj).mutable_extras().dict_items = {t.AddStr("k"), t.AddNone()};
  t.mutable_node(obj).state = t.AddDict({{t.AddStr("self"), obj}});  // a cycle through state
  const NodeId shared_str = t.AddStr("shared");
  const std::vector<NodeId> all = {
      t.AddNone(),
      t.AddBool(false),
      t.AddInt(-5),
      t.AddInt(INT64_MIN),
      t.AddLong(Bytes("\0\0\0\0\0\0\0\0\0\x80", 10)),
      t.AddLong(std::string(300, '\x7f')),  // LONG4
      t.AddFloat(-2.5),
      t.AddStr("\xe2\x82\xac"),
      t.AddTuple({}),
      t.AddTuple({t.AddInt(1), t.AddInt(2), t.AddInt(3), t.AddInt(4), t.AddInt(5)}),
      t.AddList({t.AddStr("x"), shared_str}),
      t.AddDict({{t.AddInt(1), shared_str}}),
      t.AddGlobal("torch", "FloatStorage"),
      obj,
      t.AddNewObj(t.AddGlobal("m", "D"), t.AddTuple({})),
      t.AddBuild(t.AddGlobal("m", "E"), t.AddDict()),
      t.AddPersId(t.AddTuple({t.AddStr("storage"), t.AddStr("0")})),
  };
  for (const NodeId id : all) {
    INFO(NodeKindName(t.node(id).kind));
    CheckRoundTrip(t, id);
  }
  CheckRoundTrip(t, t.AddList(all));
}

TEST_CASE("pickle writer: bytes, bytearray and sets come back as Python's protocol-2 REDUCEs",
          "[format]") {
  PickleTree t;
  const NodeId root = t.AddTuple({t.AddBytes(Bytes("a\0\x80", 3)), t.AddByteArray("z"),
                                  t.AddSet({t.AddInt(1)}), t.AddFrozenSet({})});
  PickleTree expected;
  auto codecs = [&](std::string utf8) {
    return expected.AddReduce(expected.AddGlobal("_codecs", "encode"),
                              expected.AddTuple({expected.AddStr(std::move(utf8)),
                                                 expected.AddStr("latin1")}));
  };
  auto builtin = [&](const char* name, NodeId arg) {
    return expected.AddReduce(expected.AddGlobal("__builtin__", name), expected.AddTuple({arg}));
  };
  const NodeId expected_root = expected.AddTuple({
      codecs(Bytes("a\0\xc2\x80", 4)),
      builtin("bytearray", codecs("z")),
      builtin("set", expected.AddList({expected.AddInt(1)})),
      builtin("frozenset", expected.AddList()),
  });
  Result<PickleTree> back = ParsePickle(MustWrite(t, root));
  REQUIRE(back.ok());
  CHECK(SameGraph(expected, expected_root, *back, back->root()));
}

TEST_CASE("pickle writer: shared nodes are written once, past 256 memo entries too", "[format]") {
  PickleTree t;
  std::vector<NodeId> items;
  for (int k = 0; k < 300; ++k) items.push_back(t.AddStr("s" + std::to_string(k)));
  const std::vector<NodeId> twice = [&] {
    std::vector<NodeId> v = items;
    v.insert(v.end(), items.begin(), items.end());
    return v;
  }();
  const NodeId root = t.AddList(twice);
  const std::string bytes = MustWrite(t, root);
  CHECK(bytes.find(Bytes("r\x00\x01\x00\x00", 5)) != std::string::npos);  // LONG_BINPUT 256
  CHECK(bytes.find(Bytes("j\x2b\x01\x00\x00", 5)) != std::string::npos);  // LONG_BINGET 299
  CheckRoundTrip(t, root);
}

TEST_CASE("pickle writer: an object whose state refers to it", "[format]") {
  // class C: __reduce__ -> (C, (), {"me": self}); loads in Python as o.me is o.
  PickleTree t;
  const NodeId o = t.AddReduce(t.AddGlobal("m", "C"), t.AddTuple({}));
  t.mutable_node(o).state = t.AddDict({{t.AddStr("me"), o}});
  CHECK(ToHex(MustWrite(t, o)) == "8002636d0a430a295271007d5802000000" "6d65" "680073622e");
}

TEST_CASE("pickle writer error: a cycle through a tuple", "[format]") {
  PickleTree t;
  const NodeId list = t.AddList();
  const NodeId tuple = t.AddTuple({list});
  t.Append(list, tuple);
  const Status s = WriteError(t, tuple);
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK(s.message().find("cycle through a tuple") != std::string::npos);
  // The same cycle entered at the list is fine: the list is memoized before its items.
  CHECK(ToHex(MustWrite(t, list)) == "80025d710068008561" "2e");
  // A reduce whose args contain the reduce itself.
  PickleTree r;
  const NodeId args = r.AddList();
  const NodeId reduce = r.AddReduce(r.AddGlobal("m", "f"), args);
  r.Append(args, reduce);
  CHECK(WriteError(r, reduce).code() == StatusCode::kUnsupported);
}

TEST_CASE("pickle writer error: nesting deeper than max_depth", "[format]") {
  PickleTree t;
  NodeId inner = t.AddNone();
  for (int k = 0; k < 100000; ++k) inner = t.AddList({inner});
  const Status s = WriteError(t, inner);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(s.message().find("nesting depth 513 exceeds limit 512") != std::string::npos);
  // With the limits raised, the explicit work stack writes it, and the reader reads it back.
  PickleWriteOptions options;
  options.max_depth = 100001;
  const std::string bytes = MustWrite(t, inner, options);
  PickleLimits limits;
  limits.max_depth = 100001;
  Result<PickleTree> back = ParsePickle(bytes, limits);
  REQUIRE(back.ok());
  CHECK(back->size() == t.size());
}

TEST_CASE("pickle writer error: trees protocol 2 cannot express, or that are malformed",
          "[format]") {
  PickleTree t;
  const NodeId cls = t.AddGlobal("m", "C");
  const NodeId ex = t.AddNewObjEx(cls, t.AddTuple({}), t.AddDict());
  CHECK(WriteError(t, ex).code() == StatusCode::kUnsupported);
  CHECK(WriteError(t, t.AddGlobal("m\nx", "C")).code() == StatusCode::kUnsupported);
  CHECK(WriteError(t, 12345).code() == StatusCode::kInvalidArgument);
  CHECK(WriteError(t, t.AddTuple({99999})).code() == StatusCode::kInvalidArgument);

  const NodeId odd = t.AddDict();
  t.mutable_node(odd).items.push_back(cls);
  CHECK(WriteError(t, odd).message() == "pickle writer: dict (node " + std::to_string(odd) +
                                            ") has an odd item count");
  const NodeId short_reduce = t.AddReduce(cls, cls);
  t.mutable_node(short_reduce).items.pop_back();
  CHECK(WriteError(t, short_reduce).code() == StatusCode::kInvalidArgument);
  const NodeId list = t.AddList();
  t.mutable_node(list).state = cls;
  CHECK(WriteError(t, list).code() == StatusCode::kInvalidArgument);
  const NodeId big = t.AddInt(0);
  t.mutable_node(big).kind = NodeKind::kBigInt;
  CHECK(WriteError(t, big).code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard::format
