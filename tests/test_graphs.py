"""Calls replayed from captured graphs (``_graphs``): on CUDA real CUDA graphs; on a CPU the same bookkeeping with a
stand-in graph that replays by running the captured function on the captured inputs (``_graphs._FakeGraph``).
Oracle: the same calls with capture off (eager), bit for bit."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the tests' helpers (_budgets, _lightning_helpers)

from reco_sampled_plugin import _graphs, _inputs, counting, exact_ranks, per_user_metrics

METRICS = ("ndcg@10", "recall@5", "ap@10", "rr@10", "auc", "pr_auc")


def _accelerator_paths(monkeypatch):
    """The torch paths an accelerator runs (numpy's counting, sorts and mask scans are CPU-only: the stand-in graph
    would refuse their reads to numpy)."""
    monkeypatch.setattr(counting, "_numpy_blocked", [True])
    monkeypatch.setattr(counting, "_cpu_chunks", [False])
    monkeypatch.setattr(_inputs, "_numpy_scan", [False])


@pytest.fixture
def captured(device, monkeypatch):
    """Capture on ``device`` (a CPU through the stand-in graph, on the accelerators' torch paths), from a clean cache;
    the backend not eager."""
    monkeypatch.setattr(_graphs, "_fake", [device.type == "cpu"])
    monkeypatch.setattr(counting, "_backend", "auto")
    _accelerator_paths(monkeypatch)
    _graphs.clear()
    before = dict(_graphs._stats)
    yield lambda key: _graphs._stats[key] - before[key]
    _graphs.clear()


def _batch(seed: int, b: int = 12, n: int = 300, p: int = 4, e: int = 20, device="cpu", ties_grid: bool = False):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g)
    if ties_grid:  # few distinct values: ties everywhere
        scores = (scores * 2).round() / 2
    order = torch.argsort(torch.rand(b, n, generator=g), 1)
    pos, exc = order[:, :p].clone(), order[:, p : p + e].clone()
    pos[::3, -1] = -1  # padding
    exc[1::2, -2:] = -1
    return scores.to(device), pos.to(device), exc.to(device)


def _same_error(replayed_call, eager_call, kind: type = ValueError) -> str:
    """Both calls raise a ``kind`` error (the second with capture off), with the same message; returns it."""
    with pytest.raises(kind) as eager:
        _eager(eager_call)
    with pytest.raises(kind) as replayed:
        replayed_call()
    assert str(replayed.value) == str(eager.value)
    return str(eager.value)


def _same_states(have, want, names) -> None:
    """Equal states; a histogram's rows (removed items per row: 0 .. the padded width of positives and exclusions)
    may be more where the inputs were padded wider (a mask's power-of-two width): those rows hold nothing."""
    for name in names:
        a, b = getattr(have, name).nan_to_num(), getattr(want, name).nan_to_num()
        if name == "hist" and a.shape[1:] == b.shape[1:]:
            rows = min(a.shape[0], b.shape[0])
            assert not a[rows:].any() and not b[rows:].any(), name
            a, b = a[:rows], b[:rows]
        assert torch.equal(a, b), name


def _eager(fn, *args, **kwargs):
    """``fn`` with capture off."""
    saved = _graphs._fake[0]
    _graphs._fake[0] = False
    counting.set_backend("eager")  # turns capture off on every device (the eager kernels, as auto's below its bounds)
    try:
        return fn(*args, **kwargs)
    finally:
        _graphs._fake[0] = saved
        counting.set_backend("auto")


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
def test_replayed_calls_equal_eager_bit_for_bit(captured, device, ties):
    """Five batches of one shape (captured at the second, replayed from the third) and a shorter last batch seen twice:
    every result equals the eager call's, and the replays happened."""
    shapes = [12] * 5 + [7, 7]
    for i, b in enumerate(shapes):
        s, pos, exc = _batch(i, b=b, device=device, ties_grid=True)
        want = _eager(exact_ranks, s, pos, exc, ties=ties)
        assert torch.equal(exact_ranks(s, pos, exc, ties=ties), want)
        want_m = _eager(per_user_metrics, s, pos, METRICS, exclude=exc, ties=ties, as_frame=False)
        have_m = per_user_metrics(s, pos, METRICS, exclude=exc, ties=ties, as_frame=False)
        assert list(have_m) == list(want_m)
        for k in want_m:
            assert torch.equal(have_m[k].nan_to_num(-7.0), want_m[k].nan_to_num(-7.0)), k
    assert captured("captures") == 4  # two calls x two shapes
    assert captured("replays") == 2 * 4 + 2 * 1  # a capture replays at once: batches 2-5 of 12 users, the second of 7


def test_one_positive_per_row_is_replayed_as_its_column(captured, device):
    """(B,) positives (one item per row) are captured as their (B, 1) view: the same ranks, shapes and metrics as
    eagerly, replayed from the third call; a (B,) tensor of another length is not captured and raises as eagerly."""
    for i in range(4):
        s, pos, exc = _batch(i, device=device, ties_grid=True)
        one = pos[:, 0].contiguous()
        assert torch.equal(exact_ranks(s, one, exc), _eager(exact_ranks, s, one, exc))
        have = per_user_metrics(s, one, METRICS, exclude=exc, as_frame=False)
        want = _eager(per_user_metrics, s, one, METRICS, exclude=exc, as_frame=False)
        assert all(torch.equal(have[k].nan_to_num(-7.0), want[k].nan_to_num(-7.0)) for k in want)
    assert captured("captures") == 2 and captured("replays") == 2 * 3
    assert exact_ranks(s, one, exc).shape == (12, 1)
    _same_error(lambda: exact_ranks(s, one[:5], exc), lambda: exact_ranks(s, one[:5], exc))


def test_frames_from_replays_equal_eager(captured, device):
    for i in range(4):
        s, pos, exc = _batch(i, device=device)
        want = _eager(per_user_metrics, s, pos, METRICS, exclude=exc)
        have = per_user_metrics(s, pos, METRICS, exclude=exc)
        assert have.equals(want)
    assert captured("replays") >= 2


def test_results_are_the_callers_own(captured, device):
    """A replay writes the graph's own outputs: what an earlier call returned is not overwritten."""
    got, want = [], []
    for i in range(4):
        s, pos, exc = _batch(i, device=device)
        got.append(exact_ranks(s, pos, exc))
        want.append(_eager(exact_ranks, s, pos, exc))
    assert all(torch.equal(g, w) for g, w in zip(got, want))
    assert captured("replays") >= 2


@pytest.mark.parametrize("buffers", [1, 2, 0], ids=["one_block", "two_blocks_in_turn", "new_every_call"])
def test_large_scores_are_read_in_place(captured, device, monkeypatch, buffers):
    """Scores above ``_COPY_ELEMENTS`` are read where they are, their address part of the signature: scores written
    into one block each batch are captured at the second call, two blocks in turn at the third and fourth; scores at a
    new address every call are never captured (no copy of a score batch is kept). Right every time."""
    monkeypatch.setattr(_graphs, "_COPY_ELEMENTS", 1000)
    blocks = [torch.empty(12, 300, device=device) for _ in range(buffers)]
    kept = []  # every call's own scores alive: new addresses each time
    for i in range(6):
        s, pos, exc = _batch(i, device=device)
        if blocks:
            s = blocks[i % buffers].copy_(s)
        kept.append(s)
        assert torch.equal(exact_ranks(s, pos, exc), _eager(exact_ranks, s, pos, exc))
    assert captured("captures") == buffers and captured("replays") == {1: 5, 2: 4, 0: 0}[buffers]
    for (base, addresses), entry in _graphs._graphs.items():
        assert addresses == (blocks[0].data_ptr(),) or addresses == (blocks[1].data_ptr(),)
        assert entry.buffers[0] is None and all(b is not None for b in entry.buffers[1:])  # scores in place


def test_invalid_batch_after_capture_raises_the_eager_error(captured, device):
    """A replayed batch's checks are read back: an out-of-range positive, a positive also excluded or a NaN score
    raises the eager call's error, and a valid batch after it is replayed as before."""
    for i in range(3):
        exact_ranks(*_batch(i, device=device))
        per_user_metrics(*_batch(i, device=device)[:2], METRICS, exclude=_batch(i, device=device)[2], as_frame=False)
    s, pos, exc = _batch(9, device=device)
    bad_pos = pos.clone()
    bad_pos[2, 0] = 300
    clash = exc.clone()
    clash[4, 0] = pos[4, 0]
    nan = s.clone()
    nan[5, 3] = float("nan")
    for args in ((s, bad_pos, exc), (s, pos, clash), (nan, pos, exc)):
        with pytest.raises(ValueError) as eager:
            _eager(exact_ranks, *args)
        with pytest.raises(ValueError) as replayed:
            exact_ranks(*args)
        assert str(replayed.value) == str(eager.value)
        with pytest.raises(ValueError) as eager:
            _eager(per_user_metrics, args[0], args[1], METRICS, exclude=args[2], as_frame=False)
        with pytest.raises(ValueError) as replayed:
            per_user_metrics(args[0], args[1], METRICS, exclude=args[2], as_frame=False)
        assert str(replayed.value) == str(eager.value)
    replays = captured("replays")
    assert torch.equal(exact_ranks(s, pos, exc), _eager(exact_ranks, s, pos, exc))
    assert captured("replays") == replays + 1


def test_a_failed_capture_runs_eagerly_from_then_on(captured, device, monkeypatch):
    def refuse(self, fn, inputs):
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(_graphs._FakeGraph, "capture", refuse)
    monkeypatch.setattr(_graphs._CudaGraph, "capture", refuse)
    for i in range(4):
        s, pos, exc = _batch(i, device=device)
        assert torch.equal(exact_ranks(s, pos, exc), _eager(exact_ranks, s, pos, exc))
    assert captured("failures") == 1 and captured("replays") == 0
    assert not _graphs._graphs and len(_graphs._failed) == 1


def test_a_read_back_while_capturing_is_refused_and_runs_eagerly(captured, device, monkeypatch):
    """The stand-in graph refuses what a capture refuses (here ``tie_expectation``'s reciprocal-rank grid read back its
    width, as it still does without a cut-off): the call then runs eagerly, right, and nothing is captured; with a
    cut-off (rr@10) the grid is k wide, nothing read, and the call is captured."""
    for metrics, captures in ((("rr",), 0), (("rr@10",), 1)):
        _graphs.clear()
        before = _graphs._stats["captures"]
        for i in range(3):
            s, pos, exc = _batch(i, device=device, ties_grid=True)
            have = per_user_metrics(s, pos, metrics, exclude=exc, ties="average", as_frame=False)
            want = _eager(per_user_metrics, s, pos, metrics, exclude=exc, ties="average", as_frame=False)
            (name,) = want
            assert torch.equal(have[name].nan_to_num(-7.0), want[name].nan_to_num(-7.0))
        assert _graphs._stats["captures"] - before == captures


def test_captured_calls_are_bounded(captured, device):
    """At most ``_MAX_GRAPHS`` captured calls; signatures seen once hold nothing; while every held graph is in use, a
    new signature runs eagerly (no capture evicts one in use), and one held graph unused for ``_STALE`` calls makes
    room for it."""
    for b in range(3, 3 + _graphs._MAX_GRAPHS + 3):
        for i in range(2):
            exact_ranks(*_batch(i, b=b, device=device))
    assert len(_graphs._graphs) == _graphs._MAX_GRAPHS
    assert captured("captures") == _graphs._MAX_GRAPHS  # the last 3 were held back: nothing stale to evict
    for _ in range(_graphs._STALE + 1):  # calls of the last held signatures only: the first held one goes stale
        exact_ranks(*_batch(0, b=2 + _graphs._MAX_GRAPHS, device=device))
    late = _batch(0, b=3 + _graphs._MAX_GRAPHS, device=device)
    exact_ranks(*late)
    assert captured("captures") == _graphs._MAX_GRAPHS + 1 and len(_graphs._graphs) == _graphs._MAX_GRAPHS


def test_a_loop_over_more_signatures_than_fit_keeps_replaying_what_it_holds(captured, device, monkeypatch):
    """Four signatures in turn with room for two, five rounds: the two held are replayed every round after their
    capture and the other two run eagerly; none is captured again (a least-recently-used rule would capture every
    call and replay none)."""
    monkeypatch.setattr(_graphs, "_MAX_GRAPHS", 2)
    batches = [_batch(0, b=b, device=device) for b in (3, 4, 5, 6)]
    for _ in range(5):
        for batch in batches:
            assert torch.equal(exact_ranks(*batch), _eager(exact_ranks, *batch))
    assert (captured("captures"), captured("replays")) == (2, 2 * 4)


def test_replays_advance_the_counting_clock(captured, device):
    """The ``auto`` backend compiles after so many comparisons: a replay (no Python of the kernels) counts its work
    as the eager call does."""
    s, pos, exc = _batch(0, device=device)
    steps = []
    for _ in range(4):
        before = counting.work_done()
        exact_ranks(s, pos, exc)
        steps.append(counting.work_done() - before)
    assert captured("replays") == 3 and steps[0] > 0
    assert steps == [steps[0]] * 4


def test_eager_backend_and_other_inputs_are_not_captured(captured, device, monkeypatch):
    """The eager backend and ``RECO_SAMPLED_GRAPHS=off`` turn capture off; masks (their widths are read back), a generator, random ties and relevance
    are never captured."""
    s, pos, exc = _batch(0, device=device)
    counting.set_backend("eager")
    for _ in range(3):
        exact_ranks(s, pos, exc)
    counting.set_backend("auto")
    monkeypatch.setattr(_graphs, "_switched_on", [False])  # RECO_SAMPLED_GRAPHS=off
    for _ in range(3):
        exact_ranks(s, pos, exc)
    monkeypatch.setattr(_graphs, "_switched_on", [True])
    mask = torch.zeros(s.shape[0], s.shape[1] + 1, dtype=torch.bool, device=device)
    mask = mask.scatter_(1, torch.where(pos >= 0, pos, s.shape[1]), True)[:, :-1]  # padding to the dropped column
    for _ in range(3):
        exact_ranks(s, mask, exc)
        exact_ranks(s, pos, exc, ties="random", generator=torch.Generator(device=device).manual_seed(0))
        per_user_metrics(s, pos, ("ndcg@10",), exclude=exc, relevance=torch.ones_like(s), as_frame=False)
    assert captured("captures") == 0 and not _graphs._graphs


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 9), n=st.integers(12, 60), p=st.integers(1, 5), e=st.integers(0, 6),
       ties=st.sampled_from(["pessimistic", "optimistic", "average"]), grid=st.booleans(), seed=st.integers(0, 99))
