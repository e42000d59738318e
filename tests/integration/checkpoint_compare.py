"""Value-level comparison of loaded checkpoint objects, for files reshardfs serves against files DeepSpeed wrote.

Served files hold the same values as DeepSpeed's but not the same storage layout (DeepSpeed's module tensors
are views into one flat buffer; served tensors each own an exact-size storage), so this compares what a loader
sees: types, dict key order, every scalar (floats bit for bit), and every tensor's dtype, shape and element
bits. Storage sharing between tensors is compared too where it matters to a loader: a tensor that appears twice
in one object (a tied weight) must appear twice in the other.
"""

from __future__ import annotations

import enum
import struct
from pathlib import Path
from typing import Any, Callable

import torch


def tensor_bits(t: torch.Tensor) -> torch.Tensor:
    """The element bits of `t` in C order, as uint8 (works for 0-d, empty and every dtype)."""
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class ValueCompare:
    def __init__(self, ignore_keys: frozenset[str] = frozenset()) -> None:
        self.ignore_keys = ignore_keys
        self.a_ids: dict[int, int] = {}
        self.b_ids: dict[int, int] = {}

    def same(self, a: Any, b: Any, path: str = "root") -> None:
        assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
        if isinstance(a, enum.Enum):
            assert a is b, f"{path}: {a!r} != {b!r}"
        elif isinstance(a, torch.Tensor):
            self.tensor(a, b, path)
        elif isinstance(a, float):
            assert struct.pack("<d", a) == struct.pack("<d", b), f"{path}: {a!r} != {b!r}"
        elif isinstance(a, dict):
            ka = [k for k in a if k not in self.ignore_keys]
            kb = [k for k in b if k not in self.ignore_keys]
            assert ka == kb, f"{path}: keys {ka} != {kb}"
            for k in ka:
                self.same(a[k], b[k], f"{path}[{k!r}]")
        elif isinstance(a, (list, tuple)):
            assert len(a) == len(b), f"{path}: length {len(a)} != {len(b)}"
            for i, (x, y) in enumerate(zip(a, b)):
                self.same(x, y, f"{path}[{i}]")
        elif isinstance(a, (type(None), bool, int, str, bytes, set, frozenset, torch.dtype, torch.Size)):
            assert a == b, f"{path}: {a!r} != {b!r}"
        else:
            assert hasattr(a, "__dict__"), f"{path}: no rule to compare {type(a).__name__}"
        if hasattr(a, "__dict__") and not isinstance(a, (torch.Tensor, enum.Enum)):
            self.same(vars(a), vars(b), f"{path}.__dict__")

    def tensor(self, a: torch.Tensor, b: torch.Tensor, path: str) -> None:
        assert (a.dtype, tuple(a.shape), a.requires_grad) == (b.dtype, tuple(b.shape), b.requires_grad), (
            f"{path}: {a.dtype}{tuple(a.shape)} rg={a.requires_grad} != {b.dtype}{tuple(b.shape)} rg={b.requires_grad}")
        assert torch.equal(tensor_bits(a), tensor_bits(b)), f"{path}: element bits differ"
        # The same tensor object twice (a tied weight) must be the same object twice on both sides.
        seen_a, seen_b = self.a_ids.setdefault(id(a), id(b)), self.b_ids.setdefault(id(b), id(a))
        assert seen_a == id(b) and seen_b == id(a), f"{path}: tensor identity (tied weights) differs"


def assert_same_values(a: Any, b: Any, ignore_keys: frozenset[str] = frozenset()) -> None:
    ValueCompare(ignore_keys).same(a, b)


def load(path: Path, mmap: bool = False) -> Any:
    return torch.load(path, map_location="cpu", weights_only=False, mmap=mmap)


def assert_same_files(served_dir: Path, reference_dir: Path, ignore_keys: frozenset[str] = frozenset(),
                      mmap: bool = False, fix_reference: Callable[[str, Any], Any] | None = None) -> list[str]:
    """Every *.pt of reference_dir exists in served_dir with the same values, and no other *.pt is served.
    `fix_reference(name, obj)` may correct a reference file's known upstream defect first (and should assert
    that the defect is still there). Returns the compared names."""
    names = sorted(p.name for p in reference_dir.glob("*.pt"))
    served = sorted(p.name for p in served_dir.glob("*.pt"))
    assert served == names, f"served files {served} != DeepSpeed's {names}"
    for name in names:
        try:
            reference = load(reference_dir / name)
            if fix_reference is not None:
                reference = fix_reference(name, reference)
            assert_same_values(load(served_dir / name, mmap), reference, ignore_keys)
        except AssertionError as e:
            raise AssertionError(f"{name}: {e}") from None
    return names


def assert_same_snapshot(served: Any, reference: Any, what: str) -> None:
    """assert_same_values with `what` leading the message."""
    try:
        assert_same_values(served, reference)
    except AssertionError as e:
        raise AssertionError(f"{what}: {e}") from None


def ucp_param_groups(ucp: Path) -> list[dict[str, Any]]:
    """The hyper-parameters of every param group in a ZeRO-3 UCP's zero/optimizer_state.pt (`params` left out)."""
    tag = (ucp / "latest_universal").read_text().strip()
    saved = load(ucp / tag / "zero" / "optimizer_state.pt")
    return [{k: v for k, v in g.items() if k != "params"} for g in saved["optimizer_state_dict"]["param_groups"]]
