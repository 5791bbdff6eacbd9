"""Exact and sampled ranks against brute force, laws, and invariants."""

import math
import warnings

import numpy as np
import pytest
import scipy.stats as st
import torch
from hypothesis import given, settings
from hypothesis import strategies as hs
from _profiles import examples

from reco_sampled_plugin import SamplingDesign, exact_ranks, sampled_ranks
from reco_sampled_plugin import _inputs, counting


def brute_ranks(scores, pos, exc, ties, count_other=True):
    """Rank by counting over each row in Python: the oracle. Relevant items tied with each other are placed in
    slot order under the deterministic policies (their ranks form an ordering); ``average`` splits every tie."""
    out = np.zeros(pos.shape, dtype=float)
    for b in range(scores.shape[0]):
        excluded = set(int(e) for e in exc[b] if e >= 0) if exc is not None else set()
        positives = [int(p) for p in pos[b] if p >= 0]
        for j, p in enumerate(pos[b]):
            if p < 0:
                continue
            others = [i for i in range(scores.shape[1]) if i not in excluded and i != p]
            if not count_other:
                others = [i for i in others if i not in positives]
            s = scores[b]
            gt = sum(s[i] > s[p] for i in others)
            eq = sum(s[i] == s[p] for i in others)
            eq_irr = sum(s[i] == s[p] for i in others if i not in positives)
            tied_pos_before = sum(s[int(q)] == s[p] for q in pos[b][:j] if q >= 0) if count_other else 0
            out[b, j] = {"pessimistic": 1 + gt + eq_irr + tied_pos_before, "optimistic": 1 + gt + tied_pos_before,
                         "average": 1 + gt + eq / 2}[ties]
    return out


def random_problem(rng, b=7, n=30, p=4, e=5, levels=None):
    scores = rng.standard_normal((b, n)) if levels is None else rng.integers(0, levels, (b, n)).astype(float)
    pos = np.full((b, p), -1)
    exc = np.full((b, e), -1)
    for i in range(b):
        items = rng.permutation(n)
        k = rng.integers(1, p + 1)
        pos[i, :k] = items[:k]
        q = rng.integers(0, e + 1)
        exc[i, :q] = items[k : k + q]
    return scores, pos, exc


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
@pytest.mark.parametrize("levels", [None, 3])
@pytest.mark.parametrize("count_other", [True, False])
def test_exact_ranks_match_brute_force(ties, levels, count_other):
    rng = np.random.default_rng(1)
    scores, pos, exc = random_problem(rng, levels=levels)
    got = exact_ranks(torch.tensor(scores), torch.tensor(pos), torch.tensor(exc), ties, count_other_positives=count_other)
    np.testing.assert_array_equal(got.numpy(), brute_ranks(scores, pos, exc, ties, count_other))


@settings(max_examples=80, deadline=None)
@given(seed=hs.integers(0, 2**31 - 1), b=hs.integers(1, 6), n=hs.integers(10, 70), levels=hs.sampled_from([None, 2, 5]),
       dtype=hs.sampled_from([torch.float32, torch.float64, torch.bfloat16, torch.float16]),
       path=hs.sampled_from(["numpy", "cpu chunks", "whole rows"]), form=hs.sampled_from(["index", "masks"]),
       ties=hs.sampled_from(["pessimistic", "optimistic", "average"]), offset=hs.integers(0, 3))
