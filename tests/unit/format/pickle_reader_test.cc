#include "reshard/format/pickle_reader.h"

#include <cmath>
#include <cstdio>
#include <string>
#include <string_view>
#include <unordered_set>
#include <utility>
#include <vector>

#include <catch2/catch.hpp>

#include "reshard/format/pickle_opcodes.h"

#include "tests/unit/format/pickle_goldens.h"
#include "tests/unit/hex.h"

namespace reshard::format {
namespace {

using reshard::testing::FromHex;
using reshard::testing::kMixed2;

// ---- helpers ----

// Assembles a pickle by hand: starts with PROTO `protocol`; Stop() appends STOP.
class Asm {
 public:
  explicit Asm(int protocol = 2) { Op(PickleOp::kProto).U8(static_cast<uint8_t>(protocol)); }
  Asm& Op(PickleOp op) { return U8(static_cast<uint8_t>(op)); }
  Asm& U8(uint8_t v) { return Le(v, 1); }
  Asm& U16(uint16_t v) { return Le(v, 2); }
  Asm& U32(uint32_t v) { return Le(v, 4); }
  Asm& U64(uint64_t v) { return Le(v, 8); }
  Asm& Raw(std::string_view s) {
    bytes_.append(s);
    return *this;
  }
  Asm& Int1(uint8_t v) { return Op(PickleOp::kBinInt1).U8(v); }
  Asm& Str(std::string_view s) {
    return Op(PickleOp::kBinUnicode).U32(static_cast<uint32_t>(s.size())).Raw(s);
  }
  Asm& Repeat(PickleOp op, size_t n) {
    bytes_.append(n, static_cast<char>(op));
    return *this;
  }
  std::string Stop() const { return bytes_ + '.'; }
  const std::string& bytes() const { return bytes_; }

 private:
  Asm& Le(uint64_t v, int width) {
    for (int k = 0; k < width; ++k) bytes_.push_back(static_cast<char>(v >> (8 * k)));
    return *this;
  }
  std::string bytes_;
};

// A Python-like rendering of the value at `id`, for compact structural assertions:
// reduce -> "callable(args...)", newobj -> "new cls(args...)"; object extras as "+append[..]",
// "+setitems{..}", "+state(..)"; a cycle back to a node on the path renders as "<cycle>".
class Renderer {
 public:
  explicit Renderer(const PickleTree& tree) : tree_(tree) {}
  std::string operator()(NodeId id) {
    if (on_path_.count(id)) return "<cycle>";
    on_path_.insert(id);
    std::string out = Render(tree_.node(id));
    on_path_.erase(id);
    return out;
  }

 private:
  std::string Join(const std::vector<NodeId>& items, bool pairs) {
    std::string out;
    for (size_t k = 0; k < items.size(); ++k) {
      if (k > 0) out += pairs && k % 2 == 1 ? ": " : ", ";
      out += (*this)(items[k]);
    }
    return out;
  }
  static std::string Hex(const std::string& s) {
    std::string out;
    char buf[3];
    for (char c : s) {
      std::snprintf(buf, sizeof buf, "%02x", static_cast<uint8_t>(c));
      out += buf;
    }
    return out;
  }
  static std::string Quote(const std::string& s) {
    std::string out = "'";
    char buf[5];
    for (char c : s) {
      const auto u = static_cast<uint8_t>(c);
      if (u < 0x20 || u == 0x7f) {
        std::snprintf(buf, sizeof buf, "\\x%02x", u);
        out += buf;
      } else {
        out += c;
      }
    }
    return out + "'";
  }
  std::string Render(const Node& n) {
    switch (n.kind) {
      case NodeKind::kNone: return "None";
      case NodeKind::kBool: return n.b ? "True" : "False";
      case NodeKind::kInt: return std::to_string(n.i);
      case NodeKind::kBigInt: return "long(" + Hex(n.text) + ")";
      case NodeKind::kFloat: {
        char buf[32];
        std::snprintf(buf, sizeof buf, "%.17g", n.f);
        return buf;
      }
      case NodeKind::kStr: return Quote(n.text);
      case NodeKind::kBytes: return "b'" + Hex(n.text) + "'";
      case NodeKind::kByteArray: return "bytearray'" + Hex(n.text) + "'";
      case NodeKind::kTuple:
        return "(" + Join(n.items, false) + (n.items.size() == 1 ? ",)" : ")");
      case NodeKind::kList: return "[" + Join(n.items, false) + "]";
      case NodeKind::kDict: return "{" + Join(n.items, true) + "}";
      case NodeKind::kSet: return "set{" + Join(n.items, false) + "}";
      case NodeKind::kFrozenSet: return "frozenset{" + Join(n.items, false) + "}";
      case NodeKind::kGlobal: return n.text + "." + n.global_name();
      case NodeKind::kBuild: return "build(" + Join(n.items, false) + ")";
      case NodeKind::kPersId: return "persid(" + Join(n.items, false) + ")";
      case NodeKind::kReduce:
      case NodeKind::kNewObj: {
        std::string out = n.kind == NodeKind::kNewObj ? "new " : "";
        out += (*this)(n.items[0]);
        const Node& args = tree_.node(n.items[1]);
        out += args.kind == NodeKind::kTuple ? "(" + Join(args.items, false) + ")"
                                             : "(*" + (*this)(n.items[1]) + ")";
        if (n.items.size() == 3) out += "(**" + (*this)(n.items[2]) + ")";
        if (!n.list_items().empty()) out += " +append[" + Join(n.list_items(), false) + "]";
        if (!n.dict_items().empty()) out += " +setitems{" + Join(n.dict_items(), true) + "}";
        if (n.state != kNoNode) out += " +state(" + (*this)(n.state) + ")";
        return out;
      }
    }
    return "?";
  }

