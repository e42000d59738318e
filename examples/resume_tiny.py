#!/usr/bin/env python3
"""Resume the tiny model (make_tiny_checkpoint.TinyModel) on --dp CPU ranks and train --steps more steps.

    python examples/resume_tiny.py --checkpoint MOUNTPOINT --dp 2 --losses out.json
    python examples/resume_tiny.py --checkpoint UCP_PARENT --dp 2 --load-universal --losses ref.json

It re-launches itself under torch.distributed.run (gloo). Every rank builds the model and the DeepSpeed
config of a DP=--dp ZeRO-1 fp32 run and calls the unmodified engine.load_checkpoint(--checkpoint): a
reshardfs mountpoint (native files of this layout), or, with --load-universal, the universal checkpoint
itself through DeepSpeed's own universal loader. It then trains on the example's data from the step the
checkpoint was saved at, prints each step's all-reduced loss and writes them to --losses as JSON.
"""
import argparse
import json
import os
import subprocess
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from make_tiny_checkpoint import build_model, cpu_env, init_deepspeed, torchrun_cmd, train_step  # noqa: E402


def worker(args):
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    engine, _, _ = init_deepspeed(build_model(), args.dp, args.zero_stage, load_universal=args.load_universal)
    load_path, _ = engine.load_checkpoint(args.checkpoint)
    assert load_path is not None, f"engine.load_checkpoint({args.checkpoint}) found no checkpoint"
    rank = dist.get_rank()
    start = engine.global_steps
    if rank == 0:
        print(f"[resume] DP={args.dp}: loaded {load_path} at step {start}")
    losses = []
    for step in range(start, start + args.steps):
        losses.append(train_step(engine, step, args.dp))
        if rank == 0:
            print(f"[resume] step {step + 1}: loss {losses[-1]:.8f}")
    if rank == 0 and args.losses:
        with open(args.losses, "w") as f:
            json.dump({"start_step": start, "losses": losses}, f)
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--checkpoint", required=True, help="mountpoint, or UCP parent with --load-universal")
    ap.add_argument("--dp", type=int, default=2)
    ap.add_argument("--zero-stage", type=int, default=1, choices=[1, 2, 3])
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--load-universal", action="store_true", help="DeepSpeed's own universal loader")
    ap.add_argument("--losses", help="write the losses here (JSON)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        return worker(args)
    fwd = ["--worker", "--checkpoint", os.path.abspath(args.checkpoint), "--dp", str(args.dp), "--zero-stage",
           str(args.zero_stage), "--steps", str(args.steps)]
    fwd += ["--load-universal"] if args.load_universal else []
    fwd += ["--losses", os.path.abspath(args.losses)] if args.losses else []
    subprocess.run(torchrun_cmd(args.dp, os.path.abspath(__file__), fwd), env=cpu_env(), check=True)


if __name__ == "__main__":
    main()
