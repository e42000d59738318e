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

// The Hugging Face decoder families whose AutoTP layout was recorded from DeepSpeed 0.19.8 (sorted). All of
// them carry the same shape of HF tp_plan, which AutoTP's training path follows: the attention output and MLP
// down projections (o_proj, down_proj; starcoder2's c_proj) end a residual branch and are all-reduced
// (row-parallel, their biases added whole after the reduce); the other projections (q/k/v, gate/up; starcoder2's
// c_fc), their biases and an untied lm_head are column-parallel; embeddings (and a head tied to them: no plan
// asks for a vocab-parallel embedding) and every norm's weight and bias (qwen3's and gemma3's per-head
// q_norm/k_norm included) stay whole. What a family does not have (a bias mistral never builds, starcoder2's
// c_fc elsewhere) never occurs in its checkpoints. Recorded per parameter in tests/unit/layout/autotp_layouts.json
// (tests/integration/autotp_layouts.py: every family untied and tied, llama with every optional bias) and, for
// llama, in the affine_map of examples/tiny_llama_tp2.
// With each, its config class's defaults (transformers 4.57): tie_word_embeddings, num_attention_heads,
// num_key_value_heads (0: the class takes num_attention_heads).
struct Family {
  std::string_view model_type;
  bool tie_word_embeddings;
  int64_t num_attention_heads;
  int64_t num_key_value_heads;
};
constexpr std::array<Family, 11> kDecoderFamilies = {{
    {"cohere", true, 64, 0},
    {"gemma", true, 16, 16},
    {"gemma2", true, 8, 4},
    {"gemma3_text", true, 8, 4},
    {"granite", false, 32, 0},
    {"llama", false, 32, 0},
    {"mistral", false, 32, 8},
    {"olmo", false, 32, 0},
    {"qwen2", false, 32, 32},
    {"qwen3", false, 32, 32},
    {"starcoder2", true, 24, 2},
}};

constexpr std::array<SuffixRule, 29> kDecoderRules = {{
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
    {".mlp.c_fc.weight", AutoTpRole::kColumn},
    {".mlp.c_fc.bias", AutoTpRole::kColumn},
    {".mlp.c_proj.weight", AutoTpRole::kRow},
    {".mlp.c_proj.bias", AutoTpRole::kReplicated},
    {"embed_tokens.weight", AutoTpRole::kReplicated},
    {"input_layernorm.weight", AutoTpRole::kReplicated},
    {"input_layernorm.bias", AutoTpRole::kReplicated},
    {"post_attention_layernorm.weight", AutoTpRole::kReplicated},
    {"post_attention_layernorm.bias", AutoTpRole::kReplicated},
    {"pre_feedforward_layernorm.weight", AutoTpRole::kReplicated},
    {"post_feedforward_layernorm.weight", AutoTpRole::kReplicated},
    {".self_attn.q_norm.weight", AutoTpRole::kReplicated},
    {".self_attn.k_norm.weight", AutoTpRole::kReplicated},
    {"norm.weight", AutoTpRole::kReplicated},
    {"norm.bias", AutoTpRole::kReplicated},
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
  std::vector<std::string> out;
  for (const Family& f : kDecoderFamilies) out.emplace_back(f.model_type);
  return out;
}

std::optional<ModelConfigDefaults> BuiltinModelConfigDefaults(std::string_view model_type) {
  for (const Family& f : kDecoderFamilies) {
    if (f.model_type != model_type) continue;
    ModelConfigDefaults d;
    d.tie_word_embeddings = f.tie_word_embeddings;
    d.num_attention_heads = f.num_attention_heads;
    if (f.num_key_value_heads > 0) d.num_key_value_heads = f.num_key_value_heads;
    return d;
  }
  return std::nullopt;
}

Result<AutoTpRole> BuiltinAutoTpRule(std::string_view model_type, std::string_view param_name,
                                     bool tied_word_embeddings) {
  if (std::none_of(kDecoderFamilies.begin(), kDecoderFamilies.end(),
                   [&](const Family& f) { return f.model_type == model_type; })) {
    std::string names;
    for (const std::string& k : BuiltinAutoTpModelTypes()) names += (names.empty() ? "" : ", ") + k;
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
