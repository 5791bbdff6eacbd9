"""The processes of the tests that start a gloo group (two-process DDP), forked from one fork server per test process.

A spawned process is a new interpreter that imports torch, Lightning and the package again: several seconds of CPU,
twice per two-process test. The fork server imports them once, in a process of its own that has run nothing else
(no threads, no test state), and forks each new process from there. What the processes get is what spawn gives
them: a fresh state, their function and arguments pickled (a callback or state that does not pickle still fails),
the environment the server started with (Lightning passes its port in the pickled strategy; the tests' own workers
are given theirs).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.context
import multiprocessing.forkserver

# what the server imports before it forks (an import that fails there is left to the process that needs it)
PRELOAD = ("pytest", "torch", "torch.distributed", "reco_sampled_plugin.adapters.torchmetrics", "lightning.pytorch",
           "reco_sampled_plugin.adapters.lightning", "_lightning_helpers")


def start_method() -> str:
    """``forkserver``; ``spawn`` where the platform has no fork server (Windows)."""
    return "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


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
