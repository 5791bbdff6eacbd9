"""One BLAS thread for the small dense algebra (``_blas``): set inside, restored after, never left behind."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch

import threadpoolctl  # the test extra installs it (as the framework extras do)

from reco_sampled_plugin import _blas, corrections, identification, rank_distribution, registry


def _blas_threads() -> set[int]:
    return {lib["num_threads"] for lib in threadpoolctl.threadpool_info() if lib["user_api"] == "blas"}


@pytest.fixture()
def two_threads():
    """BLAS at 2 threads outside the blocks (whatever the machine's default), restored after the test."""
    with threadpoolctl.threadpool_limits(2, user_api="blas"):
        assert _blas_threads() == {2}
        yield


def test_one_blas_thread_sets_and_restores(two_threads):
    with _blas.one_blas_thread():
        assert _blas_threads() == {1}
        with _blas.one_blas_thread():  # nested: still one, and the outer block's exit restores
            assert _blas_threads() == {1}
        assert _blas_threads() == {1}
    assert _blas_threads() == {2}
    with _blas.one_blas_thread(enabled=False):
        assert _blas_threads() == {2}


def test_blocks_in_other_threads_change_nothing(two_threads):
    """threadpoolctl acts from the main thread: a block entered in a worker thread leaves the limit alone (the
    planner's designs run in threads under the limit plan() set from the main thread) and the main thread's
    block still holds while a worker's block opens and closes."""
    seen: dict[str, set[int]] = {}

    def worker() -> None:
        with _blas.one_blas_thread():
            seen["worker"] = _blas_threads()
        seen["worker after"] = _blas_threads()

    t = threading.Thread(target=worker)
    t.start()
    t.join(20)
    assert seen == {"worker": {2}, "worker after": {2}}
    with _blas.one_blas_thread():
        t = threading.Thread(target=worker)
        t.start()
        t.join(20)
        assert _blas_threads() == {1}
        assert _blas._STATE["depth"] == 1
    assert _blas_threads() == {2}
    assert _blas._STATE["depth"] == 0


def test_an_exception_inside_restores(two_threads):
    with pytest.raises(RuntimeError):
        with _blas.one_blas_thread():
            raise RuntimeError("inside")
    assert _blas_threads() == {2}
    assert _blas._STATE["depth"] == 0


def test_without_threadpoolctl_nothing_changes(two_threads, monkeypatch):
    monkeypatch.setitem(_blas._STATE, "controller", None)
    monkeypatch.setitem(_blas._STATE, "ready", True)
    with _blas.one_blas_thread():
        assert _blas_threads() == {2}


def _spy(monkeypatch, module, name):
    """Record the BLAS threads seen each time ``module.name`` runs."""
    seen: list[set[int]] = []
    original = getattr(module, name)

    def wrapper(*args, **kwargs):
        seen.append(_blas_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, wrapper)
    return seen


def test_fits_tables_and_intervals_run_on_one_thread_and_large_tables_keep_theirs(two_threads, monkeypatch):
    rng = np.random.default_rng(0)
    ranks = rng.integers(1, 102, size=300)
    fits = _spy(monkeypatch, rank_distribution, "_build_model")
    rank_distribution.fit_rank_distribution(rank_distribution.as_histogram(ranks, 2_000, 100),
                                            registry.Mes(n_bootstrap=0))
    assert fits and all(s == {1} for s in fits)
    assert _blas_threads() == {2}

    solves = _spy(monkeypatch, corrections, "_solve")
    corrections.clear_correction_cache()
    corrections.correction_table("ndcg@10", 2_000, 100, "bv")
    corrections.correction_table("ndcg@10", 20_000, _blas.SMALL_SYSTEM, "bv")  # m + 1 above SMALL_SYSTEM
    corrections.clear_correction_cache()
    assert solves == [{1}, {2}]

    lps = _spy(monkeypatch, identification, "_solve")
    identification.identified_interval("recall@10", ranks, 2_000, 100)
    assert lps and all(s == {1} for s in lps)
    assert _blas_threads() == {2}


def test_decorated_functions_keep_their_signatures_and_docs():
    import inspect

    for fn in (rank_distribution.fit_rank_distribution, identification.identified_interval):
        assert "sampling" in inspect.signature(fn).parameters
        assert (fn.__doc__ or "").strip()  # the function's own docstring (the wrapper has none), for the API docs


def test_batched_fits_run_on_one_thread(two_threads, monkeypatch):
    rng = np.random.default_rng(1)
    hists = [rank_distribution.as_histogram(torch.as_tensor(rng.integers(1, 102, size=200)), 2_000, 100) for _ in range(3)]
    fits = _spy(monkeypatch, rank_distribution, "_build_model")
    rank_distribution.fit_rank_distribution(hists, "mes")
    assert fits and all(s == {1} for s in fits)
    assert _blas_threads() == {2}
