"""Exclusions prepared once: the CSR form (``exclusions.Exclusions``) gives the same draws, ranks and ties
as the padded exclusion lists did, on the scorer path and the score-matrix path, fixed m (with and without
replacement, popularity) and adaptive; prepared exclusions reused across calls equal raw ones; bad prepared input
is refused by name.

Oracles: (1) digests of the results of the previous implementation (main at c343c69, padded lists sorted per call)
on fixed problems with ragged lists, ties, masks and popularity; (2) the padded map of the previous implementation
(``forbidden_sorted`` + ``allowed_position_to_item``, kept for the adapters) on the same positions; (3) brute force:
the u-th allowed item from Python sets, with the uniform numbers of the same generator."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin import SamplingDesign, adaptive_sampled_ranks, sampled_ranks, sampled_ranks_from_scorer
from reco_sampled_plugin.exclusions import Exclusions, prepare_exclusions
from reco_sampled_plugin.ranking import (_make_distinct, _uniform_positions, allowed_position_to_item, draw_negatives,
                                         forbidden_sorted, prepare_sampling_index)


class MatrixScorer:
    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores

    def __call__(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        return self.scores[users.unsqueeze(1), items]


def _golden_problem(seed, b=12, n=60, p=3, emax=30):
    """Ragged lists in random order, a row with all but p + 1 items excluded, rows without positives, ties."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randint(0, 7, (b, n), generator=g).double()
    perm = torch.rand(b, n, generator=g).argsort(1)
    npos = torch.randint(0, p + 1, (b,), generator=g)
    nexc = torch.randint(0, emax + 1, (b,), generator=g)
    nexc[1] = n - p - 1
    pos = torch.full((b, p), -1, dtype=torch.int64)
    exc = torch.full((b, n), -1, dtype=torch.int64)
    for r in range(b):
        pos[r, :npos[r]] = perm[r, :npos[r]]
        e = perm[r, p:p + min(int(nexc[r]), n - p - 1)]
        exc[r, :e.numel()] = e[torch.randperm(e.numel(), generator=g)]
    return scores, pos, exc[:, : int((exc >= 0).sum(1).max())]


def _digest(r) -> str:
    parts = [r.ranks, r.n_candidates] + [t for t in (r.negatives, r.n_samples) if t is not None]
    return hashlib.sha1(b"".join(t.contiguous().numpy().tobytes() for t in parts)).hexdigest()[:12]


# digests of the previous implementation's results (main at c343c69) for seeds 0, 1, 2 of _golden_problem
GOLDEN = {
    "pessimistic/adaptive": "c005a3cdafb1", "pessimistic/adaptive_masks": "8dd9fa254241",
    "pessimistic/masks": "d03035962b70", "pessimistic/pop": "68f047bbe91d", "pessimistic/popwor": "6acda48f6e79",
    "pessimistic/scorer_adaptive": "c005a3cdafb1", "pessimistic/scorer_adaptive_masks": "8dd9fa254241",
    "pessimistic/scorer_wor": "a5a52b042162", "pessimistic/scorer_wr": "0d7dce6f864a",
    "pessimistic/wor": "a5a52b042162", "pessimistic/wor_small": "3ff909e619fb", "pessimistic/wr": "0d7dce6f864a",
    "random/adaptive": "fb09461e2370", "random/adaptive_masks": "65df4a4daabf", "random/masks": "cf3d6b9bd106",
    "random/pop": "16268f47e364", "random/popwor": "dc9be44a47bd", "random/scorer_adaptive": "fb09461e2370",
    "random/scorer_adaptive_masks": "65df4a4daabf", "random/scorer_wor": "0ac9f3b05bf0",
    "random/scorer_wr": "2bcc0ed332e9", "random/wor": "0ac9f3b05bf0", "random/wor_small": "892ab35789cd",
    "random/wr": "2bcc0ed332e9",
}


