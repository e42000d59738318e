"""DeepSpeed's reference runs, live or as committed goldens (the test tiers of scripts/test.sh).

A reference is what real DeepSpeed 0.19.8 produces for a case: its own load_universal of a universal checkpoint
at a target layout (snapshots of the live engine, its native re-save, the losses of the next steps), the same
with its ZeRO-3 defects undone, or a source checkpoint made by an example script. Tests ask References.get for
the folder holding a reference's files:

- full tier (`pytest --full`, `scripts/test.sh --full`): the reference is run live, once per session;
- default tier: it is read from tests/goldens/<id>/, recorded once by tests/tools/record_goldens.py. The
  manifest (tests/goldens/manifest.json) names the torch, DeepSpeed and transformers versions it was recorded
  with and the sha256 of every file it was made from and of every file it holds; a golden whose versions differ
  from the installed ones, whose sources changed, or whose files were altered fails the test that reads it.
  A reference without a golden fails too: record one, or mark the test `full`.

The full tier also re-records every golden into a temporary folder and requires the committed files byte for byte
(test_goldens.py), so goldens cannot go stale unnoticed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from ds_reference import EXAMPLES, LAUNCH_TIMEOUT_S, REFERENCE_TRAIN_STEPS, dump_target_states
from run_cache import RunCache

REPO = EXAMPLES.parent
GOLDEN_ROOT = REPO / "tests" / "goldens"
MANIFEST = GOLDEN_ROOT / "manifest.json"
PINNED_PACKAGES = ("torch", "deepspeed", "transformers")

TINY_UCP = EXAMPLES / "tiny" / "universal"
ZERO3_UCP = REPO / "tests" / "fixtures" / "tiny_zero3" / "universal"
LLAMA_EXAMPLE = EXAMPLES / "tiny_llama_tp2"

# Llama-family sources (examples/make_tiny_llama_checkpoint.py runs): id -> (TP, DP, ZeRO stage, --model).
# tp2_zero1 is committed as examples/tiny_llama_tp2; the others are made by the script when needed.
LLAMA_SOURCES = {"tp2_zero1": (2, 1, 1, "llama"), "tp1_zero1": (1, 2, 1, "llama"), "tp2_zero3": (2, 1, 3, "llama"),
                 "tp1_zero3": (1, 2, 3, "llama"), "qwen2_tied_tp1_zero1": (1, 1, 1, "qwen2_tied"),
                 "phi3_tp2_zero1": (2, 1, 1, "phi3"), "llama_frozen_tp1_zero1": (1, 1, 1, "llama_frozen")}  # fmt: skip
LLAMA_SOURCE_STEPS = 3
GOLDEN_BUDGET_BYTES = 20 << 20  # all goldens together, in the repository

# Reference kinds: the key each takes, and the files of a run kept as its golden (globs, relative to the run).
RUN_FILES = ("rank_*.pt", "after_rank_*.pt", "losses_rank_*.json")
KINDS = {
    # ds_reference.dump_target_states with REFERENCE_TRAIN_STEPS: (ucp, stage, dp, bf16, variant)
    "load_universal": RUN_FILES + ("native_resaved/latest", "native_resaved/*/*.pt"),
    # ds_resume.universal_corrected: (ucp, stage, dp, bf16)
    "universal_corrected": RUN_FILES,
    # llama_resume.resume("universal", ...): (source id, tp, dp, stage, precision)
    "llama_universal": RUN_FILES,
    # make_tiny_llama_checkpoint.py: (source id,)
    "llama_source": ("universal/**/*", "config.json", "reference_losses.json"),
    # examples/hf_trainer_resume.py make_source: () -- the Trainer's checkpoint-3 with its universal conversion and
    # the Trainer's own files, less the native DeepSpeed folder (nothing here reads it) and training_args.bin (it
    # pickles the run's absolute output path, so no two recordings are equal; the Trainer does not read it back)
    "hf_trainer_source": ("checkpoint-3/global_step3_universal/**/*", "checkpoint-3/latest_universal",
                          "checkpoint-3/*.json", "checkpoint-3/*.pth", "checkpoint-3/scheduler.pt",
                          "checkpoint-3/model.safetensors"),
    # examples/hf_trainer_resume.py resume("resume_load_universal", ...): ()
    "hf_trainer_universal": ("result.json", "state_rank*.pt", "rng_messages_rank*.json"),
}
HF_TRAINER_SCRIPT = EXAMPLES / "hf_trainer_resume.py"


def _relative(path: Path) -> str:
    return str(Path(path).resolve().relative_to(REPO))


@dataclass(frozen=True)
class Reference:
    kind: str
    key: tuple

    def __post_init__(self) -> None:
        assert self.kind in KINDS, self.kind

    @property
    def id(self) -> str:
        """The golden's folder name, e.g. load_universal-tiny-z1-dp4-fp32 (a committed checkpoint by its folder)."""
        if not self.key:
            return self.kind
        if self.kind == "llama_source":
            return f"{self.kind}-{self.key[0]}"
        if self.kind == "llama_universal":
            source, tp, dp, stage, precision = self.key
            return f"{self.kind}-{source}-tp{tp}-dp{dp}-z{stage}-{precision}"
        ucp, stage, dp, bf16, *variant = self.key
        return "-".join([self.kind, Path(ucp).parent.name, f"z{stage}", f"dp{dp}", "bf16" if bf16 else "fp32",
                         *[v for v in variant if v]])

    def source_files(self) -> list[Path]:
        """The checkpoint files this reference is made from (their sha256 goes into the manifest)."""
        if self.kind in ("llama_source", "hf_trainer_source"):
            return []  # made by the example script alone; the full tier's re-record pins its output
        if self.kind == "hf_trainer_universal":
            source = GOLDEN_ROOT / Reference("hf_trainer_source", ()).id
            return sorted(p for p in source.rglob("*") if p.is_file())
        if self.kind == "llama_universal":
            source = self.key[0]
            golden = GOLDEN_ROOT / Reference("llama_source", (source,)).id
            checkpoint = LLAMA_EXAMPLE if source == "tp2_zero1" else golden
            return sorted(p for p in (checkpoint / "universal").rglob("*") if p.is_file())
        return sorted(p for p in Path(self.key[0]).rglob("*") if p.is_file())


