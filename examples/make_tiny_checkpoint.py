#!/usr/bin/env python3
"""Regenerate examples/tiny/: a tiny, real DeepSpeed ZeRO checkpoint (native) and its universal
conversion made by DeepSpeed's own ds_to_universal.

    DS_ACCELERATOR=cpu /opt/reshardfs/venv/bin/python examples/make_tiny_checkpoint.py

What it does:
  1. re-launches itself under `python -m torch.distributed.run --nproc_per_node=<dp>` (CPU, gloo);
  2. each rank builds TinyModel (fixed seed), DeepSpeed ZeRO-<stage>, fp32, torch AdamW with two
     param groups, WarmupLR; trains --steps steps on deterministic data;
  3. engine.save_checkpoint(<out>/native)  -> <out>/native/global_step<steps>/ + <out>/native/latest;
  4. runs `python -m deepspeed.checkpoint.ds_to_universal --input_folder <out>/native/<tag>
     --output_folder <out>/universal/<tag>_universal --inject_missing_state` which also writes
     <out>/universal/latest_universal;
  5. removes <out>/native/zero_to_fp32.py and zero_to_torch.py (copies of DeepSpeed's recovery
     scripts; nothing loads them).

The shared model/data/config helpers below are imported by check_tiny_checkpoint.py.
"""
import argparse
import os
import shutil
import socket
import subprocess
import sys

import torch
import torch.nn as nn

HERE = os.path.dirname(os.path.abspath(__file__))

VOCAB = 64
HIDDEN = 32
SEQ = 8
GLOBAL_BATCH = 8  # sequences per optimizer step, over all DP ranks
SEED = 1234
DATA_SEED = 4321
# DeepSpeed allocates its gradient reduce buckets (reduce_bucket_size elements, default 5e8: 2 GB of fp32) at every
# step, and under torch.use_deterministic_algorithms torch.empty fills them with NaN: about 3 s of CPU per rank and
# step. The tiny models have far fewer parameters than this, so one bucket still holds every gradient.
REDUCE_BUCKET_ELEMENTS = 1_000_000


class TinyModel(nn.Module):
    """embedding 64x32 -> fc1 32x32 -> gelu -> fc2 32x32 -> gelu -> untied head 32->64.

    6272 parameters: embed.weight [64,32], fc1.weight [32,32], fc1.bias [32],
    fc2.weight [32,32], fc2.bias [32], head.weight [64,32], head.bias [64].
    """

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(VOCAB, HIDDEN)
        self.fc1 = nn.Linear(HIDDEN, HIDDEN)
        self.fc2 = nn.Linear(HIDDEN, HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB)  # untied from embed

    def forward(self, tokens, targets):
        h = self.embed(tokens)
        h = torch.nn.functional.gelu(self.fc1(h))
        h = torch.nn.functional.gelu(self.fc2(h))
        logits = self.head(h)
        return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), targets.reshape(-1))


def build_model():
    torch.manual_seed(SEED)
    return TinyModel()


def param_groups(model):
    """Two param groups with different lr / weight decay.

    group 0: the 2-D weight matrices of fc1, fc2, head  (lr 1e-3, wd 0.01)
    group 1: embedding + all biases                     (lr 5e-4, wd 0.0)
    """
    g0, g1 = [], []
    for name, p in model.named_parameters():
        (g0 if (p.dim() == 2 and not name.startswith("embed")) else g1).append(p)
    return [
        {"params": g0, "lr": 1e-3, "weight_decay": 0.01},
        {"params": g1, "lr": 5e-4, "weight_decay": 0.0},
    ]


VARIANTS = ("", "cpu_adam", "bf16_optimizer", "frozen", "round_robin")


