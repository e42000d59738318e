"""reshardfs.restore's host backend against its ceiling (issue 18): the same source bytes moved out of the page cache.

For every rank of a target layout (TP 1 x DP --dp, ZeRO --stage, bf16 weights) of a synthetic Llama universal
checkpoint (tests/tools/make_synthetic_ucp, the checkpoint scripts/bench.sh reads; reused when present), one
process plans the rank (reshardfs._C.RankPlan, what reshardfs.restore runs) and fills buffers shaped like the
engine's (fp32 partitions, exp_avg, exp_avg_sq, and at ZeRO-1/2 the bf16 weights) three ways, in rounds:

  host      RankPlan.fill(backend="host"): the chunks pread into staging, then memcpy / fp32 -> bf16 into the
            buffers (what restore does on CPU);
  discard   RankPlan.fill(backend="discard"): the same chunks pread into the same staging buffers on the same
            lanes, and nothing copied further (the staging buffers are reused, so they stay in the CPU caches);
  memcpy    the plain memcpy of the same bytes out of the page cache: every chunk an 8 MiB fill reads
            (RankPlan.chunks; 8 MiB or --chunk-bytes if larger, so that Python's per-read cost stays out of it)
            pread straight into its own place in one buffer of their total size, on as many threads as fill() has
            lanes. This is the ceiling: the kernel's copy of each source byte, once, into memory of the
            destinations' size, with no staging and no conversion.

Everything is warm: a first fill of each rank brings its files into the page cache, and every buffer is touched
before any timing. GB/s = source bytes read / seconds (1 GB = 1e9 B), best of --rounds; host / memcpy is the ratio
of their GB/s (the aim of issue 18: at least 0.8). Not a test: it asserts nothing. Prints a markdown table and
writes it to --out.

  python scripts/bench_restore.py [--size-gb 1] [--dp 4] [--stage 1] [--lanes 4] [--chunk-bytes 8388608]
                                  [--rounds 5] [--out build/bench_restore.md] [--workdir /var/tmp/reshardfs-bench]
"""

from __future__ import annotations

import argparse
import concurrent.futures
import datetime
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
BUILD = Path(os.environ.get("RESHARDFS_BUILD_DIR", REPO / "build"))  # scripts/build.sh's release build


def checkpoint(workdir: Path, size_gb: float) -> Path:
    """The synthetic universal checkpoint bench.sh and bench_resume.py use (same folder name), made if missing."""
    ucp = workdir / f"ucp-{size_gb:g}gb"
    if not (ucp / "latest_universal").is_file():
        print(f"writing a {size_gb:g} GB synthetic checkpoint to {ucp}", file=sys.stderr)
        made = subprocess.run([str(BUILD / "tests/tools/make_synthetic_ucp"), str(ucp), "--size-gb", str(size_gb)],
                              check=True, capture_output=True, text=True).stdout.strip()
        (workdir / f"ucp-{size_gb:g}gb.txt").write_text(made + "\n")
    return ucp


def buffers(plan, torch) -> tuple[list[tuple], list]:
    """Touched buffers for every storage of the rank's plan, as RankPlan.fill takes them, and the tensors."""
    out, keep = [], []
    for i, flat in enumerate(plan.flats):
        for kind in ("fp32", "exp_avg", "exp_avg_sq"):
            t = torch.ones(flat["numel"], dtype=torch.float32)
            out.append((kind, i, t.data_ptr(), t.numel() * 4))
            keep.append(t)
    for i, lp in enumerate(plan.lp_params):
        t = torch.ones(lp["numel"], dtype=torch.bfloat16)
        out.append(("lp", i, t.data_ptr(), t.numel() * 2))
        keep.append(t)
    return out, keep


