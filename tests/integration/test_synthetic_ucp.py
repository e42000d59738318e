"""tests/tools/make_synthetic_ucp, the benchmark's checkpoint generator (scripts/bench.sh).

A tiny instance must look to torch like what ds_to_universal writes (the same top-level keys as
examples/tiny/universal), and reshardfs must plan and materialize it into files torch loads.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch

from ds_reference import EXAMPLES

MAKE_SYNTHETIC_UCP = "tests/tools/make_synthetic_ucp"
TINY = EXAMPLES / "tiny" / "universal" / "global_step3_universal"


@pytest.fixture(scope="session")
def make_synthetic_ucp(reshardfs: Path) -> Path:
    path = reshardfs.parents[1] / MAKE_SYNTHETIC_UCP  # reshardfs is <build>/fs/reshardfs
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"missing tool {path} (RESHARDFS_BUILD_DIR); build it with scripts/build.sh", pytrace=False)
    return path


@pytest.fixture(scope="session")
def synthetic_ucp(make_synthetic_ucp: Path, run_tool, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("synthetic_ucp")
    result = run_tool(make_synthetic_ucp, out, "--hidden", 64, "--layers", 2, "--vocab", 128, "--source-dp", 4)
    assert result.returncode == 0 and result.stderr == "", result
    return out


def load(path: Path):
    return torch.load(path, weights_only=False)


def test_layout_matches_ds_to_universal(synthetic_ucp: Path) -> None:
    assert (synthetic_ucp / "latest_universal").read_text() == "global_step100_universal"
    tag = synthetic_ucp / "global_step100_universal"
    model = load(tag / "mp_rank_00_model_states.pt")
    assert list(model) == list(load(TINY / "mp_rank_00_model_states.pt"))
    assert list(load(tag / "zero" / "optimizer_state.pt")) == list(load(TINY / "zero" / "optimizer_state.pt"))
    assert (model["dp_world_size"], model["global_steps"]) == (4, 100)

    (shapes,) = model["param_shapes"]
    assert list(shapes) == list(model["module"])
    assert sorted(p.name for p in (tag / "zero").iterdir() if p.is_dir()) == sorted(shapes)
    assert list(shapes)[:2] == ["model.embed_tokens.weight", "model.layers.0.self_attn.q_proj.weight"]
    assert shapes["lm_head.weight"] == torch.Size([128, 64])
    assert shapes["model.layers.1.mlp.down_proj.weight"] == torch.Size([64, 256])

    for name, shape in shapes.items():
        states = {s: load(tag / "zero" / name / f"{s}.pt") for s in ("fp32", "exp_avg", "exp_avg_sq")}
        for state in states.values():
            assert list(state) == ["cat_dim", "param"] and state["param"].shape == shape
        assert torch.equal(model["module"][name], states["fp32"]["param"].detach().bfloat16())
        assert bool((states["exp_avg_sq"]["param"] >= 0).all())
        step = load(tag / "zero" / name / "step.pt")
        assert step.dtype == torch.float32 and step.dim() == 0 and step.item() == 100.0


def test_plans_and_materializes(synthetic_ucp: Path, reshardfs: Path, run_tool, tmp_path: Path) -> None:
    result = run_tool(reshardfs, "plan", synthetic_ucp, "--dp", 4, "--json")
    assert result.returncode == 0, result
    plan = json.loads(result.stdout)
    assert plan["target"]["lp_dtype"] == "bfloat16" and len(plan["ranks"]) == 4

    out = tmp_path / "dp2"
    result = run_tool(reshardfs, "materialize", synthetic_ucp, out, "--dp", 2)
    assert result.returncode == 0, result
    files = sorted((out / "global_step100").glob("*.pt"))
    assert [f.name for f in files] == [
        "bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
        "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt",
        "mp_rank_00_model_states.pt",
    ]
    for f in files:
        load(f)
