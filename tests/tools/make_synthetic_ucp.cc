// make_synthetic_ucp: writes a synthetic DeepSpeed universal checkpoint with Llama-like shapes,
// for the benchmark (scripts/bench.sh) and tests/integration/test_synthetic_ucp.py.
//
//   make_synthetic_ucp OUT_DIR --hidden H --layers L [--vocab V] [--intermediate I]
//   make_synthetic_ucp OUT_DIR --size-gb X [--vocab V]          H, L, I picked for ~X GB of states
//   common: [--tag global_step100] [--source-dp 8]
//
// What it writes is what DeepSpeed 0.19.8's ds_to_universal makes of a bf16 ZeRO-1 run without
// tensor or pipeline parallelism (deepspeed_universal.md §1; the same keys, order and pickled
// forms as examples/tiny/universal):
//   OUT_DIR/latest_universal                       "<tag>_universal", no newline, written last
//   OUT_DIR/<tag>_universal/mp_rank_00_model_states.pt
//       module: OrderedDict of bf16 tensors, views of one storage like a bf16 flat buffer;
//       param_shapes: one param group holding every parameter in module order
//   OUT_DIR/<tag>_universal/zero/optimizer_state.pt
//   OUT_DIR/<tag>_universal/zero/<name>/{fp32,exp_avg,exp_avg_sq}.pt  {'cat_dim': 0, 'param': T}
//   OUT_DIR/<tag>_universal/zero/<name>/step.pt                         0-d float32 tensor
// Tensor bytes are deterministic pseudo-random values from a counter-based hash (element i of
// each (parameter, state) stream is computable alone), produced in blocks and written with
// VirtualFile's 1 MiB sequential writes; a module weight is the bf16 rounding of its fp32 master.
// The folders are created as needed and existing files overwritten; a crash leaves no
// latest_universal, so callers can tell a complete checkpoint from a partial one.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <bit>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include "reshard/base/status.h"
#include "reshard/base/unique_fd.h"
#include "reshard/format/pickle_value.h"
#include "reshard/format/torch_archive_writer.h"
#include "reshard/format/torch_tensor.h"
#include "reshard/plan/python_values.h"
#include "reshard/view/dtype_convert.h"
#include "reshard/view/virtual_file.h"

