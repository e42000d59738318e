#include "reshard/format/tree_json.h"

#include <catch2/catch.hpp>
#include <cmath>
#include <string>
#include <vector>

namespace reshard::format {
namespace {

TEST_CASE("BigIntToDecimal handles both signs and widths", "[format]") {
  CHECK(BigIntToDecimal(std::string("\x00", 1)) == "0");
  CHECK(BigIntToDecimal("\xff") == "-1");
  // 2**64 = 00..00 01 00 (9 bytes little-endian)
  CHECK(BigIntToDecimal(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9)) == "18446744073709551616");
  // -2**64 - 1 in two's complement: ff..ff fe ff
  CHECK(BigIntToDecimal(std::string("\xff\xff\xff\xff\xff\xff\xff\xff\xfe\xff", 10)) == "-18446744073709551617");
}

TEST_CASE("TreeToJson encodes every node kind in the documented tags", "[format]") {
  PickleTree t;
  const NodeId od = t.AddReduce(t.AddGlobal("collections", "OrderedDict"), t.AddTuple({}));
  t.mutable_node(od).mutable_extras().dict_items = {t.AddStr("k"), t.AddInt(1)};
  t.mutable_node(od).state = t.AddDict({{t.AddStr("_metadata"), t.AddNone()}});
  const NodeId root = t.AddList({t.AddNone(), t.AddBool(true), t.AddInt(-3), t.AddFloat(NAN),
                                 t.AddFloat(0.5), t.AddStr("s"), t.AddBytes("\x01\xab"),
                                 t.AddTuple({t.AddInt(1)}), t.AddSet({t.AddInt(2)}), od,
                                 t.AddLong(std::string("\x00\x00\x00\x00\x00\x00\x00\x00\x01", 9))});
  auto json = TreeToJson(t, root);
  REQUIRE(json.ok());
  CHECK(json->dump() ==
        R"([null,true,-3,{"float":"nan"},{"float":0.5},"s",{"bytes":"01ab"},{"tuple":[1]},{"set":[2]},)"
        R"({"reduce":[{"global":["collections","OrderedDict"]},{"tuple":[]}],"dictitems":[["k",1]],)"
        R"("state":{"dict":[["_metadata",null]]}},{"int":"18446744073709551616"}])");
}

TEST_CASE("TreeToJson bounds depth, expansion and cycles", "[format]") {
  SECTION("depth") {
    PickleTree t;
    NodeId cur = t.AddNone();
    for (int k = 0; k < 100; ++k) cur = t.AddList({cur});
    auto json = TreeToJson(t, cur, TreeJsonLimits{50, 1u << 20});
    REQUIRE_FALSE(json.ok());
    CHECK(json.status().code() == StatusCode::kResourceExhausted);
  }
  SECTION("exponential expansion of a shared DAG") {
    PickleTree t;
    NodeId cur = t.AddInt(0);
    for (int k = 0; k < 40; ++k) cur = t.AddTuple({cur, cur});
    auto json = TreeToJson(t, cur, TreeJsonLimits{512, 100000});
    REQUIRE_FALSE(json.ok());
    CHECK(json.status().code() == StatusCode::kResourceExhausted);
  }
  SECTION("one shared bytes object printed at every reference") {
    PickleTree t;
    const NodeId blob = t.AddBytes(std::string(64 << 10, 'x'));  // 128 KiB of hex each time
    const NodeId list = t.AddList(std::vector<NodeId>(100, blob));
    CHECK(TreeToJson(t, list, TreeJsonLimits{512, 1u << 20, 16u << 20}).ok());
    auto json = TreeToJson(t, list, TreeJsonLimits{512, 1u << 20, 8u << 20});
    REQUIRE_FALSE(json.ok());
    CHECK(json.status().code() == StatusCode::kResourceExhausted);
    CHECK(json.status().message() ==
          "more than 8388608 bytes to print (shared values are printed at each reference)");
  }
  SECTION("one shared long int, converted to decimal once; a longer one printed as hex") {
    PickleTree t;
    const NodeId big = t.AddLong(std::string(kMaxDecimalBytes, '\x7f'));
    const NodeId list = t.AddList(std::vector<NodeId>(20000, big));
    auto json = TreeToJson(t, list);  // one conversion, not 20000 quadratic ones
    REQUIRE(json.ok());
    CHECK((*json)[19999]["int"] == BigIntToDecimal(std::string(kMaxDecimalBytes, '\x7f')));
    const NodeId longer = t.AddLong(std::string(kMaxDecimalBytes + 1, '\x01'));
    auto hex = TreeToJson(t, longer);
    REQUIRE(hex.ok());
    std::string want = R"({"int_bytes":")";
    for (size_t k = 0; k <= kMaxDecimalBytes; ++k) want += "01";
    CHECK(hex->dump() == want + R"("})");
  }
  SECTION("cycle") {
    PickleTree t;
    const NodeId list = t.AddList();
    t.Append(list, list);
    auto json = TreeToJson(t, list);
    REQUIRE_FALSE(json.ok());
    CHECK(json.status().code() == StatusCode::kUnsupported);
  }
}

}  // namespace
}  // namespace reshard::format
