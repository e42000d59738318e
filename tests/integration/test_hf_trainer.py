"""Hugging Face Trainer, end to end (examples/hf_trainer_resume.py): a tiny Llama trained by transformers.Trainer with
DeepSpeed ZeRO-1 on 2 ranks saves checkpoint-3/, converted by ds_to_universal; reshardfs mounts it at DP 4 with
the Trainer's own files passed through, and `trainer.train(resume_from_checkpoint=MOUNT)` resumes on 4 ranks.

The reference is the same 4-rank resume through DeepSpeed's own load_universal of checkpoint-3. Both runs record,
per rank, the engine right after the load (fp32 partition, exp_avg, exp_avg_sq, step, hyper-parameters, the lr
scheduler, the global step) and rank 0 the losses and learning rates of the 3 steps after it: they must be equal.
The default tier reads the source checkpoint and the reference from goldens (hf_trainer_source,
hf_trainer_universal) and launches only the resume from the mount; the full tier runs all of it live.

The 2-rank run wrote rng_state_0.pth and rng_state_1.pth only. The mount passes those through and invents none for
ranks 2 and 3, so those ranks' Trainers log their own "Didn't find an RNG file for process N" and go on with the
seed they were given, as they do under load_universal: tested here.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import hf_trainer_resume
from fuse_mount import requires_fuse, start_server, stop_server
from goldens import Reference, References, hf_trainer_launch

pytestmark = requires_fuse
CHECKPOINT = "checkpoint-3"
TRAINER_FILES = ("trainer_state.json", "rng_state_0.pth", "rng_state_1.pth", "scheduler.pt", "config.json",
                 "model.safetensors")  # fmt: skip


@pytest.fixture(scope="module")
def trainer_checkpoint(references: References) -> Path:
    return references.get(Reference("hf_trainer_source", ())) / CHECKPOINT


@pytest.fixture(scope="module")
def load_universal_resume(references: References) -> Path:
    return references.get(Reference("hf_trainer_universal", ()))


def test_trainer_resumes_from_the_mount_as_from_load_universal(reshardfs: Path, trainer_checkpoint: Path,
                                                               load_universal_resume: Path, tmp_path: Path) -> None:
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    server = start_server([reshardfs, "mount", trainer_checkpoint / "global_step3_universal", mnt, "--dp",
                           hf_trainer_resume.RESUME_DP, "-f"], mnt, tmp_path / "mount.log")
    try:
        # What the Trainer reads besides DeepSpeed's files: its own, byte for byte; nothing for the new ranks.
        for name in TRAINER_FILES:
            assert (mnt / name).read_bytes() == (trainer_checkpoint / name).read_bytes(), name
        assert not (mnt / "rng_state_2.pth").exists() and not (mnt / "rng_state_3.pth").exists()
        assert (mnt / "latest").read_text() == "global_step3"
        resumed = hf_trainer_resume.resume("resume_mount", mnt, tmp_path / "resume_mount", launch=hf_trainer_launch)
    finally:
        assert stop_server(server) == 0, server.stderr()

    problems = hf_trainer_resume.compare(resumed, load_universal_resume)
    assert not problems, "\n".join(problems)
    result = json.loads((resumed / "result.json").read_text())
    assert result["global_step"] == 6 and sorted(result["losses"], key=int) == [str(s) for s in range(1, 7)], result
    for rank in range(hf_trainer_resume.RESUME_DP):
        messages = json.loads((resumed / f"rng_messages_rank{rank}.json").read_text())
        if rank < hf_trainer_resume.TRAIN_DP:
            assert messages == [], (rank, messages)
        else:
            assert len(messages) == 1 and messages[0].startswith(f"Didn't find an RNG file for process {rank}"), \
                (rank, messages)
