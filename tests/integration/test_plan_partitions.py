"""The C++ planner's ZeRO-1/2 flat partitions (tests/tools/plan_partitions) against DeepSpeed's
own load_universal of the same universal checkpoint at the same layout (ds_reference), bit for
bit: every target rank's fp32 master partition, exp_avg and exp_avg_sq, padding included.

ZeRO-1: examples/tiny/universal (source DP=2, two param groups) at DP=1 and DP=4.
ZeRO-3: tests/fixtures/tiny_zero3/universal (bare-tensor UCP, source DP=2) at DP=1 and DP=4:
every sub-group flat (fp32_partitioned_groups_flat) and its Adam states.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from ds_reference import EXAMPLES

UCP = EXAMPLES / "tiny" / "universal"
ZERO3_UCP = EXAMPLES.parent / "tests" / "fixtures" / "tiny_zero3" / "universal"
STATES = ("fp32", "exp_avg", "exp_avg_sq")


def planned(plan_partitions: Path, run_tool, out: Path, dp: int, stage: int = 1, ucp: Path = UCP) -> list[dict]:
    out.mkdir()
    result = run_tool(plan_partitions, str(ucp), str(out), "--tp", "1", "--dp", str(dp), "--zero-stage", str(stage))
    assert result.returncode == 0, result
    return json.loads((out / "manifest.json").read_text())


def as_tensor(path: Path) -> torch.Tensor:
    return torch.frombuffer(bytearray(path.read_bytes()), dtype=torch.float32)


def assert_states_equal(plan_dir: Path, r: int, g: int, numel: int, ds: dict) -> None:
    """The planned fp32 / exp_avg / exp_avg_sq of rank r, group g == DeepSpeed's, bit for bit."""
    expected = {"fp32": ds["fp32"], "exp_avg": ds["state"]["exp_avg"], "exp_avg_sq": ds["state"]["exp_avg_sq"]}
    for state in STATES:
        got = as_tensor(plan_dir / f"t0_r{r}_g{g}_{state}.bin")
        assert got.numel() == numel == expected[state].numel(), (r, g, state)
        assert torch.equal(got.view(torch.int32), expected[state].view(torch.int32)), (r, g, state)


@pytest.mark.parametrize("dp", [1, 4])
def test_zero1_partitions_equal_deepspeed(dp: int, ds_reference, plan_partitions: Path, run_tool,
                                          tmp_path: Path) -> None:
    manifest = planned(plan_partitions, run_tool, tmp_path / "plan", dp)
    dumps = ds_reference(1, dp)
    assert len(dumps) == dp
    by_rank_group = {(m["dp_rank"], m["group"]): m for m in manifest}
    for r, dump in enumerate(dumps):
        groups = torch.load(dump, weights_only=False)["groups"]
        for g, ds in enumerate(groups):
            m = by_rank_group[(r, g)]
            assert m["params"] == ds["param_names"], (r, g)
            assert m["padded_numel"] == ds["flat_numel"], (r, g)
            assert m["group_padding"] == ds["group_padding"], (r, g)
            assert_states_equal(tmp_path / "plan", r, g, m["partition_numel"], ds)


@pytest.mark.parametrize("dp", [1, 4])
def test_zero3_sub_groups_equal_deepspeed(dp: int, ds_reference, plan_partitions: Path, run_tool,
                                          tmp_path: Path) -> None:
    manifest = planned(plan_partitions, run_tool, tmp_path / "plan", dp, stage=3, ucp=ZERO3_UCP)
    dumps = ds_reference(3, dp, ZERO3_UCP)
    assert len(dumps) == dp
    by_rank_group = {(m["dp_rank"], m["group"]): m for m in manifest}
    for r, dump in enumerate(dumps):
        sub_groups = torch.load(dump, weights_only=False)["sub_groups"]
        assert len(sub_groups) == len([m for m in manifest if m["dp_rank"] == r]), r
        for j, ds in enumerate(sub_groups):
            m = by_rank_group[(r, j)]
            assert m["params"] == ds["param_names"], (r, j)
            assert m["param_group"] == ds["group_id"], (r, j)
            assert_states_equal(tmp_path / "plan", r, j, m["partition_numel"], ds)
