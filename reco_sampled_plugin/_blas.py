"""One BLAS thread for the package's small dense algebra (fits, correction tables, identified intervals).

The estimators' matrices are small (a fit: ~150 cells x ~1,000 occupied columns, a bootstrap's 8-32 replicates at
once; a correction table's (m + 1)^2 system), and BLAS's own threads cost more than they save there: on the project's
2-core machine numpy's default two OpenBLAS threads made the shipped RecBole example's `mes` fit with 8 bootstrap
refits about twice as slow as one thread (measured there; git history of BENCHMARKS.md).

:func:`one_blas_thread` limits every BLAS library loaded in the process to one thread while the block runs, through
threadpoolctl where it is installed (the framework extras install it; without it nothing changes), from the main
thread only: the limit is process-wide (BLAS libraries have no per-thread setting) and threadpoolctl is designed for
calls from the main thread (its README), so one thread owns the limit and its count, and a block entered from any
other thread changes nothing. The planner's designs run in worker threads under the limit that plan() set from the
main thread; a plan() run from another thread (a server's worker) runs without it. Nested blocks are counted: the
outermost sets the limit, its exit (or exception) restores what was there before. The libraries are those loaded
at the first block (numpy's and scipy.linalg's OpenBLAS: scipy.linalg is imported first); one loaded later keeps its
threads. torch's own threads are not touched by it: :func:`one_torch_thread` sets them for the calling thread.
"""

from __future__ import annotations

import contextlib
import functools
import threading
from typing import Any, Callable, Iterator, ParamSpec, TypeVar

import torch

__all__ = ["one_blas_thread", "one_torch_thread", "torch_threads_per_thread", "blas_single", "SMALL_SYSTEM"]

#: linear systems up to this order run on one BLAS thread (correction tables: m + 1); larger ones keep BLAS's threads
SMALL_SYSTEM = 1024

_STATE: dict[str, Any] = {"controller": None, "ready": False, "depth": 0, "limiter": None}


def _controller() -> Any:
    """threadpoolctl's controller of the BLAS libraries loaded now (made once; None without threadpoolctl)."""
    if not _STATE["ready"]:
        try:
            from threadpoolctl import ThreadpoolController
        except ImportError:  # optional: BLAS keeps its threads
            controller = None
        else:
            # numpy's and scipy.linalg's BLAS (two libraries in the wheels) are loaded first
            import scipy.linalg  # noqa: F401

            controller = ThreadpoolController()
        _STATE["controller"], _STATE["ready"] = controller, True
    return _STATE["controller"]


@contextlib.contextmanager
def one_blas_thread(enabled: bool = True) -> Iterator[None]:
    """Run the block with BLAS on one thread (``enabled``, from the main thread; see the module docstring),
    restored afterwards."""
    if not enabled or threading.current_thread() is not threading.main_thread() or _controller() is None:
        yield
        return
    if _STATE["depth"] == 0:
        _STATE["limiter"] = _STATE["controller"].limit(limits=1, user_api="blas")
    _STATE["depth"] += 1
    try:
        yield
    finally:
        _STATE["depth"] -= 1
        if _STATE["depth"] == 0:
            _STATE["limiter"].restore_original_limits()
            _STATE["limiter"] = None


_P = ParamSpec("_P")
_R = TypeVar("_R")


def blas_single(fn: Callable[_P, _R]) -> Callable[_P, _R]:
    """``fn`` run inside :func:`one_blas_thread` (for functions whose dense algebra is small by construction)."""

    @functools.wraps(fn)
    def wrapper(*args: _P.args, **kwargs: _P.kwargs) -> _R:
        with one_blas_thread():
            return fn(*args, **kwargs)

    return wrapper


def torch_threads_per_thread() -> bool:
    """Whether torch's intra-op thread count is set per thread: its OpenMP backend (Linux and Windows wheels). Its
    native backend (macOS wheels) has one process-wide pool whose size cannot change once parallel work has started
    (a warning at every call)."""
    if _TORCH_OPENMP[0] is None:
        _TORCH_OPENMP[0] = "parallel backend: OpenMP" in torch.__config__.parallel_info()
    return bool(_TORCH_OPENMP[0])


_TORCH_OPENMP: list[bool | None] = [None]


@contextlib.contextmanager
def one_torch_thread() -> Iterator[None]:
    """Torch's intra-op threads set to 1 in this thread for the block, then restored, where that setting is the
    thread's own (:func:`torch_threads_per_thread`; else nothing changes). Thread-local in torch's OpenMP backend
    (OpenMP's per-thread setting, MKL's ``mkl_set_num_threads_local``; measured, torch 2.13: a thread set to 1 left
    another's matmul on two threads), so a pool worker runs its tiles' matmuls on its own core and the caller keeps
    its own setting; torch's default for threads started meanwhile is 1 until the block ends."""
    saved = torch.get_num_threads() if torch_threads_per_thread() else 1
    if saved != 1:
        torch.set_num_threads(1)
    try:
        yield
    finally:
        if saved != 1:
            torch.set_num_threads(saved)
