"""A native DeepSpeed checkpoint as the source: every file served from it must be the file served from DeepSpeed's own
ds_to_universal conversion of it, byte for byte.

Sources are native checkpoints real DeepSpeed 0.19.8 saved (native_sources.py: examples/tiny/native, the AutoTP
Llama's, and the native re-saves kept in the goldens), each beside its ds_to_universal conversion (conftest's
`converted`). Resuming from a native mount is compared with DeepSpeed's load_universal of the conversion in
test_resume_from_mount.py (and the seed case in test_llama_resume.py).
"""

from __future__ import annotations

import filecmp
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from checkpoint_compare import assert_same_values, load
from ds_reference import EXAMPLES, REFERENCE_TRAIN_STEPS, dump_target_states
from fuse_mount import requires_fuse, served_while
from goldens import LLAMA_SOURCES, llama_model
from native_sources import COMMITTED_CONVERSIONS, GOLDENS, SOURCES, convert
from tiers import tiered

sys.path.insert(0, str(EXAMPLES))
import make_tiny_llama_checkpoint as llama  # noqa: E402

REPO = EXAMPLES.parent
DEFAULT_SOURCES = ("tiny-z1-dp2", "z2-dp4-bf16", "z3-dp2-fp32", "llama-tp2-z1")
# Flags a source needs whatever the target (the model config: AutoTP shard sizes at TP > 1).
SOURCE_FLAGS = {"llama-tp2-z1": ["--model-config", EXAMPLES / "tiny_llama_tp2" / "config.json"]}
# Targets: (ZeRO stage, DP, lp dtype).
TARGETS = [(z, dp, lp) for z in (1, 2, 3) for dp in (1, 3, 4) for lp in ("fp32", "bf16")]


def materialize(reshardfs: Path, run_tool, source: Path, out: Path, stage: int, dp: int, lp: str,
                flags: list = ()) -> list[Path]:
    result = run_tool(reshardfs, "materialize", source, out, "--zero-stage", stage, "--dp", dp, "--lp-dtype", lp,
                      *flags, "-q")
    assert result.returncode == 0, result
    return sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file())


@pytest.mark.parametrize("source_id", tiered(SOURCES, default=DEFAULT_SOURCES))
def test_native_source_serves_the_files_of_its_conversion(source_id, converted, reshardfs, run_tool, tmp_path):
    universal = converted(source_id)
    compared = 0
    for stage, dp, lp in TARGETS:
        case = f"z{stage}-dp{dp}-{lp}"
        flags = SOURCE_FLAGS.get(source_id, [])
        native_files = materialize(reshardfs, run_tool, SOURCES[source_id], tmp_path / "n" / case, stage, dp, lp, flags)
        universal_files = materialize(reshardfs, run_tool, universal, tmp_path / "u" / case, stage, dp, lp, flags)
        assert native_files == universal_files, case
        for rel in native_files:
            a, b = tmp_path / "n" / case / rel, tmp_path / "u" / case / rel
            assert filecmp.cmp(a, b, shallow=False), f"{case}: {rel} differs"
            compared += 1
    assert compared >= len(TARGETS) * 2
    print(f"{source_id}: {compared} served files byte-identical across {len(TARGETS)} targets")


@requires_fuse
@pytest.mark.parametrize("source_id", tiered(SOURCES, default=DEFAULT_SOURCES))
def test_mount_shows_the_universal_checkpoint_ds_to_universal_writes(source_id, converted, reshardfs, tmp_path):
    """MOUNT/latest_universal and MOUNT/<tag>_universal/ hold what ds_to_universal wrote: the same files, the same
    dict keys in the same order, the same values bit for bit (torch.load of both); model-states files byte for byte."""
    reference = converted(source_id)
    root = (reference / "latest_universal").read_text().strip()
    expected = sorted(p.relative_to(reference / root) for p in (reference / root).rglob("*") if p.is_file())
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def compare() -> int:
        assert (mnt / "latest_universal").read_text() == root
        served = sorted(p.relative_to(mnt / root) for p in (mnt / root).rglob("*") if p.is_file())
        assert served == expected
        for rel in expected:
            try:
                assert_same_values(load(mnt / root / rel), load(reference / root / rel))
            except AssertionError as e:
                raise AssertionError(f"{rel}: {e}") from None
            if rel.name.endswith("_model_states.pt"):
                assert (mnt / root / rel).read_bytes() == (reference / root / rel).read_bytes(), rel
        return len(expected)

    n = served_while([reshardfs, "mount", SOURCES[source_id], mnt, "--dp", 2, *SOURCE_FLAGS.get(source_id, []), "-f"],
                     mnt, tmp_path / "mount.log",
                     compare)
    assert n > 0
    print(f"{source_id}: {n} universal-checkpoint files equal to ds_to_universal's")