def test_replays_equal_eager_on_any_shape(b, n, p, e, ties, grid, seed):
    """Any shape, padding and tie pattern on a CPU's stand-in graph: the third call of a shape is replayed and equals
    eager."""
    saved = _graphs._fake[0], counting._numpy_blocked[0], counting._cpu_chunks[0], _inputs._numpy_scan[0]
    _graphs._fake[0], counting._numpy_blocked[0], counting._cpu_chunks[0], _inputs._numpy_scan[0] = True, True, False, False
    _graphs.clear()
    try:
        for i in range(3):
            s, pos, exc = _batch(seed + i, b=b, n=n, p=p, e=e, ties_grid=grid)
            exc = exc if e else None
            want = _eager(exact_ranks, s, pos, exc, ties=ties)
            assert torch.equal(exact_ranks(s, pos, exc, ties=ties), want)
        assert _graphs._stats["replays"] > 0
    finally:
        _graphs._fake[0], counting._numpy_blocked[0], counting._cpu_chunks[0], _inputs._numpy_scan[0] = saved
        _graphs.clear()


@pytest.mark.parametrize("captured_in", ["inference_mode", "grad_mode"])
def test_replays_inside_and_outside_inference_mode(captured, device, captured_in):
    """A graph captured inside ``torch.inference_mode()`` (a Lightning validation loop) replays outside it and the
    reverse; the results returned outside it are ordinary tensors (usable in place and by autograd); scores that
    require grad are ranked the same."""
    calls = []
    for i in range(5):
        s, pos, exc = _batch(i, device=device)
        inside = (i < 2) == (captured_in == "inference_mode")
        if i == 4:
            s = s.clone().requires_grad_(True)
        with torch.inference_mode(inside):
            calls.append((inside, exact_ranks(s, pos, exc), _eager(exact_ranks, s.detach(), pos, exc)))
    assert captured("replays") == 4
    for inside, have, want in calls:
        assert torch.equal(have, want)
        if not inside:
            assert not have.is_inference()
            have += 1  # an ordinary tensor


