"""The package's thread pool: a call's rows split into ranges run on threads (numpy and torch release the GIL in
their loops), one per core, shared by the CPU's eager counting (:mod:`.counting`), the factor tiles
(:mod:`.factor_ranks`) and the scan of boolean masks (:mod:`._inputs`)."""

from __future__ import annotations

import os
import threading
from typing import Any, Callable

import torch

from ._blas import one_torch_thread

__all__ = ["row_ranges"]

_pool: list[Any] = [None, None]  # (process id, ThreadPoolExecutor): a forked child builds its own
_in_pool = threading.local()  # ``active``: this thread is running a range of :func:`row_ranges` for the pool


def row_ranges(work: Callable[[int, int], None], b: int, rows: int, workers: int) -> None:
    """Run ``work(first, last)`` over rows 0..b in ``workers`` near-equal ranges of whole blocks of ``rows``, on the
    process's pool of threads (one per core; numpy and torch release the GIL in their loops), or in this thread for
    one worker (and inline in a pool worker: a nested split never waits on the pool it runs in); the first error
    raised in a range is raised here once every range has ended. The workers run in this thread's grad and inference
    modes (thread-local in torch: a worker would otherwise track gradients through an ``out=`` matmul, or refuse to
    write into an inference tensor), each on one torch thread (:func:`one_torch_thread`)."""
    blocks = -(-b // rows)
    workers = max(1, min(workers, blocks))
    if workers == 1 or getattr(_in_pool, "active", False):  # a worker's own split runs inline: no wait on the pool
        work(0, b)
        return
    if _pool[0] != os.getpid():
        from concurrent.futures import ThreadPoolExecutor

        _pool[:] = [os.getpid(), ThreadPoolExecutor(max_workers=os.cpu_count() or 1, thread_name_prefix="reco-count")]
    grad, inference = torch.is_grad_enabled(), torch.is_inference_mode_enabled()

    def in_modes(first: int, last: int) -> None:
        _in_pool.active = True
        try:
            with torch.inference_mode(inference), torch.set_grad_enabled(grad), one_torch_thread():
                work(first, last)
        finally:
            _in_pool.active = False

    per = -(-blocks // workers) * rows
    futures = [_pool[1].submit(in_modes, lo, min(lo + per, b)) for lo in range(0, b, per)]
    for f in futures:  # every range waited for: none left writing into the caller's tensors
        f.exception()
    for f in futures:
        f.result()