def assert_weights_are_zero_to_fp32s(weights: Path, native: Path) -> int:
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    served = load_file(weights)
    expected = get_fp32_state_dict_from_zero_checkpoint(str(native))
    # The one designed difference: frozen parameters of a ZeRO-1 source, which zero_to_fp32 drops (it reads them
    # from frozen_param_fragments, which ZeRO-1 does not write); served as the module holds them.
    extra = sorted(set(served) - set(expected))
    if extra:
        tag = (native / "latest").read_text().strip()
        model_states = load(native / tag / "mp_rank_00_model_states.pt")
        assert model_states.get("frozen_param_fragments") is None, extra
        for name in extra:
            assert name not in model_states["buffer_names"], name
            assert torch.equal(served[name].view(torch.uint8), model_states["module"][name].contiguous().view(torch.uint8))
    assert sorted(set(served) - set(extra)) == sorted(expected)
    for name, tensor in expected.items():
        got = served[name]
        assert (got.dtype, got.shape) == (tensor.dtype, tensor.shape), name
        assert torch.equal(got.view(torch.uint8), tensor.contiguous().view(torch.uint8)), name
    return len(expected)


@requires_fuse
@pytest.mark.parametrize("source_id", tiered([*(s for s in SOURCES if s != "llama-tp2-z1"), "tiny-universal"],
                                             default=(*(s for s in DEFAULT_SOURCES if s != "llama-tp2-z1"),
                                                      "tiny-universal")))
def test_model_safetensors_is_zero_to_fp32s_state_dict(source_id, reshardfs, tmp_path):
    """MOUNT/<tag>/model.safetensors holds what zero_to_fp32's get_fp32_state_dict_from_zero_checkpoint returns for
    the native checkpoint: the same names, dtypes, shapes and bits (also when mounting its universal conversion)."""
    native = SOURCES["tiny-z1-dp2" if source_id == "tiny-universal" else source_id]
    source = EXAMPLES / "tiny" / "universal" if source_id == "tiny-universal" else native
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    n = served_while([reshardfs, "mount", source, mnt, "--dp", 3, "-f"], mnt, tmp_path / "mount.log",
                     lambda: assert_weights_are_zero_to_fp32s(mnt / "global_step3" / "model.safetensors", native))
    assert n > 0


@requires_fuse
def test_model_safetensors_of_a_tp2_source_is_its_conversions_fp32(reshardfs, tmp_path):
    """At TP 2 (where zero_to_fp32 does not merge TP slices) model.safetensors holds each trained parameter's full
    fp32 master as ds_to_universal merged it (zero/<name>/fp32.pt's 'param'), bit for bit."""
    from safetensors.torch import load as load_bytes

    universal = COMMITTED_CONVERSIONS["llama-tp2-z1"]
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    served = served_while([reshardfs, "mount", SOURCES["llama-tp2-z1"], mnt, "--dp", 1,
                           *SOURCE_FLAGS["llama-tp2-z1"], "-f"], mnt,
                          tmp_path / "mount.log", lambda: load_bytes((mnt / "global_step3" / "model.safetensors").read_bytes()))
    assert_weights_are_the_conversions(served, universal)


def assert_weights_are_the_conversions(served: dict, universal: Path) -> None:
    """Every trained parameter of `served` (a loaded model.safetensors) is the conversion's full fp32 'param'."""
    tag_dir = universal / (universal / "latest_universal").read_text().strip()
    model_states = load(next(tag_dir.glob("*model_states.pt")))
    trained = [name for group in model_states["param_shapes"] for name in group]
    assert trained and set(trained) <= set(served)
    for name in trained:
        expected = load(tag_dir / "zero" / name / "fp32.pt")
        expected = expected["param"] if isinstance(expected, dict) else expected
        got = served[name]
        assert got.dtype == expected.dtype and got.numel() == expected.numel(), name
        assert torch.equal(got.reshape(-1).view(torch.uint8), expected.reshape(-1).view(torch.uint8)), name


