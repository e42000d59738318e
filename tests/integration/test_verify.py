"""`reshardfs verify`: passes on every committed example and fixture, and fails with a list of problems on each
committed bad fixture and on the problems it exists to find (missing states, NaN and Inf, an unplannable target).

The fixture overlays (tests/fixtures/ucp_bad, ucp_edge) are laid over a copy of the tiny universal checkpoint, as
the C++ unit tests do (tests/fixtures/make_bad_ucp.py says what each holds).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from ds_reference import EXAMPLES

REPO = EXAMPLES.parent
TINY = EXAMPLES / "tiny" / "universal"
TINY_TAG = "global_step3_universal"
FIXTURES = REPO / "tests" / "fixtures"

GOOD = {
    "tiny": (TINY, []),
    "tiny_dp4_bf16": (TINY, ["--dp", "4", "--lp-dtype", "bf16"]),
    "tiny_to_zero3_dp3": (TINY, ["--zero-stage", "3", "--dp", "3"]),
    "tiny_zero3_dp3_fp16": (FIXTURES / "tiny_zero3" / "universal", ["--zero-stage", "3", "--dp", "3", "--lp-dtype", "fp16"]),
    "llama_tp2": (EXAMPLES / "tiny_llama_tp2" / "universal", []),
    "llama_tp2_to_tp1_dp2": (EXAMPLES / "tiny_llama_tp2" / "universal", ["--tp", "1", "--dp", "2"]),
    "llama_tp2_to_tp4": (EXAMPLES / "tiny_llama_tp2" / "universal",
                         ["--tp", "4", "--model-config", EXAMPLES / "tiny_llama_tp2" / "config.json"]),
}
EDGE_FLAGS = {"categories": ["--dp", "2", "--padded-vocab", "64"]}
# Open() accepts an empty affine_map (make_bad_ucp.py: "the one case here it does"), so verify does too.
ACCEPTED_BAD = {"affine_map"}
# What each bad overlay breaks: the file the one problem names.
BAD_FILE = {
    "autotp_unsupported": "mp_rank_00_model_states.pt",
    "frozen_non_contiguous": "mp_rank_00_model_states.pt",
    "non_contiguous": "zero/fc1.weight/fp32.pt",
    "shape_mismatch": "zero/fc1.bias/exp_avg_sq.pt",
    "unknown_info_key": "mp_rank_00_model_states.pt",
    "unknown_state_key": "zero/fc1.bias/exp_avg.pt",
    "version_0_5": "mp_rank_00_model_states.pt",
}


def overlaid(case: Path, tmp_path: Path) -> Path:
    ucp = tmp_path / "ucp"
    shutil.copytree(TINY, ucp)
    shutil.copytree(case, ucp / TINY_TAG, dirs_exist_ok=True)
    return ucp


def verify_json(reshardfs: Path, run_tool, source: Path, *flags: object):
    result = run_tool(reshardfs, "verify", source, *flags, "--json")
    return result, json.loads(result.stdout)


def assert_passes(reshardfs: Path, run_tool, source: Path, *flags: object) -> dict:
    result, doc = verify_json(reshardfs, run_tool, source, *flags)
    assert result.returncode == 0 and result.stderr == "", result
    assert doc["problems"] == []
    fp32_files = sorted(Path(doc["source"]).glob("zero/*/fp32.pt"))
    assert doc["states"]["fp32"]["tensors"] == len(fp32_files) > 0
    assert doc["parameters"]["total"] == len(fp32_files)
    if flags:
        plan = json.loads(run_tool(reshardfs, "plan", source, *flags, "--json").stdout)
        planned = {f["path"]: f["size"] for f in plan["files"]}
        checked = {f["path"]: f["size"] for f in doc["files"] if f["path"].endswith(".pt")}
        assert checked == planned  # every file the mount would serve, at its size
        assert len(doc["files"]) == 2 * len(planned)  # and each one's safetensors view
        assert all(f["ok"] for f in doc["files"]), doc["files"]
        assert all(f["tensors"] > 0 for f in doc["files"] if "optim_states" in f["path"]), doc["files"]
    else:
        assert "files" not in doc  # no target flag: the source alone
    return doc


@pytest.mark.parametrize("name", list(GOOD))
def test_passes_on_the_examples(name: str, reshardfs: Path, run_tool) -> None:
    source, flags = GOOD[name]
    assert_passes(reshardfs, run_tool, source, *flags)


@pytest.mark.parametrize("overlay", sorted(p.name for p in (FIXTURES / "ucp_edge").iterdir()))
def test_passes_on_the_edge_fixtures(overlay: str, reshardfs: Path, run_tool, tmp_path: Path) -> None:
    ucp = overlaid(FIXTURES / "ucp_edge" / overlay, tmp_path)
    assert_passes(reshardfs, run_tool, ucp, *EDGE_FLAGS.get(overlay, ["--dp", "2"]))


def test_text_report(reshardfs: Path, run_tool) -> None:
    result = run_tool(reshardfs, "verify", TINY, "--dp", "4")
    assert result.returncode == 0 and result.stderr == "", result
    lines = result.stdout.splitlines()
    assert lines[0] == f"source: {TINY / TINY_TAG}"
    assert lines[1] == "  parameters: 7 (7 trained, 0 fp32 only)"
    assert lines[3].split() == ["exp_avg", "7", "6272", "25088", "0"]
    assert lines[-1] == "problems: none"
    assert sum(line.endswith("  ok") for line in lines) == 2 * (1 + 4)  # model states + 4 optimizer files, .pt and view


@pytest.mark.parametrize("overlay", sorted(p.name for p in (FIXTURES / "ucp_bad").iterdir()))
def test_fails_on_each_bad_fixture(overlay: str, reshardfs: Path, run_tool, tmp_path: Path) -> None:
    ucp = overlaid(FIXTURES / "ucp_bad" / overlay, tmp_path)
    if overlay in ACCEPTED_BAD:
        assert_passes(reshardfs, run_tool, ucp, "--dp", "2")
        return
    result = run_tool(reshardfs, "verify", ucp, "--dp", "2")
    assert result.returncode == 1, result
    where = ucp if overlay != "frozen_non_contiguous" else ucp / TINY_TAG  # opened, only the plan refuses it
    assert result.stderr == f"reshardfs: error: verify found 1 problem in {where} (listed above)\n", result
    problems = result.stdout.split("problems: 1\n", 1)[1].splitlines()
    assert len(problems) == 1 and problems[0].startswith(f"  - {ucp / TINY_TAG / BAD_FILE[overlay]}: "), result


def test_lists_every_missing_optimizer_state(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    ucp = tmp_path / "ucp"
    shutil.copytree(TINY, ucp)
    zero = ucp / TINY_TAG / "zero"
    (zero / "fc1.bias" / "exp_avg.pt").unlink()
    (zero / "head.weight" / "exp_avg_sq.pt").unlink()
    result, doc = verify_json(reshardfs, run_tool, ucp)
    assert result.returncode == 1, result
    assert sorted(doc["problems"]) == [
        f"parameter 'fc1.bias': no exp_avg.pt in {zero / 'fc1.bias'} (it is trained: param_shapes lists it)",
        f"parameter 'head.weight': no exp_avg_sq.pt in {zero / 'head.weight'} (it is trained: param_shapes lists it)",
    ]
    assert doc["states"]["exp_avg"]["tensors"] == 6 and doc["states"]["exp_avg_sq"]["tensors"] == 6


def test_counts_nan_and_inf_per_state(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    ucp = tmp_path / "ucp"
    shutil.copytree(TINY, ucp)
    path = ucp / TINY_TAG / "zero" / "fc2.weight" / "exp_avg_sq.pt"
    state = torch.load(path, weights_only=True)
    flat = state["param"].view(-1)
    flat[5], flat[77], flat[1000] = float("nan"), float("inf"), float("-inf")
    torch.save(state, path)
    result, doc = verify_json(reshardfs, run_tool, ucp)
    assert result.returncode == 1, result
    assert doc["states"]["exp_avg_sq"]["non_finite"] == 3
    assert doc["states"]["fp32"]["non_finite"] == 0 and doc["states"]["exp_avg"]["non_finite"] == 0
    assert doc["problems"] == [f"parameter 'fc2.weight' exp_avg_sq: {path}: 3 of {flat.numel()} values are NaN or infinite"]


def test_reports_a_target_that_cannot_be_planned(reshardfs: Path, run_tool) -> None:
    result, doc = verify_json(reshardfs, run_tool, TINY, "--zero-stage", "3", "--tp", "2")
    assert result.returncode == 1, result
    assert doc["problems"] == ["parameter 'fc1.weight': a ZeRO-3 target with TP 2 splits only parameters with an "
                               "AutoTP layout, and this one has none"]
    assert doc["states"]["fp32"]["non_finite"] == 0  # the source was still checked


def test_a_source_that_is_not_a_checkpoint(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    result = run_tool(reshardfs, "verify", tmp_path)
    assert result.returncode == 1, result
    problems = result.stdout.split("problems: 1\n", 1)[1].splitlines()
    assert len(problems) == 1 and problems[0].startswith(f"  - {tmp_path}"), result
    assert result.stderr == f"reshardfs: error: verify found 1 problem in {tmp_path} (listed above)\n", result
