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
