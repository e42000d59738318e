// ParseUniversalCheckpointInfo and the SubparamShape parsers on trees built here: every key,
// the refusals, and the type checks (real files are covered by universal_checkpoint_test.cc).
#include "reshard/ucp/checkpoint_info.h"

#include <catch2/catch.hpp>

namespace reshard::ucp {
namespace {

using format::NodeId;
using format::PickleTree;

NodeId Strs(PickleTree& t, std::vector<std::string> v) {
  std::vector<NodeId> items;
  for (auto& s : v) items.push_back(t.AddStr(s));
  return t.AddList(items);
}

NodeId Ints(PickleTree& t, std::vector<int64_t> v, bool tuple = false) {
  std::vector<NodeId> items;
  for (int64_t i : v) items.push_back(t.AddInt(i));
  return tuple ? t.AddTuple(items) : t.AddList(items);
}

NodeId Dict(PickleTree& t, std::vector<std::pair<std::string, NodeId>> entries) {
  std::vector<std::pair<NodeId, NodeId>> items;
  for (auto& [k, v] : entries) items.emplace_back(t.AddStr(k), v);
  return t.AddDict(items);
}

// {'patterns': [p], 'shape': [(q, k, v), 64], 'partition_dim': 0}, as AutoTP publishes it.
NodeId QkvFields(PickleTree& t, const std::string& pattern) {
  const NodeId shape = t.AddList({Ints(t, {64, 16, 16}, /*tuple=*/true), t.AddInt(64)});
  return Dict(t, {{"patterns", Strs(t, {pattern})}, {"shape", shape}, {"partition_dim", t.AddInt(0)}});
}

TEST_CASE("A complete universal_checkpoint_info parses key by key", "[ucp]") {
  PickleTree t;
  const NodeId widths = t.AddList({Ints(t, {32, 32}), Ints(t, {8, 8}), Ints(t, {8, 8})});
  const NodeId info = Dict(t, {{"universal_checkpoint_version", t.AddFloat(0.4)},
                               {"original_vocab_size", t.AddInt(50257)},
                               {"padded_vocab_size", t.AddInt(50304)},
                               {"vocabulary_parameter_patterns", Strs(t, {"^embed\\.weight$"})},
                               {"pipeline_replicated_parameter_patterns", Strs(t, {"tied"})},
                               {"tp_replicated_parameter_patterns", Strs(t, {"norm", "bias"})},
                               {"parameter_to_average_patterns", Strs(t, {})},
                               {"parameter_with_row_parallelism_patterns", Strs(t, {"o_proj"})},
                               {"parameter_with_2_sub_params_cat_dim_0", Strs(t, {"h_to_4h"})},
                               {"parameter_with_sub_params", t.AddList({QkvFields(t, "^qkv$")})},
                               {"sub_param_shard_widths", Dict(t, {{"^qkv$", widths}})},
                               {"autotp_unsupported_parameter_patterns", t.AddDict()},
                               {"expert_parameter_patterns", Strs(t, {"\\.experts\\.w[123]$"})},
                               {"ds_autoep_layers", t.AddList()},
                               {"sub_params_shape", t.AddNone()}});
  auto parsed = ParseUniversalCheckpointInfo(t, info);
  REQUIRE(parsed.ok());
  const UniversalCheckpointInfo& i = *parsed;
  CHECK(i.present);
  CHECK(i.node == info);
  CHECK(i.version == 0.4);
  CHECK(i.effective_version() == 0.4);
  CHECK(i.original_vocab_size == 50257);
  CHECK(i.padded_vocab_size == 50304);
  CHECK(i.vocabulary_parameter_patterns == std::vector<std::string>{"^embed\\.weight$"});
  CHECK(i.tp_replicated_parameter_patterns == std::vector<std::string>{"norm", "bias"});
  CHECK(i.parameter_to_average_patterns.empty());
  CHECK(i.parameter_with_row_parallelism_patterns == std::vector<std::string>{"o_proj"});
  CHECK(i.parameter_with_2_sub_params_cat_dim_0 == std::vector<std::string>{"h_to_4h"});
  REQUIRE(i.parameter_with_sub_params.size() == 1);
  const SubparamShape& qkv = i.parameter_with_sub_params[0];
  CHECK(qkv.patterns == std::vector<std::string>{"^qkv$"});
  CHECK(qkv.partition_dim == 0);
  REQUIRE(qkv.shape.size() == 2);
  CHECK(qkv.shape[0].sub_sizes == std::vector<int64_t>{64, 16, 16});
  CHECK(qkv.shape[1].size == 64);
  CHECK(i.sub_param_shard_widths.at("^qkv$") == std::vector<std::vector<int64_t>>{{32, 32}, {8, 8}, {8, 8}});
  CHECK(i.expert_parameter_patterns.size() == 1);
  CHECK(i.autoep_layers != format::kNoNode);
}

TEST_CASE("Absent info, None info, and an integer version", "[ucp]") {
  PickleTree t;
  auto absent = ParseUniversalCheckpointInfo(t, format::kNoNode);
  REQUIRE(absent.ok());
  CHECK_FALSE(absent->present);
  CHECK(absent->effective_version() == 0.0);
  auto none = ParseUniversalCheckpointInfo(t, t.AddNone());
  REQUIRE(none.ok());
  CHECK_FALSE(none->present);
  auto no_version = ParseUniversalCheckpointInfo(t, t.AddDict());
  REQUIRE(no_version.ok());
  CHECK(no_version->present);
  CHECK_FALSE(no_version->version);
  auto int_version = ParseUniversalCheckpointInfo(t, Dict(t, {{"universal_checkpoint_version", t.AddInt(0)}}));
  REQUIRE(int_version.ok());
  CHECK(int_version->version == 0.0);
}

TEST_CASE("Refusals of universal_checkpoint_info", "[ucp]") {
  PickleTree t;
  auto code_and_message = [&](NodeId info) {
    auto r = ParseUniversalCheckpointInfo(t, info);
    REQUIRE_FALSE(r.ok());
    return std::make_pair(r.status().code(), r.status().message());
  };
  // The version is checked before the keys: a newer checkpoint is refused for its version.
  auto [code, message] =
      code_and_message(Dict(t, {{"affine_map", t.AddDict()}, {"universal_checkpoint_version", t.AddFloat(0.5)}}));
  CHECK(code == StatusCode::kUnsupported);
  CHECK(message == "unsupported universal checkpoint version 0.5 (reshardfs supports up to 0.4)");
  CHECK(code_and_message(Dict(t, {{"universal_checkpoint_version", t.AddInt(1)}})).second ==
        "unsupported universal checkpoint version 1 (reshardfs supports up to 0.4)");
  CHECK(code_and_message(Dict(t, {{"affine_map", t.AddDict()}})).first == StatusCode::kUnsupported);
  CHECK(code_and_message(Dict(t, {{"new_thing", t.AddInt(1)}})).second ==
        "unknown key 'new_thing' in universal_checkpoint_info");
  const NodeId unsupported = Dict(t, {{"^a$", t.AddStr("codegen fused qkv")}, {"^b$", t.AddStr("yuan")}});
  CHECK(code_and_message(Dict(t, {{"autotp_unsupported_parameter_patterns", unsupported}})).second ==
        "'autotp_unsupported_parameter_patterns' lists AutoTP layouts that cannot be converted (DeepSpeed refuses "
        "them too): ^a$: codegen fused qkv; ^b$: yuan");

  // Wrong types are corrupt, and say what they got.
  CHECK(code_and_message(Dict(t, {{"universal_checkpoint_version", t.AddStr("0.4")}})).second ==
        "'universal_checkpoint_version' must be a finite number, got str '0.4'");
  CHECK(code_and_message(Dict(t, {{"original_vocab_size", t.AddInt(-1)}})).first == StatusCode::kCorrupt);
  CHECK(code_and_message(Dict(t, {{"tp_replicated_parameter_patterns", Ints(t, {1})}})).second ==
        "'tp_replicated_parameter_patterns' must be a list of str, got list of 1");
  CHECK(code_and_message(Dict(t, {{"sub_param_shard_widths", Dict(t, {{"p", Ints(t, {1, 2})}})}})).first ==
        StatusCode::kCorrupt);
  CHECK(code_and_message(t.AddList()).second == "universal_checkpoint_info must be a dict, got list of 0");
}

// affine_map {'version': 1, 'params': {'^w$': map}} where `map` is a [8, 3] tensor held by 2 ranks, each
// holding `blocks` blocks of rows: rank r's j-th block is rows [starts[r][j], + width) (dest in order).
NodeId AffineInfo(PickleTree& t, const std::vector<std::vector<int64_t>>& starts, int64_t width) {
  std::vector<std::pair<NodeId, NodeId>> ranks;
  for (size_t r = 0; r < starts.size(); ++r) {
    std::vector<NodeId> pieces;
    for (size_t j = 0; j < starts[r].size(); ++j) {
      const auto dest_row = static_cast<int64_t>(j) * width;
      pieces.push_back(Dict(t, {{"shape", Ints(t, {width, 3})},
                                {"source", t.AddTuple({t.AddInt(starts[r][j] * 3), Ints(t, {3, 1}, true)})},
                                {"dest", t.AddTuple({t.AddInt(dest_row * 3), Ints(t, {3, 1}, true)})},
                                {"locations", Ints(t, {static_cast<int64_t>(r)})}}));
    }
    const auto rows = static_cast<int64_t>(starts[r].size()) * width;
    ranks.emplace_back(t.AddInt(static_cast<int64_t>(r)),
                       Dict(t, {{"shard_shape", Ints(t, {rows, 3})}, {"pieces", t.AddList(pieces)}}));
  }
  const NodeId map = Dict(t, {{"logical_shape", Ints(t, {8, 3})}, {"ranks", t.AddDict(ranks)}});
  const NodeId params = Dict(t, {{"^w$", map}});
  return Dict(t, {{"affine_map", Dict(t, {{"version", t.AddInt(1)}, {"params", params}})}});
}

TEST_CASE("affine_map: plain splits and fused sub-parameter blocks", "[ucp]") {
  PickleTree t;
  auto plain = ParseUniversalCheckpointInfo(t, AffineInfo(t, {{0}, {4}}, 4));
  REQUIRE(plain.ok());
  REQUIRE(plain->affine_splits.size() == 1);
  CHECK(plain->affine_splits[0].partition_dim == 0);
  CHECK(plain->affine_splits[0].sub_param_sizes.empty());
  // [gate; up], 4 rows each: rank 0 holds rows 0-1 and 4-5, rank 1 rows 2-3 and 6-7.
  auto fused = ParseUniversalCheckpointInfo(t, AffineInfo(t, {{0, 4}, {2, 6}}, 2));
  REQUIRE(fused.ok());
  CHECK(fused->affine_splits[0].partition_dim == 0);
  CHECK(fused->affine_splits[0].sub_param_sizes == std::vector<int64_t>{4, 4});
  // Each rank's block of each sub-parameter: what the native reader joins the slices by.
  CHECK(fused->affine_splits[0].sub_param_rank_widths == std::vector<std::vector<int64_t>>{{2, 2}, {2, 2}});
  CHECK(plain->affine_splits[0].sub_param_rank_widths.empty());
  // Blocks that do not tile the dim rank after rank, sub-parameter after sub-parameter, are refused.
  for (const auto& starts : std::vector<std::vector<std::vector<int64_t>>>{{{0, 4}, {6, 2}}, {{0, 2}, {4, 6}},
                                                                           {{0, 4}, {2}}}) {
    auto r = ParseUniversalCheckpointInfo(t, AffineInfo(t, starts, 2));
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnsupported);
    CHECK_THAT(r.status().message(), Catch::Contains("affine_map['^w$'] is not a split of one dim into blocks"));
  }
  // A block past the end of the tensor, and a negative extent.
  auto outside = ParseUniversalCheckpointInfo(t, AffineInfo(t, {{0, 4}, {2, 7}}, 2));
  REQUIRE_FALSE(outside.ok());
  CHECK_THAT(outside.status().message(), Catch::Contains("a piece outside the tensor"));
  auto negative = ParseUniversalCheckpointInfo(t, AffineInfo(t, {{0}, {4}}, -4));
  REQUIRE_FALSE(negative.ok());
  CHECK(negative.status().code() == StatusCode::kCorrupt);
}

TEST_CASE("SubparamShape fields and object", "[ucp]") {
  PickleTree t;
  // The legacy normalised form: a tuple shape with an int at partition_dim elsewhere.
  const NodeId tuple_shape = t.AddTuple({Ints(t, {4, 4, 4}, true), t.AddInt(-1)});
  const NodeId fields =
      Dict(t, {{"patterns", Strs(t, {"qkv"})}, {"shape", tuple_shape}, {"partition_dim", t.AddInt(0)}});
  const NodeId obj =
      t.AddNewObj(t.AddGlobal("deepspeed.checkpoint.universal_checkpoint", "SubparamShape"), t.AddTuple({}));
  t.mutable_node(obj).state = fields;
  auto parsed = ParseSubparamShapeObject(t, obj);
  REQUIRE(parsed.ok());
  CHECK(parsed->shape_is_tuple);
  CHECK(parsed->shape[1].size == -1);
  CHECK(*parsed == *ParseSubparamShapeFields(t, fields));

  auto fails = [&](NodeId id) { return ParseSubparamShapeFields(t, id).status(); };
  const NodeId list_sizes = t.AddList({Ints(t, {4, 4}), t.AddInt(8)});  // a list, not a tuple
  CHECK(fails(Dict(t, {{"patterns", Strs(t, {})}, {"shape", list_sizes}, {"partition_dim", t.AddInt(0)}})).code() ==
        StatusCode::kCorrupt);
  CHECK(
      fails(Dict(t, {{"patterns", Strs(t, {})}, {"shape", Ints(t, {8})}, {"partition_dim", t.AddInt(1)}})).message() ==
      "SubparamShape partition_dim 1 is outside its 1-dimensional shape");
  CHECK(fails(Dict(t, {{"patterns", Strs(t, {})}, {"shape", Ints(t, {8})}})).code() == StatusCode::kCorrupt);
  CHECK(fails(Dict(t, {{"patterns", Strs(t, {})},
                       {"shape", Ints(t, {8})},
                       {"partition_dim", t.AddInt(0)},
                       {"widths", t.AddNone()}}))
            .code() == StatusCode::kUnsupported);
  const NodeId other = t.AddNewObj(t.AddGlobal("x", "SubparamShape"), t.AddTuple({}));
  CHECK(ParseSubparamShapeObject(t, other).status().code() == StatusCode::kCorrupt);
}

TEST_CASE("FormatVersion prints the shortest round-trip decimal", "[ucp]") {
  CHECK(FormatVersion(0.4) == "0.4");
  CHECK(FormatVersion(0.5) == "0.5");
  CHECK(FormatVersion(1.0) == "1");
  CHECK(FormatVersion(0.45) == "0.45");
  CHECK(FormatVersion(0.1 + 0.2) == "0.30000000000000004");
}

}  // namespace
}  // namespace reshard::ucp
