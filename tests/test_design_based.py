"""The exact share (``SamplingDesign(m, exact_share=...)``) and the difference estimator ``diff`` (_design_based.py).

Oracles: the estimator's expectation and variance by enumerating every Poisson sample of a few positives (closed
forms of eq. 1-2), PPI++'s lambda as the minimiser of the variance estimate, unbiasedness and coverage by repeating
the keyed choice on fixed sampled data with known exact ranks (a model the data mislead), and the exact ranks of the
chosen positives against ``exact_ranks`` of the score matrix.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import registry
from reco_sampled_plugin._design_based import (KeyedInclusion, ShareTable, _posterior_means, difference_estimate,
                                               inclusion_probabilities, model_fit, paired_difference_by_design,
                                               predictions, reusing_fits, share_inclusion)
from reco_sampled_plugin._rank_hist import metric_at
from reco_sampled_plugin._share import with_share_arrays
from reco_sampled_plugin.design import ExactShare, SamplingDesign
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.metrics import metric_bounds
from reco_sampled_plugin.simulate import draw_sampled_ranks


def _matrix(b: int = 200, n: int = 600, seed: int = 0, lift: float = 2.0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=torch.float64)
    pos = torch.stack([torch.randperm(n, generator=g)[:2] for _ in range(b)])
    scores[torch.arange(b).unsqueeze(1), pos] += lift
    return scores, pos


@pytest.fixture(scope="module")
def matrix():
    return _matrix()


# ------------------------------------------------------------------------------------------ closed forms
@pytest.mark.parametrize("weighted", [False, True])
def test_expectation_and_variance_by_enumeration(weighted):
    """Every subset S of 6 positives with its Poisson probability: E[theta^] = theta (lambda = 1), the variance of
    theta^ is sum (1 - pi) (w e)^2 / pi / W^2, and E[V^] equals it (V^ is unbiased)."""
    rng = np.random.default_rng(3)
    y, f = rng.uniform(0, 1, 6), rng.uniform(0, 1, 6)
    pi = np.array([0.2, 0.5, 0.9, 0.35, 1.0, 0.6])
    w = rng.uniform(0.5, 2.0, 6) if weighted else np.ones(6)
    theta = float(w @ y / w.sum())
    mean = second = ev = 0.0
    for bits in itertools.product([False, True], repeat=6):
        s = np.array(bits)
        prob = float(np.prod(np.where(s, pi, 1 - pi)))
        if prob == 0:
            continue
        v, se, lam = difference_estimate(y, f, pi, s, w if weighted else None, "one")
        assert lam == 1.0
        mean += prob * v
        second += prob * v * v
        v_hat = float(((1 - pi[s]) * (w[s] * (y[s] - f[s]) / pi[s]) ** 2).sum()) / w.sum() ** 2  # eq. (2)
        random = int((s & (pi < 1)).sum())
        assert (se * se == pytest.approx(v_hat, rel=1e-12, abs=1e-300)) if random >= 2 else se == math.inf
        ev += prob * v_hat
    target = float(((1 - pi) / pi * (w * (y - f)) ** 2).sum()) / w.sum() ** 2
    assert mean == pytest.approx(theta, abs=1e-12)
    assert second - mean * mean == pytest.approx(target, rel=1e-9)
    assert ev == pytest.approx(target, rel=1e-9)  # V^ is unbiased


def test_the_default_lambda_is_exactly_unbiased_where_the_tuned_one_is_not():
    """A rare hit (2 hits among 12 positives, a 25% share, predictions that rank them poorly): over every Poisson
    share, the default (lambda = 1) has E[theta^] = theta exactly; PPI++'s lambda (eq. 3), tuned on the share's few
    hits, does not (about -8% of theta). Both recomputed here from eq. 1 and 3 on each share."""
    n = 12
    y = np.zeros(n)
    y[[2, 9]] = 1.0
    f = np.linspace(0.02, 0.4, n)[np.random.default_rng(1).permutation(n)]
    pi = np.full(n, 0.25)
    theta = float(y.mean())
    shares = np.array(list(itertools.product([False, True], repeat=n)))
    prob = np.prod(np.where(shares, pi, 1 - pi), axis=1)
    default = np.array([difference_estimate(y, f, pi, s)[0] for s in shares])
    tuned = np.array([difference_estimate(y, f, pi, s, None, "tuned")[0] for s in shares])
    a = (1 - pi) / pi**2  # eq. 3 with w = 1; lambda = 1 where the share holds no prediction to tune on
    num, den = shares @ (a * y * f), shares @ (a * f * f)
    lam = np.where(den > 0, np.clip(num / np.where(den > 0, den, 1.0), 0.0, 1.0), 1.0)
    one = (f.sum() + shares @ ((y - f) / pi)) / n  # eq. 1, lambda = 1
    by_lam = (lam * f.sum() + shares @ (y / pi) - lam * (shares @ (f / pi))) / n  # eq. 1, lambda of eq. 3
    assert np.allclose(default, one, rtol=0, atol=1e-12) and np.allclose(tuned, by_lam, rtol=0, atol=1e-12)
    assert float(prob.sum()) == pytest.approx(1.0, abs=1e-12)
    assert float(prob @ default) == pytest.approx(theta, abs=1e-12)  # exactly unbiased
    bias = float(prob @ by_lam) - theta
    assert bias < -0.05 * theta  # tuned on the share's hits: biased (low, as on the goal grid)


def test_tuned_lambda_minimises_the_variance_estimate():
    rng = np.random.default_rng(5)
    n = 400
    f = rng.uniform(0, 1, n)
    y = np.clip(0.6 * f + rng.normal(0, 0.1, n), 0, 1)
    pi = rng.uniform(0.1, 0.6, n)
    chosen = rng.uniform(size=n) < pi
    _, se, lam = difference_estimate(y, f, pi, chosen, None, "tuned")
    grid = np.linspace(0, 1, 2001)
    ses = []
    for g in grid:
        e = (y - g * f)[chosen] / pi[chosen]
        ses.append(math.sqrt(float(((1 - pi[chosen]) * e * e).sum())) / n)
    best = grid[int(np.argmin(ses))]
    assert lam == pytest.approx(best, abs=1e-3) and 0 < lam < 1
    assert se == pytest.approx(min(ses), rel=1e-6)


def test_the_model_floor_of_the_variance():
    """Eq. (4): the standard error is sqrt(max(V^, V~)), V~ = sum_S a (f2 - (2 lambda - lambda^2) f^2) / W^2."""
    rng = np.random.default_rng(7)
    n = 300
    f = rng.uniform(0, 0.3, n)
    f2 = f * rng.uniform(0.5, 1.0, n)  # E[M^2] <= E[M] for M in [0, 1]
    y = (rng.uniform(size=n) < f).astype(float)
    pi = np.full(n, 0.2)
    chosen = rng.uniform(size=n) < pi
    for y_try in (y, np.where(chosen, 0.0, y)):  # a share with hits, and one without (V^ small, V~ takes over)
        _, se_ht, lam = difference_estimate(y_try, f, pi, chosen, None, "tuned")
        _, se, lam2 = difference_estimate(y_try, f, pi, chosen, None, "tuned", f2)
        c = chosen
        v_model = float(((1 - pi[c]) / pi[c] ** 2 * np.maximum(f2[c] - (2 * lam - lam * lam) * f[c] ** 2, 0)).sum()) / n**2
        assert lam2 == lam and se == pytest.approx(math.sqrt(max(se_ht**2, v_model)), rel=1e-12)
    assert se > se_ht  # the share without hits: the forecast is the larger


def test_a_census_is_exact():
    y, f = np.array([0.1, 0.7, 0.0]), np.array([0.3, 0.3, 0.3])
    v, se, _ = difference_estimate(y, f, np.ones(3), np.ones(3, bool))
    assert v == pytest.approx(y.mean()) and se == 0.0


def test_active_probabilities():
    share = ExactShare(0.2, choice="active", floor=0.05)
    f = np.concatenate([np.zeros(50), np.linspace(0.01, 0.5, 50), np.full(10, 1.0)])
    pi = inclusion_probabilities(share, f, (0.0, 1.0))
    assert pi.mean() == pytest.approx(0.2, abs=1e-9)
    assert pi.min() == pytest.approx(0.05) and pi.max() <= 1.0
    assert (pi[:50] == 0.05).all() and (pi[-10:] == 0.05).all()  # no spread at the ends of the range: the floor
    assert (np.diff(pi[50:100]) >= -1e-15).all()  # more spread (f up to 1/2): more probability
    assert (inclusion_probabilities(ExactShare(0.3), f, (0.0, 1.0)) == 0.3).all()
    assert inclusion_probabilities(ExactShare(1.0, choice="active"), f, (0.0, 1.0)).min() == 1.0


@pytest.mark.parametrize("share", [0.2, 0.9])  # 0.9: the branch where every spread positive gets 1
def test_active_probabilities_are_a_function_of_the_spreads(share):
    """pi depends on the multiset of predictions only: the positives shuffled, or given as cells with counts (a
    histogram's table, ``ShareTable``), give the same bits per positive."""
    s = ExactShare(share, choice="active", floor=share / 5)
    rng = np.random.default_rng(4)
    cells = np.concatenate([[0.0, 1.0], rng.uniform(0, 1, 30)])
    counts = rng.integers(1, 40, len(cells))
    f = np.repeat(cells, counts)
    pi = inclusion_probabilities(s, f, (0.0, 1.0))
    assert np.average(pi) == pytest.approx(share, abs=1e-9)
    perm = rng.permutation(len(f))
    assert np.array_equal(inclusion_probabilities(s, f[perm], (0.0, 1.0)), pi[perm])
    by_cell = inclusion_probabilities(s, cells, (0.0, 1.0), counts.astype(np.float64))
    assert np.array_equal(np.repeat(by_cell, counts), pi)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_share_table_is_the_positives_inclusion(adaptive):
    """An active share's ShareTable (pi per histogram cell (n, m, r~)) read at each positive equals
    inclusion_probabilities of that positive's own prediction (``predictions``), computed positive by positive, bit
    for bit, and so does ``share_inclusion``; the same positives in another user order give the same table; a
    positive whose cell is not in the table is refused."""
    rng = np.random.default_rng(5)
    b = 150
    n = torch.as_tensor(rng.choice([300, 800, 2000], b)).view(-1, 1).expand(b, 2)
    exact = torch.as_tensor(np.ceil(rng.beta(0.3, 3.0, (b, 2)) * n.numpy())).long().clamp(min=1)
    m = torch.as_tensor(rng.choice([10, 20, 40], (b, 2))) if adaptive else torch.tensor(20)
    ranks = draw_sampled_ranks(exact, n, m, seed=6)[0]
    ranks[::7, 1] = 0  # padding
    share = ExactShare(0.2, choice="active", metric="ndcg@10", floor=0.02)
    design = SamplingDesign(10, adaptive_max=40, exact_share=share) if adaptive else \
        SamplingDesign(20, exact_share=share)
    sample = rsp.SampledRanks.from_arrays(ranks, n, m, design)
    spec, valid = parse_metric("ndcg@10"), ranks > 0
    f, _ = predictions(spec, sample)
    want = inclusion_probabilities(share, f, metric_bounds(spec, n[valid]))
    assert len(np.unique(want)) > 5 and want.mean() == pytest.approx(0.2, abs=1e-9)
    table = ShareTable.of(sample.histogram(exact=False), share, design)
    assert np.array_equal(table.inclusion(sample), want) and np.array_equal(share_inclusion(sample, share), want)
    perm = torch.as_tensor(rng.permutation(b))
    shuffled = rsp.SampledRanks.from_arrays(ranks[perm], n[perm], m[perm] if adaptive else m, design)
    again = ShareTable.of(shuffled.histogram(exact=False), share, design)
    assert all(np.array_equal(getattr(again, k), getattr(table, k)) for k in ("keys", "starts", "pi", "width"))
    full = np.zeros(ranks.shape)
    full[valid.numpy()] = want
    assert np.array_equal(table.inclusion(shuffled), full[perm.numpy()][valid[perm].numpy()])
    for cell in ([301, 20, 1], [300, 20, 22], [300, 20, 0]):  # an n, a rank beyond m + 1, no rank: not in the table
        with pytest.raises(ValueError, match="^inclusion: a positive's sampled data is not in the share's table"):
            table.lookup(*(np.array([v]) for v in cell))
    with pytest.raises(ValueError, match="^share: a table is of an active share"):
        ShareTable.of(sample.histogram(exact=False), ExactShare(0.2), design)


@pytest.mark.parametrize("adaptive", [False, True], ids=["fixed", "adaptive"])
def test_reusing_fits_gives_the_same_bits_and_fits_once(adaptive):
    """Inside ``reusing_fits`` an active share's pi and then the estimate of the same draw with its share (the
    planner's replicate) give the same bits as without (oracle: the same calls outside the block), the estimate's
    model fit is the one pi's fit made (one object: fitted once, its share rows aside) and the predictions are
    returned as copies; outside the block every call fits anew; the second replicate on the same groups reuses the
    first one's likelihoods and still equals its own uncached run."""
    rng = np.random.default_rng(11)
    b, spec = 400, parse_metric("ndcg@10")
    n = torch.as_tensor(rng.choice([3000, 5000], b))
    share = ExactShare(0.1, choice="active", metric="ndcg@10")
    design = (SamplingDesign(10, adaptive_max=80, exact_share=share) if adaptive
              else SamplingDesign(50, exact_share=share))

    def replicate(seed: int):
        exact = torch.as_tensor(np.ceil(rng.beta(0.3, 3.0, b) * n.numpy())).long().clamp(min=1)
        m = torch.as_tensor(rng.choice([10, 20, 40, 80], b)) if adaptive else torch.tensor(50)
        drawn = rsp.SampledRanks.from_arrays(draw_sampled_ranks(exact, n, m, seed=seed)[0], n, m, design)
        return drawn, exact

    def run(drawn, exact):
        pi = share_inclusion(drawn, share)
        chosen = torch.as_tensor(np.random.default_rng(3).random(len(pi)) < pi)
        shared = with_share_arrays(drawn, torch.where(chosen, exact, torch.zeros_like(exact)), pi)
        e = rsp.estimate(spec, shared, "auto")
        return pi, e.value, e.interval(0.95), shared

    draws = [replicate(seed) for seed in (1, 2)]
    plain = [run(*d) for d in draws]
    with reusing_fits():
        reused = [run(*d) for d in draws]
        hist = draws[0][0].histogram(exact=False)
        fit = model_fit(spec, hist)[0]
        assert model_fit(spec, reused[0][3].histogram().without_empty_groups())[0] is fit  # pi's fit, rows aside
        f = _posterior_means(spec, fit, np.array([3000]), np.array([10 if adaptive else 50]), np.array([1]), "binomial")
        f[0] = -1.0
        assert _posterior_means(spec, fit, np.array([3000]), np.array([10 if adaptive else 50]), np.array([1]),
                                "binomial")[0] != -1.0  # a copy each time
    for (pi_a, v_a, i_a, _), (pi_b, v_b, i_b, _) in zip(plain, reused):
        assert np.array_equal(pi_a, pi_b) and v_a == v_b and i_a == i_b
    equal = draws[0][0].histogram(exact=False).with_share(None)  # equal counts, a new histogram (no kept fits)
    assert model_fit(spec, equal)[0] is not fit  # outside a block: fitted anew


def test_popularity_active_inclusion_is_order_free_and_keyed():
    """An active share under a popularity design: ``share_inclusion`` gives each positive inclusion_probabilities of
    its own pl_fit prediction (to 1e-12 of the fit on the row-major order: pl_fit's sums in another order), the same
    bits with the rows shuffled (the fit reads the positives in one canonical order), with the share's mean; the
    KeyedInclusion of those pi gives each positive's back by (row key, item) in any row order, and refuses a positive
    it does not hold, an item outside the catalogue, a key too large and one key with two different pi."""
    g = torch.Generator().manual_seed(8)
    b, n = 30, 80  # pl_fit's cost grows with the catalogue and the positives
    scores = torch.randn(b, n, generator=g, dtype=torch.float64)
    pos = torch.stack([torch.randperm(n, generator=g)[:2] for _ in range(b)])
    pos[::4, 1] = -1
    share = ExactShare(0.3, choice="active", metric="hit@10", seed=1)
    design = SamplingDesign(20, popularity=torch.linspace(0.5, 3.0, n, dtype=torch.float64), exact_share=share)
    phase1 = rsp.sampled_ranks(scores, pos, dataclasses.replace(design, exact_share=None), generator=g)
    sample = dataclasses.replace(phase1, design=design)
    spec, valid = parse_metric("hit@10"), sample.ranks > 0
    pi = share_inclusion(sample, share)
    assert len(np.unique(pi)) > 5 and pi.mean() == pytest.approx(0.3, abs=1e-9)
    f, _ = predictions(spec, sample)
    np.testing.assert_allclose(pi, inclusion_probabilities(share, f, metric_bounds(spec, sample.candidates()[valid])),
                               rtol=1e-12, atol=0)
    perm = torch.randperm(b, generator=g)
    shuffled = dataclasses.replace(sample, ranks=sample.ranks[perm], n_candidates=sample.n_candidates[perm],
                                   negatives=None, popularity_stats=sample.popularity_stats.select(perm))
    full = np.zeros(valid.shape)
    full[valid.numpy()] = pi
    want = full[perm.numpy()][valid[perm].numpy()]
    assert np.array_equal(share_inclusion(shuffled, share), want)
    users = torch.arange(b) * 7 - 50  # row keys: any int64 ids
    table = KeyedInclusion.of(users.view(-1, 1).expand(pos.shape)[valid].numpy(), pos[valid].numpy(), pi, n)
    assert np.array_equal(table.inclusion(shuffled, users[perm], pos[perm]), want) and len(table.keys) == len(pi)
    with pytest.raises(ValueError, match="^inclusion: a positive is not in the share's table"):
        table.lookup(np.array([-49]), np.array([0]))
    with pytest.raises(ValueError, match=r"^items: expected item indices in 0\.\.79"):
        table.lookup(np.array([-50]), np.array([n]))
    with pytest.raises(ValueError, match="^row_keys: ids too large"):
        KeyedInclusion.of(np.array([2**62]), np.array([0]), np.array([0.5]), n)
    with pytest.raises(ValueError, match=r"^inclusion: one \(row key, item\) holds positives of different"):
        KeyedInclusion.of(np.array([3, 3]), np.array([1, 1]), np.array([0.5, 0.25]), n)
    twice = KeyedInclusion.of(np.array([3, 3, 2]), np.array([1, 1, 1]), np.array([0.5, 0.5, 0.25]), n)
    assert twice.keys.tolist() == [2 * n + 1, 3 * n + 1] and twice.pi.tolist() == [0.25, 0.5]


# ------------------------------------------------------------------------------------------ simulation
def test_unbiased_and_covering_where_the_model_is_wrong():
    """Exact ranks piled on rank 1 and spread deep (n = 2000, m = 20: a first bin of ~95 ranks, which the fit spreads
    over the bin): the model's HR@10 misses by far, the difference estimator over 400 repeated keyed choices on the
    same sampled data is unbiased within 3 Monte Carlo standard errors and its 95% interval covers 0.90-0.99."""
    n, m, size = 2000, 20, 1500
    g = torch.Generator().manual_seed(11)
    exact = torch.where(torch.rand(size, generator=g) < 0.3, torch.ones(size, dtype=torch.int64),
                        torch.randint(50, n + 1, (size,), generator=g))
    sampled = draw_sampled_ranks(exact, n, m, seed=2)[0]
    spec = parse_metric("hit@10")
    truth = float(metric_at(spec, exact.double().numpy(), float(n)).mean())
    base = rsp.SampledRanks.from_arrays(sampled, n, m)
    f, model = predictions(spec, base)
    assert abs(float(f.mean()) - truth) > 0.05  # the model alone is far off
    y = metric_at(spec, exact.double().numpy(), float(n))
    pi = np.full(size, 0.1)
    rng = np.random.default_rng(0)
    values, covered = [], 0
    for _ in range(400):
        chosen = rng.uniform(size=size) < pi
        v, se, _ = difference_estimate(y, f, pi, chosen, None, "one")
        values.append(v)
        covered += abs(v - truth) <= 1.959964 * se
    values = np.array(values)
    assert abs(values.mean() - truth) <= 3 * values.std(ddof=1) / math.sqrt(len(values))
    assert 0.90 <= covered / 400 <= 0.99


# ------------------------------------------------------------------------------------------ the draws
def test_share_draws_exact_ranks_and_keeps_the_sampled_draws(matrix):
    scores, pos = matrix
    plain = rsp.sampled_ranks(scores, pos, SamplingDesign(30), generator=torch.Generator().manual_seed(4))
    shared = rsp.sampled_ranks(scores, pos, SamplingDesign(30, exact_share=0.25), generator=torch.Generator().manual_seed(4))
    assert torch.equal(plain.ranks, shared.ranks) and torch.equal(plain.negatives, shared.negatives)
    exact = rsp.exact_ranks(scores, pos, count_other_positives=False)
    chosen = shared.share_ranks > 0
    assert 60 <= int(chosen.sum()) <= 140  # 400 positives at 1/4
    assert torch.equal(shared.share_ranks[chosen], exact[chosen])
    assert torch.equal(shared.inclusion, torch.full_like(shared.inclusion, 0.25))
    # keyed: the same positives whatever the generator
    other = rsp.sampled_ranks(scores, pos, SamplingDesign(30, exact_share=0.25), generator=torch.Generator().manual_seed(9))
    assert torch.equal(other.share_ranks > 0, chosen)


def test_scorer_path_matches_the_matrix_and_counts_the_exact_pairs(matrix):
    scores, pos = matrix
    design = SamplingDesign(30, exact_share=ExactShare(0.1, seed=3))

    def scorer(users, items):
        return scores[users.unsqueeze(1), items]

    got = rsp.sampled_ranks_from_scorer(scorer, pos, scores.shape[1], design, generator=torch.Generator().manual_seed(4))
    ref = rsp.sampled_ranks(scores, pos, design, generator=torch.Generator().manual_seed(4))
    assert torch.equal(got.ranks, ref.ranks) and torch.equal(got.share_ranks, ref.share_ranks)
    assert torch.equal(got.inclusion, ref.inclusion)
    plain = rsp.sampled_ranks_from_scorer(scorer, pos, scores.shape[1], SamplingDesign(30),
                                          generator=torch.Generator().manual_seed(4))
    rows = int((got.share_ranks > 0).any(1).sum())
    assert got.cost.pairs - plain.cost.pairs == rows * (scores.shape[1] - 2)  # each such row's candidates, once
    assert got.cost.stages == plain.cost.stages + 1


def test_auto_runs_diff_on_a_share_and_diff_without_one_is_auto(matrix):
    scores, pos = matrix
    shared = rsp.sampled_ranks(scores, pos, SamplingDesign(30, exact_share=0.3), generator=torch.Generator().manual_seed(4))
    est = rsp.estimate("ndcg@10", shared)
    assert est.details["auto"]["method"] == "diff" and est.details["n_exact"] == int((shared.share_ranks > 0).sum())
    assert est.details["variance"] == "max(poisson_ht, model)"
    assert est.details["lambda"] == 1.0 and est.details["coef"] == "one"  # the default: exactly unbiased
    assert rsp.estimate("ndcg@10", shared, registry.Diff(coef="one")).value == est.value
    tuned = rsp.estimate("ndcg@10", shared, registry.Diff(coef="tuned")).details
    assert tuned["coef"] == "tuned" and 0 <= tuned["lambda"] <= 1
    plain = rsp.sampled_ranks(scores, pos, SamplingDesign(30), generator=torch.Generator().manual_seed(4))
    a = rsp.estimate("ndcg@10", plain, registry.Auto(n_bootstrap=0))
    d = rsp.estimate("ndcg@10", plain, registry.Diff(n_bootstrap=0))
    assert d.value == a.value and d.stderr == a.stderr and "no_exact_share" in d.flags


def test_paired_difference(matrix):
    scores, pos = matrix
    other = scores + 0.5 * torch.randn(scores.shape, generator=torch.Generator().manual_seed(8), dtype=torch.float64)
    everyone = SamplingDesign(30, exact_share=1.0)
    a = rsp.sampled_ranks(scores, pos, everyone, generator=torch.Generator().manual_seed(1))
    b = rsp.sampled_ranks(other, pos, everyone, generator=torch.Generator().manual_seed(2))
    spec = parse_metric("ndcg@10")
    n = a.candidates().double().numpy()
    truth = float((metric_at(spec, a.share_ranks.double().numpy(), n)
                   - metric_at(spec, b.share_ranks.double().numpy(), n)).mean())
    est = paired_difference_by_design("ndcg@10", a, b)
    assert est.value == pytest.approx(truth, abs=1e-12) and est.stderr == 0.0  # a census
    c = rsp.sampled_ranks(other, pos, SamplingDesign(30, exact_share=ExactShare(0.5, seed=1)))
    with pytest.raises(ValueError, match="^b: not the same exact share"):
        paired_difference_by_design("ndcg@10", a, c)


# ------------------------------------------------------------------------------------------ validation
def test_design_and_arrays_are_checked():
    assert SamplingDesign(10, exact_share=0.1) == SamplingDesign(10, exact_share=ExactShare(0.1))
    assert SamplingDesign(10, exact_share=0.1) != SamplingDesign(10)
    assert "exact share 0.1 (uniform)" in SamplingDesign(10, exact_share=0.1).describe()
    for bad, match in ((0.0, "^share: "), (1.5, "^share: "), (True, "^share: ")):
        with pytest.raises(ValueError, match=match):
            ExactShare(bad)
        with pytest.raises(ValueError, match="^exact_share: expected a number in"):  # the argument typed there
            SamplingDesign(10, exact_share=bad)
    with pytest.raises(ValueError, match="^choice: "):
        ExactShare(0.1, choice="greedy")
    with pytest.raises(ValueError, match="^floor: "):
        ExactShare(0.1, choice="active", floor=0.2)
    with pytest.raises(ValueError, match="^exact_share: not with exact_at_cap"):
        SamplingDesign(10, adaptive_max=40, exact_at_cap=True, exact_share=0.1)
    r = torch.tensor([3, 1, 5])
    s = rsp.SampledRanks.from_arrays(r, 100, 10, share_ranks=torch.tensor([0, 7, 0]), inclusion=[0.5, 0.5, 0.5])
    assert s.share_ranks.tolist() == [0, 7, 0]
    with pytest.raises(ValueError, match="^inclusion: every positive"):
        rsp.SampledRanks.from_arrays(r, 100, 10, share_ranks=torch.tensor([0, 7, 0]), inclusion=[0.5, 0.0, 0.5])
    with pytest.raises(ValueError, match="^share_ranks: a rank above"):
        rsp.SampledRanks.from_arrays(r, 100, 10, share_ranks=torch.tensor([0, 170, 0]), inclusion=[0.5, 0.5, 0.5])
    with pytest.raises(ValueError, match="^inclusion: an exact share needs both"):
        rsp.SampledRanks.from_arrays(r, 100, 10, share_ranks=torch.tensor([0, 7, 0]))


def _share_file(path, pi_last: str):
    """A rank file of 40 positives (n = 60, m = 10) with a uniform share 0.5 (every other one chosen), the last chosen
    positive's inclusion written as ``pi_last``."""
    rows = [f"{1 + i % 11},60,10,{(7 + i) % 60 + 1 if i % 2 else ''},{pi_last if i == 39 else '0.5'}"
            for i in range(40)]
    path.write_text("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n" + "\n".join(rows) + "\n")
    return path


def test_an_inclusion_below_the_least_is_refused_wherever_it_is_given(tmp_path):
    """pi >= MIN_INCLUSION (1e-9) for a share, an active share's floor, arrays and rank files: a chosen positive at
    pi = 1e-300 made the difference estimate NaN (1/pi^2 overflows); at the bound the estimate is finite."""
    from reco_sampled_plugin._checks import MIN_INCLUSION
    from reco_sampled_plugin.rank_files import RankFile, read_rank_file

    for bad, match in ((1e-10, "^share: "), (1e-300, "^share: ")):
        with pytest.raises(ValueError, match=match):
            ExactShare(bad)
    with pytest.raises(ValueError, match=r"^floor: expected a number in \[1e-09, share"):
        ExactShare(0.5, choice="active", floor=1e-300)
    assert ExactShare(MIN_INCLUSION).floor == MIN_INCLUSION  # the default share / 5, at least the bound
    r = torch.tensor([3, 1, 5])
    with pytest.raises(ValueError, match=r"^inclusion: every positive's probability must lie in \[1e-09, 1\]"):
        rsp.SampledRanks.from_arrays(r, 100, 10, share_ranks=torch.tensor([0, 7, 0]), inclusion=[0.5, 1e-300, 0.5])
    with pytest.raises(ValueError, match=r"f\.csv:41: inclusion '1e-300' must be a probability in \[1e-09, 1\]"):
        read_rank_file(_share_file(tmp_path / "f.csv", "1e-300"))
    with pytest.raises(ValueError, match=r"^inclusion: entry 1 is 1e-300"):
        RankFile(np.array([3, 2]), np.array([60, 60]), np.array([10, 10]), exact_rank=np.array([0, 7]),
                 inclusion=np.array([0.5, 1e-300]))
    at_bound = read_rank_file(_share_file(tmp_path / "g.csv", "1e-9")).sampled(SamplingDesign(10))
    est = rsp.estimate("ndcg@10", at_bound, "diff")
    assert math.isfinite(est.value) and not math.isnan(est.stderr)


def test_histogram_path_matches_the_positives_and_merges(matrix):
    """The estimate from the histogram and its share rows equals eq. (1)-(3) on the positives' own predictions; two
    halves' histograms merged give the whole's estimate (the share rows travel with the counts)."""
    scores, pos = matrix
    design = SamplingDesign(30, exact_share=0.3)
    whole = rsp.sampled_ranks(scores, pos, design, generator=torch.Generator().manual_seed(4))
    spec = parse_metric("ndcg@10")
    est = rsp.estimate(spec, whole, registry.Diff(coef="one"))
    f, _ = predictions(spec, whole)
    valid = whole.ranks > 0
    fit, _, law = model_fit(spec, whole.histogram(exact=False).without_empty_groups())
    g, f2 = _posterior_means(spec, fit, whole.candidates()[valid].numpy(), np.full(int(valid.sum()), 30),
                             whole.ranks[valid].numpy(), law, second=True)
    assert np.array_equal(g, f)
    y = metric_at(spec, whole.share_ranks[valid].double().numpy(), whole.candidates()[valid].double().numpy())
    chosen = (whole.share_ranks[valid] > 0).numpy()
    v, se, _ = difference_estimate(y, f, whole.inclusion[valid].numpy(), chosen, None, "one", f2)
    assert est.value == pytest.approx(v, rel=1e-12) and est.stderr == pytest.approx(se, rel=1e-12)
    v, se, lam = difference_estimate(y, f, whole.inclusion[valid].numpy(), chosen, None, "tuned", f2)
    tuned = rsp.estimate(spec, whole, registry.Diff(coef="tuned"))
    assert tuned.value == pytest.approx(v, rel=1e-12) and tuned.stderr == pytest.approx(se, rel=1e-12)
    assert tuned.details["lambda"] == lam and tuned.details["coef"] == "tuned"
    halves = [rsp.SampledRanks.from_arrays(whole.ranks[rows], whole.candidates()[rows], 30, design,
                                           share_ranks=whole.share_ranks[rows], inclusion=whole.inclusion[rows])
              for rows in (slice(0, 120), slice(120, None))]
    merged = halves[0].histogram().merge(halves[1].histogram())
    assert merged.share is not None and len(merged.share.n) == int(chosen.sum())
    got = rsp.estimate(spec, merged, registry.Diff(coef="one"))
    assert got.value == pytest.approx(est.value, rel=1e-12) and got.stderr == pytest.approx(est.stderr, rel=1e-12)
    assert rsp.estimate(spec, merged).details["auto"]["method"] == "diff"
    with pytest.raises(ValueError, match="^other: one histogram carries an exact share"):
        merged.merge(rsp.sampled_ranks(scores, pos, 30).histogram())



def test_inclusion_bound_holds_on_every_path_and_in_the_inputs_precision():
    """A SampledRanks built by hand with pi = 1e-300 is refused when estimated (was: -6.7e282, stderr inf);
    float32 probabilities and shares at exactly 1e-9 are accepted (9.99999972e-10 as float64), below it refused."""
    from reco_sampled_plugin._checks import MIN_INCLUSION

    g = torch.Generator().manual_seed(0)
    r, n = torch.randint(1, 20, (200,), generator=g), torch.full((200,), 1000)
    e = torch.zeros(200, dtype=torch.long)
    e[:20] = torch.randint(1, 1000, (20,), generator=g)
    design = rsp.SamplingDesign(100, exact_share=ExactShare(0.1))
    pi = torch.full((200,), 0.1, dtype=torch.float64)
    pi[0] = 1e-300
    by_hand = rsp.SampledRanks(r, n, None, design, share_ranks=e, inclusion=pi)
    with pytest.raises(ValueError, match="^inclusion: .*MIN_INCLUSION"):
        rsp.estimate("ndcg@10", by_hand)
    pi32 = torch.full((200,), MIN_INCLUSION, dtype=torch.float32)
    assert rsp.SampledRanks.from_arrays(r, n, 100, design, share_ranks=e, inclusion=pi32).inclusion[0] == MIN_INCLUSION
    assert ExactShare(np.float32(MIN_INCLUSION)).share == MIN_INCLUSION
    with pytest.raises(ValueError, match="^share: "):
        ExactShare(np.float32(9e-10))
    with pytest.raises(ValueError, match="^inclusion: "):
        rsp.SampledRanks.from_arrays(r, n, 100, design, share_ranks=e, inclusion=torch.full((200,), 9e-10))


def test_auc_with_an_exact_share_is_estimated():
    """AUC on a sample with an exact share: ``auto`` runs ``diff``, whose model is a rank-distribution fit (gmod),
    not auto's AUC choice at a fixed m (the sampled AUC, no fit: the model failed, "n_bootstrap: method 'none' does
    not use it", and the torchmetrics class returned NaN). Its interval holds the users' exact AUC (200 users,
    n = 500, m = 20, share 0.3)."""
    import reco_sampled_plugin as rsp
    from reco_sampled_plugin.design import SamplingDesign

    g = torch.Generator().manual_seed(0)
    s, pos = torch.randn(200, 500, generator=g), torch.randint(0, 500, (200, 1), generator=g)
    sample = rsp.sampled_ranks(s, pos, SamplingDesign(20, exact_share=0.3), generator=g)
    e = rsp.estimate("auc", sample)
    truth = float(((500 - rsp.exact_ranks(s, pos)) / 499.0).double().mean())
    lo, hi = e.interval()
    assert e.details["auto"]["method"] == "diff" and lo <= truth <= hi and hi - lo < 0.05


def test_a_difference_estimate_outside_the_metric_is_moved_into_its_range():
    """A small share (30 users, share 0.3, positives near the top): the difference estimator's raw AP reaches 1.28
    (the model's error times the share's weights); the point is the range's end, flagged ``outside_metric_range``,
    the raw value kept in ``details["unclipped_value"]``, its interval inside [0, 1] and holding the point, as every
    other estimator's (the point and the interval reached 1.28 before)."""
    from reco_sampled_plugin.design import SamplingDesign

    g = torch.Generator().manual_seed(147)
    s = torch.randn(30, 50, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 50, (30, 1), generator=g)
    s.scatter_add_(1, pos, torch.full((30, 1), 5.0, dtype=torch.float64))
    sample = rsp.sampled_ranks(s, pos, SamplingDesign(5, exact_share=0.3), generator=g)
    for metric in ("ap", "ndcg", "precision@3"):
        e = rsp.estimate(metric, sample)
        lo, hi = e.interval()
        top = 1.0 if metric != "precision@3" else 1 / 3
        assert e.value == top and e.details["unclipped_value"] > top and "outside_metric_range" in e.flags
        assert 0.0 <= lo <= e.value <= hi <= top
