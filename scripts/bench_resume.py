"""End-to-end resume benchmark (issue 18): how long a new job waits before its first step.

A synthetic Llama universal checkpoint (tests/tools/make_synthetic_ucp, ~1 GB of fp32 states by default, the
checkpoint scripts/bench.sh reads) is resumed by DP CPU ranks (gloo) with bf16 weights at each ZeRO stage asked
for, three ways, in one run:

  mount      reshardfs mounts the universal checkpoint at the target layout; every rank calls
             engine.load_checkpoint(MOUNT) (DeepSpeed's native loader, load_universal off);
  universal  DeepSpeed's own loader of the same universal checkpoint (checkpoint.load_universal on);
  restore    reshardfs.restore(engine, UCP): the plan's executor fills the engine's buffers directly.
  copy       (only when asked for) engine.load_checkpoint(COPY), COPY being `reshardfs materialize` of the
             target (untimed): the target's native files on the same disk, the bound for any way that serves
             files to DeepSpeed's own loader (what is left is DeepSpeed's work after reading them).

Each way runs cold (page cache dropped after the engines are built, right before the load) and warm (the
checkpoint's files cached). Measured per way:
  load_s      from the start of the load call to its return on the slowest rank (the ranks start together
              after a barrier); for "mount" the mount itself is timed separately (mount_s) and added in total_s;
  step_s      the first training step after the load, slowest rank;
  disk_bytes  sectors read from the checkpoint's block device (/proc/diskstats) between the two barriers around
              the load, by anyone (the mount's server included), against the state bytes the ranks need (each
              fp32 master, exp_avg and exp_avg_sq element once; bf16 weights count as their fp32 source);
  rss         peak RSS of the largest rank (ru_maxrss) and, for "mount", of the server (VmHWM);
  digest      a hash of every rank's fp32 partition and Adam states after the load: equal digests mean the ways
              loaded the same state.
For "restore" it also logs each rank's load time and the part of it the executor's fill took (reading and
copying; the rest is planning, the small metadata files and the engine's own bookkeeping).
Not a test: it asserts nothing. It prints a markdown table, writes it to --out and a chart beside it (.png).
Needs root (drop_caches) and /dev/fuse, the build (scripts/build.sh; RESHARDFS_BUILD_DIR names another) and
the venv's Python (scripts/setup.sh). A cold row's disk bytes include the code pages of torch the ranks fault
back in after the drop (tens of MB).

  python scripts/bench_resume.py [--size-gb 1] [--dp 4] [--stages 1,3] [--ways mount,universal,restore[,copy]]
                                 [--caches cold,warm] [--out build/bench_resume.md] [--workdir DIR]
                                 [--restore-chunk-bytes N]
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import platform
import re
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("RESHARDFS_BUILD_DIR", REPO / "build"))  # scripts/build.sh's release build
WAYS = ("mount", "universal", "restore")  # the default; "copy" runs only when --ways names it
ALL_WAYS = (*WAYS, "copy")
HEADS = 8  # attention heads of the model built for the checkpoint (MHA: key/value heads the same)
TOKENS = 32  # sequence length of the first training step's batch, one sequence per rank


# ---- the ranks ------------------------------------------------------------------------------------------------


def _drop_caches() -> None:
    os.sync()
    Path("/proc/sys/vm/drop_caches").write_text("3\n")


def _sectors_read(device: str) -> int:
    for line in Path("/proc/diskstats").read_text().splitlines():
        fields = line.split()
        if fields[2] == device:
            return int(fields[5])
    raise RuntimeError(f"no {device} in /proc/diskstats")


def _digest(engine) -> str:
    """sha256 over this rank's fp32 partitions and their Adam states, in group order."""
    import torch
    opt = engine.optimizer
    flats = opt.fp32_partitioned_groups_flat if engine.zero_optimization_stage() == 3 else \
        opt.single_partition_of_fp32_groups
    h = hashlib.sha256()
    for flat in flats:
        h.update(flat.detach().contiguous().view(torch.uint8).numpy().tobytes())
        state = opt.optimizer.state.get(flat, {})  # empty before the first step or load at ZeRO-3
        for key in ("exp_avg", "exp_avg_sq"):
            if key in state:
                h.update(state[key].detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()[:16]


def _train_step(engine, config, rank: int) -> None:
    import torch
    tokens = torch.randint(0, config.vocab_size, (1, TOKENS), generator=torch.Generator().manual_seed(rank))
    loss = engine(input_ids=tokens, labels=tokens).loss
    engine.backward(loss)
    engine.step()


def worker(args: argparse.Namespace) -> None:
    import deepspeed
    import torch
    import torch.distributed as dist
    import transformers

    torch.manual_seed(0)
    config = transformers.LlamaConfig(**json.loads(Path(args.model_config).read_text()))
    model = transformers.LlamaForCausalLM(config)
    ds_config = {
        "train_micro_batch_size_per_gpu": 1,
        "gradient_accumulation_steps": 1,
        "steps_per_print": 1 << 30,
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.1, "torch_adam": True}},
        "zero_optimization": {"stage": args.zero_stage},
        "bf16": {"enabled": True},
        "checkpoint": {"load_universal": args.way == "universal"},
    }
    deepspeed.init_distributed(dist_backend="gloo")
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=ds_config)
    rank = dist.get_rank()
    if args.way == "save":  # the ZeRO-3 source: one step, then DeepSpeed's own save
        _train_step(engine, config, rank)
        engine.save_checkpoint(args.checkpoint, tag="global_step1")
        dist.barrier()
        dist.destroy_process_group()
        return
    initial = _digest(engine)
    dist.barrier()
    if args.cold and rank == 0:
        _drop_caches()
    dist.barrier()
    sectors = _sectors_read(args.device) if rank == 0 else 0
    start = time.perf_counter()
    fill = {}
    if args.way == "restore":
        import reshardfs
        chunk = {"chunk_bytes": args.restore_chunk_bytes} if args.restore_chunk_bytes else {}
        fill = reshardfs.restore(engine, args.checkpoint, **chunk)["reshardfs_stats"]
    else:
        path, _ = engine.load_checkpoint(args.checkpoint)
        assert path is not None, f"load_checkpoint({args.checkpoint}) loaded nothing"
    load_s = time.perf_counter() - start
    dist.barrier()
    disk = (_sectors_read(args.device) - sectors) * 512 if rank == 0 else 0
    digest = _digest(engine)
    if digest == initial:
        raise RuntimeError(f"rank {rank}: the load left the fp32 partitions and Adam states as they were built")
    start = time.perf_counter()
    _train_step(engine, config, rank)
    step_s = time.perf_counter() - start
    record = {"load_s": load_s, "step_s": step_s, "disk_bytes": disk, "digest": digest,
              "max_rss_kib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, "global_steps": engine.global_steps,
              "fill": fill}
    Path(args.out, f"rank_{rank}.json").write_text(json.dumps(record))
    dist.barrier()
    dist.destroy_process_group()


