"""Integration-test fixtures: the tools under test, a runner, and the torch.save files they read.

The tools come from $RESHARDFS_BUILD_DIR (and $RESHARDFS_ASAN_BUILD_DIR for the ASan build);
scripts/test.sh exports both. A missing variable or binary fails the test that needs it.

Every file is made by the pinned torch's own torch.save from a "case": a deterministic builder of
the object to save, plus what torch itself can do with the result.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import subprocess
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from goldens import TINY_UCP, Reference, References
from native_sources import COMMITTED_CONVERSIONS, SOURCES, convert

os.environ.setdefault("DS_ACCELERATOR", "cpu")  # DeepSpeed's import otherwise probes for GPUs

# A process started in the background by a non-interactive shell (`cmd &`, nohup) inherits SIGINT (and, from nohup,
# SIGHUP) as ignored, every child it starts inherits that, and libfuse keeps a signal it finds ignored ignored (as a
# background job expects): the FUSE servers these tests start would not unmount on SIGINT. The tests run with the
# dispositions of a foreground run, wherever they were started from.
if signal.getsignal(signal.SIGINT) == signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)
if signal.getsignal(signal.SIGHUP) == signal.SIG_IGN:
    signal.signal(signal.SIGHUP, signal.SIG_DFL)

TOOL_TIMEOUT_S = 120

RESHARDFS = "fs/reshardfs"
REWRITE_ARCHIVE = "tests/tools/rewrite_archive"
PLAN_PARTITIONS = "tests/tools/plan_partitions"


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--full", action="store_true",
                     help="the full tier: also the tests marked `full`, and DeepSpeed's reference runs live instead "
                          "of the committed goldens (tests/goldens)")


def pytest_configure(config: pytest.Config) -> None:
    # torch warns each time it rebuilds a complex32 tensor; the dtype cases do that on purpose.
    config.addinivalue_line("filterwarnings", "ignore:ComplexHalf support is experimental:UserWarning")
    config.addinivalue_line("markers", "full: only in the full tier (--full): long real-DeepSpeed variants")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """The default tier leaves out (deselects, so they count as neither run nor skipped) the `full` tests."""
    if config.getoption("--full"):
        return
    kept = [item for item in items if item.get_closest_marker("full") is None]
    if len(kept) < len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.get_closest_marker("full")])
        items[:] = kept


# ---- tools ------------------------------------------------------------------------------------


def _build_dir(variable: str) -> Path:
    value = os.environ.get(variable)
    if not value:
        pytest.fail(
            f"{variable} is not set. Run the tests with scripts/test.sh, or export "
            f"{variable}=<absolute path of the CMake build directory>.",
            pytrace=False,
        )
    path = Path(value)
    if not path.is_dir():
        pytest.fail(f"{variable}={value} is not a directory; build with scripts/build.sh", pytrace=False)
    return path


def _tool(variable: str, relative: str) -> Path:
    path = _build_dir(variable) / relative
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"missing tool {path} ({variable}); build it with scripts/build.sh", pytrace=False)
    return path


@pytest.fixture(scope="session")
def reshardfs() -> Path:
    return _tool("RESHARDFS_BUILD_DIR", RESHARDFS)


@pytest.fixture(scope="session")
def reshardfs_python() -> Path:
    """The folder to put on sys.path for `import reshardfs` (the build's python/: __init__.py + _C extension)."""
    path = _build_dir("RESHARDFS_BUILD_DIR") / "python"
    if not any((path / "reshardfs").glob("_C*.so")):
        pytest.fail(f"missing the reshardfs._C extension under {path}; build it with scripts/build.sh", pytrace=False)
    return path


@pytest.fixture(scope="session")
def asan_reshardfs() -> Path:
    return _tool("RESHARDFS_ASAN_BUILD_DIR", RESHARDFS)


@pytest.fixture(scope="session")
def rewrite_archive() -> Path:
    return _tool("RESHARDFS_BUILD_DIR", REWRITE_ARCHIVE)


@pytest.fixture(scope="session")
def plan_partitions() -> Path:
    return _tool("RESHARDFS_BUILD_DIR", PLAN_PARTITIONS)


@dataclass(frozen=True)
class ToolResult:
    args: list[str]
    returncode: int
    stdout: str
    stderr: str

    def __str__(self) -> str:  # the assertion message when a check on a tool run fails
        return (f"$ {' '.join(self.args)}\nrc={self.returncode}\n"
                f"--- stdout\n{self.stdout[-4000:]}\n--- stderr\n{self.stderr[-4000:]}")  # fmt: skip


Runner = Callable[..., ToolResult]


@pytest.fixture(scope="session")
def converted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """converted(id) -> the universal checkpoint ds_to_universal writes for native_sources.SOURCES[id] (the folder
    with latest_universal): the committed one, or converted once per session."""
    done: dict[str, Path] = {}

    def get(source_id: str) -> Path:
        if source_id in COMMITTED_CONVERSIONS:
            return COMMITTED_CONVERSIONS[source_id]
        if source_id not in done:
            done[source_id] = convert(SOURCES[source_id], tmp_path_factory.mktemp(f"ucp-{source_id}"))
        return done[source_id]

    return get


@pytest.fixture(scope="session")
def run_tool() -> Runner:
    """run_tool(binary, *args, timeout=...) -> ToolResult; a non-zero exit is not an exception."""

    def run(*args: Any, timeout: float = TOOL_TIMEOUT_S) -> ToolResult:
        argv = [str(a) for a in args]
        done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
        text = [out.decode("utf-8", errors="replace") for out in (done.stdout, done.stderr)]
        return ToolResult(argv, done.returncode, *text)

    return run


@pytest.fixture(scope="session")
def inspect_json(reshardfs: Path, run_tool: Runner) -> Callable[[Path], dict[str, Any]]:
    """inspect_json(file): the parsed `reshardfs inspect --json` of a good file (cached)."""
    cache: dict[Path, dict[str, Any]] = {}

    def inspect(path: Path) -> dict[str, Any]:
        if path not in cache:
            result = run_tool(reshardfs, "inspect", path, "--json")
            assert result.returncode == 0 and result.stderr == "", result
            cache[path] = json.loads(result.stdout)
        return cache[path]

    return inspect


# ---- torch.save cases -------------------------------------------------------------------------

V2_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool",
             "complex64", "complex128"]  # fmt: skip
