#!/usr/bin/env python3
"""Records DeepSpeed's reference runs that the default test tier reads (tests/integration/goldens.py GOLDENS) into
tests/goldens/<id>/ and tests/goldens/manifest.json: the pinned torch, DeepSpeed and transformers versions, the
sha256 of every checkpoint file each golden was made from, and of every file it holds.

    /opt/reshardfs/venv/bin/python tests/tools/record_goldens.py [--out DIR]

Run it after a bump of the pinned packages, a change of a committed checkpoint the goldens read, or a change of
the reference harness (tests/integration/ds_reference.py, ds_resume.py, llama_resume.py, the example scripts),
then commit tests/goldens. `scripts/test.sh --full` re-records into a temporary folder and requires the committed
files byte for byte. About 10 DeepSpeed launches: several minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))
os.environ.setdefault("DS_ACCELERATOR", "cpu")

from goldens import GOLDEN_BUDGET_BYTES, GOLDEN_ROOT, GOLDENS, read_manifest, record  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=GOLDEN_ROOT, help="where to write (default tests/goldens)")
    ap.add_argument("--only", action="append", metavar="ID", default=[],
                    help="re-record just this golden (repeatable); the others stay as the manifest has them")
    args = ap.parse_args()
    by_id = {ref.id: ref for ref in GOLDENS}
    unknown = sorted(set(args.only) - set(by_id))
    if unknown:
        ap.error(f"no golden {unknown}; goldens.GOLDENS has {sorted(by_id)}")
    refs = [by_id[i] for i in args.only] if args.only else GOLDENS
    args.out.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="reshardfs-goldens-") as work:
        manifest = record(refs, Path(work), args.out, log=lambda line: print(line, flush=True),
                          keep=read_manifest() if args.only else None)
    stale = {p.name for p in args.out.iterdir() if p.is_dir()} - set(manifest["goldens"])
    for name in sorted(stale):
        print(f"record: {args.out / name} is no golden any more; remove it", file=sys.stderr)
    size = sum(p.stat().st_size for p in args.out.rglob("*") if p.is_file())
    print(f"record: {len(manifest['goldens'])} goldens, {size / 1e6:.1f} MB, {time.monotonic() - start:.0f} s, "
          f"versions {manifest['versions']}")
    if size > GOLDEN_BUDGET_BYTES:
        print(f"record: over the {GOLDEN_BUDGET_BYTES >> 20} MiB budget", file=sys.stderr)
        return 1
    return 1 if stale else 0


if __name__ == "__main__":
    sys.exit(main())
