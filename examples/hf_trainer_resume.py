"""Hugging Face Trainer + DeepSpeed: train on 2 ranks, resume on 4 from a reshardfs mount.

    python examples/hf_trainer_resume.py [--out DIR]     (CPU, gloo; about 2 minutes on 2 cores)

1. A tiny Llama causal LM is trained by `transformers.Trainer` with a DeepSpeed ZeRO-1 config on 2 ranks for 3
   steps; the Trainer saves `DIR/run/checkpoint-3/` (DeepSpeed's global_step3/ plus its own files:
   trainer_state.json, rng_state_{0,1}.pth, training_args.bin, the model's config and weights).
2. DeepSpeed's `ds_to_universal` converts it into `checkpoint-3/global_step3_universal/` (+ latest_universal).
3. `reshardfs.mount(checkpoint-3/global_step3_universal, MNT, dp=4)` serves it as a DP 4 run would have saved it;
   the Trainer's files beside it are passed through. `trainer.train(resume_from_checkpoint=MNT)` runs on 4 ranks
   for 3 more steps.
4. The same resume through DeepSpeed's own `load_universal` of checkpoint-3 (ds_config checkpoint.load_universal).

Each resume writes DIR/<name>/result.json (global step, learning rates, losses of the resumed steps) and, per
rank, DIR/<name>/state_rank<R>.pt: the optimizer's fp32 partition and Adam states, the lr scheduler's state and
the global step as the engine holds them right after loading (a TrainerCallback's on_train_begin). The script
prints both and exits 1 unless they are equal.

What a user resuming under the Trainer at another DP should know (transformers 4.57.1, what this script shows):
the Trainer restores the per-device batch size from trainer_state.json, so the global batch scales with the DP
degree (8 at DP 2, 16 at DP 4 here), and it skips the batches the old run consumed counted in its own steps.

The new ranks 2 and 3 find no rng_state_2.pth / rng_state_3.pth (the 2-rank run never wrote them); the mount does
not invent them, so the Trainer logs its own "Didn't find an RNG file for process 2" and goes on with the seed it
was given, exactly as it does when resuming through load_universal.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from make_tiny_checkpoint import cpu_env, finish_output, to_universal, torchrun_cmd  # noqa: E402

SAVE_STEP = 3
TOTAL_STEPS = 6
# Per rank, in both runs: on resume the Trainer takes the per-device batch size from the checkpoint's
# trainer_state.json (train_batch_size) whatever its arguments say, so at DP 4 the global batch is 16 (8 at DP 2).
PER_DEVICE_BATCH = 4
SEQUENCE = 16
SAMPLES = 64
TRAIN_DP = 2
RESUME_DP = 4


def build_model():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=SEQUENCE,
                         tie_word_embeddings=False)
    return LlamaForCausalLM(config)


class TokenData:
    """SAMPLES fixed random sequences (labels = inputs: next-token prediction)."""

    def __init__(self):
        import torch
        generator = torch.Generator().manual_seed(1234)
        self.tokens = torch.randint(0, 128, (SAMPLES, SEQUENCE), generator=generator)

    def __len__(self):
        return SAMPLES

    def __getitem__(self, i):
        return {"input_ids": self.tokens[i], "labels": self.tokens[i]}


def ds_config(load_universal: bool) -> dict:
    """ZeRO-1 with the Trainer's AdamW and linear schedule as DeepSpeed's client optimizer and scheduler."""
    config = {
        "train_batch_size": "auto",
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_optimization": {"stage": 1, "reduce_bucket_size": 1_000_000},
        "zero_allow_untested_optimizer": True,
        "steps_per_print": 1000,
    }
    if load_universal:
        config["checkpoint"] = {"load_universal": True}
    return config


def snapshot_callback(out: Path):
    """A TrainerCallback that saves, per rank, what the engine holds right after the checkpoint was loaded."""
    import torch
    import torch.distributed as dist
    from transformers import TrainerCallback

    class Snapshot(TrainerCallback):
        def on_train_begin(self, args, state, control, optimizer=None, lr_scheduler=None, **kwargs):
            zero = optimizer  # accelerate's wrapper around DeepSpeed's ZeRO optimizer around torch's AdamW
            while not hasattr(zero, "single_partition_of_fp32_groups"):
                zero = zero.optimizer
            base = zero.optimizer
            partitions = [p.detach().clone() for p in zero.single_partition_of_fp32_groups]
            adam = [{k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in base.state[p].items()}
                    for p in zero.single_partition_of_fp32_groups]
            torch.save({"global_step": state.global_step, "fp32_partitions": partitions, "adam": adam,
                        "param_groups": [{k: v for k, v in g.items() if k != "params"} for g in base.param_groups],
                        "lr_scheduler": lr_scheduler.state_dict()}, out / f"state_rank{dist.get_rank()}.pt")

    return Snapshot()


class TrainerMessages:
    """The transformers.trainer log records about RNG files this process sees (the Trainer logs at info level
    whether it found the checkpoint's rng_state_<rank>.pth)."""

    def __init__(self):
        import logging
        self.messages: list[str] = []
        messages = self.messages

        class Keep(logging.Handler):
            def emit(self, record):
                if "RNG" in record.getMessage():
                    messages.append(record.getMessage())

        logging.getLogger("transformers.trainer").addHandler(Keep(level=logging.INFO))


def worker(args) -> None:
    import torch.distributed as dist
    from transformers import Trainer, TrainingArguments

    out = Path(args.out)
    resume = args.mode != "train"
    messages = TrainerMessages()
    training_args = TrainingArguments(
        output_dir=str(out if not resume else out / "trainer"),
        per_device_train_batch_size=PER_DEVICE_BATCH,
        max_steps=SAVE_STEP if not resume else TOTAL_STEPS,
        learning_rate=1e-3,
        lr_scheduler_type="linear",
        warmup_steps=2,
        weight_decay=0.01,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="steps" if not resume else "no",
        save_steps=SAVE_STEP,
        seed=0,
        report_to=[],
        disable_tqdm=True,
        dataloader_num_workers=0,
        deepspeed=ds_config(load_universal=args.mode == "resume_load_universal"),
        ddp_backend="gloo",
        log_level="info",
        log_level_replica="info",
    )
    callbacks = [snapshot_callback(out)] if resume else []
    trainer = Trainer(model=build_model(), args=training_args, train_dataset=TokenData(), callbacks=callbacks)
    trainer.train(resume_from_checkpoint=str(args.checkpoint) if resume else None)
    if resume:
        (out / f"rng_messages_rank{dist.get_rank()}.json").write_text(json.dumps(messages.messages))
    if dist.get_rank() == 0:
        losses = {entry["step"]: entry["loss"] for entry in trainer.state.log_history if "loss" in entry}
        lrs = {entry["step"]: entry["learning_rate"] for entry in trainer.state.log_history if "learning_rate" in entry}
        (out / "result.json").write_text(json.dumps({"global_step": trainer.state.global_step, "losses": losses,
                                                     "learning_rates": lrs}, indent=1))


def torchrun_launch(nproc: int, argv: list[str], what: str, expected: list[Path]) -> None:
    """Runs this script's worker on `nproc` CPU ranks under torch.distributed.run; `expected` must exist after."""
    subprocess.run(torchrun_cmd(nproc, str(Path(__file__).resolve()), [str(a) for a in argv]), env=cpu_env(),
                   check=True)
    missing = [str(p) for p in expected if not p.is_file()]
    if missing:
        raise RuntimeError(f"{what}: the ranks exited 0 but left no {missing}")


def make_source(out: Path, launch=torchrun_launch) -> Path:
    """Steps 1 and 2: the Trainer's 2-rank run into `out` and the universal conversion of its checkpoint; returns
    out/checkpoint-3."""
    checkpoint = out / f"checkpoint-{SAVE_STEP}"
    launch(TRAIN_DP, ["--worker", "train", "--out", out], f"hf_trainer: train DP {TRAIN_DP}",
           [checkpoint / "trainer_state.json"])
    convert(checkpoint)
    finish_output(str(checkpoint))
    return checkpoint


def resume(mode: str, checkpoint: Path, out: Path, launch=torchrun_launch) -> Path:
    """A 4-rank resume from `checkpoint` (mode resume_mount: a mount of it; resume_load_universal: the Trainer's
    checkpoint folder, loaded by DeepSpeed's load_universal) writing its results into `out`; returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    launch(RESUME_DP, ["--worker", mode, "--out", out, "--checkpoint", checkpoint],
           f"hf_trainer: {mode} DP {RESUME_DP}", [out / "result.json"] +
           [out / f"{name}_rank{rank}.{ext}" for rank in range(RESUME_DP)
            for name, ext in (("state", "pt"), ("rng_messages", "json"))])
    return out


def convert(checkpoint: Path) -> Path:
    """ds_to_universal of checkpoint-N/global_stepN into checkpoint-N/global_stepN_universal (a HF model writes no
    universal_checkpoint_info, hence --inject_missing_state, which changes no file)."""
    return Path(to_universal(str(checkpoint), str(checkpoint), inject_missing_state=True))


def compare(mounted: Path, reference: Path) -> list[str]:
    """The differences between the two resumes: result.json and each rank's state right after loading."""
    import torch
    problems = []
    got, want = (json.loads((d / "result.json").read_text()) for d in (mounted, reference))
    if got != want:
        problems.append(f"result.json: {got} != {want}")
    for rank in range(RESUME_DP):
        got, want = (json.loads((d / f"rng_messages_rank{rank}.json").read_text()) for d in (mounted, reference))
        if got != want:
            problems.append(f"rank {rank}, the Trainer's RNG-file messages: {got} != {want}")
        a, b = (torch.load(d / f"state_rank{rank}.pt", weights_only=False) for d in (mounted, reference))
        for key in ("global_step", "param_groups", "lr_scheduler"):
            if a[key] != b[key]:
                problems.append(f"rank {rank} {key}: {a[key]} != {b[key]}")
        for i, (x, y) in enumerate(zip(a["fp32_partitions"], b["fp32_partitions"], strict=True)):
            if not torch.equal(x, y):
                problems.append(f"rank {rank} fp32 partition {i} differs")
        for i, (x, y) in enumerate(zip(a["adam"], b["adam"], strict=True)):
            if x.keys() != y.keys() or any(not torch.equal(torch.as_tensor(x[k]), torch.as_tensor(y[k])) for k in x):
                problems.append(f"rank {rank} Adam state {i} differs")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a temporary one)")
    parser.add_argument("--worker", choices=["train", "resume_mount", "resume_load_universal"])
    parser.add_argument("--checkpoint", type=Path)
    args = parser.parse_args()
    if args.worker:
        args.mode = args.worker
        worker(args)
        return 0

    import reshardfs
    out = (args.out or Path(tempfile.mkdtemp(prefix="hf_trainer_resume."))).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    checkpoint = make_source(out / "run")
    (out / "mnt").mkdir()
    with reshardfs.mount(checkpoint / f"global_step{SAVE_STEP}_universal", out / "mnt", dp=RESUME_DP) as mounted:
        resume("resume_mount", mounted.path, out / "resume_mount")
    resume("resume_load_universal", checkpoint, out / "resume_load_universal")

    for name in ("resume_mount", "resume_load_universal"):
        print(f"{name}: {(out / name / 'result.json').read_text()}")
    problems = compare(out / "resume_mount", out / "resume_load_universal")
    print("\n".join(problems) if problems else "PASS: the resume from the mount equals DeepSpeed's load_universal")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
