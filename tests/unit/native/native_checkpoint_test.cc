// native::OpenNativeCheckpoint against real DeepSpeed 0.19.8 checkpoints: examples/tiny/native
// (ZeRO-1, TP 1, DP 2) against DeepSpeed's own ds_to_universal output of it (examples/tiny/
// universal): the index must be the one the universal reader builds from the converted folder,
// and every state's bytes, gathered from the optimizer files' fragments, the converted file's.
// Refusals are built on copies of it and on examples/tiny_llama_tp2/native (TP 2).
#include "reshard/native/native_checkpoint.h"

#include <fcntl.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "reshard/base/unique_fd.h"
#include "reshard/format/pickle_query.h"
#include "tests/unit/temp_dir.h"

namespace reshard::native {
namespace {

namespace fs = std::filesystem;
using reshard::testing::TempDir;

fs::path RepoRoot() { return fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path(); }
fs::path TinyNative() { return RepoRoot() / "examples/tiny/native"; }
fs::path TinyUniversal() { return RepoRoot() / "examples/tiny/universal"; }

std::vector<uint8_t> ReadRun(const std::string& path, uint64_t offset, uint64_t n) {
  std::vector<uint8_t> out(n);
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  REQUIRE(fd.valid());
  REQUIRE(::pread(fd.get(), out.data(), n, static_cast<off_t>(offset)) == static_cast<ssize_t>(n));
  return out;
}

// The tensor's bytes in C order, from its file or its pieces.
std::vector<uint8_t> ReadState(const ucp::StateTensor& t) {
  if (t.pieces.empty()) return ReadRun(t.path, t.data_offset, t.nbytes);
  std::vector<uint8_t> out;
  for (const ucp::TensorPiece& p : t.pieces) {
    const std::vector<uint8_t> run = ReadRun(p.path, p.data_offset, p.numel * format::ItemSize(t.dtype));
    out.insert(out.end(), run.begin(), run.end());
  }
  return out;
}

Status OpenStatus(const fs::path& p) {
  auto r = OpenNativeCheckpoint(p.string());
  return r.ok() ? Status::Ok() : r.status();
}

// Compares the native index of `native` with the universal reader's index of its conversion;
// returns how many states were stitched from more than one run.
size_t CheckSameIndex(const fs::path& native_path, const fs::path& universal_path) {
  auto native = OpenNativeCheckpoint(native_path.string());
  REQUIRE(native.ok());
  auto universal = ucp::UniversalCheckpoint::Open(universal_path.string());
  REQUIRE(universal.ok());
  CHECK(native->native());
  CHECK_FALSE(universal->native());
  CHECK(native->tag() == "global_step3");
  CHECK(native->zero_stage() == universal->zero_stage());
  CHECK(native->tp_degree() == universal->tp_degree());
  CHECK(native->dp_world_size() == universal->dp_world_size());
  CHECK(native->num_source_groups() == universal->num_source_groups());
  REQUIRE(native->param_groups().size() == universal->param_groups().size());
  for (size_t g = 0; g < native->param_groups().size(); ++g) {
    CHECK(native->param_groups()[g].params == universal->param_groups()[g].params);
  }
  REQUIRE(native->params().size() == universal->params().size());
  size_t fragmented = 0;
  for (size_t k = 0; k < native->params().size(); ++k) {
    const ucp::ParamEntry& n = native->params()[k];
    const ucp::ParamEntry& u = universal->params()[k];
    INFO(u.name);
    CHECK(n.name == u.name);
    CHECK(n.full_shape == u.full_shape);
    CHECK(n.bare_tensor == u.bare_tensor);
    CHECK(n.categories == u.categories);
    CHECK(n.listed == u.listed);
    CHECK(n.source_group == u.source_group);
    CHECK(n.tp_shapes == u.tp_shapes);
    REQUIRE(n.step.has_value() == u.step.has_value());
    if (n.step) {
      CHECK(n.step->is_tensor == u.step->is_tensor);
      CHECK(n.step->value == u.step->value);
    }
    REQUIRE(n.states.size() == u.states.size());
    for (const auto& [key, ut] : u.states) {
      INFO(key);
      REQUIRE(n.states.count(key) == 1);
      const ucp::StateTensor& nt = n.states.at(key);
      CHECK(nt.dtype == ut.dtype);
      CHECK(nt.shape == ut.shape);
      CHECK(nt.nbytes == ut.nbytes);
      CHECK(nt.requires_grad == ut.requires_grad);
      CHECK(ReadState(nt) == ReadState(ut));
      fragmented += nt.pieces.size() > 1;
    }
  }
  // zero/optimizer_state.pt's keys are read in place from rank 0's optimizer_state_dict.
  const format::PickleTree& t = native->optimizer_state().tree();
  CHECK(format::DictLookup(t, native->optimizer_state_root(), "clip_grad") != format::kNoNode);
  return fragmented;
}

TEST_CASE("A native ZeRO-1 checkpoint indexes as its ds_to_universal conversion", "[native]") {
  // The tiny model's second group straddles the two DP ranks: some state is really stitched.
  CHECK(CheckSameIndex(TinyNative(), TinyUniversal()) > 0);
}

TEST_CASE("A native AutoTP TP 2 checkpoint indexes as its conversion: slices joined along their split dim", "[native]") {
  // examples/tiny_llama_tp2: q/k/v/gate/up/lm_head/embed split along dim 0, o/down along dim 1
  // (one run per row and rank), norms replicated.
  CHECK(CheckSameIndex(RepoRoot() / "examples/tiny_llama_tp2/native", RepoRoot() / "examples/tiny_llama_tp2/universal") >
        0);
}

TEST_CASE("Sources are told apart by their files", "[native]") {
  CHECK(LooksNative(TinyNative().string()));
  CHECK(LooksNative((TinyNative() / "global_step3").string()));
  CHECK_FALSE(LooksNative(TinyUniversal().string()));
  CHECK_FALSE(LooksNative((TinyUniversal() / "global_step3_universal").string()));
  auto a = OpenCheckpointSource(TinyNative().string());
  auto b = OpenCheckpointSource(TinyUniversal().string());
  REQUIRE(a.ok());
  REQUIRE(b.ok());
  CHECK(a->native());
  CHECK_FALSE(b->native());
}

TEST_CASE("Refuse what a native source cannot be served from, one line each", "[native]") {
  TempDir tmp;
  fs::copy(TinyNative(), tmp.path(), fs::copy_options::recursive);
  const fs::path tag = tmp.path() / "global_step3";

  SECTION("a missing rank file is named") {
    fs::remove(tag / "zero_pp_rank_0_mp_rank_00_optim_states.pt");
    const Status s = OpenStatus(tmp.path());
    CHECK(s.code() == StatusCode::kNotFound);
    CHECK_THAT(s.message(), Catch::Contains("no optimizer file for DP rank 0"));
  }
  SECTION("a missing last rank shows as a disagreement with the recorded DP size") {
    fs::remove(tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt");
    const Status s = OpenStatus(tmp.path());
    CHECK(s.code() == StatusCode::kCorrupt);
    CHECK_THAT(s.message(), Catch::Contains("partition_count") && Catch::Contains("1 DP ranks"));
  }
  SECTION("a truncated rank file") {
    const fs::path f = tag / "zero_pp_rank_1_mp_rank_00_optim_states.pt";
    fs::resize_file(f, fs::file_size(f) / 2);
    const Status s = OpenStatus(tmp.path());
    CHECK_FALSE(s.ok());
    CHECK_THAT(s.message(), Catch::StartsWith(f.string()));
  }
  SECTION("pipeline and MoE files") {
    std::ofstream(tag / "layer_01-model_states.pt") << "x";
    const Status pipe = OpenStatus(tmp.path());
    CHECK(pipe.code() == StatusCode::kUnsupported);
    CHECK_THAT(pipe.message(), Catch::Contains("pipeline-parallel"));
    fs::remove(tag / "layer_01-model_states.pt");
    std::ofstream(tag / "layer_0_expert_0_mp_rank_00_model_states.pt") << "x";
    const Status moe = OpenStatus(tmp.path());
    CHECK(moe.code() == StatusCode::kUnsupported);
    CHECK_THAT(moe.message(), Catch::Contains("MoE"));
  }
  SECTION("a stage-0 checkpoint has no optimizer files") {
    for (const char* f : {"zero_pp_rank_0_mp_rank_00_optim_states.pt", "zero_pp_rank_1_mp_rank_00_optim_states.pt"}) {
      fs::remove(tag / f);
    }
    const Status s = OpenStatus(tmp.path());
    CHECK(s.code() == StatusCode::kUnsupported);
    CHECK_THAT(s.message(), Catch::Contains("stage-0"));
  }
}

}  // namespace
}  // namespace reshard::native
