"""Operators dispatched per call on the hot paths, counted on the CPU (``tests/_budgets.OpCounter``).

Each aten operator is at least one kernel launch on an accelerator, where a call's time is its fixed cost per
launch (BENCHMARKS.md, "Where the time goes on a GPU"); on a CPU each is a few microseconds of dispatch. The count
of every hot path and adapter update is the same whatever the batch size B and the catalogue size n (no loop that
dispatches per chunk of users or items) on both eager counting paths: the CPU's numpy one (``counting._numpy_padded``)
and the torch loop that an accelerator runs (one pass per reference over whole rows; the loop over chunks of 2^22
comparisons it replaced dispatched 131 / 245 / 5,981 operators for one ``exact_ranks`` call at 16 x 296 / 128 x
20,000 / 1,024 x 100,000). Each count stays within a budget: today's count, so that a change that adds operators says
so here.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _budgets import OpCounter  # noqa: E402

from reco_sampled_plugin import DEFAULT_METRICS, _graphs, _inputs, counting, exact_ranks, per_user_metrics, sampled_ranks  # noqa: E402
from reco_sampled_plugin.adapters._shared import RankingSettings, padded_inputs  # noqa: E402
from reco_sampled_plugin.adapters import torchmetrics as tm  # noqa: E402
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics  # noqa: E402
from reco_sampled_plugin.design import ExactShare, SamplingDesign  # noqa: E402

P, E, M = 5, 50, 100
SIZES = [(16, 296), (128, 20_000)]  # B x P x m <= 2^16: one block of keyed numbers (_hash._HASH_BLOCK) at both;
# n a multiple of 8: a mask is read as 64-bit words, padded (one operator more) otherwise
SETTINGS = RankingSettings(("hit@10", "ndcg@10", "auc"), n_samples=M)

# operators per call, measured on this commit (CPU, eager counting): (numpy path, the torch loop of accelerators)
BUDGET = {
    "exact index": (77, 93),  # 3 more than with the index checks read first: one synchronisation fewer
    # the CPU scans masks in numpy (``_inputs._sparse_masks_numpy``); the torch scan counts the rows' entries and the
    # non-zero words before its one read, then lists them with ``nonzero_static`` (136 with a ``nonzero`` of its own)
    "exact masks": (59, 133),
    # an accelerator keys its uniform draws by a seed (the hash's 32-bit mixes: 55 operators more than the generator's
    # draws), replayed from a graph from a shape's third call on (8 operators: tests/test_graphs.py)
    "sampled index": (154, 209),
    # the exact update on an accelerator keeps its finite-scores flag in the ``failed_checks`` state instead of reading
    # it (three operators: stack, mul, maximum); its metrics' sums in one set of reductions (22 operators for three
    # metrics when summed one by one: 89 / 110 before)
    "ExactRankingMetrics.update_padded": (74, 90),
    "SampledRankingMetrics.update_padded": (183, 183),
    # the exact and sampled updates of one batch (flags kept, unread); the CPU's numpy scan of the masks 34 fewer; the
    # positives looked up in the exclusion mask before the one read (284 / 319 when looked up in its listed indices)
    "callback batch (mask exclusions)": (278, 312),
    # with an exact share, as on an accelerator (a static capacity of rows ranked in one pass); 64 of the 128 more:
    # the keyed uniform of the share's choice (hash chains)
    "SampledRankingMetrics.update_padded, exact share": (311, 323),
    # ten metrics: the cut-off's hits and each rule's undefined users computed once per k (306 in the torch loop when
    # each metric computed its own)
    "per_user_metrics, ten metrics": (200, 215),
}
PATHS = ("numpy", "torch loop")


def _problem(b: int, n: int) -> dict:
    g = torch.Generator().manual_seed(b + n)
    scores = torch.randint(-5, 6, (b, n), generator=g).to(torch.float32)  # many ties
    items = torch.stack([torch.randperm(n, generator=g)[: P + E] for _ in range(b)])
    pos, exc = items[:, :P].sort(1).values, items[:, P:].clone()
    exc[::3, E // 2:] = -1  # ragged exclusions (padding)
    pm = torch.zeros(b, n, dtype=torch.bool).scatter_(1, pos, True)
    em = torch.zeros(b, n + 1, dtype=torch.bool).scatter_(1, torch.where(exc >= 0, exc, n), True)[:, :n]
    return dict(scores=scores, pos=pos, exc=exc, pm=pm, em=em, ids=torch.arange(b))


def _calls(d: dict) -> dict:
    s, pos, exc = d["scores"], d["pos"], d["exc"]
    exact = ExactRankingMetrics.from_settings(SETTINGS)
    sampled = SampledRankingMetrics.from_settings(SETTINGS)
    shared = SampledRankingMetrics.from_settings(
        dataclasses.replace(SETTINGS, n_samples=SamplingDesign(M, exact_share=ExactShare(0.05))))
    both = (ExactRankingMetrics.from_settings(SETTINGS),
            SampledRankingMetrics.from_settings(dataclasses.replace(SETTINGS, check_finite=False)))

    def callback_batch() -> None:  # what the Lightning callback does with a batch (its _batch_end)
        p, e = padded_inputs(s, pos[:, 0], d["em"])
        both[0].update_padded(s, p, e, None)
        both[1].update_padded(s, p, e, d["ids"], None)

    return {
        "exact index": lambda: exact_ranks(s, pos, exclude=exc),
        "exact masks": lambda: exact_ranks(s, d["pm"], exclude=d["em"]),
        "sampled index": lambda: sampled_ranks(s, pos, M, exclude=exc, generator=torch.Generator().manual_seed(1)),
        "ExactRankingMetrics.update_padded": lambda: exact.update_padded(s, pos, exc),
        "SampledRankingMetrics.update_padded": lambda: sampled.update_padded(s, pos, exc, d["ids"]),
        "callback batch (mask exclusions)": callback_batch,
        "SampledRankingMetrics.update_padded, exact share": lambda: shared.update_padded(s, pos, exc, d["ids"]),
        "per_user_metrics, ten metrics": lambda: per_user_metrics(s, pos, DEFAULT_METRICS, exclude=exc, as_frame=False),
    }


@pytest.fixture(params=PATHS)
def eager(request, monkeypatch):
    """The eager backend on one intra-op thread (the CPU's counting splits large calls between threads with one buffer
    each, ``counting._in_threads``: one ``empty`` per thread, which an accelerator never runs), on the numpy path or
    the torch loop of an accelerator (numpy blocked, whole rows, masks scanned in torch); yields the path's index in
    ``PATHS``."""
    before, threads = counting.get_backend(), torch.get_num_threads()
    counting.set_backend("eager")
    torch.set_num_threads(1)
    monkeypatch.setattr(counting, "_numpy_blocked", [request.param == "torch loop"])
    monkeypatch.setattr(counting, "_cpu_chunks", [request.param != "torch loop"])
    monkeypatch.setattr(_inputs, "_numpy_scan", [request.param != "torch loop"])  # masks scanned as on an accelerator
    # uniform draws keyed by a seed, as on an accelerator (the stand-in graph's switch; the eager backend captures none)
    monkeypatch.setattr(_graphs, "_fake", [request.param == "torch loop"])
    yield PATHS.index(request.param)
    torch.set_num_threads(threads)
    counting.set_backend(before)


@pytest.mark.parametrize("name", list(BUDGET))
def test_operators_per_call_are_constant_in_size_and_within_budget(name, eager, monkeypatch):
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)  # an exact share's accelerator path
    counts = []
    for b, n in SIZES:
        fn = _calls(_problem(b, n))[name]
        fn()  # first call: caches (device constants, tables) filled
        with OpCounter() as ops:
            fn()
        counts.append(ops.count)
        assert ops.count <= BUDGET[name][eager], (b, n, ops.count, ops.calls.most_common(8))
    assert counts[0] == counts[1], (name, counts)


@pytest.mark.parametrize("name", ["exact index", "ExactRankingMetrics.update_padded"])
def test_masks_counted_by_their_bytes_dispatch_a_constant_count(name, eager, monkeypatch):
    """From ``counting._WORD_COUNT_MIN`` scores per block the torch loop counts each reference's mask by its bytes
    (``counting._count_columns``): up to 6 operators more per reference (two dtype views, each with its detach, a
    shape view and one more sum: one kernel more, the others metadata), 30 for these 5 positives, the same at every
    size."""
    monkeypatch.setattr(counting, "_WORD_COUNT_MIN", 0)  # the large blocks' path at these sizes
    counts = []
    for b, n in SIZES:
        fn = _calls(_problem(b, n))[name]
        fn()
        with OpCounter() as ops:
            fn()
        counts.append(ops.count)
    assert counts[0] == counts[1], counts
    assert counts[0] <= BUDGET[name][eager] + (30 if PATHS[eager] == "torch loop" else 0), (counts, ops.calls.most_common(8))
