"""Resuming the tiny AutoTP Llama (examples/make_tiny_llama_checkpoint.py) at a TP x DP layout, for the TP tests.

resume(mode, checkpoint, tp, dp, zero_stage, out_dir) launches tp * dp CPU processes (gloo, ds_launch.launch),
running this file as a worker. Each rank builds the example's model (LlamaForCausalLM, or
another of make_tiny_llama_checkpoint.MODELS) and DeepSpeed config for the layout ("tensor_parallel": {"autotp_size":
tp}), and loads `checkpoint` with the unmodified engine.load_checkpoint:

  mode "native"     load_universal off: a reshardfs mountpoint (or any native checkpoint folder);
  mode "universal"  load_universal on: DeepSpeed's own universal loader of the same UCP, the reference;
                    at ZeRO-3 with its two known defects undone (ds_resume.correct_zero3_load_universal);
  mode "restore"    no load_checkpoint: reshardfs.restore(engine, UCP, model_config) (imported from
                    --python-dir) fills the engine straight from the universal checkpoint.

Then it writes, per global rank r:

  out_dir/rank_<r>.pt            ds_reference._snapshot of the engine right after the load
  out_dir/after_rank_<r>.pt      the same after `train_steps` more steps on the example's data
  out_dir/losses_rank_<r>.json   {"start_step", "losses" (this rank's), "global_mean_losses"}

The steps continue the example's deterministic data (llama.global_batch(step), cut by DP rank), so a
correct resume continues the original run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import torch

from ds_reference import EXAMPLES, _snapshot, launch

sys.path.insert(0, str(EXAMPLES))
import make_tiny_llama_checkpoint as llama  # noqa: E402

MODES = ("native", "universal", "restore")
# fp32 weights; bf16 weights; bf16 weights with fp32 gradient accumulation (DeepSpeed's BF16_Optimizer, ZeRO-1).
PRECISIONS = ("fp32", "bf16", "bf16_optimizer")


def resume(mode: str, checkpoint: Path, tp: int, dp: int, zero_stage: int, out_dir: Path, precision: str = "fp32",
           train_steps: int = 3, python_dir: Path | None = None, model_config: Path | None = None,
           model: str = "llama") -> Path:
    """Runs the workers; returns out_dir. Raises RuntimeError with the failing rank's traceback on failure.
    Mode "restore" needs `python_dir` (the build's python/) and takes the model's `model_config`.
    `model`: the example's model (make_tiny_llama_checkpoint --model)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = ["--mode", mode, "--checkpoint", str(Path(checkpoint).resolve()), "--tp", str(tp), "--dp", str(dp),
            "--zero-stage", str(zero_stage), "--out", str(out_dir.resolve()), "--train-steps", str(train_steps),
            "--model", model]
    argv += ["--precision", precision]
    if python_dir is not None:
        argv += ["--python-dir", str(Path(python_dir).resolve())]
    if model_config is not None:
        argv += ["--model-config", str(Path(model_config).resolve())]
    expected = [out_dir / f"rank_{r}.pt" for r in range(tp * dp)]
    if train_steps > 0:
        expected += [out_dir / f"{name}_rank_{r}.{ext}" for r in range(tp * dp)
                     for name, ext in (("after", "pt"), ("losses", "json"))]  # fmt: skip
    launch(tp * dp, Path(__file__), argv, f"llama_resume: {mode} ZeRO-{zero_stage} TP {tp} x DP {dp} {precision}",
           expected)
    return out_dir


# ---- worker (one per rank) -------------------------------------------------------------------


def snapshot(engine: Any, zero_stage: int, tp: int) -> dict[str, Any]:
    """ds_reference._snapshot plus the rank's place in the TP x DP grid and, at ZeRO-3, every parameter's
    TP-local shape (ds_shape) as DeepSpeed's AutoTP layers made it."""
    import torch.distributed as dist
    from deepspeed.utils import groups
    snap = _snapshot(engine, zero_stage)
    # At TP 1 DeepSpeed creates no tensor-parallel group at all.
    snap["tp_rank"] = groups.get_tensor_model_parallel_rank() if tp > 1 else 0
    snap["dp_rank"] = groups._get_data_parallel_rank() if tp > 1 else dist.get_rank()
    if zero_stage == 3:
        opt = engine.optimizer
        snap["ds_shapes"] = {opt.param_names[p]: tuple(p.ds_shape) for group in opt.fp16_groups for p in group}
    return snap


def _continue_training(engine: Any, zero_stage: int, tp: int, train_steps: int, out_dir: Path, rank: int) -> None:
    start = engine.global_steps
    losses, means = [], []
    for step in range(start, start + train_steps):
        tokens = llama.local_batch(step)
        loss = engine(input_ids=tokens, labels=tokens).loss
        engine.backward(loss)
        engine.step()
        losses.append(loss.detach().float().item())
        means.append(llama.global_mean(loss.detach()))
    torch.save(snapshot(engine, zero_stage, tp), out_dir / f"after_rank_{rank}.pt")
    record = {"start_step": start, "losses": losses, "global_mean_losses": means}
    (out_dir / f"losses_rank_{rank}.json").write_text(json.dumps(record))


def _worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    out = Path(args.out)
    model = llama.build_model(args.model)
    universal = args.mode == "universal"
    with torch.no_grad():  # a load that silently leaves the initial weights must not pass
        for p in model.parameters():
            # DeepSpeed's load_universal never loads frozen parameters (engine.py skips load_module_state_dict
            # under load_universal): there they keep the seeded initial weights, which are the saved ones.
            if p.requires_grad or not universal:
                p.add_(0.5)
    engine, _ = llama.init_engine(model, args, load_universal=universal)
    if args.mode == "restore":
        sys.path.insert(0, args.python_dir)
        import reshardfs
        reshardfs.restore(engine, args.checkpoint, model_config=args.model_config)
    else:
        load_path, _ = engine.load_checkpoint(args.checkpoint)
        assert load_path is not None, f"load_checkpoint({args.checkpoint}) found nothing"
    if universal and args.zero_stage == 3:
        from ds_resume import correct_zero3_load_universal
        correct_zero3_load_universal(engine, Path(args.checkpoint))
    rank = dist.get_rank()
    torch.save(snapshot(engine, args.zero_stage, args.tp), out / f"rank_{rank}.pt")
    if args.train_steps > 0:
        _continue_training(engine, args.zero_stage, args.tp, args.train_steps, out, rank)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--checkpoint", required=True)
    ap.add_argument("--tp", type=int, required=True)
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--zero-stage", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--precision", choices=PRECISIONS, default="fp32")
    ap.add_argument("--train-steps", type=int, default=0)
    ap.add_argument("--python-dir")
    ap.add_argument("--model-config")
    ap.add_argument("--model", default="llama", choices=list(llama.MODELS))
    cli = ap.parse_args()
    cli.bf16, cli.bf16_optimizer = cli.precision != "fp32", cli.precision == "bf16_optimizer"
    _worker(cli)
