"""reshardfs.restore and its executor (issue 6): the engine filled straight from the universal checkpoint.

Two kinds of check, both exact (tensors bit for bit, torch.equal on their bytes):

- test_fill_equals_served_files[<case>] (no DeepSpeed process): for every target rank, reshardfs._C.RankPlan.fill
  writes the rank's flat fp32 partitions, exp_avg, exp_avg_sq and (ZeRO-1/2) lp weights into fresh CPU tensors with
  the host backend, through small staging chunks so reads are split and merged; they must equal the tensors of
  the files `reshardfs materialize` writes for that layout (what the mount serves); the "discard" backend of
  scripts/bench_restore.py makes the same reads (RankPlan.chunks lists them) and writes nothing. Cases cover ZeRO-1 -> ZeRO-2
  with DP 2 -> 4 and bf16 lp weights, ZeRO-3 DP 2 -> 4, and TP 2 -> 1 and 2 -> 2 (DP 1 -> 2) of the tiny AutoTP
  Llama.
- test_restore_matches_load_universal[<case>]: `dp` CPU ranks (gloo) build the target engine, call
  reshardfs.restore(engine, UCP) instead of load_checkpoint (in the cooperative cases, with cooperative=True:
  the 4 ranks split the reads and exchange pieces with gloo all-to-alls, in several rounds), snapshot the live engine and train 3 more steps
  (ds_resume.restore_from_universal). The snapshot must equal DeepSpeed's own load_universal at the same layout
  (ds_reference, shared with test_resume_from_mount.py, where the mount is held to the same reference), and the
  losses and state after 3 steps must equal that run's. For ZeRO-3 the reference is load_universal with its two
  known 0.19.8 defects undone (ds_resume.universal_corrected; test_resume_from_mount.py asserts they are there).

Refusals are checked in-process with their messages.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from checkpoint_compare import assert_same_snapshot, load, ucp_param_groups
from ds_reference import EXAMPLES, REFERENCE_TRAIN_STEPS
from ds_resume import restore_from_universal
from run_cache import RunCache
from tiers import tiered

sys.path.insert(0, str(EXAMPLES))
import make_tiny_checkpoint as tiny  # noqa: E402

pytestmark = pytest.mark.timeout(900)

UCP = EXAMPLES / "tiny" / "universal"
ZERO3_UCP = EXAMPLES.parent / "tests" / "fixtures" / "tiny_zero3" / "universal"
LLAMA_UCP = EXAMPLES / "tiny_llama_tp2" / "universal"
NATIVE = EXAMPLES / "tiny" / "native"
ZERO3_NATIVE = EXAMPLES.parent / "tests" / "goldens" / "load_universal-tiny_zero3-z3-dp2-fp32" / "native_resaved"
LP_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}

# id: (UCP, target ZeRO stage, TP, DP, lp dtype)
FILL_CASES = {
    "zero1_to_zero2_bf16_dp2_to_dp4": (UCP, 2, 1, 4, "bf16"),
    "zero1_fp16_dp2_to_dp1": (UCP, 1, 1, 1, "fp16"),
    "zero3_dp2_to_dp4": (ZERO3_UCP, 3, 1, 4, "fp32"),
    "llama_tp2_to_tp1_dp2": (LLAMA_UCP, 1, 1, 2, "fp32"),
    "llama_tp2_dp1_to_dp2": (LLAMA_UCP, 1, 2, 2, "fp32"),
    # Native sources (no ds_to_universal): the executor reads the optimizer files' fragments in place.
    "native_zero1_dp2_to_zero2_bf16_dp4": (NATIVE, 2, 1, 4, "bf16"),
    "native_zero3_dp2_to_dp3": (ZERO3_NATIVE, 3, 1, 3, "fp32"),
}

# id: (UCP, target ZeRO stage, DP, bf16 target, cooperative)
RESTORE_CASES = {
    "zero1_dp2_to_dp1": (UCP, 1, 1, False, False),
    "zero1_dp2_to_dp4": (UCP, 1, 4, False, False),
    "zero1_to_zero2_fp32_to_bf16_dp2_to_dp4": (UCP, 2, 4, True, False),
    "zero3_dp2_to_dp1": (ZERO3_UCP, 3, 1, False, False),
    "zero3_fp32_to_bf16_dp2_to_dp4": (ZERO3_UCP, 3, 4, True, False),
    # 4 ranks reading cooperatively and exchanging over gloo, in several rounds.
    "cooperative_zero1_to_zero2_fp32_to_bf16_dp2_to_dp4": (UCP, 2, 4, True, True),
    "cooperative_zero3_fp32_to_bf16_dp2_to_dp4": (ZERO3_UCP, 3, 4, True, True),
}
# The default tier's smoke set: one restore and one cooperative restore (one launch each, against goldens).
DEFAULT_TIER = {"zero1_dp2_to_dp4", "cooperative_zero1_to_zero2_fp32_to_bf16_dp2_to_dp4"}


@pytest.fixture(scope="session")
def reshardfs_c(reshardfs_python: Path) -> Any:
    sys.path.insert(0, str(reshardfs_python))
    from reshardfs import _C
    return _C


def ds_config_json(stage: int, lp: str) -> str:
    return json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, "zero_optimization": {"stage": stage},
                       "bf16": {"enabled": lp == "bf16"}, "fp16": {"enabled": lp == "fp16"}})  # fmt: skip


def served_tensors(root: Path, stage: int, tp_rank: int, dp_rank: int, lp: str) -> tuple[list[list[torch.Tensor]], dict]:
    """From a materialized checkpoint: per flat partition [fp32, exp_avg, exp_avg_sq], and the module's lp weights."""
    tag = root / (root / "latest").read_text().strip()
    prefix = "bf16_" if lp == "bf16" else ""
    osd = load(tag / f"{prefix}zero_pp_rank_{dp_rank}_mp_rank_{tp_rank:02d}_optim_states.pt")["optimizer_state_dict"]
    if stage == 3:
        flats, state = osd["fp32_flat_groups"], osd["optimizer_state_dict"]["state"]
        module = {}
    else:
        flats, state = osd["single_partition_of_fp32_groups"], osd["base_optimizer_state"]["state"]
        module = load(tag / f"mp_rank_{tp_rank:02d}_model_states.pt")["module"]
    return [[fp32, state[i]["exp_avg"], state[i]["exp_avg_sq"]] for i, fp32 in enumerate(flats)], module