# What the default tier reads: every reference its tests ask for. test_goldens.py requires the manifest to hold
# exactly these, and the full tier re-records each.
GOLDENS = [
    *(Reference("load_universal", (TINY_UCP, stage, dp, bf16, "")) for stage, dp, bf16 in
      [(1, 1, False), (1, 4, False), (2, 4, False), (1, 4, True), (2, 4, True)]),
    *(Reference("load_universal", (ZERO3_UCP, 3, dp, False, "")) for dp in (1, 2, 4)),
    Reference("universal_corrected", (ZERO3_UCP, 3, 4, False)),
    Reference("llama_universal", ("tp2_zero1", 1, 2, 1, "fp32")),
    Reference("llama_source", ("tp1_zero3",)),
    Reference("hf_trainer_source", ()),
    Reference("hf_trainer_universal", ()),
]


def llama_model(source: str) -> str:
    return LLAMA_SOURCES[source][3]


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def installed_versions() -> dict[str, str]:
    from importlib.metadata import version
    return {name: version(name) for name in PINNED_PACKAGES}


def kept_files(kind: str, run_dir: Path) -> Iterator[Path]:
    """The files of a run of `kind` that its golden keeps, relative to the run folder, sorted."""
    found = set()
    for pattern in KINDS[kind]:
        found.update(p.relative_to(run_dir) for p in run_dir.glob(pattern) if p.is_file())
    return iter(sorted(found))


def collect(kind: str, run_dir: Path, dest: Path) -> list[str]:
    """Copies the kept files of a run into `dest` (the same relative paths); returns them."""
    names = []
    for rel in kept_files(kind, run_dir):
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(run_dir / rel, dest / rel)
        names.append(str(rel))
    if not names:
        raise RuntimeError(f"{kind} run in {run_dir} left none of the files its golden keeps ({KINDS[kind]})")
    return names


# ---- live runs ----------------------------------------------------------------------------------


def make_llama_source(source: str, out: Path) -> Path:
    """make_tiny_llama_checkpoint.py's run of that source into `out` (native/, universal/, config.json, ...)."""
    from make_tiny_checkpoint import cpu_env
    tp, dp, stage, model = LLAMA_SOURCES[source]
    cmd = [sys.executable, str(EXAMPLES / "make_tiny_llama_checkpoint.py"), "--out", str(out), "--tp", str(tp),
           "--dp", str(dp), "--zero-stage", str(stage), "--steps", str(LLAMA_SOURCE_STEPS), "--model", model]
    done = subprocess.run(cmd, env=cpu_env(), capture_output=True, text=True, timeout=2 * LAUNCH_TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed (rc={done.returncode}):\n{done.stdout[-3000:]}\n"
                           f"{done.stderr[-6000:]}")  # fmt: skip
    return out


def hf_trainer_launch(nproc: int, argv: list, what: str, expected: list[Path]) -> None:
    """examples/hf_trainer_resume.py's workers, launched by the tests' fork server (ds_launch)."""
    from ds_launch import launch
    launch(nproc, HF_TRAINER_SCRIPT, argv, what, expected)


def run_live(ref: Reference, out: Path, llama_source: Callable[[str], Path],
             hf_trainer_source: Callable[[], Path]) -> Path:
    """Runs the reference with real DeepSpeed into `out`; returns the folder holding its files.
    `llama_source(id)` gives a Llama source's folder (for llama_universal), `hf_trainer_source()` the Trainer's
    (for hf_trainer_universal). Raises RuntimeError on failure."""
    import hf_trainer_resume
    from ds_resume import universal_corrected
    from llama_resume import resume
    steps = REFERENCE_TRAIN_STEPS
    if ref.kind == "hf_trainer_source":
        hf_trainer_resume.make_source(out, launch=hf_trainer_launch)
        return out
    if ref.kind == "hf_trainer_universal":
        checkpoint = hf_trainer_source() / "checkpoint-3"
        return hf_trainer_resume.resume("resume_load_universal", checkpoint, out, launch=hf_trainer_launch)
    if ref.kind == "load_universal":
        ucp, stage, dp, bf16, variant = ref.key
        dump_target_states(ucp, stage, dp, out, bf16, train_steps=steps, variant=variant)
    elif ref.kind == "universal_corrected":
        ucp, stage, dp, bf16 = ref.key
        universal_corrected(ucp, stage, dp, out, train_steps=steps, bf16=bf16)
    elif ref.kind == "llama_universal":
        source, tp, dp, stage, precision = ref.key
        resume("universal", llama_source(source) / "universal", tp, dp, stage, out, precision=precision,
               train_steps=steps, model=llama_model(source))  # fmt: skip
    else:
        make_llama_source(ref.key[0], out)
    return out