def test_exact_ranks_match_brute_force_on_every_eager_path(seed, b, n, levels, dtype, path, form, ties, offset):
    """Every eager counting path (numpy's on a CPU, the CPU's torch loop in small chunks, an accelerator's whole
    rows) and both mask scans give the oracle's ranks, for any dtype, ties, padding, and inputs given as views offset
    into wider tensors (scores, masks)."""
    rng = np.random.default_rng(seed)
    scores, pos, exc = random_problem(rng, b=b, n=n, levels=levels)  # 4 positives, 5 exclusions at most
    wide = torch.zeros(b, n + offset, dtype=dtype)
    wide[:, offset:] = torch.tensor(scores).to(dtype)
    s = wide[:, offset:]  # a view: rows n + offset apart
    exact = s.to(torch.float64).numpy()  # the scores as compared (low precision rounds some to equal values)
    slots = pos
    if form == "masks":
        pm = torch.zeros(b, n + offset, dtype=torch.bool)
        em = torch.zeros(b, n + offset, dtype=torch.bool)
        for i in range(b):
            pm[i, offset + pos[i][pos[i] >= 0]] = True
            em[i, offset + exc[i][exc[i] >= 0]] = True
        positives, excluded = pm[:, offset:], em[:, offset:]
        ascending = np.sort(np.where(pos >= 0, pos, n), 1)  # a mask's slots: its items in ascending order
        slots = np.where(ascending < n, ascending, -1)
    else:
        positives, excluded = torch.tensor(pos), torch.tensor(exc)
    want = brute_ranks(exact, slots, exc, ties)
    old = (counting.get_backend(), counting._numpy_blocked[0], counting._cpu_chunks[0], counting._EAGER_CPU_CHUNK_ELEMENTS,
           _inputs._numpy_scan[0])
    counting.set_backend("eager")
    counting._numpy_blocked[0] = path != "numpy"
    counting._cpu_chunks[0] = path != "whole rows"
    counting._EAGER_CPU_CHUNK_ELEMENTS = 7  # chunks of the floor's 64 items: two where n > 64
    _inputs._numpy_scan[0] = path != "whole rows"  # an accelerator scans masks in torch
    try:
        got = exact_ranks(s, positives, excluded, ties)
    finally:
        counting.set_backend(old[0])
        (counting._numpy_blocked[0], counting._cpu_chunks[0], counting._EAGER_CPU_CHUNK_ELEMENTS,
         _inputs._numpy_scan[0]) = old[1:]
    got = got.double().numpy()  # a mask's width is its longest row's; the oracle's further slots are padding (0)
    np.testing.assert_array_equal(got, want[:, : got.shape[1]])
    assert not want[:, got.shape[1]:].any()


@settings(max_examples=40, deadline=None)
@given(seed=hs.integers(0, 2**31 - 1), b=hs.integers(1, 6), n=hs.integers(10, 140), levels=hs.sampled_from([2, 5]),
       dtype=hs.sampled_from([torch.float32, torch.bfloat16]))
def test_random_ties_are_the_same_on_every_eager_path(seed, b, n, levels, dtype):
    """The random tie policy's ranks (tied items with smaller keys in front) are the same on the CPU's torch loop in
    64-item chunks and on an accelerator's whole rows, for one generator seed, and each row's ranks among a tie group
    stay within its tie group: from 1 + the items above it to that + the items tied with it."""
    rng = np.random.default_rng(seed)
    scores, pos, exc = random_problem(rng, b=b, n=n, levels=levels)
    s = torch.tensor(scores).to(dtype)
    exact = s.to(torch.float64).numpy()
    old = (counting.get_backend(), counting._cpu_chunks[0], counting._EAGER_CPU_CHUNK_ELEMENTS)
    counting.set_backend("eager")
    counting._EAGER_CPU_CHUNK_ELEMENTS = 7  # chunks of the floor's 64 items: up to three at these n
    got = []
    try:
        for whole in (False, True):
            counting._cpu_chunks[0] = not whole
            got.append(exact_ranks(s, torch.tensor(pos), torch.tensor(exc), "random",
                                   generator=torch.Generator().manual_seed(seed)))
    finally:
        counting.set_backend(old[0])
        counting._cpu_chunks[0], counting._EAGER_CPU_CHUNK_ELEMENTS = old[1:]
    assert torch.equal(got[0], got[1])
    r = got[0].double().numpy()
    for i in range(b):
        for j in np.flatnonzero(pos[i] >= 0):
            others = [k for k in range(n) if k != pos[i, j] and k not in set(exc[i][exc[i] >= 0].tolist())]
            above = sum(exact[i, k] > exact[i, pos[i, j]] for k in others)
            tied = sum(exact[i, k] == exact[i, pos[i, j]] for k in others)
            assert 1 + above <= r[i, j] <= 1 + above + tied, (i, j, r[i, j], above, tied)