def _golden_cases(sc, pos, exc, w, ties, prepared: bool):
    n = sc.shape[1]
    pm = torch.zeros_like(sc, dtype=torch.bool).scatter_(1, pos.clamp(min=0), pos >= 0)
    em = torch.zeros_like(sc, dtype=torch.bool).scatter_(1, exc.clamp(min=0), exc >= 0)
    prep = (lambda x: prepare_exclusions(x, n)) if prepared else (lambda x: x)
    e, e40, e20, emk = prep(exc), prep(exc[:, :40]), prep(exc[:, :20]), prep(em)
    s = MatrixScorer(sc)
    ad = SamplingDesign(2, adaptive_max=32)
    return {
        "wr": lambda g: sampled_ranks(sc, pos, 7, e, generator=g, ties=ties),
        "wor": lambda g: sampled_ranks(sc, pos, SamplingDesign(7, replacement=False), e40, generator=g, ties=ties),
        "wor_small": lambda g: sampled_ranks(sc, pos, SamplingDesign(6, replacement=False), e20, generator=g, ties=ties),
        "pop": lambda g: sampled_ranks(sc, pos, SamplingDesign(5, popularity=w), e, generator=g, ties=ties),
        "popwor": lambda g: sampled_ranks(sc, pos, SamplingDesign(5, replacement=False, popularity=w), e20, generator=g, ties=ties),
        "masks": lambda g: sampled_ranks(sc, pm, 7, emk, generator=g, ties=ties),
        "adaptive": lambda g: adaptive_sampled_ranks(sc, pos, ad, exclude=e, generator=g, ties=ties),
        "adaptive_masks": lambda g: adaptive_sampled_ranks(sc, pm, ad, exclude=emk, generator=g, ties=ties),
        "scorer_wr": lambda g: sampled_ranks_from_scorer(s, pos, n, 7, exclude=e, generator=g, ties=ties),
        "scorer_wor": lambda g: sampled_ranks_from_scorer(s, pos, n, SamplingDesign(7, replacement=False),
                                                          exclude=e40, generator=g, ties=ties),
        "scorer_adaptive": lambda g: sampled_ranks_from_scorer(s, pos, n, ad, exclude=e, generator=g, ties=ties),
        "scorer_adaptive_masks": lambda g: sampled_ranks_from_scorer(s, pm, n, ad, exclude=emk, generator=g, ties=ties),
    }


@pytest.mark.parametrize("prepared", [False, True])
@pytest.mark.parametrize("ties", ["pessimistic", "random"])
def test_same_results_as_the_padded_implementation(ties, prepared):
    digests: dict[str, list[str]] = {}
    for seed in range(3):
        sc, pos, exc = _golden_problem(seed)
        w = torch.rand(60, generator=torch.Generator().manual_seed(seed)) + 0.05
        for name, fn in _golden_cases(sc, pos, exc, w, ties, prepared).items():
            digests.setdefault(name, []).append(_digest(fn(torch.Generator().manual_seed(seed + 100))))
    for name, ds in digests.items():
        assert hashlib.sha1("".join(ds).encode()).hexdigest()[:12] == GOLDEN[f"{ties}/{name}"], name


@st.composite
def ragged(draw):
    """Ragged exclusions: empty lists, one very long list among short ones, a row with all but one candidate
    excluded, padding anywhere, rows in random order; positives disjoint from them (some rows without)."""
    b = draw(st.integers(1, 7))
    n = draw(st.integers(3, 40))
    p = draw(st.integers(1, 3))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    pos = np.full((b, p), -1, dtype=np.int64)
    lists = []
    long_row = draw(st.integers(0, b - 1))
    for r in range(b):
        perm = rng.permutation(n)
        k = int(rng.integers(0, min(p, n - 1) + 1))
        pos[r, :k] = perm[:k]
        room = n - k - 1  # at least one candidate left
        e = room if (r == long_row and draw(st.booleans())) else int(rng.integers(0, min(room, 3) + 1))
        lists.append(perm[k:k + e])
    width = max(len(x) for x in lists) + draw(st.integers(0, 2))
    exc = np.full((b, width), -1, dtype=np.int64)
    for r, x in enumerate(lists):
        slots = np.sort(rng.choice(width, size=len(x), replace=False))  # padding anywhere
        exc[r, slots] = x
    return torch.from_numpy(pos), torch.from_numpy(exc), n, seed


def _allowed(pos, exc, n):
    return [sorted(set(range(n)) - set(pos[r][pos[r] >= 0].tolist()) - set(exc[r][exc[r] >= 0].tolist()))
            for r in range(pos.shape[0])]


