#include "reshard/layout/tp_partition.h"

#include <catch2/catch.hpp>
#include <optional>
#include <random>
#include <string>
#include <vector>

namespace reshard::layout {
namespace {

using Shape = std::vector<int64_t>;
using Indices = std::vector<int64_t>;

// ---- Brute-force reference: a tiny N-d array of universal element indices (-1 = zero padding),
// sliced element by element through multi-indices, the way torch's chunk/narrow/cat/pad do.
struct Arr {
  Shape shape;
  Indices data;
};

int64_t Numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

int64_t FlatIndex(const Shape& shape, const Shape& idx) {
  int64_t flat = 0;
  for (size_t k = 0; k < shape.size(); ++k) flat = flat * shape[k] + idx[k];
  return flat;
}

// Calls f(multi_index) for every element of `shape` in row-major order.
template <typename F>
void ForEachIndex(const Shape& shape, F&& f) {
  if (Numel(shape) == 0) return;
  Shape idx(shape.size(), 0);
  while (true) {
    f(idx);
    size_t k = shape.size();
    while (k > 0 && ++idx[k - 1] == shape[k - 1]) idx[--k] = 0;
    if (k == 0) return;
  }
}

Arr Iota(const Shape& shape) {
  Arr a{shape, Indices(static_cast<size_t>(Numel(shape)))};
  for (size_t i = 0; i < a.data.size(); ++i) a.data[i] = static_cast<int64_t>(i);
  return a;
}

Arr Narrow(const Arr& a, int dim, int64_t start, int64_t len) {
  Arr out{a.shape, {}};
  out.shape[static_cast<size_t>(dim)] = len;
  ForEachIndex(out.shape, [&](const Shape& idx) {
    Shape src = idx;
    src[static_cast<size_t>(dim)] += start;
    out.data.push_back(a.data[static_cast<size_t>(FlatIndex(a.shape, src))]);
  });
  return out;
}

// torch.chunk: ceil-sized chunks, possibly fewer than n.
std::vector<Arr> Chunk(const Arr& a, int64_t n, int dim) {
  const int64_t size = a.shape[static_cast<size_t>(dim)];
  const int64_t c = (size + n - 1) / n;
  std::vector<Arr> out;
  for (int64_t s = 0; s < size; s += c) out.push_back(Narrow(a, dim, s, std::min(c, size - s)));
  return out;
}

Arr Cat(const std::vector<Arr>& parts, int dim) {
  Arr out{parts.at(0).shape, {}};
  out.shape[static_cast<size_t>(dim)] = 0;
  for (const Arr& p : parts) out.shape[static_cast<size_t>(dim)] += p.shape[static_cast<size_t>(dim)];
  ForEachIndex(out.shape, [&](const Shape& idx) {
    Shape src = idx;
    size_t j = 0;
    while (src[static_cast<size_t>(dim)] >= parts[j].shape[static_cast<size_t>(dim)]) {
      src[static_cast<size_t>(dim)] -= parts[j++].shape[static_cast<size_t>(dim)];
    }
    out.data.push_back(parts[j].data[static_cast<size_t>(FlatIndex(parts[j].shape, src))]);
  });
  return out;
}

Arr PadRows(const Arr& a, int64_t rows) {  // F.pad(a, (0, 0, 0, rows)) on a 2-D tensor
  Arr out = a;
  out.shape[0] += rows;
  out.data.resize(static_cast<size_t>(Numel(out.shape)), -1);
  return out;
}

Arr View(const Arr& a, const Shape& shape) { return Arr{shape, a.data}; }

// ---- The code under test, expanded to the same form.
Indices Expand(const view::GatherList& list) {
  Indices out;
  view::ForEachRun(list, [&](uint64_t, uint64_t src, uint64_t n, bool zero) {
    for (uint64_t k = 0; k < n; ++k) out.push_back(zero ? -1 : static_cast<int64_t>(src + k));
  });
  return out;
}

TpSlice Slice(const Shape& full, const UcpCategory& cat, const AutoTpRestoreMeta* meta, int tp_size, int tp_rank,
              std::optional<int64_t> padded_vocab_rows = std::nullopt) {
  auto s = SliceForRank(full, cat, meta, padded_vocab_rows, tp_size, tp_rank);
  INFO(s.status().ToString());
  REQUIRE(s.ok());
  REQUIRE(view::NumElements(s->gather) == static_cast<uint64_t>(Numel(s->local_shape)));
  return *s;
}

void CheckSlice(const Shape& full, const UcpCategory& cat, const AutoTpRestoreMeta* meta, int tp_size, int tp_rank,
                const Arr& expected, std::optional<int64_t> padded_vocab_rows = std::nullopt) {
  INFO("T=" << tp_size << " t=" << tp_rank);
  const TpSlice s = Slice(full, cat, meta, tp_size, tp_rank, padded_vocab_rows);
  CHECK(s.local_shape == expected.shape);
  CHECK(Expand(s.gather) == expected.data);
}

Status SliceStatus(const Shape& full, const UcpCategory& cat, const AutoTpRestoreMeta* meta, int tp_size, int tp_rank,
                   std::optional<int64_t> padded_vocab_rows = std::nullopt) {
  return SliceForRank(full, cat, meta, padded_vocab_rows, tp_size, tp_rank).status();
}

UcpCategory CatDim(int d, int64_t n_sub_params = 1) {
  UcpCategory c;
  c.cat_dim = d;
  c.n_sub_params = n_sub_params;
  return c;
}

UcpCategory SubParams(std::vector<std::vector<int64_t>> shape, int partition_dim) {
  UcpCategory c;
  c.sub_param_shape = SubParamShape{std::move(shape), partition_dim};
  return c;
}

AutoTpRestoreMeta AutoTp(int partition_dim, Shape logical) {
  AutoTpRestoreMeta m;
  m.partition_dim = partition_dim;
  m.logical_shape = std::move(logical);
  return m;
}

TEST_CASE("Replicated categories are served whole on every rank", "[layout]") {
  for (const Shape& full : {Shape{4}, Shape{3, 5}, Shape{}, Shape{0, 7}}) {
    for (int tp_size : {1, 3, 4}) {
      for (int t = 0; t < tp_size; ++t) CheckSlice(full, UcpCategory{}, nullptr, tp_size, t, Iota(full));
    }
  }
  CHECK(IsReplicatedCategory(UcpCategory{}));
  CHECK_FALSE(IsReplicatedCategory(CatDim(0)));
  UcpCategory vocab;
  vocab.vocab_tensor = true;
  CHECK_FALSE(IsReplicatedCategory(vocab));
}

TEST_CASE("cat_dim 0, 1 and later dims chunk evenly like torch.chunk", "[layout]") {
  for (const Shape& full : {Shape{8, 4}, Shape{4, 8}, Shape{2, 6, 4}, Shape{12}}) {
    for (int dim = -1; dim < static_cast<int>(full.size()); ++dim) {
      const int d = dim < 0 ? dim + static_cast<int>(full.size()) : dim;
      for (int tp_size : {1, 2, 3, 4}) {
        if (full[static_cast<size_t>(d)] % tp_size != 0) continue;
        for (int t = 0; t < tp_size; ++t) {
          CheckSlice(full, CatDim(dim), nullptr, tp_size, t, Chunk(Iota(full), tp_size, d)[static_cast<size_t>(t)]);
        }
      }
    }
  }
  // A cat_dim 1 slice is one strided gather, not one piece per row.
  const TpSlice s = Slice({4, 8}, CatDim(1), nullptr, 4, 1);
  REQUIRE(s.gather.size() == 1);
  CHECK(s.gather[0] == view::Gather::Source(2, 2, 4, 8));
}

TEST_CASE("Vocab tensors: the worked example of 3.7 and the target padding", "[layout]") {
  UcpCategory vocab = CatDim(0);
  vocab.vocab_tensor = true;
  const Shape full{10, 4};  // stored with the source padding (12 rows at T0=2) already stripped
  // Default padding: smallest multiple of T; local rows 3, rows 10 and 11 are zeros (rank 3).
  for (int t = 0; t < 4; ++t) {
    CheckSlice(full, vocab, nullptr, 4, t, Chunk(PadRows(Iota(full), 2), 4, 0)[static_cast<size_t>(t)]);
  }
  const TpSlice last = Slice(full, vocab, nullptr, 4, 3);
  CHECK(last.local_shape == Shape{3, 4});
  CHECK(Expand(last.gather) == Indices{36, 37, 38, 39, -1, -1, -1, -1, -1, -1, -1, -1});
  // An explicit target padded vocab (Megatron pads to a multiple of 128 * T).
  for (int t = 0; t < 4; ++t) {
    CheckSlice(full, vocab, nullptr, 4, t, Chunk(PadRows(Iota(full), 6), 4, 0)[static_cast<size_t>(t)], 16);
  }
  CheckSlice(full, vocab, nullptr, 1, 0, PadRows(Iota(full), 2), 12);  // T=1 still pads
  // DeepSpeed's `F.shape == p.shape` shortcut: local rows == stored rows -> whole tensor on every rank.
  for (int t = 0; t < 2; ++t) CheckSlice(full, vocab, nullptr, 2, t, Iota(full), 20);
  // A vocab tensor written without cat_dim (replicated or affine branch) still splits on dim 0.
  UcpCategory bare;
  bare.vocab_tensor = true;
  CheckSlice(full, bare, nullptr, 4, 2, Chunk(PadRows(Iota(full), 2), 4, 0)[2]);
}

TEST_CASE("SwiGLU 2-sub-params: each half chunked, then concatenated", "[layout]") {
  const Shape full{16, 4};
  for (int tp_size : {1, 2, 4, 8}) {
    for (int t = 0; t < tp_size; ++t) {
      std::vector<Arr> parts;
      for (const Arr& half : Chunk(Iota(full), 2, 0)) parts.push_back(Chunk(half, tp_size, 0)[static_cast<size_t>(t)]);
      CheckSlice(full, CatDim(0, 2), nullptr, tp_size, t, Cat(parts, 0));
    }
  }
  // torch.chunk(3) of 10 rows is 4/4/2: every part splits at T=2, so DeepSpeed accepts it.
  for (int t = 0; t < 2; ++t) {
    std::vector<Arr> parts;
    for (const Arr& p : Chunk(Iota({10, 2}), 3, 0)) parts.push_back(Chunk(p, 2, 0)[static_cast<size_t>(t)]);
    CheckSlice({10, 2}, CatDim(0, 3), nullptr, 2, t, Cat(parts, 0));
  }
  CHECK(SliceStatus({16, 4}, CatDim(0, 2), nullptr, 3, 0).message() ==
        "T=3 does not divide sub-param 0 of size 8 (dim 0 of size 16 in 2 sub-params, cat_dim 0)");
}

// The loader's sub_param_shape rule: view, then narrow each sub-parameter and chunk it.
Arr SubParamReference(const Shape& full, const Shape& view_shape, int pd, const Indices& sizes, int tp_size, int t) {
  const Arr v = View(Iota(full), view_shape);
  std::vector<Arr> parts;
  int64_t off = 0;
  for (int64_t size : sizes) {
    parts.push_back(Chunk(Narrow(v, pd, off, size), tp_size, pd)[static_cast<size_t>(t)]);
    off += size;
  }
  return Cat(parts, pd);
}

TEST_CASE("Sub-params: q/k/v 8/4/4 at T=4 (3.7), other dims, -1 and foreign views", "[layout]") {
  for (int t = 0; t < 4; ++t) {
    CheckSlice({16, 4}, SubParams({{8, 4, 4}, {4}}, 0), nullptr, 4, t,
               SubParamReference({16, 4}, {16, 4}, 0, {8, 4, 4}, 4, t));
  }
  const TpSlice q = Slice({16, 4}, SubParams({{8, 4, 4}, {4}}, 0), nullptr, 4, 1);
  CHECK(Expand(q.gather) == Indices{8, 9, 10, 11, 12, 13, 14, 15, 36, 37, 38, 39, 52, 53, 54, 55});
  for (int t = 0; t < 2; ++t) {  // partition dim 1, -1 inferred, and a negative partition_dim
    CheckSlice({3, 8}, SubParams({{-1}, {4, 2, 2}}, 1), nullptr, 2, t,
               SubParamReference({3, 8}, {3, 8}, 1, {4, 2, 2}, 2, t));
    CheckSlice({3, 8}, SubParams({{3}, {4, 2, 2}}, -1), nullptr, 2, t,
               SubParamReference({3, 8}, {3, 8}, 1, {4, 2, 2}, 2, t));
  }
  // A 3-D view of a 2-D tensor maps back onto dim 0 of the full shape.
  const Arr ref = SubParamReference({16, 4}, {16, 2, 2}, 0, {8, 4, 4}, 4, 2);
  const TpSlice s = Slice({16, 4}, SubParams({{8, 4, 4}, {2}, {-1}}, 0), nullptr, 4, 2);
  CHECK(s.local_shape == Shape{4, 4});
  CHECK(Expand(s.gather) == ref.data);
  // A 2-D view of a 1-D tensor cannot: the local shape stays in view coordinates.
  CHECK(Slice({64}, SubParams({{8, 4, 4}, {4}}, 0), nullptr, 4, 0).local_shape == Shape{4, 4});
  CHECK(SliceStatus({16, 4}, SubParams({{8, 4, 4}, {4}}, 0), nullptr, 8, 0).message() ==
        "T=8 does not divide sub-parameter 1 of size 4 (sub_param_shape sizes [8, 4, 4], partition_dim 0)");
}

// _narrow_sub_params: rank t's width of every sub-parameter, concatenated.
Arr WidthsReference(const Shape& full, int pd, const Indices& sizes, const std::vector<Indices>& widths, int t) {
  std::vector<Arr> parts;
  int64_t off = 0;
  for (size_t j = 0; j < sizes.size(); ++j) {
    int64_t before = 0;
    for (int r = 0; r < t; ++r) before += widths[j][static_cast<size_t>(r)];
    parts.push_back(Narrow(Iota(full), pd, off + before, widths[j][static_cast<size_t>(t)]));
    off += sizes[j];
  }
  return Cat(parts, pd);
}

TEST_CASE("AutoTP uneven split: 10 over 4 ranks is 3,3,2,2 on dim 0 and dim 1", "[layout]") {
  auto sizes = GetShardSizeList(10, 4, "self_attn.o_proj", std::nullopt);
  REQUIRE(sizes.ok());
  REQUIRE(*sizes == Indices{3, 3, 2, 2});
  for (int pd : {0, 1}) {
    const Shape full = pd == 0 ? Shape{10, 3} : Shape{3, 10};
    AutoTpRestoreMeta meta = AutoTp(pd, full);
    meta.partition_sizes = *sizes;
    for (int t = 0; t < 4; ++t) CheckSlice(full, CatDim(pd), &meta, 4, t, WidthsReference(full, pd, {10}, {*sizes}, t));
  }
}

TEST_CASE("AutoTP: more ranks than KV heads gives zero-width ranks", "[layout]") {
  // k_proj of 2 KV heads of head_dim 4 over T=4: heads 1,1,0,0 -> rows 4,4,0,0.
  auto rows = GetShardSizeList(8, 4, "self_attn.k_proj", 2);
  REQUIRE(rows.ok());
  REQUIRE(*rows == Indices{4, 4, 0, 0});
  AutoTpRestoreMeta k = AutoTp(0, {8, 6});
  k.partition_sizes = *rows;
  CheckSlice({8, 6}, CatDim(0), &k, 4, 1, Narrow(Iota({8, 6}), 0, 4, 4));
  const TpSlice empty = Slice({8, 6}, CatDim(0), &k, 4, 3);
  CHECK(empty.local_shape == Shape{0, 6});
  CHECK(empty.gather.empty());
  // Fused q/k/v (8 query heads, 2 KV heads, head_dim 2) as sub-parameters on dim 0 and dim 1.
  auto widths = SubParamShardWidths({16, 4, 4}, 4, "self_attn.qkv_proj", 2);
  REQUIRE(widths.ok());
  REQUIRE(*widths == std::vector<Indices>{{8, 8, 0, 0}, {2, 2, 0, 0}, {2, 2, 0, 0}});
  for (int pd : {0, 1}) {
    const Shape full = pd == 0 ? Shape{24, 3} : Shape{3, 24};
    AutoTpRestoreMeta qkv = AutoTp(pd, full);
    qkv.sub_param_sizes = Indices{16, 4, 4};
    qkv.sub_param_shard_widths = *widths;
    for (int t = 0; t < 4; ++t) {
      CheckSlice(full, UcpCategory{}, &qkv, 4, t, WidthsReference(full, pd, {16, 4, 4}, *widths, t));
    }
  }
  // Random widths (some zero) over random shapes.
  std::mt19937 rng(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int tp_size = 1 + static_cast<int>(rng() % 4), pd = static_cast<int>(rng() % 2);
    Indices sizes;
    std::vector<Indices> w;
    int64_t dim = 0;
    const size_t n_sub = 1 + rng() % 3;
    for (size_t j = 0; j < n_sub; ++j) {
      w.emplace_back(static_cast<size_t>(tp_size));
      sizes.push_back(0);
      for (int64_t& x : w.back()) sizes.back() += x = rng() % 3;
      dim += sizes.back();
    }
    const Shape full = pd == 0 ? Shape{dim, 2} : Shape{3, dim};
    AutoTpRestoreMeta m = AutoTp(pd, full);
    m.sub_param_sizes = sizes;
    m.sub_param_shard_widths = w;
    for (int t = 0; t < tp_size; ++t) {
      CheckSlice(full, UcpCategory{}, &m, tp_size, t, WidthsReference(full, pd, sizes, w, t));
    }
  }
}

TEST_CASE("AutoTP shard sizes: kv-head rule, grain size and name bypasses", "[layout]") {
  auto list = [](int64_t total, int tp_size, const char* name, std::optional<int64_t> kv, int64_t grain = 1) {
    auto r = GetShardSizeList(total, tp_size, name, kv, grain);
    REQUIRE(r.ok());
    return *r;
  };
  CHECK(list(12, 2, "self_attn.v_proj", 3) == Indices{8, 4});  // 12 % 3 == 0: 2 heads, 1 head
  CHECK(list(10, 2, "self_attn.v_proj", 3) == Indices{5, 5});  // 10 % 3 != 0: near-even
  for (const char* bypass :
       {"model.layers.0.mlp.c_fc", "gate_proj", "up_proj", "down_proj", "experts.w2", "lm_head", "embed_out"}) {
    INFO(bypass);
    CHECK(list(12, 2, bypass, 3) == Indices{6, 6});
  }
  CHECK(list(12, 2, "model.lm_head", 3) == Indices{8, 4});  // "lm_head" is an exact match, not a substring
  CHECK(list(1000, 4, "o_proj", std::nullopt, 64) == Indices{256, 256, 256, 232});
  CHECK(list(30, 4, "o_proj", std::nullopt, 64) == Indices{8, 8, 7, 7});  // below one grain
  // A grain-split slice, checked element by element.
  const Indices sizes = list(200, 3, "o_proj", std::nullopt, 64);
  REQUIRE(sizes == Indices{64, 64, 72});
  AutoTpRestoreMeta m = AutoTp(1, {2, 200});
  m.partition_sizes = sizes;
  CheckSlice({2, 200}, CatDim(1), &m, 3, 2, Narrow(Iota({2, 200}), 1, 128, 72));
}

TEST_CASE("GetShardSize matches DeepSpeed 0.19.8 tp_shard.get_shard_size", "[layout]") {
  // Produced by /opt/reshardfs/venv/bin/python with, for each row (total, T, name, kv, grain):
  //   from deepspeed.module_inject.tp_shard import AutoTPMeta, get_shard_size
  //   [get_shard_size(total, T, AutoTPMeta(num_kv_heads=kv, tp_grain_size=grain), name, r) for r in range(T)]
  // (0.19.8 passes kv heads and grain in an AutoTPMeta, not module globals; the last row used name=None.)
  struct Row {
    int64_t total;
    int tp_size;
    const char* name;
    std::optional<int64_t> kv;
    int64_t grain;
    Indices sizes;
  };
  // clang-format off
  const std::vector<Row> rows = {
      {10, 4, "", std::nullopt, 1, {3, 3, 2, 2}},
      {10, 4, "self_attn.k_proj", 2, 1, {5, 5, 0, 0}},
      {8, 4, "self_attn.k_proj", 2, 1, {4, 4, 0, 0}},
      {4096, 3, "self_attn.q_proj", 8, 1, {1536, 1536, 1024}},
      {4096, 3, "mlp.down_proj", 8, 1, {1366, 1365, 1365}},
      {4096, 3, "mlp", 8, 1, {1366, 1365, 1365}},
      {4096, 3, "lm_head", 8, 1, {1366, 1365, 1365}},
      {4096, 3, "model.lm_head", 8, 1, {1536, 1536, 1024}},
      {4096, 3, "embed_out", 8, 1, {1366, 1365, 1365}},
      {4096, 3, "gate_proj", 8, 1, {1366, 1365, 1365}},
      {4096, 3, "experts.w1", 8, 1, {1366, 1365, 1365}},
      {100, 3, "x", std::nullopt, 64, {64, 0, 36}},
      {1000, 4, "", std::nullopt, 64, {256, 256, 256, 232}},
      {30, 4, "q", std::nullopt, 64, {8, 8, 7, 7}},
      {12, 4, "k_proj", 5, 1, {3, 3, 3, 3}},
      {7, 8, "", std::nullopt, 1, {1, 1, 1, 1, 1, 1, 1, 0}},
      {0, 4, "v_proj", 2, 1, {0, 0, 0, 0}},
      {96, 4, "attn", 6, 16, {32, 32, 16, 16}},
      {4100, 3, "o_proj", std::nullopt, 64, {1408, 1344, 1348}},
      {4096, 3, "", 8, 1, {1536, 1536, 1024}},
  };
  // clang-format on
  for (const Row& row : rows) {
    INFO(row.total << " T=" << row.tp_size << " '" << row.name << "' grain " << row.grain);
    for (int r = 0; r < row.tp_size; ++r) {
      auto s = GetShardSize(row.total, row.tp_size, row.name, r, row.kv, row.grain);
      REQUIRE(s.ok());
      CHECK(*s == row.sizes[static_cast<size_t>(r)]);
    }
  }
}

AffinePiece Piece(Shape shape, int64_t src, Shape src_strides, int64_t dest, Shape dest_strides) {
  return AffinePiece{std::move(shape), src, std::move(src_strides), dest, std::move(dest_strides), 1.0};
}

// affine.py segmented_map([6, 2], [(4, False), (2, True)], 0, 2, [[3, 1]]) and
// block_gather_map([4, 3], {0: [0, 2], 1: [1]}, 1, 1), as printed by their to_dict().
AffineMap SegmentedMap() {
  AffineMap m;
  m.logical_shape = {6, 2};
  m.ranks[0] = {{5, 2}, {Piece({3, 2}, 0, {2, 1}, 0, {2, 1}), Piece({2, 2}, 8, {2, 1}, 6, {2, 1})}};
  m.ranks[1] = {{3, 2}, {Piece({1, 2}, 6, {2, 1}, 0, {2, 1}), Piece({2, 2}, 8, {2, 1}, 2, {2, 1})}};
  return m;
}
AffineMap BlockMap() {
  AffineMap m;
  m.logical_shape = {4, 3};
  m.ranks[0] = {{4, 2}, {Piece({4, 1}, 0, {3, 1}, 0, {2, 1}), Piece({4, 1}, 2, {3, 1}, 1, {2, 1})}};
  m.ranks[1] = {{4, 1}, {Piece({4, 1}, 1, {3, 1}, 0, {1, 1})}};
  return m;
}

TEST_CASE("Golden: DeepSpeed 0.19.8 load_hp_checkpoint_state on a mock parameter", "[layout]") {
  // Produced by running the real universal_checkpoint.load_hp_checkpoint_state (torch 2.9.1, CPU)
  // for every rank on a mock lp parameter of the target local shape, with param = arange + 1 and
  // the category keys / ds_autotp_universal_checkpoint_meta shown below; values are element
  // indices, -1 = zero padding. The mock's local shapes follow the rules (vocab: [3, 4]; vocab_shape_equal:
  // [3, 2], i.e. the stored shape, padded 6 = 3 * T; AutoTP: the metadata's widths).
  struct Case {
    const char* name;
    Shape full;
    UcpCategory cat;
    std::optional<AutoTpRestoreMeta> meta;
    std::optional<int64_t> padded_vocab_rows;
    std::vector<Indices> ranks;
  };
  UcpCategory vocab = CatDim(0);
  vocab.vocab_tensor = true;
  AutoTpRestoreMeta sizes0 = AutoTp(0, {10, 3}), sizes1 = AutoTp(1, {2, 10});
  sizes0.partition_sizes = sizes1.partition_sizes = Indices{3, 3, 2, 2};
  AutoTpRestoreMeta widths0 = AutoTp(0, {16, 2}), widths1 = AutoTp(1, {2, 6}), replicated;
  widths0.sub_param_sizes = Indices{8, 4, 4};
  widths0.sub_param_shard_widths = {{4, 4, 0, 0}, {2, 2, 0, 0}, {2, 2, 0, 0}};
  widths1.sub_param_sizes = Indices{4, 2};
  widths1.sub_param_shard_widths = {{2, 1, 1}, {1, 1, 0}};
  replicated.replicated = true;
  AutoTpRestoreMeta segmented = AutoTp(0, {6, 2}), blocks = AutoTp(1, {4, 3});
  segmented.affine_map = SegmentedMap();
  blocks.affine_map = BlockMap();
  // clang-format off
  const std::vector<Case> cases = {
      {"replicated", {4}, {}, {}, {},
       {{0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}, {0, 1, 2, 3}}},
      {"cat0", {8, 4}, CatDim(0), {}, {},
       {{0, 1, 2, 3, 4, 5, 6, 7}, {8, 9, 10, 11, 12, 13, 14, 15}, {16, 17, 18, 19, 20, 21, 22, 23},
        {24, 25, 26, 27, 28, 29, 30, 31}}},
      {"cat1", {4, 8}, CatDim(1), {}, {},
       {{0, 1, 8, 9, 16, 17, 24, 25}, {2, 3, 10, 11, 18, 19, 26, 27}, {4, 5, 12, 13, 20, 21, 28, 29},
        {6, 7, 14, 15, 22, 23, 30, 31}}},
      {"vocab", {10, 4}, vocab, {}, {},
       {{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}, {12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23},
        {24, 25, 26, 27, 28, 29, 30, 31, 32, 33, 34, 35}, {36, 37, 38, 39, -1, -1, -1, -1, -1, -1, -1, -1}}},
      {"vocab_shape_equal", {3, 2}, vocab, {}, 6,
       {{0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}}},
      {"swiglu", {16, 4}, CatDim(0, 2), {}, {},
       {{0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 36, 37, 38, 39},
        {8, 9, 10, 11, 12, 13, 14, 15, 40, 41, 42, 43, 44, 45, 46, 47},
        {16, 17, 18, 19, 20, 21, 22, 23, 48, 49, 50, 51, 52, 53, 54, 55},
        {24, 25, 26, 27, 28, 29, 30, 31, 56, 57, 58, 59, 60, 61, 62, 63}}},
      {"qkv", {16, 4}, SubParams({{8, 4, 4}, {4}}, 0), {}, {},
       {{0, 1, 2, 3, 4, 5, 6, 7, 32, 33, 34, 35, 48, 49, 50, 51},
        {8, 9, 10, 11, 12, 13, 14, 15, 36, 37, 38, 39, 52, 53, 54, 55},
        {16, 17, 18, 19, 20, 21, 22, 23, 40, 41, 42, 43, 56, 57, 58, 59},
        {24, 25, 26, 27, 28, 29, 30, 31, 44, 45, 46, 47, 60, 61, 62, 63}}},
      {"qkv_dim1", {3, 8}, SubParams({{3}, {4, 2, 2}}, 1), {}, {},
       {{0, 1, 4, 6, 8, 9, 12, 14, 16, 17, 20, 22}, {2, 3, 5, 7, 10, 11, 13, 15, 18, 19, 21, 23}}},
      {"autotp_sizes_dim0", {10, 3}, CatDim(0), sizes0, {},
       {{0, 1, 2, 3, 4, 5, 6, 7, 8}, {9, 10, 11, 12, 13, 14, 15, 16, 17}, {18, 19, 20, 21, 22, 23},
        {24, 25, 26, 27, 28, 29}}},
      {"autotp_sizes_dim1", {2, 10}, CatDim(1), sizes1, {},
       {{0, 1, 2, 10, 11, 12}, {3, 4, 5, 13, 14, 15}, {6, 7, 16, 17}, {8, 9, 18, 19}}},
      {"autotp_widths_zero_rank", {16, 2}, {}, widths0, {},
       {{0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 24, 25, 26, 27},
        {8, 9, 10, 11, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31}, {}, {}}},
      {"autotp_widths_dim1", {2, 6}, {}, widths1, {},
       {{0, 1, 4, 6, 7, 10}, {2, 5, 8, 11}, {3, 9}}},
      {"autotp_even_chunk", {8, 2}, {}, AutoTp(0, {8, 2}), {},
       {{0, 1, 2, 3}, {4, 5, 6, 7}, {8, 9, 10, 11}, {12, 13, 14, 15}}},
      {"autotp_replicated", {3, 2}, CatDim(0), replicated, {},
       {{0, 1, 2, 3, 4, 5}, {0, 1, 2, 3, 4, 5}}},
      {"autotp_affine_segmented", {6, 2}, {}, segmented, {},
       {{0, 1, 2, 3, 4, 5, 8, 9, 10, 11}, {6, 7, 8, 9, 10, 11}}},
      {"autotp_affine_blocks_dim1", {4, 3}, {}, blocks, {},
       {{0, 2, 3, 5, 6, 8, 9, 11}, {1, 4, 7, 10}}},
  };
  // clang-format on
  for (const Case& c : cases) {
    INFO(c.name);
    const int tp_size = static_cast<int>(c.ranks.size());
    for (int t = 0; t < tp_size; ++t) {
      const TpSlice s = Slice(c.full, c.cat, c.meta ? &*c.meta : nullptr, tp_size, t, c.padded_vocab_rows);
      CHECK(Expand(s.gather) == c.ranks[static_cast<size_t>(t)]);
    }
  }
}

TEST_CASE("AutoTP metadata rule order and fall-through", "[layout]") {
  // With metadata, no replicated shortcut and no vocab padding: a bare dict chunks on dim 0.
  AutoTpRestoreMeta none;
  CheckSlice({4, 2}, UcpCategory{}, &none, 2, 1, Chunk(Iota({4, 2}), 2, 0)[1]);
  UcpCategory vocab = CatDim(0);
  vocab.vocab_tensor = true;
  CheckSlice({8, 2}, vocab, &none, 4, 3, Chunk(Iota({8, 2}), 4, 0)[3]);
  // An affine map for another rank or another numel is skipped; the rules below it apply.
  AutoTpRestoreMeta m = AutoTp(0, {6, 2});
  m.affine_map = SegmentedMap();
  m.affine_map->ranks.erase(1);
  CheckSlice({6, 2}, UcpCategory{}, &m, 2, 1, Chunk(Iota({6, 2}), 2, 0)[1]);
  m.affine_map = SegmentedMap();
  m.affine_map->logical_shape = {6, 3};
  CheckSlice({6, 2}, UcpCategory{}, &m, 2, 0, Chunk(Iota({6, 2}), 2, 0)[0]);
  // Version < 0.4: widths ignored, even split.
  AutoTpRestoreMeta old = AutoTp(0, {16, 2});
  old.version = 0.3;
  old.sub_param_sizes = Indices{8, 4, 4};
  old.sub_param_shard_widths = {{8, 0}, {4, 0}, {4, 0}};
  CheckSlice({16, 2}, UcpCategory{}, &old, 2, 1, SubParamReference({16, 2}, {16, 2}, 0, {8, 4, 4}, 2, 1));
  // sub_param_shape fallback when sub_param_sizes is unset; a legacy count (3, -1) is refused.
  AutoTpRestoreMeta spec = AutoTp(0, {16, 2});
  spec.sub_param_shape = std::vector<std::vector<int64_t>>{{8, 4, 4}, {-1}};
  spec.sub_param_shard_widths = {{4, 4}, {2, 2}, {2, 2}};
  CheckSlice({16, 2}, UcpCategory{}, &spec, 2, 0, SubParamReference({16, 2}, {16, 2}, 0, {8, 4, 4}, 2, 0));
  spec.sub_param_shape = std::vector<std::vector<int64_t>>{{3}, {-1}};
  CHECK(SliceStatus({16, 2}, UcpCategory{}, &spec, 2, 0).message() ==
        "AutoTP sub-parameter sizes [3] sum to 3, but dim 0 of logical shape [16, 2] is 16");
}

TEST_CASE("Refusals name the values", "[layout]") {
  auto code = [](const Status& s) { return s.code(); };
  const UcpCategory c0 = CatDim(0);
  CHECK(SliceStatus({8, 4}, c0, nullptr, 3, 0).message() == "T=3 does not divide dim 0 of size 8 (cat_dim 0)");
  CHECK(SliceStatus({8, 6}, CatDim(1), nullptr, 4, 0).message() == "T=4 does not divide dim 1 of size 6 (cat_dim 1)");
  CHECK(SliceStatus({8}, c0, nullptr, 0, 0).message() == "T=0 is outside [1, 65536]");
  CHECK(SliceStatus({8}, c0, nullptr, 2, 2).message() == "TP rank 2 is outside [0, T=2)");
  CHECK(code(SliceStatus({8}, c0, nullptr, 2, -1)) == StatusCode::kInvalidArgument);
  CHECK(SliceStatus({1, 1, 1, 1, 1, 1, 1, 1, 1}, c0, nullptr, 1, 0).message() ==
        "universal tensor shape [1, 1, 1, 1, 1, 1, 1, 1, 1] has 9 dims, more than 8");
  CHECK(code(SliceStatus({4, -1}, c0, nullptr, 1, 0)) == StatusCode::kInvalidArgument);
  CHECK(code(SliceStatus({int64_t{1} << 32, int64_t{1} << 32}, c0, nullptr, 1, 0)) == StatusCode::kOutOfRange);
  CHECK(SliceStatus({8}, CatDim(1), nullptr, 2, 0).message() == "cat_dim 1 is out of range for a 1-dim tensor");
  CHECK(code(SliceStatus({}, c0, nullptr, 1, 0)) == StatusCode::kInvalidArgument);
  // sub_param_shape that does not view the tensor, two -1s, -1 at partition_dim.
  CHECK(SliceStatus({16, 4}, SubParams({{8, 4, 4}, {5}}, 0), nullptr, 1, 0).message() ==
        "sub_param_shape [16, 5] cannot view the 64-element tensor of shape [16, 4]");
  CHECK(code(SliceStatus({16, 4}, SubParams({{-1}, {-1}}, 0), nullptr, 1, 0)) == StatusCode::kCorrupt);
  CHECK(code(SliceStatus({16, 4}, SubParams({{-1}, {4}}, 0), nullptr, 1, 0)) == StatusCode::kCorrupt);
  // Vocab: not 2-D, padding below the rows or not a multiple of T, split on dim 1.
  UcpCategory vocab = c0;
  vocab.vocab_tensor = true;
  CHECK(code(SliceStatus({10}, vocab, nullptr, 2, 0)) == StatusCode::kUnsupported);
  CHECK(code(SliceStatus({10, 2, 2}, vocab, nullptr, 2, 0)) == StatusCode::kUnsupported);
  CHECK(SliceStatus({10, 4}, vocab, nullptr, 4, 0, 8).message() == "padded vocab rows 8 < universal vocab rows 10");
  CHECK(SliceStatus({10, 4}, vocab, nullptr, 4, 0, 13).message() == "padded vocab rows 13 is not a multiple of T=4");
  vocab.cat_dim = 1;
  CHECK(code(SliceStatus({10, 4}, vocab, nullptr, 2, 0)) == StatusCode::kUnsupported);
  // AutoTP metadata.
  AutoTpRestoreMeta m = AutoTp(0, {8, 2});
  m.unsupported_reason = "fused qkv of codegen";
  CHECK(SliceStatus({8, 2}, c0, &m, 2, 0).message() ==
        "AutoTP parameter cannot be restored from a universal checkpoint: fused qkv of codegen");
  m = AutoTp(0, {8, 2});
  m.replicated = true;
  CHECK(code(SliceStatus({8, 2}, c0, &m, 2, 0)) == StatusCode::kInvalidArgument);
  m = AutoTp(0, {8, 3});
  CHECK(SliceStatus({8, 2}, c0, &m, 2, 0).message() ==
        "AutoTP logical_shape [8, 3] cannot view the 16-element tensor of shape [8, 2]");
  m = AutoTp(0, {6, 2});
  CHECK(SliceStatus({6, 2}, c0, &m, 4, 0).message() ==
        "T=4 does not divide dim 0 of size 6 (AutoTP partition_dim, no partition_sizes)");
  m.partition_sizes = Indices{3, 2};
  CHECK(SliceStatus({6, 2}, c0, &m, 2, 0).message() ==
        "AutoTP partition_sizes [3, 2] sum to 5, but dim 0 of logical shape [6, 2] is 6");
  m.partition_sizes = Indices{6};
  CHECK(code(SliceStatus({6, 2}, c0, &m, 2, 0)) == StatusCode::kInvalidArgument);
  m = AutoTp(0, {6, 2});
  m.sub_param_sizes = Indices{4, 2};
  m.sub_param_shard_widths = {{2, 2}, {2, 1}};
  CHECK(SliceStatus({6, 2}, c0, &m, 2, 0).message() ==
        "AutoTP shard widths [2, 1] of sub-parameter 1 sum to 3, not its size 2");
  m.sub_param_shard_widths = {{2, 2}};
  CHECK(code(SliceStatus({6, 2}, c0, &m, 2, 0)) == StatusCode::kInvalidArgument);
  m.sub_param_shard_widths = {{2, 2}, {1, 1, 0}};
  CHECK(code(SliceStatus({6, 2}, c0, &m, 2, 0)) == StatusCode::kInvalidArgument);
  m.version = 0.2;
  m.sub_param_sizes = Indices{3, 3};
  CHECK(code(SliceStatus({6, 2}, c0, &m, 2, 0)) == StatusCode::kInvalidArgument);
  // Affine maps: scaled pieces, gaps, overlaps, out-of-bounds pieces.
  m = AutoTp(0, {6, 2});
  m.affine_map = SegmentedMap();
  m.affine_map->ranks[0].pieces[1].scale = 0.5;
  CHECK(SliceStatus({6, 2}, c0, &m, 2, 0).message() ==
        "affine map rank 0 piece 1 has scale 0.5; a scaled shard is not a gather");
  m.affine_map = SegmentedMap();
  m.affine_map->ranks[0].pieces[1].dest_offset = 8;
  CHECK(code(SliceStatus({6, 2}, c0, &m, 2, 0)) == StatusCode::kInvalidArgument);  // past the shard
  m.affine_map->ranks[0].pieces[1].shape = {1, 2};
  CHECK(SliceStatus({6, 2}, c0, &m, 2, 0).message() == "affine map rank 0 leaves shard element 6 uncovered");
  m.affine_map->ranks[0].pieces[1].dest_offset = 4;
  CHECK(SliceStatus({6, 2}, c0, &m, 2, 0).message() == "affine map rank 0 writes shard element 4 twice");
  m.affine_map->ranks[0].pieces[1] = Piece({2, 2}, 10, {2, 1}, 6, {2, 1});
  CHECK(code(SliceStatus({6, 2}, c0, &m, 2, 0)) == StatusCode::kInvalidArgument);  // past the source
  // A split that would need millions of interleaved pieces.
  CHECK(code(SliceStatus({5000000, 4}, SubParams({{-1}, {2, 2}}, 1), nullptr, 2, 0)) == StatusCode::kResourceExhausted);
  CHECK(Slice({5000000, 4}, SubParams({{-1}, {2, 2}}, 1), nullptr, 1, 0).gather.size() == 1);  // T=1: one run
  // Shard sizes.
  CHECK(code(GetShardSize(-1, 2, "", 0, std::nullopt).status()) == StatusCode::kInvalidArgument);
  CHECK(code(GetShardSize(8, 2, "", 2, std::nullopt).status()) == StatusCode::kInvalidArgument);
  CHECK(GetShardSize(8, 2, "", 0, 0).status().message() == "num_kv_heads 0 < 1");
  CHECK(GetShardSize(8, 2, "", 0, std::nullopt, 0).status().message() == "tp_grain_size 0 < 1");
  CHECK(code(GetShardSizeList(8, 0, "", std::nullopt).status()) == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard::layout
