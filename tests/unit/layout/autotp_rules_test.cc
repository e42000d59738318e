// layout::BuiltinAutoTpRule against what real DeepSpeed 0.19.8 AutoTP recorded: every parameter of
// examples/tiny_llama_tp2 (a LlamaForCausalLM trained at AutoTP TP 2) has an affine_map entry whose
// split dim the rule must reproduce; every parameter of the tiny model of every family in
// autotp_layouts.json (recorded by tests/integration/autotp_layouts.py) has the split dim and per-rank
// shard sizes the rule and GetShardSizeList must reproduce, read through the config.json
// save_pretrained writes (plan::ParseModelConfig fills what it leaves out with the family's recorded
// config-class defaults); and the rule's refusals.
#include "reshard/layout/autotp_rules.h"

#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <set>
#include <nlohmann/json.hpp>

#include "reshard/layout/tp_partition.h"
#include "reshard/plan/target_config.h"
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

TEST_CASE("The built-in rules reproduce AutoTP's recorded layout of every listed family", "[autotp]") {
  std::ifstream in(RepoRoot() / "tests/unit/layout/autotp_layouts.json");
  REQUIRE(in.good());
  const nlohmann::json doc = nlohmann::json::parse(in);
  const int tp = doc.at("tp_size").get<int>();
  std::set<std::string> model_types;
  int tied = 0;
  for (const auto& [family, layout] : doc.at("families").items()) {
    const std::string model_type = layout.at("model_type").get<std::string>();
    model_types.insert(model_type);
    // The family's config-class defaults, as transformers recorded them.
    const nlohmann::json& recorded_defaults = layout.at("config_defaults");
    const std::optional<ModelConfigDefaults> defaults = BuiltinModelConfigDefaults(model_type);
    REQUIRE(defaults.has_value());
    CHECK(defaults->tie_word_embeddings == recorded_defaults.at("tie_word_embeddings").get<bool>());
    CHECK(defaults->num_attention_heads == recorded_defaults.at("num_attention_heads").get<int64_t>());
    const nlohmann::json& kv_default = recorded_defaults.at("num_key_value_heads");
    CHECK(defaults->num_key_value_heads ==
          (kv_default.is_null() ? std::nullopt : std::optional<int64_t>(kv_default.get<int64_t>())));
    // The config.json save_pretrained writes: only what differs from those defaults.
    auto config = plan::ParseModelConfig(nlohmann::ordered_json::parse(layout.at("config").dump()));
    REQUIRE(config.ok());
    CHECK(config->model_type == model_type);
    const bool tied_model = family.size() > 5 && family.substr(family.size() - 5) == "_tied";
    CHECK(config->tie_word_embeddings == tied_model);
    REQUIRE(config->num_kv_heads.has_value());
    const int64_t kv_heads = *config->num_kv_heads;
    CHECK(kv_heads == 3);
    int split = 0;
    int uneven = 0;
    for (const auto& [name, recorded] : layout.at("params").items()) {
      INFO(family << " " << name);
      auto role = BuiltinAutoTpRule(model_type, name, config->tie_word_embeddings);
      REQUIRE(role.ok());
      const int dim = SplitDim(*role);
      if (recorded.at("split_dim").is_null()) {
        CHECK(dim == -1);
        continue;
      }
      REQUIRE(dim == recorded.at("split_dim").get<int>());
      const auto shape = recorded.at("shape").get<std::vector<int64_t>>();
      auto sizes = GetShardSizeList(shape.at(static_cast<size_t>(dim)), tp, name.substr(0, name.rfind('.')), kv_heads);
      REQUIRE(sizes.ok());
      const auto expected = recorded.at("shard_sizes").get<std::vector<int64_t>>();
      CHECK(*sizes == expected);
      ++split;
      uneven += expected.front() != expected.back() ? 1 : 0;
    }
    CHECK(split >= 14);  // 7 projections x 2 layers (+ an untied lm_head)
    CHECK(uneven >= 8);  // q/k/v/o of 2 layers: 3 KV heads over 2 ranks
    tied += config->tie_word_embeddings ? 1 : 0;
  }
  CHECK(std::vector<std::string>(model_types.begin(), model_types.end()) == BuiltinAutoTpModelTypes());
  CHECK(tied == 11);
}

TEST_CASE("Built-in AutoTP rules refuse what they do not know", "[autotp]") {
  const auto unsupported = [](const Result<AutoTpRole>& r, const std::string& text) {
    REQUIRE_FALSE(r.ok());
    CHECK(r.status().code() == StatusCode::kUnsupported);
    CHECK_THAT(r.status().message(), Catch::Contains(text));
  };
  unsupported(BuiltinAutoTpRule("gpt2", "transformer.h.0.attn.c_attn.weight", false),
              "no built-in AutoTP rules for model_type 'gpt2' (reshardfs knows: cohere, gemma, gemma2, gemma3_text, "
              "granite, llama, mistral, olmo, qwen2, qwen3, starcoder2)");
  CHECK(BuiltinAutoTpRule("llama", "lm_head.weight", true).value() == AutoTpRole::kReplicated);
  CHECK(BuiltinAutoTpRule("llama", "lm_head.weight", false).value() == AutoTpRole::kColumn);
  unsupported(BuiltinAutoTpRule("qwen2", "model.layers.0.mlp.experts.0.gate_proj.scale", false),
              "parameter 'model.layers.0.mlp.experts.0.gate_proj.scale': no built-in AutoTP rule of model_type "
              "'qwen2'");
  unsupported(BuiltinAutoTpRule("llama", "model.my_lm_head.weight", false), "no built-in AutoTP rule");
  CHECK(BuiltinAutoTpModelTypes() == std::vector<std::string>{"cohere", "gemma", "gemma2", "gemma3_text", "granite",
                                                               "llama", "mistral", "olmo", "qwen2", "qwen3",
                                                               "starcoder2"});
  CHECK_FALSE(BuiltinModelConfigDefaults("gpt2").has_value());
  CHECK(SplitDim(AutoTpRole::kReplicated) == -1);
}

}  // namespace
}  // namespace reshard::layout