@requires_fuse
@pytest.mark.parametrize("dtype", ["bf16", "fp16"])
def test_export_dtype_rounds_the_masters(dtype, reshardfs, run_tool, tmp_path):
    """--export-dtype: model.safetensors holds zero_to_fp32's tensors as torch rounds them (.to(dtype)), through
    the mount and materialize alike."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    from safetensors.torch import load_file

    torch_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    native = SOURCES["z2-dp4-bf16"]
    expected = {k: v.to(torch_dtype) for k, v in get_fp32_state_dict_from_zero_checkpoint(str(native)).items()}
    out = tmp_path / "out"
    result = run_tool(reshardfs, "materialize", native, out, "--dp", 3, "--export-dtype", dtype, "-q")
    assert result.returncode == 0, result
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    served = served_while([reshardfs, "mount", native, mnt, "--dp", 3, "--export-dtype", dtype, "-f"], mnt,
                          tmp_path / "mount.log", lambda: (mnt / "global_step3" / "model.safetensors").read_bytes())
    assert served == (out / "global_step3" / "model.safetensors").read_bytes()
    got = load_file(out / "global_step3" / "model.safetensors")
    assert sorted(got) == sorted(expected)
    for name, tensor in expected.items():
        assert got[name].dtype == torch_dtype, name
        assert torch.equal(got[name].view(torch.uint8), tensor.contiguous().view(torch.uint8)), name


@requires_fuse
def test_load_universal_from_the_mount_of_a_native_source(reshardfs, tmp_path):
    """DeepSpeed's own load_universal, pointed at the mount of examples/tiny/native, resumes exactly as it does from
    the committed ds_to_universal output (the golden of that run): every rank's state, then 3 training steps. One
    DeepSpeed launch (about 8 s here): the one end-to-end check that a universal loader works with no conversion."""
    golden = GOLDENS / "load_universal-tiny-z1-dp4-fp32"
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    out = tmp_path / "run"
    served_while([reshardfs, "mount", SOURCES["tiny-z1-dp2"], mnt, "--dp", 4, "-f"], mnt, tmp_path / "mount.log",
                 lambda: dump_target_states(mnt, 1, 4, out, train_steps=REFERENCE_TRAIN_STEPS))
    for rank in range(4):
        for name in (f"rank_{rank}.pt", f"after_rank_{rank}.pt"):
            try:
                assert_same_values(load(out / name), load(golden / name))
            except AssertionError as e:
                raise AssertionError(f"{name}: {e}") from None
        losses = f"losses_rank_{rank}.json"
        assert (out / losses).read_text() == (golden / losses).read_text()


@requires_fuse
def test_mount_of_a_native_source_reads_like_materialize(reshardfs, run_tool, tmp_path):
    """The FUSE server opens a native source too; torch.load of a served file gives the materialized file's tensors."""
    source = SOURCES["tiny-z1-dp2"]
    files = materialize(reshardfs, run_tool, source, tmp_path / "m", 2, 4, "bf16")
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def read_all() -> dict[Path, bytes]:
        return {rel: (mnt / rel).read_bytes() for rel in files}

    served = served_while([reshardfs, "mount", source, mnt, "--zero-stage", 2, "--dp", 4, "--lp-dtype", "bf16", "-f"],
                          mnt, tmp_path / "mount.log", read_all)
    for rel, data in served.items():
        assert data == (tmp_path / "m" / rel).read_bytes(), rel
    optim = next(rel for rel in files if rel.name.endswith("optim_states.pt"))
    state = torch.load(tmp_path / "m" / optim, map_location="cpu", weights_only=False)
    assert state["optimizer_state_dict"]["single_partition_of_fp32_groups"][0].dtype == torch.float32