# ---- goldens ------------------------------------------------------------------------------------


def read_manifest() -> dict:
    return json.loads(MANIFEST.read_text()) if MANIFEST.is_file() else {"goldens": {}}


def check_golden(ref: Reference, manifest: dict) -> Path:
    """The golden folder of `ref` after checking it against the manifest; raises LookupError saying why not."""
    entry = manifest["goldens"].get(ref.id)
    rerecord = "re-record with tests/tools/record_goldens.py (it needs the pinned packages installed)"
    if entry is None:
        raise LookupError(f"no golden for {ref.id} in {_relative(MANIFEST)}: record it with "
                          "tests/tools/record_goldens.py, or mark the test `full` (live DeepSpeed runs only)")
    installed = installed_versions()
    if manifest["versions"] != installed:
        raise LookupError(f"goldens were recorded with {manifest['versions']}, installed are {installed}: {rerecord}")
    for rel, digest in entry["sources"].items():
        path = REPO / rel
        if not path.is_file() or sha256(path) != digest:
            raise LookupError(f"{rel}, a source of golden {ref.id}, changed since it was recorded: {rerecord}")
    sources = {_relative(p) for p in ref.source_files()}
    if sources != set(entry["sources"]):
        raise LookupError(f"golden {ref.id} was made from other files than its checkpoint holds now: {rerecord}")
    folder = GOLDEN_ROOT / ref.id
    for rel, digest in entry["files"].items():
        path = folder / rel
        if not path.is_file() or sha256(path) != digest:
            raise LookupError(f"{_relative(path)} is missing or differs from the manifest: {rerecord}")
    return folder


def record(refs: list[Reference], work: Path, root: Path = GOLDEN_ROOT, log: Callable[[str], None] = print,
           keep: dict | None = None) -> dict:
    """Runs every reference live (Llama sources that are goldens too are run once and shared) and writes their
    kept files under root/<id>/ and root/manifest.json, beside the entries of `keep` (a manifest recorded with
    the same versions) not re-recorded. Returns the manifest."""
    runs: dict[Reference, Path] = {}

    def run(ref: Reference) -> Path:
        if ref not in runs:
            log(f"record: {ref.id}")
            runs[ref] = run_live(ref, work / ref.id, llama_source,
                                 lambda: run(Reference("hf_trainer_source", ())))
        return runs[ref]

    def llama_source(source: str) -> Path:
        return LLAMA_EXAMPLE if source == "tp2_zero1" else run(Reference("llama_source", (source,)))

    goldens = {}
    if keep is not None:
        if keep["versions"] != installed_versions():
            raise RuntimeError(f"the goldens were recorded with {keep['versions']}: re-record all of them")
        goldens.update(keep["goldens"])
    for ref in sorted(refs, key=lambda r: r.id):
        dest = root / ref.id
        shutil.rmtree(dest, ignore_errors=True)
        names = collect(ref.kind, run(ref), dest)
        goldens[ref.id] = {"sources": {_relative(p): sha256(p) for p in ref.source_files()},
                           "files": {name: sha256(dest / name) for name in names}}
    manifest = {"versions": installed_versions(), "goldens": dict(sorted(goldens.items()))}
    (root / "manifest.json").write_text(json.dumps(manifest, indent=1, sort_keys=True) + "\n")
    return manifest


class References:
    """The session's references: live runs (cached per reference) in the full tier, committed goldens otherwise."""

    def __init__(self, live: bool, work: Path) -> None:
        self.live = live
        self.work = work
        self.runs = RunCache()
        self.manifest = read_manifest()

    def get(self, ref: Reference) -> Path:
        """The folder of the reference's files (a failed run or an unusable golden fails the calling test)."""
        if self.live:
            return self.live_run(ref)
        try:
            return check_golden(ref, self.manifest)
        except LookupError as error:
            pytest.fail(str(error), pytrace=False)

    def live_run(self, ref: Reference) -> Path:
        """Runs `ref` with DeepSpeed once per session, whatever the tier (the full tier's golden re-check)."""
        return self.runs.get(ref, lambda: run_live(ref, self.work / ref.id, self.llama_source,
                                                   lambda: self.get(Reference("hf_trainer_source", ()))))

    def llama_source(self, source: str) -> Path:
        if source == "tp2_zero1":
            return LLAMA_EXAMPLE
        return self.get(Reference("llama_source", (source,)))