def test_mask_and_index_inputs_agree():
    rng = np.random.default_rng(2)
    scores, pos, exc = random_problem(rng)
    s = torch.tensor(scores)
    pos_mask = torch.zeros(s.shape, dtype=torch.bool)
    exc_mask = torch.zeros(s.shape, dtype=torch.bool)
    for b in range(s.shape[0]):
        pos_mask[b, pos[b][pos[b] >= 0]] = True
        exc_mask[b, exc[b][exc[b] >= 0]] = True
    by_mask = exact_ranks(s, pos_mask, exc_mask)
    by_index = exact_ranks(s, torch.tensor(pos), torch.tensor(exc))
    # mask layout lists positives in ascending item order
    for b in range(s.shape[0]):
        want = sorted(zip(pos[b][pos[b] >= 0], by_index[b][pos[b] >= 0].tolist()))
        assert by_mask[b][: len(want)].tolist() == [r for _, r in want]


def test_random_ties_are_a_permutation_within_tie_groups(gen):
    # every item tied: ranks of the positives must be distinct, uniform over 1..n_candidates
    n, reps = 8, 4000
    scores = torch.zeros(reps, n)
    pos = torch.tensor([[0, 3]]).repeat(reps, 1)
    exc = torch.tensor([[5]]).repeat(reps, 1)
    r = exact_ranks(scores, pos, exc, "random", generator=gen)
    assert (r[:, 0] != r[:, 1]).all()
    counts = torch.bincount(r[:, 0])[1:].numpy()
    assert counts.shape == (n - 1,)  # 7 candidates: ranks 1..7, each reached
    chi2 = st.chisquare(counts)
    assert chi2.pvalue > 1e-3
    # reproducible from the generator
    r2 = exact_ranks(scores, pos, exc, "random", generator=torch.Generator().manual_seed(12345))
    assert torch.equal(r, r2)


def test_compiled_and_eager_counts_agree():
    torch.manual_seed(0)
    scores = torch.randn(64, 20_000)
    scores[:, :50] = 0.0  # ties
    pos = torch.randint(0, 20_000, (64, 5))
    pos[:, 0] = 3
    ref = torch.gather(scores, 1, pos)
    ref[::4, -1] = float("inf")  # a padded slot of the factor path: nothing beats it
    counting.set_backend("eager")
    try:
        eager = [counting.count_beating(scores, ref, inc) for inc in (False, True)]
        seeds = torch.arange(64).unsqueeze(1)
        keys = counting.item_keys(pos, seeds)
        eager_tb = counting.count_tied_before(scores, ref, keys, seeds)
        counting.set_backend("compiled")
        compiled = [counting.count_beating(scores, ref, inc) for inc in (False, True)]
        compiled_tb = counting.count_tied_before(scores, ref, keys, seeds)
    finally:
        counting.set_backend("auto")
    for a, b in zip(eager, compiled):
        assert torch.equal(a, b)
    assert torch.equal(eager_tb, compiled_tb)
    assert (eager_tb[:, 0] > 0).any()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_compiled_ranks_of_half_precision_scores_equal_the_eager_ones(dtype):
    """Scores in half precision (mixed-precision models) with many ties, exclusions and padding: the compiled kernels
    give the eager path's exact ranks for every tie policy, and both the brute-force ranks of the same scores (the
    excluded items at -inf, the other positives competing)."""
    g = torch.Generator().manual_seed(3)
    scores = (torch.randint(0, 9, (48, 5_000), generator=g).to(torch.float32) / 4).to(dtype)  # exact in both dtypes
    pos = torch.stack([torch.randperm(5_000, generator=g)[:9] for _ in range(48)])
    pos, exc = pos[:, :3].clone(), pos[:, 3:].clone()
    pos[::5, 2] = -1
    exc[::3, 4:] = -1
    got = {}
    try:
        for backend in ("eager", "compiled"):
            counting.set_backend(backend)
            got[backend] = {t: exact_ranks(scores, pos, exc, t) for t in ("pessimistic", "optimistic", "average")}
    finally:
        counting.set_backend("auto")
    s = scores.to(torch.float64)
    s.scatter_(1, exc.clamp(min=0), torch.where(exc >= 0, -math.inf, s.gather(1, exc.clamp(min=0))))
    ref = s.gather(1, pos.clamp(min=0))  # the other positives compete (the default), the excluded items do not
    beat = (s.unsqueeze(1) > ref.unsqueeze(2)).sum(-1)
    tied = (s.unsqueeze(1) == ref.unsqueeze(2)).sum(-1)  # the positive itself included
    # positives tied with each other in slot order under the first two policies (their ranks form an ordering)
    same = (ref.unsqueeze(2) == ref.unsqueeze(1)) & (pos >= 0).unsqueeze(1)  # [b, j, k]: slot k ties slot j
    before = torch.tril(same, diagonal=-1).sum(-1)
    after = torch.triu(same, diagonal=1).sum(-1)
    for t, want in (("optimistic", beat + 1 + before), ("pessimistic", beat + tied - after),
                    ("average", beat + (tied + 1) / 2)):
        assert torch.equal(got["eager"][t], got["compiled"][t]), t
        valid = pos >= 0
        assert torch.equal(got["eager"][t][valid].to(torch.float64), want[valid].to(torch.float64)), t
        assert bool((got["eager"][t][~valid] == 0).all())


