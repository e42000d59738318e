#include "reshard/layout/zero_partition.h"

#include <algorithm>
#include <catch2/catch.hpp>
#include <cstdint>
#include <random>
#include <string>
#include <utility>
#include <vector>

// Ground truth. Unless a case says otherwise, the expected numbers were printed by the REAL
// DeepSpeed 0.19.8 optimizer constructors: DeepSpeedZeroOptimizer / BF16_Optimizer built in one
// gloo process with deepspeed.comm.get_world_size / get_rank patched to return (D, r), then
// state_dict() read back. Save this as z12.py and run
//   DS_ACCELERATOR=cpu /opt/reshardfs/venv/bin/python z12.py <<< 'Z(3, 2, [[("a", 12), ...]])'
// ----
// import os, sys, types, torch, deepspeed
// from deepspeed import comm as dist
// os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1",
//                   LOCAL_RANK="0")
// deepspeed.init_distributed("gloo")
// from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer
// from deepspeed.runtime.bf16_optimizer import BF16_Optimizer
// def Z(D, r, groups, bf16=False, rr=False, align=False, dtype=torch.float32):
//     dist.get_world_size, dist.get_rank = (lambda group=None: D), (lambda group=None: r)
//     names, pgs = {}, []
//     for g in groups:  # g: [(name, numel[, requires_grad])]
//         ps = [torch.nn.Parameter(torch.zeros(t[1], dtype=dtype),
//                                  requires_grad=t[2:] != (False,)) for t in g]
//         names.update(zip(ps, (t[0] for t in g)))
//         pgs.append({"params": ps})
//     try:
//         opt = torch.optim.AdamW(pgs)
//         if bf16:
//             o = BF16_Optimizer(opt, names, types.SimpleNamespace(enabled=True,
//                                immediate_grad_update=False), grad_acc_dtype=torch.float32)
//         else:
//             o = DeepSpeedZeroOptimizer(opt, names, None, {}, round_robin_gradients=rr,
//                                        parameter_alignment=align, communication_data_type=dtype)
//         sd = o.state_dict()
//         print(D, r, sd["group_paddings"], sd.get("param_alignment_paddings"),
//               [[(k, a.numel, a.start) for k, a in m.items()]
//                for m in sd["param_slice_mappings"]])
//     except Exception as e:
//         print(D, r, type(e).__name__, e)
// exec(sys.stdin.read())
// ----
// The patched world size was checked against the real two-process checkpoint in examples/tiny
// (the "tiny checkpoint" case below): identical mappings.

