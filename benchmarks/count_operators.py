"""Operators dispatched per call on the hot paths (``tests/test_gpu_readiness_dispatch.py``'s cases) at several sizes.

Each aten operator is at least one kernel launch on an accelerator; counted on the CPU with ``tests/_budgets.OpCounter``
(eager backend, one thread, adapters on their accelerator path). ``--path torch`` runs the eager path an accelerator
runs (numpy blocked: whole rows, masks scanned in torch; the keyed hash in one block, as off the CPU; uniform draws
keyed by a seed); ``--path
numpy`` the CPU's.

    python benchmarks/count_operators.py --path torch --sizes 16x296,128x20000,1024x100000
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
import test_gpu_readiness_dispatch as cases  # noqa: E402
from _budgets import OpCounter  # noqa: E402

from reco_sampled_plugin import _graphs, _hash, _inputs, counting  # noqa: E402


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--path", choices=("torch", "numpy"), default="torch")
    p.add_argument("--sizes", default="16x296,128x20000,1024x100000", help="comma-separated BxN")
    args = p.parse_args(argv)
    sizes = [tuple(int(x) for x in s.split("x")) for s in args.sizes.split(",")]
    counting.set_backend("eager")
    torch.set_num_threads(1)
    cases.tm._READS_ON_CPU = False
    if args.path == "torch":
        counting._numpy_blocked[0] = True
        if hasattr(counting, "_cpu_chunks"):
            counting._cpu_chunks[0] = False
        if hasattr(_inputs, "_numpy_scan"):
            _inputs._numpy_scan[0] = False
        _graphs._fake[0] = True  # uniform draws keyed by a seed, as on an accelerator (eager backend: nothing captured)
        _hash._HASH_BLOCK = 1 << 62  # the CPU-only cache blocks of the hash off: an accelerator hashes at once
    print(f"operators per call, {args.path} path, torch {torch.__version__}")
    print("| call | " + " | ".join(f"{b:,} x {n:,}" for b, n in sizes) + " |")
    print("| --- |" + " --- |" * len(sizes))
    for name in cases.BUDGET:
        row = []
        for b, n in sizes:
            fn = cases._calls(cases._problem(b, n))[name]
            fn()  # caches filled
            with OpCounter() as ops:
                fn()
            row.append(f"{ops.count:,}")
        print(f"| {name} | " + " | ".join(row) + " |", flush=True)


if __name__ == "__main__":
    main()
