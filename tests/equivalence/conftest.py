"""Fixtures of the equivalence tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest


@pytest.fixture
def count_loops(monkeypatch) -> Callable[[type], list]:
    """``count_loops(cls)``: a list that gets the length of every compiled loop ``cls.steps`` runs."""

    def count(cls: type) -> list:
        calls: list = []
        original = cls.steps

        def steps(self, *args, **kwargs):
            calls.append(len(args[1]))
            return original(self, *args, **kwargs)

        monkeypatch.setattr(cls, "steps", steps)
        return calls
    return count
