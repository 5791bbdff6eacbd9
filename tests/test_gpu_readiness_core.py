"""GPU-readiness of the core hot paths, checked on the CPU.

* host synchronisations per call (``_budgets.SyncCounter``): at most 4, the same for any B and n;
* the largest temporary (``_budgets.PeakTemporary``): the score block (B x n) plus O(B (P + E + P m));
* random numbers drawn on the scores' device; out-of-memory errors of compiled kernels propagate;
* results unchanged: ranks against an argsort oracle, sampled ranks against their laws (chi-square).
"""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest
import scipy.stats as st
import torch
from _budgets import count_syncs, peak_temporary
from hypothesis import given, settings
from hypothesis import strategies as hst

import reco_sampled_plugin as rsp
from reco_sampled_plugin import _inputs, counting
from reco_sampled_plugin.ranking import _rand, _row_seeds

@pytest.fixture(autouse=True)
def _accelerator_mask_scan(monkeypatch):
    """Masks scanned as on an accelerator, in torch (one ``nonzero``: a synchronisation there); a CPU scans them in
    numpy (``_inputs._sparse_masks_numpy``), which these probes would not see."""
    monkeypatch.setattr(_inputs, "_numpy_scan", [False])


SYNC_BUDGET = 4
SIZES = [(8, 1_000), (48, 12_000)]  # (B, n)
P, E, M = 3, 20, 50


def _problem(b: int, n: int, device, seed: int = 0, p: int = P, e: int = E):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g)
    idx = torch.rand(b, n, generator=g).argsort(1)[:, : p + e]  # distinct items per row
    pos, exc = idx[:, :p].clone(), idx[:, p:].clone()
    pos[0, -1] = -1  # padding
    exc[1, :3] = -1
    return scores.to(device), pos.to(device), exc.to(device)


def _masks(scores, pos, exc):
    pm = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, pos.clamp(min=0), pos >= 0)
    em = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, exc.clamp(min=0), exc >= 0)
    return pm, em


def _weights(n: int, device):
    return (torch.rand(n, generator=torch.Generator().manual_seed(5)) + 0.1).to(device)


def _calls(scores, pos, exc):
    n = scores.shape[1]
    gen = torch.Generator().manual_seed(1)
    pm, em = _masks(scores, pos, exc)
    w = _weights(n, scores.device)
    # the designs are built once, as a user builds them, outside the counted calls
    without = rsp.SamplingDesign(M, replacement=False)
    by_popularity = rsp.SamplingDesign(M, popularity=w)
    by_popularity_without = rsp.SamplingDesign(M, replacement=False, popularity=w)
    return {
        "exact": lambda: rsp.exact_ranks(scores, pos, exc),
        "exact_average": lambda: rsp.exact_ranks(scores, pos, exc, "average", count_other_positives=False),
        "exact_random": lambda: rsp.exact_ranks(scores, pos, exc, "random", generator=gen),
        "exact_masks": lambda: rsp.exact_ranks(scores, pm, exclude=em),
        "sampled": lambda: rsp.sampled_ranks(scores, pos, M, exc, generator=gen),
        "sampled_no_replacement": lambda: rsp.sampled_ranks(scores, pos, without, exc, generator=gen),
        "sampled_default_generator": lambda: rsp.sampled_ranks(scores, pos, without, exc),
        "popularity": lambda: rsp.sampled_ranks(scores, pos, by_popularity, exc, generator=gen),
        "popularity_no_replacement": lambda: rsp.sampled_ranks(scores, pos, by_popularity_without, exc, generator=gen),
        "per_user_metrics": lambda: rsp.per_user_metrics(scores, pos, ["ndcg@10", "recall@10", "auc"], exc),
        "per_user_metrics_dict": lambda: rsp.per_user_metrics(scores, pos, ["ndcg@10", "ap@5"], exc, as_frame=False),
        "per_user_metrics_masks": lambda: rsp.per_user_metrics(scores, pm, ["ndcg@10", "recall@10"], em),
        "sampled_masks": lambda: rsp.sampled_ranks(scores, pm, without, em, generator=gen),
    }