def test_native_source_refusals_are_one_line(reshardfs, run_tool, tmp_path):
    broken = tmp_path / "broken"
    subprocess.run(["cp", "-r", str(SOURCES["z2-dp4-fp32"]), str(broken)], check=True)
    (broken / "global_step3" / "zero_pp_rank_2_mp_rank_00_optim_states.pt").unlink()
    missing = run_tool(reshardfs, "plan", broken, "--dp", 2)
    assert missing.returncode != 0
    lines = missing.stderr.strip().splitlines()
    assert len(lines) == 1 and "no optimizer file for DP rank 2" in lines[0], missing

    # ZeRO-Infinity's NVMe offload keeps the fp32 partitions and moments in swap files: a save without them (empty
    # tensors in their place) is refused as such, not as fragments past their partition.
    swapped = tmp_path / "swapped"
    shutil.copytree(SOURCES["z3-dp2-fp32"], swapped)
    for path in sorted(swapped.glob("global_step3/*optim_states.pt")):
        optim = load(path)
        osd = optim["optimizer_state_dict"]
        osd["fp32_flat_groups"] = [torch.empty(0) for _ in osd["fp32_flat_groups"]]
        for state in osd["optimizer_state_dict"]["state"].values():
            state["exp_avg"], state["exp_avg_sq"] = torch.empty(0), torch.empty(0)
        optim["ds_config"]["zero_optimization"]["offload_optimizer"] = {"device": "nvme", "nvme_path": "/local_nvme"}
        torch.save(optim, path)
    refused = run_tool(reshardfs, "plan", swapped, "--dp", 2)
    assert refused.returncode != 0
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and "offloads the optimizer to NVMe" in lines[0], refused


@requires_fuse
def test_two_sub_parameter_pattern_at_tp2_joins_as_the_converter(reshardfs, run_tool, tmp_path):
    """Megatron's parameter_with_2_sub_params_cat_dim_0 at TP 2: the converter joins every rank's first
    torch.chunk(slice, 2) and then every rank's second. The AutoTP Llama source is re-saved with that pattern for
    its gate_proj weights and no affine_map (so the category patterns decide every parameter), converted by
    ds_to_universal, and the native mount's universal view must equal the conversion value for value, the files
    served at TP 1 byte for byte."""
    native = tmp_path / "native"
    shutil.copytree(SOURCES["llama-tp2-z1"], native)
    tag = (native / "latest").read_text().strip()
    for path in sorted((native / tag).glob("mp_rank_*_model_states.pt")):
        model_states = load(path)
        info = model_states["universal_checkpoint_info"]
        del info["affine_map"]
        info["parameter_with_2_sub_params_cat_dim_0"] = [r"^model\.layers\.\d+\.mlp\.gate_proj\.weight$"]
        torch.save(model_states, path)
    universal = convert(native, tmp_path / "ucp")
    root = (universal / "latest_universal").read_text().strip()
    gate = universal / root / "zero" / "model.layers.0.mlp.gate_proj.weight" / "fp32.pt"
    assert load(gate)["param_n_sub_params"] == 2, "the conversion did not take the pattern"
    expected = sorted(p.relative_to(universal / root) for p in (universal / root).rglob("*") if p.is_file())
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def compare() -> None:
        for rel in expected:
            try:
                assert_same_values(load(mnt / root / rel), load(universal / root / rel))
            except AssertionError as e:
                raise AssertionError(f"{rel}: {e}") from None

    flags = ["--model-config", EXAMPLES / "tiny_llama_tp2" / "config.json", "--padded-vocab", 128]
    served_while([reshardfs, "mount", native, mnt, "--dp", 1, *flags, "-f"], mnt, tmp_path / "mount.log", compare)
    for lp in ("fp32", "bf16"):
        served = [materialize(reshardfs, run_tool, source, tmp_path / name / lp, 1, 2, lp, [*flags, "--tp", 1])
                  for name, source in (("n", native), ("u", universal))]
        assert served[0] == served[1], lp
        for rel in served[0]:
            assert filecmp.cmp(tmp_path / "n" / lp / rel, tmp_path / "u" / lp / rel, shallow=False), (lp, rel)


NORMS = r"^model\.(layers\.\d+\.(input|post_attention)_layernorm|norm)\.weight$"


