"""The per-rank files reshardfs serves, against files real DeepSpeed wrote, value for value and bit for bit.

`reshardfs materialize` writes exactly the bytes a mount serves (both read the same plan through
plan::PlannedFile), so these tests pin the content of every served file:

- round trip: the bundled ZeRO-1 DP=2 checkpoint served at its own layout equals the native files
  DeepSpeed saved before the conversion (examples/tiny/native), every key, value and tensor bit;
- reshard: at a new layout it equals what DeepSpeed itself writes after its own load_universal of the
  same universal checkpoint into an engine of that layout (ds_reference's native_resaved/): the
  module weights (lp = RNE(fp32) for bf16 targets), fp32 partitions, Adam states, step, hyper-parameters,
  paddings, param_slice_mappings, ds_config (the target run's own, passed with --ds-config), scheduler
  and step counters. The layout is taken from that ds_config alone (DP from its batch sizes), as a user
  pointing reshardfs at the resuming run's config gets it.

Cross-stage targets DeepSpeed cannot load itself (a ZeRO-1 checkpoint into ZeRO-3) are compared where
DeepSpeed can produce a reference: ZeRO-1 -> ZeRO-2 here; ZeRO-3 targets from the ZeRO-3 fixture.
"""

from __future__ import annotations

import json
from collections import OrderedDict
import resource
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint_compare import assert_same_files, tensor_bits
from ds_reference import EXAMPLES
from goldens import GOLDEN_ROOT

sys.path.insert(0, str(EXAMPLES))
import make_tiny_checkpoint as tiny  # noqa: E402

UCP = EXAMPLES / "tiny" / "universal"
NATIVE = EXAMPLES / "tiny" / "native"
ZERO3_UCP = EXAMPLES.parent / "tests" / "fixtures" / "tiny_zero3" / "universal"
TAG = "global_step3"

# id: (universal checkpoint, target ZeRO stage, target DP, bf16 target)
RESHARD_CASES = {
    "zero1_dp2_to_dp1": (UCP, 1, 1, False),
    "zero1_dp2_to_dp4": (UCP, 1, 4, False),
    "zero1_to_zero2_dp2_to_dp4": (UCP, 2, 4, False),
    "zero1_fp32_to_bf16_dp2_to_dp4": (UCP, 1, 4, True),
    "zero3_dp2_to_dp1": (ZERO3_UCP, 3, 1, False),
    "zero3_dp2_to_dp4": (ZERO3_UCP, 3, 4, False),
    "zero3_dp2_same_layout": (ZERO3_UCP, 3, 2, False),
}


def materialize(reshardfs: Path, run_tool, ucp: Path, out: Path, *flags: str) -> Path:
    result = run_tool(reshardfs, "materialize", ucp, out, *flags)
    assert result.returncode == 0, result
    assert (out / "latest").read_text() == TAG
    return out / TAG


def test_round_trip_equals_the_native_files(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    served = materialize(reshardfs, run_tool, UCP, tmp_path / "served")
    names = assert_same_files(served, NATIVE / TAG)
    assert len(names) == 3, names  # mp_rank_00_model_states + 2 optimizer files


@pytest.mark.parametrize("layout", list(RESHARD_CASES))
def test_reshard_equals_deepspeeds_own_resave(layout: str, reshardfs: Path, run_tool, ds_reference,
                                              tmp_path: Path) -> None:
    ucp, stage, dp, bf16 = RESHARD_CASES[layout]
    reference = ds_reference(stage, dp, ucp, bf16)[0].parent / "native_resaved" / TAG
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(tiny.ds_config(dp, stage, bf16=bf16, load_universal=True)))
    served = materialize(reshardfs, run_tool, ucp, tmp_path / "served", "--ds-config", config)
    assert_same_files(served, reference, fix_reference=zero3_reference_fix(ucp) if stage == 3 else None)


