// libFuzzer harness: the parameter-folder reader (ucp/param_state.h: the state dicts or bare tensors of
// fp32/exp_avg/exp_avg_sq.pt, step.pt, the category keys cat_dim, vocab_tensor, sub-parameter shapes, ...). The
// input's first byte picks one committed parameter folder (dict format with step.pt, ZeRO-3 bare tensors, a
// vocabulary tensor, category keys), the second one of its files, the rest replaces that file; the folder is
// indexed and every state it accepts must lie inside its file. Much faster than fuzz_checkpoint, which reaches
// the same reader only through a whole checkpoint.
#include <sys/stat.h>

#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "reshard/ucp/param_state.h"
#include "tests/fuzz/fuzz_common.h"

namespace {

void CheckInside(const reshard::ucp::StateTensor& state) {
  struct stat st {};
  if (stat(state.path.c_str(), &st) != 0) std::abort();
  const auto size = static_cast<uint64_t>(st.st_size);
  if (state.data_offset > size || state.nbytes > size - state.data_offset) std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // In the order of PARAM_FOLDERS in make_seeds.py.
  static const std::string kFolders[] = {
      reshard::fuzz::SourcePath("examples/tiny/universal/global_step3_universal/zero/embed.weight"),
      reshard::fuzz::SourcePath("tests/fixtures/tiny_zero3/universal/global_step3_universal/zero/fc1.weight"),
      reshard::fuzz::SourcePath("examples/tiny_llama_tp2/universal/global_step3_universal/zero/model.embed_tokens.weight"),
      reshard::fuzz::SourcePath(
          "examples/tiny_llama_tp2/universal/global_step3_universal/zero/model.layers.0.self_attn.q_proj.weight"),
      reshard::fuzz::SourcePath("tests/fixtures/ucp_edge/categories/zero/fc1.weight"),
  };
  static std::unique_ptr<reshard::fuzz::ScratchCheckpoint> scratch[std::size(kFolders)];
  if (size < 2) return 0;
  const size_t pick = data[0] % std::size(kFolders);
  if (!scratch[pick]) scratch[pick] = std::make_unique<reshard::fuzz::ScratchCheckpoint>(kFolders[pick]);
  reshard::fuzz::ScratchCheckpoint& folder = *scratch[pick];
  folder.Replace(data[1], data + 2, size - 2);
  auto entry = reshard::ucp::IndexParamFolder(folder.root(), "param");
  if (entry.ok()) {
    for (const auto& [key, state] : entry->states) CheckInside(state);
    if (entry->step && entry->step->is_tensor) CheckInside(entry->step->tensor);
  }
  folder.Restore();
  return 0;
}