V3_DTYPES = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz",
             "float8_e8m0fnu", "complex32"]  # fmt: skip
# The dtypes safetensors 0.6.2 loads into torch (safetensors/torch.py _TYPES).
SAFETENSORS_DTYPES = ["float64", "float32", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                      "bool", "float8_e4m3fn", "float8_e5m2", "uint16", "uint32", "uint64"]  # fmt: skip


def random_tensor(dtype_name: str, *shape: int) -> torch.Tensor:
    """Random bit patterns (NaNs and all) in `dtype_name`; fails if this torch lacks the dtype."""
    dtype = getattr(torch, dtype_name)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape).bool()
    raw = torch.randint(0, 256, (math.prod(shape) * dtype.itemsize,), dtype=torch.uint8)
    return raw.view(dtype).reshape(shape)


def dtype_tensors(names: list[str]) -> dict[str, dict[str, torch.Tensor]]:
    out = {}
    for name in names:
        matrix = random_tensor(name, 3, 5)
        out[name] = {"matrix": matrix, "column": matrix[:, 1], "scalar": random_tensor(name)}
    return out


def views() -> dict[str, torch.Tensor]:
    base = torch.randn(6, 8)
    return {
        "base": base,
        "row": base[2],
        "column": base[:, 3],
        "transposed": base.t(),
        "block": base[1:4, 2:6],
        "flat_offset": base.view(-1)[5:17],
        "every_other": base[::2, ::3],
        "expanded": torch.randn(3, 1).expand(3, 4),  # stride 0
        "slice_of_unsaved": torch.arange(100, dtype=torch.int32)[40:50],  # the whole storage is saved
    }


def empty_and_scalar() -> dict[str, torch.Tensor]:
    storage = torch.randn(10)
    return {
        "empty": torch.empty(0),
        "empty_3d": torch.empty(2, 0, 3, dtype=torch.bfloat16),
        "empty_view": storage[4:4],
        "storage": storage,
        "scalar_f32": torch.tensor(3.5),
        "scalar_i64": torch.tensor(-7),
        "scalar_bool": torch.tensor(True),
        "scalar_view": storage[7],
    }


