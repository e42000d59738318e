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

// LlamaForCausalLM under AutoTP's training path: the attention output and MLP down projections
// end a residual branch and are all-reduced (row-parallel); the other projections and the
// untied lm_head are column-parallel; embeddings and RMSNorm weights stay whole. Exactly what
// DeepSpeed 0.19.8 recorded for every parameter of examples/tiny_llama_tp2.
constexpr std::array<SuffixRule, 11> kLlamaRules = {{
    {".self_attn.q_proj.weight", AutoTpRole::kColumn},
    {".self_attn.k_proj.weight", AutoTpRole::kColumn},
    {".self_attn.v_proj.weight", AutoTpRole::kColumn},
    {".self_attn.o_proj.weight", AutoTpRole::kRow},
    {".mlp.gate_proj.weight", AutoTpRole::kColumn},
    {".mlp.up_proj.weight", AutoTpRole::kColumn},
    {".mlp.down_proj.weight", AutoTpRole::kRow},
    {"embed_tokens.weight", AutoTpRole::kReplicated},
    {"input_layernorm.weight", AutoTpRole::kReplicated},
    {"post_attention_layernorm.weight", AutoTpRole::kReplicated},
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

std::vector<std::string> BuiltinAutoTpModelTypes() { return {"llama"}; }

Result<AutoTpRole> BuiltinAutoTpRule(std::string_view model_type, std::string_view param_name,
                                     bool tied_word_embeddings) {
  const std::vector<std::string> known = BuiltinAutoTpModelTypes();
  if (std::find(known.begin(), known.end(), model_type) == known.end()) {
    std::string names;
    for (const std::string& k : known) names += (names.empty() ? "" : ", ") + k;
    return Unsupported("no built-in AutoTP rules for model_type '" + std::string(model_type) + "' (reshardfs knows: " +
                       names + "); its TP > 1 layout cannot be derived from a checkpoint saved without TP");
  }
  if (tied_word_embeddings) {
    return Unsupported("model_type '" + std::string(model_type) +
                       "' with tie_word_embeddings: AutoTP's tied output head is not covered by the built-in rules");
  }
  // lm_head is matched whole: "lm_head.weight" (or with a wrapper prefix), never "*_lm_head".
  if (param_name == "lm_head.weight" || EndsWith(param_name, ".lm_head.weight")) return AutoTpRole::kColumn;
  const auto it = std::find_if(kLlamaRules.begin(), kLlamaRules.end(),
                               [&](const SuffixRule& r) { return EndsWith(param_name, r.suffix); });
  if (it == kLlamaRules.end()) {
    return Unsupported("parameter '" + std::string(param_name) + "': no built-in AutoTP rule of model_type '" +
                       std::string(model_type) + "' matches it");
  }
  return it->role;
}

}  // namespace reshard::layout
