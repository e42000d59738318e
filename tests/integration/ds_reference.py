"""Ground truth for the planner: what DeepSpeed's own `load_universal` puts into each target rank.

dump_target_states(ucp_parent, zero_stage, dp, out_dir) launches `dp` CPU processes (gloo, ds_launch.launch),
running this file as a worker. Each rank builds examples/make_tiny_checkpoint.py's
TinyModel and DeepSpeed config for the target layout plus `"checkpoint": {"load_universal": true}`,
calls the unmodified `engine.load_checkpoint(ucp_parent)`, and writes

  out_dir/rank_<r>.pt      plain tensors and values read from the live engine/optimizer (see _snapshot)
  out_dir/native_resaved/  what `engine.save_checkpoint` then writes natively at the target layout

With train_steps > 0 the engine then trains that many more steps and also writes ds_resume.continue_training's
out_dir/after_rank_<r>.pt and out_dir/losses_rank_<r>.json.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

import torch

from ds_launch import LAUNCH_TIMEOUT_S, launch  # noqa: F401 (LAUNCH_TIMEOUT_S: for the other harness modules)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
sys.path.insert(0, str(EXAMPLES))
import make_tiny_checkpoint as tiny  # noqa: E402

# Steps every test-session reference run trains after its load and re-save: the resume tests compare
# them, and the other tests share the same runs (their snapshots and re-saves come before training).
REFERENCE_TRAIN_STEPS = 3


def dump_target_states(ucp_parent: Path, zero_stage: int, dp: int, out_dir: Path, bf16: bool = False,
                       train_steps: int = 0, variant: str = "") -> list[Path]:
    """Load the universal checkpoint under `ucp_parent` (the folder holding latest_universal) into a
    ZeRO-`zero_stage`, DP=`dp` engine; returns out_dir/rank_0.pt ... rank_<dp-1>.pt.
    Raises RuntimeError with the launcher's output if DeepSpeed fails."""
    out_dir.mkdir(parents=True, exist_ok=True)
    argv = ["--ucp", str(Path(ucp_parent).resolve()), "--zero-stage", str(zero_stage), "--dp", str(dp),
            "--out", str(out_dir.resolve())] + (["--bf16"] if bf16 else [])  # fmt: skip
    if train_steps > 0:
        argv += ["--train-steps", str(train_steps)]
    if variant:
        argv += ["--variant", variant]
    files = [out_dir / f"rank_{r}.pt" for r in range(dp)]
    launch(dp, Path(__file__), argv,
           f"ds_reference: load_universal ZeRO-{zero_stage} dp={dp} bf16={bf16} variant={variant or 'adamw'}", files)
    return files


# ---- worker (one per rank) -------------------------------------------------------------------


def _plain(value: Any) -> Any:
    """A detached CPU clone of a tensor; other values unchanged."""
    return value.detach().cpu().clone() if torch.is_tensor(value) else value


def _hyper(group: dict[str, Any]) -> dict[str, Any]:
    return {k: _plain(v) for k, v in group.items() if k != "params"}


def _zero12_groups(opt: Any) -> list[dict[str, Any]]:
    groups = []
    for i, fp32 in enumerate(opt.single_partition_of_fp32_groups):
        rank = torch.distributed.get_rank(group=opt.real_dp_process_group[i])
        groups.append({
            "fp32": _plain(fp32),  # padded partition, length ps
            "state": {k: _plain(v) for k, v in opt.optimizer.state[fp32].items()},
            "hyper": _hyper(opt.optimizer.param_groups[i]),
            "lp_partition": _plain(opt.parallel_partitioned_bit16_groups[i][rank]),
            "flat_numel": opt.bit16_groups_flat[i].numel(),  # Npad
            "group_padding": opt.groups_padding[i],
            "param_alignment_padding": list(opt.round_robin_bit16_padding[i]),
            "partition_count": opt.partition_count[i],
            "param_names": [opt.param_names[p] for p in opt.bit16_groups[i]],
            "slice_mappings": {n: (a.start, a.numel) for n, a in opt._param_slice_mappings[i].items()},
        })
    return groups


