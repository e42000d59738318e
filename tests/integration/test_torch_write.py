"""reshardfs's writers, through tests/tools/rewrite_archive, against the pinned torch and safetensors.

`rewrite_archive IN.pt OUT.pt` re-emits IN through reshardfs's pickle writer and virtual zip writer;
every way torch loads OUT must give what the same load of IN gives. `--safetensors` writes the
tensors on str-key paths; safetensors' own loaders must read them back unchanged.
"""

from __future__ import annotations

import enum
import pickle
import struct
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from inert_unpickler import json_diff, reference_tree, resolve, str_key_path, tensor_nodes

DEEPSPEED_CASES = ["ds_model_states", "ds_zero2_optim_states", "ds_zero3_optim_states"]


def u8(t: torch.Tensor) -> torch.Tensor:
    """The whole storage behind `t` as a uint8 tensor."""
    return torch.empty(0, dtype=torch.uint8).set_(t.untyped_storage())


def values_u8(t: torch.Tensor) -> torch.Tensor:
    """The elements of `t` (not its storage), row-major, as uint8."""
    return t.contiguous().reshape(-1).view(torch.uint8)


class DeepCompare:
    """Asserts two loaded objects are the same: types, order, bits, and which tensors share storage."""

    def __init__(self) -> None:
        self.a_to_b: dict[int, int] = {}
        self.b_to_a: dict[int, int] = {}

    def same(self, a: Any, b: Any, path: str = "root") -> None:
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        if isinstance(a, enum.Enum):
            assert a is b, f"{path}: {a!r} != {b!r}"
            return
        if isinstance(a, torch.Tensor):
            self.tensor(a, b, path)
        elif isinstance(a, float):
            assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r}"
        elif isinstance(a, dict):
            assert len(a) == len(b), f"{path}: {len(a)} != {len(b)} entries"
            for i, ((ka, va), (kb, vb)) in enumerate(zip(a.items(), b.items())):
                self.same(ka, kb, f"{path}.key#{i}")
                self.same(va, vb, f"{path}[{ka!r}]")
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                self.same(x, y, f"{path}[{i}]")
        elif isinstance(a, (type(None), bool, int, str, bytes, bytearray, set, frozenset, torch.dtype)):
            assert a == b, f"{path}: {a!r} != {b!r}"
        else:
            assert hasattr(a, "__dict__"), f"{path}: no rule to compare {type(a).__name__}"
        if hasattr(a, "__dict__"):  # OrderedDict._metadata, tensor attributes, opaque objects
            self.same(vars(a), vars(b), f"{path}.__dict__")

    def tensor(self, a: torch.Tensor, b: torch.Tensor, path: str) -> None:
        def meta(t: torch.Tensor) -> tuple[Any, ...]:
            return t.dtype, t.shape, t.stride(), t.storage_offset(), t.requires_grad, t.is_conj(), t.is_neg()

        assert meta(a) == meta(b), f"{path}: {meta(a)} != {meta(b)}"
        assert torch.equal(u8(a), u8(b)), f"{path}: storage bytes differ"
        if a.untyped_storage().nbytes():
            pa, pb = a.untyped_storage().data_ptr(), b.untyped_storage().data_ptr()
            shared = self.a_to_b.setdefault(pa, pb) == pb and self.b_to_a.setdefault(pb, pa) == pa
            assert shared, f"{path}: storage sharing between tensors differs"


def assert_same(a: Any, b: Any) -> None:
    DeepCompare().same(a, b)


@pytest.fixture(scope="session")
def rewritten(rewrite_archive: Path, run_tool, case_file, tmp_path_factory) -> Callable[[str], Path]:
    """rewritten(case): the case's file after rewrite_archive (run once per session)."""
    directory = tmp_path_factory.mktemp("rewritten")
    files: dict[str, Path] = {}

    def get(case: str) -> Path:
        if case not in files:
            out = directory / f"{case}.pt"
            result = run_tool(rewrite_archive, case_file(case), out)
            assert result.returncode == 0 and out.is_file(), result
            files[case] = out
        return files[case]

    return get


def test_rewrite_loads_equal(case: str, case_file, rewritten) -> None:
    assert_same(torch.load(rewritten(case), weights_only=False), torch.load(case_file(case), weights_only=False))


def test_rewrite_loads_equal_mmap(case: str, case_file, rewritten) -> None:
    out = torch.load(rewritten(case), weights_only=False, mmap=True)
    assert_same(out, torch.load(case_file(case), weights_only=False, mmap=True))


def test_rewrite_weights_only(case: str, case_spec, case_file, rewritten) -> None:
    src, out = case_file(case), rewritten(case)
    if case_spec.weights_only:
        assert_same(torch.load(out, weights_only=True), torch.load(src, weights_only=True))
        return
    errors = []
    for path in (src, out):
        with pytest.raises(pickle.UnpicklingError) as error:
            torch.load(path, weights_only=True)
        errors.append(str(error.value))
    assert errors[1] == errors[0]


def test_rewrite_keeps_pickle_tree(case: str, case_file, rewritten) -> None:
    """OUT's data.pkl (read with zipfile, so its CRC is checked) holds IN's tree exactly."""
    expected, _ = reference_tree(case_file(case))
    got, _ = reference_tree(rewritten(case))
    diff = json_diff(got, expected)
    assert diff is None, f"rewritten pickle differs at {diff}"


def test_rewrite_crcs(case: str, rewritten) -> None:
    """Metadata records carry real CRC-32s; tensor records carry 0 or their real CRC-32."""
    out = rewritten(case)
    data = out.read_bytes()
    with zipfile.ZipFile(out) as archive:
        for info in archive.infolist():
            name = info.filename.split("/", 1)[1]
            if not name.startswith("data/"):
                archive.read(info)  # raises BadZipFile on a CRC mismatch
                continue
            name_len, extra_len = struct.unpack("<HH", data[info.header_offset + 26 : info.header_offset + 30])
            start = info.header_offset + 30 + name_len + extra_len
            real = zlib.crc32(data[start : start + info.file_size])
            assert info.CRC in (0, real), f"{info.filename}: CRC {info.CRC:#x}, data has {real:#x}"


@pytest.mark.parametrize("name", DEEPSPEED_CASES)
def test_deepspeed_objects_round_trip(name: str, case_object, rewritten) -> None:
    """Opaque DeepSpeed/argparse objects come back equal to the objects originally saved."""
    assert_same(torch.load(rewritten(name), weights_only=False), case_object(name))


def test_safetensors(safetensors_case: str, case_file, rewrite_archive: Path, run_tool, tmp_path: Path) -> None:
    src, out = case_file(safetensors_case), tmp_path / f"{safetensors_case}.safetensors"
    result = run_tool(rewrite_archive, "--safetensors", src, out)
    assert result.returncode == 0, result

    tree, _ = reference_tree(src)
    loaded = torch.load(src, weights_only=False)
    expected = {}
    for path, _ in tensor_nodes(tree):
        if name := str_key_path(path, tree):
            expected[name] = resolve(loaded, path)
    assert expected, "case has no tensor on a str-key path"

    tensors = load_file(out)
    assert sorted(tensors) == sorted(expected)
    with safe_open(out, framework="pt") as f:
        assert sorted(f.keys()) == sorted(expected)
        for name, want in expected.items():
            for got in (tensors[name], f.get_tensor(name)):
                assert (got.dtype, got.shape) == (want.dtype, want.shape), name
                assert torch.equal(values_u8(got), values_u8(want)), f"{name}: values differ"
