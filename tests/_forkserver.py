"""The processes of the tests that start a gloo group (two-process DDP), forked from one fork server per test process.

A spawned process is a new interpreter that imports torch, Lightning and the package again: several seconds of CPU,
twice per two-process test. The fork server imports them once, in a process of its own that has run nothing else
(no threads, no test state), and forks each new process from there. Like spawn, each process gets its function and
arguments pickled (a callback or state that does not pickle still fails). Unlike spawn: the environment and limits
are the server's, as they were when it started (Lightning passes its port in the pickled strategy; the tests' own
workers are given theirs), and Lightning neither restores its global-state snapshot nor stops the model's
parameters from being shared, which it does only for ``spawn``: fine for the evaluation these tests run (keyed
draws, no training across ranks), not for a DDP fit. Linux only (forking after importing torch is fragile on macOS,
where Python's default is spawn); elsewhere spawn.
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver
import sys

# what the server imports before it forks (an import that fails there is left to the process that needs it)
PRELOAD = ("pytest", "torch", "torch.distributed", "reco_sampled_plugin.adapters.torchmetrics", "lightning.pytorch",
           "reco_sampled_plugin.adapters.lightning", "_lightning_helpers")


def start_method() -> str:
    """``forkserver`` on Linux; ``spawn`` elsewhere."""
    return "forkserver" if sys.platform.startswith("linux") else "spawn"


def context(*extra: str) -> multiprocessing.context.BaseContext:
    """The forkserver context, its server preloading :data:`PRELOAD` and ``extra`` modules (set before the server
    starts: once it runs, every test process's later callers share it as it is); spawn's where there is none."""
    if start_method() == "forkserver":
        multiprocessing.forkserver.set_forkserver_preload([*PRELOAD, *extra])
    return multiprocessing.get_context(start_method())


def lightning_ddp():
    """Lightning's DDP strategy with its processes started as ``ddp_spawn`` starts them (pickled, fresh: Lightning's
    multiprocessing launcher), from the fork server."""
    from lightning.pytorch.strategies import DDPStrategy

    context()
    return DDPStrategy(start_method=start_method())