def averaged_source(native: Path, tp: int) -> Path:
    """examples/tiny_llama_tp2/native re-saved as a Megatron-style source whose norms are averaged over its TP ranks
    (parameter_to_average_patterns, no affine_map), at TP 2 or, with TP rank 1's files copied as rank 2, at TP 3. Every
    TP rank but 0 gets its fp32 masters and Adam moments scaled by exp(N(0, 0.01)) elementwise (the replicated
    embedding excepted: the converter checks that its slices agree), so the slices differ and their mean is neither
    of them; every rank's first exp_avg element of model.norm.weight is set to -0.0, where
    Python's sum(), which starts from 0, gives +0.0."""
    shutil.copytree(SOURCES["llama-tp2-z1"], native)
    tag = native / (native / "latest").read_text().strip()
    if tp == 3:
        shutil.copy(tag / "mp_rank_01_model_states.pt", tag / "mp_rank_02_model_states.pt")
        shutil.copy(tag / "zero_pp_rank_0_mp_rank_01_optim_states.pt", tag / "zero_pp_rank_0_mp_rank_02_optim_states.pt")
    for rank in range(tp):
        path = tag / f"mp_rank_{rank:02d}_model_states.pt"
        model_states = load(path)
        model_states["mp_world_size"] = tp
        model_states["checkpoint_parallel_dimensions"]["tp_degree"] = tp
        info = model_states["universal_checkpoint_info"]
        del info["affine_map"]
        info["tp_replicated_parameter_patterns"] = [p for p in info["tp_replicated_parameter_patterns"] if "norm" not in p]
        info["parameter_to_average_patterns"] = [NORMS]
        torch.save(model_states, path)
        path = tag / f"zero_pp_rank_0_mp_rank_{rank:02d}_optim_states.pt"
        optim = load(path)
        osd = optim["optimizer_state_dict"]
        generator = torch.Generator().manual_seed(rank)
        with torch.no_grad():
            for g, flat in enumerate(osd["single_partition_of_fp32_groups"]):
                moments = osd["base_optimizer_state"]["state"][g]
                for name, fragment in osd["param_slice_mappings"][g].items():
                    for tensor in (flat, moments["exp_avg"], moments["exp_avg_sq"]):
                        if rank > 0 and name != "model.embed_tokens.weight":  # replicated: the converter checks it
                            piece = tensor.narrow(0, fragment.start, fragment.numel)
                            piece.mul_(torch.exp(0.01 * torch.randn(piece.shape, generator=generator)))
                if "model.norm.weight" in osd["param_slice_mappings"][g]:
                    moments["exp_avg"][osd["param_slice_mappings"][g]["model.norm.weight"].start] = -0.0
        torch.save(optim, path)
    return native


@requires_fuse
@pytest.mark.parametrize("tp", [2, 3])
def test_averaged_patterns_at_tp_are_the_converters_mean(tp, reshardfs, run_tool, tmp_path):
    """parameter_to_average_patterns at TP > 1: ds_to_universal writes sum(slices) / len(slices), a value no file
    holds; the native mount computes it in the same order of operations (float32 division by 3 included, and the
    +0.0 that sum() makes of -0.0). Its universal view must equal the conversion value for value, and at TP 2 (a real
    layout) the files served at TP 1 byte for byte."""
    native = averaged_source(tmp_path / "native", tp)
    universal = convert(native, tmp_path / "ucp")
    root = (universal / "latest_universal").read_text().strip()
    norm = universal / root / "zero" / "model.norm.weight"
    slices = [load(native / "global_step3" / f"zero_pp_rank_0_mp_rank_{r:02d}_optim_states.pt") for r in range(tp)]
    first = slices[0]["optimizer_state_dict"]["param_slice_mappings"][1]["model.norm.weight"]
    rank0 = slices[0]["optimizer_state_dict"]["single_partition_of_fp32_groups"][1].narrow(0, first.start, first.numel)
    assert not torch.equal(load(norm / "fp32.pt")["param"], rank0), "the conversion did not average the norm"
    assert str(load(norm / "exp_avg.pt")["param"][0].item()) == "0.0", "sum() of -0.0 slices is +0.0 there"
    expected = sorted(p.relative_to(universal / root) for p in (universal / root).rglob("*") if p.is_file())
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def compare() -> None:
        assert sorted(p.relative_to(mnt / root) for p in (mnt / root).rglob("*") if p.is_file()) == expected
        for rel in expected:
            try:
                assert_same_values(load(mnt / root / rel), load(universal / root / rel))
            except AssertionError as e:
                raise AssertionError(f"{rel}: {e}") from None

    flags = ["--model-config", EXAMPLES / "tiny_llama_tp2" / "config.json", "--padded-vocab", 128]
    served_while([reshardfs, "mount", native, mnt, "--dp", 1, "--tp", 1, *flags, "-f"], mnt, tmp_path / "mount.log",
                 compare)
    verified = run_tool(reshardfs, "verify", native, "--tp", 1, *flags)
    assert verified.returncode == 0, verified
    if tp > 2:
        return
    for lp in ("fp32", "bf16"):
        served = [materialize(reshardfs, run_tool, source, tmp_path / name / lp, 1, 2, lp, [*flags, "--tp", 1])
                  for name, source in (("n", native), ("u", universal))]
        assert served[0] == served[1], lp
        for rel in served[0]:
            assert filecmp.cmp(tmp_path / "n" / lp / rel, tmp_path / "u" / lp / rel, shallow=False), (lp, rel)