@pytest.mark.parametrize("p", [1, 5, 7, 11])
def test_grouped_compiled_counts_and_fused_finite_check(p):
    """Padded counts run in compiled passes of up to 5 references (7 -> 4 + 3, 11 -> 4 + 4 + 3): equal to
    the eager counts; the same pass flags exactly the rows holding NaN, +inf or -inf, on both backends."""
    torch.manual_seed(p)
    scores = torch.randn(40, 9_000)
    scores[:, :30] = 0.25  # ties
    ref = torch.cat([scores[:, 30 + torch.randperm(8_000)[: p - 1]], torch.full((40, 1), 0.25)], 1)[:, :p]
    bad = scores.clone()
    bad[3, 100], bad[17, 5], bad[29, 8_999] = math.nan, math.inf, -math.inf
    want = {}
    try:
        for backend in ("eager", "compiled"):
            counting.set_backend(backend)
            for inc in (False, True):
                counts = counting.count_beating(scores, ref, inclusive=inc)
                checked, finite = counting.count_beating_checked(scores, ref, inclusive=inc)
                assert torch.equal(counts, checked) and bool(finite.all())
                want.setdefault(inc, counts)
                assert torch.equal(counts, want[inc]), (backend, inc)
                _, finite_bad = counting.count_beating_checked(bad, ref, inclusive=inc)
                assert finite_bad.nonzero().numel() == 37 and set((~finite_bad).nonzero().flatten().tolist()) == {3, 17, 29}
    finally:
        counting.set_backend("auto")
    brute = (scores.unsqueeze(1) >= ref.unsqueeze(2)).sum(-1)
    assert torch.equal(want[True], brute)
    pos = torch.tensor([[0, 40]] * 40)
    try:
        counting.set_backend("compiled")
        with pytest.raises(ValueError, match=r"NaN or inf in 3 of 40 rows \(first bad row 3\)"):
            exact_ranks(bad, pos)
    finally:
        counting.set_backend("auto")


