"""reshardfs from Python.

`plan`, `materialize` and `mount` (a context manager) run the packaged `reshardfs` program with the target
layout as keyword arguments (reshardfs/commands.py); `restore` fills a live engine without files (below).

reshardfs.restore: fill a live DeepSpeed engine from a universal checkpoint, without files.

`restore(engine, src)` is what `engine.load_checkpoint(<reshardfs mount>)` achieves, minus the
pickles and the per-rank files: the C++ planner (reshardfs._C.RankPlan, the same plan the mount
serves) says which source bytes land at which offset of this rank's buffers, and its executor reads
each needed byte once and copies it straight into the engine's tensors, on whatever device they
live (host backend for CPU tensors, CUDA backend for GPU tensors when the extension has one).

Filled from the plan, per rank:
  ZeRO-1/2  each param group's flat fp32 partition, exp_avg and exp_avg_sq, and every trainable
            parameter's lp weight (RNE of the fp32 master, what a native save holds);
  ZeRO-3    each sub-group's fp32 partition and Adam states; the engine then re-derives its lp
            partitions from them, as DeepSpeed's own universal loader does.
Set from the checkpoint's small metadata files (read with torch.load, tensors memory-mapped): the
optimizer step (one per group or sub-group, never shared), every param group's hyper-parameters,
the loss-scaler state, the lr scheduler, global_steps, global_samples and skipped_steps.

With cooperative=True the ranks of a node split the reads (each source byte read once per node) and
exchange pieces with all-to-alls (gpu/node_executor.h). Not yet: BF16_Optimizer engines (NotImplementedError).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reshardfs import _C
from reshardfs._binary import ReshardfsError
from reshardfs.commands import Mount, materialize, mount, plan

__all__ = ["restore", "RankPlan", "plan", "materialize", "mount", "Mount", "ReshardfsError"]

RankPlan = _C.RankPlan


def _tag_dir(src: Path) -> Path:
    latest = src / "latest_universal"
    if latest.is_file():
        return src / latest.read_text().strip()
    if (src / "zero").is_dir():
        return src
    raise FileNotFoundError(f"{src}: neither a universal checkpoint tag folder (zero/) nor its parent (latest_universal)")


def _model_states(tag_dir: Path) -> dict[str, Any]:
    import torch
    names = sorted(tag_dir.glob("mp_rank_*_model_states.pt")) or sorted(tag_dir.glob("zero_pp_rank_0_mp_rank_*_model_states.pt"))
    if not names:
        raise FileNotFoundError(f"{tag_dir}: no model-states file")
    return torch.load(names[0], map_location="cpu", weights_only=False, mmap=True)


def _saved_step(tag_dir: Path, first_param: str, optim_sd: dict[str, Any], group: int) -> Any:
    """The optimizer step of a param group: step.pt of its first parameter (ZeRO-1/2 conversions), else
    the state of the group's first sub-group in optimizer_state.pt (ZeRO-3 conversions); None if neither."""
    import torch
    step_file = tag_dir / "zero" / first_param / "step.pt"
    if step_file.is_file():
        return torch.load(step_file, weights_only=False)
    osd = optim_sd.get("optimizer_state_dict", {})
    groups, state = osd.get("param_groups", []), osd.get("state", {})
    if group < len(groups) and groups[group].get("params") and groups[group]["params"][0] in state:
        return state[groups[group]["params"][0]].get("step")
    return None


def _like(live: Any, value: Any) -> Any:
    """`value` as the live optimizer keeps its step: a fresh tensor of the live dtype, or a Python int; as saved
    (a fresh copy) when the optimizer has no step yet."""
    import torch
    number = value.item() if isinstance(value, torch.Tensor) else value
    if isinstance(live, torch.Tensor):
        return torch.tensor(number, dtype=live.dtype, device=live.device)
    if live is None:
        return value.clone() if isinstance(value, torch.Tensor) else value
    return int(number)


def _address(tensor: Any) -> tuple[int, int]:
    if not tensor.is_contiguous():
        raise ValueError("reshardfs.restore needs contiguous engine tensors")
    return tensor.data_ptr(), tensor.numel() * tensor.element_size()


def _backend(tensors: list[Any]) -> tuple[str, int]:
    devices = {t.device for t in tensors}
    if len(devices) != 1:
        raise ValueError(f"engine tensors on several devices: {sorted(map(str, devices))}")
    device = devices.pop()
    if device.type == "cpu":
        return "host", 0
    if device.type == "cuda":
        if not _C.has_cuda:
            raise NotImplementedError("engine tensors are on CUDA but reshardfs._C was built without CUDA")
        return "cuda", device.index or 0
    raise NotImplementedError(f"engine tensors on {device}: only cpu and cuda are supported")