def _bf16_optimizer_groups(opt: Any) -> list[dict[str, Any]]:
    """BF16_Optimizer's counterpart of _zero12_groups: its partitions keep their tail padding."""
    groups = []
    for i, fp32 in enumerate(opt.fp32_groups_flat_partition):
        rank = torch.distributed.get_rank(group=opt.real_dp_process_group[i])
        groups.append({
            "fp32": _plain(fp32),
            "state": {k: _plain(v) for k, v in opt.optimizer.state[fp32].items()},
            "hyper": _hyper(opt.optimizer.param_groups[i]),
            "lp_partition": _plain(opt.bf16_partitioned_groups[i][rank]),
            "flat_numel": opt.bf16_groups_flat[i].numel(),
            "group_padding": opt.group_paddings[i],
            "partition_count": opt.partition_count[i],
            "param_names": [opt.param_names[p] for p in opt.bf16_groups[i]],
            "slice_mappings": {n: (a.start, a.numel) for n, a in opt._param_slice_mappings[i].items()},
        })
    return groups


def _zero3_sub_groups(opt: Any) -> list[dict[str, Any]]:
    return [{
        "fp32": _plain(fp32),
        "state": {k: _plain(v) for k, v in opt.optimizer.state[fp32].items()},
        "lp_partition": _plain(opt.fp16_partitioned_groups_flat[j]),
        "group_id": opt.sub_group_to_group_id[j],
        "param_names": [opt.param_names[p] for p in opt.fp16_groups[j]],
        "param_partition_numels": [p.ds_tensor.numel() for p in opt.fp16_groups[j]],
    } for j, fp32 in enumerate(opt.fp32_partitioned_groups_flat)]


def _snapshot(engine: Any, zero_stage: int) -> dict[str, Any]:
    opt = engine.optimizer
    snap = {
        "wrapper": f"{type(opt).__module__}.{type(opt).__name__}",
        "base_optimizer": f"{type(opt.optimizer).__module__}.{type(opt.optimizer).__name__}",
        "lr_scheduler": engine.lr_scheduler.state_dict(),
        "global_steps": engine.global_steps,
        "global_samples": engine.global_samples,
        "skipped_steps": engine.skipped_steps,
        "param_groups": [_hyper(g) for g in opt.optimizer.param_groups],
    }
    if zero_stage == 3:
        snap["sub_groups"] = _zero3_sub_groups(opt)
        # Frozen parameters are in no sub-group: each rank holds its partition in ds_tensor.
        snap["frozen"] = {n: _plain(p.ds_tensor) for n, p in engine.module.named_parameters() if not p.requires_grad}
    elif type(opt).__name__ == "BF16_Optimizer":
        snap["groups"] = _bf16_optimizer_groups(opt)
        snap["module"] = {k: _plain(v) for k, v in engine.module.state_dict().items()}
    else:
        snap["groups"] = _zero12_groups(opt)
        snap["module"] = {k: _plain(v) for k, v in engine.module.state_dict().items()}  # lp dtype
    return snap


def _worker(args: argparse.Namespace) -> None:
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    engine, _, _ = tiny.init_deepspeed(tiny.build_model(), args.dp, args.zero_stage, args.bf16, load_universal=True,
                                       variant=args.variant)
    load_path, _ = engine.load_checkpoint(args.ucp)
    assert load_path is not None, f"load_checkpoint({args.ucp}) found nothing"
    torch.save(_snapshot(engine, args.zero_stage), Path(args.out) / f"rank_{dist.get_rank()}.pt")
    engine.save_checkpoint(str(Path(args.out) / "native_resaved"))
    if args.train_steps > 0:
        from ds_resume import continue_training
        continue_training(engine, args.zero_stage, args.dp, args.train_steps, Path(args.out))
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--ucp", required=True)
    ap.add_argument("--zero-stage", type=int, required=True)
    ap.add_argument("--dp", type=int, required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--bf16", action="store_true")
    ap.add_argument("--train-steps", type=int, default=0)
    ap.add_argument("--variant", default="", choices=tiny.VARIANTS)
    _worker(ap.parse_args())