def ds_config(dp, zero_stage, bf16=False, load_universal=False, variant=""):
    """The run's DeepSpeed config. `variant`:
      ""                torch.optim.AdamW under DeepSpeed's ZeRO optimizer (state['step'] a 0-d tensor);
      "cpu_adam"        ZeRO-Offload of the optimizer to the CPU, which runs DeepSpeedCPUAdam (a JIT-built
                        op, about 2 min to build once), whose state['step'] is a Python int;
      "bf16_optimizer"  data_types.grad_accum_dtype fp32: with bf16 and ZeRO stage 1 DeepSpeed then runs
                        its BF16_Optimizer instead of the ZeRO-1 optimizer (files of another layout);
      "frozen"          torch AdamW as "", with fc1 (weight and bias) frozen by init_deepspeed: parameters no
                        optimizer owns, saved in the module (ZeRO-1/2) and, from ZeRO-2 on, under
                        frozen_param_shapes / frozen_param_fragments (ZeRO-3: each rank's partition);
      "round_robin"     torch AdamW as "", with zero_optimization.round_robin_gradients (ZeRO-1/2): DeepSpeed
                        orders each group's parameters round robin over the DP ranks before flattening, so the
                        flat partitions hold them in another order than the model's."""
    assert variant in VARIANTS, variant
    cfg = {
        "train_batch_size": GLOBAL_BATCH,
        "train_micro_batch_size_per_gpu": GLOBAL_BATCH // dp,
        "gradient_accumulation_steps": 1,
        "gradient_clipping": 1.0,
        "steps_per_print": 1000,
        "optimizer": {
            "type": "AdamW",
            "params": {
                # per-group lr/weight_decay from param_groups() override these defaults
                "lr": 1e-3,
                "betas": [0.9, 0.95],
                "eps": 1e-8,
                "weight_decay": 0.01,
                # On the CPU accelerator the default "AdamW" path needs FusedAdam (a JIT-built op);
                # torch_adam selects torch.optim.AdamW, which stores state['step'] as a 0-d tensor.
                "torch_adam": True,
            },
        },
        "scheduler": {
            "type": "WarmupLR",
            # no warmup_max_lr -> each group warms up to its own lr
            "params": {"warmup_min_lr": 1e-5, "warmup_num_steps": 10, "warmup_type": "linear"},
        },
        "zero_optimization": {"stage": zero_stage, "reduce_bucket_size": REDUCE_BUCKET_ELEMENTS},
        "bf16": {"enabled": bool(bf16)},
        "fp16": {"enabled": False},
    }
    if load_universal:
        cfg["checkpoint"] = {"load_universal": True}
    if variant == "cpu_adam":
        cfg["optimizer"]["params"]["torch_adam"] = False
        cfg["zero_optimization"]["offload_optimizer"] = {"device": "cpu"}
    elif variant == "bf16_optimizer":
        cfg["data_types"] = {"grad_accum_dtype": "fp32"}
    elif variant == "round_robin":
        cfg["zero_optimization"]["round_robin_gradients"] = True
    return cfg


def global_batch(step):
    """The global batch of optimizer step `step` (0-based): tokens [GLOBAL_BATCH, SEQ] and targets."""
    g = torch.Generator().manual_seed(DATA_SEED + step)
    tokens = torch.randint(0, VOCAB, (GLOBAL_BATCH, SEQ), generator=g)
    targets = (tokens * 3 + 1) % VOCAB  # learnable mapping, so the loss goes down
    return tokens, targets


def local_batch(step, rank, dp):
    tokens, targets = global_batch(step)
    n = GLOBAL_BATCH // dp
    return tokens[rank * n:(rank + 1) * n], targets[rank * n:(rank + 1) * n]


def optimizer_step(base):
    """state['step'] of the first parameter (ZeRO-1/2: flat partition; ZeRO-3: sub-group) that has one."""
    for st in base.state.values():
        if "step" in st:
            return st["step"]
    return None


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def torchrun_cmd(nproc, script, argv):
    return [
        sys.executable, "-m", "torch.distributed.run", "--nnodes=1",
        f"--nproc_per_node={nproc}", f"--master_addr=127.0.0.1", f"--master_port={free_port()}", script
    ] + list(argv)


