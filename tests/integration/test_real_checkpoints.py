"""The format layer on files real DeepSpeed wrote: every .pt of examples/tiny (native per-rank
files and the universal checkpoint ds_to_universal made from them).

  inspect --json tree == Python's own unpickler (inert), for every file
  rewrite_archive OUT == IN under torch.load(weights_only=False) and torch.load(mmap=True)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from inert_unpickler import json_diff, reference_tree
from test_torch_write import DeepCompare

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "tiny"
FILES = sorted(EXAMPLE.rglob("*.pt"))


def test_example_is_there() -> None:
    # The parametrised tests below would silently vanish without files: require them.
    assert len(FILES) >= 30, f"expected the bundled DeepSpeed checkpoint under {EXAMPLE}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(EXAMPLE)))
def test_inspect_matches_python(path: Path, inspect_json) -> None:
    expected, _ = reference_tree(path)
    diff = json_diff(inspect_json(path)["tree"], expected)
    assert diff is None, f"C++ tree differs from the inert unpickler at {diff}"


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(EXAMPLE)))
def test_rewrite_loads_equal(path: Path, rewrite_archive: Path, run_tool, tmp_path: Path) -> None:
    out = tmp_path / path.name
    result = run_tool(rewrite_archive, str(path), str(out))
    assert result.returncode == 0, result
    DeepCompare().same(torch.load(path, weights_only=False), torch.load(out, weights_only=False))
    DeepCompare().same(torch.load(path, weights_only=False, mmap=True),
                       torch.load(out, weights_only=False, mmap=True))
