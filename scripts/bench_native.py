"""Native-source benchmark (issue 15): what mounting a native DeepSpeed checkpoint saves over converting it.

The synthetic Llama model of scripts/bench_resume.py (~1 GB of fp32 states by default) is trained one step and
saved natively by real DeepSpeed on 2 CPU ranks (bf16 weights), at each ZeRO stage asked for (kept in the workdir
and reused). Then, with the checkpoint's files in the page cache, in one run per stage:

  convert      python -m deepspeed.checkpoint.ds_to_universal --inject_missing_state (a plain run records no
               universal_checkpoint_info; its default workers): wall time, peak RSS of its
               largest process (GNU time's %M), bytes written;
  mount        reshardfs mount of the native folder: time until mounted, the server's peak RSS (VmHWM) after
               everything below was read through it;
  zero_to_fp32 python -m deepspeed.utils.zero_to_fp32 --safe_serialization (DeepSpeed's consolidation) against
               copying MOUNT/<tag>/model.safetensors to the same disk;
  reads        every file of a DP 4 target (its <tag>/ folder, safetensors views excluded) read once, 8 MiB at a
               time, from a mount of the native folder and from a mount of ds_to_universal's output: GB/s.

Not a test: it asserts nothing. Prints a markdown table and writes it to --out. Needs root and /dev/fuse, the
build (scripts/build.sh; RESHARDFS_BUILD_DIR names another) and the venv's Python (scripts/setup.sh).

  python scripts/bench_native.py [--size-gb 1] [--stages 1,3] [--out build/bench_native.md] [--workdir DIR]
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_resume  # noqa: E402  (the model, the save launch, mount and unmount)

BUILD = bench_resume.BUILD
CHUNK = 8 << 20


def log(message: str) -> None:
    print(f"bench_native: {message}", file=sys.stderr, flush=True)


def tree_bytes(root: Path) -> int:
    return sum(p.stat().st_size for p in root.rglob("*") if p.is_file())


def warm(root: Path) -> None:
    for p in root.rglob("*"):
        if p.is_file():
            with open(p, "rb") as f:
                while f.read(CHUNK):
                    pass


def timed(cmd: list[str]) -> tuple[float, int]:
    """Runs cmd under GNU time; returns (wall seconds, peak RSS of its largest process in KiB)."""
    with tempfile.NamedTemporaryFile("r") as stats:
        start = time.perf_counter()
        done = subprocess.run(["/usr/bin/time", "-f", "%M", "-o", stats.name, *cmd], capture_output=True, text=True,
                              check=False)
        wall = time.perf_counter() - start
        if done.returncode != 0:
            raise RuntimeError(f"{' '.join(cmd)} failed:\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        return wall, int(stats.read().split()[-1])


def read_all(root: Path) -> tuple[int, float]:
    files = sorted(p for p in root.rglob("*") if p.is_file() and "safetensors" not in p.parts)
    total, start = 0, time.perf_counter()
    for p in files:
        with open(p, "rb", buffering=0) as f:
            while chunk := f.read(CHUNK):
                total += len(chunk)
    return total, time.perf_counter() - start


def mount(source: Path, mnt: Path, extra: list[str]) -> tuple[subprocess.Popen, float]:
    mnt.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    server = subprocess.Popen([str(BUILD / "fs/reshardfs"), "--log-level", "warn", "mount", "-f", str(source),
                               str(mnt), *extra])
    while not os.path.ismount(mnt):
        if server.poll() is not None:
            raise RuntimeError(f"reshardfs mount exited with {server.returncode}")
        time.sleep(0.002)
    return server, time.perf_counter() - start


def native_checkpoint(args, workdir: Path, stage: int, model_config: Path) -> Path:
    native = workdir / f"native-z{stage}-{args.size_gb:g}gb"
    if (native / "latest").is_file():
        return native
    shutil.rmtree(native, ignore_errors=True)
    log(f"saving a ZeRO-{stage} checkpoint with DeepSpeed to {native}")
    bench_resume.launch(args, "save", stage, False, native, model_config, "", workdir / f"save-z{stage}", nproc=2)
    shutil.rmtree(workdir / f"save-z{stage}", ignore_errors=True)
    return native


def bench_stage(args, workdir: Path, stage: int, native: Path) -> dict:
    row: dict = {"stage": stage, "native_bytes": tree_bytes(native / "global_step1")}
    scratch = Path(tempfile.mkdtemp(prefix="bench_native_", dir=workdir))
    target = ["--dp", "4", "--zero-stage", str(stage), "--lp-dtype", "bf16"]
    try:
        warm(native)
        converted = scratch / "universal"
        log(f"ZeRO-{stage}: ds_to_universal")
        row["convert_s"], row["convert_kib"] = timed(
            [sys.executable, "-m", "deepspeed.checkpoint.ds_to_universal", "--input_folder",
             str(native / "global_step1"), "--output_folder", str(converted / "global_step1_universal"),
             "--inject_missing_state"])
        row["convert_bytes"] = tree_bytes(converted)

        log(f"ZeRO-{stage}: zero_to_fp32")
        row["z2f_s"], row["z2f_kib"] = timed([sys.executable, "-m", "deepspeed.utils.zero_to_fp32", str(native),
                                             str(scratch / "z2f"), "--safe_serialization"])
        row["z2f_bytes"] = tree_bytes(scratch / "z2f")
        shutil.rmtree(scratch / "z2f")

        log(f"ZeRO-{stage}: mount of the native folder")
        server, row["mount_s"] = mount(native, scratch / "mnt", target)
        try:
            start = time.perf_counter()
            shutil.copyfile(scratch / "mnt" / "global_step1" / "model.safetensors", scratch / "model.safetensors")
            os.sync()
            row["weights_s"] = time.perf_counter() - start
            row["weights_bytes"] = (scratch / "model.safetensors").stat().st_size
            (scratch / "model.safetensors").unlink()
            row["native_read_bytes"], row["native_read_s"] = read_all(scratch / "mnt" / "global_step1")
        finally:
            row["mount_kib"] = bench_resume.unmount(server, scratch / "mnt")

        log(f"ZeRO-{stage}: mount of the converted folder")
        warm(converted)
        server, row["universal_mount_s"] = mount(converted, scratch / "mnt", target)
        try:
            row["universal_read_bytes"], row["universal_read_s"] = read_all(scratch / "mnt" / "global_step1")
        finally:
            row["universal_mount_kib"] = bench_resume.unmount(server, scratch / "mnt")
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return row


def report(rows: list[dict], out: Path) -> None:
    gb = 1e9
    lines = [f"Native-source benchmark, {datetime.date.today()}, {platform.node()} ({os.cpu_count()} cores), "
             "files in the page cache. Times in s, RSS in MiB.", "",
             "| ZeRO | checkpoint GB | ds_to_universal s | its RSS | reshardfs mount s | server RSS | mount / convert "
             "| zero_to_fp32 s | its RSS | copy model.safetensors s | target read GB/s: native | universal | ratio |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        native_rate = r["native_read_bytes"] / r["native_read_s"] / gb
        universal_rate = r["universal_read_bytes"] / r["universal_read_s"] / gb
        lines.append(
            f"| {r['stage']} | {r['native_bytes'] / gb:.2f} | {r['convert_s']:.1f} | {r['convert_kib'] / 1024:.0f} "
            f"| {r['mount_s']:.3f} | {r['mount_kib'] / 1024:.0f} | {r['mount_s'] / r['convert_s']:.2%} "
            f"| {r['z2f_s']:.1f} | {r['z2f_kib'] / 1024:.0f} | {r['weights_s']:.2f} "
            f"| {native_rate:.2f} | {universal_rate:.2f} | {native_rate / universal_rate:.2f} |")
    text = "\n".join(lines) + "\n"
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text)
    out.with_suffix(".json").write_text(json.dumps(rows, indent=1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size-gb", type=float, default=1.0)
    ap.add_argument("--stages", default="1,3")
    ap.add_argument("--workdir", default="/var/tmp/reshardfs-bench")
    ap.add_argument("--out", default=str(bench_resume.REPO / "build" / "bench_native.md"))
    ap.add_argument("--port", type=int, default=29517)
    args = ap.parse_args()
    args.dp = 2
    workdir = Path(args.workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    _, config = bench_resume.make_checkpoint(workdir, args.size_gb)
    model_config = workdir / "bench_resume_config.json"
    model_config.write_text(json.dumps(config))
    rows = []
    for stage in (int(s) for s in args.stages.split(",")):
        native = native_checkpoint(args, workdir, stage, model_config)
        rows.append(bench_stage(args, workdir, stage, native))
    report(rows, Path(args.out))


if __name__ == "__main__":
    main()
