"""``deferred_checks``: the input checks of ``exact_ranks`` / ``per_user_metrics`` read once, at a block's end.

Oracles: the same calls outside a block (results bit for bit; their errors' kinds), host synchronisations counted
(``_budgets.SyncCounter``) on the torch paths an accelerator runs, and calls replayed from the CPU's stand-in graph."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _budgets import count_syncs  # noqa: E402

import reco_sampled_plugin as rsp  # noqa: E402
from reco_sampled_plugin import _deferred, _graphs, _inputs, counting  # noqa: E402

METRICS = ("ndcg@10", "recall@5", "auc")


@pytest.fixture
def accelerator_paths(monkeypatch):
    """The torch paths an accelerator runs (numpy's counting and scans are CPU-only reads)."""
    monkeypatch.setattr(counting, "_numpy_blocked", [True])
    monkeypatch.setattr(counting, "_cpu_chunks", [False])
    monkeypatch.setattr(_inputs, "_numpy_scan", [False])


def _batches(k: int = 5, b: int = 12, n: int = 300, p: int = 3, e: int = 20):
    out = []
    for seed in range(k):
        g = torch.Generator().manual_seed(seed)
        order = torch.argsort(torch.rand(b, n, generator=g), 1)
        pos, exc = order[:, :p].clone(), order[:, p:p + e].clone()
        pos[::4, -1] = -1
        out.append((torch.randn(b, n, generator=g), pos, exc))
    return out


def _calls(scores, pos, exc):
    return (rsp.exact_ranks(scores, pos, exc),
            rsp.per_user_metrics(scores, pos, METRICS, exclude=exc, as_frame=False))


def test_valid_calls_in_a_block_read_nothing_and_equal_calls_outside(accelerator_paths):
    """Inside the block each call queues its work and reads nothing back (outside: one read per call); the results
    are the same, and the block's end reads once and raises nothing."""
    batches = _batches()
    outside = [_calls(*batch) for batch in batches]
    assert all(count_syncs(_calls, *batch)[1].count == 2 for batch in batches[:1])  # one read per call outside
    with rsp.deferred_checks() as block:
        for (s, pos, exc), (ranks, values) in zip(batches, outside):
            (got_ranks, got_values), syncs = count_syncs(_calls, s, pos, exc)
            assert syncs.count == 0, dict(syncs.calls)
            assert torch.equal(got_ranks, ranks)
            assert all(torch.equal(got_values[k].nan_to_num(-7), v.nan_to_num(-7)) for k, v in values.items())
    assert block.calls == 2 * len(batches)
    assert set(block._state) == {torch.device("cpu")} and block._state[torch.device("cpu")].shape == (len(_deferred.DEFERRABLE),)


def test_the_block_raises_the_earliest_failed_check_naming_the_call(accelerator_paths):
    """A NaN score in the 2nd call and an out-of-range positive in the 4th: the block's end raises the NaN error of
    call 2 with the other named, the kinds' texts as ``deferred_checks`` documents them; the calls themselves
    returned (computed on stand-ins: an out-of-range positive ranked as padding)."""
    batches = _batches()
    s, pos, exc = batches[1]
    s = s.clone()
    s[3, 7] = float("nan")
    batches[1] = (s, pos, exc)
    s, pos, exc = batches[3]
    pos = pos.clone()
    pos[2, 0] = 300
    batches[3] = (s, pos, exc)
    with pytest.raises(ValueError) as err:
        with rsp.deferred_checks():
            for s, pos, exc in batches:
                ranks = rsp.exact_ranks(s, pos, exc)
            assert int(ranks[2, 0]) > 0  # the last batch is valid; the 4th ranked its bad slot as padding
    text = str(err.value)
    assert text.startswith("scores: NaN or inf in the score matrix")
    assert "[check 'scores_finite', first failed at call 2 of 5" in text and "'positives_range' (call 4)" in text
    # each kind alone gives the CPU's error kind outside a block
    for s, pos, exc in batches[1:4:2]:
        with pytest.raises(ValueError, match=r"^(scores: NaN|positives: item indices)"):
            rsp.exact_ranks(s, pos, exc)


def test_the_error_has_the_failing_calls_own_message(accelerator_paths):
    """Calls over catalogues of 50 and then 100 items: an out-of-range positive in the second is reported with its
    own range (0..99), not the first call's."""
    small, large = torch.randn(4, 50), torch.randn(4, 100)
    pos = torch.tensor([[1], [2], [3], [4]])
    with pytest.raises(ValueError, match=r"^positives: item indices must lie in 0\.\.99 .*at call 2 of 2"):
        with rsp.deferred_checks():
            rsp.exact_ranks(small, pos)
            rsp.exact_ranks(large, torch.tensor([[1], [2], [300], [4]]))


@pytest.mark.parametrize("kind", ["duplicates", "clash"])
def test_duplicates_and_clashes_are_deferred_too(kind, accelerator_paths):
    s, pos, exc = _batches(1)[0]
    pos, exc = pos.clone(), exc.clone()
    if kind == "duplicates":
        exc[1, 1] = exc[1, 0]
    else:
        exc[5, 0] = pos[5, 0]
    with pytest.raises(ValueError, match=rf"^exclude: .*\[check 'exclude_{kind}', first failed at call 1 of 1"):
        with rsp.deferred_checks():
            rsp.per_user_metrics(s, pos, METRICS, exclude=exc, as_frame=False)


def test_masks_frames_and_factors_are_checked_at_once(accelerator_paths):
    """Inside a block, what reads anyway keeps its immediate error: masks (their widths), a DataFrame (copied to the
    host) and factors (NaN factors); those calls add nothing to the block."""
    s, pos, exc = _batches(1)[0]
    pm = torch.zeros(12, 300, dtype=torch.bool).scatter_(1, pos.clamp(min=0), True)
    em = pm.clone()  # every positive also excluded
    u, v = torch.randn(12, 4), torch.randn(300, 4)
    u[0, 0] = float("nan")
    bad = s.clone()
    bad[0, 0] = float("inf")
    with rsp.deferred_checks() as block:
        with pytest.raises(ValueError, match=r"^exclude: 12 row\(s\) exclude one of their own positives"):
            rsp.exact_ranks(s, pm, em)
        with pytest.raises(ValueError, match="^scores: NaN or inf in 1 of 12 rows"):
            rsp.per_user_metrics(bad, pos, METRICS, exclude=exc)
        with pytest.raises(ValueError, match="^user_factors: contains NaN"):
            rsp.per_user_metrics((u, v), pos, METRICS, exclude=exc, as_frame=False)
    assert block.calls == 0


def test_blocks_nest_and_an_error_inside_propagates_unread():
    """An inner block reads its own calls at its end; the outer one only its own. An exception raised in a block
    leaves it without the read (the block's own error would hide it)."""
    s, pos, exc = _batches(1)[0]
    bad = pos.clone()
    bad[0, 0] = 999
    with rsp.deferred_checks() as outer:
        rsp.exact_ranks(s, pos, exc)
        with pytest.raises(ValueError, match="first failed at call 1 of 1"):
            with rsp.deferred_checks():
                rsp.exact_ranks(s, bad, exc)
    assert outer.calls == 1
    with pytest.raises(KeyError):
        with rsp.deferred_checks():
            rsp.exact_ranks(s, bad, exc)
            raise KeyError("the caller's")
    assert getattr(_deferred._active, "block", None) is None


def test_replayed_calls_defer_their_flags(accelerator_paths, monkeypatch):
    """Calls replayed from a graph (the CPU's stand-in) keep their flags in the block as eager calls do: no read per
    call, the same results, a bad batch among them raised at the end with its call number."""
    monkeypatch.setattr(_graphs, "_fake", [True])
    monkeypatch.setattr(counting, "_backend", "auto")
    _graphs.clear()
    batches = _batches(6)
    s, pos, exc = batches[4]
    pos = pos.clone()
    pos[1, 1] = -5
    batches[4] = (s, pos, exc)
    replays = _graphs._stats["replays"]
    try:
        with pytest.raises(ValueError, match=r"^positives: item indices must lie .*first failed at call 9 of 12"):
            with rsp.deferred_checks():
                for s, pos, exc in batches:
                    (ranks, values), syncs = count_syncs(_calls, s, pos, exc)
                    assert syncs.count == 0, dict(syncs.calls)
        assert _graphs._stats["replays"] - replays == 2 * 5  # batches 2-6 of both calls (captured at the second)
    finally:
        _graphs.clear()


def test_seeded_sampled_ranks_defer_their_flags(accelerator_paths, monkeypatch):
    """``sampled_ranks`` on an accelerator (the CPU's stand-in: seeded draws, replayed) keeps its flags in the block:
    no read per call (one outside), the same ranks as outside; a batch whose row 2 has no item left to draw (every
    item a positive or excluded) is raised at the block's end with the pool's text and its call number."""
    monkeypatch.setattr(_graphs, "_fake", [True])
    monkeypatch.setattr(counting, "_backend", "auto")
    _graphs.clear()
    batches = _batches(4, n=30, e=0)

    def call(s, pos, exc):
        return rsp.sampled_ranks(s, pos, 10, generator=torch.Generator().manual_seed(0)).ranks

    call(*batches[0])  # the hash's constants cached on the device (copied there once per process)
    outside = [count_syncs(call, *batch) for batch in batches]
    assert all(syncs.count == 1 for _, syncs in outside), [dict(syncs.calls) for _, syncs in outside]
    full = torch.arange(30).expand(12, 30).clone()
    full[:, 3:] = -1
    full[2] = torch.arange(30)
    try:
        with rsp.deferred_checks():
            for (ranks, _), (s, pos, exc) in zip(outside, batches):
                got, syncs = count_syncs(call, s, pos, exc)
                assert syncs.count == 0 and torch.equal(got, ranks)
        with pytest.raises(ValueError, match=r"^n_samples: some row has too few .*first failed at call 2 of 3"):
            with rsp.deferred_checks():
                for positives in (batches[0][1], full, batches[1][1]):
                    call(batches[0][0], positives, None)
    finally:
        _graphs.clear()
