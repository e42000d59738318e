"""Resuming with DeepSpeed's own native loader, and continuing training, for the resume tests.

resume_from_native(checkpoint_dir, zero_stage, dp, out_dir) launches `dp` CPU processes (gloo, ds_launch.launch),
running this file as a worker. Each rank builds examples/make_tiny_checkpoint.py's
TinyModel and the DeepSpeed config of the target layout (load_universal off), fills its frozen parameters
with NaN (poison_frozen), calls the unmodified `engine.load_checkpoint(checkpoint_dir)` (a reshardfs mountpoint,
or any native checkpoint), and writes

  out_dir/rank_<r>.pt            ds_reference._snapshot of the engine right after the load
  out_dir/after_rank_<r>.pt      the same snapshot after `train_steps` more optimizer steps
  out_dir/losses_rank_<r>.json   {"start_step", "losses", "global_mean_losses"} of those steps

The steps continue the tiny example's deterministic data: step k (0-based, k = engine.global_steps after
the load, 3 for the bundled checkpoints) trains on tiny.local_batch(k, rank, dp), exactly the batch the
original run would have used next. `losses` are this rank's own micro-batch losses (fp32 Python floats,
exact), `global_mean_losses` their all-reduced mean.

Mode `restore` replaces load_checkpoint with reshardfs.restore(engine, <UCP>) (gpu/python/reshardfs, imported
from --python-dir): the engine is filled from the universal checkpoint directly, and the same files are written.

Two more worker modes give references the resume tests compare against:
  train_uninterrupted   trains `steps` steps from TinyModel's initial weights, saves them natively
                        (out_dir/native) and snapshots, then trains on: the original run that a round trip
                        must continue exactly (to_universal converts its native save with DeepSpeed's own
                        ds_to_universal, as examples/make_tiny_checkpoint.py does);
  universal_corrected   DeepSpeed's own ZeRO-3 load_universal followed by the correction of its two known
                        defects (per-group hyper-parameters, one `step` tensor per sub-group), so that a
                        ZeRO-3 resume at a new DP has a same-layout training reference.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from ds_reference import LAUNCH_TIMEOUT_S, _snapshot, launch, tiny

MODES = ("native", "restore", "train_uninterrupted", "universal_corrected")
COOPERATIVE_ROUND_BYTES = 16384
COOPERATIVE_CHUNK_BYTES = 4096


def _launch(mode: str, zero_stage: int, dp: int, out_dir: Path, bf16: bool, train_steps: int,
            checkpoint_dir: Path | None = None, steps: int = 0, variant: str = "",
            python_dir: Path | None = None, cooperative: bool = False) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = ["--mode", mode, "--zero-stage", str(zero_stage), "--dp", str(dp), "--out", str(out_dir.resolve()),
            "--train-steps", str(train_steps), "--steps", str(steps)] + (["--bf16"] if bf16 else [])  # fmt: skip
    if variant:
        argv += ["--variant", variant]
    if checkpoint_dir is not None:
        argv += ["--checkpoint", str(Path(checkpoint_dir).resolve())]
    if python_dir is not None:
        argv += ["--python-dir", str(Path(python_dir).resolve())]
    if cooperative:
        argv.append("--cooperative")
    files = [out_dir / f"rank_{r}.pt" for r in range(dp)]
    trained = [out_dir / f"{name}_rank_{r}.{ext}" for r in range(dp)
               for name, ext in (("after", "pt"), ("losses", "json"))]  # fmt: skip
    launch(dp, Path(__file__), argv,
           f"ds_resume: {mode} ZeRO-{zero_stage} dp={dp} bf16={bf16} variant={variant or 'adamw'}",
           files + (trained if train_steps > 0 else []))  # fmt: skip
    return files


def resume_from_native(checkpoint_dir: Path, zero_stage: int, dp: int, out_dir: Path, bf16: bool = False,
                       train_steps: int = 3, variant: str = "") -> list[Path]:
    """engine.load_checkpoint(checkpoint_dir) with load_universal off at ZeRO-`zero_stage`, DP=`dp`, then
    `train_steps` more steps; returns out_dir/rank_<r>.pt. Raises RuntimeError with the output on failure."""
    return _launch("native", zero_stage, dp, out_dir, bf16, train_steps, checkpoint_dir=checkpoint_dir, variant=variant)


def restore_from_universal(ucp_parent: Path, zero_stage: int, dp: int, out_dir: Path, python_dir: Path,
                           bf16: bool = False, train_steps: int = 3, variant: str = "",
                           cooperative: bool = False) -> list[Path]:
    """reshardfs.restore(engine, ucp_parent) at ZeRO-`zero_stage`, DP=`dp` (no load_checkpoint), then `train_steps`
    more steps; also writes out_dir/restore_stats_rank_<r>.json (the executor's counters). `cooperative`: the
    ranks read cooperatively and exchange over gloo, in rounds of COOPERATIVE_ROUND_BYTES (small, so that the
    tiny model's restore takes several rounds)."""
    return _launch("restore", zero_stage, dp, out_dir, bf16, train_steps, checkpoint_dir=ucp_parent, variant=variant,
                   python_dir=python_dir, cooperative=cooperative)


def train_uninterrupted(zero_stage: int, dp: int, out_dir: Path, bf16: bool = False, steps: int = 3,
                        train_steps: int = 3, variant: str = "") -> list[Path]:
    """The original tiny run: `steps` steps from the initial weights, engine.save_checkpoint(out_dir/native),
    snapshot (rank_<r>.pt), then `train_steps` more, recorded as resume_from_native records them."""
    return _launch("train_uninterrupted", zero_stage, dp, out_dir, bf16, train_steps, steps=steps, variant=variant)


def to_universal(native_dir: Path, universal_parent: Path) -> Path:
    """DeepSpeed's ds_to_universal of native_dir's latest tag into universal_parent (make_tiny_checkpoint's
    converter call, flags included); returns universal_parent."""
    tiny.to_universal(str(native_dir), str(universal_parent), inject_missing_state=True, timeout=LAUNCH_TIMEOUT_S)
    return universal_parent


def universal_corrected(ucp_parent: Path, zero_stage: int, dp: int, out_dir: Path, train_steps: int = 3,
                        bf16: bool = False) -> list[Path]:
    """DeepSpeed's ZeRO-3 load_universal of `ucp_parent`, its two known defects corrected (see
    correct_zero3_load_universal), then `train_steps` more steps."""
    assert zero_stage == 3, "only DeepSpeed's ZeRO-3 universal loader needs correcting"
    return _launch("universal_corrected", zero_stage, dp, out_dir, bf16, train_steps, checkpoint_dir=ucp_parent)


# ---- worker (one per rank) -------------------------------------------------------------------


def continue_training(engine: Any, zero_stage: int, dp: int, train_steps: int, out_dir: Path) -> None:
    """Trains `train_steps` steps on the tiny example's data from step engine.global_steps on, then writes
    out_dir/after_rank_<r>.pt and out_dir/losses_rank_<r>.json (see the module docstring)."""
    import torch.distributed as dist
    rank = dist.get_rank()
    start = engine.global_steps
    losses, means = [], []
    for step in range(start, start + train_steps):
        tokens, targets = tiny.local_batch(step, rank, dp)
        loss = engine(tokens, targets)
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach().float().item())
        means.append(tiny.global_mean(loss.detach()))
    torch.save(_snapshot(engine, zero_stage), out_dir / f"after_rank_{rank}.pt")
    record = {"start_step": start, "losses": losses, "global_mean_losses": means}
    (out_dir / f"losses_rank_{rank}.json").write_text(json.dumps(record))


def correct_zero3_load_universal(engine: Any, ucp_parent: Path) -> None:
    """Undoes DeepSpeed 0.19.8's two ZeRO-3 load_universal defects in the live optimizer (stage3.py
    load_hp_checkpoint_state_from_checkpoint_dir_stage3), asserting each is present first:
    every param group got group 0's hyper-parameters, and every sub-group's state['step'] is one shared
    tensor object (AdamW increments it in place once per sub-group)."""
    tag = (ucp_parent / "latest_universal").read_text().strip()
    saved = torch.load(ucp_parent / tag / "zero" / "optimizer_state.pt", weights_only=False)
    groups = saved["optimizer_state_dict"]["param_groups"]
    base = engine.optimizer.optimizer
    assert [g["lr"] for g in base.param_groups] == [groups[0]["lr"]] * len(base.param_groups), \
        "DeepSpeed no longer copies group 0's hyper-parameters into every group"
    for live, group in zip(base.param_groups, groups):
        live.update({k: v for k, v in group.items() if k != "params"})
    steps = [base.state[fp32]["step"] for fp32 in engine.optimizer.fp32_partitioned_groups_flat]
    assert len(steps) > 1 and all(s is steps[0] for s in steps), "DeepSpeed no longer shares one step tensor"
    for fp32 in engine.optimizer.fp32_partitioned_groups_flat:
        base.state[fp32]["step"] = base.state[fp32]["step"].clone()


def poison_frozen(engine: Any) -> None:
    """Fills the frozen parameters (this rank's ZeRO-3 partition) with NaN. Their initial values are the saved ones
    (TinyModel is seeded, and frozen parameters never change), so only this makes a check of them after a native
    load able to fail: they hold the checkpoint's values only if load_checkpoint put them there. (DeepSpeed's own
    load_universal never loads them: engine.py skips load_module_state_dict under load_universal.)"""
    for param in engine.module.parameters():
        if not param.requires_grad:
            (param.ds_tensor if hasattr(param, "ds_tensor") else param).data.fill_(float("nan"))


def _worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    out = Path(args.out)
    engine, _, _ = tiny.init_deepspeed(tiny.build_model(), args.dp, args.zero_stage, args.bf16,
                                       load_universal=args.mode == "universal_corrected", variant=args.variant)
    if args.mode == "train_uninterrupted":
        for step in range(args.steps):
            tiny.train_step(engine, step, args.dp)
        engine.save_checkpoint(str(out / "native"))
    elif args.mode == "restore":
        sys.path.insert(0, args.python_dir)
        import reshardfs
        client = reshardfs.restore(engine, args.checkpoint, cooperative=args.cooperative,
                                   chunk_bytes=COOPERATIVE_CHUNK_BYTES if args.cooperative else 8 << 20,
                                   round_bytes=COOPERATIVE_ROUND_BYTES)
        (out / f"restore_stats_rank_{dist.get_rank()}.json").write_text(json.dumps(client["reshardfs_stats"]))
    else:
        if args.mode != "universal_corrected":
            poison_frozen(engine)
        load_path, _ = engine.load_checkpoint(args.checkpoint)
        assert load_path is not None, f"load_checkpoint({args.checkpoint}) found nothing"
        if args.mode == "universal_corrected":
            correct_zero3_load_universal(engine, Path(args.checkpoint))
    torch.save(_snapshot(engine, args.zero_stage), out / f"rank_{dist.get_rank()}.pt")
    if args.train_steps > 0:
        continue_training(engine, args.zero_stage, args.dp, args.train_steps, out)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--checkpoint")
    ap.add_argument("--python-dir")
    ap.add_argument("--cooperative", action="store_true")
    ap.add_argument("--zero-stage", type=int, required=True)
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--steps", type=int, default=0)
    ap.add_argument("--train-steps", type=int, default=0)
    ap.add_argument("--variant", default="", choices=tiny.VARIANTS)
    _worker(ap.parse_args())