@pytest.mark.parametrize("layout", list(FILL_CASES))
def test_fill_equals_served_files(layout: str, reshardfs_c: Any, reshardfs: Path, run_tool, tmp_path: Path) -> None:
    case = layout
    ucp, stage, tp, dp, lp = FILL_CASES[case]
    out = tmp_path / "served"
    model_config = ucp.parent / "config.json"  # the Llama's HF config (KV heads for AutoTP shard sizes)
    model_flags = ["--model-config", model_config] if model_config.is_file() else []
    model_json = model_config.read_text() if model_config.is_file() else ""
    result = run_tool(reshardfs, "materialize", ucp, out, "--zero-stage", str(stage), "--tp", str(tp), "--dp", str(dp),
                      "--lp-dtype", lp, *model_flags)  # fmt: skip
    assert result.returncode == 0, result.stderr
    filled_bytes = 0
    for tp_rank in range(tp):
        for dp_rank in range(dp):
            plan = reshardfs_c.RankPlan(str(ucp), ds_config_json(stage, lp), tp, dp, tp_rank, dp_rank, model_json)
            assert plan.zero_stage == stage
            buffers, flats, lps = [], [], []
            for i, flat in enumerate(plan.flats):
                # Garbage first: every byte must be written (padding zeroed), not left from allocation.
                tensors = [torch.full((flat["numel"],), float("nan")) for _ in range(3)]
                flats.append(tensors)
                buffers += [(kind, i, t.data_ptr(), t.numel() * 4) for kind, t in zip(("fp32", "exp_avg", "exp_avg_sq"), tensors)]
            for i, param in enumerate(plan.lp_params):
                t = torch.full(param["shape"], float("nan"), dtype=LP_DTYPES[lp])
                lps.append((param["name"], t))
                buffers.append(("lp", i, t.data_ptr(), t.numel() * t.element_size()))
            # scripts/bench_restore.py's ceiling: the same reads, and no byte written.
            discarded = plan.fill(buffers, backend="discard", lanes=3, chunk_bytes=256)
            assert all(torch.isnan(t).all() for t in [*(t for ts in flats for t in ts), *(t for _, t in lps)])
            # 256-byte chunks: every tensor is split over several reads, and neighbouring pieces are merged.
            stats = plan.fill(buffers, backend="host", lanes=3, chunk_bytes=256)
            assert stats["chunks"] > len(plan.flats), stats
            assert (discarded["chunks"], discarded["bytes_read"]) == (stats["chunks"], stats["bytes_read"])
            chunks = plan.chunks(buffers, lanes=3, chunk_bytes=256)
            assert len(chunks) == stats["chunks"] and sum(length for _, _, length, _ in chunks) == stats["bytes_read"]
            filled_bytes += stats["bytes_copied"]

            expected_flats, module = served_tensors(out, stage, tp_rank, dp_rank, lp)
            assert len(flats) == len(expected_flats)
            for i, (got, want) in enumerate(zip(flats, expected_flats)):
                for kind, g, w in zip(("fp32", "exp_avg", "exp_avg_sq"), got, want):
                    assert g.dtype == w.dtype and g.shape == w.shape, (case, i, kind, g.shape, w.shape)
                    assert torch.equal(g.view(torch.int32), w.view(torch.int32)), f"{case} rank {tp_rank},{dp_rank} flat {i} {kind}"
            assert (len(lps) > 0) == (stage != 3)
            for name, t in lps:
                w = module[name]
                assert t.dtype == w.dtype and t.shape == w.shape, (name, t.shape, w.shape)
                assert torch.equal(t.view(torch.int16 if t.element_size() == 2 else torch.int32),
                                   w.view(torch.int16 if w.element_size() == 2 else torch.int32)), f"{case}: lp {name}"
    assert filled_bytes > 0


