// ucp::UniversalCheckpoint against real universal checkpoints made by DeepSpeed 0.19.8:
// examples/tiny/universal (ZeRO-1, TP=1, DP=2), tests/fixtures/tiny_zero3/universal (ZeRO-3,
// bare tensors), and overlays of the tiny one from tests/fixtures/ucp_bad and ucp_edge (made by
// tests/fixtures/make_bad_ucp.py) or built here. Expected values were read with torch.load.
#include "reshard/ucp/universal_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "reshard/format/pickle_query.h"
#include "reshard/plan/frozen_params.h"
#include "reshard/plan/optimizer_groups.h"
#include "reshard/plan/target.h"
#include "tests/unit/temp_dir.h"

namespace reshard::ucp {
namespace {

namespace fs = std::filesystem;

// The repository root, from this file's path (tests/unit/ucp/<this file>).
fs::path RepoRoot() { return fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path(); }
fs::path TinyParent() { return RepoRoot() / "examples/tiny/universal"; }
fs::path TinyTag() { return TinyParent() / "global_step3_universal"; }
fs::path Zero3Parent() { return RepoRoot() / "tests/fixtures/tiny_zero3/universal"; }
constexpr const char* kTag = "global_step3_universal";

using reshard::testing::TempDir;

// A copy of the tiny UCP (parent folder with latest_universal) under `tmp`, with the files of
// fixture case `overlay` (relative to tests/fixtures, e.g. "ucp_bad/version_0_5") copied over
// its tag folder. Returns the tag folder.
fs::path CopyTiny(const TempDir& tmp, const std::string& overlay = "") {
  fs::copy(TinyParent(), tmp.path(), fs::copy_options::recursive);
  const fs::path tag = tmp.path() / kTag;
  if (!overlay.empty()) {
    const fs::path src = RepoRoot() / "tests/fixtures" / overlay;
    REQUIRE(fs::is_directory(src));
    fs::copy(src, tag, fs::copy_options::recursive | fs::copy_options::overwrite_existing);
  }
  return tag;
}

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
}

// The float32 at byte `offset` of `path`, as a bit pattern (what a FUSE read would serve).
uint32_t BitsAt(const std::string& path, uint64_t offset) {
  const int fd = ::open(path.c_str(), O_RDONLY);
  REQUIRE(fd >= 0);
  uint32_t bits = 0;
  const ssize_t n = ::pread(fd, &bits, sizeof(bits), static_cast<off_t>(offset));
  ::close(fd);
  REQUIRE(n == static_cast<ssize_t>(sizeof(bits)));
  return bits;
}

// Element k of a float32 state, as bits.
uint32_t ElementBits(const StateTensor& s, uint64_t k) {
  REQUIRE(s.dtype == format::DType::kFloat32);
  REQUIRE(k < s.numel());
  return BitsAt(s.path, s.data_offset + 4 * k);
}

Status OpenStatus(const fs::path& path) {
  auto ucp = UniversalCheckpoint::Open(path.string());
  return ucp.ok() ? Status::Ok() : ucp.status();
}

struct Expected {
  const char* name;
  std::vector<int64_t> shape;
  int32_t group;
};
// Source flat order: param_shapes group 0 (2-D weights), then group 1 (embedding and biases).
const std::vector<Expected> kTinyParams = {
    {"fc1.weight", {32, 32}, 0},   {"fc2.weight", {32, 32}, 0}, {"head.weight", {64, 32}, 0},
    {"embed.weight", {64, 32}, 1}, {"fc1.bias", {32}, 1},       {"fc2.bias", {32}, 1},
    {"head.bias", {64}, 1},
};

uint64_t Numel(const std::vector<int64_t>& shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// Bit patterns torch.load reads (struct.pack('<f', x)); identical in both tiny checkpoints,
// which trained the same model the same way.
void CheckTinyValues(const UniversalCheckpoint& ucp) {
  const ParamEntry* embed = ucp.FindParam("embed.weight");
  const ParamEntry* head = ucp.FindParam("head.weight");
  const ParamEntry* fc1_bias = ucp.FindParam("fc1.bias");
  REQUIRE((embed && head && fc1_bias));
  const StateTensor& fp32 = embed->states.at("fp32");
  CHECK(ElementBits(fp32, 0) == 0xbde4eecc);  // -0.11178359389305115
  CHECK(ElementBits(fp32, 1) == 0xbefe4991);  // -0.49665501713752747
  CHECK(ElementBits(fp32, 2047) == 0xbf397cc5);
  CHECK(ElementBits(embed->states.at("exp_avg"), 0) == 0x37133f6d);  // 8.776650247455109e-06
  CHECK(ElementBits(embed->states.at("exp_avg"), 2047) == 0xb79e5d22);
  CHECK(ElementBits(embed->states.at("exp_avg_sq"), 1) == 0x2c69c561);  // 3.322085878956771e-12
  CHECK(ElementBits(head->states.at("fp32"), 0) == 0x3e343816);
  CHECK(ElementBits(head->states.at("fp32"), 2047) == 0x3e20855a);
  CHECK(ElementBits(fc1_bias->states.at("exp_avg_sq"), 0) == 0x3488a9ab);
  CHECK(ElementBits(fc1_bias->states.at("exp_avg_sq"), 31) == 0x3672fa9b);
  float f;
  const uint32_t bits = ElementBits(fc1_bias->states.at("fp32"), 0);
  std::memcpy(&f, &bits, 4);
  CHECK(f == static_cast<float>(0.08175963908433914));
}

TEST_CASE("Open the tiny ZeRO-1 UCP through latest_universal", "[ucp]") {
  auto opened = UniversalCheckpoint::Open(TinyParent().string());
  REQUIRE(opened.ok());
  const UniversalCheckpoint& ucp = *opened;
  CHECK(ucp.dir() == (TinyParent() / kTag).string());
  CHECK(ucp.tag() == kTag);
  CHECK(ucp.tp_degree() == 1);
  CHECK(ucp.dp_world_size() == 2);
  CHECK(ucp.zero_stage() == 1);
  CHECK(ucp.zero_stage_recorded());
  CHECK_FALSE(ucp.info().present);  // --inject_missing_state injects it in memory only
  CHECK(ucp.num_source_groups() == 2);

  REQUIRE(ucp.params().size() == kTinyParams.size());
  for (size_t k = 0; k < kTinyParams.size(); ++k) {
    const ParamEntry& p = ucp.params()[k];
    const Expected& e = kTinyParams[k];
    INFO(e.name);
    CHECK(p.name == e.name);
    CHECK(p.full_shape == e.shape);
    CHECK_FALSE(p.bare_tensor);
    CHECK(p.listed);
    CHECK(p.source_group == e.group);
    CHECK(p.tp_shapes == std::vector<std::vector<int64_t>>{e.shape});
    CHECK(p.categories.cat_dim == 0);
    CHECK_FALSE(p.categories.param_n_sub_params);
    CHECK_FALSE(p.categories.sub_param_shape);
    CHECK_FALSE(p.categories.vocab_tensor);
    CHECK_FALSE(p.categories.is_expert_param);
    CHECK_FALSE(p.categories.ep_num_experts);
    REQUIRE(p.states.size() == 3);
    for (const char* key : {"fp32", "exp_avg", "exp_avg_sq"}) {
      const StateTensor& s = p.states.at(key);
      CHECK(s.path == ucp.dir() + "/zero/" + e.name + "/" + key + ".pt");
      CHECK(s.dtype == format::DType::kFloat32);
      CHECK(s.shape == e.shape);
      CHECK(s.nbytes == 4 * Numel(e.shape));
      CHECK(s.data_offset % 64 == 0);  // torch 2.9 aligns every storage record to 64 bytes
      CHECK(s.data_offset + s.nbytes <= fs::file_size(s.path));
    }
    REQUIRE(p.step);  // torch AdamW: a 0-d float32 tensor with its own storage record
    CHECK(p.step->is_tensor);
    CHECK(p.step->value == 3.0);
    CHECK(p.step->tensor.dtype == format::DType::kFloat32);
    CHECK(p.step->tensor.shape.empty());
    CHECK(p.step->tensor.nbytes == 4);
    CHECK(BitsAt(p.step->tensor.path, p.step->tensor.data_offset) == 0x40400000);  // 3.0f
  }
  CheckTinyValues(ucp);

  REQUIRE(ucp.param_groups().size() == 2);
  CHECK(ucp.param_groups()[0].params == std::vector<int64_t>{0});
  CHECK(ucp.param_groups()[1].params == std::vector<int64_t>{1});
  const format::PickleTree& tree = ucp.optimizer_state().tree();
  CHECK(format::AsFloat(tree, format::DictLookup(tree, ucp.param_groups()[1].node, "lr")) == 0.000108);
  CHECK(format::IsObjectOf(tree, format::DictLookup(tree, tree.root(), "loss_scaler"),
                           "deepspeed.runtime.fp16.loss_scaler", "LossScaler"));

  REQUIRE(ucp.model_states().size() == 1);
  const ModelStatesFile& m = ucp.model_states()[0];
  CHECK(m.name == "mp_rank_00_model_states.pt");
  CHECK(m.tp_rank == 0);
  CHECK(m.dp_rank == -1);
  CHECK(ucp.ModelStatesForTp(0) == &m);
  CHECK(ucp.ModelStatesForTp(1) == nullptr);
  const format::PickleTree& mt = m.archive.tree();
  CHECK(format::AsInt(mt, format::DictLookup(mt, mt.root(), "global_steps")) == 3);
  CHECK(ucp.FindParam("nope") == nullptr);
}

TEST_CASE("Open the tag folder directly, with or without a trailing slash", "[ucp]") {
  for (const std::string& path : {TinyTag().string(), TinyTag().string() + "/"}) {
    auto ucp = UniversalCheckpoint::Open(path);
    REQUIRE(ucp.ok());
    CHECK(ucp->dir() == TinyTag().string());
    CHECK(ucp->params().size() == 7);
    CHECK(ucp->params()[3].name == "embed.weight");
    CheckTinyValues(*ucp);
  }
}

TEST_CASE("Open the tiny ZeRO-3 UCP: bare tensors, no step, per-rank model states", "[ucp]") {
  auto opened = UniversalCheckpoint::Open(Zero3Parent().string());
  REQUIRE(opened.ok());
  const UniversalCheckpoint& ucp = *opened;
  CHECK(ucp.zero_stage() == 3);  // ZeroStageEnum.weights, pickled by value
  CHECK(ucp.tp_degree() == 1);
  CHECK(ucp.dp_world_size() == 2);
  CHECK(ucp.num_source_groups() == 2);  // ZeRO-3 sub-groups
  REQUIRE(ucp.params().size() == kTinyParams.size());
  for (size_t k = 0; k < kTinyParams.size(); ++k) {
    const ParamEntry& p = ucp.params()[k];
    const Expected& e = kTinyParams[k];
    INFO(e.name);
    CHECK(p.name == e.name);
    CHECK(p.bare_tensor);
    CHECK(p.full_shape == std::vector<int64_t>{static_cast<int64_t>(Numel(e.shape))});
    CHECK(p.tp_shapes == std::vector<std::vector<int64_t>>{e.shape});
    CHECK(p.source_group == e.group);
    CHECK(p.categories == ParamCategories{});
    CHECK_FALSE(p.step);
    CHECK(p.states.size() == 3);
    CHECK(p.states.at("exp_avg").nbytes == 4 * Numel(e.shape));
  }
  CheckTinyValues(ucp);
  REQUIRE(ucp.model_states().size() == 2);
  CHECK(ucp.model_states()[0].name == "zero_pp_rank_0_mp_rank_00_model_states.pt");
  CHECK(ucp.model_states()[1].dp_rank == 1);
  CHECK(ucp.ModelStatesForTp(0) == &ucp.model_states()[0]);
  REQUIRE(ucp.param_groups().size() == 2);
  CHECK(ucp.param_groups()[1].params == std::vector<int64_t>{1});  // sub-group ids
  const format::PickleTree& tree = ucp.optimizer_state().tree();
  CHECK(format::DictLookup(tree, tree.root(), "fp32_flat_groups") != format::kNoNode);
}

// ---- refusals from fixtures ----

TEST_CASE("Refuse universal_checkpoint_version 0.5", "[ucp]") {
  TempDir tmp;
  const Status s = OpenStatus(CopyTiny(tmp, "ucp_bad/version_0_5"));
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK_THAT(s.message(), Catch::EndsWith("mp_rank_00_model_states.pt: unsupported universal checkpoint version 0.5 "
                                          "(reshardfs supports up to 0.4)"));
}

TEST_CASE("Refuse unknown universal_checkpoint_info keys; an empty affine_map is read", "[ucp]") {
  TempDir tmp1, tmp2;
  auto affine = UniversalCheckpoint::Open(CopyTiny(tmp1, "ucp_bad/affine_map").string());
  REQUIRE(affine.ok());
  CHECK(affine->info().affine_splits.empty());
  CHECK(affine->FindAffineSplit("fc1.weight") == nullptr);
  const Status unknown = OpenStatus(CopyTiny(tmp2, "ucp_bad/unknown_info_key"));
  CHECK(unknown.code() == StatusCode::kUnsupported);
  CHECK_THAT(unknown.message(), Catch::Contains("unknown key 'shard_geometry' in universal_checkpoint_info"));
}

TEST_CASE("A real AutoTP checkpoint's affine_map gives each parameter its split dim", "[ucp]") {
  // examples/tiny_llama_tp2: DeepSpeed 0.19.8 AutoTP at TP 2 (q/k/v/gate/up/lm_head column, o/down
  // row, embed and norms untouched), converted by its ds_to_universal.
  auto ucp = UniversalCheckpoint::Open((RepoRoot() / "examples/tiny_llama_tp2/universal").string());
  REQUIRE(ucp.ok());
  CHECK(ucp->info().affine_splits.size() == 21);
  const auto dim = [&](const std::string& name) -> std::optional<int> {
    const AffineSplit* split = ucp->FindAffineSplit(name);
    REQUIRE(split != nullptr);
    return split->partition_dim;
  };
  CHECK(dim("model.layers.0.self_attn.q_proj.weight") == 0);
  CHECK(dim("model.layers.1.self_attn.k_proj.weight") == 0);
  CHECK(dim("model.layers.0.mlp.up_proj.weight") == 0);
  CHECK(dim("lm_head.weight") == 0);
  CHECK(dim("model.layers.0.self_attn.o_proj.weight") == 1);
  CHECK(dim("model.layers.1.mlp.down_proj.weight") == 1);
  CHECK_FALSE(dim("model.embed_tokens.weight").has_value());
  CHECK_FALSE(dim("model.norm.weight").has_value());
  const AffineSplit* k = ucp->FindAffineSplit("model.layers.1.self_attn.k_proj.weight");
  CHECK(k->logical_shape == std::vector<int64_t>{32, 64});
  CHECK(ucp->FindAffineSplit("model.layers.1.self_attn.k_proj") == nullptr);  // patterns are anchored
}

TEST_CASE("Refuse non-empty autotp_unsupported_parameter_patterns", "[ucp]") {
  TempDir tmp;
  const Status s = OpenStatus(CopyTiny(tmp, "ucp_bad/autotp_unsupported"));
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK_THAT(s.message(), Catch::Contains("^fc1\\.weight$: fused QKV with shared QK"));
}

TEST_CASE("Refuse an unknown key in a state dict", "[ucp]") {
  TempDir tmp;
  const Status s = OpenStatus(CopyTiny(tmp, "ucp_bad/unknown_state_key"));
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK_THAT(s.message(), Catch::Contains("zero/fc1.bias/exp_avg.pt: unknown key 'foo' in the state dict"));
}

TEST_CASE("Refuse state files of one parameter with different shapes", "[ucp]") {
  TempDir tmp;
  const Status s = OpenStatus(CopyTiny(tmp, "ucp_bad/shape_mismatch"));
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK_THAT(s.message(), Catch::EndsWith("zero/fc1.bias/exp_avg_sq.pt: shape [16] differs from fp32.pt's [32]"));
}

TEST_CASE("Refuse a non-contiguous tensor", "[ucp]") {
  TempDir tmp;
  const Status s = OpenStatus(CopyTiny(tmp, "ucp_bad/non_contiguous"));
  CHECK(s.code() == StatusCode::kUnsupported);
  CHECK_THAT(s.message(), Catch::Contains("zero/fc1.weight/fp32.pt: tensor of shape [32, 32] has strides [1, 32], "
                                          "not contiguous"));
}

TEST_CASE("Refuse state files whose category keys disagree", "[ucp]") {
  TempDir tmp;
  const fs::path tag = CopyTiny(tmp, "ucp_edge/categories");
  fs::copy_file(TinyTag() / "zero/fc2.weight/exp_avg.pt", tag / "zero/fc2.weight/exp_avg.pt",
                fs::copy_options::overwrite_existing);
  const Status s = OpenStatus(tag);
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK_THAT(s.message(), Catch::EndsWith("zero/fc2.weight/exp_avg.pt: category keys {cat_dim=0} differ from "
                                          "fp32.pt's {cat_dim=0, param_n_sub_params=2}"));
}

// ---- refusals built here ----

TEST_CASE("Refuse a folder that is not a universal checkpoint", "[ucp]") {
  TempDir tmp;
  const Status empty = OpenStatus(tmp.path());
  CHECK(empty.code() == StatusCode::kInvalidArgument);
  CHECK(empty.message() ==
        tmp.path().string() + ": not a universal checkpoint (no zero/ folder and no latest_universal file)");
  CHECK(OpenStatus(tmp.path() / "absent").code() == StatusCode::kNotFound);
  CHECK(OpenStatus(RepoRoot() / "examples/tiny/native").code() == StatusCode::kInvalidArgument);

  const fs::path tag = CopyTiny(tmp);
  fs::remove(tag / "mp_rank_00_model_states.pt");
  const Status no_model = OpenStatus(tag);
  CHECK(no_model.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(no_model.message(), Catch::StartsWith(tag.string() + ": not a universal checkpoint (no mp_rank_"));
}

TEST_CASE("Refuse a latest_universal that names a missing or no folder", "[ucp]") {
  TempDir tmp;
  fs::create_directories(tmp.path() / "zero_is_not_here");
  WriteText(tmp.path() / "latest_universal", "global_step9_universal\n");
  const Status missing = OpenStatus(tmp.path());
  CHECK(missing.code() == StatusCode::kNotFound);
  CHECK(missing.message() == (tmp.path() / "latest_universal").string() + ": names 'global_step9_universal', but " +
                                 (tmp.path() / "global_step9_universal").string() + " is not a folder");
  WriteText(tmp.path() / "latest_universal", " \n");
  CHECK(OpenStatus(tmp.path()).code() == StatusCode::kNotFound);
  // A named folder that exists but is no UCP is refused for what it lacks.
  WriteText(tmp.path() / "latest_universal", "zero_is_not_here");
  const Status not_ucp = OpenStatus(tmp.path());
  CHECK(not_ucp.code() == StatusCode::kInvalidArgument);
  CHECK_THAT(not_ucp.message(), Catch::EndsWith("zero_is_not_here: not a universal checkpoint (no zero/ folder)"));
}

TEST_CASE("Refuse a parameter folder without fp32.pt", "[ucp]") {
  TempDir tmp;
  const fs::path tag = CopyTiny(tmp);
  fs::remove(tag / "zero/head.bias/fp32.pt");
  const Status s = OpenStatus(tmp.path());
  CHECK(s.code() == StatusCode::kNotFound);
  CHECK(s.message() ==
        (tag / "zero/head.bias").string() + ": no fp32.pt (every parameter folder needs its fp32 master weight)");
}

TEST_CASE("Refuse a listed parameter without a folder, and a missing optimizer_state.pt", "[ucp]") {
  TempDir tmp1, tmp2;
  const fs::path tag1 = CopyTiny(tmp1);
  fs::remove_all(tag1 / "zero/fc2.bias");
  const Status no_folder = OpenStatus(tag1);
  CHECK(no_folder.code() == StatusCode::kNotFound);
  CHECK_THAT(no_folder.message(), Catch::Contains("param_shapes of mp_rank_00_model_states.pt lists 'fc2.bias'"));
  const fs::path tag2 = CopyTiny(tmp2);
  fs::remove(tag2 / "zero/optimizer_state.pt");
  CHECK(OpenStatus(tag2).code() == StatusCode::kNotFound);
}

TEST_CASE("Refuse layout metadata that disagrees with the files", "[ucp]") {
  TempDir tmp1, tmp2, tmp3;
  // A parameter folder holding another parameter's tensors: consistent in itself, but not the
  // 32 elements param_shapes records for fc1.bias.
  const fs::path tag1 = CopyTiny(tmp1);
  fs::remove_all(tag1 / "zero/fc1.bias");
  fs::copy(tag1 / "zero/head.bias", tag1 / "zero/fc1.bias");
  const Status numel = OpenStatus(tag1);
  CHECK(numel.code() == StatusCode::kCorrupt);
  CHECK(numel.message() ==
        (tag1 / "zero/fc1.bias").string() + "/fp32.pt: holds 64 elements but param_shapes records 32 for 'fc1.bias'");
  // A ZeRO-3 optimizer_state.pt next to a ZeRO-1 model-states file.
  const fs::path tag2 = CopyTiny(tmp2);
  fs::copy_file(Zero3Parent() / kTag / "zero/optimizer_state.pt", tag2 / "zero/optimizer_state.pt",
                fs::copy_options::overwrite_existing);
  const Status stage = OpenStatus(tag2);
  CHECK(stage.code() == StatusCode::kCorrupt);
  CHECK_THAT(stage.message(), Catch::EndsWith("says zero_stage 3 but the model-states files are mp_rank files "
                                              "(mp_rank_00_model_states.pt)"));
  // A ZeRO-3 UCP missing the DP rank 1 model-states file.
  fs::copy(Zero3Parent(), tmp3.path(), fs::copy_options::recursive);
  fs::remove(tmp3.path() / kTag / "zero_pp_rank_1_mp_rank_00_model_states.pt");
  const Status grid = OpenStatus(tmp3.path());
  CHECK(grid.code() == StatusCode::kCorrupt);
  CHECK_THAT(grid.message(), Catch::EndsWith("dp_world_size 2 but the folder holds 1 DP ranks of ZeRO-3 "
                                             "model-states files"));
}

TEST_CASE("Parameter folder entries: DeepSpeed's state-file rule", "[ucp]") {
  TempDir tmp;
  const fs::path tag = CopyTiny(tmp);
  // Ignored by DeepSpeed's loader, and here: no "pt" after the first character, or a
  // duplicate name for an existing state.
  WriteText(tag / "zero/fc1.bias/README", "notes");
  fs::copy_file(tag / "zero/fc1.bias/fp32.pt", tag / "zero/fc1.bias/fp32.pt.bak");
  auto ok = UniversalCheckpoint::Open(tag.string());
  REQUIRE(ok.ok());
  CHECK(ok->FindParam("fc1.bias")->states.size() == 3);
  // Taken by DeepSpeed for the state 'rece', whose file does not exist.
  WriteText(tag / "zero/fc1.bias/receipt", "x");
  const Status s = OpenStatus(tag);
  CHECK(s.code() == StatusCode::kCorrupt);
  CHECK_THAT(s.message(), Catch::Contains("zero/fc1.bias/receipt: DeepSpeed's universal loader takes this entry for "
                                          "the state 'rece'"));
  // Another `<key>.pt` is another optimizer state.
  fs::remove(tag / "zero/fc1.bias/receipt");
  fs::copy_file(tag / "zero/fc1.bias/exp_avg.pt", tag / "zero/fc1.bias/momentum_buffer.pt");
  auto extra = UniversalCheckpoint::Open(tag.string());
  REQUIRE(extra.ok());
  CHECK(extra->FindParam("fc1.bias")->states.count("momentum_buffer") == 1);
}

TEST_CASE("DeepSpeedStateKey follows re.search(r'(.+).pt', name)", "[ucp]") {
  CHECK(DeepSpeedStateKey("fp32.pt") == std::optional<std::string>("fp32"));
  CHECK(DeepSpeedStateKey("exp_avg_sq.pt") == std::optional<std::string>("exp_avg_sq"));
  CHECK(DeepSpeedStateKey("a.pt.bak") == std::optional<std::string>("a"));
  CHECK(DeepSpeedStateKey("x.pt.pt") == std::optional<std::string>("x.pt"));
  CHECK(DeepSpeedStateKey("receipt") == std::optional<std::string>("rece"));
  CHECK(DeepSpeedStateKey("a.pt") == std::optional<std::string>("a"));
  CHECK_FALSE(DeepSpeedStateKey(".pt"));
  CHECK_FALSE(DeepSpeedStateKey("pt"));
  CHECK_FALSE(DeepSpeedStateKey("README"));
  CHECK_FALSE(DeepSpeedStateKey(""));
  CHECK(DeepSpeedStateKey("a\nb.pt") == std::optional<std::string>("b"));  // '.' stops at a newline
  CHECK_FALSE(DeepSpeedStateKey("ab\npt"));
}

// ---- accepted edge cases ----

TEST_CASE("An unlisted folder holding a view into a flat buffer comes last, at the view's offset", "[ucp]") {
  TempDir tmp;
  const fs::path tag = CopyTiny(tmp, "ucp_edge/unlisted_view");
  auto ucp = UniversalCheckpoint::Open(tag.string());
  REQUIRE(ucp.ok());
  REQUIRE(ucp->params().size() == 8);
  const ParamEntry& alias = ucp->params().back();
  CHECK(alias.name == "fc2.weight_alias");
  CHECK_FALSE(alias.listed);
  CHECK(alias.source_group == -1);
  CHECK(alias.tp_shapes.empty());
  CHECK(alias.full_shape == std::vector<int64_t>{32, 32});
  CHECK_FALSE(alias.step);
  REQUIRE(alias.states.size() == 1);
  const StateTensor& view = alias.states.at("fp32");
  CHECK(view.nbytes == 4096);
  // The record holds the whole 4096-element group-0 buffer; fc2.weight starts at element 1024.
  CHECK((view.data_offset - 4 * 1024) % 64 == 0);
  const StateTensor& master = ucp->FindParam("fc2.weight")->states.at("fp32");
  for (uint64_t k : {0u, 1u, 511u, 1023u}) CHECK(ElementBits(view, k) == ElementBits(master, k));
  CHECK(ElementBits(view, 0) == 0x3de20f2a);
  // It had no optimizer state in the source run, so it is in no optimizer group (DeepSpeed's loaders
  // never read it); the listed params keep theirs.
  auto groups = plan::OptimizerGroups(*ucp);
  REQUIRE(groups.ok());
  size_t in_groups = 0;
  for (const auto& g : *groups) {
    for (const ParamEntry* p : g) CHECK(p->listed);
    in_groups += g.size();
  }
  CHECK(in_groups == 7);
}

TEST_CASE("Category keys: sub_param_shape, param_n_sub_params, vocab_tensor", "[ucp]") {
  TempDir tmp;
  auto ucp = UniversalCheckpoint::Open(CopyTiny(tmp, "ucp_edge/categories").string());
  REQUIRE(ucp.ok());
  const ParamCategories& fc1 = ucp->FindParam("fc1.weight")->categories;
  CHECK_FALSE(fc1.cat_dim);
  REQUIRE(fc1.sub_param_shape);
  const SubparamShape& sp = *fc1.sub_param_shape;
  CHECK(sp.patterns == std::vector<std::string>{"fc1\\.weight"});
  CHECK(sp.partition_dim == 0);
  CHECK_FALSE(sp.shape_is_tuple);
  REQUIRE(sp.shape.size() == 2);
  CHECK(sp.shape[0].is_tuple);
  CHECK(sp.shape[0].sub_sizes == std::vector<int64_t>{16, 16});
  CHECK_FALSE(sp.shape[1].is_tuple);
  CHECK(sp.shape[1].size == 32);
  const ParamCategories& fc2 = ucp->FindParam("fc2.weight")->categories;
  CHECK(fc2.cat_dim == 0);
  CHECK(fc2.param_n_sub_params == 2);
  const ParamCategories& embed = ucp->FindParam("embed.weight")->categories;
  CHECK(embed.cat_dim == 0);
  CHECK(embed.vocab_tensor == true);
  ParamCategories plain;
  plain.cat_dim = 0;
  CHECK(ucp->FindParam("head.weight")->categories == plain);
}

TEST_CASE("zero_stage pickled by name, and an int step", "[ucp]") {
  TempDir tmp1, tmp2;
  auto by_name = UniversalCheckpoint::Open(CopyTiny(tmp1, "ucp_edge/zero_stage_by_name").string());
  REQUIRE(by_name.ok());
  CHECK(by_name->zero_stage() == 1);
  CHECK(by_name->zero_stage_recorded());
  auto int_step = UniversalCheckpoint::Open(CopyTiny(tmp2, "ucp_edge/step_int").string());
  REQUIRE(int_step.ok());
  const auto& step = int_step->FindParam("fc1.bias")->step;
  REQUIRE(step);
  CHECK_FALSE(step->is_tensor);
  CHECK(step->int_value == 3);
  CHECK(step->value == 3.0);
  CHECK(int_step->FindParam("fc2.bias")->step->is_tensor);
}

TEST_CASE("A frozen parameter is planned from its module entry; another TP needs its AutoTP layout", "[ucp][frozen]") {
  TempDir tmp;
  const fs::path tag = CopyTiny(tmp, "ucp_edge/frozen");
  auto ucp = UniversalCheckpoint::Open(tag.string());
  REQUIRE(ucp.ok());
  CHECK(plan::FrozenParamNames(*ucp, ucp->ModelStatesForTp(0)->archive.tree()) ==
        std::vector<std::string>{"frozen.weight"});
  plan::Target target;
  target.zero_stage = 3;
  target.dp_size = 4;
  plan::SourceTable sources;
  auto frozen = plan::PlanFrozenParams(*ucp, target, 0, sources);
  REQUIRE(frozen.ok());
  REQUIRE(frozen->size() == 1);
  const plan::FrozenParam& p = frozen->front();
  CHECK(p.name == "frozen.weight");
  CHECK(p.shape == std::vector<int64_t>{8, 4});
  CHECK(p.dtype == format::DType::kFloat32);
  // One run of the module entry's 32 elements in the model-states file: arange(32) / 3.
  REQUIRE(p.value.size() == 1);
  CHECK(plan::NumElements(p.value) == 32);
  const plan::Source& source = sources.sources().at(p.value[0].source);
  CHECK(source.path == (tag / "mp_rank_00_model_states.pt").string());
  for (uint64_t k : {0u, 1u, 31u}) {
    const float expected = static_cast<float>(k) / 3.0f;
    uint32_t bits = 0;
    std::memcpy(&bits, &expected, sizeof(bits));
    CHECK(BitsAt(source.path, source.data_offset + 4 * (p.value[0].gather.start + k)) == bits);
  }

  // TinyModel names no AutoTP layout, so nothing says how TP 2 cuts it.
  target.tp_size = 2;
  auto refused = plan::PlanFrozenParams(*ucp, target, 0, sources);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(refused.status().message(),
             Catch::Contains("frozen parameter 'frozen.weight': its cut at TP 2 is known only from the model's "
                             "AutoTP layout"));
}

TEST_CASE("A frozen parameter saved as a strided view is refused", "[ucp][frozen]") {
  TempDir tmp;
  auto ucp = UniversalCheckpoint::Open(CopyTiny(tmp, "ucp_bad/frozen_non_contiguous").string());
  REQUIRE(ucp.ok());
  plan::Target target;
  target.dp_size = 4;
  plan::SourceTable sources;
  auto refused = plan::PlanFrozenParams(*ucp, target, 0, sources);
  REQUIRE_FALSE(refused.ok());
  CHECK(refused.status().code() == StatusCode::kUnsupported);
  CHECK_THAT(refused.status().message(),
             Catch::EndsWith("mp_rank_00_model_states.pt: module entry 'frozen.weight' is a non-contiguous view of "
                             "its storage"));
}

}  // namespace
}  // namespace reshard::ucp