def test_exact_update_replayed_equals_eager_states(captured, device, monkeypatch):
    """``ExactRankingMetrics.update`` of index inputs on a device that defers its checks: replayed updates leave the
    states (sums, count, failed checks) and the values of eager updates, an invalid batch among them refused at
    compute with the eager update's message."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)  # a CPU defers as an accelerator does
    metrics = ("ndcg@10", "recall@5", "auc", "rr@10")
    have, want = (tm.ExactRankingMetrics(metrics).to(device) for _ in range(2))
    batches = [_batch(i, device=device) for i in range(5)]
    bad = batches[3][1].clone()
    bad[2, 0] = 300  # out of range: counted as padding, refused at compute
    batches[3] = (batches[3][0], bad, batches[3][2])
    for s, pos, exc in batches:
        have.update(s, pos, exc)
        _eager(want.update, s, pos, exc)
    assert captured("replays") == 4
    _same_states(have, want, ("sums", "count", "failed_checks"))
    assert "first failed at update 4" in _same_error(have.compute, want.compute)
    # a new metric whose updates are all replays (captured by another): the messages its checks had come from the capture
    other, eager_other = (tm.ExactRankingMetrics(metrics).to(device) for _ in range(2))
    replays = captured("replays")
    other.update(*batches[3])
    _eager(eager_other.update, *batches[3])
    with pytest.raises(ValueError) as replayed:
        other.compute()
    assert captured("replays") == replays + 1
    assert str(replayed.value) == str(pytest.raises(ValueError, eager_other.compute).value)
    have.reset(), want.reset()
    for s, pos, exc in batches[:3]:
        have.update(s, pos, exc)
        _eager(want.update, s, pos, exc)
    assert {k: torch.equal(v, want.compute()[k]) for k, v in have.compute().items()} == dict.fromkeys(want.compute(), True)


def test_a_replayed_call_dispatches_a_few_operators_besides_its_graph(captured, device, monkeypatch):
    """The CPU proxy of a replay's cost: the operators a replayed call dispatches outside its graph (copies of small
    inputs, copies of the outputs, the flags read, the states' additions) are at most 10 (12 for the updates from
    factors: the user factors and bias copied too; 14 with an exact share: its rows and overflow flag copied out and
    added to their states; ``sampled_ranks``: its seed drawn and copied in) with the scores and the item factors read
    in place (as at scale), whatever the call dispatches eagerly (68-322 on an accelerator's path)."""
    from _budgets import OpCounter
    from reco_sampled_plugin import SamplingDesign, exact_ranks_from_factors, sampled_ranks
    from reco_sampled_plugin.adapters import torchmetrics as tm

    _outside_graphs(device, monkeypatch)
    metric = tm.ExactRankingMetrics(METRICS).to(device)
    sampled = _sampled(tm, device)
    shared = _sampled(tm, device, SamplingDesign(20, exact_share=0.3))
    s, pos, exc = _batch(0, device=device)
    u, v, bias = _factors(0, device=device)
    calls = {"exact_ranks": lambda: exact_ranks(s, pos, exc),
             "SampledRankingMetrics.update, exact share": lambda: shared.update(s, pos, exc),
             "per_user_metrics": lambda: per_user_metrics(s, pos, METRICS, exclude=exc, as_frame=False),
             "ExactRankingMetrics.update": lambda: metric.update(s, pos, exc),
             "SampledRankingMetrics.update": lambda: sampled.update(s, pos, exc),
             "ExactRankingMetrics.update_factors": lambda: metric.update_factors(u, v, pos, exc, item_bias=bias),
             "SampledRankingMetrics.update_factors": lambda: sampled.update_factors(u, v, pos, exc, item_bias=bias),
             "exact_ranks_from_factors": lambda: exact_ranks_from_factors(u, v, pos, exclude=exc, item_bias=bias),
             "sampled_ranks": lambda: sampled_ranks(s, pos, 20, exclude=exc),
             "per_user_metrics of factors": lambda: per_user_metrics((u, v, bias), pos, METRICS, exclude=exc,
                                                                     as_frame=False)}
    for name, fn in calls.items():
        _graphs.clear()  # room for each call's graph (more calls than _MAX_GRAPHS)
        for _ in range(2):
            fn()
        replays = captured("replays")
        with OpCounter() as ops:
            fn()
        eager = OpCounter()
        with eager:
            _eager(fn) if device.type == "cpu" else None
        assert captured("replays") == replays + 1, name
        # + u and bias copied; an exact share's rows and overflow copied out and added to its states
        assert ops.count <= 10 + 2 * ("update_factors" in name) + 4 * ("share" in name), (name, dict(ops.calls))
        assert device.type != "cpu" or eager.count >= 60, (name, eager.count)


@pytest.mark.parametrize("protocol", ["scores", "factors"])
@pytest.mark.parametrize("one_positive", [False, True])
@pytest.mark.parametrize("exclusions", ["index", "mask"])
def test_the_callback_batch_runs_in_its_graphs(captured, device, monkeypatch, protocol, one_positive, exclusions):
    """The Lightning callback's batch (``on_validation_batch_end``) of padded index inputs ((B, P) or (B,)
    positives), with ids and a keep mask (a DistributedSampler's padding), scores or factors: its preparation and
    checks run inside the two updates' graphs, so outside them it dispatches at most 31 operators (per update its
    inputs copied into the graph, its outputs copied out, its flags and states added: 10-13; the rows' positions and
    keep mask: 5), where preparing the inputs once for both updates dispatched 56-63, and reads nothing back; its
    states equal those of the same batches with capture off. Mask exclusions are turned into padded indices (a
    power-of-two width) before the graphs: one read (their width and the scan's size, with the checks; no
    ``nonzero``; the positives looked up in the mask with them) and at most 99 operators outside the graphs (95-106
    and two reads before)."""
    from types import SimpleNamespace

    from _budgets import OpCounter, SyncCounter
    from reco_sampled_plugin.adapters import lightning as lt
    from reco_sampled_plugin.adapters import torchmetrics as tm

    _outside_graphs(device, monkeypatch)
    s, pos, exc = _batch(0, device=device)
    u, v, bias = _factors(0, device=device)
    positives = pos[:, 0] if one_positive else pos
    inputs = {"scores": s} if protocol == "scores" else {"user_factors": u, "item_factors": v, "item_bias": bias}
    if exclusions == "mask":
        exc = torch.zeros(12, 300, dtype=torch.bool, device=device).scatter_(1, exc.clamp(min=0), exc >= 0)
    out = dict(inputs, positives=positives, exclude=exc, ids=torch.arange(12, device=device))
    sampler = SimpleNamespace(rank=0, num_replicas=1, num_samples=12, total_size=12, drop_last=False,
                              dataset=range(11))  # 11 users: the last row a padding repeat, dropped
    trainer = SimpleNamespace(sanity_checking=False)
    settings = lt.RankingSettings(METRICS, n_samples=20, estimators=("none",))
    callbacks = [lt.RankingMetricsCallback(settings, progress=False) for _ in range(2)]
    for cb in callbacks:
        state = lt._LoaderState(tm.ExactRankingMetrics.from_settings(settings).to(device),
                                tm.SampledRankingMetrics.from_settings(settings).to(device), sampler)
        cb._state = lambda *args, state=state: state
    have, want = callbacks

    def batch(cb) -> None:  # the same 12 rows each time (an epoch's first batch)
        cb._state().rows = 0
        cb._batch_end(trainer, None, out, None, "validate", 0)

    for _ in range(2):  # seen, then captured
        batch(have)
    replays = captured("replays")
    with OpCounter() as ops:
        batch(have)
    with SyncCounter() as syncs:
        batch(have)
    for _ in range(4):
        _eager(batch, want)
    assert captured("captures") == 2 and captured("replays") == replays + 4  # both updates, twice
    most, reads = (31, {}) if exclusions == "index" else (99, {"tolist": 1})
    assert ops.count <= most and dict(syncs.calls) == reads, (ops.count, dict(ops.calls), dict(syncs.calls))
    a, b = have._state(), want._state()
    _same_states(a.exact, b.exact, ("sums", "count", "failed_checks"))
    _same_states(a.sampled, b.sampled, SAMPLED_STATES)
    # 4 batches of 11 kept users: 4 slots each, 4 of them padding (or one positive each)
    assert float(a.exact.count) == 4 * (11 if one_positive else 11 * 4 - 4)


def test_a_callback_batch_of_mismatched_rows_is_refused_before_any_change(captured, device, monkeypatch):
    """Index positives of another row count than the scores are not taken for capture: the callback's batch raises
    the prepared path's ValueError before its row counter or either metric's update count moves."""
    from types import SimpleNamespace

    from reco_sampled_plugin.adapters import lightning as lt
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    s, pos, exc = _batch(0, device=device)
    settings = lt.RankingSettings(METRICS, n_samples=20, estimators=("none",))
    cb = lt.RankingMetricsCallback(settings, progress=False)
    state = lt._LoaderState(tm.ExactRankingMetrics.from_settings(settings).to(device),
                            tm.SampledRankingMetrics.from_settings(settings).to(device), None)
    cb._state = lambda *args: state
    trainer = SimpleNamespace(sanity_checking=False)
    for bad in ({"positives": pos[:-1], "exclude": exc}, {"positives": pos, "exclude": exc[:-1]}):
        with pytest.raises(ValueError, match=r"expected shape \(12, P\)"):
            cb._batch_end(trainer, None, dict(bad, scores=s), None, "validate", 0)
        assert (state.rows, state.exact._update_count, state.sampled._update_count) == (0, 0, 0)
    assert captured("captures") == 0


def _outside_graphs(device, monkeypatch) -> None:
    """Count what a replayed call dispatches outside its graph, as at scale: the stand-in's replay (a CPU) runs with no
    mode (its operators are the graph's, not counted), the accelerators' path of the adapters (nothing read), the
    scores and item factors read in place (more than ``_COPY_ELEMENTS``)."""
    from torch.utils._python_dispatch import _disable_current_modes

    from reco_sampled_plugin.adapters import torchmetrics as tm

    if device.type == "cpu":
        replay = _graphs._FakeGraph.replay
        monkeypatch.setattr(_graphs._FakeGraph, "replay", lambda self: _no_modes(replay, self, _disable_current_modes))
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    monkeypatch.setattr(_graphs, "_COPY_ELEMENTS", 1000)


def _no_modes(fn, arg, disable):
    with disable():
        return fn(arg)


def _factors(seed: int, b: int = 12, n: int = 300, d: int = 5, device="cpu"):
    """Small integer factors and half-integer biases: every score exact, many ties."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randint(-2, 3, (b, d), generator=g).float()
    v = torch.randint(-2, 3, (n, d), generator=g).float()
    bias = torch.randint(-3, 4, (n,), generator=g).float() / 2
    return u.to(device), v.to(device), bias.to(device)


@pytest.mark.parametrize("ties", ["pessimistic", "average"])
@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_factor_calls_replayed_equal_eager(captured, device, monkeypatch, ties, with_bias):
    """``per_user_metrics`` and ``exact_ranks_from_factors`` on factors: replayed (the item factors read in place,
    their norm computed in the graph, never from the cache) equal to eager, dict and frame; a replayed batch with NaN
    factors raises the eager error; item factors scaled in place past the overflow bound after the capture are ranked
    as eagerly (the graph's fresh norm flags them, the call runs eagerly on the materialized scores)."""
    from reco_sampled_plugin import exact_ranks_from_factors, factor_ranks

    monkeypatch.setattr(_graphs, "_COPY_ELEMENTS", 1000)  # the item factors (1,500 numbers) read in place
    monkeypatch.setattr(factor_ranks, "_item_norm_on_device", None)  # any use of the cache in a capture would fail
    _, v, bias = _factors(0, device=device)
    bias = bias if with_bias else None
    metrics = ("ndcg@10", "recall@5", "auc", "rr@10")
    for i in range(4):
        u = _factors(i + 1, device=device)[0]
        _, pos, exc = _batch(i, device=device)
        f = (u, v) if bias is None else (u, v, bias)
        want = _eager(per_user_metrics, f, pos, metrics, exclude=exc, ties=ties, as_frame=False)
        have = per_user_metrics(f, pos, metrics, exclude=exc, ties=ties, as_frame=False)
        assert all(torch.equal(have[k].nan_to_num(-7.0), want[k].nan_to_num(-7.0)) for k in want)
        kw = dict(exclude=exc, ties=ties, item_bias=bias)
        assert torch.equal(exact_ranks_from_factors(u, v, pos, **kw), _eager(exact_ranks_from_factors, u, v, pos, **kw))
    assert captured("captures") == 2 and captured("replays") == 6
    assert per_user_metrics(f, pos, metrics, exclude=exc, ties=ties).equals(
        _eager(per_user_metrics, f, pos, metrics, exclude=exc, ties=ties))
    nan_u = u.clone()
    nan_u[3, 1] = float("nan")
    for call in (lambda x: per_user_metrics((x, v) if bias is None else (x, v, bias), pos, metrics, exclude=exc,
                                            ties=ties, as_frame=False),
                 lambda x: exact_ranks_from_factors(x, v, pos, exclude=exc, ties=ties, item_bias=bias)):
        with pytest.raises(ValueError) as eager:
            _eager(call, nan_u)
        with pytest.raises(ValueError) as replayed:
            call(nan_u)
        assert str(replayed.value) == str(eager.value)
    v.mul_(1e38)  # in place, the same address: scores overflow float32 (the eager path refuses them)
    replays = captured("replays")
    outcomes = []
    for run in (lambda: exact_ranks_from_factors(u, v, pos, exclude=exc, ties=ties, item_bias=bias),
                lambda: _eager(exact_ranks_from_factors, u, v, pos, exclude=exc, ties=ties, item_bias=bias)):
        try:
            outcomes.append(run())
        except ValueError as exc_info:
            outcomes.append(str(exc_info))
    assert captured("replays") == replays + 1
    assert type(outcomes[0]) is type(outcomes[1]) is str  # the materialized scores refused, replayed or not
    assert outcomes[0] == outcomes[1] if isinstance(outcomes[0], str) else torch.equal(outcomes[0], outcomes[1])


@pytest.mark.parametrize("with_keep", [True, False], ids=["keep", "no_keep"])
def test_exact_update_padded_replayed_equals_eager_states(captured, device, monkeypatch, with_keep):
    """``ExactRankingMetrics.update_padded`` (the Lightning callback's call: validated padded inputs, a keep mask per
    batch): replayed updates leave the eager updates' states, each batch's own keep mask applied."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    have, want = (tm.ExactRankingMetrics(("ndcg@10", "auc"), ties="average").to(device) for _ in range(2))
    for i in range(5):
        s, pos, exc = _batch(i, device=device, ties_grid=True)
        keep = (torch.arange(12, device=device) % (i + 2) != 0) if with_keep else None
        have.update_padded(s, pos, exc, keep)
        _eager(want.update_padded, s, pos, exc, keep)
    assert captured("replays") == 4
    _same_states(have, want, ("sums", "count", "failed_checks"))


def rsp_exact_ranks_shape(pm: torch.Tensor, device) -> tuple[int, ...]:
    """The shape of ``exact_ranks`` of mask positives (on ``device``, capture on): the widest row's, as on a CPU."""
    return tuple(exact_ranks(torch.randn(pm.shape, device=device), pm).shape)


def _factor_batches(k: int, with_bias: bool, device, overflow: bool = False):
    """``k`` factor batches (u, v, bias or None, positives, exclusions): NaN user factors in the 4th, and with
    ``overflow`` user factors past float32 scores' bound in the 5th."""
    for i in range(k):
        u, v, bias = _factors(i, device=device)
        if i == 3:
            u = u.clone()
            u[4, 1] = float("nan")
        if i == 4 and overflow:
            u = u * 1e38  # past the overflow bound of float32 scores
        _, pos, exc = _batch(i, device=device)
        yield i, u, v, bias if with_bias else None, pos, exc


SAMPLED_STATES = ("hist", "n_items", "failed_checks")


def _sampled(tm, device, design=20, estimators=("none", "bv"), **kwargs):
    return tm.SampledRankingMetrics(("ndcg@10", "recall@5", "auc"), design, estimators, seed=3, **kwargs).to(device)


def test_sampled_update_replayed_equals_eager_states(captured, device, monkeypatch):
    """``SampledRankingMetrics.update`` (a fixed-m uniform design) of index inputs where checks are deferred: replayed
    updates leave the eager updates' states (histogram, catalogue, failed checks) bit for bit, with the default ids
    (a running row counter, outside the graph) and with given ids, a histogram that grows with a later batch's
    exclusions, and an invalid batch refused at compute with the eager update's message."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    have, want = _sampled(tm, device), _sampled(tm, device)
    batches = [_batch(i, device=device) for i in range(5)] + [_batch(9, e=30, device=device) for _ in range(3)]
    bad = batches[3][1].clone()
    bad[2, 0] = 300  # out of range: counted as padding, refused at compute
    batches[3] = (batches[3][0], bad, batches[3][2])
    for i, (s, pos, exc) in enumerate(batches):
        ids = None if i % 2 else torch.arange(100 * i, 100 * i + 12, device=device)
        have.update(s, pos, exc, ids=ids)
        _eager(want.update, s, pos, exc, ids=ids)
    assert captured("replays") == 4 + 2 and have.hist.shape[0] == 34  # batches 2-5, then 2-3 of the wider ones
    _same_states(have, want, SAMPLED_STATES)
    assert "first failed at update 4" in _same_error(have.compute, want.compute)
    have.reset(), want.reset()
    for s, pos, exc in batches[:3]:
        have.update(s, pos, exc)
        _eager(want.update, s, pos, exc)
    assert have._rows_seen == want._rows_seen == 36
    assert {k: torch.equal(v, want.compute()[k]) for k, v in have.compute().items()} == dict.fromkeys(want.compute(), True)


@pytest.mark.parametrize("with_keep", [True, False], ids=["keep", "no_keep"])
def test_sampled_update_padded_replayed_equals_eager_states(captured, device, monkeypatch, with_keep):
    """``SampledRankingMetrics.update_padded`` (the Lightning callback's call: padded inputs, ids and a keep mask per
    batch): replayed updates leave the eager updates' states."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    have, want = _sampled(tm, device, ties="optimistic"), _sampled(tm, device, ties="optimistic")
    for i in range(5):
        s, pos, exc = _batch(i, device=device, ties_grid=True)
        ids = torch.arange(12 * i, 12 * i + 12, device=device)
        keep = (torch.arange(12, device=device) % (i + 2) != 0) if with_keep else None
        have.update_padded(s, pos, exc, ids, keep)
        _eager(want.update_padded, s, pos, exc, ids, keep)
    assert captured("replays") == 4
    _same_states(have, want, SAMPLED_STATES)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_sampled_factor_updates_replayed_equal_eager_states(captured, device, monkeypatch, with_bias):
    """``SampledRankingMetrics.update_factors`` (raw index inputs, the factors' finiteness checked) and
    ``update_factors_padded`` (the Lightning callback's call: the positives' scores from the exact update, ids, a keep
    mask) replayed leave the eager updates' states and update counts; NaN factors in one batch are refused at compute
    with the eager message."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    (have, want), (have_p, want_p) = ((_sampled(tm, device) for _ in range(2)) for _ in range(2))
    exact = tm.ExactRankingMetrics(("ndcg@10",)).to(device)
    for i, u, v, bias, pos, exc in _factor_batches(5, with_bias, device):
        have.update_factors(u, v, pos, exc, item_bias=bias)
        _eager(want.update_factors, u, v, pos, exc, item_bias=bias)
        s_pos = _eager(exact.update_factors_padded, u, v, bias, pos, exc)
        ids = torch.arange(12 * i, 12 * i + 12, device=device)
        keep = torch.arange(12, device=device) % (i + 2) != 0
        have_p.update_factors_padded(u, v, bias, pos, exc, ids, keep, s_pos)
        _eager(want_p.update_factors_padded, u, v, bias, pos, exc, ids, keep, s_pos)
    assert captured("replays") == 2 * 4
    for a, b in ((have, want), (have_p, want_p)):
        assert a._update_count == b._update_count == 5
        _same_states(a, b, SAMPLED_STATES)
    assert "first failed at update 4" in _same_error(have.compute, want.compute)


@pytest.mark.parametrize("with_bias", [True, False], ids=["bias", "no_bias"])
def test_exact_factor_updates_replayed_equal_eager_states(captured, device, monkeypatch, with_bias):
    """``ExactRankingMetrics.update_factors`` and ``update_factors_padded`` (the Lightning callback's call: a keep mask,
    the positives' scores returned for the sampled update) replayed leave the eager updates' states and update counts
    and return their scores; NaN factors and factors that could overflow are refused at compute with the eager
    messages (the overflow bound computed in the graph)."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    from torch.overrides import _get_current_function_mode_stack

    from reco_sampled_plugin import factor_ranks

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    cached = factor_ranks._item_norm_on_device

    def never_in_a_capture(v):  # a graph must not read the cached norm (the eager updates do)
        assert not any(isinstance(m, _graphs._NoReadBack) for m in _get_current_function_mode_stack())
        return cached(v)

    monkeypatch.setattr(factor_ranks, "_item_norm_on_device", never_in_a_capture)
    (have, want), (have_p, want_p) = ((tm.ExactRankingMetrics(("ndcg@10", "auc"), ties="average").to(device)
                                       for _ in range(2)) for _ in range(2))
    for i, u, v, bias, pos, exc in _factor_batches(6, with_bias, device, overflow=True):
        have.update_factors(u, v, pos, exc, item_bias=bias)
        _eager(want.update_factors, u, v, pos, exc, item_bias=bias)
        keep = torch.arange(12, device=device) % (i + 2) != 0
        got = have_p.update_factors_padded(u, v, bias, pos, exc, keep)
        expected = _eager(want_p.update_factors_padded, u, v, bias, pos, exc, keep)
        assert torch.equal(got.nan_to_num(), expected.nan_to_num())
    assert captured("replays") == 2 * 5
    for a, b in ((have, want), (have_p, want_p)):
        assert a._update_count == b._update_count == 6
        _same_states(a, b, ("sums", "count", "failed_checks"))
        message = _same_error(a.compute, b.compute)
        assert "first failed at update 4" in message and "'factors_overflow' (update 5)" in message


@pytest.mark.parametrize("inputs", ["masks", "index", "one positive"])
@pytest.mark.parametrize("protocol", ["step", "factors"])
def test_lightning_callback_replayed_equals_eager(captured, device, monkeypatch, tmp_path, protocol, inputs):
    """A real Trainer's validation epochs with the callback (exact and sampled metrics) where checks are deferred:
    batches replayed from graphs (masks: each batch's mask-derived widths in powers of two; padded indices, with (B,
    P) or (B,) positives: their own shapes, prepared inside the graphs) give the values of the same epochs with capture
    off, estimate for estimate."""
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader

    import _lightning_helpers as H
    from reco_sampled_plugin.adapters import torchmetrics as tm
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    settings = RankingSettings(("ndcg@10", "hit@5", "auc"), n_samples=20, estimators=("none", "bv"), max_n_groups=None)

    def epochs() -> list[dict[str, float]]:
        cb = RankingMetricsCallback(settings)
        trainer = pl.Trainer(callbacks=[cb], accelerator="gpu" if device.type == "cuda" else "cpu", devices=1,
                             logger=False, enable_checkpointing=False, enable_model_summary=False,
                             enable_progress_bar=False, default_root_dir=str(tmp_path))
        model = H.SyntheticModule(protocol=protocol)
        out = []
        for _ in range(3):
            data = H.UserDataset() if inputs == "masks" else H.IndexedUserDataset(one_positive=inputs == "one positive")
            trainer.validate(model, DataLoader(data, batch_size=8), verbose=False)
            out.append({k: e.value for k, e in cb.results["validate"].items()})
        return out

    replayed = epochs()
    # per epoch 5 batches (4 of 8 users, 1 of 5) x 2 updates: the 4 full batches one signature per update (masks:
    # their widths in powers of two), so 4 captures (2 shapes x 2 updates) and every later call replayed
    assert (captured("captures"), captured("replays"), captured("failures")) == (4, 26, 0)
    assert replayed == _eager(epochs) and len(replayed[0]) == 3 * 3


def test_mask_widths_come_in_powers_of_two_where_calls_are_replayed(captured, device):
    """``prepare_index(bucket=True)`` (the Lightning callback's) of masks where graphs capture: each mask's indices
    padded to the next power of two of its widest row (then batches share shapes), the same entries in the same
    order; without ``bucket`` (every other caller: their results keep their shapes) or capture, the widest row's."""
    from reco_sampled_plugin.ranking import prepare_index

    g = torch.Generator().manual_seed(5)
    pm = torch.rand(6, 300, generator=g) < 0.01
    em = (torch.rand(6, 300, generator=g) < 0.09) & ~pm
    pos, exc = prepare_index(pm.to(device), em.to(device), 6, 300, device, bucket=True)
    plain_pos, plain_exc = _eager(prepare_index, pm.to(device), em.to(device), 6, 300, device, bucket=True)
    unbucketed = prepare_index(pm.to(device), em.to(device), 6, 300, device)
    assert torch.equal(unbucketed[0], plain_pos) and torch.equal(unbucketed[1], plain_exc)
    assert rsp_exact_ranks_shape(pm.to(device), device) == (6, plain_pos.shape[1])
    for got, want in ((pos, plain_pos), (exc, plain_exc)):
        w = want.shape[1]
        assert w == int((want >= 0).sum(1).max()) and got.shape[1] == (1 << (w - 1).bit_length() if w > 1 else w)
        assert torch.equal(got[:, :w], want) and bool((got[:, w:] == -1).all())
    assert exc.shape[1] > plain_exc.shape[1]  # a width that is no power of two here


def test_a_sampled_batch_the_host_refuses_gives_the_eager_error_and_counts(captured, device, monkeypatch):
    """A batch whose histogram state would be too large (refused from its shapes, before any draw): where updates are
    captured, the same ValueError as eager (its bad positives' first, else the state's), for scores and factors, no
    state changed and each update counted once, as eagerly."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    scores = torch.rand(2, 100, device=device)
    u, v = torch.randn(2, 4, device=device), torch.randn(100, 4, device=device)
    exclude = torch.arange(2, 60, device=device).repeat(2, 1)
    for bad in (False, True):
        pos = torch.tensor([[0], [150 if bad else 1]], device=device)
        calls = {"update": lambda m: m.update(scores, pos, exclude),
                 "update_factors": lambda m: m.update_factors(u, v, pos, exclude),
                 "update_factors_padded": lambda m: m.update_factors_padded(u, v, None, pos, exclude)}
        for name, call in calls.items():
            have, want = (tm.SampledRankingMetrics(["ndcg@10"], n_samples=2**24).to(device) for _ in range(2))
            errors = []
            for metric, run in ((have, call), (want, lambda m: _eager(call, m))):
                with pytest.raises(ValueError) as err:
                    run(metric)
                errors.append(str(err.value))
            padded = name.endswith("padded")  # validated inputs by contract: the state's error
            assert errors[0] == errors[1], name
            assert ("item indices" if bad and not padded else "the histogram state") in errors[0], name
            assert have._update_count == want._update_count and have.hist.shape[0] == 0, name
    assert captured("captures") == 0


def test_refused_inputs_leave_the_counters_and_later_states_as_eagerly(captured, device, monkeypatch):
    """Inputs the eager update refuses before changing anything (ids of the wrong length, positives of another batch
    size, for scores and factors): where updates are captured the same errors, the running row counter and update
    count unchanged, and later batches give the eager states (the catalogue state written, not left at 0)."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    s, pos, exc = _batch(0, device=device)
    u, v, _ = _factors(0, device=device)
    wrong = pos[:5]
    refused = [lambda m: m.update(s, pos, exc, ids=torch.arange(5, device=device)),
               lambda m: m.update(s, wrong, exc),
               lambda m: m.update_factors(u, v, wrong, exc)]
    have, want = _sampled(tm, device), _sampled(tm, device)
    for call in refused:
        messages = []
        for metric, run in ((have, call), (want, lambda m, call=call: _eager(call, m))):
            with pytest.raises(ValueError) as err:
                run(metric)
            messages.append(str(err.value))
        assert messages[0] == messages[1]
        assert (have._rows_seen, have._update_count) == (want._rows_seen, want._update_count)
    for _ in range(3):
        have.update(s, pos, exc)
        _eager(want.update, s, pos, exc)
        have.update_factors(u, v, pos, exc)
        _eager(want.update_factors, u, v, pos, exc)
    assert captured("replays") > 0
    _same_states(have, want, SAMPLED_STATES)
    assert int(have.n_items) == 300 and (have._rows_seen, have._update_count) == (want._rows_seen, want._update_count)


@pytest.mark.parametrize("overflow", [False, True])
@pytest.mark.parametrize("source", ["scores", "scores, prepared", "factors", "factors, prepared"])
def test_exact_share_updates_replayed_equal_eager_states(captured, device, monkeypatch, overflow, source):
    """A fixed-m uniform design with an exact share: each batch's chosen positives ranked exactly in the share's
    static capacity of rows (``share_capacity_rows``) inside the graph, whose rows and overflow flag join the ``share``
    and ``share_overflow`` states after the replay: the states (histogram, share rows, overflow, checks) equal those
    of the same batches with capture off, a keep mask included, and so do the estimates (a capacity of one row
    overflows: refused at compute, with the eager error)."""
    from reco_sampled_plugin import SamplingDesign
    from reco_sampled_plugin.adapters import torchmetrics as tm
    from reco_sampled_plugin.ranking import prepare_index

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    if overflow:
        monkeypatch.setattr(tm, "share_capacity", lambda rows, slots, share: 1)
    design = SamplingDesign(20, exact_share=0.3)
    have, want = (_sampled(tm, device, design, ("none", "bv")) for _ in range(2))
    keep = torch.ones(12, dtype=torch.bool, device=device)
    keep[-2:] = False
    for i in range(5):
        s, pos, exc = _batch(i % 2, device=device)
        u, v, bias = _factors(i % 2, device=device)
        ids = torch.arange(12 * i, 12 * i + 12, device=device)
        p, e = prepare_index(pos, exc, 12, 300, device, pending=[])
        call = {"scores": lambda m: m.update(s, pos, exc, ids, keep),
                "scores, prepared": lambda m: m.update_padded(s, p, e, ids, keep),
                "factors": lambda m: m.update_factors(u, v, pos, exc, ids, keep, item_bias=bias),
                "factors, prepared": lambda m: m.update_factors_padded(u, v, bias, p, e, ids, keep)}[source]
        call(have)
        _eager(call, want)
    # one signature: captured at the second batch, replayed from then on
    assert (captured("captures"), captured("replays"), captured("failures")) == (1, 4, 0)
    _same_states(have, want, SAMPLED_STATES + ("share", "share_overflow"))
    assert have.share.shape[0] > 0 and bool((have.share[:, 3] > 0).any())  # exact ranks in the rows
    if overflow:
        assert int(have.share_overflow) == 5  # every batch
        assert "static capacity" in _same_error(have.compute, want.compute, RuntimeError)
    else:
        assert int(have.share_overflow) == 0
        got, ref = have.estimates(), _eager(want.estimates)
        assert {k: (e.value, e.interval()) for k, e in got.items()} == {k: (e.value, e.interval()) for k, e in ref.items()}


def test_sampled_designs_with_host_side_state_are_not_captured(captured, device, monkeypatch):
    """Adaptive, popularity and without-replacement designs keep their eager update (sizes read back or host-side
    rows): nothing captured, the same states as with capture off."""
    from reco_sampled_plugin import SamplingDesign
    from reco_sampled_plugin.adapters import torchmetrics as tm

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    designs = {"adaptive": (SamplingDesign(20, adaptive_max=80), {}),
               "popularity": (SamplingDesign(20, popularity=torch.rand(300) + 0.1), {}),
               "without replacement": (SamplingDesign(20, replacement=False), {})}
    for name, (design, kwargs) in designs.items():
        have, want = (_sampled(tm, device, design, ("none",), **kwargs) for _ in range(2))
        for i in range(3):
            s, pos, exc = _batch(i, device=device)
            torch.manual_seed(i)
            have.update(s, pos, exc)
            torch.manual_seed(i)
            _eager(want.update, s, pos, exc)
        assert captured("captures") == 0, name
        assert torch.equal(have.hist, want.hist), name


def test_the_docs_state_the_capture_settings_the_code_has():
    """docs/gpu.md ("Calls replayed from CUDA graphs") names the module's bounds and switch as they are."""
    import math
    import os
    import subprocess

    text = " ".join((Path(__file__).resolve().parents[1] / "docs" / "gpu.md").read_text().split())
    section = text[text.index("## Calls replayed from CUDA graphs"):text.index("## Beyond one machine")]
    assert f"at most {_graphs._MAX_GRAPHS} captured calls per process" in section
    assert f"went unused for {_graphs._STALE} calls" in section
    assert f"signature's last {_graphs._RECENT} calls" in section
    assert f"up to 2^{int(math.log2(_graphs._COPY_ELEMENTS))} elements" in section
    assert "`RECO_SAMPLED_GRAPHS=off`" in section
    code = "from reco_sampled_plugin import _graphs; print(_graphs._switched_on[0])"
    env = dict(os.environ, RECO_SAMPLED_GRAPHS="off")
    assert subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True).stdout.strip() == "False"


def _sorted_batch(seed: int, b: int = 12, n: int = 300, device="cpu", **kw):
    """:func:`_batch` (``kw``: p, e) with each row's positives ascending, padded at the end and as wide as the row
    with most (the layout a mask's positives get), and the same rows as (B, n) masks."""
    s, pos, exc = _batch(seed, b=b, n=n, device=device, **kw)
    pos = torch.where(pos >= 0, pos, n).sort(1).values
    pos = torch.where(pos < n, pos, -1)[:, :int((pos < n).sum(1).max())]
    wide = torch.zeros((b, n + 1), dtype=torch.bool, device=device)
    pm = wide.clone().scatter_(1, torch.where(pos >= 0, pos, n), True)[:, :n]
    em = wide.clone().scatter_(1, torch.where(exc >= 0, exc, n), True)[:, :n]
    return s, pos, exc, pm, em


def _same_sampled(have, want) -> None:
    assert torch.equal(have.ranks, want.ranks) and torch.equal(have.negatives, want.negatives)
    assert torch.equal(have.n_candidates, want.n_candidates) and have.design == want.design


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
def test_sampled_ranks_replayed_equal_the_general_path(captured, device, ties):
    """``sampled_ranks`` of index inputs (uniform, with replacement) on an accelerator is replayed from its graph from
    the third call of a shape, the seed drawn from the generator copied in: the same ranks, negatives and candidate
    counts, and the generator left in the same state, as the general path's (masks: prepared, read, then the same
    seeded draw), and as with capture off; the draws avoid the rows' positives and exclusions, and the ranks count
    the drawn items that beat each positive (brute force)."""
    from reco_sampled_plugin import sampled_ranks
    from reco_sampled_plugin.exclusions import prepare_exclusions

    n = 300
    for i, b in enumerate([12] * 4 + [7, 7]):
        s, pos, exc, pm, em = _sorted_batch(i, b=b, n=n, device=device)
        s = (s * 2).round() / 2  # ties
        gens = [torch.Generator(device=device).manual_seed(i) for _ in range(4)]
        have = sampled_ranks(s, pos, 30, exclude=exc, generator=gens[0], ties=ties)
        _same_sampled(have, sampled_ranks(s, pm, 30, exclude=em, generator=gens[1], ties=ties))
        _same_sampled(have, sampled_ranks(s, pos, 30, exclude=prepare_exclusions(exc, n), generator=gens[2], ties=ties))
        assert torch.equal(torch.rand(3, generator=gens[0], device=device), torch.rand(3, generator=gens[1], device=device))
        _graphs._switched_on[0] = False
        try:
            _same_sampled(have, sampled_ranks(s, pos, 30, exclude=exc, generator=gens[3], ties=ties))
        finally:
            _graphs._switched_on[0] = True
        neg, valid = have.negatives, pos >= 0
        assert bool(((neg >= 0) == valid.unsqueeze(2)).all()) and int(neg.max()) < n
        forbidden = (neg.unsqueeze(3) == torch.cat([pos, exc], 1).view(b, 1, 1, -1)).any(3)
        assert not bool((forbidden & (neg >= 0)).any())
        ps, ns = s.gather(1, pos.clamp(min=0)).unsqueeze(2), s.gather(1, neg.clamp(min=0).view(b, -1)).view(neg.shape)
        beat = {"pessimistic": (ns >= ps).double(), "optimistic": (ns > ps).double(),
                "average": (ns > ps).double() + (ns == ps).double() / 2}[ties]
        assert torch.equal(have.ranks.double(), torch.where(valid, beat.sum(2) + 1, 0.0))
        assert torch.equal(have.n_candidates, n - (exc >= 0).sum(1) - valid.sum(1) + 1)  # the positive and the rest
    assert captured("captures") == 2 and captured("replays") == 3 + 1


def test_seeded_draws_in_row_blocks_equal_one_block(captured, device, monkeypatch):
    """Rows drawn in blocks (``MAX_ELEMENTS`` lowered: blocks of 2 rows) are keyed by their place in the batch, so
    they draw what one block draws, with padded and with prepared exclusions."""
    from reco_sampled_plugin import ranking, sampled_ranks
    from reco_sampled_plugin.exclusions import prepare_exclusions

    s, pos, exc, _, _ = _sorted_batch(0, device=device)
    whole = sampled_ranks(s, pos, 30, exclude=exc, generator=torch.Generator(device=device).manual_seed(3))
    monkeypatch.setattr(ranking, "MAX_ELEMENTS", 8 * 2 * 4 * 30)
    for e in (exc, prepare_exclusions(exc, s.shape[1])):
        _same_sampled(sampled_ranks(s, pos, 30, exclude=e, generator=torch.Generator(device=device).manual_seed(3)),
                      whole)


def test_seeded_draws_are_uniform_over_each_rows_candidates(captured, device):
    """The law of the seeded draw (uniform with replacement among the row's items neither positive nor excluded):
    400 rows with item 3 relevant and items 0 and 7 excluded, m = 50 each (20,000 draws over 9 items), under 20
    generator seeds: never a forbidden item; each seed's chi-square test of equal frequencies gives a p-value, and
    those of a uniform law are uniform on [0, 1] (Kolmogorov-Smirnov, p > 0.01), for all draws and for the rows'
    first draws alone (rows independent); two seeds draw different items (8 in 9 draws differ)."""
    from scipy import stats

    from reco_sampled_plugin import sampled_ranks

    b, n, m = 400, 12, 50
    s = torch.randn(b, n, generator=torch.Generator().manual_seed(0)).to(device)
    pos = torch.full((b, 1), 3, device=device)
    exc = torch.tensor([[0, 7]], device=device).expand(b, 2)
    allowed = [i for i in range(n) if i not in (0, 3, 7)]
    p_all, p_first, draws = [], [], []
    for seed in range(20):
        neg = sampled_ranks(s, pos, m, exclude=exc, generator=torch.Generator(device=device).manual_seed(seed)).negatives
        counts = torch.bincount(neg.flatten().cpu(), minlength=n)
        assert counts[[0, 3, 7]].sum() == 0
        p_all.append(stats.chisquare(counts[allowed].numpy()).pvalue)
        p_first.append(stats.chisquare(torch.bincount(neg[:, 0, 0].cpu(), minlength=n)[allowed].numpy()).pvalue)
        draws.append(neg)
    assert stats.kstest(p_all, "uniform").pvalue > 0.01, p_all
    assert stats.kstest(p_first, "uniform").pvalue > 0.01, p_first
    assert (draws[0] != draws[1]).double().mean() > 0.8


@pytest.mark.parametrize("bad", ["range", "nan", "pool", "range and m"])
def test_a_bad_sampled_batch_after_capture_raises_the_general_error(captured, device, bad):
    from reco_sampled_plugin import sampled_ranks

    for i in range(3):  # 24 items, 4 positives and up to 19 exclusions per row (of 20 slots): a pool left
        s, pos, exc, _, _ = _sorted_batch(i, n=24, device=device)
        exc[:, -1] = -1
        sampled_ranks(s, pos, 20, exclude=exc)
    assert captured("replays") == 2
    s, pos, exc = s.clone(), pos.clone(), exc.clone()
    m = 0 if bad == "range and m" else 20  # two faults: the inputs' error first, as on the general path
    if bad.startswith("range"):
        pos[2, 0] = 24
    elif bad == "nan":
        s[4, 9] = float("nan")
    else:  # row 1: every item a positive or excluded, none left to draw
        pos[1], exc[1] = torch.arange(20, 24, device=device), torch.arange(20, device=device)
    message = _same_error(lambda: sampled_ranks(s, pos, m, exclude=exc),
                          lambda: sampled_ranks(s, pos, m, exclude=exc))
    assert message.startswith({"range": "positives:", "nan": "scores: NaN", "pool": "positives: some row",
                               "range and m": "positives:"}[bad])


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 9), n=st.integers(8, 60), p=st.integers(1, 5), e=st.integers(0, 6), m=st.integers(1, 40),
       ties=st.sampled_from(["pessimistic", "optimistic", "average"]), grid=st.booleans(),
       form=st.sampled_from(["masks", "prepared", "one positive", "int32"]), seed=st.integers(0, 99))