def test_compiled_counts_trace_one_graph_for_views_and_grad_mode():
    """One compiled graph for a score matrix of its own, a view of a flat buffer (the factor path's tiles), scores
    that require grad, inside or outside no_grad: all run the graph the first call traced (a recompile raises), and
    count as brute force does."""
    import torch._dynamo

    g = torch.Generator().manual_seed(3)
    flat = torch.randn(40 * 9_000 + 1, generator=g)
    forms = {
        "own rows": flat[1:].clone().view(40, 9_000),
        "view": flat[: 37 * 5_000].view(37, 5_000),
        "view past an offset": flat[7 : 7 + 2 * 20_000].view(2, 20_000),
        "requires grad": flat[: 5 * 6_000].clone().view(5, 6_000).requires_grad_(),
    }
    try:
        counting.set_backend("compiled")
        counting.count_beating_checked(forms["own rows"], forms["own rows"][:, :3].clone())  # traced here
        # a recompile raises, and the counting's fallback to the eager path warns: an error here
        with torch._dynamo.config.patch(error_on_recompile=True), warnings.catch_warnings():
            warnings.simplefilter("error")
            for name, scores in forms.items():
                ref = scores.detach()[:, 10:13].clone()
                for grad in (True, False):
                    with torch.set_grad_enabled(grad):
                        counts, finite = counting.count_beating_checked(scores, ref)
                    want = (scores.detach().unsqueeze(1) > ref.unsqueeze(2)).sum(-1)
                    assert torch.equal(counts, want) and bool(finite.all()), (name, grad)
        assert "gt" not in counting._compile_failed
    finally:
        counting.set_backend("auto")


def test_row_indexed_counts_match_brute_force_on_both_backends():
    """count_beating_rows: one reference per positive against its own row (users with 1 to 40 positives,
    ties, -inf exclusions), compiled and eager, equal to a brute-force numpy count."""
    torch.manual_seed(1)
    scores = torch.randn(50, 3_000)
    scores[:, :40] = 0.5  # ties
    scores[:, 40:90] = -math.inf  # excluded items
    per_user = torch.randint(1, 41, (50,))
    rows = torch.repeat_interleave(torch.arange(50), per_user)
    cols = torch.randint(0, 3_000, rows.shape)
    cols[::7] = 3  # some positives tied
    ref = scores[rows, cols]
    s_np, r_np, ref_np = scores.numpy(), rows.numpy(), ref.numpy()
    brute = {inc: np.array([(s_np[r] >= t).sum() if inc else (s_np[r] > t).sum() for r, t in zip(r_np, ref_np)])
             for inc in (False, True)}
    try:
        for backend in ("eager", "compiled"):
            counting.set_backend(backend)
            for inc in (False, True):
                got = counting.count_beating_rows(scores, rows, ref, inclusive=inc)
                assert got.dtype == torch.int64
                np.testing.assert_array_equal(got.numpy(), brute[inc], err_msg=f"{backend} inclusive={inc}")
    finally:
        counting.set_backend("auto")
    assert (brute[True] - brute[False]).max() >= 40  # the ties were exercised
    with pytest.raises(ValueError, match="rows / ref"):
        counting.count_beating_rows(scores, rows[:-1], ref)


@settings(max_examples=examples(40), deadline=None)
@given(seed=hs.integers(0, 10_000), levels=hs.sampled_from([None, 2, 5]), ties=hs.sampled_from(["pessimistic", "optimistic", "average"]))
def test_rank_invariants(seed, levels, ties):
    rng = np.random.default_rng(seed)
    scores, pos, exc = random_problem(rng, b=3, n=12, levels=levels)
    s, p, e = torch.tensor(scores), torch.tensor(pos), torch.tensor(exc)
    base = exact_ranks(s, p, e, ties)
    # permuting the items (and relabelling indices) leaves ranks unchanged
    perm = torch.tensor(rng.permutation(s.shape[1]))
    inv = torch.argsort(perm)
    relabel = lambda idx: torch.where(idx >= 0, inv[idx.clamp(min=0)], idx)  # noqa: E731
    assert torch.equal(exact_ranks(s[:, perm], relabel(p), relabel(e), ties), base)
    # excluded items never count: changing their scores changes nothing
    s2 = s.clone()
    for b in range(s.shape[0]):
        idx = e[b][e[b] >= 0]
        s2[b, idx] = torch.tensor(rng.standard_normal(len(idx)) * 100)
    assert torch.equal(exact_ranks(s2, p, e, ties), base)
    # raising a positive's score never worsens its rank
    s3 = s.clone()
    s3[0, p[0, 0]] += 0.5
    assert exact_ranks(s3, p, e, ties)[0, 0] <= base[0, 0]
    # ranks lie in 1..n_candidates
    valid = p >= 0
    n_cand = s.shape[1] - (e >= 0).sum(1, keepdim=True)
    assert ((base[valid] >= 1).all()) and (base <= n_cand).all()