CALLS = list(_calls(*_problem(2, 100, "cpu")))


@pytest.mark.parametrize("name", CALLS)
def test_host_synchronisations_within_budget_and_independent_of_size(name, device, backend):
    counts = {}
    for b, n in SIZES:
        fn = _calls(*_problem(b, n, device))[name]
        fn()  # compile outside the counter
        _, counter = count_syncs(fn)
        counts[(b, n)] = (counter.count, dict(counter.calls))
    assert all(c <= SYNC_BUDGET for c, _ in counts.values()), counts
    assert len({c for c, _ in counts.values()}) == 1, counts


def test_exact_ranks_of_index_inputs_read_back_once(device):
    """``exact_ranks`` with index tensors reads its index checks and the counting pass's NaN/inf rows in one
    synchronisation, after the work is queued (two before: the checks, then the rows); a failing check still raises
    its own error, the index checks before the scores'."""
    scores, pos, exc = _problem(16, 2_000, device)
    rsp.exact_ranks(scores, pos, exc)
    _, counter = count_syncs(rsp.exact_ranks, scores, pos, exc)
    assert counter.count == 1, dict(counter.calls)
    bad = scores.clone()
    bad[3, 7] = float("nan")
    with pytest.raises(ValueError, match=r"^scores: NaN or inf in 1 of 16 rows \(first bad row 3\)"):
        rsp.exact_ranks(bad, pos, exc)
    out_of_range = pos.clone()
    out_of_range[2, 0] = 2_000
    with pytest.raises(ValueError, match=r"^positives: item indices must lie in 0\.\.1999"):
        rsp.exact_ranks(bad, out_of_range, exc)  # the index check first, though the scores fail too


# a call on masks against the same call on index inputs: the reads it adds (the masks' widths, read with the checks
# before any work: a data-dependent shape; the scan's nonzero_static sized by a count read with them)
MASK_TWINS = {"exact_masks": ("exact", 1), "per_user_metrics_masks": ("per_user_metrics", 1),
              "sampled_masks": ("sampled_no_replacement", 0)}


@pytest.mark.parametrize("name", sorted(MASK_TWINS))
def test_masks_read_their_widths_with_the_checks(name, device):
    """Masks are scanned without a read of their own (no ``nonzero``): their widths and the scan's size are read with
    the call's checks, so a call on masks reads at most once more than on index inputs (before its work, where the
    index form reads its checks after), at every size."""
    twin, extra = MASK_TWINS[name]
    for b, n in SIZES:
        calls = _calls(*_problem(b, n, device))
        got = {}
        for key in (name, twin):
            calls[key]()
            got[key] = count_syncs(calls[key])[1]
        assert "nonzero" not in got[name].calls, dict(got[name].calls)
        assert got[name].count == got[twin].count + extra, (b, n, dict(got[name].calls), dict(got[twin].calls))


@pytest.mark.parametrize("ties", ["pessimistic", "average"])
@pytest.mark.parametrize("as_frame", [False, True], ids=["dict", "frame"])
def test_per_user_metrics_of_index_inputs_read_back_once(device, ties, as_frame):
    """``per_user_metrics`` with index tensors reads its index checks with the counting pass's NaN/inf rows (and a
    frame's values) in one synchronisation, also with ``ties="average"`` (RR@k's grid k wide); two or three before; a
    failing check still raises its own error, the index checks before the scores'."""
    scores, pos, exc = _problem(16, 2_000, device)
    metrics = ["ndcg@10", "rr@10", "auc"]
    rsp.per_user_metrics(scores, pos, metrics, exc, ties=ties, as_frame=as_frame)
    _, counter = count_syncs(rsp.per_user_metrics, scores, pos, metrics, exc, ties=ties, as_frame=as_frame)
    assert counter.count == 1, dict(counter.calls)
    bad = scores.clone()
    bad[3, 7] = float("nan")
    with pytest.raises(ValueError, match=r"^scores: NaN or inf in 1 of 16 rows \(first bad row 3\)"):
        rsp.per_user_metrics(bad, pos, metrics, exc, ties=ties, as_frame=as_frame)
    out_of_range = pos.clone()
    out_of_range[2, 0] = 2_000
    with pytest.raises(ValueError, match=r"^positives: item indices must lie in 0\.\.1999"):
        rsp.per_user_metrics(bad, out_of_range, metrics, exc, ties=ties, as_frame=as_frame)


