#include "reshard/layout/autotp_rules.h"

#include <algorithm>
#include <array>
#include <utility>

namespace reshard::layout {
namespace {

struct SuffixRule {
  std::string_view suffix;  // matched against the end of the parameter name
  AutoTpRole role;
};

// The Hugging Face decoder families whose AutoTP layout was recorded from DeepSpeed 0.19.8 (sorted). All
// four carry the same HF tp_plan, which AutoTP's training path follows: the attention output and MLP down
// projections end a residual branch and are all-reduced (row-parallel, their biases added whole after the
// reduce); the other projections, their biases and an untied lm_head are column-parallel; embeddings (and a
// head tied to them: none of the four plans asks for a vocab-parallel embedding) and norm weights (qwen3's
// per-head q_norm/k_norm included) stay whole. What a family does not have (a bias
// mistral never builds) never occurs in its checkpoints. Recorded per parameter in
// tests/unit/layout/autotp_layouts.json (llama with every optional bias, mistral, qwen2, qwen3; each untied
// and tied) and, for llama, in the affine_map of examples/tiny_llama_tp2.
constexpr std::array<std::string_view, 4> kDecoderFamilies = {"llama", "mistral", "qwen2", "qwen3"};

constexpr std::array<SuffixRule, 20> kDecoderRules = {{
    {".self_attn.q_proj.weight", AutoTpRole::kColumn},
    {".self_attn.q_proj.bias", AutoTpRole::kColumn},
    {".self_attn.k_proj.weight", AutoTpRole::kColumn},
    {".self_attn.k_proj.bias", AutoTpRole::kColumn},
    {".self_attn.v_proj.weight", AutoTpRole::kColumn},
    {".self_attn.v_proj.bias", AutoTpRole::kColumn},
    {".self_attn.o_proj.weight", AutoTpRole::kRow},
    {".self_attn.o_proj.bias", AutoTpRole::kReplicated},
    {".mlp.gate_proj.weight", AutoTpRole::kColumn},
    {".mlp.gate_proj.bias", AutoTpRole::kColumn},
    {".mlp.up_proj.weight", AutoTpRole::kColumn},
    {".mlp.up_proj.bias", AutoTpRole::kColumn},
    {".mlp.down_proj.weight", AutoTpRole::kRow},
    {".mlp.down_proj.bias", AutoTpRole::kReplicated},
    {"embed_tokens.weight", AutoTpRole::kReplicated},
    {"input_layernorm.weight", AutoTpRole::kReplicated},
    {"post_attention_layernorm.weight", AutoTpRole::kReplicated},
    {".self_attn.q_norm.weight", AutoTpRole::kReplicated},
    {".self_attn.k_norm.weight", AutoTpRole::kReplicated},
    {"norm.weight", AutoTpRole::kReplicated},
}};

bool EndsWith(std::string_view s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.substr(s.size() - suffix.size()) == suffix;
}

}  // namespace

int SplitDim(AutoTpRole role) {
  switch (role) {
    case AutoTpRole::kColumn:
      return 0;
    case AutoTpRole::kRow:
      return 1;
    case AutoTpRole::kReplicated:
      break;
  }
  return -1;
}

std::vector<std::string> BuiltinAutoTpModelTypes() {
  return std::vector<std::string>(kDecoderFamilies.begin(), kDecoderFamilies.end());
}

Result<AutoTpRole> BuiltinAutoTpRule(std::string_view model_type, std::string_view param_name,
                                     bool tied_word_embeddings) {
  const std::vector<std::string> known = BuiltinAutoTpModelTypes();
  if (std::find(known.begin(), known.end(), model_type) == known.end()) {
    std::string names;
    for (const std::string& k : known) names += (names.empty() ? "" : ", ") + k;
    return Unsupported("no built-in AutoTP rules for model_type '" + std::string(model_type) + "' (reshardfs knows: " +
                       names + "); its TP > 1 layout cannot be derived from a checkpoint saved without TP");
  }
  // lm_head is matched whole: "lm_head.weight" (or with a wrapper prefix), never "*_lm_head". Untied, it is
  // column-parallel; tied, AutoTP keeps the embedding whole, and the head is the same tensor.
  if (param_name == "lm_head.weight" || EndsWith(param_name, ".lm_head.weight")) {
    return tied_word_embeddings ? AutoTpRole::kReplicated : AutoTpRole::kColumn;
  }
  const auto it = std::find_if(kDecoderRules.begin(), kDecoderRules.end(),
                               [&](const SuffixRule& r) { return EndsWith(param_name, r.suffix); });
  if (it == kDecoderRules.end()) {
    return Unsupported("parameter '" + std::string(param_name) + "': no built-in AutoTP rule of model_type '" +
                       std::string(model_type) + "' matches it");
  }
  return it->role;
}

}  // namespace reshard::layout