@pytest.mark.parametrize("replacement,law", [(True, "binomial"), (False, "hypergeometric")])
def test_sampled_rank_histogram_follows_the_law(replacement, law, gen):
    # one positive per row at a known exact rank among the irrelevant candidates
    n_items, m, users = 60, 10, 20_000
    scores = torch.arange(n_items, 0, -1, dtype=torch.float64).repeat(users, 1)  # item i has rank i + 1
    pos = torch.full((users, 1), 20)  # exact rank 21 among all
    exc = torch.tensor([[0, 59]]).repeat(users, 1)  # excluded: one above, one below
    res = sampled_ranks(scores, pos, SamplingDesign(m, replacement=replacement), exc, generator=gen)
    n = int(res.n_candidates[0])
    assert n == n_items - 2 and (res.n_candidates == n).all()
    r_exact = 20  # 19 non-excluded items above it
    observed = torch.bincount(res.ranks[:, 0], minlength=m + 2)[1:].numpy()
    j = np.arange(m + 1)
    probs = st.binom(m, (r_exact - 1) / (n - 1)).pmf(j) if law == "binomial" else st.hypergeom(n - 1, r_exact - 1, m).pmf(j)
    expected = probs * users
    keep = expected > 5
    obs = np.append(observed[keep], observed[~keep].sum())
    exp = np.append(expected[keep], expected[~keep].sum())
    assert st.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue > 1e-3
    # negatives never hit positives or excluded items; without replacement they are distinct
    neg = res.negatives[:, 0, :]
    assert not torch.isin(neg, torch.tensor([0, 20, 59])).any()
    if not replacement:
        assert (torch.sort(neg, 1).values.diff(dim=1) > 0).all()


def test_sampled_auc_unbiased_by_simulation(gen):
    n_items, m, users = 200, 20, 5000
    torch.manual_seed(3)
    scores = torch.randn(users, n_items, dtype=torch.float64)
    pos = torch.randint(0, n_items, (users, 1))
    r = exact_ranks(scores, pos)[:, 0].double()
    exact_auc = ((n_items - r) / (n_items - 1)).mean()
    res = sampled_ranks(scores, pos, m, generator=gen)
    sampled_auc = (m + 1 - res.ranks[:, 0].double()) / m
    se = sampled_auc.std() / users**0.5
    assert abs(float(sampled_auc.mean() - exact_auc)) < 4 * float(se)


def test_popularity_sampling_follows_weights(gen):
    n_items, users, m = 6, 20_000, 3
    scores = torch.randn(users, n_items)
    pos = torch.zeros(users, 1, dtype=torch.int64)
    w = torch.tensor([5.0, 1.0, 2.0, 3.0, 0.0, 4.0])
    res = sampled_ranks(scores, pos, SamplingDesign(m, popularity=w), generator=gen)
    counts = torch.bincount(res.negatives.reshape(-1), minlength=n_items).double()
    assert counts[0] == 0 and counts[4] == 0
    expected = w[1:].clone(); expected[3] = 0
    freq = counts[1:] / counts.sum()
    np.testing.assert_allclose(freq.numpy(), (expected / expected.sum()).numpy(), atol=0.01)
    res2 = sampled_ranks(scores, pos, SamplingDesign(3, popularity=w, replacement=False), generator=gen)
    assert (torch.sort(res2.negatives[:, 0], 1).values.diff(dim=1) > 0).all()