@settings(max_examples=examples(60), deadline=None)
@given(ragged(), st.integers(1, 6), st.booleans())
def test_draws_equal_the_padded_map_and_brute_force(case, m, replacement):
    pos, exc, n, seed = case
    allowed = _allowed(pos, exc, n)
    active = (pos >= 0).any(1)
    if not replacement and any(len(a) < m for a, on in zip(allowed, active.tolist()) if on):
        replacement = True  # a pool smaller than m: only with replacement
    ex = prepare_exclusions(exc, n)
    got = draw_negatives(pos, ex, n, m, replacement, None, torch.Generator().manual_seed(seed), "cpu")
    raw = draw_negatives(pos, exc, n, m, replacement, None, torch.Generator().manual_seed(seed), "cpu")
    assert torch.equal(got, raw)
    if bool(active.all()):
        # the previous implementation: positions of the same generator, the padded sorted forbidden lists
        g = torch.Generator().manual_seed(seed)
        n_allowed = torch.tensor([len(a) for a in allowed])
        positions = _uniform_positions(n_allowed, (pos.shape[0], pos.shape[1], m), g, "cpu")
        if not replacement:
            small = n_allowed <= 4 * m
            positions = _make_distinct(positions, n_allowed, g, "cpu", small if bool(small.any()) else None, n)
        old = allowed_position_to_item(positions, forbidden_sorted(pos, exc, n), n)
        assert torch.equal(got, old)
        if replacement:  # brute force: the u-th allowed item, u from the same uniform numbers
            u = torch.rand((pos.shape[0], pos.shape[1], m), generator=torch.Generator().manual_seed(seed),
                           dtype=torch.float64)
            for r, a in enumerate(allowed):
                at = np.minimum(np.floor(u[r].numpy() * len(a)).astype(np.int64), len(a) - 1)
                assert got[r].tolist() == np.asarray(a)[at].tolist()
    for r, a in enumerate(allowed):  # never a positive or an excluded item
        if active[r]:
            assert set(got[r].reshape(-1).tolist()) <= set(a)


@settings(max_examples=examples(40), deadline=None)
@given(ragged(), st.sampled_from(["fixed", "without", "adaptive"]), st.sampled_from(["pessimistic", "random"]))
def test_scorer_and_matrix_paths_equal_with_raw_and_prepared_exclusions(case, kind, ties):
    pos, exc, n, seed = case
    scores = torch.randint(0, 4, (pos.shape[0], n), generator=torch.Generator().manual_seed(seed)).double()
    allowed = _allowed(pos, exc, n)
    smallest = min([len(a) for a, on in zip(allowed, (pos >= 0).any(1).tolist()) if on], default=1)
    design = {"fixed": 3, "without": SamplingDesign(max(1, min(3, smallest)), replacement=False),
              "adaptive": SamplingDesign(1, adaptive_max=16)}[kind]
    ex = prepare_exclusions(exc, n)
    fn = adaptive_sampled_ranks if kind == "adaptive" else sampled_ranks
    results = []
    for e in (exc, ex, ex):  # raw, prepared, the same prepared object again
        g = torch.Generator().manual_seed(seed)
        results.append(fn(scores, pos, design, exclude=e, generator=g, ties=ties))
        g = torch.Generator().manual_seed(seed)
        results.append(sampled_ranks_from_scorer(MatrixScorer(scores), pos, n, design, exclude=e, generator=g,
                                                 ties=ties))
    for r in results[1:]:
        assert torch.equal(r.ranks, results[0].ranks)
        assert torch.equal(r.n_candidates, results[0].n_candidates)
        for a, b in ((r.negatives, results[0].negatives), (r.n_samples, results[0].n_samples)):
            assert (a is None and b is None) or torch.equal(a, b)
    full = results[1].cost.full_pairs
    assert full == sum(len(a) + int((pos[r] >= 0).sum()) for r, a in enumerate(allowed) if (pos[r] >= 0).any())


@settings(max_examples=examples(40), deadline=None)
@given(ragged())
def test_prepared_form_holds_the_lists(case):
    pos, exc, n, seed = case
    ex = prepare_exclusions(exc, n)
    lists = [sorted(x for x in row.tolist() if x >= 0) for row in exc]
    assert ex.counts.tolist() == [len(x) for x in lists]
    padded = ex.padded()
    assert [[x for x in row.tolist() if x >= 0] for row in padded] == lists
    assert torch.equal(prepare_exclusions(padded, n).items, ex.items)
    at = torch.where(exc >= 0, exc, torch.full_like(exc, n))  # padding to a spare column
    mask = torch.zeros((exc.shape[0], n + 1), dtype=torch.bool).scatter_(1, at, True)[:, :n]
    assert torch.equal(prepare_exclusions(mask, n).items, ex.items)
    probe = torch.arange(n).expand(exc.shape[0], n)
    assert torch.equal(ex.contains(probe), mask)
    idx = torch.from_numpy(np.random.default_rng(seed).integers(0, exc.shape[0], size=5))
    sub = ex.select(idx)
    assert [[x for x in row.tolist() if x >= 0] for row in sub.padded()] == [lists[i] for i in idx.tolist()]
    # a block of rows, padded to a given width (the popularity draw's hole tables): the same lists, nothing else
    b = exc.shape[0]
    lo = int(np.random.default_rng(seed + 1).integers(0, b + 1))
    width = max([len(x) for x in lists], default=0) + 1
    block = ex.padded_block(lo, b - lo, width, n)
    assert block.shape == (b - lo, width)
    assert [[x for x in row.tolist() if x < n] for row in block] == lists[lo:]


