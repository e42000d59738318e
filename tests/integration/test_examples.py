"""The end-to-end example keeps working: examples/resume_4_to_2.sh trains the tiny model on 4 ranks with real
DeepSpeed, converts it with ds_to_universal, mounts it for a DP=2 run, resumes on 2 ranks from the mount with
engine.load_checkpoint and trains 3 steps, then requires the same losses as DeepSpeed's own load_universal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fuse_mount import requires_fuse
from tiers import FULL

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TIMEOUT_S = 900


@FULL  # three DeepSpeed launches of its own (train on 4 ranks, convert, resume on 2): the full tier
@requires_fuse
@pytest.mark.timeout(EXAMPLE_TIMEOUT_S + 60)  # the script's own limit, not test.sh's 300 s per test, decides
def test_resume_4_to_2_example(reshardfs: Path, tmp_path: Path) -> None:
    env = dict(os.environ, RESHARDFS_BIN=str(reshardfs))
    done = subprocess.run(["bash", str(REPO / "examples" / "resume_4_to_2.sh"), str(tmp_path / "work")], env=env,
                          capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)  # fmt: skip
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "resume_4_to_2: PASS" in done.stdout, output[-6000:]
    assert not os.path.ismount(tmp_path / "work" / "mnt"), "the example left its mount behind"


@FULL  # four DeepSpeed launches under torchrun (train on 2 ranks, convert, two resumes on 4): the full tier
@requires_fuse
@pytest.mark.timeout(EXAMPLE_TIMEOUT_S + 60)
def test_hf_trainer_resume_example(reshardfs_python: Path, tmp_path: Path) -> None:
    """examples/hf_trainer_resume.py as a user runs it (torchrun, the reshardfs.mount context manager of the
    build's Python package); tests/integration/test_hf_trainer.py checks the same story in finer detail."""
    env = dict(os.environ, PYTHONPATH=str(reshardfs_python))
    script = REPO / "examples" / "hf_trainer_resume.py"
    done = subprocess.run([sys.executable, str(script), "--out", str(tmp_path / "work")], env=env, capture_output=True,
                          text=True, timeout=EXAMPLE_TIMEOUT_S)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output[-6000:]
    assert "PASS: the resume from the mount equals DeepSpeed's load_universal" in done.stdout, output[-6000:]
    assert not os.path.ismount(tmp_path / "work" / "mnt"), "the example left its mount behind"


@FULL  # six DeepSpeed launches (a ZeRO-3 save, then three ways at two stages, 4 ranks each): the full tier
@requires_fuse
@pytest.mark.timeout(EXAMPLE_TIMEOUT_S + 60)
def test_resume_benchmark_ways_load_the_same_state(reshardfs: Path, tmp_path: Path) -> None:
    """scripts/bench_resume.py on a small checkpoint: every way (engine.load_checkpoint of a mount, DeepSpeed's
    load_universal, reshardfs.restore) resumes at ZeRO-1 and ZeRO-3, and, stage by stage, all three leave
    bit-identical fp32 partitions and Adam states on every rank (the table's digest column: one letter per
    stage). A way that loaded nothing fails in its ranks (the digest must change)."""
    env = dict(os.environ, RESHARDFS_BUILD_DIR=str(reshardfs.parents[1]))
    out = tmp_path / "bench_resume.md"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_resume.py"), "--size-gb", "0.05",
                           "--caches", "warm", "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=EXAMPLE_TIMEOUT_S)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    rows = [line.split("|")[1:-1] for line in out.read_text().splitlines() if line.startswith("| 1 ") or
            line.startswith("| 3 ")]
    assert sorted((r[0].strip(), r[1].strip()) for r in rows) == sorted(
        (s, w) for s in ("1", "3") for w in ("mount", "universal", "restore")), out.read_text()
    assert all(r[-1].strip() == "A" for r in rows), out.read_text()
    assert out.with_suffix(".png").stat().st_size > 0


def test_restore_benchmark_runs(reshardfs_python: Path, tmp_path: Path) -> None:
    """scripts/bench_restore.py on a small checkpoint (one process, no DeepSpeed): a row for every rank and the
    total, each fill reading as many bytes as the other ways and every time above zero."""
    env = dict(os.environ, RESHARDFS_BUILD_DIR=str(reshardfs_python.parent))
    out = tmp_path / "bench_restore.md"
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "bench_restore.py"), "--size-gb", "0.02",
                           "--rounds", "1", "--workdir", str(tmp_path / "work"), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, (done.stdout + done.stderr)[-6000:]
    rows = [[c.strip() for c in line.split("|")[1:-1]] for line in out.read_text().splitlines()
            if line.startswith("| ") and line[2:3].isdigit() or line.startswith("| all ")]
    assert [r[0] for r in rows] == ["0", "1", "2", "3", "all"], out.read_text()
    for r in rows:
        assert float(r[2].split()[0]) > 0, r  # source MB read
        seconds = [float(cell.split()[0]) for cell in r[4:7]]  # host, discard, memcpy
        assert all(s > 0 for s in seconds), r