@pytest.mark.parametrize("name", CALLS)
def test_largest_temporary_is_the_score_block_plus_small_terms(name, device, backend):
    for b, n in SIZES:
        fn = _calls(*_problem(b, n, device))[name]
        fn()
        _, rec = peak_temporary(fn)
        bound = b * n + 6 * b * (P + E + P * M)
        assert rec.peak <= bound, (b, n, rec.peak, rec.op)


@pytest.mark.parametrize("name", ["popularity", "popularity_no_replacement"])
def test_popularity_draws_build_no_rows_by_catalogue_block(name, device, backend):
    """Popularity draws keep the catalogue's one cumulative sum (n + 1 values) and per-draw tables (the uniform
    numbers of up to three rounds, B x P x m each, and the rows' holes), never a (rows x n) block of weights."""
    for b, n in SIZES:
        fn = _calls(*_problem(b, n, device))[name]
        fn()
        _, rec = peak_temporary(fn)
        bound = (n + 1) + 3 * b * P * M + 6 * b * (P + E)
        assert rec.peak <= bound, (b, n, rec.peak, rec.op)


@pytest.mark.parametrize("path", ["numpy", "cpu chunks", "whole rows"])
@pytest.mark.parametrize("p", [1, 3, 12])
def test_eager_counting_temporary_stays_within_the_score_block(p, path, monkeypatch):
    """Every eager path's largest temporary (numpy's, the CPU's torch loop in cache-sized chunks, an accelerator's whole
    rows: a (B, n) boolean, and the random tie policy's (B, n) keys) holds at most B x n elements."""
    monkeypatch.setattr(counting, "_numpy_blocked", [path != "numpy"])
    monkeypatch.setattr(counting, "_cpu_chunks", [path != "whole rows"])
    scores = torch.randn(16, 3_000)
    ref = scores[:, :p].clone()
    before = counting.get_backend()
    counting.set_backend("eager")
    try:
        for inclusive in (False, True):
            out, rec = peak_temporary(counting.count_beating, scores, ref, inclusive)
            assert rec.peak <= scores.numel(), (rec.peak, rec.op)
            assert torch.equal(out, (scores.unsqueeze(1) >= ref.unsqueeze(2) if inclusive else scores.unsqueeze(1) > ref.unsqueeze(2)).sum(2))
        seeds = torch.arange(16).unsqueeze(1)
        keys = counting.item_keys(torch.arange(p).expand(16, p), seeds)
        _, rec = peak_temporary(counting.count_tied_before, scores, ref, keys, seeds)
        assert rec.peak <= scores.numel(), (rec.peak, rec.op)
    finally:
        counting.set_backend(before)


def test_random_numbers_live_on_the_scores_device(device):
    u = _rand((3, 4), None, device)
    assert u.device.type == device.type and u.dtype == torch.float64
    g = torch.Generator(device=device).manual_seed(0)
    assert _rand((3, 4), g, device).device.type == device.type
    assert _row_seeds(5, None, device).device.type == device.type
    assert _row_seeds(5, torch.Generator().manual_seed(0), device).device.type == device.type
    scores, pos, exc = _problem(6, 400, device)
    for kw in ({}, {"replacement": False}, {"popularity": _weights(400, device)},
               {"popularity": _weights(400, device), "replacement": False}):
        for gen in (None, torch.Generator().manual_seed(3)):
            res = rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(10, **kw), exc, generator=gen)
            assert res.ranks.device.type == res.negatives.device.type == device.type
            valid = pos >= 0
            neg = res.negatives[valid]  # (V, m): never a positive or excluded item
            assert (neg >= 0).all() and (neg < 400).all()
            forb = torch.cat([pos, exc], 1)
            rows = valid.nonzero()[:, 0]
            assert not (neg.unsqueeze(2) == forb[rows].unsqueeze(1)).any()
            if kw.get("replacement") is False:
                assert (neg.sort(1).values.diff(dim=1) > 0).all()