def zero3_reference_fix(ucp: Path):
    """Corrects two defects of DeepSpeed 0.19.8's ZeRO-3 load_universal in its re-save, after checking that
    each is still there (when upstream fixes one, its check fails and tells us to drop the correction):

    - every param group gets the hyper-parameters of group 0 (stage3.py _load_universal_checkpoint updates
      each group from the first saved one), so group 1 carries group 0's lr and weight_decay; reshardfs
      serves each group its own, from the universal checkpoint's optimizer_state.pt;
    - every sub-group's state gets the same `step` tensor object, so torch's AdamW, which increments
      state['step'] in place once per sub-group step, would count each optimizer step once per sub-group;
      reshardfs serves one step tensor per sub-group, as a native ZeRO-3 save has them."""
    saved = torch.load(next(ucp.glob("*/zero/optimizer_state.pt")), weights_only=False)
    groups = saved["optimizer_state_dict"]["param_groups"]
    assert groups[0]["lr"] != groups[1]["lr"], "the fixture needs two groups with different lr"

    def fix(name: str, obj):
        if "optim_states" not in name:
            return obj
        inner = obj["optimizer_state_dict"]["optimizer_state_dict"]
        ds_groups = inner["param_groups"]
        assert [g["lr"] for g in ds_groups] == [groups[0]["lr"]] * len(ds_groups), (
            "DeepSpeed's ZeRO-3 universal loader no longer copies group 0's hyper-parameters to every "
            "group: drop this correction and compare directly")
        for ds_group, group in zip(ds_groups, groups):
            ds_group.update({k: v for k, v in group.items() if k != "params"})
        steps = [state["step"] for state in inner["state"].values()]
        assert len(steps) > 1 and all(s is steps[0] for s in steps), (
            "DeepSpeed's ZeRO-3 universal loader no longer shares one step tensor between sub-groups: "
            "drop this correction and compare directly")
        for state in inner["state"].values():
            state["step"] = state["step"].clone()
        return obj

    return fix


