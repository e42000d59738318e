"""DeepSpeed's own load_universal (ds_reference.py) against an independent implementation of the
ZeRO-1/2 DP-cut rules (deepspeed_universal.md §3.2, §3.5), bit for bit.

The UCP is examples/tiny/universal (ZeRO-1, source DP=2); targets are ZeRO-1 at DP=1 and DP=4.
Per group g of the target: flat = concat(zero/<name>/<key>.pt['param'].flatten() for name in
param_shapes[g]) ++ zeros up to Npad = ceil(N / 2D) * 2D; rank r owns flat[r*ps:(r+1)*ps], ps = Npad/D.

The `ds_reference` session fixture (conftest.py) runs DeepSpeed once per (stage, dp) and session;
the planner's tests (test_plan_partitions.py) compare against the same dumps.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from ds_reference import EXAMPLES

UCP = EXAMPLES / "tiny" / "universal"
UCP_TAG = UCP / (UCP / "latest_universal").read_text().strip()
TARGET_DPS = [1, 4]
KEYS = ("fp32", "exp_avg", "exp_avg_sq")


def load(path: Path) -> dict:
    return torch.load(path, weights_only=False)


def ucp_state(name: str, key: str) -> torch.Tensor:
    obj = load(UCP_TAG / "zero" / name / f"{key}.pt")
    return obj if key == "step" else obj["param"]


def param_shapes() -> list[dict[str, torch.Size]]:
    return load(UCP_TAG / "mp_rank_00_model_states.pt")["param_shapes"]


def expected_group(names: list[str], dp: int) -> tuple[int, int, int, dict[str, list[torch.Tensor]]]:
    """(N, Npad, ps, {key: [partition of rank r]}) of one param group at DP=dp (§3.5)."""
    flats = {key: torch.cat([ucp_state(name, key).flatten() for name in names]) for key in KEYS}
    n = flats["fp32"].numel()
    npad = math.ceil(n / (2 * dp)) * 2 * dp
    ps = npad // dp
    parts = {}
    for key, flat in flats.items():
        padded = torch.cat([flat, torch.zeros(npad - n, dtype=flat.dtype)])
        parts[key] = [padded[r * ps:(r + 1) * ps] for r in range(dp)]
    return n, npad, ps, parts


def group_padding(n: int, ps: int, r: int) -> int:
    """group_paddings[g] of rank r (§3.5): the padding elements inside its partition."""
    left = r * ps
    return ps if n <= left else max(0, left + ps - n)


def expected_groups(dp: int) -> list[tuple[int, int, int, dict[str, list[torch.Tensor]]]]:
    return [expected_group(list(shapes), dp) for shapes in param_shapes()]


def same(a: object, b: torch.Tensor) -> bool:
    """Bit for bit: both tensors, same dtype and shape, equal."""
    return torch.is_tensor(a) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)


@pytest.mark.parametrize("dp", TARGET_DPS)
def test_optimizer_partitions_match_rules(ds_reference, dp: int) -> None:
    files = ds_reference(1, dp)
    saved_groups = load(UCP_TAG / "zero" / "optimizer_state.pt")["param_groups"]
    for g, (shapes, (n, npad, ps, parts)) in enumerate(zip(param_shapes(), expected_groups(dp))):
        step = ucp_state(next(iter(shapes)), "step")
        assert all(same(ucp_state(name, "step"), step) for name in shapes), f"group {g}: step.pt files differ"
        hyper = {k: v for k, v in saved_groups[g].items() if k != "params"}
        for r, path in enumerate(files):
            got = load(path)["groups"][g]
            where = f"dp={dp} rank {r} group {g} (N={n} Npad={npad} ps={ps})"
            assert (got["flat_numel"], got["fp32"].numel(), got["partition_count"]) == (npad, ps, dp), where
            assert got["param_names"] == list(shapes), where
            assert same(got["fp32"], parts["fp32"][r]), f"{where}: fp32 partition"
            for key in ("exp_avg", "exp_avg_sq"):
                assert same(got["state"][key], parts[key][r]), f"{where}: {key}"
            assert set(got["state"]) == {"step", *KEYS[1:]}, where
            assert same(got["state"]["step"], step), f"{where}: step {got['state']['step']!r} != {step!r}"
            assert got["hyper"] == hyper, f"{where}: hyper-parameters {got['hyper']} != {hyper}"


@pytest.mark.parametrize("dp", TARGET_DPS)
def test_lp_weights_padding_and_counters(ds_reference, dp: int) -> None:
    source = load(UCP_TAG / "mp_rank_00_model_states.pt")
    for r, path in enumerate(ds_reference(1, dp)):
        dump = load(path)
        for name, weight in dump["module"].items():
            assert same(weight, ucp_state(name, "fp32")), f"dp={dp} rank {r}: lp {name} != zero/{name}/fp32.pt"
        for g, (got, (n, _, ps, _)) in enumerate(zip(dump["groups"], expected_groups(dp))):
            assert same(got["lp_partition"], got["fp32"]), f"dp={dp} rank {r} group {g}: lp != fp32 partition"
            assert got["group_padding"] == group_padding(n, ps, r), f"dp={dp} rank {r} group {g}"
        for key in ("global_steps", "global_samples", "skipped_steps", "lr_scheduler"):
            assert dump[key] == source[key], f"dp={dp} rank {r}: {key} {dump[key]!r} != {source[key]!r}"


@pytest.mark.parametrize("dp", TARGET_DPS)
def test_native_resave_holds_the_same_partitions(ds_reference, dp: int) -> None:
    files = ds_reference(1, dp)
    resaved = files[0].parent / "native_resaved"
    tag = (resaved / "latest").read_text()
    optim_files = {f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in range(dp)}
    assert {p.name for p in (resaved / tag).iterdir()} == {"mp_rank_00_model_states.pt"} | optim_files
    assert load(resaved / tag / "mp_rank_00_model_states.pt")["dp_world_size"] == dp
    for r, path in enumerate(files):
        dump = load(path)
        osd = load(resaved / tag / f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt")["optimizer_state_dict"]
        assert osd["partition_count"] == [dp] * len(dump["groups"])
        for g, got in enumerate(dump["groups"]):
            lean = got["fp32"].numel() - osd["group_paddings"][g]
            assert osd["group_paddings"][g] == got["group_padding"]
            assert same(osd["single_partition_of_fp32_groups"][g], got["fp32"][:lean]), f"dp={dp} rank {r} group {g}"
            state = osd["base_optimizer_state"]["state"][g]
            assert all(same(state[k], v) for k, v in got["state"].items()), f"dp={dp} rank {r} group {g}"