def run(args: argparse.Namespace) -> None:
    sys.path.insert(0, str(BUILD / "python"))
    import torch
    from reshardfs import _C

    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    ucp = checkpoint(workdir, args.size_gb)
    config = json.dumps({"train_micro_batch_size_per_gpu": 1, "bf16": {"enabled": True},
                         "zero_optimization": {"stage": args.stage}})
    rows = []
    pool = concurrent.futures.ThreadPoolExecutor(args.lanes)
    for rank in range(args.dp):
        plan = _C.RankPlan(str(ucp), config, 1, args.dp, 0, rank, "")
        bufs, keep = buffers(plan, torch)
        # The first fill brings the rank's files into the page cache.
        first = plan.fill(bufs, backend="host", lanes=args.lanes, chunk_bytes=args.chunk_bytes)
        chunks = plan.chunks(bufs, lanes=args.lanes, chunk_bytes=max(args.chunk_bytes, 8 << 20))
        if any(computed for *_, computed in chunks):
            raise RuntimeError("the plan reads computed sources: the memcpy ceiling covers files only")
        ceiling_read = sum(length for _, _, length, _ in chunks)
        place = memoryview(torch.ones(ceiling_read, dtype=torch.uint8).numpy())
        fds = {path: os.open(path, os.O_RDONLY) for path in {c[0] for c in chunks}}
        jobs, at = [], 0
        for path, offset, length, _ in chunks:
            jobs.append((fds[path], place[at:at + length], offset))
            at += length

        def memcpy() -> float:
            start = time.perf_counter()
            for (_, view, offset), n in zip(jobs, pool.map(lambda job: os.preadv(job[0], [job[1]], job[2]), jobs)):
                if n != len(view):
                    raise OSError(f"short read: {n} of {len(view)} bytes at byte {offset}")
            return time.perf_counter() - start

        best = {"host": float("inf"), "discard": float("inf"), "memcpy": float("inf")}
        for _ in range(args.rounds):
            for way in ("host", "discard"):
                filled = plan.fill(bufs, backend=way, lanes=args.lanes, chunk_bytes=args.chunk_bytes)
                best[way] = min(best[way], filled["seconds"])
            best["memcpy"] = min(best["memcpy"], memcpy())
        rows.append({"rank": rank, "read": first["bytes_read"], "ceiling_read": ceiling_read,
                     "copied": first["bytes_copied"], "chunks": first["chunks"], **best})
        for fd in fds.values():
            os.close(fd)
        del keep, place, jobs
    report(args, ucp, rows)


def report(args: argparse.Namespace, ucp: Path, rows: list[dict]) -> None:
    load = os.getloadavg()[0]
    lines = [f"Measured {datetime.datetime.now(datetime.timezone.utc).isoformat(timespec='seconds')} "
             f"(`python scripts/bench_restore.py --size-gb {args.size_gb:g} --dp {args.dp} --stage {args.stage} "
             f"--lanes {args.lanes} --rounds {args.rounds} --chunk-bytes {args.chunk_bytes}`)",
             "",
             f"- machine: {os.cpu_count()} CPUs, kernel {platform.release()}; 1-min load average {load:.2f} at the end",
             f"- checkpoint: {ucp.name} (synthetic Llama UCP); target TP 1 x DP {args.dp}, ZeRO-{args.stage}, bf16 "
             f"weights; {args.lanes} lanes, {args.chunk_bytes / 2**20:g} MiB chunks; source in the page cache; "
             f"best of {args.rounds} rounds",
             "",
             "| rank | chunks | source bytes read | bytes copied | host fill | discard | memcpy from the page cache "
             "| host / memcpy |",
             "|---|---|---|---|---|---|---|---|"]
    ways = ("host", "discard", "memcpy")
    keys = ("read", "ceiling_read", "copied", "chunks", *ways)
    for r in rows + [{"rank": "all", **{k: sum(x[k] for x in rows) for k in keys}}]:
        gbs = {w: (r["ceiling_read"] if w == "memcpy" else r["read"]) / r[w] / 1e9 for w in ways}
        cells = [f"{r[w]:.3f} s, {gbs[w]:.2f} GB/s" for w in ways]
        lines.append(f"| {r['rank']} | {r['chunks']} | {r['read'] / 1e6:.1f} MB | {r['copied'] / 1e6:.1f} MB | "
                     + " | ".join(cells) + f" | {gbs['host'] / gbs['memcpy']:.2f} |")
    text = "\n".join(lines) + "\n"
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(text)
    print(text)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--dp", type=int, default=4)
    ap.add_argument("--stage", type=int, choices=(1, 2, 3), default=1)
    ap.add_argument("--lanes", type=int, default=4)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--chunk-bytes", type=int, default=8 << 20, help="fill()'s chunk_bytes (default: restore's, 8 MiB)")
    ap.add_argument("--out", default=str(REPO / "build/bench_restore.md"))
    ap.add_argument("--workdir", default="/var/tmp/reshardfs-bench")
    run(ap.parse_args())


if __name__ == "__main__":
    main()
