"""The Python API of the reshardfs package (gpu/python/reshardfs/commands.py): plan, materialize and mount give
exactly what the commands give, keyword targets become the same flags, and failures become ReshardfsError with
the program's one error line. Runs the build's package (build/python), which carries the program as the wheel
does (reshardfs/_bin/reshardfs); test_wheel.py runs the same API from an installed wheel.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fuse_mount import requires_fuse
from goldens import TINY_UCP, ZERO3_UCP

TAG = "global_step3"


def tree_bytes(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


@pytest.fixture(scope="module")
def api(reshardfs_python: Path) -> Any:
    sys.path.insert(0, str(reshardfs_python))
    import reshardfs
    assert Path(reshardfs.__file__).parent == reshardfs_python / "reshardfs", reshardfs.__file__
    return reshardfs


@pytest.fixture(scope="module")
def reference_tree(reshardfs: Path, run_tool, tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    """What `reshardfs materialize ZERO3_UCP OUT --dp 4 --lp-dtype bf16` writes."""
    out = tmp_path_factory.mktemp("reference") / "out"
    result = run_tool(reshardfs, "materialize", ZERO3_UCP, out, "--dp", "4", "--lp-dtype", "bf16")
    assert result.returncode == 0, result
    return tree_bytes(out)


def test_the_package_carries_the_build_program(api: Any, reshardfs: Path) -> None:
    packaged = Path(api.__file__).parent / "_bin" / "reshardfs"
    assert packaged.read_bytes() == reshardfs.read_bytes()


def test_plan_returns_what_plan_json_prints(api: Any, reshardfs: Path, run_tool) -> None:
    result = run_tool(reshardfs, "plan", TINY_UCP, "--json", "--dp", "4", "--zero-stage", "3", "--lp-dtype", "fp16")
    assert result.returncode == 0, result
    assert api.plan(TINY_UCP, dp=4, zero_stage=3, lp_dtype="fp16") == json.loads(result.stdout)
    assert api.plan(str(TINY_UCP), dp=4, zero_stage=3, lp_dtype="fp16", tp=None) == json.loads(result.stdout)


def test_materialize_writes_what_the_command_writes(api: Any, reference_tree: dict[str, bytes], tmp_path: Path,
                                                    capfd: pytest.CaptureFixture[str]) -> None:
    out = api.materialize(ZERO3_UCP, tmp_path / "out", dp=4, lp_dtype="bf16", quiet=True)
    assert out == tmp_path / "out"
    assert tree_bytes(out) == reference_tree
    assert capfd.readouterr() == ("", ""), "quiet=True printed something"
    # Not quiet: the progress goes to stderr as plain lines (not a terminal), ending with the total.
    api.materialize(ZERO3_UCP, tmp_path / "loud", dp=4, lp_dtype="bf16")
    total = sum(len(data) for data in reference_tree.values())
    stderr = capfd.readouterr().err
    assert stderr.startswith("materialize: ") and " in " in stderr.splitlines()[-1], stderr
    assert total < 1024 * 1024 and stderr.splitlines()[-1].startswith(f"materialize: {total / 1024:.1f} KiB in "), \
        (total, stderr)


def test_a_refusal_raises_with_the_programs_error_line(api: Any, tmp_path: Path) -> None:
    with pytest.raises(api.ReshardfsError, match=r"^--dp: Value 0 not in range 1 to 1048576 \(see --help\)$") as caught:
        api.plan(TINY_UCP, dp=0)
    assert caught.value.returncode != 0 and "--dp" in caught.value.argv
    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "keep").write_text("x")
    with pytest.raises(api.ReshardfsError, match="exists and is not an empty folder"):
        api.materialize(TINY_UCP, tmp_path / "full", dp=2, quiet=True)
    assert os.listdir(tmp_path / "full") == ["keep"]


def test_unknown_keywords_are_refused_before_running_anything(api: Any, tmp_path: Path) -> None:
    with pytest.raises(TypeError, match="unknown target option.*dp_size.*known:.*dp"):
        api.plan(TINY_UCP, dp_size=4)
    with pytest.raises(TypeError, match="unknown target option.*direct_io"):
        api.materialize(TINY_UCP, tmp_path / "out", direct_io=True)
    assert not (tmp_path / "out").exists()


def test_python_m_reshardfs_is_the_program(reshardfs_python: Path, reshardfs: Path) -> None:
    env = dict(os.environ, PYTHONPATH=str(reshardfs_python))
    module = subprocess.run([sys.executable, "-m", "reshardfs", "--version"], env=env, capture_output=True, text=True,
                            timeout=60, check=False)
    program = subprocess.run([reshardfs, "--version"], capture_output=True, text=True, timeout=60, check=False)
    assert (module.returncode, module.stdout) == (0, program.stdout) and program.stdout.startswith("reshardfs "), module


@requires_fuse
def test_mount_serves_the_materialized_bytes_and_unmounts_on_exit(api: Any, reference_tree: dict[str, bytes],
                                                                  tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with api.mount(ZERO3_UCP, mnt, dp=4, lp_dtype="bf16", quiet=True) as mounted:
        assert mounted.path == mnt.resolve() and mounted.mounted
        served = {name: (mnt / name).read_bytes() for name in reference_tree}
        assert (mnt / "latest").read_text() == TAG
    assert not os.path.ismount(mnt)
    assert served == reference_tree
    mounted.unmount()  # a second unmount does nothing


@requires_fuse
def test_mount_unmounts_when_the_block_raises(api: Any, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with pytest.raises(KeyError, match="raised inside"):
        with api.mount(TINY_UCP, mnt, dp=2, single_threaded=True, quiet=True):
            assert os.path.ismount(mnt)
            raise KeyError("raised inside")
    assert not os.path.ismount(mnt)


@requires_fuse
def test_a_refused_mount_raises_and_mounts_nothing(api: Any, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    with pytest.raises(api.ReshardfsError, match=r"^parameter .fc1.weight.: T=3 does not divide dim 0 of size 32"):
        api.mount(TINY_UCP, mnt, tp=3, quiet=True)
    assert not os.path.ismount(mnt)