def test_predrawn_negatives_ncf_style():
    scores = torch.tensor([[0.1, 0.9, 0.5, 0.3, 0.7], [0.5, 0.4, 0.3, 0.2, 0.1]])
    pos = torch.tensor([0, 4])
    neg = torch.tensor([[1, 2, 3], [0, 1, 2]])
    res = sampled_ranks(scores, pos, negatives=neg)
    assert res.ranks[:, 0].tolist() == [4, 4]
    assert res.n_candidates.tolist() == [5, 5]
    with pytest.raises(ValueError, match="negatives"):
        sampled_ranks(scores, pos, negatives=torch.tensor([[0, 2, 3], [0, 1, 2]]))


def test_bad_input_errors_name_the_argument():
    s = torch.randn(3, 10)
    with pytest.raises(ValueError, match="scores: NaN or inf in 1 of 3 rows"):
        bad = s.clone(); bad[1, 2] = float("nan")
        exact_ranks(bad, torch.tensor([0, 1, 2]))
    with pytest.raises(ValueError, match="scores"):
        exact_ranks(torch.randn(10), torch.tensor([0]))
    with pytest.raises(ValueError, match="positives"):
        exact_ranks(s, torch.tensor([0, 1, 10]))
    with pytest.raises(ValueError, match="positives"):
        exact_ranks(s, torch.tensor([[0, 0], [1, -1], [2, -1]]))
    with pytest.raises(ValueError, match="exclude"):
        exact_ranks(s, torch.tensor([0, 1, 2]), exclude=torch.tensor([[0], [5], [6]]))
    with pytest.raises(ValueError, match="ties"):
        exact_ranks(s, torch.tensor([0, 1, 2]), ties="first")
    with pytest.raises(ValueError, match="n_samples"):
        sampled_ranks(s, torch.tensor([0, 1, 2]), SamplingDesign(10, replacement=False))
    with pytest.raises(ValueError, match="positives"):
        exact_ranks(s, torch.zeros(3, 9, dtype=torch.bool))
    if torch.cuda.is_available():  # pragma: no cover - exercised on GPU machines
        with pytest.raises(ValueError, match="devices"):
            exact_ranks(s.cuda(), torch.tensor([0, 1, 2]))


def test_finite_check_catches_inf_and_ignores_overflowing_sums():
    big = torch.full((2, 4), 3e38, dtype=torch.float32)  # row sums overflow, values are finite
    assert exact_ranks(big, torch.tensor([0, 1])).tolist() == [[4], [4]]
    for bad_value in (float("inf"), float("-inf"), float("nan")):
        s = torch.randn(5, 6)
        s[3, 1] = bad_value
        s[4, 0] = bad_value
        with pytest.raises(ValueError, match="NaN or inf in 2 of 5 rows"):
            exact_ranks(s, torch.tensor([0, 1, 2, 3, 4]))


def test_without_replacement_mixed_pool_sizes(gen):
    # one row with a tiny pool (keys path), one with a large pool (rejection path)
    n_items, m = 400, 5
    scores = torch.randn(2, n_items)
    exclude = torch.full((2, n_items - 8), -1)
    exclude[0] = torch.arange(8, n_items)  # row 0: 7 irrelevant candidates left
    res = sampled_ranks(scores, torch.tensor([0, 0]), SamplingDesign(m, replacement=False), exclude, generator=gen)
    assert res.n_candidates.tolist() == [8, n_items]
    for row in res.negatives[:, 0]:
        assert len(set(row.tolist())) == m
    assert (res.negatives[0] < 8).all() and (res.negatives[0] > 0).all()