  const PickleTree& tree_;
  std::unordered_set<NodeId> on_path_;
};

std::string Render(const PickleTree& tree) { return Renderer(tree)(tree.root()); }

PickleTree MustParse(std::string_view bytes, const PickleLimits& limits = {}) {
  Result<PickleTree> tree = ParsePickle(bytes, limits);
  INFO(tree.status().ToString());
  REQUIRE(tree.ok());
  return std::move(tree).value();
}

Status ParseError(std::string_view bytes, const PickleLimits& limits = {}) {
  Result<PickleTree> tree = ParsePickle(bytes, limits);
  REQUIRE_FALSE(tree.ok());
  return tree.status();
}

// ---- pickles written by Python 3.11 (pickle.dumps(obj, protocol=N).hex()) ----

// The object of pickle_goldens.h's kMixed2, at protocols 3, 4 and 5.
constexpr std::string_view kMixed3 =
    "80037d71002858010000006171015d7102284b014b024b034740120000000000004e877103655801000000737104"
    "636275696c74696e730a7365740a71055d71064b0761857107527108580200000066737109636275696c74696e73"
    "0a66726f7a656e7365740a710a5d710b4b086185710c52710d580100000062710e430200ff710f58020000006261"
    "7110636275696c74696e730a6279746561727261790a711143027879711285711352711458010000007471158858"
    "010000006671168958010000006571172958010000007571185802000000c3a97119752e";
constexpr std::string_view kMixed4 =
    "8004957b000000000000007d94288c0161945d94284b014b024b034740120000000000004e8794658c0173948f94"
    "284b07908c02667394284b0891948c016294430200ff948c026261948c086275696c74696e73948c096279746561"
    "727261799493944302787994859452948c017494888c016694898c016594298c0175948c02c3a994752e";
constexpr std::string_view kMixed5 =
    "80059565000000000000007d94288c0161945d94284b014b024b034740120000000000004e8794658c0173948f94"
    "284b07908c02667394284b0891948c016294430200ff948c026261949602000000000000007879948c017494888c"
    "016694898c016594298c0175948c02c3a994752e";

// [0, -1, 255, 256, 65535, 65536, 2**31 - 1, 2**31, -2**31, -2**31 - 1, 2**63 - 1, -2**63,
//  2**64, -2**64, 2**40]
constexpr std::string_view kInts2 =
    "80025d7100284b004affffffff4bff4d00014dffff4a000001004affffff7f8a0500000080004a000000808a05ff"
    "ffff7fff8a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a090000000000000000ff"
    "8a06000000000001652e";
constexpr std::string_view kInts4 =
    "80049563000000000000005d94284b004affffffff4bff4d00014dffff4a000001004affffff7f8a050000008000"
    "4a000000808a05ffffff7fff8a08ffffffffffffff7f8a0800000000000000808a090000000000000000018a0900"
    "00000000000000ff8a06000000000001652e";

// [1.5, -0.0, inf, -inf, nan]
constexpr std::string_view kFloats2 =
    "80025d710028473ff8000000000000478000000000000000477ff000000000000047fff0000000000000477ff800"
    "0000000000652e";
constexpr std::string_view kFloats4 =
    "80049532000000000000005d9428473ff8000000000000478000000000000000477ff000000000000047fff00000"
    "00000000477ff8000000000000652e";

// x = [1]; [x, x, {"k": x}]
constexpr std::string_view kShared2 =
    "80025d7100285d71014b016168017d710258010000006b7103680173652e";
constexpr std::string_view kShared4 =
    "80049515000000000000005d94285d944b016168017d948c016b94680173652e";
// l = []; l.append(l)
constexpr std::string_view kSelfRef2 = "80025d71006800612e";
constexpr std::string_view kSelfRef5 = "80059506000000000000005d946800612e";

// OrderedDict([("w", 1), ("b", 2)]) with _metadata = {"": {"version": 1}}, as state dicts have.
constexpr std::string_view kOrderedDict2 =
    "800263636f6c6c656374696f6e730a4f726465726564446963740a7100295271012858010000007771024b015801"
    "0000006271034b02757d710458090000005f6d6574616461746171057d7106580000000071077d71085807000000"
    "76657273696f6e71094b01737373622e";
constexpr std::string_view kOrderedDict4 =
    "80049555000000000000008c0b636f6c6c656374696f6e73948c0b4f72646572656444696374949394295294288c"
    "0177944b018c0162944b02757d948c095f6d65746164617461947d948c00947d948c0776657273696f6e944b0173"
    "7373622e";

// class Point (in __main__) whose __getnewargs_ex__ returns ((1,), {"y": 2}) and whose
// __getstate__ returns None: Point(1, y=2) at protocols 4 and 5.
constexpr std::string_view kNewObjEx4 =
    "80049525000000000000008c085f5f6d61696e5f5f948c05506f696e749493944b0185947d948c0179944b027392"
    "942e";
constexpr std::string_view kNewObjEx5 =
    "80059525000000000000008c085f5f6d61696e5f5f948c05506f696e749493944b0185947d948c0179944b027392"
    "942e";

// archive/data.pkl of torch.save(OrderedDict(w=torch.zeros(2, 3), n=7)), torch 2.9.
constexpr std::string_view kTorchDataPkl =
    "800263636f6c6c656374696f6e730a4f726465726564446963740a71002952710128580100000077710263746f72"
    "63682e5f7574696c730a5f72656275696c645f74656e736f725f76320a71032828580700000073746f7261676571"
    "0463746f7263680a466c6f617453746f726167650a71055801000000307106580300000063707571074b06747108"
    "514b004b024b038671094b034b0186710a8968002952710b74710c52710d58010000006e710e4b07752e";

constexpr std::string_view kMixedCommon =
    "{'a': [1, 2, (3, 4.5, None)], 's': %SET, 'fs': %FROZENSET, 'b': %BYTES, 'ba': %BYTEARRAY, "
    "'t': True, 'f': False, 'e': (), 'u': '\xc3\xa9'}";

std::string Mixed(std::string set, std::string frozenset, std::string bytes,
                  std::string bytearray) {
  std::string out(kMixedCommon);
  auto replace = [&](std::string_view key, const std::string& value) {
    out.replace(out.find(key), key.size(), value);
  };
  replace("%SET", set);
  replace("%FROZENSET", frozenset);
  replace("%BYTES", bytes);
  replace("%BYTEARRAY", bytearray);
  return out;
}

TEST_CASE("pickle reader: Python's containers, bytes and sets at protocols 2 to 5", "[format]") {
  const std::string codecs_b = "_codecs.encode('\\x00\xc3\xbf', 'latin1')";
  CHECK(Render(MustParse(FromHex(kMixed2))) ==
        Mixed("__builtin__.set([7])", "__builtin__.frozenset([8])", codecs_b,
              "__builtin__.bytearray(_codecs.encode('xy', 'latin1'))"));
  CHECK(Render(MustParse(FromHex(kMixed3))) ==
        Mixed("builtins.set([7])", "builtins.frozenset([8])", "b'00ff'",
              "builtins.bytearray(b'7879')"));
  CHECK(Render(MustParse(FromHex(kMixed4))) ==
        Mixed("set{7}", "frozenset{8}", "b'00ff'", "builtins.bytearray(b'7879')"));
  CHECK(Render(MustParse(FromHex(kMixed5))) ==
        Mixed("set{7}", "frozenset{8}", "b'00ff'", "bytearray'7879'"));
}

TEST_CASE("pickle reader: protocol 2 memo shares the _codecs.encode global", "[format]") {
  const PickleTree tree = MustParse(FromHex(kMixed2));
  const NodeId b = tree.DictGet(tree.root(), "b");
  const NodeId ba_arg = tree.node(tree.node(tree.DictGet(tree.root(), "ba")).items[1]).items[0];
  REQUIRE(tree.node(b).kind == NodeKind::kReduce);
  CHECK(tree.node(b).items[0] == tree.node(ba_arg).items[0]);  // BINGET 15
  CHECK(tree.IsGlobal(tree.node(b).items[0], "_codecs", "encode"));
}

TEST_CASE("pickle reader: ints of every width, and big ints", "[format]") {
  const std::string expected =
      "[0, -1, 255, 256, 65535, 65536, 2147483647, 2147483648, -2147483648, -2147483649, "
      "9223372036854775807, -9223372036854775808, long(000000000000000001), "
      "long(0000000000000000ff), 1099511627776]";
  CHECK(Render(MustParse(FromHex(kInts2))) == expected);
  CHECK(Render(MustParse(FromHex(kInts4))) == expected);
  // BININT is signed; BININT2 and BININT1 are not; LONG1 of length 0 is 0.
  CHECK(Render(MustParse(Asm().Op(PickleOp::kBinInt).U32(0x80000000u).Stop())) == "-2147483648");
  CHECK(Render(MustParse(Asm().Op(PickleOp::kBinInt2).U16(0xFFFF).Stop())) == "65535");
  CHECK(Render(MustParse(Asm().Op(PickleOp::kLong1).U8(0).Stop())) == "0");
  // LONG4 with a redundant sign byte normalises to kInt.
  CHECK(Render(MustParse(Asm().Op(PickleOp::kLong4).U32(3).Raw("\xff\xff\xff").Stop())) == "-1");
}

TEST_CASE("pickle reader: BINFLOAT is big-endian, including -0.0, inf and nan", "[format]") {
  for (const std::string_view hex : {kFloats2, kFloats4}) {
    const PickleTree tree = MustParse(FromHex(hex));
    const std::vector<NodeId>& items = tree.node(tree.root()).items;
    REQUIRE(items.size() == 5);
    CHECK(tree.node(items[0]).f == 1.5);
    CHECK(tree.node(items[1]).f == 0.0);
    CHECK(std::signbit(tree.node(items[1]).f));
    CHECK(tree.node(items[2]).f == INFINITY);
    CHECK(tree.node(items[3]).f == -INFINITY);
    CHECK(std::isnan(tree.node(items[4]).f));
  }
}

TEST_CASE("pickle reader: memo shares containers by id, so later mutation is visible",
          "[format]") {
  for (const std::string_view hex : {kShared2, kShared4}) {
    const PickleTree tree = MustParse(FromHex(hex));
    const std::vector<NodeId>& items = tree.node(tree.root()).items;
    REQUIRE(items.size() == 3);
    CHECK(items[0] == items[1]);
    CHECK(tree.DictGet(items[2], "k") == items[0]);
    CHECK(Render(tree) == "[[1], [1], {'k': [1]}]");
  }
  // The list is memoized empty and filled afterwards; the memo sees the appended item.
  const std::string bytes = Asm()
                                .Op(PickleOp::kEmptyList).Op(PickleOp::kBinPut).U8(0)
                                .Int1(9).Op(PickleOp::kAppend)
                                .Op(PickleOp::kBinGet).U8(0).Op(PickleOp::kTuple2)
                                .Stop();
  CHECK(Render(MustParse(bytes)) == "([9], [9])");
}

TEST_CASE("pickle reader: a list that contains itself", "[format]") {
  for (const std::string_view hex : {kSelfRef2, kSelfRef5}) {
    const PickleTree tree = MustParse(FromHex(hex));
    REQUIRE(tree.node(tree.root()).items.size() == 1);
    CHECK(tree.node(tree.root()).items[0] == tree.root());
  }
}

TEST_CASE("pickle reader: OrderedDict state dicts keep SETITEMS and BUILD on the object",
          "[format]") {
  const std::string expected =
      "collections.OrderedDict() +setitems{'w': 1, 'b': 2} "
      "+state({'_metadata': {'': {'version': 1}}})";
  CHECK(Render(MustParse(FromHex(kOrderedDict2))) == expected);
  CHECK(Render(MustParse(FromHex(kOrderedDict4))) == expected);  // STACK_GLOBAL, MEMOIZE, FRAME
}

TEST_CASE("pickle reader: NEWOBJ_EX from __getnewargs_ex__", "[format]") {
  for (const std::string_view hex : {kNewObjEx4, kNewObjEx5}) {
    const PickleTree tree = MustParse(FromHex(hex));
    CHECK(Render(tree) == "new __main__.Point(1)(**{'y': 2})");
    CHECK(tree.node(tree.root()).items.size() == 3);
  }
}

TEST_CASE("pickle reader: torch.save data.pkl", "[format]") {
  const PickleTree tree = MustParse(FromHex(kTorchDataPkl));
  CHECK(Render(tree) ==
        "collections.OrderedDict() +setitems{'w': torch._utils._rebuild_tensor_v2("
        "persid(('storage', torch.FloatStorage, '0', 'cpu', 6)), 0, (2, 3), (3, 1), False, "
        "collections.OrderedDict()), 'n': 7}");
  // backward_hooks reuses the OrderedDict global through BINGET 0.
  const Node& root = tree.node(tree.root());
  const Node& tensor = tree.node(root.dict_items()[1]);
  const Node& args = tree.node(tensor.items[1]);
  CHECK(tree.node(args.items[5]).items[0] == root.items[0]);
}

TEST_CASE("pickle reader: hand-assembled opcodes", "[format]") {
  using Op = PickleOp;
  SECTION("stack opcodes: POP, POP_MARK, DUP, and POP of a bare mark") {
    CHECK(Render(MustParse(Asm().Int1(1).Int1(2).Op(Op::kPop).Stop())) == "1");
    CHECK(Render(MustParse(Asm().Int1(1).Op(Op::kMark).Int1(2).Int1(3).Op(Op::kPopMark).Stop())) ==
          "1");
    CHECK(Render(MustParse(Asm().Int1(4).Op(Op::kDup).Op(Op::kTuple2).Stop())) == "(4, 4)");
    CHECK(Render(MustParse(Asm().Int1(5).Op(Op::kMark).Op(Op::kPop).Stop())) == "5");
  }
  SECTION("text and bytes of every width") {
    CHECK(Render(MustParse(Asm().Op(Op::kShortBinUnicode).U8(2).Raw("hi").Stop())) == "'hi'");
    CHECK(Render(MustParse(Asm().Op(Op::kBinUnicode8).U64(1).Raw("x").Stop())) == "'x'");
    CHECK(Render(MustParse(Asm().Op(Op::kBinString).U32(2).Raw("ab").Stop())) == "'ab'");
    CHECK(Render(MustParse(Asm().Op(Op::kShortBinString).U8(1).Raw("c").Stop())) == "'c'");
    CHECK(Render(MustParse(Asm().Op(Op::kBinBytes).U32(1).Raw("\x01").Stop())) == "b'01'");
    CHECK(Render(MustParse(Asm().Op(Op::kShortBinBytes).U8(0).Stop())) == "b''");
    CHECK(Render(MustParse(Asm().Op(Op::kBinBytes8).U64(2).Raw("\xfe\xff").Stop())) == "b'feff'");
    CHECK(Render(MustParse(Asm().Op(Op::kByteArray8).U64(1).Raw("z").Stop())) == "bytearray'7a'");
    // A lone surrogate, as Python's surrogatepass writes it.
    CHECK(Render(MustParse(Asm().Str("\xed\xa0\x80").Stop())) == "'\xed\xa0\x80'");
  }
  SECTION("containers built from a MARK") {
    const std::string tuple4 =
        Asm().Op(Op::kMark).Int1(1).Int1(2).Int1(3).Int1(4).Op(Op::kTuple).Stop();
    CHECK(Render(MustParse(tuple4)) == "(1, 2, 3, 4)");
    CHECK(Render(MustParse(Asm().Op(Op::kMark).Int1(1).Op(Op::kList).Stop())) == "[1]");
    CHECK(Render(MustParse(Asm().Op(Op::kMark).Str("k").Int1(1).Op(Op::kDict).Stop())) ==
          "{'k': 1}");
    CHECK(Render(MustParse(Asm().Op(Op::kMark).Int1(1).Op(Op::kFrozenSet).Stop())) ==
          "frozenset{1}");
    const std::string set =
        Asm().Op(Op::kEmptySet).Op(Op::kMark).Int1(1).Int1(2).Op(Op::kAddItems).Stop();
    CHECK(Render(MustParse(set)) == "set{1, 2}");
    CHECK(Render(MustParse(Asm().Op(Op::kEmptyDict).Str("k").Int1(1).Op(Op::kSetItem).Stop())) ==
          "{'k': 1}");
    CHECK(Render(MustParse(Asm().Op(Op::kEmptyTuple).Op(Op::kTuple1).Stop())) == "((),)");
    CHECK(Render(MustParse(Asm().Int1(1).Int1(2).Int1(3).Op(Op::kTuple3).Stop())) == "(1, 2, 3)");
  }
  SECTION("a repeated str key replaces the value, as in Python") {
    const std::string bytes = Asm()
                                  .Op(Op::kMark).Str("k").Int1(1).Str("j").Int1(2).Op(Op::kDict)
                                  .Op(Op::kMark).Str("k").Int1(3).Op(Op::kSetItems)
                                  .Stop();
    CHECK(Render(MustParse(bytes)) == "{'k': 3, 'j': 2}");
  }
  SECTION("globals, REDUCE, NEWOBJ, BINPERSID, BUILD") {
    CHECK(Render(MustParse(Asm().Op(Op::kGlobal).Raw("a.b\nC\n").Stop())) == "a.b.C");
    CHECK(Render(MustParse(Asm(4).Str("m").Str("n").Op(Op::kStackGlobal).Stop())) == "m.n");
    const std::string reduce =
        Asm().Op(Op::kGlobal).Raw("m\nf\n").Int1(1).Op(Op::kTuple1).Op(Op::kReduce).Stop();
    CHECK(Render(MustParse(reduce)) == "m.f(1)");
    const std::string newobj =
        Asm().Op(Op::kGlobal).Raw("m\nC\n").Op(Op::kEmptyTuple).Op(Op::kNewObj).Stop();
    CHECK(Render(MustParse(newobj)) == "new m.C()");
    CHECK(Render(MustParse(Asm().Str("k").Op(Op::kBinPersId).Stop())) == "persid('k')");
    // BUILD on a non-object wraps it; a second BUILD on an object wraps it too.
    CHECK(Render(MustParse(Asm().Op(Op::kEmptyList).Int1(1).Op(Op::kBuild).Stop())) ==
          "build([], 1)");
    const std::string twice = Asm()
                                  .Op(Op::kGlobal).Raw("m\nC\n").Op(Op::kEmptyTuple).Op(Op::kNewObj)
                                  .Int1(1).Op(Op::kBuild).Int1(2).Op(Op::kBuild)
                                  .Stop();
    CHECK(Render(MustParse(twice)) == "build(new m.C() +state(1), 2)");
  }
  SECTION("APPENDS and SETITEMS on an object land in its list_items and dict_items") {
    const std::string bytes = Asm()
                                  .Op(Op::kGlobal).Raw("m\nL\n").Op(Op::kEmptyTuple).Op(Op::kReduce)
                                  .Int1(1).Op(Op::kAppend)
                                  .Op(Op::kMark).Int1(2).Int1(3).Op(Op::kAppends)
                                  .Str("k").Int1(4).Op(Op::kSetItem)
                                  .Stop();
    CHECK(Render(MustParse(bytes)) == "m.L() +append[1, 2, 3] +setitems{'k': 4}");
  }
  SECTION("memo: LONG_BINPUT, LONG_BINGET, MEMOIZE, and a sparse huge id") {
    const std::string bytes = Asm()
                                  .Int1(7).Op(Op::kLongBinPut).U32(0xFFFFFFFFu)
                                  .Op(Op::kMemoize)  // id 1: the memo holds one entry
                                  .Op(Op::kLongBinGet).U32(0xFFFFFFFFu)
                                  .Op(Op::kBinGet).U8(1)
                                  .Op(Op::kTuple3)
                                  .Stop();
    CHECK(Render(MustParse(bytes)) == "(7, 7, 7)");
  }
  SECTION("protocols 2 to 5, FRAME, and bytes after STOP") {
    for (int proto = 2; proto <= 5; ++proto) {
      CHECK(Render(MustParse(Asm(proto).Op(Op::kNone).Stop())) == "None");
    }
    const std::string framed = Asm(4).Op(Op::kFrame).U64(2).Op(Op::kNewTrue).Stop();
    CHECK(Render(MustParse(framed)) == "True");
    CHECK(Render(MustParse(Asm().Op(Op::kNewFalse).Stop() + "garbage")) == "False");
  }
}

TEST_CASE("pickle reader: every byte is a known opcode or an unknown-opcode error", "[format]") {
  int named = 0;
  for (int byte = 0; byte < 256; ++byte) {
    const auto b = static_cast<uint8_t>(byte);
    const Result<PickleTree> tree = ParsePickle(Asm().U8(b).Stop());
    const bool unknown_error = !tree.ok() && tree.status().message().find("unknown opcode") !=
                                                 std::string::npos;
    INFO("byte " << byte << ": " << tree.status().ToString());
    if (PickleOpName(b).empty()) {
      CHECK(unknown_error);
    } else {
      ++named;
      CHECK_FALSE(unknown_error);
      CHECK(PickleOpName(static_cast<PickleOp>(b)) == PickleOpName(b));
    }
  }
  CHECK(named == 68);
  CHECK(PickleOpName(PickleOp::kShortBinUnicode) == "SHORT_BINUNICODE");
  CHECK(PickleOpName(PickleOp::kReadOnlyBuffer) == "READONLY_BUFFER");
}

// ---- error paths ----

TEST_CASE("pickle reader error: every truncation of a valid pickle", "[format]") {
  for (const std::string_view hex : {kTorchDataPkl, kMixed2, kMixed5, kOrderedDict4, kInts2}) {
    const std::string full = FromHex(hex);
    for (size_t n = 0; n < full.size(); ++n) {
      INFO("prefix of " << n << " bytes");
      CHECK(ParseError(full.substr(0, n)).code() == StatusCode::kCorrupt);
    }
  }
}

TEST_CASE("pickle reader error: empty input", "[format]") {
  CHECK(ParseError("").code() == StatusCode::kCorrupt);
}

TEST_CASE("pickle reader error: unknown opcode", "[format]") {
  const Status s = ParseError(Asm().U8(0xFF).Stop());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 2: unknown opcode 0xff");
}

TEST_CASE("pickle reader error: text-protocol and other unsupported opcodes", "[format]") {
  const Status s = ParseError(Asm().Raw("I1\n").Stop());
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK(s.message().rfind("offset 2: INT: ", 0) == 0);
  CHECK(ParseError(Asm().Op(PickleOp::kExt1).U8(1).Stop()).code() == StatusCode::kUnsupported);
  CHECK(ParseError(Asm(5).Op(PickleOp::kNextBuffer).Stop()).code() == StatusCode::kUnsupported);
}

TEST_CASE("pickle reader error: PROTO missing, out of range, or not first", "[format]") {
  CHECK(ParseError("N.").code() == StatusCode::kUnsupported);  // protocol 0/1
  CHECK(ParseError(Asm(1).Op(PickleOp::kNone).Stop()).code() == StatusCode::kUnsupported);
  CHECK(ParseError(Asm(6).Op(PickleOp::kNone).Stop()).code() == StatusCode::kUnsupported);
  CHECK(ParseError(Asm().Op(PickleOp::kProto).U8(2).Op(PickleOp::kNone).Stop()).code() ==
        StatusCode::kCorrupt);
}

TEST_CASE("pickle reader error: stack underflow", "[format]") {
  const Status s = ParseError(Asm().Op(PickleOp::kAppend).Stop());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 2: APPEND: stack underflow");
  // A MARK fences off what lies below it.
  CHECK(ParseError(Asm().Int1(1).Op(PickleOp::kMark).Op(PickleOp::kTuple1).Stop()).message() ==
        "offset 5: TUPLE1: stack underflow");
  CHECK(ParseError(Asm().Op(PickleOp::kDup).Stop()).code() == StatusCode::kCorrupt);
  CHECK(ParseError(Asm().Op(PickleOp::kTuple).Stop()).message() ==
        "offset 2: TUPLE: no MARK on the stack");
}

TEST_CASE("pickle reader error: SETITEMS with an odd item count", "[format]") {
  const std::string bytes =
      Asm().Op(PickleOp::kEmptyDict).Op(PickleOp::kMark).Int1(1).Op(PickleOp::kSetItems).Stop();
  const Status s = ParseError(bytes);
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 6: SETITEMS: odd number of items (1) after MARK");
  CHECK(ParseError(Asm().Op(PickleOp::kMark).Int1(1).Op(PickleOp::kDict).Stop()).code() ==
        StatusCode::kCorrupt);
}

TEST_CASE("pickle reader error: APPENDS on a dict, ADDITEMS on a list", "[format]") {
  const std::string appends =
      Asm().Op(PickleOp::kEmptyDict).Op(PickleOp::kMark).Int1(1).Op(PickleOp::kAppends).Stop();
  const Status s = ParseError(appends);
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 6: APPENDS: target is a dict, not a list or an object");
  const std::string additems =
      Asm().Op(PickleOp::kEmptyList).Op(PickleOp::kMark).Int1(1).Op(PickleOp::kAddItems).Stop();
  CHECK(ParseError(additems).code() == StatusCode::kCorrupt);
}

TEST_CASE("pickle reader error: BINGET of an id never stored", "[format]") {
  const Status s = ParseError(Asm().Op(PickleOp::kBinGet).U8(5).Stop());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 2: BINGET: id 5 was never stored");
}

TEST_CASE("pickle reader error: too many memo entries", "[format]") {
  PickleLimits limits;
  limits.max_memo_entries = 2;
  Asm ok;
  ok.Op(PickleOp::kNone).Op(PickleOp::kLongBinPut).U32(0xFFFFFFFFu).Op(PickleOp::kBinPut).U8(3);
  ok.Op(PickleOp::kBinPut).U8(3);  // overwriting an id takes no new entry
  CHECK(MustParse(ok.Stop(), limits).size() == 1);
  ok.Op(PickleOp::kLongBinPut).U32(7);  // offset 2 + 1 + 5 + 2 + 2
  const Status s = ParseError(ok.Stop(), limits);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(s.message() == "offset 12: LONG_BINPUT: id 7: memo limit 2 exceeded");
}

TEST_CASE("pickle reader error: deep nesting is bounded without recursion", "[format]") {
  constexpr size_t kDepth = 100000;
  Asm lists;
  lists.Repeat(PickleOp::kEmptyList, kDepth).Repeat(PickleOp::kAppend, kDepth - 1);
  Status s = ParseError(lists.Stop());
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(s.message().find("nesting depth 513 exceeds limit 512") != std::string::npos);

  Asm tuples;
  tuples.Repeat(PickleOp::kMark, kDepth).Op(PickleOp::kNone).Repeat(PickleOp::kTuple, kDepth);
  CHECK(ParseError(tuples.Stop()).code() == StatusCode::kResourceExhausted);

  PickleLimits limits;
  limits.max_depth = 3;
  CHECK(MustParse(Asm().Op(PickleOp::kNone).Op(PickleOp::kTuple1).Op(PickleOp::kTuple1).Stop(),
                  limits).size() == 3);
  const std::string four =
      Asm().Op(PickleOp::kNone).Repeat(PickleOp::kTuple1, 3).Stop();
  CHECK(ParseError(four, limits).code() == StatusCode::kResourceExhausted);
}

TEST_CASE("pickle reader error: a length longer than the input", "[format]") {
  const Status s = ParseError(Asm().Op(PickleOp::kBinUnicode).U32(0xFFFFFFFFu).Raw("abc").bytes());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 2: BINUNICODE: string length 4294967295 exceeds remaining 3 bytes");
  const std::string huge8 = Asm().Op(PickleOp::kBinBytes8).U64(~uint64_t{0}).Stop();
  CHECK(ParseError(huge8).code() == StatusCode::kCorrupt);
  CHECK(ParseError(Asm().Op(PickleOp::kLong4).U32(0x7FFFFFFF).Stop()).code() ==
        StatusCode::kCorrupt);
  // Negative signed lengths.
  CHECK(ParseError(Asm().Op(PickleOp::kBinString).U32(0xFFFFFFFFu).Stop()).message() ==
        "offset 2: BINSTRING: negative length -1");
  CHECK(ParseError(Asm().Op(PickleOp::kLong4).U32(0x80000000u).Stop()).code() ==
        StatusCode::kCorrupt);
}

TEST_CASE("pickle reader error: FRAME length past the end", "[format]") {
  const Status s = ParseError(Asm(4).Op(PickleOp::kFrame).U64(1000).Op(PickleOp::kNone).Stop());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 2: FRAME: frame length 1000 exceeds remaining 2 bytes");
}

TEST_CASE("pickle reader error: STOP with two values or an open MARK", "[format]") {
  const Status s = ParseError(Asm().Op(PickleOp::kNone).Op(PickleOp::kNone).Stop());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 4: STOP: 2 values on the stack, expected exactly 1");
  CHECK(ParseError(Asm().Op(PickleOp::kMark).Op(PickleOp::kNone).Stop()).code() ==
        StatusCode::kCorrupt);
  CHECK(ParseError(Asm().Stop()).code() == StatusCode::kCorrupt);
  CHECK(ParseError(Asm().Op(PickleOp::kNone).bytes()).message() ==
        "offset 3: truncated: input ends before STOP");
}

TEST_CASE("pickle reader error: invalid UTF-8 in str and GLOBAL", "[format]") {
  CHECK(ParseError(Asm().Str("a\xff").Stop()).message() ==
        "offset 2: BINUNICODE: invalid UTF-8 at byte 1 of a 2-byte string");
  CHECK(ParseError(Asm().Str("\xc0\x80").Stop()).code() == StatusCode::kCorrupt);  // overlong
  CHECK(ParseError(Asm().Str("\xf4\x90\x80\x80").Stop()).code() == StatusCode::kCorrupt);
  CHECK(ParseError(Asm().Str("\xe2\x82").Stop()).code() == StatusCode::kCorrupt);  // cut short
  CHECK(ParseError(Asm().Op(PickleOp::kGlobal).Raw("m\xff\nn\n").Stop()).code() ==
        StatusCode::kCorrupt);
}

TEST_CASE("pickle reader error: GLOBAL without a newline", "[format]") {
  const Status s = ParseError(Asm().Op(PickleOp::kGlobal).Raw(std::string(5000, 'm')).Stop());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 2: GLOBAL: line longer than 4096 bytes");
  CHECK(ParseError(Asm().Op(PickleOp::kGlobal).Raw("mod\nname").bytes()).code() ==
        StatusCode::kCorrupt);
}

TEST_CASE("pickle reader error: STACK_GLOBAL operands that are not str", "[format]") {
  const Status s = ParseError(Asm(4).Int1(1).Str("n").Op(PickleOp::kStackGlobal).Stop());
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK(s.message() == "offset 10: STACK_GLOBAL: operands must be str, got int and str");
}

TEST_CASE("pickle reader error: node, stack, mark and payload limits", "[format]") {
  PickleLimits limits;
  limits.max_nodes = 3;
  const std::string four_nones = Asm()
                                     .Op(PickleOp::kNone).Op(PickleOp::kPop)
                                     .Op(PickleOp::kNone).Op(PickleOp::kPop)
                                     .Op(PickleOp::kNone).Op(PickleOp::kPop)
                                     .Op(PickleOp::kNone)
                                     .Stop();
  CHECK(ParseError(four_nones, limits).message() == "offset 8: NONE: node limit 3 exceeded");

  // The arena's byte budget lowers the node limit to what it holds, and says so.
  limits = PickleLimits();
  limits.max_tree_bytes_per_input_byte = 0;
  limits.max_tree_bytes = 3 * (sizeof(Node) + sizeof(uint32_t));
  CHECK(ParseError(four_nones, limits).message() ==
        "offset 8: NONE: node limit 3 exceeded (the tree's " + std::to_string(limits.max_tree_bytes) + "-byte budget)");
  limits.max_tree_bytes = 4 * (sizeof(Node) + sizeof(uint32_t));
  CHECK(MustParse(four_nones, limits).size() == 4);

  // A larger pickle gets max_tree_bytes_per_input_byte times its length, when that is more.
  limits.max_tree_bytes = 1;
  limits.max_tree_bytes_per_input_byte = 3 * (sizeof(Node) + sizeof(uint32_t)) / four_nones.size() + 1;
  const uint64_t scaled = limits.max_tree_bytes_per_input_byte * four_nones.size();
  CHECK(ParseError(four_nones, limits).message() ==
        "offset 8: NONE: node limit 3 exceeded (the tree's " + std::to_string(scaled) + "-byte budget)");
  limits.max_tree_bytes_per_input_byte = 4 * (sizeof(Node) + sizeof(uint32_t)) / four_nones.size() + 1;
  CHECK(MustParse(four_nones, limits).size() == 4);

  limits = PickleLimits();
  limits.max_stack = 2;
  const std::string three = Asm().Int1(1).Int1(2).Int1(3).Op(PickleOp::kTuple3).Stop();
  CHECK(ParseError(three, limits).code() == StatusCode::kResourceExhausted);
  const std::string marks = Asm().Repeat(PickleOp::kMark, 3).Stop();
  CHECK(ParseError(marks, limits).code() == StatusCode::kResourceExhausted);

  limits = PickleLimits();
  limits.max_payload_bytes = 4;
  CHECK(MustParse(Asm().Str("abcd").Stop(), limits).size() == 1);
  const Status s = ParseError(Asm().Str("ab").Str("abc").Op(PickleOp::kTuple2).Stop(), limits);
  CHECK(s.code() == StatusCode::kResourceExhausted);
  CHECK(s.message() == "offset 9: BINUNICODE: payload of 3 bytes exceeds the remaining budget "
                       "(2 of 4 bytes used)");

  // A GLOBAL's name and an extended object's items live in a NodeExtras, charged like a payload: a pickle of
  // 5-byte STACK_GLOBALs over memoized strings cannot make them cost more than the budget says.
  limits = PickleLimits();
  const std::string global = Asm(4).Op(PickleOp::kGlobal).Raw("m\nC\n").Stop();
  limits.max_payload_bytes = 2 + sizeof(NodeExtras);
  CHECK(MustParse(global, limits).size() == 1);
  limits.max_payload_bytes = 1 + sizeof(NodeExtras);
  CHECK(ParseError(global, limits).code() == StatusCode::kResourceExhausted);
  const std::string extended =
      Asm().Op(PickleOp::kGlobal).Raw("m\nL\n").Op(PickleOp::kEmptyTuple).Op(PickleOp::kReduce)
          .Int1(1).Op(PickleOp::kAppend).Int1(2).Op(PickleOp::kAppend)
          .Stop();
  limits.max_payload_bytes = 2 + 2 * sizeof(NodeExtras);  // the global's and the object's, once each
  CHECK(MustParse(extended, limits).size() == 5);
  limits.max_payload_bytes = 1 + 2 * sizeof(NodeExtras);
  CHECK(ParseError(extended, limits).code() == StatusCode::kResourceExhausted);
}

TEST_CASE("pickle tree: a copied node owns its own extras", "[format]") {
  PickleTree t;
  const NodeId g = t.AddGlobal("collections", "OrderedDict");
  const NodeId od = t.AddReduce(g, t.AddTuple({}));
  t.mutable_node(od).mutable_extras().dict_items = {t.AddStr("k"), t.AddInt(1)};
  t.AddFloat(0.5);
  PickleTree copy = t;
  copy.mutable_node(od).mutable_extras().dict_items.push_back(copy.AddStr("j"));
  copy.mutable_node(g).mutable_extras().name = "dict";
  CHECK(t.node(od).dict_items().size() == 2);
  CHECK(copy.node(od).dict_items().size() == 3);
  CHECK(t.node(g).global_name() == "OrderedDict");
  CHECK(t.IsGlobal(g, "collections", "OrderedDict"));
  CHECK(copy.node(t.size() - 1).f == 0.5);
  // Nodes without extras report them empty, and stay without.
  CHECK(t.node(t.size() - 1).dict_items().empty());
  CHECK(t.node(t.size() - 1).global_name().empty());
  CHECK(t.node(t.size() - 1).extras == nullptr);
}

TEST_CASE("pickle tree: nodes stay in place as the tree grows, and copies and moves keep every node", "[format]") {
  PickleTree t;
  const NodeId first = t.AddStr("first");
  const Node* first_address = &t.node(first);
  // Past several chunk boundaries (64, 128, 256, ... nodes) and into chunks of thousands.
  constexpr int64_t kCount = 100000;
  const NodeId list = t.AddList();
  for (int64_t i = 0; i < kCount; ++i) t.Append(list, t.AddInt(i));
  CHECK(&t.node(first) == first_address);
  CHECK(t.node(first).text == "first");
  REQUIRE(t.size() == static_cast<size_t>(kCount) + 2);
  auto all_ints_in_order = [&](const PickleTree& tree) {
    const std::vector<NodeId>& items = tree.node(list).items;
    if (items.size() != static_cast<size_t>(kCount)) return false;
    for (int64_t i = 0; i < kCount; ++i) {
      const Node& n = tree.node(items[static_cast<size_t>(i)]);
      if (n.kind != NodeKind::kInt || n.i != i) return false;
    }
    return true;
  };
  CHECK(all_ints_in_order(t));
  t.set_root(list);

  PickleTree copy = t;
  CHECK(copy.size() == t.size());
  CHECK(copy.root() == list);
  CHECK(all_ints_in_order(copy));
  CHECK(&copy.node(first) != first_address);

  PickleTree moved = std::move(copy);
  CHECK(moved.size() == t.size());
  CHECK(all_ints_in_order(moved));
  CHECK(copy.size() == 0);  // NOLINT(bugprone-use-after-move): a moved-from tree is empty and usable
  CHECK(copy.root() == kNoNode);
  CHECK(copy.node(copy.AddNone()).kind == NodeKind::kNone);

  PickleTree assigned;
  assigned.AddBool(true);
  assigned = t;
  CHECK(all_ints_in_order(assigned));
  assigned = std::move(moved);
  CHECK(all_ints_in_order(assigned));
  CHECK(moved.size() == 0);  // NOLINT(bugprone-use-after-move)
}

}  // namespace
}  // namespace reshard::format
