"""Hypothesis example counts relative to the loaded profile (tests/conftest.py).

A test that needs more (or fewer) examples than the profile's default states its count at the ``fast`` profile's
scale (40 examples); ``examples(n)`` scales it to the profile in force, so ``--hypothesis-profile long`` deepens
every property test alike and ``quick`` (a developer's loop) thins them alike. Never hard-code ``max_examples``.
"""

from __future__ import annotations

from hypothesis import settings

#: max_examples of the ``fast`` profile, the scale the counts in the tests are written at
BASE = 40


def examples(n: int) -> int:
    """``n`` examples at the ``fast`` profile's scale, scaled to the loaded profile (at least 1)."""
    return max(1, round(n * settings.default.max_examples / BASE))