def ints() -> dict[str, Any]:
    values = [0, 1, 255, 256, 65535, 65536, -1, -128, -129, 2**31 - 1, 2**31, -(2**31), -(2**31) - 1, 2**32,
              2**63 - 1, 2**63, -(2**63), -(2**63) - 1, 2**64, 10**30, -(10**30), 2**2100, -(2**2100) + 1]  # fmt: skip
    return {"list": values, "tuple": tuple(values), "keys": {v: str(v) for v in values[:8]}}


def floats() -> dict[str, Any]:
    values = [0.0, -0.0, 1.5, -2.25, 0.1, 1e308, -1e-308, 5e-324, 2.2250738585072014e-308, float("nan"),
              float("inf"), float("-inf")]  # fmt: skip
    return {"list": values, "pair": (values[1], values[9]), "mixed": [1, 1.0, True, None]}


def strings_and_bytes() -> dict[str, Any]:
    return {
        "": "",
        "unicode": "grüße 日本 🚀",
        "control": "a\x00b\nc\t\"'\\",
        "long": "x" * 70000,
        "bytes": bytes(range(256)),
        "empty_bytes": b"",
        "bytearray": bytearray(b"\x00\x80abc\xff"),
        "empty_bytearray": bytearray(),
        "flags": [True, False, None],
    }


def tuples() -> dict[str, Any]:
    return {
        "lengths": [tuple(range(n)) for n in range(9)],
        "nested": ((), ((),), (1, (2, (3, (4,))))),
        "with_tensors": (torch.ones(2), (torch.zeros(1, dtype=torch.int8),)),
        "as_key": {(1, "a"): "pair", (): "empty"},
    }


def containers() -> dict[str, Any]:
    shared_list = [1, 2, 3]
    shared_tensor = torch.randn(4)
    return {
        "nested": [[[], {}], [[[]]], {"a": {"b": {"c": [1]}}}],
        "int_keys": {1: "one", -5: "minus five", 2**40: "big"},
        "mixed_keys": {None: 0, True: 1, 2.5: 2, "s": 3},
        "shared_list": [shared_list, shared_list],
        "shared_tensor": {"first": shared_tensor, "again": shared_tensor},
        "set": {3, 1, 2},
        "empty_set": set(),
        "frozenset": frozenset({"x"}),
        "ordered": OrderedDict([("z", 1), ("a", 2)]),
        "empty_ordered": OrderedDict(),
    }


def state_dict() -> OrderedDict:
    model = nn.Sequential(nn.Linear(4, 3), nn.LayerNorm(3), nn.BatchNorm1d(3), nn.Linear(3, 2, bias=False))
    return model.to(torch.bfloat16).state_dict()


def parameters() -> dict[str, Any]:
    return {
        "param": nn.Parameter(torch.randn(3, 4)),
        "frozen": nn.Parameter(torch.randn(2), requires_grad=False),
        "leaf_requires_grad": torch.randn(2, requires_grad=True),
        "in_list": [nn.Parameter(torch.randn(1, dtype=torch.float64))],
    }


def conj_views() -> dict[str, torch.Tensor]:
    # Conjugate views carry a 7th _rebuild_tensor_v2 argument, {'conj': True}.
    z = random_tensor("complex64", 4)
    return {"z": z, "conj": z.conj()}


def many_tensors() -> OrderedDict:
    return OrderedDict((f"layer.{i}.weight", torch.full((i % 3 + 1,), float(i))) for i in range(120))


def tensor_root() -> torch.Tensor:
    return torch.randn(2, 3).t()


def list_root() -> list[Any]:
    t = torch.arange(6, dtype=torch.int16)
    return [t, t[1:], {"k": t.view(2, 3)}, 5]


def ds_module() -> tuple[OrderedDict, OrderedDict]:
    model = nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.Linear(4, 2))
    model[0].weight.requires_grad_(False)
    module = model.to(torch.bfloat16).state_dict()
    shapes = OrderedDict((name, p.shape) for name, p in model.named_parameters() if p.requires_grad)
    return module, shapes