# ---- the driver -----------------------------------------------------------------------------------------------


def log(message: str) -> None:
    print(f"bench_resume: {message}", file=sys.stderr, flush=True)


def block_device(path: Path) -> str:
    """The /proc/diskstats name of the device holding `path`."""
    dev = os.stat(path).st_dev
    return Path(f"/sys/dev/block/{os.major(dev)}:{os.minor(dev)}").resolve().name


def make_checkpoint(workdir: Path, size_gb: float) -> tuple[Path, dict]:
    """The synthetic universal checkpoint of scripts/bench.sh (reused when present) and its Llama config."""
    ucp = workdir / f"ucp-{size_gb:g}gb"
    shape_file = workdir / f"ucp-{size_gb:g}gb.txt"
    if not (ucp / "latest_universal").is_file() or not shape_file.is_file():
        log(f"writing a {size_gb:g} GB synthetic checkpoint to {ucp}")
        made = subprocess.run([str(BUILD / "tests/tools/make_synthetic_ucp"), str(ucp), "--size-gb", str(size_gb)],
                              check=True, capture_output=True, text=True).stdout.strip()
        shape_file.write_text(made + "\n")
    shape = dict((k, int(v)) for k, v in re.findall(r"(hidden|layers|vocab|intermediate) (\d+)", shape_file.read_text()))
    config = {"hidden_size": shape["hidden"], "intermediate_size": shape["intermediate"],
              "num_hidden_layers": shape["layers"], "vocab_size": shape["vocab"], "num_attention_heads": HEADS,
              "num_key_value_heads": HEADS, "tie_word_embeddings": False, "max_position_embeddings": 2 * TOKENS}
    return ucp, config


