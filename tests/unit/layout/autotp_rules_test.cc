// layout::BuiltinAutoTpRule against what real DeepSpeed 0.19.8 AutoTP recorded: every parameter of
// examples/tiny_llama_tp2 (a LlamaForCausalLM trained at AutoTP TP 2) has an affine_map entry whose
// split dim the rule must reproduce; and the rule's refusals.
#include "reshard/layout/autotp_rules.h"

#include <catch2/catch.hpp>
#include <filesystem>

#include "reshard/ucp/universal_checkpoint.h"

namespace reshard::layout {
namespace {

namespace fs = std::filesystem;

fs::path RepoRoot() { return fs::path(__FILE__).parent_path().parent_path().parent_path().parent_path(); }

TEST_CASE("The built-in llama rules give every parameter the split DeepSpeed's AutoTP recorded", "[autotp]") {
  auto ucp = ucp::UniversalCheckpoint::Open((RepoRoot() / "examples/tiny_llama_tp2/universal").string());
  REQUIRE(ucp.ok());
  REQUIRE(ucp->params().size() == 21);
  int split = 0;
  for (const ucp::ParamEntry& p : ucp->params()) {
    INFO(p.name);
    const ucp::AffineSplit* recorded = ucp->FindAffineSplit(p.name);
    REQUIRE(recorded != nullptr);
    auto role = BuiltinAutoTpRule("llama", p.name, false);
    REQUIRE(role.ok());
    const int dim = SplitDim(*role);
    CHECK(recorded->partition_dim.value_or(-1) == dim);
    split += dim >= 0 ? 1 : 0;
  }
  CHECK(split == 15);  // 7 projections x 2 layers + lm_head
}

TEST_CASE("Built-in AutoTP rules refuse what they do not know", "[autotp]") {
  const auto unsupported = [](const Result<AutoTpRole>& r, const std::string& text) {
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnsupported);
    CHECK_THAT(r.status().message(), Catch::Contains(text));
  };
  unsupported(BuiltinAutoTpRule("gpt2", "transformer.h.0.attn.c_attn.weight", false),
              "no built-in AutoTP rules for model_type 'gpt2' (reshardfs knows: llama)");
  unsupported(BuiltinAutoTpRule("llama", "model.embed_tokens.weight", true), "tie_word_embeddings");
  unsupported(BuiltinAutoTpRule("llama", "model.layers.0.self_attn.q_proj.bias", false),
              "parameter 'model.layers.0.self_attn.q_proj.bias': no built-in AutoTP rule of model_type 'llama'");
  unsupported(BuiltinAutoTpRule("llama", "model.my_lm_head.weight", false), "no built-in AutoTP rule");
  CHECK(BuiltinAutoTpModelTypes() == std::vector<std::string>{"llama"});
  CHECK(SplitDim(AutoTpRole::kReplicated) == -1);
}

}  // namespace
}  // namespace reshard::layout