def test_mmap_load_equals(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    served = materialize(reshardfs, run_tool, UCP, tmp_path / "served")
    assert_same_files(served, NATIVE / TAG, mmap=True)


def test_plan_reports_sizes_and_amplification(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    served = materialize(reshardfs, run_tool, UCP, tmp_path / "served", "--dp", "4", "--lp-dtype", "bf16")
    result = run_tool(reshardfs, "plan", UCP, "--dp", "4", "--lp-dtype", "bf16", "--json")
    assert result.returncode == 0, result
    doc = json.loads(result.stdout)
    assert doc["target"] == {"tp": 1, "dp": 4, "zero_stage": 1, "lp_dtype": "bfloat16", "tag": TAG}
    sizes = {f["path"]: f["size"] for f in doc["files"]}
    assert sizes == {f"{TAG}/{p.name}": p.stat().st_size for p in served.glob("*.pt")}
    assert [(r["tp_rank"], r["dp_rank"]) for r in doc["ranks"]] == [(0, d) for d in range(4)]
    for r in doc["ranks"]:
        # Every rank reads each source byte it needs once; only the bf16 module weights, derived from
        # fp32 masters, read twice the bytes they serve.
        assert 1.0 < r["read_amplification"] < 1.5, r


# A ds_config as HF Trainer users write it: every value the Trainer knows left to it.
TRAINER_AUTO_CONFIG = {"train_batch_size": "auto", "train_micro_batch_size_per_gpu": "auto",
                       "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
                       "zero_optimization": {"stage": 2, "reduce_bucket_size": "auto"}, "bf16": {"enabled": "auto"}}


def test_trainer_auto_config_takes_dp_from_the_flag(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """With --dp, a Trainer's "auto" config still gives what it does say (ZeRO-2 here); "auto" precision falls back
    to the source run's, as an absent key does."""
    config = tmp_path / "ds_config.json"
    config.write_text(json.dumps(TRAINER_AUTO_CONFIG))
    result = run_tool(reshardfs, "plan", UCP, "--json", "--ds-config", config, "--dp", "4")
    assert result.returncode == 0, result
    assert json.loads(result.stdout)["target"] == {"tp": 1, "dp": 4, "zero_stage": 2, "lp_dtype": "float32",
                                                   "tag": TAG}


REFUSALS = {
    # id: (flags, the one error line)
    "zero3_tp2": (["--zero-stage", "3", "--tp", "2"],
                  "a ZeRO-3 target with TP 2 splits only parameters with an AutoTP layout, and this one has none"),
    "autotp_target_of_a_checkpoint_without_tp": (
        ["--ds-config", "{autotp2}"],
        "the checkpoint was saved without TP, so its split at TP 2 must come from the model's AutoTP layout "
        "(pass --model-config config.json)"),
    "autotp_unknown_model_type": (
        ["--tp", "2", "--model-config", "{gpt2_model}"],
        "no built-in AutoTP rules for model_type 'gpt2' (reshardfs knows: cohere, gemma, gemma2, gemma3_text, "
        "granite, llama, mistral, olmo, qwen2, qwen3, starcoder2)"),
    "autotp_rule_missing": (["--tp", "2", "--model-config", "{llama_model}"],
                            "no built-in AutoTP rule of model_type 'llama' matches it"),
    "batch_not_divisible": (["--ds-config", "{bad_batch}"], "train_batch_size 10 is not a multiple of"),
    # micro batch * accumulation steps is 2^64: the product once overflowed (to 0 here) and the tool divided by it.
    "batch_product_overflows": (["--ds-config", "{huge_micro_batch}"], "train_batch_size 8 is not a multiple of"),
    # Once truncated to an int without a word: stage 2^32 + 1 was served as ZeRO-1.
    "stage_out_of_range": (["--ds-config", "{huge_stage}"], "zero_optimization.stage 4294967297 is out of range"),
    # A float batch size beyond int64: casting it to an integer was undefined behaviour (UBSan: float-cast-overflow;
    # on x86 the cast happened to give a value that was refused).
    "batch_beyond_int64": (["--ds-config", "{float_batch}"], "train_batch_size must be an integer"),
    "missing_config": (["--ds-config", "/nonexistent/ds_config.json"], "/nonexistent/ds_config.json: cannot open"),
    # The HF Trainer's "auto" batch sizes: its world size decides DP, and the source's DP would be a guess.
    "trainer_auto_batch_without_dp": (["--ds-config", "{trainer_auto}"],
                                      "the target ds_config's train_batch_size is \"auto\" (the HF Trainer fills "
                                      "it in when it starts), so it gives no DP size: pass --dp"),
    "not_a_ucp": ([], "not a universal checkpoint (no zero/ folder and no latest_universal file)"),
}


@pytest.mark.parametrize("refusal", list(REFUSALS))
def test_refusals(refusal: str, reshardfs: Path, run_tool, tmp_path: Path) -> None:
    flags, message = REFUSALS[refusal]
    configs = {
        "{bad_batch}": {"train_batch_size": 10, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 1},
        "{huge_micro_batch}": {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2**32,
                               "gradient_accumulation_steps": 2**32},
        "{huge_stage}": {"zero_optimization": {"stage": 2**32 + 1}},
        "{float_batch}": {"train_batch_size": 1e300, "train_micro_batch_size_per_gpu": 1,
                          "gradient_accumulation_steps": 1},
        "{autotp2}": {"zero_optimization": {"stage": 1}, "tensor_parallel": {"autotp_size": 2}},
        "{gpt2_model}": {"model_type": "gpt2", "num_attention_heads": 4},
        "{llama_model}": {"model_type": "llama", "num_attention_heads": 4, "num_key_value_heads": 2},
        "{trainer_auto}": TRAINER_AUTO_CONFIG,
    }
    argv = []
    for flag in flags:
        if flag in configs:
            path = tmp_path / "config.json"
            path.write_text(json.dumps(configs[flag]))
            flag = str(path)
        argv.append(flag)
    source = tmp_path if refusal == "not_a_ucp" else UCP
    out = tmp_path / "out"
    result = run_tool(reshardfs, "materialize", source, out, *argv)
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("reshardfs: error: ") and message in lines[0], result
    assert not out.exists(), "a refused target must write nothing"


def test_frozen_parameters_keep_their_values_at_any_dp_and_zero_stage(reshardfs: Path, run_tool,
                                                                      tmp_path: Path) -> None:
    """A frozen parameter (a module entry without optimizer state; the converter gives it a folder holding
    fp32.pt only) is copied from the source's module at the source's own layout. At another DP degree or ZeRO
    stage it is the same tensor: a ZeRO-1/2 target's module holds it in the lp dtype, a ZeRO-2 target also
    names it in frozen_param_shapes / frozen_param_fragments (the fragment being the parameter itself, as
    DeepSpeed's param.detach() is), a ZeRO-3 target holds the (0,) placeholder and, per rank, the ceil
    partition padded with zeros. At another TP degree it is refused here: TinyModel has no AutoTP layout (the
    Llama suite re-cuts frozen parameters for TP 2). Made here from the tiny ZeRO-1 UCP by adding one such entry."""
    ucp = tmp_path / "ucp"
    shutil.copytree(UCP, ucp)
    tag = ucp / f"{TAG}_universal"
    frozen = torch.arange(32, dtype=torch.float32).reshape(8, 4) / 3
    states = torch.load(tag / "mp_rank_00_model_states.pt", weights_only=False)
    states["module"]["frozen.weight"] = frozen
    torch.save(states, tag / "mp_rank_00_model_states.pt")
    (tag / "zero" / "frozen.weight").mkdir()
    torch.save({"param": frozen}, tag / "zero" / "frozen.weight" / "fp32.pt")

    served = materialize(reshardfs, run_tool, ucp, tmp_path / "served")
    module = torch.load(served / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    reference = torch.load(NATIVE / TAG / "mp_rank_00_model_states.pt", weights_only=False)["module"]
    assert list(module) == [*reference, "frozen.weight"]
    assert torch.equal(module["frozen.weight"], frozen)
    for name, tensor in reference.items():
        assert torch.equal(tensor_bits(module[name]), tensor_bits(tensor)), name

    dp4 = materialize(reshardfs, run_tool, ucp, tmp_path / "dp4", "--dp", "4")
    states = torch.load(dp4 / "mp_rank_00_model_states.pt", weights_only=False)
    assert torch.equal(tensor_bits(states["module"]["frozen.weight"]), tensor_bits(frozen))
    assert states["frozen_param_shapes"] is None and states["frozen_param_fragments"] is None

    zero2 = materialize(reshardfs, run_tool, ucp, tmp_path / "zero2", "--dp", "4", "--zero-stage", "2",
                        "--lp-dtype", "bf16")
    states = torch.load(zero2 / "mp_rank_00_model_states.pt", weights_only=False)
    lp = states["module"]["frozen.weight"]
    assert lp.dtype == torch.bfloat16 and torch.equal(tensor_bits(lp), tensor_bits(frozen.bfloat16()))
    assert states["frozen_param_shapes"] == OrderedDict([("frozen.weight", torch.Size([8, 4]))])
    assert list(states["frozen_param_fragments"]) == ["frozen.weight"]
    assert states["frozen_param_fragments"]["frozen.weight"] is lp

    zero3 = materialize(reshardfs, run_tool, ucp, tmp_path / "zero3", "--dp", "3", "--zero-stage", "3")
    padded = torch.cat([frozen.flatten(), torch.zeros(1)])  # 32 elements over 3 ranks: 11, 11, 10 + 1 pad
    for rank in range(3):
        states = torch.load(zero3 / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt", weights_only=False)
        assert states["module"]["frozen.weight"].shape == (0,)
        assert states["frozen_param_shapes"] == OrderedDict([("frozen.weight", torch.Size([8, 4]))])
        fragment = states["frozen_param_fragments"]["frozen.weight"]
        assert torch.equal(tensor_bits(fragment), tensor_bits(padded[rank * 11:(rank + 1) * 11])), rank

    # At another TP degree only the model's AutoTP layout says how a frozen parameter is cut; TinyModel has none.
    result = run_tool(reshardfs, "materialize", ucp, tmp_path / "tp2", "--tp", "2")
    assert result.returncode == 1 and "frozen parameter 'frozen.weight': its cut at TP 2 is known only from the " \
        "model's AutoTP layout" in result.stderr, result
    assert not (tmp_path / "tp2").exists()

    # Back from the ZeRO-3 files: a UCP whose frozen values live only in the fragments, served at ZeRO-1 DP 1.
    zero3_ucp = tmp_path / "zero3_ucp"
    shutil.copytree(ZERO3_UCP, zero3_ucp)
    zero3_tag = zero3_ucp / f"{TAG}_universal"
    pn = 16  # 32 elements over the fixture's 2 ranks
    for rank in range(2):
        path = zero3_tag / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt"
        states = torch.load(path, weights_only=False)
        states["module"]["frozen.weight"] = torch.empty(0)
        states["frozen_param_shapes"] = OrderedDict([("frozen.weight", torch.Size([8, 4]))])
        states["frozen_param_fragments"] = OrderedDict([("frozen.weight", frozen.flatten()[rank * pn:(rank + 1) * pn])])
        torch.save(states, path)
    dp1 = materialize(reshardfs, run_tool, zero3_ucp, tmp_path / "zero3_to_dp1", "--dp", "1", "--zero-stage", "1")
    states = torch.load(dp1 / "mp_rank_00_model_states.pt", weights_only=False)
    assert torch.equal(tensor_bits(states["module"]["frozen.weight"]), tensor_bits(frozen))


def test_autoep_expert_tensors_are_refused(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """A parameter the converter marked as an AutoEP expert tensor (is_expert_param, ep_num_experts in its state
    files) is refused with its name, at any layout: expert-parallel slicing is not served yet."""
    ucp = tmp_path / "ucp"
    shutil.copytree(UCP, ucp)
    folder = ucp / f"{TAG}_universal" / "zero" / "fc1.weight"
    for state in ("fp32", "exp_avg", "exp_avg_sq"):
        d = torch.load(folder / f"{state}.pt", weights_only=False)
        d.update(is_expert_param=True, ep_num_experts=2)
        torch.save(d, folder / f"{state}.pt")
    result = run_tool(reshardfs, "materialize", ucp, tmp_path / "out")
    assert result.returncode == 1, result
    assert "parameter 'fc1.weight': AutoEP expert tensors are not served yet" in result.stderr, result
    assert not (tmp_path / "out").exists()


def test_materialize_refuses_a_non_empty_folder(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    (tmp_path / "keep.txt").write_text("mine")
    result = run_tool(reshardfs, "materialize", UCP, tmp_path)
    assert result.returncode == 1 and "exists and is not an empty folder" in result.stderr, result
    assert [p.name for p in tmp_path.iterdir()] == ["keep.txt"]


def flatten_tensors(value, name: str = "") -> dict[str, torch.Tensor]:
    """The tensors of a loaded file by dotted path through dicts and lists (the safetensors view's names)."""
    if isinstance(value, torch.Tensor):
        return {name: value}
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, (list, tuple)) else []
    out: dict[str, torch.Tensor] = {}
    for key, child in items:
        if isinstance(key, (str, int)) and not isinstance(key, bool):
            out.update(flatten_tensors(child, f"{name}.{key}" if name else str(key)))
    return out


@pytest.mark.parametrize("flags", [[], ["--dp", "4", "--lp-dtype", "bf16"], ["--dp", "3", "--zero-stage", "3"]],
                         ids=["zero1_dp2_same_layout", "zero1_dp4_bf16", "zero3_dp3"])
def test_safetensors_views_hold_the_same_tensors(flags: list[str], reshardfs: Path, run_tool, tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import load_file

    served = materialize(reshardfs, run_tool, UCP, tmp_path / "served", *flags)
    pt_files = sorted(served.glob("*.pt"))
    views = sorted((served / "safetensors").iterdir())
    assert [v.name for v in views] == [p.stem + ".safetensors" for p in pt_files]
    for pt, view in zip(pt_files, views):
        expected = flatten_tensors(torch.load(pt, weights_only=False))
        loaded = load_file(view)
        assert sorted(loaded) == sorted(expected), view.name
        for name, tensor in expected.items():
            got = loaded[name]
            assert got.dtype == tensor.dtype and got.shape == tensor.shape, name
            assert torch.equal(tensor_bits(got), tensor_bits(tensor)), f"{view.name}: {name}"
        with safe_open(view, framework="pt") as f:
            assert f.metadata() == {"format": "pt"}
            name = next(iter(expected))
            assert torch.equal(tensor_bits(f.get_tensor(name)), tensor_bits(expected[name]))


def ucp_with_column_parallel_fc1(tmp_path: Path) -> Path:
    """A copy of the tiny universal checkpoint with fc2.weight (32 x 32) row-parallel (cat_dim 1). The
    converter itself recorded cat_dim 0 (column-parallel) for every other parameter of this model, which
    has no universal_checkpoint_info to mark any parameter replicated."""
    ucp = tmp_path / "ucp"
    shutil.copytree(UCP, ucp)
    for name, cat_dim in (("fc1.weight", 0), ("fc2.weight", 1)):
        for state in ("fp32", "exp_avg", "exp_avg_sq"):
            path = next(ucp.glob(f"*/zero/{name}/{state}.pt"))
            saved = torch.load(path, weights_only=False)
            saved["cat_dim"] = cat_dim
            torch.save(saved, path)
    return ucp


def test_tp_slices_of_column_and_row_parallel_params(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """TP 2, DP 2: each TP rank's module holds its slice of fc1 and head (rows) and fc2 (columns),
    computed here independently from the universal fp32 tensors."""
    ucp = ucp_with_column_parallel_fc1(tmp_path)
    served = materialize(reshardfs, run_tool, ucp, tmp_path / "served", "--tp", "2", "--dp", "2")
    full = {name: torch.load(next(ucp.glob(f"*/zero/{name}/fp32.pt")), weights_only=False)["param"]
            for name in ("fc1.weight", "fc2.weight", "head.weight")}
    for t in range(2):
        model = torch.load(served / f"mp_rank_{t:02d}_model_states.pt", weights_only=False)
        assert model["mp_world_size"] == 2 and model["dp_world_size"] == 2
        module = model["module"]
        assert torch.equal(module["fc1.weight"], full["fc1.weight"][16 * t : 16 * (t + 1)])
        assert torch.equal(module["fc2.weight"], full["fc2.weight"][:, 16 * t : 16 * (t + 1)])
        assert torch.equal(module["head.weight"], full["head.weight"][32 * t : 32 * (t + 1)])
        assert model["param_shapes"][0]["fc1.weight"] == torch.Size([16, 32])
        assert model["param_shapes"][0]["fc2.weight"] == torch.Size([32, 16])
        # The rank's flat fp32 partitions concatenated over DP are its TP-local group in flat order.
        for g, shapes in enumerate(model["param_shapes"]):
            flat = torch.cat([torch.load(served / f"zero_pp_rank_{d}_mp_rank_{t:02d}_optim_states.pt",
                                         weights_only=False)["optimizer_state_dict"]["single_partition_of_fp32_groups"][g]
                              for d in range(2)])
            expected = torch.cat([module[name].reshape(-1) for name in shapes])
            assert torch.equal(flat[: expected.numel()], expected), (t, g)


def test_a_tp_split_that_does_not_divide_is_refused(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    ucp = ucp_with_column_parallel_fc1(tmp_path)
    result = run_tool(reshardfs, "materialize", ucp, tmp_path / "out", "--tp", "3")
    assert result.returncode == 1, result
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "parameter 'fc1.weight'" in lines[0] and "does not divide" in lines[0], result
    assert not (tmp_path / "out").exists()


LLAMA = EXAMPLES / "tiny_llama_tp2"


def test_autotp_round_trip_equals_the_native_tp2_files(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """A real AutoTP checkpoint (tiny Llama with grouped-query attention, TP=2, saved by DeepSpeed and
    converted by its ds_to_universal, whose only record of the splits is the affine_map): served at
    TP=2, every file equals DeepSpeed's own TP=2 native file, q/k/v/o/gate/up/down/lm_head shards included."""
    served = materialize(reshardfs, run_tool, LLAMA / "universal", tmp_path / "served", "--tp", "2", "--dp", "1",
                         "--model-config", LLAMA / "config.json")
    names = assert_same_files(served, LLAMA / "native" / TAG)
    assert len(names) == 4, names


def assert_tp1_zero12_files_hold_the_universal_tensors(ucp: Path, served: Path, dp: int) -> None:
    """At TP 1 and ZeRO-1/2: the module holds each universal fp32 tensor whole (in its logical shape), and the
    flat fp32 partitions over DP concatenate to the group in param_shapes order (checked independently of
    the planner)."""
    model = torch.load(served / "mp_rank_00_model_states.pt", weights_only=False)
    for name, tensor in model["module"].items():
        full = torch.load(next(ucp.glob(f"*/zero/{name}/fp32.pt")), weights_only=False)
        full = full["param"] if isinstance(full, dict) else full  # ZeRO-3 conversions store bare tensors
        assert torch.equal(tensor.reshape(-1), full.reshape(-1)), name
    for g, shapes in enumerate(model["param_shapes"]):
        flat = torch.cat([torch.load(served / f"zero_pp_rank_{d}_mp_rank_00_optim_states.pt", weights_only=False)
                          ["optimizer_state_dict"]["single_partition_of_fp32_groups"][g] for d in range(dp)])
        expected = torch.cat([model["module"][name].reshape(-1) for name in shapes])
        assert torch.equal(flat, expected), g
        for name, shape in shapes.items():
            assert model["module"][name].shape == shape, name


def test_autotp_to_tp1_serves_the_whole_tensors(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """AutoTP TP 2 -> TP 1, DP 2."""
    ucp = LLAMA / "universal"
    served = materialize(reshardfs, run_tool, ucp, tmp_path / "served", "--tp", "1", "--dp", "2")
    assert_tp1_zero12_files_hold_the_universal_tensors(ucp, served, 2)


def test_zero3_to_zero1_dp2_to_dp4(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """Cross-stage, which DeepSpeed's own loaders do not support: the ZeRO-3 conversion (bare flattened
    tensors) served to a ZeRO-1 DP=4 run gets its weights in their logical shapes."""
    served = materialize(reshardfs, run_tool, ZERO3_UCP, tmp_path / "served", "--zero-stage", "1", "--dp", "4")
    assert_tp1_zero12_files_hold_the_universal_tensors(ZERO3_UCP, served, 4)


def test_autotp_target_without_the_model_config_is_refused(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    result = run_tool(reshardfs, "materialize", LLAMA / "universal", tmp_path / "out", "--tp", "2", "--dp", "1")
    assert result.returncode == 1, result
    assert result.stderr.strip().splitlines() == [
        "reshardfs: error: parameter 'model.layers.0.self_attn.q_proj.weight' is split by AutoTP: a TP 2 target "
        "needs the model's num_key_value_heads (pass --model-config config.json)"], result
    assert not (tmp_path / "out").exists()


def test_more_source_files_than_the_open_file_limit(reshardfs: Path, run_tool, tmp_path: Path) -> None:
    """A universal checkpoint has 3-4 files per parameter: a 70B Llama ~2,900, a 100k-parameter MoE ~400,000, more
    than any usual open-file limit. reshardfs raises its soft limit to the hard one and keeps at most half of it
    open: past that budget source files are opened on demand (LRU). Before, a soft limit of 1024 failed a 70B
    mount with EMFILE, and a hard limit below the file count failed every checkpoint that large. Here the hard
    limit is 40 (budget 20) for 86 files: plan, materialize and the served bytes are what an unlimited run gives."""
    ucp = GOLDEN_ROOT / "hf_trainer_source" / "checkpoint-3" / "global_step3_universal"
    files = sum(1 for p in ucp.rglob("*") if p.is_file())
    assert files == 86
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    assert hard == resource.RLIM_INFINITY or hard > 2 * files, f"the hard limit here ({hard}) is too low for the test"

    def run_with_limit(limit: tuple[int, int] | None, *args) -> subprocess.CompletedProcess:
        set_limit = (lambda: resource.setrlimit(resource.RLIMIT_NOFILE, limit)) if limit else None
        return subprocess.run([str(reshardfs), *map(str, args)], capture_output=True, text=True, timeout=120,
                              check=False, preexec_fn=set_limit)

    expected_plan = run_with_limit(None, "plan", ucp, "--dp", "4", "--json")
    assert expected_plan.returncode == 0, expected_plan
    expected = run_with_limit(None, "materialize", "-q", ucp, tmp_path / "unlimited", "--dp", "4")
    assert expected.returncode == 0, expected
    for limit in [(40, hard), (40, 40)]:
        planned = run_with_limit(limit, "plan", ucp, "--dp", "4", "--json")
        assert planned.returncode == 0 and planned.stdout == expected_plan.stdout, (limit, planned.stderr)
        out = tmp_path / f"limit_{limit[1]}"
        written = run_with_limit(limit, "materialize", "-q", ucp, out, "--dp", "4")
        assert written.returncode == 0 and written.stderr == "", (limit, written.stderr)
        got = {str(p.relative_to(out)): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
        want = {str(p.relative_to(tmp_path / "unlimited")): p.read_bytes()
                for p in sorted((tmp_path / "unlimited").rglob("*")) if p.is_file()}
        assert got.keys() == want.keys() and all(got[k] == want[k] for k in want), limit
