// AutoTP rules: how DeepSpeed's AutoTP (training mode, tensor_parallel.autotp_size) splits each
// parameter of a Hugging Face decoder family, for checkpoints that do not say it themselves.
//
// A universal checkpoint converted from a run without TP (TP degree 1: no AutoTP layers, so no
// affine_map, and the converter's default cat_dim 0 on every parameter) or from ZeRO-3 (bare
// tensors, no categories at all) carries nothing about how an AutoTP run of TP > 1 will cut its
// parameters. DeepSpeed's own loader takes that from the live AutoTP layers of the resuming
// model; the planner has no model, so it takes it from these rules, keyed by the model config's
// `model_type`.
//
// Only families whose rules were checked against the installed DeepSpeed are listed (see
// BuiltinAutoTpRule): cohere, gemma, gemma2, gemma3_text, granite, llama, mistral, olmo, qwen2,
// qwen3 and starcoder2, against the affine_map DeepSpeed 0.19.8's AutoTP records for every parameter
// of a tiny model of each, untied and tied (tests/unit/layout/autotp_layouts.json, re-recorded from
// the pinned package by tests/integration/test_autotp_layouts.py), the split dims and KV-aware shard
// sizes both; llama and qwen2 (tied) also end to end: a TP 1 checkpoint resumed from the mount at
// TP 2 equals DeepSpeed's own load_universal (tests/integration/test_llama_resume.py).
// Everything else is refused rather than guessed.
//
// A config.json written by transformers' save_pretrained holds only the fields that differ from its
// config class's defaults, and those defaults differ by family (gemma ties its embeddings by default,
// llama does not; mistral has 8 KV heads by default, llama as many as query heads):
// BuiltinModelConfigDefaults gives them for the listed families (transformers 4.57, recorded in the
// same table).
// Pure functions. Public header: C++17.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "reshard/base/status.h"

namespace reshard::layout {

// How AutoTP's layer for a parameter holds it on a TP rank.
enum class AutoTpRole {
  kReplicated,  // every rank holds the whole tensor (embeddings, norms)
  kColumn,      // LinearLayer: split along dim 0 (output features) with AutoTP's shard sizes
  kRow,         // LinearAllreduce: split along dim 1 (input features) with AutoTP's shard sizes
};

// The dim a role splits (kColumn 0, kRow 1); -1 for kReplicated.
int SplitDim(AutoTpRole role);

// The model types BuiltinAutoTpRule knows, sorted.
std::vector<std::string> BuiltinAutoTpModelTypes();

// The defaults of a family's Hugging Face config class for the fields reshardfs reads.
struct ModelConfigDefaults {
  bool tie_word_embeddings = false;
  int64_t num_attention_heads = 0;
  // nullopt: the class takes num_attention_heads (LlamaConfig(num_key_value_heads=None)).
  std::optional<int64_t> num_key_value_heads;
};

// The config-class defaults of `model_type`, or nullopt when it is not a listed family.
std::optional<ModelConfigDefaults> BuiltinModelConfigDefaults(std::string_view model_type);

// The role of parameter `param_name` (as named in the checkpoint, e.g.
// "model.layers.0.self_attn.q_proj.weight") in an AutoTP run of model family `model_type`.
// `tied_word_embeddings`: the model config's tie_word_embeddings (a tied lm_head stays whole, as
// the embedding it shares; an untied one is column-parallel).
// Errors (kUnsupported, naming the parameter or type): an unlisted model_type, a parameter no rule
// of the family matches.
Result<AutoTpRole> BuiltinAutoTpRule(std::string_view model_type, std::string_view param_name,
                                     bool tied_word_embeddings);

}  // namespace reshard::layout
