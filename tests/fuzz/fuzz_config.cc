// libFuzzer harness: the target readers (plan/target_config.h): a DeepSpeed ds_config.json and a Hugging Face
// config.json, as `--ds-config` and `--model-config` take them. The input is the ds_config text, a NUL byte, and
// the model config text; both are parsed as the CLI parses them, and a target that resolves is planned and read
// in full over the committed AutoTP Llama checkpoint (TP, DP, ZeRO stage, dtypes, AutoTP shard sizes all come
// from the two configs).
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <utility>
#include <string_view>

#include <nlohmann/json.hpp>

#include "tests/fuzz/fuzz_common.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  size_t split = input.find('\0');
  std::string_view ds_text = input.substr(0, split);
  std::string_view model_text = split == std::string_view::npos ? std::string_view() : input.substr(split + 1);
  auto ds_config = nlohmann::ordered_json::parse(ds_text, nullptr, /*allow_exceptions=*/false,
                                                 /*ignore_comments=*/true);
  if (ds_config.is_discarded()) return 0;
  reshard::plan::ModelConfig model;
  if (!model_text.empty()) {
    auto model_json = nlohmann::ordered_json::parse(model_text, nullptr, false, true);
    if (model_json.is_discarded()) return 0;
    auto parsed = reshard::plan::ParseModelConfig(model_json);
    if (!parsed.ok()) return 0;
    model = *parsed;
  }
  // Opened once: the configs are the input here, and re-reading 88 unchanged files per input made this harness
  // ~370 exec/s.
  static const reshard::ucp::UniversalCheckpoint checkpoint = [] {
    auto opened = reshard::ucp::UniversalCheckpoint::Open(reshard::fuzz::LlamaUcp());
    if (!opened.ok()) std::abort();
    return std::move(*opened);
  }();
  (void)reshard::fuzz::PlanAndReadAll(checkpoint, ds_config, {}, model);
  return 0;
}