def ds_config() -> dict[str, Any]:
    return {
        "train_batch_size": 8,
        "bf16": {"enabled": True},
        "zero_optimization": {"stage": 2, "reduce_bucket_size": 5e8},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "betas": [0.9, 0.999]}},
    }


def ds_model_states() -> dict[str, Any]:
    """mp_rank_00_model_states.pt as DeepSpeed 0.19 writes it (deepspeed_native.md §3)."""
    import deepspeed

    module, shapes = ds_module()
    return {
        "module": module,
        "buffer_names": [],
        "optimizer": None,
        "param_shapes": [shapes],
        "frozen_param_shapes": OrderedDict([("0.weight", torch.Size([4, 4]))]),
        "shared_params": {},
        "frozen_param_fragments": OrderedDict([("0.weight", module["0.weight"].clone())]),
        "lr_scheduler": {"last_batch_iteration": 9},
        "data_sampler": None,
        "random_ltd": None,
        "sparse_tensor_module_names": set(),
        "skipped_steps": 0,
        "global_steps": 10,
        "global_samples": 80,
        "dp_world_size": 2,
        "mp_world_size": 1,
        "checkpoint_parallel_dimensions": {"pp_degree": 1, "tp_degree": 1},
        "ds_config": ds_config(),
        "ds_version": deepspeed.__version__,
        "args": argparse.Namespace(lr=1e-3, seed=1234, layers=[4, 4], name="tiny"),
        "iteration": 10,
    }


def ds_zero2_optim_states() -> dict[str, Any]:
    """bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt, ZeRO-2 with dynamic fp16 loss scaling (§4.1)."""
    import deepspeed
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    flat = torch.randn(12)
    scaler = DynamicLossScaler(init_scale=2**16, scale_window=1000, min_scale=1, delayed_shift=2,
                               consecutive_hysteresis=False, dtype=torch.float16)  # fmt: skip
    optimizer = {
        "loss_scaler": scaler,
        "dynamic_loss_scale": True,
        "overflow": False,
        "clip_grad": 1.0,
        "base_optimizer_state": {
            "state": {0: {"step": 10, "exp_avg": torch.randn(12), "exp_avg_sq": torch.rand(12)}},
            "param_groups": [{"lr": 1e-3, "bias_correction": True, "betas": (0.9, 0.999), "eps": 1e-8,
                              "weight_decay": 0.0, "step": 0, "params": [0]}],  # fmt: skip
        },
        "single_partition_of_fp32_groups": [flat[:10]],
        "zero_stage": ZeroStageEnum.gradients,
        "group_paddings": [2],
        "partition_count": [2],
        "ds_version": deepspeed.__version__,
        "param_slice_mappings": [OrderedDict([("0.weight", fragment_address(numel=8, start=0)),
                                              ("0.bias", fragment_address(numel=2, start=8))])],  # fmt: skip
    }
    return {"optimizer_state_dict": optimizer, "ds_config": ds_config(), "ds_version": deepspeed.__version__}


def ds_zero3_optim_states() -> dict[str, Any]:
    """zero_pp_rank_0_mp_rank_00_optim_states.pt, ZeRO-3 with a static loss scaler (§4.2)."""
    import deepspeed
    from deepspeed.runtime.fp16.loss_scaler import LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum

    flat = torch.randn(8)
    flat.ds_id = "0_3"  # a tensor attribute: torch pickles it through _rebuild_from_type_v2
    optimizer = {
        "zero_stage": ZeroStageEnum.weights,
        "loss_scaler": LossScaler(scale=1.0),
        "dynamic_loss_scale": False,
        "overflow": False,
        "partition_count": 2,
        "optimizer_state_dict": {
            "state": {0: {"step": 3, "exp_avg": torch.zeros(8), "exp_avg_sq": torch.ones(8)}},
            "param_groups": [{"lr": 1e-3, "betas": [0.9, 0.999], "params": [0]}],
        },
        "fp32_flat_groups": [flat],
    }
    return {"optimizer_state_dict": optimizer, "ds_config": ds_config(), "ds_version": deepspeed.__version__}


@dataclass(frozen=True)
class Case:
    build: Callable[[], Any]
    weights_only: bool = True  # torch.load(weights_only=True) accepts the file
    safetensors: bool = False  # every tensor on a str-key path has a dtype safetensors loads


