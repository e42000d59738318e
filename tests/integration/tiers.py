"""The test tiers (conftest.py's --full): which cases of a parametrized test the default tier runs."""

from __future__ import annotations

from collections.abc import Iterable

import pytest

FULL = pytest.mark.full


def tiered(ids: Iterable[str], default: Iterable[str]) -> list:
    """One pytest.param per case id, marked `full` unless it is in `default`, the default tier's smoke set."""
    ids, default = list(ids), set(default)
    assert default <= set(ids), f"unknown default-tier cases: {sorted(default - set(ids))}"
    return [pytest.param(i, id=i, marks=() if i in default else FULL) for i in ids]
