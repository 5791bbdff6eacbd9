"""A pytest plugin that records, per test, the CPU seconds of the process and of its waited children (getrusage)
and the wall seconds, as JSON: ``{nodeid: [cpu_self, cpu_children, wall]}``, one file per xdist worker.

    PYTHONPATH=benchmarks python -m pytest -p pytest_cputime -n 2 [tests]   # writes $PYTEST_CPUTIME_DIR/cputime_<worker>.json

``PYTEST_CPUTIME_DIR`` defaults to the current directory. CPU of processes the test does not wait for (Ray's
workers, daemons) is not counted: their tests show as wall time.
"""

from __future__ import annotations

import json
import os
import resource
import time
from collections.abc import Iterator

import pytest

_RECORDS: dict[str, tuple[float, float, float]] = {}


def _cpu() -> tuple[float, float]:
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime, children.ru_utime + children.ru_stime


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    own, children = _cpu()
    wall = time.perf_counter()
    yield
    own_after, children_after = _cpu()
    _RECORDS[item.nodeid] = (own_after - own, children_after - children, time.perf_counter() - wall)


def pytest_sessionfinish(session: pytest.Session) -> None:
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    folder = os.environ.get("PYTEST_CPUTIME_DIR", ".")
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f"cputime_{worker}.json")
    with open(path, "w") as f:
        json.dump(_RECORDS, f)