def test_exact_paths_and_candidate_counts_take_prepared_exclusions():
    sc, pos, exc = _golden_problem(4)
    ex = prepare_exclusions(exc, sc.shape[1])
    for ties in rsp.ranking.TIES:
        assert torch.equal(rsp.exact_ranks(sc, pos, ex, ties, generator=torch.Generator().manual_seed(0)),
                           rsp.exact_ranks(sc, pos, exc, ties, generator=torch.Generator().manual_seed(0)))
    assert torch.equal(rsp.candidate_counts(60, pos, ex), rsp.candidate_counts(60, pos, exc))


def test_prepared_exclusions_are_not_changed_by_use():
    sc, pos, exc = _golden_problem(5)
    ex = prepare_exclusions(exc, 60)
    items, counts = ex.items.clone(), ex.counts.clone()
    for _ in range(2):
        sampled_ranks_from_scorer(MatrixScorer(sc), pos, 60, SamplingDesign(2, adaptive_max=32), exclude=ex,
                                  generator=torch.Generator().manual_seed(0))
    assert torch.equal(ex.items, items) and torch.equal(ex.counts, counts)


def test_bad_exclusions_are_named():
    sc, pos, exc = _golden_problem(6)
    n = sc.shape[1]
    ex = prepare_exclusions(exc, n)
    s = MatrixScorer(sc)
    with pytest.raises(ValueError, match="^exclude: prepared for 12 rows over 60 items"):
        sampled_ranks(sc[:, :50], pos, 3, exclude=ex)
    with pytest.raises(ValueError, match="^exclude: prepared for 12 rows"):
        sampled_ranks_from_scorer(s, pos[:5], n, 3, exclude=ex)
    with pytest.raises(ValueError, match="^exclude: prepared for 12 rows"):
        adaptive_sampled_ranks(sc[:5], pos[:5], SamplingDesign(2, adaptive_max=8), exclude=ex)
    with pytest.raises(ValueError, match="^exclude: prepared for"):
        rsp.exact_ranks(sc[:5], pos[:5], ex)
    on_meta = Exclusions(ex.items.to("meta"), ex.row_of.to("meta"), ex.counts.to("meta"), n)
    with pytest.raises(ValueError, match="^exclude: prepared on meta"):
        prepare_sampling_index(pos, on_meta, 12, n, torch.device("cpu"))
    with pytest.raises(ValueError, match="^exclude: .*same item twice"):
        prepare_exclusions(torch.tensor([[1, 2, 1], [0, -1, -1]]), 5)
    with pytest.raises(ValueError, match="^exclude: item indices must lie in 0..4"):
        prepare_exclusions(torch.tensor([[1, 5], [0, -1]]), 5)
    with pytest.raises(ValueError, match="^exclude"):
        prepare_exclusions(torch.tensor([[0.5, 1.0]]), 5)
    with pytest.raises(ValueError, match="^exclude"):
        prepare_exclusions("items", 5)
    with pytest.raises(ValueError, match="^n_items"):
        prepare_exclusions(torch.tensor([[1, 2]]), 0)
    bad = Exclusions(ex.items, ex.row_of, ex.counts, 61)
    with pytest.raises(ValueError, match="^exclude: prepared for 12 rows over 61 items"):
        sampled_ranks_from_scorer(s, pos, n, 3, exclude=bad)
    clash = pos.clone()
    row = 0 if (exc[0] >= 0).any() else 2
    clash[row, 0] = int(exc[row][exc[row] >= 0][0])
    for e in (exc, ex):  # a positive also excluded: raw and prepared alike
        with pytest.raises(ValueError, match="^exclude: 1 row\\(s\\) exclude one of their own positives"):
            sampled_ranks_from_scorer(s, clash, n, 3, exclude=e)
        with pytest.raises(ValueError, match="^exclude: 1 row\\(s\\) exclude one of their own positives"):
            sampled_ranks(sc, clash, 3, exclude=e)
    dup = exc.clone()
    dup[3, :2] = torch.tensor([7, 7]) if not (pos[3] == 7).any() else torch.tensor([8, 8])
    with pytest.raises(ValueError, match="^exclude: 1 row\\(s\\) list the same item twice"):
        sampled_ranks_from_scorer(s, pos, n, 3, exclude=dup)