# Llama-family native sources made live by examples/make_tiny_llama_checkpoint.py in the full tier (the goldens
# keep only their conversions): ZeRO-1 and ZeRO-3 without TP, a tied head (Qwen2), frozen layers, AutoTP ZeRO-3 at TP 2,
# and Phi-3 at AutoTP TP 2, whose fused qkv_proj / gate_up_proj affine maps join per sub-parameter.
LLAMA_NATIVE = ("tp1_zero1", "tp1_zero3", "qwen2_tied_tp1_zero1", "llama_frozen_tp1_zero1", "tp2_zero3",
                "phi3_tp2_zero1")


@requires_fuse
@pytest.mark.timeout(900)
@pytest.mark.parametrize("source_id", tiered(LLAMA_NATIVE, default=()))
def test_llama_native_sources(source_id, references, reshardfs, run_tool, tmp_path):
    """From each native Llama-family source: the files served at ZeRO-1 DP 2 bf16 and at AutoTP TP 2 ZeRO-3 equal
    those served from its ds_to_universal conversion byte for byte (the TP 1 -> AutoTP TP 2 seed case from a native
    source included); the mount's universal view equals the conversion value for value; model.safetensors equals
    zero_to_fp32's state dict (tied and frozen parameters included; see assert_weights_are_zero_to_fp32s)."""
    src = references.llama_source(source_id)
    native, universal, config = src / "native", src / "universal", src / "config.json"
    model = llama_model(source_id)
    targets = {"z1-dp2-bf16": (1, 2, 1, True), "autotp2-z3-dp1": (2, 1, 3, False)}
    for case, (tp, dp, stage, bf16) in targets.items():
        ds_config = tmp_path / f"{case}.json"
        ds_config.write_text(json.dumps(llama.ds_config(tp, dp, stage, bf16, model=model)))
        trees = []
        for name, source in (("n", native), ("u", universal)):
            out = tmp_path / name / case
            result = run_tool(reshardfs, "materialize", source, out, "--ds-config", ds_config, "--dp", dp,
                              "--model-config", config, "-q")
            assert result.returncode == 0, result
            trees.append(sorted(p.relative_to(out) for p in out.rglob("*") if p.is_file()))
        assert trees[0] == trees[1], case
        for rel in trees[0]:
            assert filecmp.cmp(tmp_path / "n" / case / rel, tmp_path / "u" / case / rel, shallow=False), (case, rel)

    root = (universal / "latest_universal").read_text().strip()
    expected = sorted(p.relative_to(universal / root) for p in (universal / root).rglob("*") if p.is_file())
    mnt = tmp_path / "mnt"
    mnt.mkdir()

    def check() -> None:
        assert sorted(p.relative_to(mnt / root) for p in (mnt / root).rglob("*") if p.is_file()) == expected
        for rel in expected:
            try:
                assert_same_values(load(mnt / root / rel), load(universal / root / rel))
            except AssertionError as e:
                raise AssertionError(f"{rel}: {e}") from None
        tag = (mnt / "latest").read_text()
        if LLAMA_SOURCES[source_id][0] > 1:  # zero_to_fp32 does not merge TP slices: the conversion's are the reference
            from safetensors.torch import load as load_bytes

            assert_weights_are_the_conversions(load_bytes((mnt / tag / "model.safetensors").read_bytes()), universal)
        else:
            assert assert_weights_are_zero_to_fp32s(mnt / tag / "model.safetensors", native) > 0

    served_while([reshardfs, "mount", native, mnt, "--dp", 2, "--model-config", config, "-f"], mnt,
                 tmp_path / "mount.log", check)


@pytest.mark.parametrize("source_id", tiered(SOURCES, default=DEFAULT_SOURCES))
def test_verify_reads_a_native_source(source_id, converted, reshardfs, run_tool):
    """`reshardfs verify` of a native source reads every state through its fragments: the same per-state counts
    of tensors, elements and bytes as verify of its conversion, and no problem."""
    reports = []
    for source in (SOURCES[source_id], converted(source_id)):
        result = run_tool(reshardfs, "verify", source, "--json")
        assert result.returncode == 0, result
        reports.append(json.loads(result.stdout))
    native, universal = reports
    assert native["problems"] == [] and native["parameters"] == universal["parameters"]
    assert native["states"] == universal["states"]