def test_refusals(reshardfs_c: Any) -> None:
    with pytest.raises(NotImplementedError, match="BF16_Optimizer"):
        reshardfs_c.RankPlan(str(UCP), json.dumps(tiny.ds_config(2, 1, bf16=True, variant="bf16_optimizer")), 1, 2, 0, 0)
    with pytest.raises(ValueError, match="TP rank 1 outside"):
        reshardfs_c.RankPlan(str(UCP), "{}", 1, 2, 1, 0)
    with pytest.raises(ValueError, match="not a universal checkpoint"):
        reshardfs_c.RankPlan(str(EXAMPLES), "{}", 1, 2, 0, 0)
    with pytest.raises(ValueError, match="ds_config is not a JSON object"):
        reshardfs_c.RankPlan(str(UCP), "[1]", 1, 2, 0, 0)
    plan = reshardfs_c.RankPlan(str(UCP), "{}", 1, 2, 0, 0)
    numel = plan.flats[0]["numel"]
    t = torch.empty(numel + 1)
    with pytest.raises(ValueError, match=rf"fp32\[0\] .* needs {numel * 4} bytes, the buffer has {numel * 4 + 4}"):
        plan.fill([("fp32", 0, t.data_ptr(), t.numel() * 4)])
    with pytest.raises(ValueError, match="unknown buffer kind 'momentum'"):
        plan.fill([("momentum", 0, t.data_ptr(), 4096)])
    with pytest.raises(ValueError, match="unknown backend 'tpu'"):
        plan.fill([], backend="tpu")


# ---- DeepSpeed engines ------------------------------------------------------------------------


@pytest.fixture(scope="session")
def restored(reshardfs_python: Path, tmp_path_factory: pytest.TempPathFactory):
    cache = RunCache()

    def run(ucp: Path, stage: int, dp: int, bf16: bool, cooperative: bool) -> Path:
        out = tmp_path_factory.mktemp(f"restore_{ucp.parent.name}_z{stage}_dp{dp}{'_bf16' if bf16 else ''}"
                                      f"{'_cooperative' if cooperative else ''}")
        restore_from_universal(ucp, stage, dp, out, reshardfs_python, bf16=bf16, train_steps=REFERENCE_TRAIN_STEPS,
                               cooperative=cooperative)
        return out

    return lambda *key: cache.get(key, lambda: run(*key))




@pytest.mark.parametrize("layout", tiered(RESTORE_CASES, DEFAULT_TIER))
def test_restore_matches_load_universal(layout: str, restored, load_universal_trained,
                                        load_universal_corrected) -> None:
    case = layout
    ucp, stage, dp, bf16, cooperative = RESTORE_CASES[case]
    restore_dir = restored(ucp, stage, dp, bf16, cooperative)
    reference_dir = load_universal_trained(ucp, stage, dp, bf16, "")
    trained_dir = load_universal_corrected(ucp, stage, dp, bf16) if stage == 3 else reference_dir
    for rank in range(dp):
        got = load(restore_dir / f"rank_{rank}.pt")
        want = load(reference_dir / f"rank_{rank}.pt")
        if stage == 3:  # load_universal gives every group group 0's hyper-parameters; the UCP has the real ones
            want["param_groups"] = ucp_param_groups(ucp)
        assert_same_snapshot(got, want, f"{case} rank {rank}: restore vs load_universal")
        got_losses = json.loads((restore_dir / f"losses_rank_{rank}.json").read_text())
        want_losses = json.loads((trained_dir / f"losses_rank_{rank}.json").read_text())
        assert got_losses == want_losses, f"{case} rank {rank}: losses {got_losses} != {want_losses}"
        assert_same_snapshot(load(restore_dir / f"after_rank_{rank}.pt"), load(trained_dir / f"after_rank_{rank}.pt"),
                             f"{case} rank {rank}: after {REFERENCE_TRAIN_STEPS} steps")
    stats = [json.loads((restore_dir / f"restore_stats_rank_{rank}.json").read_text()) for rank in range(dp)]
    if cooperative:
        # Several rounds, and every rank received pieces others read. At ZeRO-1/2 every rank's lp weights are
        # the whole model, which the ranks alone would read 4 times: the node reads them once.
        assert all(s["rounds"] > 1 and s["bytes_received"] > 0 for s in stats), stats
        if stage != 3:
            assert 2 * sum(s["bytes_read"] for s in stats) < sum(s["bytes_owned"] for s in stats), stats
    else:
        assert all(s["bytes_copied"] > 0 for s in stats), stats