namespace {

using reshard::Result;
using reshard::Status;
namespace format = reshard::format;
namespace plan = reshard::plan;
namespace view = reshard::view;
using format::NodeId;
using format::PickleTree;

constexpr int64_t kGlobalSteps = 100;
constexpr uint64_t kStateBytesPerParam = 12;  // fp32 + exp_avg + exp_avg_sq

struct ModelShape {
  int64_t hidden = 0;
  int64_t layers = 0;
  int64_t vocab = 32000;
  int64_t intermediate = 0;  // 0: Llama's rule, LlamaIntermediate(hidden)
};

struct Param {
  std::string name;
  std::vector<int64_t> dims;
  uint64_t numel = 0;
};

// Llama's MLP width: 2/3 of 4 * hidden, rounded up to a multiple of 256 (11008 for 4096).
int64_t LlamaIntermediate(int64_t hidden) { return (8 * hidden / 3 + 255) / 256 * 256; }

// The trainable parameters of a Llama decoder (MHA, untied head) in named_parameters() order.
std::vector<Param> LlamaParams(const ModelShape& m) {
  const int64_t h = m.hidden, i = m.intermediate;
  std::vector<std::pair<std::string, std::vector<int64_t>>> named = {{"model.embed_tokens.weight", {m.vocab, h}}};
  for (int64_t l = 0; l < m.layers; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    for (const char* proj : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      named.push_back({p + "self_attn." + proj + ".weight", {h, h}});
    }
    named.push_back({p + "mlp.gate_proj.weight", {i, h}});
    named.push_back({p + "mlp.up_proj.weight", {i, h}});
    named.push_back({p + "mlp.down_proj.weight", {h, i}});
    named.push_back({p + "input_layernorm.weight", {h}});
    named.push_back({p + "post_attention_layernorm.weight", {h}});
  }
  named.push_back({"model.norm.weight", {h}});
  named.push_back({"lm_head.weight", {m.vocab, h}});
  std::vector<Param> params;
  for (auto& [name, dims] : named) {
    uint64_t numel = 1;
    for (int64_t d : dims) numel *= static_cast<uint64_t>(d);
    params.push_back({std::move(name), std::move(dims), numel});
  }
  return params;
}

uint64_t PerLayerParams(int64_t h, int64_t i) { return static_cast<uint64_t>(4 * h * h + 3 * h * i + 2 * h); }

// Shapes for about `size_gb` * 1e9 state bytes at `vocab`: the widest hidden size (a multiple of
// 256) whose layers, filling what the embedding and head leave, number at least hidden / 128 (the
// depth-to-width ratio of Llama 7B and 70B), so small sizes get many layers, not one fat one.
// Below the smallest shape (hidden 256, one layer: about 0.2 GB at vocab 32000) it returns that.
ModelShape PickShape(double size_gb, int64_t vocab) {
  const double target = size_gb * 1e9 / kStateBytesPerParam;
  ModelShape best{256, 1, vocab, LlamaIntermediate(256)};
  for (int64_t h = 256; h <= 16384; h += 256) {
    const int64_t i = LlamaIntermediate(h);
    const double rest = target - static_cast<double>(2 * vocab * h + h);
    const auto layers = static_cast<int64_t>(std::llround(rest / static_cast<double>(PerLayerParams(h, i))));
    if (layers < std::max<int64_t>(1, h / 128)) {
      if (h == 256) best.layers = std::max<int64_t>(1, layers);
      break;
    }
    best = {h, layers, vocab, i};
  }
  return best;
}

// ---- tensor bytes -------------------------------------------------------------------------------

// lowbias32 (Chris Wellons' xorshift-multiply integer hash): full avalanche, branch-free, and
// vectorisable, so a block of elements costs about a cycle each.
inline uint32_t Mix(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// One (parameter, state) stream: element i is a float in [lo, lo + span), from Mix(i ^ key).
// Streams repeat after 2^32 elements, which no benchmark tensor reaches.
struct Stream {
  uint32_t key = 0;
  float lo = 0;
  float span = 1;

  void Generate(uint64_t first, float* out, size_t n) const {
    const auto base = static_cast<uint32_t>(first);
    for (size_t k = 0; k < n; ++k) {
      // 23 random mantissa bits under exponent 0: a float in [1, 2).
      const float unit = std::bit_cast<float>(0x3F800000U | (Mix((base + static_cast<uint32_t>(k)) ^ key) >> 9));
      out[k] = (unit - 1.0f) * span + lo;
    }
  }
};

enum class State : uint32_t { kFp32, kExpAvg, kExpAvgSq };

Stream StateStream(size_t param, State state) {
  const uint32_t key = Mix(static_cast<uint32_t>(param) * 4 + static_cast<uint32_t>(state) + 1);
  switch (state) {
    case State::kFp32: return {key, -0.05f, 0.1f};
    case State::kExpAvg: return {key, -1e-3f, 2e-3f};
    case State::kExpAvgSq: return {key, 0.0f, 1e-6f};
  }
  return {};
}

constexpr size_t kBlockElems = 16384;

// Writes bytes [offset, offset + length) of an array of `item`-byte elements (item <= 4), where
// produce(first, n, out) writes elements [first, first + n) to `out`; works block by block, so
// any byte range is served, whatever its alignment.
template <typename Produce>
void FillBytes(size_t item, uint64_t offset, uint8_t* out, size_t length, Produce&& produce) {
  alignas(64) static thread_local std::array<uint8_t, kBlockElems * 4> block;
  while (length > 0) {
    const uint64_t first = offset / item;
    const size_t skip = offset % item;
    const size_t n = std::min<uint64_t>(kBlockElems, (skip + length + item - 1) / item);
    produce(first, n, block.data());
    const size_t take = std::min(length, n * item - skip);
    std::memcpy(out, block.data() + skip, take);
    out += take;
    offset += take;
    length -= take;
  }
}

// ---- files --------------------------------------------------------------------------------------

Status WriteArchive(const std::filesystem::path& path, const PickleTree& tree,
                    const std::vector<format::ArchiveStorageSpec>& storages, const view::DataFill& fill) {
  RS_ASSIGN_OR_RETURN(const format::TorchArchiveLayout layout,
                      format::LayoutTorchArchive(tree, storages, 64, path.stem().string()));
  const reshard::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return reshard::ErrnoError(path.string(), errno);
  // Records are numbered from layout.first_storage_entry; callers see storage indices.
  auto by_storage = [&](uint32_t record, uint64_t offset, uint8_t* out, size_t length) {
    return fill(record - layout.first_storage_entry, offset, out, length);
  };
  return view::WriteAll(layout.zip.file, by_storage, fd.get()).Annotate(path.string());
}

Status WriteText(const std::filesystem::path& path, const std::string& text) {
  const reshard::UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  if (!fd.valid()) return reshard::ErrnoError(path.string(), errno);
  if (::write(fd.get(), text.data(), text.size()) != static_cast<ssize_t>(text.size())) {
    return reshard::ErrnoError(path.string(), errno);
  }
  return Status::Ok();
}

Status MakeDirs(const std::filesystem::path& dir) {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) return reshard::IoError(dir.string() + ": " + error.message());
  return Status::Ok();
}

// A contiguous tensor of `dims` starting `storage_offset` elements into storage `key`, which holds
// `storage_numel` elements of `dtype`.
Result<NodeId> Tensor(PickleTree& tree, format::DType dtype, const std::vector<int64_t>& dims,
                      const std::string& key, uint64_t storage_numel, int64_t storage_offset,
                      bool requires_grad) {
  format::TensorRef t;
  t.storage.key = key;
  t.storage.dtype = dtype;
  t.storage.nbytes = storage_numel * format::ItemSize(dtype);
  t.dtype = dtype;
  t.shape = dims;
  t.stride.assign(dims.size(), 1);
  for (size_t d = dims.size(); d-- > 1;) t.stride[d - 1] = t.stride[d] * dims[d];
  t.storage_offset = storage_offset;
  t.requires_grad = requires_grad;
  return format::AddTensor(tree, t);
}

nlohmann::ordered_json DsConfig(int64_t source_dp) {
  return {
      {"train_batch_size", source_dp},
      {"train_micro_batch_size_per_gpu", 1},
      {"gradient_accumulation_steps", 1},
      {"gradient_clipping", 1.0},
      {"steps_per_print", 1000},
      {"optimizer",
       {{"type", "AdamW"},
        {"params",
         {{"lr", 3e-4}, {"betas", {0.9, 0.95}}, {"eps", 1e-8}, {"weight_decay", 0.1}, {"torch_adam", true}}}}},
      {"scheduler",
       {{"type", "WarmupLR"},
        {"params", {{"warmup_min_lr", 0.0}, {"warmup_num_steps", 10}, {"warmup_type", "linear"}}}}},
      {"zero_optimization", {{"stage", 1}}},
      {"bf16", {{"enabled", true}}},
      {"fp16", {{"enabled", false}}},
  };
}

// mp_rank_00_model_states.pt: the module as bf16 views of one storage (the bf16 flat buffer a
// ZeRO-1 bf16 run saves), and the engine's bookkeeping in DeepSpeed's key order.
Status WriteModelStates(const std::filesystem::path& path, const std::vector<Param>& params, int64_t source_dp) {
  PickleTree tree;
  std::vector<uint64_t> starts;  // element offset of each parameter in the storage, then the total
  uint64_t total = 0;
  for (const Param& p : params) {
    starts.push_back(total);
    total += p.numel;
  }
  starts.push_back(total);
  std::vector<std::pair<NodeId, NodeId>> module, shapes;
  for (size_t k = 0; k < params.size(); ++k) {
    RS_ASSIGN_OR_RETURN(const NodeId t, Tensor(tree, format::DType::kBFloat16, params[k].dims, "0", total,
                                               static_cast<int64_t>(starts[k]), false));
    module.emplace_back(tree.AddStr(params[k].name), t);
    shapes.emplace_back(tree.AddStr(params[k].name), plan::AddTorchSize(tree, params[k].dims));
  }
  const NodeId root = plan::AddStrDict(
      tree, {
                {"module", plan::AddOrderedDict(tree, module)},
                {"buffer_names", tree.AddList()},
                {"optimizer", tree.AddNone()},
                {"param_shapes", tree.AddList({plan::AddOrderedDict(tree, shapes)})},
                {"frozen_param_shapes", tree.AddNone()},
                {"shared_params", tree.AddDict()},
                {"frozen_param_fragments", tree.AddNone()},
                {"lr_scheduler", plan::AddStrDict(tree, {{"last_batch_iteration", tree.AddInt(kGlobalSteps - 1)}})},
                {"data_sampler", tree.AddNone()},
                {"random_ltd", tree.AddNone()},
                {"skipped_steps", tree.AddInt(0)},
                {"global_steps", tree.AddInt(kGlobalSteps)},
                {"global_samples", tree.AddInt(kGlobalSteps * source_dp)},
                {"dp_world_size", tree.AddInt(source_dp)},
                {"mp_world_size", tree.AddInt(1)},
                {"checkpoint_parallel_dimensions",
                 plan::AddStrDict(tree, {{"pp_degree", tree.AddInt(1)}, {"tp_degree", tree.AddInt(1)}})},
                {"ds_config", plan::AddJson(tree, DsConfig(source_dp))},
                {"ds_version", tree.AddStr("0.19.8")},
            });
  tree.set_root(root);

  // Storage element e belongs to the parameter whose range holds it: its fp32 master, rounded.
  auto produce = [&](uint64_t first, size_t n, uint8_t* out) {
    alignas(64) static thread_local std::array<float, kBlockElems> fp32;
    while (n > 0) {
      const size_t k = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), first) - starts.begin()) - 1;
      const size_t run = std::min<uint64_t>(n, starts[k + 1] - first);
      StateStream(k, State::kFp32).Generate(first - starts[k], fp32.data(), run);
      view::Float32ToBFloat16(fp32.data(), reinterpret_cast<uint16_t*>(out), run);
      out += run * 2;
      first += run;
      n -= run;
    }
  };
  auto fill = [&](uint32_t, uint64_t offset, uint8_t* out, size_t length) {
    FillBytes(2, offset, out, length, produce);
    return Status::Ok();
  };
  return WriteArchive(path, tree, {{"0", total * 2}}, fill);
}