def make_zero3_checkpoint(args, workdir: Path, model_config: Path) -> Path:
    """A universal checkpoint of a ZeRO-3 source, for the ZeRO-3 rows (reused when present): DeepSpeed 0.19.8's
    ZeRO-3 universal loader reads the zero_pp_rank model-states files only a ZeRO-3 source has, so it cannot load
    the synthetic ZeRO-1 checkpoint. The same model, bf16, saved by DeepSpeed at ZeRO-3 on 2 ranks after one step
    and converted by its ds_to_universal."""
    ucp = workdir / f"ucp-zero3-{args.size_gb:g}gb"
    if (ucp / "latest_universal").is_file():
        return ucp
    native = workdir / f"native-zero3-{args.size_gb:g}gb"
    shutil.rmtree(native, ignore_errors=True)
    shutil.rmtree(ucp, ignore_errors=True)
    log(f"saving a ZeRO-3 checkpoint with DeepSpeed to {native}")
    launch(args, "save", 3, False, native, model_config, "", workdir / "save-zero3", nproc=2)
    shutil.rmtree(workdir / "save-zero3", ignore_errors=True)
    log(f"converting it with ds_to_universal to {ucp}")
    done = subprocess.run([sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
                           str(native / "global_step1"), "--output_folder", str(ucp / "global_step1_universal"),
                           "--num_extract_workers", "1", "--num_merge_workers", "1"],
                          capture_output=True, text=True, check=False)
    if done.returncode != 0 or not (ucp / "latest_universal").is_file():
        raise RuntimeError(f"ds_to_universal failed:\n{done.stderr[-4000:]}")
    shutil.rmtree(native)
    return ucp


def state_bytes(ucp: Path) -> int:
    """What the ranks need from disk: every fp32 master, exp_avg and exp_avg_sq tensor once (file sizes less
    their few hundred bytes of zip and pickle are the tensor bytes; counted as whole files)."""
    return sum(p.stat().st_size for p in ucp.glob("*/zero/*/*.pt") if p.name != "step.pt")


def launch(args, way: str, stage: int, cold: bool, checkpoint: Path, model_config: Path, device: str,
           out: Path, nproc: int = 0) -> list[dict]:
    nproc = nproc or args.dp
    out.mkdir(parents=True)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=str(BUILD / "python"))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc), "--master-port",
           str(args.port), __file__, "--worker", "--way", way, "--zero-stage", str(stage), "--checkpoint",
           str(checkpoint), "--model-config", str(model_config), "--device", device, "--out", str(out)]
    if cold:
        cmd.append("--cold")
    if args.restore_chunk_bytes:
        cmd += ["--restore-chunk-bytes", str(args.restore_chunk_bytes)]
    with open(out / "ranks.log", "w") as log_file:
        result = subprocess.run(cmd, env=env, stdout=log_file, stderr=subprocess.STDOUT, timeout=1800, check=False)
    if result.returncode != 0:
        raise RankFailure((out / "ranks.log").read_text())
    return [json.loads((out / f"rank_{r}.json").read_text()) for r in range(nproc)] if way != "save" else []


class RankFailure(RuntimeError):
    """A way that failed in the ranks; its row says why (the last exception line of the ranks' log)."""

    def __init__(self, log_text: str) -> None:
        errors = [l.split("]:", 1)[-1].strip() for l in log_text.splitlines() if re.search(r"(Error|Exception)\b", l)]
        super().__init__(errors[-1] if errors else log_text[-500:])
        self.log_text = log_text


def mount(ucp: Path, mnt: Path, dp: int, stage: int, cold: bool) -> tuple[subprocess.Popen, float]:
    if cold:
        _drop_caches()
    mnt.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    server = subprocess.Popen([str(BUILD / "fs/reshardfs"), "--log-level", "warn", "mount", "-f", str(ucp),
                               str(mnt), "--dp", str(dp), "--zero-stage", str(stage), "--lp-dtype", "bf16"])
    while not os.path.ismount(mnt):
        if server.poll() is not None:
            raise RuntimeError(f"reshardfs mount exited with {server.returncode}")
        time.sleep(0.002)
    return server, time.perf_counter() - start