CASES: dict[str, Case] = {
    "dtypes_safetensors": Case(lambda: dtype_tensors(SAFETENSORS_DTYPES), safetensors=True),
    "dtypes_other": Case(lambda: dtype_tensors(sorted(set(V2_DTYPES + V3_DTYPES) - set(SAFETENSORS_DTYPES)))),
    "views": Case(views, safetensors=True),
    "empty_and_scalar": Case(empty_and_scalar, safetensors=True),
    "ints": Case(ints, weights_only=False),  # 2**2100 needs LONG4
    "floats": Case(floats),
    "strings_and_bytes": Case(strings_and_bytes, weights_only=False),  # b"" is GLOBAL __builtin__ bytes
    "tuples": Case(tuples),
    "containers": Case(containers, weights_only=False),  # frozenset
    "state_dict": Case(state_dict, safetensors=True),
    "parameters": Case(parameters),
    "conj_views": Case(conj_views),
    "many_tensors": Case(many_tensors, safetensors=True),
    "tensor_root": Case(tensor_root),
    "list_root": Case(list_root),
    "ds_model_states": Case(ds_model_states, weights_only=False, safetensors=True),
    "ds_zero2_optim_states": Case(ds_zero2_optim_states, weights_only=False),
    "ds_zero3_optim_states": Case(ds_zero3_optim_states, weights_only=False),
}


def build_case(name: str) -> Any:
    torch.manual_seed(0)
    return CASES[name].build()


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """`case` runs a test once per case; `safetensors_case` once per safetensors-able case."""
    if "case" in metafunc.fixturenames:
        metafunc.parametrize("case", list(CASES))
    if "safetensors_case" in metafunc.fixturenames:
        metafunc.parametrize("safetensors_case", [n for n, c in CASES.items() if c.safetensors])


@pytest.fixture(scope="session")
def case_file(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """case_file(name): the torch.save file of a case, written once per session."""
    directory = tmp_path_factory.mktemp("torch_save")
    files: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in files:
            path = directory / f"{name}.pt"
            torch.save(build_case(name), path)
            files[name] = path
        return files[name]

    return get


@pytest.fixture
def case_spec(case: str) -> Case:
    return CASES[case]


@pytest.fixture(scope="session")
def case_object() -> Callable[[str], Any]:
    """case_object(name): a fresh copy of the object a case's file was saved from."""
    return build_case


# ---- DeepSpeed's own load_universal, as ground truth -------------------------------------------


@pytest.fixture(scope="session")
def references(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> References:
    """DeepSpeed's reference runs (goldens.py): live in the full tier, the committed goldens otherwise."""
    return References(live=request.config.getoption("--full"), work=tmp_path_factory.mktemp("references"))


@pytest.fixture(scope="session")
def load_universal_trained(references: References) -> Callable[..., Path]:
    """load_universal_trained(ucp, stage, dp, bf16, variant): the folder of DeepSpeed's own load_universal of `ucp`
    at that layout (ds_reference: rank_<r>.pt, native_resaved/), then REFERENCE_TRAIN_STEPS steps (after_rank_<r>.pt,
    losses_rank_<r>.json)."""
    return lambda *key: references.get(Reference("load_universal", key))


@pytest.fixture(scope="session")
def ds_reference(load_universal_trained) -> Callable[..., list[Path]]:
    """ds_reference(zero_stage, dp, ucp=examples/tiny/universal, bf16=False): the rank_<r>.pt dumps of
    load_universal_trained (native_resaved/ next to them)."""

    def get(zero_stage: int, dp: int, ucp: Path = TINY_UCP, bf16: bool = False) -> list[Path]:
        folder = load_universal_trained(ucp, zero_stage, dp, bf16, "")
        return [folder / f"rank_{r}.pt" for r in range(dp)]

    return get


@pytest.fixture(scope="session")
def load_universal_corrected(references: References) -> Callable[..., Path]:
    """load_universal_corrected(ucp, stage, dp, bf16): DeepSpeed's ZeRO-3 load_universal of `ucp` with its two known
    defects undone (ds_resume.universal_corrected), then REFERENCE_TRAIN_STEPS steps: its folder."""
    return lambda *key: references.get(Reference("universal_corrected", key))
