// libFuzzer harness: the checkpoint readers (ucp/: param state dicts and bare tensors, step.pt,
// universal_checkpoint_info with its affine maps, optimizer_state.pt, the model-states files; native/: the
// optimizer files' flat partitions, slice mappings and steps) and the planner behind them. The input's first byte
// picks one file of a committed checkpoint (the tiny ZeRO-1 one, the ZeRO-3 bare-tensor one, the AutoTP Llama
// with its affine_map, a native ZeRO-1 or ZeRO-3 one, or the AutoTP Llama's native TP 2 save, whose TP slices the
// native reader joins), the rest replaces that file's bytes, and the whole
// checkpoint is opened, planned for another layout and read to the last byte (with a native source's universal
// view and every source's model.safetensors), as `materialize` and the mount would.
#include <cstddef>
#include <cstdint>
#include <memory>

#include "tests/fuzz/fuzz_common.h"

namespace {

struct Case {
  std::unique_ptr<reshard::fuzz::ScratchCheckpoint> checkpoint;
  reshard::plan::TargetOverrides overrides;
};

Case MakeCase(const std::string& ucp, int dp, int tp) {
  Case c{std::make_unique<reshard::fuzz::ScratchCheckpoint>(ucp), {}};
  c.overrides.dp_size = dp;
  c.overrides.tp_size = tp;
  c.overrides.lp_dtype = reshard::format::DType::kBFloat16;
  return c;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static Case cases[] = {MakeCase(reshard::fuzz::TinyUcp(), 4, 1),     MakeCase(reshard::fuzz::Zero3Ucp(), 3, 1),
                         MakeCase(reshard::fuzz::LlamaUcp(), 2, 1),    MakeCase(reshard::fuzz::TinyNative(), 3, 1),
                         MakeCase(reshard::fuzz::Zero3Native(), 4, 1), MakeCase(reshard::fuzz::LlamaNative(), 2, 1)};
  constexpr size_t kCases = sizeof(cases) / sizeof(cases[0]);
  if (size < 2) return 0;
  Case& c = cases[data[0] % kCases];
  c.checkpoint->Replace(data[1], data + 2, size - 2);
  (void)reshard::fuzz::PlanAndReadAll(c.checkpoint->root(), nullptr, c.overrides);
  c.checkpoint->Restore();
  return 0;
}
