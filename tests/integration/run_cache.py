"""RunCache: one expensive run (a DeepSpeed launch, a mount plus a resume) per key and test session."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest


class RunCache:
    """get(key, run) runs `run()` once per key. A run that raises RuntimeError fails every test that needs it,
    with the error's text (the launcher's output), instead of being retried by each test."""

    def __init__(self) -> None:
        self.results: dict[Any, tuple[bool, Any]] = {}

    def get(self, key: Any, run: Callable[[], Any]) -> Any:
        if key not in self.results:
            try:
                self.results[key] = (True, run())
            except RuntimeError as error:
                self.results[key] = (False, str(error))
        ok, value = self.results[key]
        if not ok:
            pytest.fail(value, pytrace=False)
        return value