# --- results unchanged: an argsort oracle -----------------------------------------------------------------


def _oracle(scores, pos, exc, ties, count_other, seeds=None):
    """Rank of each positive = its place in an argsort of the row's candidates (lexsort: score descending, then
    the tie order the policy prescribes)."""
    from reco_sampled_plugin.counting import item_keys

    s = scores.numpy()
    out = np.zeros(pos.shape, dtype=float)
    for b in range(s.shape[0]):
        excluded = {int(e) for e in exc[b] if e >= 0}
        slots = {int(q): j for j, q in enumerate(pos[b]) if q >= 0}
        keys = item_keys(torch.arange(s.shape[1]), seeds[b]).numpy() if seeds is not None else None
        for j, p in enumerate(pos[b].tolist()):
            if p < 0:
                continue
            cand = np.array([i for i in range(s.shape[1]) if i not in excluded and (count_other or i == p or i not in slots)])
            relevant = np.array([i in slots for i in cand])
            slot = np.array([slots.get(int(i), 0) for i in cand])
            me = cand == p

            def place(*tie_keys):  # lexsort: the last key is the primary one
                order = np.lexsort(tuple(tie_keys) + (-s[b, cand],))
                return int(np.nonzero(me[order])[0][0]) + 1

            if ties == "pessimistic":
                out[b, j] = place(slot, relevant)  # irrelevant first, then relevant in slot order
            elif ties == "optimistic":
                out[b, j] = place(slot, ~relevant)
            elif ties == "average":
                out[b, j] = (place(me) + place(~me)) / 2  # every tied item above, every tied item below
            else:
                out[b, j] = place(keys[cand])
    return out


@pytest.mark.parametrize("ties", rsp.ranking.TIES)
@pytest.mark.parametrize("count_other", [True, False])
@pytest.mark.parametrize("seed", [0, 1])
def test_ranks_match_an_argsort_oracle_with_ties(ties, count_other, seed, device, backend):
    g = torch.Generator().manual_seed(seed)
    b, n = 9, 60
    scores = torch.randint(0, 6, (b, n), generator=g).double()  # many ties
    idx = torch.rand(b, n, generator=g).argsort(1)
    pos, exc = idx[:, :4].clone(), idx[:, 4:14].clone()
    pos[torch.rand(b, 4, generator=g) < 0.25] = -1
    exc[torch.rand(b, 10, generator=g) < 0.3] = -1
    pos[2] = -1  # a row without a positive
    gen = torch.Generator().manual_seed(7)
    seeds = torch.randint(0, 2**31 - 1, (b, 1), generator=torch.Generator().manual_seed(7)) if ties == "random" else None
    got = rsp.exact_ranks(scores.to(device), pos.to(device), exc.to(device), ties, count_other_positives=count_other,
                          generator=gen)
    want = _oracle(scores, pos, exc, ties, count_other, seeds)
    np.testing.assert_array_equal(got.cpu().double().numpy(), want)
    pm, em = _masks(scores, pos, exc)
    by_mask = rsp.exact_ranks(scores.to(device), pm.to(device), em.to(device), ties, count_other_positives=count_other,
                              generator=torch.Generator().manual_seed(7))
    order = torch.where(pos >= 0, pos, torch.full_like(pos, n)).sort(1)  # masks give positives in item order
    expect = torch.as_tensor(want).gather(1, order.indices)[:, : by_mask.shape[1]]
    if ties != "random" and not (count_other and ties in ("pessimistic", "optimistic")):  # slot order differs
        np.testing.assert_array_equal(by_mask.cpu().double().numpy(), expect.numpy())