def test_seeded_sampled_ranks_equal_across_forms_on_any_shape(b, n, p, e, m, ties, grid, form, seed):
    """Any shape, padding and tie pattern on a CPU's stand-in graph: the replayed index call (third of a shape) gives
    what the same rows in another form give from the same generator state (masks, prepared exclusions, (B,)
    positives, int32 indices: the general path or a capture of its own)."""
    from reco_sampled_plugin import sampled_ranks
    from reco_sampled_plugin.exclusions import prepare_exclusions

    saved = _graphs._fake[0], counting._numpy_blocked[0], counting._cpu_chunks[0], _inputs._numpy_scan[0]
    _graphs._fake[0], counting._numpy_blocked[0], counting._cpu_chunks[0], _inputs._numpy_scan[0] = True, True, False, False
    _graphs.clear()
    try:
        for i in range(3):
            s, pos, exc, pm, em = _sorted_batch(seed + i, b=b, n=max(n, p + e + 4), p=p, e=max(e, 2))
            if grid:
                s = (s * 2).round() / 2
            if form == "one positive":  # (B,) positives: one per row, -1 for a row without one
                pos = pos[:, :1] if pos.shape[1] else torch.full((b, 1), -1)
            exc, em = (exc, em) if e else (None, None)
            gens = [torch.Generator().manual_seed(seed) for _ in range(2)]
            made = iter(gens)
            gen = lambda: next(made)  # noqa: E731
            have = sampled_ranks(s, pos, m, exclude=exc, generator=gen(), ties=ties)
            other = {"masks": lambda: sampled_ranks(s, pm, m, exclude=em, generator=gen(), ties=ties),
                     "prepared": lambda: sampled_ranks(s, pos, m, exclude=None if exc is None else
                                                       prepare_exclusions(exc, s.shape[1]), generator=gen(), ties=ties),
                     "one positive": lambda: sampled_ranks(s, pos[:, 0], m, exclude=exc, generator=gen(), ties=ties),
                     "int32": lambda: sampled_ranks(s, pos.to(torch.int32), m, exclude=None if exc is None else
                                                    exc.to(torch.int32), generator=gen(), ties=ties)}[form]()
            _same_sampled(have, other)
            # one seed per call whatever the form (also without a positive): later draws are the same
            assert torch.equal(torch.rand(2, generator=gens[0]), torch.rand(2, generator=gens[1]))
        assert _graphs._stats["replays"] > 0
    finally:
        _graphs._fake[0], counting._numpy_blocked[0], counting._cpu_chunks[0], _inputs._numpy_scan[0] = saved
        _graphs.clear()