@settings(max_examples=examples(60), deadline=None)
@given(hs.integers(0, 2**31 - 1), hs.integers(1, 6), hs.integers(1, 8))
def test_positive_also_excluded_matches_brute_force(seed, n_pos, n_exc):
    """The overlap check (each positive looked up in its row's sorted exclusions) raises exactly when some
    row excludes one of its own positives, naming how many rows do."""
    from reco_sampled_plugin.ranking import prepare_index

    g = torch.Generator().manual_seed(seed)
    b, n = 6, 15
    pos = torch.stack([torch.randperm(n, generator=g)[:n_pos] for _ in range(b)])
    exc = torch.stack([torch.randperm(n, generator=g)[:n_exc] for _ in range(b)])
    pos[torch.rand(b, n_pos, generator=g) < 0.3] = -1
    exc[torch.rand(b, n_exc, generator=g) < 0.3] = -1
    clash_rows = int(((pos.unsqueeze(2) == exc.unsqueeze(1)) & (pos.unsqueeze(2) >= 0)).any(2).any(1).sum())
    if clash_rows:
        with pytest.raises(ValueError, match=f"exclude: {clash_rows} row\\(s\\) exclude one of their own positives"):
            prepare_index(pos, exc, b, n, "cpu")
    else:
        got_pos, got_exc = prepare_index(pos, exc, b, n, "cpu")
        assert torch.equal(got_pos, pos) and torch.equal(got_exc, exc)


@pytest.mark.parametrize("popularity", [False, True])
def test_rows_without_positives_draw_nothing(popularity):
    """A row with no relevant item needs no pool to sample from (even one with every item excluded), gets
    rank 0 and n = its irrelevant items; a batch where every row has one draws exactly as before."""
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(3, 6, generator=g)
    pos = torch.tensor([[1, -1], [-1, -1], [-1, -1]])
    exc = torch.tensor([[-1, -1, -1, -1, -1, -1], [0, 2, 3, 4, -1, -1], [0, 1, 2, 3, 4, 5]])
    kw = dict(n_samples=SamplingDesign(3, replacement=False, popularity=torch.ones(6) if popularity else None))
    out = sampled_ranks(scores, pos, exclude=exc, generator=torch.Generator().manual_seed(1), **kw)
    alone = sampled_ranks(scores[:1], pos[:1], exclude=exc[:1], generator=torch.Generator().manual_seed(1), **kw)
    assert torch.equal(out.ranks[:1], alone.ranks) and torch.equal(out.negatives[:1], alone.negatives)
    assert out.ranks[1:].eq(0).all() and out.negatives[1:].eq(-1).all()
    assert out.n_candidates.tolist() == [6, 2, 0]
    with pytest.raises(ValueError, match="fewer"):
        sampled_ranks(scores[1:2], torch.tensor([[1]]), exclude=exc[1:2], generator=torch.Generator().manual_seed(1), **kw)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
def test_tied_relevant_items_form_an_ordering(ties):
    """Two relevant items with one score (popularity or integer scores tie often) take ranks 1 and 2 in slot
    order, so list metrics stay possible: P@1 = 1 and AUC = 1, never P@1 = 2 or AUC > 1 (nor P@1 = 0)."""
    from reco_sampled_plugin import per_user_metrics

    scores = torch.tensor([[7.0, 7.0, 3.0, 1.0, 0.0, 2.0]])
    pos = torch.tensor([[0, 1]])
    assert exact_ranks(scores, pos, ties=ties).tolist() == [[1, 2]]
    assert exact_ranks(scores, torch.tensor([[1, 0]]), ties=ties).tolist() == [[1, 2]]  # slot order, not item order
    df = per_user_metrics(scores, pos, ["precision@1", "hit@1", "auc"], ties=ties)
    assert df.iloc[0].tolist() == [1.0, 1.0, 1.0]
    tied_irrelevant = torch.tensor([[7.0, 7.0, 7.0, 1.0]])  # an irrelevant item tied too: the policy decides its place
    assert exact_ranks(tied_irrelevant, pos, ties=ties).tolist() == ([[2, 3]] if ties == "pessimistic" else [[1, 2]])
