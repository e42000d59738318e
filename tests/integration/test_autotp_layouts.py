"""The AutoTP layouts the built-in rules are checked against (tests/unit/layout/autotp_layouts.json) are what the
pinned DeepSpeed does.

One launch of autotp_layouts.record (2 CPU ranks, AutoTP TP 2, the tiny model of every family in FAMILIES,
each with an untied and a tied output head):

- test_committed_layouts_match_installed_deepspeed: the document recorded now equals the committed one, so the
  C++ unit test ([autotp]) that checks every built-in rule and shard size against it checks them against the
  installed DeepSpeed and transformers.
- test_layouts_describe_the_tensors: the recorded splits say how AutoTP really cut the bytes: every rank's
  parameter equals the whole tensor (replicated) or the block of it the recorded dim and shard sizes give; a
  tied lm_head (in the state_dict, not in the map) is the whole tensor, as the built-in rules serve it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from autotp_layouts import FAMILIES, record

COMMITTED = Path(__file__).resolve().parents[1] / "unit" / "layout" / "autotp_layouts.json"
TP = 2


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return record(tmp_path_factory.mktemp("autotp_layouts"), TP)


def test_committed_layouts_match_installed_deepspeed(recorded: Path) -> None:
    now = json.loads((recorded / "layouts.json").read_text())
    committed = json.loads(COMMITTED.read_text())
    assert now == committed, ("the installed DeepSpeed records other AutoTP layouts than the committed table; "
                              "re-record with `python tests/integration/autotp_layouts.py --write "
                              f"{COMMITTED}` and review the rules in reshard/layout/autotp_rules.cc")


@pytest.mark.parametrize("family", list(FAMILIES))
def test_layouts_describe_the_tensors(family: str, recorded: Path) -> None:
    params = json.loads((recorded / "layouts.json").read_text())["families"][family]["params"]
    full = torch.load(recorded / f"{family}_full.pt")
    aliases = ["lm_head.weight"] if family.endswith("_tied") else []
    assert sorted(full) == sorted([*params, *aliases])
    split = 0
    for rank in range(TP):
        local = torch.load(recorded / f"{family}_rank_{rank}.pt")
        assert sorted(local) == sorted(full)
        for name in local:
            layout = params.get(name, {"split_dim": None})
            if layout["split_dim"] is None:
                expected = full[name]
            else:
                sizes = layout["shard_sizes"]
                expected = full[name].narrow(layout["split_dim"], sum(sizes[:rank]), sizes[rank])
                split += 1
            assert torch.equal(local[name], expected), f"{family} rank {rank}: {name}"
    assert split >= TP * 14, split  # 7 projections x 2 layers (+ an untied lm_head)