def _node_group(coords: tuple[int, int]) -> tuple[Any, list[tuple[int, int]]]:
    """This node's process group (consecutive blocks of LOCAL_WORLD_SIZE ranks) and every node rank's
    (tp_rank, dp_rank), in node-rank order."""
    import os
    import torch.distributed as dist
    size = int(os.environ.get("LOCAL_WORLD_SIZE", dist.get_world_size()))
    if size < 1 or dist.get_world_size() % size != 0:
        raise ValueError(f"LOCAL_WORLD_SIZE={size} does not divide the world size {dist.get_world_size()}")
    group, _ = dist.new_subgroups(group_size=size)
    node_ranks: list[Any] = [None] * size
    dist.all_gather_object(node_ranks, coords, group=group)
    return group, [tuple(c) for c in node_ranks]


def _fill_cooperatively(node: Any, group: Any, buffers: list[tuple], backend: str, device: int, lanes: int,
                        chunk_bytes: int, round_bytes: int) -> dict[str, Any]:
    """Each round: read this rank's chunks (its own pieces land directly, the others' are packed), one
    all-to-all over the node group, then unpack what the other ranks read for this one."""
    import time
    import torch
    import torch.distributed as dist
    start = time.monotonic()
    node.prepare(buffers, backend=backend, lanes=lanes, chunk_bytes=chunk_bytes, round_bytes=round_bytes,
                 device=device)
    where = "cpu" if backend == "host" else f"cuda:{device}"
    exchanged = 0
    for k in range(node.rounds):
        send_sizes, recv_sizes = node.send_sizes(k), node.recv_sizes(k)
        send = torch.empty(sum(send_sizes), dtype=torch.uint8, device=where)
        recv = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=where)
        node.read_round(k, send.data_ptr())
        dist.all_to_all_single(recv, send, recv_sizes, send_sizes, group=group)
        node.unpack_round(k, recv.data_ptr())
        exchanged += sum(recv_sizes)
    return {"rounds": node.rounds, "bytes_read": node.bytes_to_read, "bytes_owned": node.bytes_owned,
            "bytes_received": exchanged, "seconds": time.monotonic() - start}


def _check_names(what: str, planned: list[str], live: list[str]) -> None:
    if planned != live:
        raise ValueError(f"{what}: the plan orders {planned} but the engine holds {live}; the checkpoint's model "
                         "and the engine's model (or their param groups) differ")


