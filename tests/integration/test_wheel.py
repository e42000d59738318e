"""`pip install .` for real: the wheel scikit-build-core builds from pyproject.toml installs into a fresh venv, and
from there (no source tree, no build folder on any path) the `reshardfs` console script and the Python API give
exactly what the build's program gives.

The wheel is built once per session without build isolation (the venv of scripts/setup.sh holds the pinned
scikit-build-core and pybind11, so no download happens) and without the CUDA backend, which needs nvcc and adds
nothing the CPU checks here could see; otherwise it is what `pip install .` builds.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

from fuse_mount import requires_fuse
from goldens import REPO, ZERO3_UCP

BUILD_TIMEOUT_S = 1200  # the whole CMake build of the program and the extension, on 2 cores
# The first test of the module builds the wheel in its setup, which pytest-timeout counts as part of the test.
pytestmark = pytest.mark.timeout(BUILD_TIMEOUT_S + 300)
EXPECTED_FILES = {"reshardfs/__init__.py", "reshardfs/__main__.py", "reshardfs/_binary.py", "reshardfs/commands.py",
                  "reshardfs/_bin/reshardfs"}  # fmt: skip


def run(argv: list, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """`argv` with an environment that knows nothing of this checkout (no PYTHONPATH, no RESHARDFS_* variables)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "RESHARDFS_", "VIRTUAL_ENV"))}
    return subprocess.run([str(a) for a in argv], env=env, capture_output=True, text=True, timeout=timeout,
                          check=False, **kwargs)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    start = time.monotonic()
    done = run([sys.executable, "-m", "pip", "wheel", REPO, "--no-build-isolation", "--no-deps", "-w", out,
                f"--config-settings=build-dir={out / 'build'}", "--config-settings=cmake.define.RESHARDFS_CUDA=OFF"],
               timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-6000:]
    wheels = list(out.glob("reshardfs-*.whl"))
    assert len(wheels) == 1, wheels
    print(f"\nwheel: {wheels[0].name}, {wheels[0].stat().st_size} bytes, built in {time.monotonic() - start:.0f} s")
    return wheels[0]


@pytest.fixture(scope="module")
def venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv (this interpreter's base Python) with nothing but the wheel installed."""
    root = tmp_path_factory.mktemp("venv") / "venv"
    done = run([sys.executable, "-m", "venv", root])
    assert done.returncode == 0, done.stderr
    start = time.monotonic()
    done = run([root / "bin" / "python", "-m", "pip", "install", "--no-index", "--no-deps", wheel])
    assert done.returncode == 0, done.stdout + done.stderr
    print(f"\nwheel: installed into a fresh venv in {time.monotonic() - start:.1f} s")
    return root


def test_the_wheel_holds_the_package_and_nothing_else(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    package = {n for n in names if not n.startswith("reshardfs-")}
    extension = {n for n in package if n.startswith("reshardfs/_C.") and n.endswith(".so")}
    assert len(extension) == 1 and package - extension == EXPECTED_FILES, sorted(package)
    entry_points = zipfile.ZipFile(wheel).read(next(n for n in names if n.endswith("entry_points.txt"))).decode()
    assert "reshardfs = reshardfs.__main__:main" in entry_points, entry_points


def test_the_console_script_is_the_program(venv: Path, reshardfs: Path, tmp_path: Path) -> None:
    installed = run([venv / "bin" / "reshardfs", "--version"], cwd=tmp_path)
    built = run([reshardfs, "--version"])
    assert installed.returncode == 0 and installed.stdout == built.stdout, installed
    flags = ["--dp", "4", "--lp-dtype", "bf16"]
    installed = run([venv / "bin" / "reshardfs", "plan", ZERO3_UCP, "--json", *flags], cwd=tmp_path)
    built = run([reshardfs, "plan", ZERO3_UCP, "--json", *flags])
    assert installed.returncode == 0 and json.loads(installed.stdout) == json.loads(built.stdout), installed
    refused = run([venv / "bin" / "reshardfs", "plan", ZERO3_UCP, "--tp", "3"], cwd=tmp_path)
    assert refused.returncode == 1 and refused.stderr.startswith("reshardfs: error: "), refused


# Run by the venv's Python from an empty folder: the installed package's plan, materialize and mount; prints where the package is and the sha256 of every file each wrote or served.
API_SCRIPT = """
import hashlib, json, os, sys
from pathlib import Path
import reshardfs

src, out, mnt = Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3])

def digests(root):
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}

result = {"package": reshardfs.__file__, "plan": reshardfs.plan(src, dp=4, lp_dtype="bf16")}
result["materialized"] = digests(reshardfs.materialize(src, out, dp=4, lp_dtype="bf16", quiet=True))
with reshardfs.mount(src, mnt, dp=4, lp_dtype="bf16", quiet=True) as mounted:
    result["served"] = {name: hashlib.sha256((mounted.path / name).read_bytes()).hexdigest()
                        for name in result["materialized"]}
result["mounted_after"] = os.path.ismount(mnt)
print(json.dumps(result))
"""


@requires_fuse
def test_the_api_runs_from_the_installed_wheel(venv: Path, reshardfs: Path, run_tool, tmp_path: Path) -> None:
    (tmp_path / "mnt").mkdir()
    (tmp_path / "cwd").mkdir()
    done = run([venv / "bin" / "python", "-c", API_SCRIPT, ZERO3_UCP, tmp_path / "out", tmp_path / "mnt"],
               cwd=tmp_path / "cwd")
    assert done.returncode == 0, done.stdout + done.stderr
    result = json.loads(done.stdout)
    assert Path(result["package"]).is_relative_to(venv), result["package"]

    flags = ["--dp", "4", "--lp-dtype", "bf16"]
    expected_plan = run_tool(reshardfs, "plan", ZERO3_UCP, "--json", *flags)
    assert result["plan"] == json.loads(expected_plan.stdout)
    reference = tmp_path / "reference"
    assert run_tool(reshardfs, "materialize", ZERO3_UCP, reference, *flags).returncode == 0
    expected = {str(p.relative_to(reference)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(reference.rglob("*")) if p.is_file()}
    assert result["materialized"] == expected
    assert result["served"] == expected and result["mounted_after"] is False
