"""The committed goldens of DeepSpeed's reference runs (goldens.py, tests/goldens/) are complete, pinned and current.

Default tier: the manifest holds exactly goldens.GOLDENS, was recorded with the torch, DeepSpeed and transformers
versions the requirement files pin and the venv has, every golden's sources and files still hash as recorded, and
all of it fits the repository budget. Full tier: each golden is recorded again from a live DeepSpeed run (the same
run the full tier's other tests compare against) and must equal the committed files byte for byte.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from goldens import (GOLDEN_BUDGET_BYTES, GOLDEN_ROOT, GOLDENS, PINNED_PACKAGES, REPO, check_golden, collect,
                     installed_versions, read_manifest)
from tiers import FULL

REQUIREMENTS = [REPO / "scripts" / "requirements-torch.txt", REPO / "scripts" / "requirements.txt"]


def pinned_versions() -> dict[str, str]:
    pins = {}
    for path in REQUIREMENTS:
        for line in path.read_text().splitlines():
            match = re.fullmatch(r"\s*([A-Za-z0-9_.-]+)==([^\s#]+).*", line)
            if match:
                pins[match[1].lower()] = match[2]
    return {name: pins[name] for name in PINNED_PACKAGES}


def test_manifest_holds_exactly_the_goldens() -> None:
    manifest = read_manifest()
    assert sorted(manifest["goldens"]) == sorted(ref.id for ref in GOLDENS), (
        "tests/goldens/manifest.json and goldens.GOLDENS disagree: re-record with tests/tools/record_goldens.py")
    folders = sorted(p.name for p in GOLDEN_ROOT.iterdir() if p.is_dir())
    assert folders == sorted(manifest["goldens"]), f"golden folders {folders} != the manifest's"
    for name, entry in manifest["goldens"].items():
        held = sorted(str(p.relative_to(GOLDEN_ROOT / name)) for p in (GOLDEN_ROOT / name).rglob("*") if p.is_file())
        assert held == sorted(entry["files"]), f"{name}: holds {held}, the manifest lists {sorted(entry['files'])}"


def test_goldens_were_recorded_with_the_pinned_packages() -> None:
    recorded, pinned, installed = read_manifest()["versions"], pinned_versions(), installed_versions()
    assert installed == pinned, f"the venv has {installed}, the requirement files pin {pinned}: run scripts/setup.sh"
    assert recorded == pinned, (f"the goldens were recorded with {recorded}, the pins are now {pinned}: re-record "
                                "them with tests/tools/record_goldens.py and commit tests/goldens")


def test_goldens_fit_the_budget() -> None:
    size = sum(p.stat().st_size for p in GOLDEN_ROOT.rglob("*") if p.is_file())
    assert size <= GOLDEN_BUDGET_BYTES, f"tests/goldens holds {size} bytes, over {GOLDEN_BUDGET_BYTES}"


@pytest.mark.parametrize("ref", GOLDENS, ids=lambda ref: ref.id)
def test_golden_is_intact(ref) -> None:
    """Its sources hash as recorded (a changed checkpoint needs a new golden) and so do its files."""
    folder = check_golden(ref, read_manifest())
    assert folder == GOLDEN_ROOT / ref.id


@FULL
@pytest.mark.parametrize("ref", GOLDENS, ids=lambda ref: ref.id)
def test_golden_equals_a_fresh_recording(ref, references, tmp_path: Path) -> None:
    names = collect(ref.kind, references.live_run(ref), tmp_path)
    committed = sorted(read_manifest()["goldens"][ref.id]["files"])
    assert sorted(names) == committed, f"{ref.id}: the live run keeps {sorted(names)}, the golden {committed}"
    differing = [n for n in names if (tmp_path / n).read_bytes() != (GOLDEN_ROOT / ref.id / n).read_bytes()]
    assert not differing, (f"{ref.id}: DeepSpeed now writes other bytes for {differing}: find out why, then "
                           "re-record with tests/tools/record_goldens.py")