def restore(engine: Any, src: str | Path, model_config: str | Path | None = None, cooperative: bool = False,
            lanes: int = 4, chunk_bytes: int = 8 << 20, round_bytes: int = 256 << 20) -> dict[str, Any]:
    """Fills `engine` (a DeepSpeed ZeRO-1/2/3 engine, already built for the target layout) from the universal
    checkpoint `src` (its tag folder, or the folder holding latest_universal). `model_config` is the model's
    HF config.json when the checkpoint was saved without TP and the engine runs AutoTP. Returns the
    checkpoint's client state (what load_checkpoint returns) plus "reshardfs_stats" (the executor's counters).

    cooperative=True: the ranks of each node (LOCAL_WORLD_SIZE consecutive ranks, as torchrun places them) read
    each source byte once between them and exchange the pieces with all-to-alls of at most `round_bytes` per
    round over a per-node process group (gloo on CPU, NCCL on GPUs). Every rank must call it then.
    chunk_bytes: the size of one read (and of each of a lane's two staging buffers); README's "Time to a resumed
    engine" has what 2 MiB and 8 MiB measured (scripts/bench_restore.py, bench_resume.py --restore-chunk-bytes).
    Raises ValueError / NotImplementedError / FileNotFoundError / OSError with the planner's message."""
    import torch
    import torch.distributed as dist
    from deepspeed.utils.bwc import bwc_tensor_model_parallel_rank, bwc_tensor_model_parallel_world_size

    src = Path(src)
    tag_dir = _tag_dir(src)
    opt = engine.optimizer
    stage = engine.zero_optimization_stage()
    if type(opt).__name__ == "BF16_Optimizer" or stage not in (1, 2, 3):
        raise NotImplementedError(f"reshardfs.restore fills ZeRO-1/2/3 engines, not {type(opt).__name__}")
    dp_group = opt.dp_process_group if stage == 3 else opt.real_dp_process_group[0]
    tp_size = bwc_tensor_model_parallel_world_size(mpu=engine.mpu)
    tp_rank = bwc_tensor_model_parallel_rank(mpu=engine.mpu)
    model_json = Path(model_config).read_text() if model_config else ""
    config_json = json.dumps(engine._config._param_dict)
    dp_size, dp_rank = dist.get_world_size(group=dp_group), dist.get_rank(group=dp_group)
    node_group = None
    if cooperative:
        node_group, node_ranks = _node_group((tp_rank, dp_rank))
        plan = _C.NodeRestore(str(src), config_json, tp_size, dp_size, node_ranks, dist.get_rank(group=node_group),
                              model_json)
    else:
        plan = _C.RankPlan(str(src), config_json, tp_size, dp_size, tp_rank, dp_rank, model_json)
    if plan.zero_stage != stage:
        raise ValueError(f"the plan is for ZeRO-{plan.zero_stage}, the engine runs ZeRO-{stage}")

    base = opt.optimizer
    names = opt.param_names
    flats_live = opt.fp32_partitioned_groups_flat if stage == 3 else opt.single_partition_of_fp32_groups
    lp_groups = opt.fp16_groups if stage == 3 else opt.bit16_groups
    if len(plan.flats) != len(flats_live):
        raise ValueError(f"the plan has {len(plan.flats)} flat partitions, the engine {len(flats_live)}")
    optim_sd = torch.load(tag_dir / "zero" / "optimizer_state.pt", map_location="cpu", weights_only=False, mmap=True)
    buffers, tensors = [], []
    for i, (flat, fp32) in enumerate(zip(plan.flats, flats_live)):
        _check_names(f"flat partition {i}", flat["param_names"], [names[p] for p in lp_groups[i]])
        # Keys in the order torch's Adam creates them (and DeepSpeed's loaders set them): step, exp_avg, exp_avg_sq.
        state = base.state[fp32]
        old = dict(state)
        state.clear()
        step = _saved_step(tag_dir, flat["param_names"][0], optim_sd, flat["param_group"]) if flat["param_names"] else None
        if step is not None:
            state["step"] = _like(old.pop("step", None), step)
        elif "step" in old:
            state["step"] = old.pop("step")
        for key in ("exp_avg", "exp_avg_sq"):
            # Uninitialised: the fill writes every byte (the executor refuses extents that leave one out), and
            # zeroing first cost each rank a pass over its partition (0.69 s of 1.4 at ZeRO-1, 4 ranks on 2 cores).
            state[key] = old.pop(key) if key in old else torch.empty_like(fp32)
        state.update(old)
        for kind, tensor in (("fp32", fp32.data), ("exp_avg", state["exp_avg"]), ("exp_avg_sq", state["exp_avg_sq"])):
            buffers.append((kind, i, *_address(tensor)))
            tensors.append(tensor)
    if stage != 3:
        by_name = {names[p]: p for group in lp_groups for p in group}
        for i, lp in enumerate(plan.lp_params):
            param = by_name.get(lp["name"])
            if param is None:
                raise ValueError(f"the engine has no trainable parameter '{lp['name']}'")
            if list(param.shape) != list(lp["shape"]):
                raise ValueError(f"'{lp['name']}': planned TP-local shape {lp['shape']}, engine {list(param.shape)}")
            buffers.append(("lp", i, *_address(param.data)))
            tensors.append(param.data)
    backend, device = _backend(tensors)
    if cooperative:
        stats = _fill_cooperatively(plan, node_group, buffers, backend, device, lanes, chunk_bytes, round_bytes)
    else:
        stats = plan.fill(buffers, backend=backend, lanes=lanes, chunk_bytes=chunk_bytes, device=device)

    # Small non-tensor state, as DeepSpeed's loaders set it (but per group, and one step per flat).
    saved_groups = optim_sd["param_groups"] if "param_groups" in optim_sd else optim_sd["optimizer_state_dict"]["param_groups"]
    if stage == 3:
        opt._load_global_state_stage3(optim_sd)
    else:
        opt._load_global_state(optim_sd)
    if len(saved_groups) != len(base.param_groups):
        raise ValueError(f"the checkpoint has {len(saved_groups)} param groups, the engine {len(base.param_groups)}")
    for live, saved in zip(base.param_groups, saved_groups):
        live.update({k: v for k, v in saved.items() if k != "params"})
    if stage == 3:
        # The lp partitions from the fp32 ones, as DeepSpeed's universal loader derives them.
        for s, fp32 in enumerate(opt.fp32_partitioned_groups_flat):
            if fp32.numel() > 0:
                opt.fp16_partitioned_groups_flat[s].data.copy_(fp32.data)
            updated = opt.unflatten(opt.fp16_partitioned_groups_flat[s], opt.fp16_partitioned_groups[s])
            for partitioned, q in zip(opt.fp16_partitioned_groups[s], updated):
                partitioned.data = q.data

    ms = _model_states(tag_dir)
    if engine.lr_scheduler is not None and ms.get("lr_scheduler") is not None:
        engine.lr_scheduler.load_state_dict(ms["lr_scheduler"])
    engine.global_steps = ms["global_steps"]
    engine.global_samples = ms.get("global_samples", engine.global_steps * engine.train_batch_size())
    engine.skipped_steps = ms["skipped_steps"]
    known = {"module", "buffer_names", "optimizer", "param_shapes", "frozen_param_shapes", "frozen_param_fragments",
             "lr_scheduler", "data_sampler", "random_ltd", "sparse_tensor_module_names", "skipped_steps",
             "global_steps", "global_samples", "dp_world_size", "mp_world_size", "ds_config", "ds_version",
             "shared_params", "universal_checkpoint_info", "checkpoint_parallel_dimensions"}
    client = {k: v for k, v in ms.items() if k not in known}
    client["reshardfs_stats"] = stats
    return client