@pytest.mark.parametrize("scan", ["numpy", "torch"])
def test_mask_and_index_forms_agree_and_mask_conversion_is_exact(scan, monkeypatch):
    """Both scans of masks (numpy's on a CPU, the accelerators' torch one) give each row's set items in order, the
    widths, totals and, for two masks, whether they share an entry, at widths around a 64-bit word and a group of 8
    words, sparse and dense rows, empty and full rows, and views."""
    from reco_sampled_plugin import _inputs
    from reco_sampled_plugin._inputs import mask_to_padded, sparse_masks

    monkeypatch.setattr(_inputs, "_numpy_scan", [scan == "numpy"])
    g = torch.Generator().manual_seed(3)
    for n in (1, 7, 8, 13, 64, 65, 513, 1001):
        for density in (0.003, 0.3):
            mask = torch.rand(11, n, generator=g) < density
            mask[4] = False
            mask[5] = True
            got = mask_to_padded(mask)
            width = int(mask.sum(1).max())
            want = torch.full((11, width), -1, dtype=torch.int64)
            for b in range(11):
                items = mask[b].nonzero()[:, 0]
                want[b, : items.numel()] = items
            assert torch.equal(got, want)
            assert torch.equal(mask_to_padded(mask, width), want)
            sliced = torch.rand(11, n + 5, generator=g)[:, 2 : n + 2] < density  # not contiguous
            assert torch.equal(mask_to_padded(sliced), mask_to_padded(sliced.contiguous()))
            other = (torch.rand(11, n, generator=g) < density) & ~mask  # disjoint from mask, then one shared entry
            for shared in (False, True):
                if shared:
                    other[5, n // 2] = True
                sm = sparse_masks([mask, other])
                assert [int(w) for w in sm.widths] == [width, int(other.sum(1).max())]
                assert [int(t) for t in sm.totals] == [int(mask.sum()), int(other.sum())]
                assert bool(sm.overlap) == shared
                padded = sm.padded([int(v) for v in sm.reads()])
                assert torch.equal(padded[0], want) and torch.equal(padded[1], mask_to_padded(other))


def test_a_device_without_nonzero_static_lists_the_same_entries(monkeypatch):
    """Where ``torch.nonzero_static`` has no kernel (CUDA builds of torch 2.2-2.5 raise NotImplementedError) the
    masks' scan and the exclusions' CSR fall back to ``nonzero`` (remembered per device type): the same ranks and
    draws as with it."""
    scores, pos, exc = _problem(8, 300, "cpu")
    pm, em = _masks(scores, pos, exc)
    design = rsp.SamplingDesign(20, replacement=False)

    def calls():
        return (rsp.exact_ranks(scores, pm, exclude=em), rsp.exact_ranks(scores, pos, exclude=em),
                rsp.sampled_ranks(scores, pos, design, exc, generator=torch.Generator().manual_seed(3)).ranks)

    want = calls()
    tried = []

    def missing(*args, **kwargs):
        tried.append(1)
        raise NotImplementedError("Could not run 'aten::nonzero_static' with arguments from the 'CUDA' backend")

    monkeypatch.setattr(torch, "nonzero_static", missing)
    monkeypatch.setattr(_inputs, "_STATIC_NONZERO", {})
    got = calls()
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert len(tried) == 1 and _inputs._STATIC_NONZERO == {"cpu": False}  # tried once, then nonzero


@settings(max_examples=60, deadline=None)
@given(b=hst.integers(1, 9), n=hst.integers(1, 200), density=hst.sampled_from([0.0, 0.01, 0.2, 1.0]),
       offset=hst.integers(0, 3), seed=hst.integers(0, 2**31 - 1))
def test_both_scans_of_masks_agree_on_any_masks(b, n, density, offset, seed):
    """The CPU's numpy scan equals the accelerators' torch scan (indices, widths, totals, overlap) for two masks of any
    shape and density, views offset into a wider buffer included (unaligned storage, rows n + offset apart)."""
    g = torch.Generator().manual_seed(seed)
    wide = torch.rand(2, b, n + offset, generator=g) < density
    masks = [wide[0, :, offset:], wide[1, :, : n]]
    got = {}
    for scan in (True, False):
        _inputs._numpy_scan[0] = scan
        try:
            sm = _inputs.sparse_masks(masks)
            widths = [int(w) for w in sm.widths]
            got[scan] = (widths, [int(t) for t in sm.totals], bool(sm.overlap), sm.padded([int(v) for v in sm.reads()]))
        finally:
            _inputs._numpy_scan[0] = True
    (w1, t1, o1, p1), (w2, t2, o2, p2) = got[True], got[False]
    assert (w1, t1, o1) == (w2, t2, o2)
    assert all(torch.equal(x, y) for x, y in zip(p1, p2))
    assert o1 == bool((masks[0] & masks[1]).any()) and t1 == [int(m.sum()) for m in masks]


@pytest.mark.parametrize("threads", [2, 3])
def test_a_large_mask_scanned_in_row_ranges_lists_every_entry_in_order(threads, monkeypatch):
    """The CPU's numpy scan of a large mask splits its rows between torch's threads (``_inputs._MASK_THREAD_MIN``,
    here 0): the same entries in the same order as the torch scan, sparse (by words) and dense (by bytes) masks,
    ranges that leave empty rows, an offset view, and two masks' overlap."""
    monkeypatch.setattr(_inputs, "_MASK_THREAD_MIN", 0)
    saved = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        g = torch.Generator().manual_seed(11)
        for n, density in ((512, 0.002), (512, 0.2), (1000, 0.05)):
            wide = torch.rand(2, 13, n + 1, generator=g) < density
            wide[0, 3:6] = False  # empty rows
            masks = [wide[0, :, 1:], wide[1, :, :n]]  # an offset view and a strided one
            got = {}
            for scan in (True, False):
                monkeypatch.setattr(_inputs, "_numpy_scan", [scan])
                sm = _inputs.sparse_masks(masks)
                widths = [int(w) for w in sm.widths]
                got[scan] = (widths, [int(t) for t in sm.totals], bool(sm.overlap), sm.padded([int(v) for v in sm.reads()]))
            (w1, t1, o1, p1), (w2, t2, o2, p2) = got[True], got[False]
            assert (w1, t1, o1) == (w2, t2, o2) and all(torch.equal(x, y) for x, y in zip(p1, p2)), (n, density)
            assert t1 == [int(m.sum()) for m in masks] and o1 == bool((masks[0] & masks[1]).any())
    finally:
        torch.set_num_threads(saved)


@pytest.mark.parametrize("scan", ["numpy", "torch"])
def test_a_one_row_mask_view_is_ranked(scan, monkeypatch):
    """A one-row view into a wider mask (contiguous, but its rows 17 apart, offset by one) is read as words from a
    row-major copy: it raised a RuntimeError (a one-row view kept its row stride through ``clone()``)."""
    monkeypatch.setattr(_inputs, "_numpy_scan", [scan == "numpy"])
    wide = torch.zeros(1, 17, dtype=torch.bool)
    wide[0, 3] = True  # item 2 of the view
    excluded = torch.zeros(1, 17, dtype=torch.bool)
    excluded[0, 15:] = True  # items 14, 15 of the view
    scores = torch.arange(16.0).unsqueeze(0)
    assert torch.equal(rsp.exact_ranks(scores, wide[:, 1:]), torch.tensor([[14]]))
    assert torch.equal(rsp.exact_ranks(scores, wide[:, 1:], exclude=excluded[:, 1:]), torch.tensor([[12]]))


def test_fused_validation_keeps_the_errors():
    s = torch.randn(3, 10)
    with pytest.raises(ValueError, match="positives: item indices"):
        rsp.exact_ranks(s, torch.tensor([[0, 11], [1, -1], [2, -1]]), exclude=torch.tensor([[0], [1], [2]]))
    with pytest.raises(ValueError, match="positives: 1 row"):
        rsp.exact_ranks(s, torch.tensor([[0, 0], [1, -1], [2, -1]]), exclude=torch.tensor([[5], [5], [5]]))
    with pytest.raises(ValueError, match="exclude: 2 row"):
        rsp.exact_ranks(s, torch.tensor([0, 1, 2]), exclude=torch.tensor([[0], [1], [3]]))
    pm = torch.zeros(3, 10, dtype=torch.bool)
    pm[:, 0] = True
    em = torch.zeros(3, 10, dtype=torch.bool)
    em[1:, 0] = True
    with pytest.raises(ValueError, match="exclude: 2 row.*first: row 1"):
        rsp.exact_ranks(s, pm, exclude=em)
    with pytest.raises(ValueError, match="exclude: 1 row"):
        rsp.exact_ranks(s, pm, exclude=torch.tensor([[-1], [0], [4]]))
    with pytest.raises(ValueError, match=r"exclude: 1 row.*first: row 1\)"):  # index positives in a mask's rows
        rsp.exact_ranks(s, torch.tensor([[0], [0], [1]]), exclude=em)
    with pytest.raises(ValueError, match="exclude: item indices must lie in 0..9"):  # the range first, then a clash
        rsp.exact_ranks(s, pm, exclude=torch.tensor([[-1], [12], [0]]))
    bad = s.clone()
    bad[2, 3] = math.nan
    with pytest.raises(ValueError, match="scores: NaN or inf in 1 of 3 rows"):
        rsp.sampled_ranks(bad, torch.tensor([0, 1, 2]), 3)
    with pytest.raises(ValueError, match="negatives: 1 row"):
        rsp.sampled_ranks(s, torch.tensor([0, 1, 2]), negatives=torch.tensor([[3, 4], [5, 1], [6, 7]]))
    for as_frame in (True, False):
        with pytest.raises(ValueError, match="scores: NaN or inf in 1 of 3 rows"):
            rsp.per_user_metrics(bad, torch.tensor([0, 1, 2]), ["ndcg@3"], as_frame=as_frame)
        with pytest.raises(ValueError, match="scores: NaN or inf in 1 of 3 rows"):
            rsp.per_user_metrics(bad, torch.tensor([0, 1, 2]), ["ndcg@3"], relevance=torch.ones(3), as_frame=as_frame)
    with pytest.raises(ValueError, match="negatives: item indices"):
        rsp.sampled_ranks(s, torch.tensor([0, 1, 2]), negatives=torch.tensor([[3, 4], [5, 10], [6, 7]]))


# --- sampled ranks follow their laws ----------------------------------------------------------------------


def _chi2_pvalue(observed, probs):
    expected = probs * observed.sum()
    keep = expected > 5
    obs, exp = observed[keep].astype(float), expected[keep]
    if (~keep).any():  # the rare outcomes pooled into one cell
        obs, exp = np.append(obs, observed[~keep].sum()), np.append(exp, expected[~keep].sum())
    return st.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("n_items,m", [(30, 10), (2_000, 40)])  # a small pool (keys) and a large one (redraws)
def test_uniform_without_replacement_is_hypergeometric(n_items, m):
    users = 12_000
    scores = torch.arange(n_items, 0, -1, dtype=torch.float64).repeat(users, 1)  # item i has rank i + 1
    r_item = n_items // 3
    res = rsp.sampled_ranks(scores, torch.full((users, 1), r_item), rsp.SamplingDesign(m, replacement=False),
                            generator=torch.Generator().manual_seed(11))
    observed = torch.bincount(res.ranks[:, 0], minlength=m + 2)[1:].numpy()
    probs = st.hypergeom(n_items - 1, r_item, m).pmf(np.arange(m + 1))
    assert _chi2_pvalue(observed, probs) > 1e-3
    assert (res.negatives[:, 0].sort(1).values.diff(dim=1) > 0).all()


def _successive_sampling_pairs(w):
    """P({a, b}) for two draws without replacement proportional to w (successive sampling)."""
    total = w.sum()
    out = {}
    for a in range(len(w)):
        for b in range(len(w)):
            if a != b and w[a] > 0 and w[b] > 0:
                key = (min(a, b), max(a, b))
                out[key] = out.get(key, 0.0) + w[a] / total * w[b] / (total - w[a])
    return out


@pytest.mark.parametrize("weights", [[5.0, 1.0, 2.0, 3.0, 0.0, 4.0], [1.0, 1e6, 1.0, 2.0, 0.5, 3.0]])
def test_popularity_without_replacement_is_successive_sampling(weights):
    """Pairs drawn without replacement proportionally to the weights (item 0 is the positive, never drawn): the
    law of torch.multinomial(replacement=False); a dominant weight does not stall the duplicate redraws."""
    users = 20_000
    w = torch.tensor(weights, dtype=torch.float64)
    scores = torch.randn(users, len(weights), generator=torch.Generator().manual_seed(0))
    res = rsp.sampled_ranks(scores, torch.full((users, 1), 0), rsp.SamplingDesign(2, replacement=False, popularity=w),
                            generator=torch.Generator().manual_seed(2))
    neg = res.negatives[:, 0].sort(1).values
    assert (neg[:, 0] != neg[:, 1]).all() and (neg != 0).all()
    ww = w.numpy().copy()
    ww[0] = 0.0
    law = _successive_sampling_pairs(ww)
    keys = sorted(law)
    code = {k: i for i, k in enumerate(keys)}
    observed = np.bincount([code[(int(a), int(b))] for a, b in neg.tolist()], minlength=len(keys))
    probs = np.array([law[k] for k in keys])
    assert _chi2_pvalue(observed, probs / probs.sum()) > 1e-3
    # every allowed item of positive weight but one: the redraws of a dominant item's duplicates still end
    n_pos = int((w[1:] > 0).sum())
    full = rsp.sampled_ranks(scores, torch.full((users, 1), 0), rsp.SamplingDesign(n_pos - 1, replacement=False, popularity=w),
                             generator=torch.Generator().manual_seed(3))
    assert (full.negatives[:, 0].sort(1).values.diff(dim=1) > 0).all()


def test_popularity_with_replacement_follows_the_weights_on_device(device):
    users, n = 20_000, 7
    w = torch.tensor([0.0, 1.0, 2.0, 3.0, 0.5, 4.0, 1.5], device=device)
    scores = torch.randn(users, n, device=device)
    res = rsp.sampled_ranks(scores, torch.full((users, 1), 3, device=device), rsp.SamplingDesign(3, popularity=w))
    counts = torch.bincount(res.negatives.reshape(-1).cpu(), minlength=n).numpy()
    probs = w.cpu().numpy().copy()
    probs[3] = 0.0
    assert counts[0] == 0 and counts[3] == 0
    keep = probs > 0
    assert _chi2_pvalue(counts[keep], probs[keep] / probs[keep].sum()) > 1e-3


# --- compiled kernels: failures fall back, out-of-memory errors propagate -------------------------------


def test_out_of_memory_in_a_compiled_kernel_propagates(monkeypatch):
    monkeypatch.setattr(counting, "_compile_failed", set())
    monkeypatch.setattr(counting, "_backend", "compiled")
    scores = torch.randn(4, 300)
    ref = scores[:, :2].clone()
    calls = []

    def oom(*args):
        calls.append(1)
        raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")

    monkeypatch.setattr(counting, "_get_compiled", lambda name: oom)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(torch.OutOfMemoryError):
            counting.count_beating(scores, ref)
        with pytest.raises(RuntimeError, match="out of memory"):
            counting.count_tied_before(scores, ref, torch.zeros(4, 2, dtype=torch.int64), torch.zeros(4, 1, dtype=torch.int64))
    assert not counting._compile_failed  # not taken for a compile failure
    with pytest.raises(torch.OutOfMemoryError):
        counting.count_beating(scores, ref)  # the compiled kernel is still the one called
    assert len(calls) == 3


def test_a_failing_compiled_kernel_warns_once_and_falls_back_to_the_chunked_eager_path(monkeypatch):
    monkeypatch.setattr(counting, "_compile_failed", set())
    monkeypatch.setattr(counting, "_backend", "compiled")
    scores = torch.randn(6, 500)
    ref = scores[:, :3].clone()
    want = (scores.unsqueeze(1) > ref.unsqueeze(2)).sum(2)

    def broken(*args):
        raise RuntimeError("no C compiler found")

    monkeypatch.setattr(counting, "_get_compiled", lambda name: broken)
    with pytest.warns(RuntimeWarning, match="no C compiler found"):
        got = counting.count_beating(scores, ref)
    assert torch.equal(got, want)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        got, rec = peak_temporary(counting.count_beating, scores, ref)  # no second warning; eager in chunks
    assert torch.equal(got, want) and rec.peak <= scores.numel()
    assert "gt" in counting._compile_failed