// zero/optimizer_state.pt: the common optimizer state of a ZeRO-1 run with one param group.
Status WriteOptimizerState(const std::filesystem::path& path, size_t num_params, int64_t source_dp) {
  PickleTree tree;
  const NodeId scaler = tree.AddNewObj(tree.AddGlobal("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
                                       tree.AddTuple({}));
  tree.mutable_node(scaler).state =
      plan::AddStrDict(tree, {{"cur_scale", tree.AddFloat(1.0)}, {"dynamic", tree.AddBool(false)}});
  const NodeId group = plan::AddStrDict(tree, {
                                                  {"lr", tree.AddFloat(3e-4)},
                                                  {"weight_decay", tree.AddFloat(0.1)},
                                                  {"betas", tree.AddList({tree.AddFloat(0.9), tree.AddFloat(0.95)})},
                                                  {"eps", tree.AddFloat(1e-8)},
                                                  {"amsgrad", tree.AddBool(false)},
                                                  {"maximize", tree.AddBool(false)},
                                                  {"foreach", tree.AddNone()},
                                                  {"capturable", tree.AddBool(false)},
                                                  {"differentiable", tree.AddBool(false)},
                                                  {"fused", tree.AddNone()},
                                                  {"decoupled_weight_decay", tree.AddBool(true)},
                                                  {"params", plan::AddIntList(tree, {0})},
                                              });
  tree.set_root(plan::AddStrDict(
      tree, {
                {"loss_scaler", scaler},
                {"dynamic_loss_scale", tree.AddBool(false)},
                {"overflow", tree.AddBool(false)},
                {"clip_grad", tree.AddFloat(1.0)},
                {"zero_stage", plan::AddZeroStageEnum(tree, 1)},
                {"group_paddings", plan::AddIntList(tree, {0})},
                {"param_alignment_paddings",
                 tree.AddList({plan::AddIntList(tree, std::vector<int64_t>(num_params, 0))})},
                {"partition_count", plan::AddIntList(tree, {source_dp})},
                {"ds_version", tree.AddStr("0.19.8")},
                {"param_groups", tree.AddList({group})},
            }));
  return WriteArchive(path, tree, {}, [](uint32_t, uint64_t, uint8_t*, size_t) { return Status::Ok(); });
}

// zero/<name>/<state>.pt: {'cat_dim': 0, 'param': the full tensor}, as the TP=1 merge saves it.
Status WriteStateFile(const std::filesystem::path& path, const Param& param, size_t index, State state) {
  PickleTree tree;
  RS_ASSIGN_OR_RETURN(const NodeId t, Tensor(tree, format::DType::kFloat32, param.dims, "0", param.numel, 0,
                                             state == State::kFp32));
  tree.set_root(plan::AddStrDict(tree, {{"cat_dim", tree.AddInt(0)}, {"param", t}}));
  const Stream stream = StateStream(index, state);
  auto fill = [&](uint32_t, uint64_t offset, uint8_t* out, size_t length) {
    FillBytes(4, offset, out, length,
              [&](uint64_t first, size_t n, uint8_t* block) { stream.Generate(first, reinterpret_cast<float*>(block), n); });
    return Status::Ok();
  };
  return WriteArchive(path, tree, {{"0", param.numel * 4}}, fill);
}

// zero/<name>/step.pt: torch.optim.AdamW's step, a bare 0-d float32 tensor.
Status WriteStep(const std::filesystem::path& path) {
  PickleTree tree;
  RS_ASSIGN_OR_RETURN(const NodeId t, Tensor(tree, format::DType::kFloat32, {}, "0", 1, 0, false));
  tree.set_root(t);
  const float step = static_cast<float>(kGlobalSteps);
  auto fill = [&](uint32_t, uint64_t offset, uint8_t* out, size_t length) {
    std::memcpy(out, reinterpret_cast<const uint8_t*>(&step) + offset, length);
    return Status::Ok();
  };
  return WriteArchive(path, tree, {{"0", 4}}, fill);
}

struct Options {
  std::string out_dir;
  ModelShape shape;
  double size_gb = 0;
  std::string tag = "global_step100";
  int64_t source_dp = 8;
};

Status Run(Options options) {
  if (options.size_gb > 0) options.shape = PickShape(options.size_gb, options.shape.vocab);
  ModelShape& m = options.shape;
  if (m.intermediate == 0) m.intermediate = LlamaIntermediate(m.hidden);
  const auto started = std::chrono::steady_clock::now();
  const std::vector<Param> params = LlamaParams(m);
  const std::filesystem::path root(options.out_dir);
  const std::filesystem::path tag_dir = root / (options.tag + "_universal");
  // A checkpoint being rewritten is incomplete until latest_universal names it again.
  std::error_code error;
  std::filesystem::remove(root / "latest_universal", error);
  if (error) return reshard::IoError((root / "latest_universal").string() + ": " + error.message());

  RS_RETURN_IF_ERROR(MakeDirs(tag_dir / "zero"));
  RS_RETURN_IF_ERROR(WriteModelStates(tag_dir / "mp_rank_00_model_states.pt", params, options.source_dp));
  RS_RETURN_IF_ERROR(WriteOptimizerState(tag_dir / "zero" / "optimizer_state.pt", params.size(), options.source_dp));
  uint64_t numel = 0;
  for (size_t k = 0; k < params.size(); ++k) {
    const std::filesystem::path dir = tag_dir / "zero" / params[k].name;
    RS_RETURN_IF_ERROR(MakeDirs(dir));
    RS_RETURN_IF_ERROR(WriteStateFile(dir / "fp32.pt", params[k], k, State::kFp32));
    RS_RETURN_IF_ERROR(WriteStateFile(dir / "exp_avg.pt", params[k], k, State::kExpAvg));
    RS_RETURN_IF_ERROR(WriteStateFile(dir / "exp_avg_sq.pt", params[k], k, State::kExpAvgSq));
    RS_RETURN_IF_ERROR(WriteStep(dir / "step.pt"));
    numel += params[k].numel;
  }
  RS_RETURN_IF_ERROR(WriteText(root / "latest_universal", options.tag + "_universal"));

  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  std::printf("%s: hidden %lld, layers %lld, vocab %lld, intermediate %lld: %zu params, %llu elements, "
              "%.3f GB of fp32 states, written in %.1f s\n",
              tag_dir.c_str(), static_cast<long long>(m.hidden), static_cast<long long>(m.layers),
              static_cast<long long>(m.vocab), static_cast<long long>(m.intermediate), params.size(),
              static_cast<unsigned long long>(numel), static_cast<double>(numel * kStateBytesPerParam) / 1e9,
              seconds);
  return Status::Ok();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"Write a synthetic DeepSpeed universal checkpoint with Llama-like shapes (benchmark tool)"};
  Options options;
  app.add_option("OUT_DIR", options.out_dir, "Folder for latest_universal and <tag>_universal/")->required();
  CLI::Option* size = app.add_option("--size-gb", options.size_gb, "Pick hidden/layers for about X GB of states")
                          ->check(CLI::PositiveNumber);
  CLI::Option* hidden = app.add_option("--hidden", options.shape.hidden, "Hidden size")->check(CLI::PositiveNumber);
  CLI::Option* layers = app.add_option("--layers", options.shape.layers, "Decoder layers")->check(CLI::PositiveNumber);
  CLI::Option* intermediate = app.add_option("--intermediate", options.shape.intermediate,
                                             "MLP width (default: Llama's, 8/3 hidden rounded up to 256)")
                                  ->check(CLI::PositiveNumber);
  app.add_option("--vocab", options.shape.vocab, "Vocabulary size")->check(CLI::PositiveNumber)->capture_default_str();
  app.add_option("--tag", options.tag, "Checkpoint tag; the folder is <tag>_universal")->capture_default_str();
  app.add_option("--source-dp", options.source_dp, "DP world size recorded as the source's")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  size->excludes(hidden)->excludes(layers)->excludes(intermediate);
  hidden->needs(layers);
  layers->needs(hidden);
  CLI11_PARSE(app, argc, argv);
  if (size->count() == 0 && hidden->count() == 0) {
    std::fprintf(stderr, "make_synthetic_ucp: error: give --size-gb, or --hidden and --layers\n");
    return 1;
  }

  const Status status = Run(options);
  if (!status.ok()) {
    std::fprintf(stderr, "make_synthetic_ucp: error: %s\n", status.message().c_str());
    return 1;
  }
  return 0;
}