def cpu_env():
    env = dict(os.environ)
    env["DS_ACCELERATOR"] = "cpu"
    env.setdefault("OMP_NUM_THREADS", "1")
    env["PYTHONHASHSEED"] = "0"
    # The same floating-point results on every x86 machine: torch's own kernels, MKL and oneDNN each pick AVX-512
    # code where the CPU has it, and a training step then rounds differently from one on an AVX2 machine (the
    # committed goldens were recorded on one; on an AVX-512 machine 11 of them no longer matched a fresh recording
    # until these three were set).
    env.setdefault("ATEN_CPU_CAPABILITY", "avx2")
    env.setdefault("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    env.setdefault("ONEDNN_MAX_CPU_ISA", "AVX2")
    return env


def init_deepspeed(model, dp, zero_stage, bf16=False, load_universal=False, variant=""):
    import deepspeed
    if variant == "frozen":
        model.fc1.requires_grad_(False)
    deepspeed.init_distributed(dist_backend="gloo")
    engine, optimizer, _, scheduler = deepspeed.initialize(model=model,
                                                           model_parameters=param_groups(model),
                                                           config=ds_config(dp, zero_stage, bf16, load_universal, variant))
    return engine, optimizer, scheduler


def train_step(engine, step, dp):
    import torch.distributed as dist
    rank = dist.get_rank()
    tokens, targets = local_batch(step, rank, dp)
    loss = engine(tokens, targets)
    engine.backward(loss)
    engine.step()
    return global_mean(loss.detach())


def eval_loss(engine, step, dp):
    import torch.distributed as dist
    rank = dist.get_rank()
    tokens, targets = local_batch(step, rank, dp)
    with torch.no_grad():
        loss = engine(tokens, targets)
    return global_mean(loss.detach())


def global_mean(t):
    import torch.distributed as dist
    t = t.float().clone()
    dist.all_reduce(t)
    return (t / dist.get_world_size()).item()


# ----------------------------------------------------------------------------------------------
# make_tiny_checkpoint proper


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(HERE, "tiny"), help="output dir (default examples/tiny)")
    ap.add_argument("--zero-stage", type=int, default=1, choices=[1, 2, 3])
    ap.add_argument("--dp", type=int, default=2, help="number of CPU processes (data parallel degree)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bf16", action="store_true", help="bf16 model weights (default fp32)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def worker(args):
    import deepspeed
    import torch.distributed as dist
    torch.use_deterministic_algorithms(True)
    torch.set_num_threads(1)
    model = build_model()
    engine, optimizer, scheduler = init_deepspeed(model, args.dp, args.zero_stage, args.bf16)
    rank = dist.get_rank()
    if rank == 0:
        base = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
        print(f"[make] deepspeed {deepspeed.__version__} torch {torch.__version__}")
        print(f"[make] ZeRO wrapper: {type(engine.optimizer).__module__}.{type(engine.optimizer).__name__}")
        print(f"[make] base optimizer: {type(base).__module__}.{type(base).__name__}")
        print(f"[make] lr scheduler: {type(scheduler).__name__}")
    for step in range(args.steps):
        loss = train_step(engine, step, args.dp)
        if rank == 0:
            print(f"[make] step {step + 1}: loss {loss:.8f} lr {scheduler.get_last_lr()}")
    native = os.path.join(args.out, "native")
    engine.save_checkpoint(native)  # tag = global_step<N>
    if rank == 0:
        base = engine.optimizer.optimizer if hasattr(engine.optimizer, "optimizer") else engine.optimizer
        s = optimizer_step(base)
        print(f"[make] optimizer state['step'] is {type(s).__module__}.{type(s).__name__} {s!r}"
              f" dtype={getattr(s, 'dtype', None)} shape={tuple(getattr(s, 'shape', ()))}")
    # the loss of the next step's batch with the saved weights, for reference
    nxt = eval_loss(engine, args.steps, args.dp)
    if rank == 0:
        print(f"[make] eval loss on batch {args.steps} after save: {nxt:.8f}")
    dist.barrier()
    dist.destroy_process_group()


def to_universal(native, universal_parent, inject_missing_state, timeout=None):
    """DeepSpeed's own ds_to_universal of `native`'s latest tag into <universal_parent>/<tag>_universal
    (which also writes <universal_parent>/latest_universal), one worker each. Raises RuntimeError with
    the converter's output when it fails; returns the tag folder."""
    with open(os.path.join(native, "latest")) as f:
        tag = f.read().strip()
    universal = os.path.join(universal_parent, f"{tag}_universal")
    os.makedirs(universal_parent, exist_ok=True)
    cmd = [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder", os.path.join(native, tag),
           "--output_folder", universal, "--num_extract_workers", "1", "--num_merge_workers", "1"]
    if inject_missing_state:
        cmd.append("--inject_missing_state")
    done = subprocess.run(cmd, env=cpu_env(), capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0 or not os.path.isfile(os.path.join(universal_parent, "latest_universal")):
        raise RuntimeError(f"ds_to_universal failed (rc={done.returncode}): {' '.join(cmd)}\n"
                           f"--- stdout\n{done.stdout[-3000:]}\n--- stderr\n{done.stderr[-6000:]}")
    return universal


def finish_output(out, list_files=False):
    """Drops the recovery scripts DeepSpeed 0.19.8 copies next to every ZeRO checkpoint
    (zero_to_fp32.py, zero_to_torch.py: nothing loads them) and prints the total size of `out`."""
    total = 0
    for root, _, files in sorted(os.walk(out)):
        for fn in sorted(files):
            p = os.path.join(root, fn)
            if fn in ("zero_to_fp32.py", "zero_to_torch.py"):
                os.remove(p)
                continue
            total += os.path.getsize(p)
            if list_files:
                print(f"{os.path.getsize(p):8d}  {os.path.relpath(p, out)}")
    print(f"[make] total {total} bytes in {out}")


def main(argv=None):
    args = parse_args(argv)
    if args.worker:
        return worker(args)
    args.out = os.path.abspath(args.out)
    for sub in ("native", "universal"):
        shutil.rmtree(os.path.join(args.out, sub), ignore_errors=True)
    os.makedirs(args.out, exist_ok=True)
    env = cpu_env()
    fwd = ["--worker", "--out", args.out, "--zero-stage", str(args.zero_stage), "--dp", str(args.dp),
           "--steps", str(args.steps)] + (["--bf16"] if args.bf16 else [])
    subprocess.run(torchrun_cmd(args.dp, os.path.abspath(__file__), fwd), env=env, check=True)

    # A plain torch model does not write 'universal_checkpoint_info' into the model states, so the
    # converter needs --inject_missing_state (it injects {universal_checkpoint_version: ...} in
    # memory only; the copied mp_rank_* files are unchanged).
    to_universal(os.path.join(args.out, "native"), os.path.join(args.out, "universal"), inject_missing_state=True)
    finish_output(args.out, list_files=True)


if __name__ == "__main__":
    main()