namespace reshard::layout {
namespace {

using Group = std::vector<FlatParam>;
using Mapping = std::vector<SliceMapping>;

Zero12Partition MustPartition(const Group& params, uint32_t d, uint32_t r, Zero12Options opt = {}) {
  auto part = PartitionZero12(params, d, r, opt);
  REQUIRE(part.ok());
  return std::move(part).value();
}

Mapping MustMap(const Group& params, uint32_t d, uint32_t r, Zero12Options opt = {}) {
  auto map = ParamSliceMappings(params, MustPartition(params, d, r, opt));
  REQUIRE(map.ok());
  return std::move(map).value();
}

Zero12Options Bf16() {
  Zero12Options opt;
  opt.flavor = Zero12Flavor::kBf16Optimizer;
  return opt;
}

TEST_CASE("Zero12 reproduces the worked example of deepspeed_universal.md 3.7", "[layout]") {
  // Target T=4, D=3: TP-local numels embed 12, col 8, row 8, ln 4, swiglu 16, qkv 16, avg 4.
  const Group g = {{"embed", 12},  {"col", 8},  {"row", 8}, {"ln", 4},
                   {"swiglu", 16}, {"qkv", 16}, {"avg", 4}};
  const Zero12Partition r2 = MustPartition(g, 3, 2);
  CHECK(r2.group_numel == 68);
  CHECK(r2.padded_numel == 72);
  CHECK(r2.partition_numel == 24);
  CHECK(r2.partition_start == 48);
  CHECK(r2.group_padding == 4);  // 20 real elements + 4 padding
  CHECK(r2.fragments == std::vector<Fragment>{{5, 0, 0, 16}, {6, 0, 16, 4}});
  CHECK(MustPartition(g, 3, 1).fragments ==
        std::vector<Fragment>{{2, 4, 0, 4}, {3, 0, 4, 4}, {4, 0, 8, 16}});  // row lp[4:8]
  // Z(3, r, [[("embed",12),("col",8),("row",8),("ln",4),("swiglu",16),("qkv",16),("avg",4)]]):
  //   3 0 [0] [[0, 0, 0, 0, 0, 0, 0]] [[('embed', 12, 0), ('col', 8, 12), ('row', 4, 20)]]
  //   3 1 [0] [[0, 0, 0, 0, 0, 0, 0]] [[('row', 4, 0), ('ln', 4, 4), ('swiglu', 16, 8)]]
  //   3 2 [4] [[0, 0, 0, 0, 0, 0, 0]] [[('qkv', 16, 0), ('avg', 4, 16)]]
  CHECK(MustMap(g, 3, 0) == Mapping{{"embed", 12, 0}, {"col", 8, 12}, {"row", 4, 20}});
  CHECK(MustMap(g, 3, 1) == Mapping{{"row", 4, 0}, {"ln", 4, 4}, {"swiglu", 16, 8}});
  CHECK(MustMap(g, 3, 2) == Mapping{{"qkv", 16, 0}, {"avg", 4, 16}});
  CHECK(MustPartition(g, 3, 0).group_padding == 0);
  CHECK(MustPartition(g, 3, 1).group_padding == 0);
  CHECK(r2.param_alignment_gaps == std::vector<uint64_t>(7, 0));
  CHECK(r2.flat_order == std::vector<size_t>{0, 1, 2, 3, 4, 5, 6});
}

TEST_CASE("Zero12 equals the real ZeRO-1 checkpoint in examples/tiny (two groups, DP=2)",
          "[layout]") {
  // From examples/tiny/native/global_step3 (DeepSpeed 0.19.8, 2 gloo processes):
  //   param_shapes: [{fc1.weight [32,32], fc2.weight [32,32], head.weight [64,32]},
  //                  {embed.weight [64,32], fc1.bias [32], fc2.bias [32], head.bias [64]}]
  //   zero_pp_rank_{0,1}_mp_rank_00_optim_states.pt: group_paddings [0, 0],
  //   param_alignment_paddings [[0, 0, 0], [0, 0, 0, 0]], partitions of 2048 and 1088 elements,
  //   param_slice_mappings as below.
  const Group g0 = {{"fc1.weight", 1024}, {"fc2.weight", 1024}, {"head.weight", 2048}};
  const Group g1 = {{"embed.weight", 2048}, {"fc1.bias", 32}, {"fc2.bias", 32}, {"head.bias", 64}};
  for (uint32_t r = 0; r < 2; ++r) {
    CHECK(MustPartition(g0, 2, r).partition_numel == 2048);
    CHECK(MustPartition(g1, 2, r).partition_numel == 1088);
    CHECK(MustPartition(g0, 2, r).group_padding == 0);
    CHECK(MustPartition(g1, 2, r).group_padding == 0);
    CHECK(MustPartition(g0, 2, r).param_alignment_gaps == std::vector<uint64_t>{0, 0, 0});
    CHECK(MustPartition(g1, 2, r).param_alignment_gaps == std::vector<uint64_t>{0, 0, 0, 0});
  }
  CHECK(MustMap(g0, 2, 0) == Mapping{{"fc1.weight", 1024, 0}, {"fc2.weight", 1024, 1024}});
  CHECK(MustMap(g1, 2, 0) == Mapping{{"embed.weight", 1088, 0}});
  CHECK(MustMap(g0, 2, 1) == Mapping{{"head.weight", 2048, 0}});
  CHECK(MustMap(g1, 2, 1) == Mapping{{"embed.weight", 960, 0},
                                     {"fc1.bias", 32, 960},
                                     {"fc2.bias", 32, 992},
                                     {"head.bias", 64, 1024}});
}

TEST_CASE("Zero12 gives padding-only partitions to the tail ranks of a small group", "[layout]") {
  // 100 elements at D=64: Npad 128, ps 2; ranks 0..29 hold a, 30..49 hold b, 50..63 only padding.
  // Z(64, r, [[("a",60),("b",40)]]):  64 29 [0] .. [[('a', 2, 0)]]   64 30 [0] .. [[('b', 2, 0)]]
  //   64 49 [0] .. [[('b', 2, 0)]]   64 50 [2] [[0, 0]] [[]]   64 63 [2] [[0, 0]] [[]]
  // Same with bf16=True: 64 0 [0] None [[('a', 2, 0)]]  64 50 [0] None [[]]  64 62 [0] None [[]]
  //   64 63 [28] None [[]]
  const Group g = {{"a", 60}, {"b", 40}};
  CHECK(MustPartition(g, 64, 0).padded_numel == 128);
  CHECK(MustMap(g, 64, 29) == Mapping{{"a", 2, 0}});
  CHECK(MustMap(g, 64, 30) == Mapping{{"b", 2, 0}});
  CHECK(MustMap(g, 64, 49) == Mapping{{"b", 2, 0}});
  for (uint32_t r : {50u, 63u}) {
    const Zero12Partition p = MustPartition(g, 64, r);
    CHECK(p.fragments.empty());
    CHECK(p.recorded_fragments.empty());
    CHECK(p.group_padding == 2);
  }
  CHECK(MustPartition(g, 64, 49).group_padding == 0);
  CHECK(MustMap(g, 64, 0, Bf16()) == Mapping{{"a", 2, 0}});
  CHECK(MustPartition(g, 64, 50, Bf16()).group_padding == 0);
  CHECK(MustPartition(g, 64, 62, Bf16()).group_padding == 0);
  CHECK(MustPartition(g, 64, 63, Bf16()).group_padding == 28);
}

TEST_CASE("Zero12 group_paddings: ZeRO clamps per window, BF16 puts it all on the last rank",
          "[layout]") {
  // Z(4, r, [[("p0",10),("p1",3),("p2",7)]]) with and without bf16=True (same mappings):
  //   4 0 [0] [('p0', 6, 0)]   4 1 [0] [('p0', 4, 0), ('p1', 2, 4)]
  //   4 2 [0] [('p1', 1, 0), ('p2', 5, 1)]   4 3 [4] [('p2', 2, 0)]
  // and for a 2-element group: Z(4, r, [[("x",2)]]) gives [2] on ranks 1..3 (ZeRO), while
  // BF16 gives [0] on ranks 0..2 and [6] on rank 3.
  const Group g = {{"p0", 10}, {"p1", 3}, {"p2", 7}};
  const std::vector<Mapping> expected = {
      {{"p0", 6, 0}}, {{"p0", 4, 0}, {"p1", 2, 4}}, {{"p1", 1, 0}, {"p2", 5, 1}}, {{"p2", 2, 0}}};
  for (uint32_t r = 0; r < 4; ++r) {
    CHECK(MustMap(g, 4, r) == expected[r]);
    CHECK(MustMap(g, 4, r, Bf16()) == expected[r]);
    CHECK(MustPartition(g, 4, r).group_padding == (r == 3 ? 4u : 0u));
    CHECK(MustPartition(g, 4, r, Bf16()).group_padding == (r == 3 ? 4u : 0u));
  }
  const Group x = {{"x", 2}};
  for (uint32_t r = 0; r < 4; ++r) {
    CHECK(MustPartition(x, 4, r).group_padding == (r == 0 ? 0u : 2u));
    CHECK(MustPartition(x, 4, r, Bf16()).group_padding == (r == 3 ? 6u : 0u));
  }
}

TEST_CASE("Zero12 drops zero-element and frozen params as is_optimized_parameter does",
          "[layout]") {
  // Z(2, r, [[("z0",0),("a",6),("z1",0),("b",6),("z2",0)]]), also with bf16=True:
  //   2 0 [0] [[0, 0]] [[('a', 6, 0)]]   2 1 [0] [[0, 0]] [[('b', 6, 0)]]
  // Z(2, r, [[("f",4,False),("a",6)]]):
  //   2 0 [0] [[0]] [[('a', 4, 0)]]   2 1 [2] [[0]] [[('a', 2, 0)]]
  // Z(2, 0, [[("z",0)]]) -> IndexError; with bf16=True -> ValueError torch.cat(); and
  // Z(2, 0, [[("f",4,False)]]) -> IndexError.
  const Group g = {{"z0", 0}, {"a", 6}, {"z1", 0}, {"b", 6}, {"z2", 0}};
  for (const Zero12Options& opt : {Zero12Options{}, Bf16()}) {
    const Zero12Partition r0 = MustPartition(g, 2, 0, opt);
    CHECK(r0.flat_order == std::vector<size_t>{1, 3});
    CHECK(r0.param_alignment_gaps == std::vector<uint64_t>{0, 0});
    CHECK(r0.group_numel == 12);
    CHECK(MustMap(g, 2, 0, opt) == Mapping{{"a", 6, 0}});
    CHECK(MustMap(g, 2, 1, opt) == Mapping{{"b", 6, 0}});
  }
  const Group frozen = {{"f", 4, false}, {"a", 6}};
  CHECK(MustMap(frozen, 2, 0) == Mapping{{"a", 4, 0}});
  CHECK(MustMap(frozen, 2, 1) == Mapping{{"a", 2, 0}});
  CHECK(MustPartition(frozen, 2, 1).group_padding == 2);
  CHECK(MustPartition(frozen, 2, 1).flat_order == std::vector<size_t>{1});
  for (const Group& empty : {Group{{"z", 0}}, Group{{"f", 4, false}}, Group{}}) {
    auto part = PartitionZero12(empty, 2, 0);
    REQUIRE_FALSE(part.ok());
    CHECK(part.status().code() == StatusCode::kInvalidArgument);
    CHECK_FALSE(PartitionZero12(empty, 2, 0, Bf16()).ok());
  }
}

TEST_CASE("Zero12 round robin: buffer in round-robin order, recorded offsets in client order",
          "[layout]") {
  // Z(3, r, [[("p0",5),("p1",3),("p2",7),("p3",2),("p4",9)]], rr=True), ZeRO-1 and ZeRO-2 alike:
  //   3 0 [0] [[0, 0, 0, 0, 0]] [[('p0', 5, 0), ('p1', 3, 5), ('p2', 2, 8)]]
  //   3 1 [0] [[0, 0, 0, 0, 0]] [[('p2', 5, 0), ('p3', 2, 5), ('p4', 3, 7)]]
  //   3 2 [4] [[0, 0, 0, 0, 0]] [[('p4', 6, 0)]]
  // round_robin_bit16_groups (== param_shapes order) was [p0, p3, p1, p4, p2]. The recorded
  // mapping says p1 sits at hp 5 of rank 0, but the buffer holds p3 there: the upstream
  // inconsistency. Z(2, r, [[("p0",5),("p1",3)]], rr=True) does not reorder and stays consistent.
  const Group g = {{"p0", 5}, {"p1", 3}, {"p2", 7}, {"p3", 2}, {"p4", 9}};
  Zero12Options rr;
  rr.round_robin_gradients = true;
  const Zero12Partition r0 = MustPartition(g, 3, 0, rr);
  CHECK(r0.flat_order == std::vector<size_t>{0, 3, 1, 4, 2});
  CHECK(r0.flat_offsets == std::vector<uint64_t>{0, 5, 7, 10, 19});
  CHECK_FALSE(r0.recorded_matches_layout);
  CHECK(r0.fragments == std::vector<Fragment>{{0, 0, 0, 5}, {3, 0, 5, 2}, {1, 0, 7, 3}});
  CHECK(MustMap(g, 3, 0, rr) == Mapping{{"p0", 5, 0}, {"p1", 3, 5}, {"p2", 2, 8}});
  CHECK(MustMap(g, 3, 1, rr) == Mapping{{"p2", 5, 0}, {"p3", 2, 5}, {"p4", 3, 7}});
  CHECK(MustMap(g, 3, 2, rr) == Mapping{{"p4", 6, 0}});
  CHECK(MustPartition(g, 3, 2, rr).group_padding == 4);
  // The window [20, 30) really holds p2[1:7] (p2 is last in the buffer), not p4 as recorded.
  CHECK(MustPartition(g, 3, 2, rr).fragments == std::vector<Fragment>{{2, 1, 0, 6}});
  // BF16_Optimizer has no round robin.
  Zero12Options bf16_rr = Bf16();
  bf16_rr.round_robin_gradients = true;
  CHECK(MustPartition(g, 3, 0, bf16_rr).flat_order == std::vector<size_t>{0, 1, 2, 3, 4});
  const Group two = {{"p0", 5}, {"p1", 3}};
  CHECK(MustPartition(two, 2, 1, rr).recorded_matches_layout);
  CHECK(MustMap(two, 2, 1, rr) == Mapping{{"p0", 1, 0}, {"p1", 3, 1}});
}

TEST_CASE("Zero12 parameter_alignment gaps and param_alignment_paddings", "[layout]") {
  CHECK(ParamAlignmentElems(false, 2) == 1);
  CHECK(ParamAlignmentElems(true, 2) == 8);
  CHECK(ParamAlignmentElems(true, 4) == 4);
  CHECK(ParamAlignmentElems(true, 1) == 16);
  // Z(2, r, [[("p0",5),("p1",3),("p2",7),("p3",2),("p4",9)]], align=True, dtype=torch.bfloat16):
  //   2 0 [0] [[3, 5, 1, 6, 0]] [[('p0', 5, 0), ('p1', 3, 8), ('p2', 6, 16)]]
  //   2 1 [3] [[3, 5, 1, 6, 0]] [[('p2', 1, 0), ('p3', 2, 2), ('p4', 9, 10)]]
  const Group g = {{"p0", 5}, {"p1", 3}, {"p2", 7}, {"p3", 2}, {"p4", 9}};
  Zero12Options al;
  al.param_alignment_elems = ParamAlignmentElems(true, 2);
  const Zero12Partition r1 = MustPartition(g, 2, 1, al);
  CHECK(r1.param_alignment_gaps == std::vector<uint64_t>{3, 5, 1, 6, 0});
  CHECK(r1.content_numel == 41);
  CHECK(r1.padded_numel == 44);
  CHECK(r1.group_padding == 3);
  CHECK(MustMap(g, 2, 0, al) == Mapping{{"p0", 5, 0}, {"p1", 3, 8}, {"p2", 6, 16}});
  CHECK(MustMap(g, 2, 1, al) == Mapping{{"p2", 1, 0}, {"p3", 2, 2}, {"p4", 9, 10}});
  // With round robin too, the real offsets are passed down, so the mapping is consistent:
  // Z(3, r, <same>, rr=True, align=True, dtype=torch.bfloat16):
  //   3 0 [0] [[3, 6, 5, 7, 0]] [[('p0', 5, 0), ('p3', 2, 8)]]
  //   3 1 [0] [[3, 6, 5, 7, 0]] [[('p1', 3, 0), ('p4', 8, 8)]]
  //   3 2 [1] [[3, 6, 5, 7, 0]] [[('p2', 7, 8), ('p4', 1, 0)]]
  al.round_robin_gradients = true;
  CHECK(MustPartition(g, 3, 0, al).param_alignment_gaps == std::vector<uint64_t>{3, 6, 5, 7, 0});
  CHECK(MustPartition(g, 3, 0, al).recorded_matches_layout);
  CHECK(MustMap(g, 3, 0, al) == Mapping{{"p0", 5, 0}, {"p3", 2, 8}});
  CHECK(MustMap(g, 3, 1, al) == Mapping{{"p1", 3, 0}, {"p4", 8, 8}});
  CHECK(MustMap(g, 3, 2, al) == Mapping{{"p2", 7, 8}, {"p4", 1, 0}});
  CHECK(MustPartition(g, 3, 2, al).group_padding == 1);
  // When every gap happens to be 0, DeepSpeed falls back to client-order offsets again:
  // Z(2, r, [[("a",8),("b",8),("c",8)]], rr=True, align=True, dtype=torch.bfloat16):
  //   2 0 [0] [[0, 0, 0]] [[('a', 8, 0), ('b', 4, 8)]]
  //   2 1 [0] [[0, 0, 0]] [[('b', 4, 0), ('c', 8, 4)]]
  const Group abc = {{"a", 8}, {"b", 8}, {"c", 8}};
  CHECK(MustPartition(abc, 2, 0, al).flat_order == std::vector<size_t>{0, 2, 1});
  CHECK_FALSE(MustPartition(abc, 2, 0, al).recorded_matches_layout);
  CHECK(MustMap(abc, 2, 0, al) == Mapping{{"a", 8, 0}, {"b", 4, 8}});
  CHECK(MustMap(abc, 2, 1, al) == Mapping{{"b", 4, 0}, {"c", 8, 4}});
  // BF16_Optimizer ignores parameter_alignment.
  Zero12Options bf16_al = Bf16();
  bf16_al.param_alignment_elems = 8;
  CHECK(MustPartition(g, 2, 0, bf16_al).content_numel == 26);
}

// Independent oracle for the property test: the flat buffer as (param, element) per slot, -1 for
// padding, built element by element.
std::vector<std::pair<int64_t, uint64_t>> NaiveFlat(const Group& g, uint32_t d, bool rr,
                                                    uint64_t align) {
  std::vector<size_t> kept;
  for (size_t i = 0; i < g.size(); ++i) {
    if (g[i].requires_grad && g[i].numel > 0) kept.push_back(i);
  }
  std::vector<size_t> order;
  if (rr) {
    for (size_t b = 0; b < d; ++b) {
      for (size_t k = 0; k < kept.size(); ++k) {
        if (k % d == b) order.push_back(kept[k]);
      }
    }
  } else {
    order = kept;
  }
  std::vector<std::pair<int64_t, uint64_t>> flat;
  for (size_t k = 0; k < order.size(); ++k) {
    for (uint64_t e = 0; e < g[order[k]].numel; ++e) flat.emplace_back(order[k], e);
    while (k + 1 < order.size() && flat.size() % align != 0) flat.emplace_back(-1, 0);
  }
  while (flat.size() % (2 * d) != 0) flat.emplace_back(-1, 0);
  return flat;
}

TEST_CASE("Zero12 ranks tile the flat buffer exactly once (random groups and D)", "[layout]") {
  std::mt19937_64 rng(20240611);
  for (int trial = 0; trial < 400; ++trial) {
    Group g;
    const int n = 1 + static_cast<int>(rng() % 9);
    for (int i = 0; i < n; ++i) {
      const uint64_t numel = (rng() % 5 == 0) ? 0 : 1 + rng() % 40;
      g.push_back({"p" + std::to_string(i), numel, rng() % 7 != 0});
    }
    g.push_back({"last", 1 + rng() % 13});  // at least one kept param
    const uint32_t d = 1 + static_cast<uint32_t>(rng() % 9);
    Zero12Options opt;
    opt.flavor = rng() % 3 == 0 ? Zero12Flavor::kBf16Optimizer : Zero12Flavor::kZeroOptimizer;
    opt.round_robin_gradients = rng() % 2 == 0;
    opt.param_alignment_elems = rng() % 2 == 0 ? 1 : ParamAlignmentElems(true, 1 + rng() % 4);
    const bool bf16 = opt.flavor == Zero12Flavor::kBf16Optimizer;
    const auto flat =
        NaiveFlat(g, d, !bf16 && opt.round_robin_gradients, bf16 ? 1 : opt.param_alignment_elems);
    uint64_t padding_total = 0;
    for (uint32_t r = 0; r < d; ++r) {
      const Zero12Partition p = MustPartition(g, d, r, opt);
      REQUIRE(p.padded_numel == flat.size());
      REQUIRE(p.partition_numel * d == p.padded_numel);
      REQUIRE(p.partition_start == p.partition_numel * r);
      // Expanding the fragments over a padding-filled window reproduces the oracle's window.
      std::vector<std::pair<int64_t, uint64_t>> window(p.partition_numel, {-1, 0});
      uint64_t next = 0;
      for (const Fragment& f : p.fragments) {
        REQUIRE(f.numel > 0);
        REQUIRE(f.hp_start >= next);  // ascending, non-overlapping
        REQUIRE(f.hp_start + f.numel <= p.partition_numel);
        REQUIRE(f.lp_start + f.numel <= g[f.param].numel);
        for (uint64_t e = 0; e < f.numel; ++e) {
          window[f.hp_start + e] = {static_cast<int64_t>(f.param), f.lp_start + e};
        }
        next = f.hp_start + f.numel;
      }
      REQUIRE(std::equal(window.begin(), window.end(), flat.begin() + p.partition_start));
      // DeepSpeed's recorded mapping equals the layout (in client order) exactly when flagged.
      std::vector<Fragment> sorted = p.fragments;
      std::sort(sorted.begin(), sorted.end(),
                [](const Fragment& a, const Fragment& b) { return a.param < b.param; });
      if (p.recorded_matches_layout) {
        REQUIRE(p.recorded_fragments == sorted);
      } else {
        // The fallback DeepSpeed uses: cumulative offsets over the kept params in client order.
        std::vector<Fragment> naive;
        uint64_t offset = 0;
        for (size_t i = 0; i < g.size(); ++i) {
          if (!g[i].requires_grad || g[i].numel == 0) continue;
          const uint64_t lo = std::max(offset, p.partition_start);
          const uint64_t hi = std::min(offset + g[i].numel, p.partition_start + p.partition_numel);
          if (lo < hi) naive.push_back({i, lo - offset, lo - p.partition_start, hi - lo});
          offset += g[i].numel;
        }
        REQUIRE(p.recorded_fragments == naive);
        REQUIRE(opt.round_robin_gradients);
      }
      const uint64_t tail_in_window =
          p.content_numel >= p.partition_start + p.partition_numel
              ? 0
              : std::min(p.partition_numel,
                         p.partition_start + p.partition_numel - p.content_numel);
      if (bf16) {
        REQUIRE(p.group_padding == (r + 1 == d ? p.padded_numel - p.group_numel : 0));
      } else {
        REQUIRE(p.group_padding == tail_in_window);
        padding_total += p.group_padding;
      }
    }
    if (!bf16) {
      const Zero12Partition p0 = MustPartition(g, d, 0, opt);
      REQUIRE(padding_total == p0.padded_numel - p0.content_numel);
    }
  }
}

TEST_CASE("Zero12 refuses bad arguments and overflowing sizes", "[layout]") {
  const Group g = {{"a", 4}};
  CHECK(PartitionZero12(g, 0, 0).status().code() == StatusCode::kInvalidArgument);
  CHECK(PartitionZero12(g, 2, 2).status().code() == StatusCode::kInvalidArgument);
  Zero12Options bad;
  bad.nccl_start_alignment_factor = 0;
  CHECK(PartitionZero12(g, 2, 0, bad).status().code() == StatusCode::kInvalidArgument);
  bad = Zero12Options{};
  bad.param_alignment_elems = 0;
  CHECK(PartitionZero12(g, 2, 0, bad).status().code() == StatusCode::kInvalidArgument);
  const Group huge = {{"a", UINT64_MAX - 2}, {"b", 8}};
  CHECK(PartitionZero12(huge, 2, 0).status().code() == StatusCode::kOutOfRange);
  const Group near = {{"a", UINT64_MAX - 2}};  // fits, but rounding up to 4 does not
  CHECK(PartitionZero12(near, 2, 0).status().code() == StatusCode::kOutOfRange);
  const Group dup = {{"a", 4}, {"a", 4}};
  CHECK(ParamSliceMappings(dup, MustPartition(dup, 1, 0)).status().code() ==
        StatusCode::kInvalidArgument);
  CHECK_FALSE(ParamSliceMappings({}, MustPartition(g, 1, 0)).ok());
}

// ZeRO-3 ground truth: a REAL two- and four-process ZeRO-3 engine (fp32, torch AdamW), saved as
// gt3.py and run as
//   DS_ACCELERATOR=cpu /opt/reshardfs/venv/bin/python -m torch.distributed.run
//       --nproc_per_node=D --master_addr=127.0.0.1 --master_port=29602 gt3.py 8   (one line)
// ----
// import os, sys, json, torch, torch.nn as nn, deepspeed
// SPEC = [("a", 8, 0), ("b", 8, 0), ("c", 8, 0), ("d", 8, 0), ("e", 7, 1), ("f", 9, 1),
//         ("z", 0, 1), ("g", 8, 1), ("h", 6, 1), ("x", 5, 2)]      # (name, numel, group)
// class M(nn.Module):
//     def __init__(self):
//         super().__init__()
//         for k, (n, numel, g) in enumerate(SPEC):  # element i of param k = 100*(k+1) + i + 1
//             p = nn.Parameter(100.0 * (k + 1) + torch.arange(1, numel + 1, dtype=torch.float32))
//             p.requires_grad = g != 2                 # group 2 holds only a frozen param
//             self.register_parameter(n, p)
//     def forward(self, x): return sum((p.sum() for p in self.parameters()), x.sum())
// deepspeed.init_distributed(dist_backend="gloo")
// m = M()
// groups = [{"params": [getattr(m, n) for n, _, g in SPEC if g == gi]} for gi in range(3)]
// cfg = {"train_batch_size": int(os.environ["WORLD_SIZE"]), "train_micro_batch_size_per_gpu": 1,
//        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
//        "zero_optimization": {"stage": 3, "sub_group_size": int(sys.argv[1])}}
// engine, *_ = deepspeed.initialize(model=m, model_parameters=groups, config=cfg)
// sd = engine.optimizer.state_dict()
// print(os.environ["RANK"], [t.tolist() for t in sd["fp32_flat_groups"]],
//       [g["params"] for g in sd["optimizer_state_dict"]["param_groups"]])
// ----
// Padding slots printed uninitialised memory (DeepSpeed allocates them with torch.empty); they are
// 0 below. Output (rank, fp32_flat_groups, param_groups[*]['params']):
//   D=2  0 [[101..104, 201..204], [301..304, 401..404], [501..504, 601..605], [801..804, 901..903]]
//           [[0, 1], [2, 3], []]
//        1 [[105..108, 205..208], [305..308, 405..408], [505, 506, 507, X, 606..609, X],
//           [805..808, 904, 905, 906]]  [[0, 1], [2, 3], []]
//   D=4  r [[1a, 1b, 2a, 2b, 3a, 3b, 4a, 4b], [5a, 5b, 6a, 6b, 6c, 8a, 8b, 9a, 9b]]  [[0], [1], []]
//        with 1a = 100 + 2r + 1 etc.; rank 3's second flat is [507, X, X, X, X, 807, 808, X, X].
std::vector<double> RenderFlat(const Zero3SubGroup& sg, const std::vector<int>& global_index) {
  std::vector<double> out;
  for (const Zero3ParamPart& part : sg.parts) {
    for (uint64_t j = 0; j < part.partition_numel; ++j) {
      out.push_back(j < part.real_numel
                        ? 100.0 * (global_index[part.param] + 1) + double(part.src_start + j + 1)
                        : 0.0);
    }
  }
  return out;
}

std::vector<double> Run(double first, int n) {
  std::vector<double> v;
  for (int i = 0; i < n; ++i) v.push_back(first + i);
  return v;
}

std::vector<double> Cat(std::initializer_list<std::vector<double>> parts) {
  std::vector<double> v;
  for (const auto& p : parts) v.insert(v.end(), p.begin(), p.end());
  return v;
}

TEST_CASE("Zero3 sub-groups and partitions match a real ZeRO-3 engine at D=2 and D=4", "[layout]") {
  const std::vector<Group> groups = {
      {{"a", 8}, {"b", 8}, {"c", 8}, {"d", 8}},
      {{"e", 7}, {"f", 9}, {"z", 0}, {"g", 8}, {"h", 6}},
      {{"x", 5, false}},
  };
  // SPEC position of each param, per group (z is SPEC 6, so g is 7 and h is 8).
  const std::vector<std::vector<int>> global = {{0, 1, 2, 3}, {4, 5, 6, 7, 8}, {9}};
  auto render = [&](const std::vector<Zero3SubGroup>& sgs) {
    std::vector<std::vector<double>> out;
    for (const Zero3SubGroup& sg : sgs) out.push_back(RenderFlat(sg, global[sg.param_group]));
    return out;
  };

  // D=2: pn a..d = 4 each; the sum reaches 8 (== sub_group_size) after two params: 4 sub-groups.
  auto d2r0 = PartitionZero3(groups, 2, 0, 8);
  auto d2r1 = PartitionZero3(groups, 2, 1, 8);
  REQUIRE(d2r0.ok());
  REQUIRE(d2r1.ok());
  REQUIRE(d2r0->size() == 4);
  CHECK(render(*d2r0) == std::vector<std::vector<double>>{
                             Cat({Run(101, 4), Run(201, 4)}), Cat({Run(301, 4), Run(401, 4)}),
                             Cat({Run(501, 4), Run(601, 5)}), Cat({Run(801, 4), Run(901, 3)})});
  CHECK(render(*d2r1) == std::vector<std::vector<double>>{Cat({Run(105, 4), Run(205, 4)}),
                                                          Cat({Run(305, 4), Run(405, 4)}),
                                                          Cat({Run(505, 3), {0}, Run(606, 4), {0}}),
                                                          Cat({Run(805, 4), Run(904, 3)})});
  CHECK((*d2r1)[2].parts == std::vector<Zero3ParamPart>{{0, 4, 4, 3, 0}, {1, 5, 5, 4, 4}});
  CHECK((*d2r1)[2].flat_numel == 9);
  auto pg2 = Zero3ParamGroupSubGroups(*d2r0, groups.size());
  REQUIRE(pg2.ok());
  CHECK(*pg2 == std::vector<std::vector<size_t>>{{0, 1}, {2, 3}, {}});

  // D=4: group 0 totals 8 pn (single sub-group); group 1 pn 2,3,2,2 first reaches 8 at its last
  // param, so it too stays whole. Boundaries moved with D.
  std::vector<std::vector<std::vector<double>>> d4;
  for (uint32_t r = 0; r < 4; ++r) {
    auto sgs = PartitionZero3(groups, 4, r, 8);
    REQUIRE(sgs.ok());
    REQUIRE(sgs->size() == 2);
    d4.push_back(render(*sgs));
    auto pg4 = Zero3ParamGroupSubGroups(*sgs, groups.size());
    REQUIRE(pg4.ok());
    CHECK(*pg4 == std::vector<std::vector<size_t>>{{0}, {1}, {}});
  }
  CHECK(d4[0] == std::vector<std::vector<double>>{{101, 102, 201, 202, 301, 302, 401, 402},
                                                  {501, 502, 601, 602, 603, 801, 802, 901, 902}});
  CHECK(d4[1][1] == std::vector<double>{503, 504, 604, 605, 606, 803, 804, 903, 904});
  CHECK(d4[2][1] == std::vector<double>{505, 506, 607, 608, 609, 805, 806, 905, 906});
  CHECK(d4[3] == std::vector<std::vector<double>>{{107, 108, 207, 208, 307, 308, 407, 408},
                                                  {507, 0, 0, 0, 0, 807, 808, 0, 0}});
}

TEST_CASE("Zero3 closes a sub-group at >= sub_group_size, counting partition numels", "[layout]") {
  // DeepSpeedZeroOptimizer_Stage3._create_fp16_sub_groups called directly on three params of
  // partition_numel 4 (fake `self` with sub_group_size; fake params with partition_numel()):
  //   0 [[a],[b],[c]]  4 [[a],[b],[c]]  5 [[a,b],[c]]  8 [[a,b],[c]]  11 [[a,b,c]]  12 [[a,b,c]]
  const std::vector<Group> groups = {{{"a", 8}, {"b", 8}, {"c", 8}}};  // pn 4 at D=2
  const std::vector<std::pair<uint64_t, std::vector<size_t>>> cases = {
      {0, {1, 1, 1}}, {4, {1, 1, 1}}, {5, {2, 1}}, {8, {2, 1}}, {11, {3}}, {12, {3}}};
  for (const auto& [size, shape] : cases) {
    auto sgs = PartitionZero3(groups, 2, 1, size);
    REQUIRE(sgs.ok());
    std::vector<size_t> got;
    for (const Zero3SubGroup& sg : *sgs) got.push_back(sg.parts.size());
    CHECK(got == shape);
  }
  // With full numels (8 each) and sub_group_size 8 the split would be [[a],[b],[c]]; with pn 4 it
  // is [[a,b],[c]] - the pn sum is what DeepSpeed compares.
}

TEST_CASE("Zero3 single-param parts, empty inputs and errors", "[layout]") {
  auto one = PartitionZero3Param(1, 4, 3);  // pn 1, rank 3 starts past the end
  REQUIRE(one.ok());
  CHECK(one->partition_numel == 1);
  CHECK(one->src_start == 3);
  CHECK(one->real_numel == 0);
  auto ten = PartitionZero3Param(10, 4, 3);  // pn 3: ranks hold 3, 3, 3, 1
  REQUIRE(ten.ok());
  CHECK(ten->src_start == 9);
  CHECK(ten->real_numel == 1);
  auto zero = PartitionZero3Param(0, 4, 0);
  REQUIRE(zero.ok());
  CHECK(zero->partition_numel == 0);
  auto none = PartitionZero3({{}, {{"f", 3, false}, {"z", 0}}}, 2, 0, 100);
  REQUIRE(none.ok());
  CHECK(none->empty());
  CHECK(PartitionZero3({{{"a", 1}}}, 0, 0, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(PartitionZero3({{{"a", 1}}}, 2, 5, 1).status().code() == StatusCode::kInvalidArgument);
  CHECK(PartitionZero3Param(4, 2, 2).status().code() == StatusCode::kInvalidArgument);
  const std::vector<Group> huge = {{{"a", UINT64_MAX - 1}, {"b", 8}}};  // a stays open
  CHECK(PartitionZero3(huge, 1, 0, UINT64_MAX).status().code() == StatusCode::kOutOfRange);
  Zero3SubGroup stray;
  stray.param_group = 3;
  CHECK(Zero3ParamGroupSubGroups({stray}, 2).status().code() == StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace reshard::layout