def materialize(ucp: Path, out: Path, dp: int, stage: int) -> None:
    """The target's native files, as a mount would serve them, written to `out` (the "copy" way)."""
    subprocess.run([str(BUILD / "fs/reshardfs"), "--log-level", "warn", "materialize", "--quiet", str(ucp), str(out),
                    "--dp", str(dp), "--zero-stage", str(stage), "--lp-dtype", "bf16"], check=True,
                   stdout=subprocess.DEVNULL)
    os.sync()


def unmount(server: subprocess.Popen, mnt: Path) -> int:
    """Unmounts; returns the server's peak RSS in KiB."""
    hwm = 0
    for line in Path(f"/proc/{server.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            hwm = int(line.split()[1])
    subprocess.run(["fusermount3", "-u", str(mnt)], check=True)
    server.wait(timeout=60)
    return hwm


def run(args: argparse.Namespace) -> None:
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    synthetic, config = make_checkpoint(workdir, args.size_gb)
    model_config = workdir / "bench_resume_config.json"
    model_config.write_text(json.dumps(config))
    sources = {stage: make_zero3_checkpoint(args, workdir, model_config) if stage == 3 else synthetic
               for stage in args.stages}
    device = block_device(synthetic)
    scratch = Path(tempfile.mkdtemp(prefix="bench_resume_", dir=workdir))
    rows = []
    try:
        for stage in args.stages:
            ucp = sources[stage]
            for way in args.ways:
                for cache in args.caches:
                    cold = cache == "cold"
                    log(f"ZeRO-{stage} {way} {cache}")
                    server, mount_s, server_kib = None, 0.0, 0
                    if way == "mount":
                        checkpoint = scratch / "mnt"
                        server, mount_s = mount(ucp, checkpoint, args.dp, stage, cold)
                    elif way == "copy":
                        checkpoint = scratch / f"copy-zero{stage}"
                        if not checkpoint.exists():
                            materialize(ucp, checkpoint, args.dp, stage)
                    else:
                        checkpoint = ucp
                    if not cold:  # warm: read every file the ranks will read once first
                        for p in (checkpoint if way == "copy" else ucp).rglob("*.pt"):
                            with open(p, "rb") as f:
                                while f.read(8 << 20):
                                    pass
                    try:
                        ranks = launch(args, way, stage, cold, checkpoint, model_config, device,
                                       scratch / f"z{stage}_{way}_{cache}")
                    except RankFailure as failure:
                        rows.append({"stage": stage, "way": way, "cache": cache, "failed": str(failure),
                                     "need": state_bytes(ucp)})
                        log(f"failed: {failure}")
                        continue
                    finally:
                        if server is not None:
                            server_kib = unmount(server, checkpoint)
                    load_s = max(r["load_s"] for r in ranks)
                    if way == "restore":
                        log("per rank: load s " + " ".join(f"{r['load_s']:.2f}" for r in ranks) + ", of which the "
                            "executor's fill s " + " ".join(f"{r['fill']['seconds']:.2f}" for r in ranks))
                    rows.append({
                        "stage": stage, "way": way, "cache": cache, "mount_s": mount_s, "load_s": load_s,
                        "total_s": mount_s + load_s, "step_s": max(r["step_s"] for r in ranks),
                        "disk_bytes": ranks[0]["disk_bytes"], "rank_rss_mib": max(r["max_rss_kib"] for r in ranks) / 1024,
                        "server_rss_mib": server_kib / 1024, "digest": ",".join(r["digest"] for r in ranks),
                        "need": state_bytes(ucp),
                    })
                    log(json.dumps(rows[-1]))
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    report(args, rows, config)


def report(args, rows: list[dict], config: dict) -> None:
    cpu = next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines()
                if l.startswith("model name")), platform.processor())
    lines = [f"Resume benchmark, {datetime.date.today()}: {os.cpu_count()} cores ({cpu}), "
             f"{os.sysconf('SC_PAGE_SIZE') * os.sysconf('SC_PHYS_PAGES') / 2**30:.0f} GiB; `python "
             f"scripts/bench_resume.py --size-gb {args.size_gb:g} --dp {args.dp}`.",
             f"Model: Llama, hidden {config['hidden_size']}, {config['num_hidden_layers']} layers, vocab "
             f"{config['vocab_size']}. ZeRO-1 rows: the synthetic universal checkpoint of scripts/bench.sh (a ZeRO-1 "
             f"source); ZeRO-3 rows: the same model saved by DeepSpeed at ZeRO-3 and converted by ds_to_universal. "
             f"Need: the fp32 state bytes of the checkpoint (master, exp_avg, exp_avg_sq). Target: {args.dp} CPU "
             f"ranks (gloo), bf16 weights.", "",
             "| ZeRO | way | cache | mount s | load s | mount + load s | vs universal | first step s | disk GB "
             "(x need) | rank peak RSS MiB | server peak RSS MiB | state digest |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    base = {(r["stage"], r["cache"]): r["total_s"] for r in rows if r["way"] == "universal" and "failed" not in r}
    digests = {}
    for r in rows:
        if "failed" in r:
            lines.append(f"| {r['stage']} | {r['way']} | {r['cache']} | fails: {r['failed'][:160]} |||||||||")
            continue
        need = r["need"]
        digests.setdefault(r["stage"], {}).setdefault(r["digest"], len(digests.get(r["stage"], {})))
        ref = base.get((r["stage"], r["cache"]))
        speedup = f"{ref / r['total_s']:.1f}x" if ref else "-"
        lines.append(f"| {r['stage']} | {r['way']} | {r['cache']} | {r['mount_s']:.2f} | {r['load_s']:.2f} | "
                     f"{r['total_s']:.2f} | {speedup} | {r['step_s']:.2f} | {r['disk_bytes'] / 1e9:.2f} "
                     f"({r['disk_bytes'] / need:.2f}) | {r['rank_rss_mib']:.0f} | "
                     f"{r['server_rss_mib']:.0f} | {'ABCDEFGH'[digests[r['stage']][r['digest']]]} |")
    lines += ["", "vs universal: DeepSpeed's load_universal's mount + load time over this way's, same stage and cache. "
              "State digest: ways with the same letter (per stage) loaded bit-identical fp32 partitions and Adam "
              "states on every rank. Disk GB is read from the block device during the load only (cold rows)."]
    text = "\n".join(lines) + "\n"
    print(text)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    chart(rows, out.with_suffix(".png"))


def chart(rows: list[dict], path: Path) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows = [r for r in rows if "failed" not in r]
    groups = sorted({(r["stage"], r["cache"]) for r in rows})
    fig, ax = plt.subplots(figsize=(8, 4))
    ways = [w for w in ALL_WAYS if any(r["way"] == w for r in rows)]
    width = 0.8 / max(len(ways), 1)
    for k, way in enumerate(ways):
        values = [next((r["total_s"] for r in rows if (r["stage"], r["cache"], r["way"]) == (*g, way)), 0) for g in groups]
        ax.bar([i + k * width for i in range(len(groups))], values, width, label=way)
    ax.set_xticks([i + width for i in range(len(groups))], [f"ZeRO-{s} {c}" for s, c in groups])
    ax.set_ylabel("seconds to a loaded engine (mount + load)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--way", choices=(*ALL_WAYS, "save"))
    ap.add_argument("--zero-stage", type=int)
    ap.add_argument("--checkpoint")
    ap.add_argument("--model-config")
    ap.add_argument("--device")
    ap.add_argument("--cold", action="store_true")
    ap.add_argument("--out", default=str(REPO / "build/bench_resume.md"))
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--stages", type=lambda s: [int(x) for x in s.split(",")], default=[1, 3])
    ap.add_argument("--ways", type=lambda s: s.split(","), default=list(WAYS))
    ap.add_argument("--caches", type=lambda s: s.split(","), default=["cold", "warm"])
    ap.add_argument("--workdir", default="/var/tmp/reshardfs-bench")
    ap.add_argument("--port", type=int, default=29561)
    ap.add_argument("--restore-chunk-bytes", type=int, help="reshardfs.restore's chunk_bytes (default: its own)")
    args = ap.parse_args()
    if not args.worker and not set(args.ways) <= set(ALL_WAYS):
        ap.error(f"--ways: each of {', '.join(ALL_WAYS)}, not {','.join(args.ways)}")
    if args.worker:
        worker(args)
    else:
        run(args)


if __name__ == "__main__":
    main()