@pytest.mark.parametrize("kind", ["fixed", "without", "adaptive", "popularity"])
def test_on_every_device_equal_to_the_cpu(device, kind):
    """Prepared and raw exclusions on the device (a CPU generator: the same numbers) give the CPU's results."""
    sc, pos, exc = _golden_problem(7)
    n = sc.shape[1]
    w = torch.rand(n, generator=torch.Generator().manual_seed(1)) + 0.05
    design = {"fixed": 5, "without": SamplingDesign(5, replacement=False),
              "adaptive": SamplingDesign(2, adaptive_max=32), "popularity": SamplingDesign(4, popularity=w)}[kind]
    e = exc[:, :20] if kind == "without" else exc
    ref = sampled_ranks_from_scorer(MatrixScorer(sc), pos, n, design, exclude=e,
                                    generator=torch.Generator().manual_seed(3))
    sc_d, pos_d, e_d = sc.to(device), pos.to(device), e.to(device)
    if kind == "popularity":
        design = SamplingDesign(4, popularity=w.to(device))
    for ex in (e_d, prepare_exclusions(e_d, n)):
        got = sampled_ranks_from_scorer(MatrixScorer(sc_d), pos_d, n, design, exclude=ex,
                                        generator=torch.Generator().manual_seed(3))
        assert torch.equal(got.ranks.cpu(), ref.ranks)
        fn = adaptive_sampled_ranks if kind == "adaptive" else sampled_ranks
        mat = fn(sc_d, pos_d, design, exclude=ex, generator=torch.Generator().manual_seed(3))
        assert torch.equal(mat.ranks.cpu(), ref.ranks)


@settings(max_examples=examples(40), deadline=None)
@given(ragged(), st.sampled_from(["duplicate", "positive"]), st.integers(0, 2**31 - 1))
def test_a_duplicate_or_an_excluded_positive_is_refused_on_every_path(case, fault, seed):
    """A row listing an item twice, or excluding one of its own positives, is a ValueError naming ``exclude`` on
    both paths, raw or prepared (the previous implementation's messages)."""
    pos, exc, n, _ = case
    rng = np.random.default_rng(seed)
    exc = torch.cat([exc, torch.full((exc.shape[0], 1), -1)], 1)  # a spare slot in every row
    if fault == "duplicate":
        rows = [r for r in range(exc.shape[0]) if (exc[r] >= 0).any()]
        if not rows:
            return
        r = int(rng.choice(rows))
        exc[r, -1] = int(rng.choice(exc[r][exc[r] >= 0].numpy()))
        match = "^exclude: 1 row\\(s\\) list the same item twice"
    else:
        rows = [r for r in range(pos.shape[0]) if (pos[r] >= 0).any()]
        if not rows:
            return
        r = int(rng.choice(rows))
        exc[r, -1] = int(rng.choice(pos[r][pos[r] >= 0].numpy()))
        match = "^exclude: 1 row\\(s\\) exclude one of their own positives"
    scores = torch.zeros((pos.shape[0], n), dtype=torch.float64)
    calls = [lambda e: sampled_ranks(scores, pos, 1, exclude=e),
             lambda e: adaptive_sampled_ranks(scores, pos, SamplingDesign(1, adaptive_max=4), exclude=e),
             lambda e: sampled_ranks_from_scorer(MatrixScorer(scores), pos, n, 1, exclude=e),
             lambda e: rsp.exact_ranks(scores, pos, e)]
    for call in calls:
        with pytest.raises(ValueError, match=match):
            call(exc)
    if fault == "duplicate":
        with pytest.raises(ValueError, match=match):
            prepare_exclusions(exc, n)
    else:
        ex = prepare_exclusions(exc, n)  # valid alone; the call that pairs it with the positives refuses it
        for call in calls:
            with pytest.raises(ValueError, match=match):
                call(ex)
