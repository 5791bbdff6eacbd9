"""Popularity-sampled evaluation corrected: the law, the per-positive statistics every draw keeps,
the Hansen-Hurwitz estimator ``hh`` and its refusals (docs/popularity.md).

Oracles: brute-force enumeration of every draw sequence on small catalogues (n <= 8, m <= 3), simulation of the
plugin's own draw against that law, synthetic catalogues with known exact ranks, and Krichene & Rendle's closed form
under uniform weights.
"""

from __future__ import annotations

import dataclasses
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as hst
from _profiles import examples
from scipy import stats as st

import reco_sampled_plugin as rsp
from reco_sampled_plugin import popularity, registry
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin._estimate import FLAG_TEXT

from _popularity_helpers import factor_world  # noqa: E402  (tests/ is on sys.path)

# ------------------------------------------------------------------------------------------ a small catalogue
N_ITEMS = 8
POS = [1, 4]  # the row's positives
EXC = [6]  # an excluded item, given a huge weight: the law must renormalise it away
SCORES = np.array([0.3, 0.9, 1.4, -0.2, 0.1, 2.0, 5.0, 0.05])
WEIGHTS = np.array([2.0, 1.0, 0.5, 3.0, 1.5, 0.05, 100.0, 1.2])
DRAWABLE = [j for j in range(N_ITEMS) if j not in POS + EXC]  # 0, 2, 3, 5, 7


def _law(m: int, scores=SCORES, weights=WEIGHTS, positives=POS, excluded=EXC):
    """Brute force: every sequence of m draws from q~ (the weights renormalised over the drawable items), its
    probability, and per positive the beating count and the Hansen-Hurwitz estimate Y = (1/m) sum [beats] / q~."""
    drawable = [j for j in range(len(scores)) if j not in list(positives) + list(excluded)]
    q = weights[drawable] / weights[drawable].sum()
    seqs = np.array(list(itertools.product(range(len(drawable)), repeat=m)))  # indices into drawable
    prob = np.prod(q[seqs], axis=1)
    items = np.array(drawable)[seqs]
    beats = np.stack([scores[items] > scores[t] for t in positives], 1)  # (S, P, m)
    y = (beats / q[seqs][:, None, :]).sum(2) / m
    above = [np.array([scores[j] > scores[t] for j in drawable]) for t in positives]  # A per positive
    return q, items, prob, beats.sum(2), y, above


def _plugin_on(items: np.ndarray, m: int, scores=SCORES, weights=WEIGHTS, positives=POS, excluded=EXC):
    """The plugin's SampledRanks of the given draw sequences (one row per sequence, the same row each time)."""
    s = items.shape[0]
    design = SamplingDesign(m, popularity=torch.tensor(weights))
    exc = torch.tensor(list(excluded), dtype=torch.int64).repeat(s, 1) if len(excluded) else None
    return rsp.sampled_ranks(torch.tensor(scores).repeat(s, 1), torch.tensor(list(positives)).repeat(s, 1), design,
                             exclude=exc, negatives=torch.from_numpy(items))


@settings(max_examples=examples(25), deadline=None)
@given(data=hst.data())
def test_enumerated_law_on_random_small_catalogues(data):
    """Random catalogues of n <= 8 items (1-2 positives, 0-2 excluded, distinct scores, weights in [0.05, 5]),
    m <= 3: the plugin's estimate, averaged over the enumerated law, is R - 1 for every positive (to 1e-12)."""
    n = data.draw(hst.integers(4, 8))
    m = data.draw(hst.integers(1, 3))
    perm = data.draw(hst.permutations(list(range(n))))
    n_pos = data.draw(hst.integers(1, 2))
    n_exc = data.draw(hst.integers(0, min(2, n - n_pos - 1)))
    positives, excluded = perm[:n_pos], perm[n_pos:n_pos + n_exc]
    scores = np.array(data.draw(hst.permutations(list(range(n)))), dtype=np.float64)
    weights = np.array(data.draw(hst.lists(hst.floats(0.05, 5.0), min_size=n, max_size=n)))
    q, items, prob, beating, y, above = _law(m, scores, weights, positives, excluded)
    sampled = _plugin_on(items, m, scores, weights, positives, excluded)
    got = popularity.rank_estimates(sampled).numpy() - 1.0
    np.testing.assert_allclose(got, y, rtol=1e-12, atol=1e-12)
    for p, a in enumerate(above):
        assert abs(float(prob @ got[:, p]) - a.sum()) < 1e-11
        var = float(prob @ (got[:, p] - a.sum()) ** 2)
        assert var == pytest.approx((np.sum(1.0 / q[a]) - a.sum() ** 2) / m, rel=1e-10, abs=1e-11)


@pytest.mark.parametrize("m", [1, 2, 3])
def test_enumerated_law_hansen_hurwitz_mean_and_variance(m):
    """For every draw sequence the plugin's statistics give the enumerated Y; over the law, E[Y] = R - 1 (to 1e-12),
    Var[Y] = (1/m)(sum_A 1/q~ - (R - 1)^2), the variance estimate read from (S1, S2) is unbiased, r~ - 1 is
    Binomial(m, q~(A)), and estimate('auc', method='hh') weighted by the law is the exact AUC."""
    q, items, prob, beating, y, above = _law(m)
    sampled = _plugin_on(items, m)
    stats = sampled.popularity_stats
    got = popularity.rank_estimates(sampled).numpy() - 1.0
    np.testing.assert_allclose(got, y, rtol=1e-13, atol=1e-12)
    np.testing.assert_array_equal(stats.beating.numpy(), beating)
    np.testing.assert_array_equal(sampled.ranks.numpy() - 1, beating)
    n = N_ITEMS - len(EXC) - len(POS) + 1  # the positive and its drawable candidates
    assert sampled.candidates().unique().tolist() == [n]
    for p, a in enumerate(above):
        r_minus_1 = int(a.sum())
        mean = float(prob @ y[:, p])
        var = float(prob @ (y[:, p] - r_minus_1) ** 2)
        assert abs(mean - r_minus_1) < 1e-12
        assert var == pytest.approx((np.sum(1.0 / q[a]) - r_minus_1 ** 2) / m, rel=1e-12, abs=1e-12)
        if m > 1:  # the variance estimate from the sufficient statistics, unbiased
            s1, s2 = stats.inv_q[:, p].numpy(), stats.inv_q2[:, p].numpy()
            v_hat = (s2 - s1 ** 2 / m) / (m * (m - 1))
            assert float(prob @ v_hat) == pytest.approx(var, rel=1e-12, abs=1e-12)
        pmf = np.bincount(beating[:, p], weights=prob, minlength=m + 1)
        np.testing.assert_allclose(pmf, st.binom.pmf(np.arange(m + 1), m, q[a].sum()), atol=1e-13)
    # end to end: the law's expectation of the estimate is the exact AUC of the two positives
    exact_auc = np.mean([(n - 1 - a.sum()) / (n - 1) for a in above])
    est = rsp.estimate("auc", sampled, method="hh", weights=torch.from_numpy(prob * 1e3).unsqueeze(1))
    assert est.value == pytest.approx(exact_auc, abs=1e-12)
    assert est.details["design"] == "popularity"


def test_the_plugins_popularity_draw_follows_the_law():
    """The plugin's own draw (fixed seed, 40,000 repeats of the row): never a positive or an excluded item, r~ - 1
    distributed as Binomial(m, q~(A)) cell by cell and the mean Hansen-Hurwitz estimate at R - 1, within 4 standard
    errors; the scorer loop keeps the same statistics from the same generator."""
    m, reps = 3, 40_000
    q, _, _, _, _, above = _law(m)
    scores = torch.tensor(SCORES).repeat(reps, 1)
    pos = torch.tensor(POS).repeat(reps, 1)
    exc = torch.tensor(EXC).repeat(reps, 1)
    design = SamplingDesign(m, popularity=torch.tensor(WEIGHTS))
    sampled = rsp.sampled_ranks(scores, pos, design, exclude=exc, generator=torch.Generator().manual_seed(7))
    assert not bool(torch.isin(sampled.negatives, torch.tensor(POS + EXC)).any())
    freq = np.bincount(sampled.negatives.reshape(-1).numpy(), minlength=N_ITEMS) / sampled.negatives.numel()
    np.testing.assert_allclose(freq[DRAWABLE], q, atol=4 * np.sqrt(q * (1 - q) / sampled.negatives.numel()).max())
    y = popularity.rank_estimates(sampled).numpy() - 1.0
    for p, a in enumerate(above):
        pi = q[a].sum()
        pmf = st.binom.pmf(np.arange(m + 1), m, pi)
        got = np.bincount(sampled.ranks[:, p].numpy() - 1, minlength=m + 1) / reps
        assert np.all(np.abs(got - pmf) <= 4 * np.sqrt(pmf * (1 - pmf) / reps) + 1e-12), (p, got, pmf)
        sd = math.sqrt((np.sum(1.0 / q[a]) - a.sum() ** 2) / m)
        assert abs(y[:, p].mean() - a.sum()) <= 4 * sd / math.sqrt(reps)
        assert y[:, p].std() == pytest.approx(sd, rel=0.05)
    # the scorer loop: the same draws, ranks and statistics from the same seed
    table = torch.tensor(SCORES).repeat(reps, 1)
    looped = rsp.sampled_ranks_from_scorer(lambda u, i: table[u].gather(1, i), pos, N_ITEMS, design, exclude=exc,
                                           generator=torch.Generator().manual_seed(7))
    assert torch.equal(looped.ranks, sampled.ranks)
    for f in ("beating", "inv_q", "inv_q2", "unreachable"):
        assert torch.equal(getattr(looped.popularity_stats, f), getattr(sampled.popularity_stats, f)), f


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
def test_ties_count_in_the_statistics_as_in_the_ranks(ties):
    """Tied draws count in S1 as in r~ (1 pessimistic, 0 optimistic, 1/2 average), each weighted by 1/q~."""
    g = torch.Generator().manual_seed(3)
    scores = torch.randint(0, 4, (50, 30), generator=g).to(torch.float64)
    pos = torch.randint(0, 30, (50, 1), generator=g)
    w = torch.rand(30, generator=g, dtype=torch.float64) + 0.1
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(6, popularity=w), generator=g, ties=ties)
    neg = s.negatives
    sp_, sn = scores.gather(1, pos).unsqueeze(2), scores.gather(1, neg.reshape(50, -1)).reshape(neg.shape)
    share = {"pessimistic": (sn >= sp_).double(), "optimistic": (sn > sp_).double(),
             "average": (sn > sp_).double() + (sn == sp_).double() / 2}[ties]
    total = w.sum() - w[pos[:, 0]]
    qn = w[neg] / total.view(-1, 1, 1)
    torch.testing.assert_close(s.popularity_stats.inv_q, (share / qn).sum(2), rtol=1e-13, atol=0)
    torch.testing.assert_close(s.popularity_stats.inv_q2, ((share / qn) ** 2).sum(2), rtol=1e-13, atol=0)
    torch.testing.assert_close(s.popularity_stats.beating, s.ranks.to(torch.float64) - 1)


# ------------------------------------------------------------------------------------ estimate() against truth
def _world(seed: int, users: int = 200, n: int = 400):
    """A synthetic catalogue: Zipf counts, popularity-biased scores, one positive per user lifted above the noise,
    five excluded items; q proportional to count (RecBole's pop with alpha = 1)."""
    g = torch.Generator().manual_seed(seed)
    counts = torch.floor(1000.0 / torch.arange(1, n + 1, dtype=torch.float64)) + 1
    scores = 0.5 * counts.log().unsqueeze(0) + torch.randn(users, n, generator=g, dtype=torch.float64)
    pos = torch.randint(0, n, (users, 1), generator=g)
    scores.scatter_add_(1, pos, torch.full((users, 1), 1.5, dtype=torch.float64))
    exc = (pos + 1 + 7 * torch.arange(5)) % n
    exact = rsp.exact_ranks(scores, pos, exc, count_other_positives=False)
    cand = (rsp.candidate_counts(n, pos, exc, count_other_positives=False) + 1).unsqueeze(1)
    auc = float(((cand - exact) / (cand - 1.0)).mean())
    return scores, pos, exc, counts, auc


def test_hh_auc_recovers_the_exact_auc_and_its_intervals_cover():
    """On the synthetic catalogue (m = 20): within 4 SE of the exact AUC; over 200 seeded repeats the 95% interval
    (between-positive SE) covers the population AUC (fresh users each repeat) and value +- 1.96 stderr_sampling
    covers the fixed positives' exact AUC (fresh draws each repeat), both at a rate in [0.90, 0.99]."""
    scores, pos, exc, counts, truth = _world(0)
    design = SamplingDesign(20, popularity=counts)
    one = rsp.estimate("auc", rsp.sampled_ranks(scores, pos, design, exclude=exc,
                                                generator=torch.Generator().manual_seed(1)), method="hh")
    assert abs(one.value - truth) <= 4 * one.stderr
    assert one.details["stderr_sampling"] < one.stderr  # the spread of the positives' true AUCs adds to it
    assert 1.0 <= one.details["mean_rank"] <= 396
    repeats = 200
    fixed = []
    for s in range(repeats):  # the fixed positives, fresh draws
        e = rsp.estimate("auc", rsp.sampled_ranks(scores, pos, design, exclude=exc,
                                                  generator=torch.Generator().manual_seed(100 + s)), method="hh")
        fixed.append(abs(e.value - truth) <= 1.959964 * e.details["stderr_sampling"])
    fresh, truths = [], []
    for s in range(repeats):  # fresh users and draws: the interval of the population AUC
        sc, p, x, c, t = _world(1000 + s)
        e = rsp.estimate("auc", rsp.sampled_ranks(sc, p, SamplingDesign(20, popularity=c), exclude=x,
                                                  generator=torch.Generator().manual_seed(s)), method="hh")
        fresh.append(e.interval(0.95))
        truths.append(t)
    population = float(np.mean(truths))  # sd / sqrt(40,000 positives): ~1e-3 of the intervals' width
    covered = np.mean([lo <= population <= hi for lo, hi in fresh])
    assert 0.90 <= np.mean(fixed) <= 0.99, np.mean(fixed)
    assert 0.90 <= covered <= 0.99, covered


def test_uniform_weights_give_krichene_and_rendles_values_exactly():
    """q~ = 1/(n - 1): each rank estimate is 1 + (n - 1)(r~ - 1)/m and the hh AUC equals rank_estimate's (linear
    rounding), the sampled AUC (none), and hh on the bare ranks; no weights flagged (Kish share 1)."""
    g = torch.Generator().manual_seed(5)
    scores = torch.randn(300, 200, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 200, (300, 2), generator=g)
    pos[:, 1] = (pos[:, 0] + 1 + torch.randint(0, 198, (300,), generator=g)) % 200
    exc = (pos[:, :1] + 100) % 200
    exc = torch.where((exc == pos[:, 1:]), (exc + 1) % 200, exc)
    exc = torch.where((exc == pos[:, :1]) | (exc == pos[:, 1:]), (exc + 1) % 200, exc)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(25, popularity=torch.ones(200)), exclude=exc, generator=g)
    n = s.candidates().to(torch.float64)
    kr = 1 + (n - 1) * (s.ranks.to(torch.float64) - 1) / 25
    torch.testing.assert_close(popularity.rank_estimates(s), kr, rtol=1e-13, atol=0)
    hh = rsp.estimate("auc", s, method="hh")
    bare = rsp.estimate("auc", rsp.SampledRanks.from_arrays(s.ranks, n, 25), "hh")
    ke = rsp.estimate("auc", rsp.SampledRanks.from_arrays(s.ranks, n, 25), rsp.registry.RankEstimate(rounding="linear"))
    none = rsp.estimate("auc", rsp.SampledRanks.from_arrays(s.ranks, n, 25), "none")
    for other in (bare, ke, none):
        assert hh.value == pytest.approx(other.value, abs=1e-12)
        assert hh.stderr == pytest.approx(other.stderr, rel=1e-9)
    assert hh.details["ess_share"] == pytest.approx(1.0) and not hh.flags
    assert popularity.mean_rank(s).value == pytest.approx(float(kr.mean()), rel=1e-12)
    assert hh.details["mean_rank"] == pytest.approx(float(kr.mean()), rel=1e-12)


def test_concentrated_weights_are_flagged():
    """Ten common items and 190 rare ones (weight ratio 10^4), the rare ones all scored above the positives: the
    beating draws' Kish share falls below ESS_SHARE_FLAG and the estimate says so; it stays unbiased (4 SE)."""
    n, users = 200, 400
    w = torch.full((n,), 0.1, dtype=torch.float64)
    w[:10] = 1000.0
    scores = torch.zeros(users, n, dtype=torch.float64)
    scores[:, 10:] = 2.0  # rare items above the positive
    scores[:, :5] = 3.0  # five common items above
    pos = torch.full((users, 1), 7)
    scores[:, 7] = 1.0
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(50, popularity=w), generator=torch.Generator().manual_seed(2))
    e = rsp.estimate("auc", s, method="hh")
    assert e.details["ess_share"] < popularity.ESS_SHARE_FLAG and "weights_concentrated" in e.flags
    truth = (n - 196) / (n - 1)  # n candidates (199 drawable and the positive), 195 above it: R = 196
    assert abs(e.value - truth) <= 4 * e.stderr
    assert "weights_concentrated" in FLAG_TEXT and rsp.explain_flags(e.flags)


# --------------------------------------------------------------------------------------------- other paths
def test_evaluate_factors_carries_the_statistics_and_corrects_auc():
    train, test, a, b, design = factor_world()
    res = rsp.evaluate_factors(train, test, a, b, metrics=["roc_auc"], n_samples=design, method="hh",
                               as_df=False)
    ev = res.sampled
    assert ev.popularity_stats is not None
    torch.testing.assert_close(ev.popularity_stats.beating, ev.sampled_ranks.to(torch.float64) - 1)
    # each positive's own weight (pl_fit's strata), in the test matrix's row-major order
    np.testing.assert_array_equal(ev.popularity_stats.positive_weight.numpy(),
                                  design.popularity.numpy()[test.indices])
    row = res.summary["ROC_AUC"]
    again = rsp.estimate("auc", rsp.SampledRanks(ev.sampled_ranks, ev.n_candidates, None, design,
                                                 popularity_stats=ev.popularity_stats), method="hh")
    assert row["corrected"] == again.value and abs(row["corrected"] - row["exact"]) <= 4 * row["stderr"]
    with pytest.raises(ValueError, match="^metrics: method 'hh' estimates auc only"):
        rsp.evaluate_factors(train, test, a, b, n_samples=design, method="hh")
    with pytest.raises(ValueError, match="^method: 'bv' assumes uniform sampling.*'hh'"):
        rsp.evaluate_factors(train, test, a, b, metrics=["roc_auc"], n_samples=design, method="bv")


def test_registry_views():
    pop = SamplingDesign(10, popularity=torch.ones(5))
    assert registry.get("hh").family == "hansen_hurwitz" and registry.get("hh").metrics == ("auc",)
    assert registry.names(design=pop, metric="auc") == ("auto", "none", "hh", "pl_fit")  # auto: hh for AUC
    assert registry.names(design=pop, metric="ndcg@10") == ("auto", "none", "pl_fit")  # pl_fit (test_popularity_topk)
    assert "hh" not in registry.names(metric="mrr") and "hh" in registry.names(metric="auc")
    assert registry.names(metric="hit") == registry.names(metric="hit@10")
    with pytest.raises(ValueError, match="^metrics: "):
        registry.Estimator("x", "none", "s", ".corrections:estimate_by_table", metrics=("auc", 3))


# ---------------------------------------------------------------------------------------------- refusals
@pytest.fixture(scope="module")
def pop_ranks():
    g = torch.Generator().manual_seed(11)
    scores = torch.randn(60, 50, generator=g, dtype=torch.float64)
    pos = torch.randint(0, 50, (60, 1), generator=g)
    w = torch.rand(50, generator=g, dtype=torch.float64) + 0.5
    return scores, pos, w, rsp.sampled_ranks(scores, pos, SamplingDesign(10, popularity=w), generator=g)


def test_refusals_name_the_argument(pop_ranks):
    scores, pos, w, s = pop_ranks
    # bare ranks cannot carry the weights; a SampledRanks stripped of them neither
    with pytest.raises(ValueError, match="^design: bare ranks"):
        rsp.SampledRanks.from_arrays(s.ranks, s.candidates(), 10, SamplingDesign(10, popularity=w))
    with pytest.raises(ValueError, match="^sampled_ranks: these popularity-sampled ranks .* carry no per-draw"):
        rsp.estimate("auc", dataclasses.replace(s, popularity_stats=None), method="hh")
    without = rsp.sampled_ranks(scores, pos, SamplingDesign(10, replacement=False, popularity=w))
    assert without.popularity_stats is None
    with pytest.raises(ValueError, match="^method: 'hh' does not support .*without replacement are not independent"):
        rsp.estimate("auc", without, method="hh")
    # top-K metrics under popularity: refused, naming what is available
    with pytest.raises(ValueError, match=r"^metric: method 'hh' estimates auc only; for hit@10 use one of "
                                         r"\('auto', 'none', 'pl_fit'\)"):
        rsp.estimate("hit@10", s, method="hh")
    with pytest.raises(ValueError, match=r"^method: 'mes' does not support .*popularity.*for ndcg@10 use one of "
                                         r"\('auto', 'none', 'pl_fit'\)"):
        rsp.estimate("ndcg@10", s, method="mes")
    with pytest.raises(ValueError, match="^metric: method 'hh' estimates auc only"):
        rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(s.ranks, 50, 10), "hh")  # uniform bare ranks too
    # a drawable candidate of weight 0 can never be drawn: its count is unidentified
    w0 = w.clone()
    w0[3] = 0.0
    z = rsp.sampled_ranks(scores, pos, SamplingDesign(10, popularity=w0), generator=torch.Generator().manual_seed(1))
    assert rsp.estimate("auc", z, method="none").value > 0  # the uncorrected metric needs no weights
    with pytest.raises(ValueError, match="^popularity: .* weight 0"):
        rsp.estimate("auc", z, method="hh")
    # weights the design refuses; given negatives the law cannot draw
    for bad in (float("nan"), -1.0):
        wb = w.clone()
        wb[0] = bad
        with pytest.raises(ValueError, match="^popularity: "):
            SamplingDesign(10, popularity=wb)
        with pytest.raises(ValueError, match="^popularity: "):
            rsp.sampled_ranks(scores, pos, SamplingDesign(10, popularity=wb))
    neg = torch.full((60, 10), 3)
    neg[pos[:, 0] == 3] = 4
    with pytest.raises(ValueError, match="^negatives: .* weight 0"):
        rsp.sampled_ranks(scores, pos, SamplingDesign(10, popularity=w0), negatives=neg)
    # the rank estimate needs a fixed-m draw's SampledRanks
    adaptive = rsp.adaptive_sampled_ranks(scores, pos, SamplingDesign(5, adaptive_max=20))
    for fn in (popularity.rank_estimates, popularity.mean_rank):
        with pytest.raises(ValueError, match="^sampled: adaptive"):
            fn(adaptive)
        with pytest.raises(ValueError, match="^sampled: expected the SampledRanks"):
            fn(s.ranks)
    with pytest.raises(ValueError, match="^method: 'hh' does not support"):
        rsp.estimate("auc", adaptive, method="hh")


def test_popularity_draws_refuses_ranks_without_a_design(pop_ranks):
    """Regression (found by mypy): SampledRanks without a design, with or without statistics, were an
    AttributeError (``None.replacement`` / ``None.n_samples``); a ValueError naming ``sampled_ranks`` now, and the
    same ranks with their design still give the draws."""
    _, _, _, s = pop_ranks
    assert s.popularity_stats is not None
    for bare in (dataclasses.replace(s, design=None), dataclasses.replace(s, design=None, popularity_stats=None)):
        with pytest.raises(ValueError, match="^sampled_ranks: these SampledRanks carry no design"):
            popularity.popularity_draws(bare)
    d = popularity.popularity_draws(s)
    valid = s.ranks > 0
    np.testing.assert_array_equal(d.s1, s.popularity_stats.inv_q[valid].numpy())
    np.testing.assert_array_equal(d.m, np.full(int(valid.sum()), 10.0))


def test_statistics_from_csr_exclusions_equal_the_padded_form():
    """The draw paths keep exclusions in CSR form (exclusions.Exclusions): the per-row forbidden weight summed over
    the entries equals the padded, sorted form's, so the statistics are identical (also with zero weights)."""
    from reco_sampled_plugin.exclusions import prepare_exclusions
    from reco_sampled_plugin.ranking import popularity_draw_stats

    g = torch.Generator().manual_seed(11)
    b, n, m = 6, 40, 9
    w = torch.rand(n, generator=g, dtype=torch.float64) + 0.05
    w[[3, 17]] = 0.0  # two items no draw can pick
    pos = torch.tensor([[0, 1], [2, -1], [5, 6], [7, -1], [8, 9], [10, -1]])
    exc = torch.full((b, 5), -1, dtype=torch.int64)
    exc[0, :3] = torch.tensor([3, 11, 20])
    exc[2, :5] = torch.tensor([17, 30, 31, 32, 33])
    exc[4, :1] = torch.tensor([39])
    design = rsp.SamplingDesign(m, popularity=w)
    neg = torch.randint(18, 30, (b, 2, m), generator=g)
    beat = torch.rand(b, 2, m, generator=g) < 0.3
    padded = popularity_draw_stats(design, beat, neg, pos, exc, n)
    csr = popularity_draw_stats(design, beat, neg, pos, prepare_exclusions(exc, n), n)
    for name in ("beating", "inv_q", "inv_q2", "unreachable"):
        a, c = getattr(padded, name), getattr(csr, name)
        assert torch.equal(a, c) if not a.is_floating_point() else torch.allclose(a, c, rtol=1e-14, atol=0), name


# --------------------------------------------------------------------------- the draw's inverse cdf with holes
@settings(max_examples=examples(80), deadline=None)
@given(hst.integers(1, 40), hst.integers(1, 6), hst.integers(0, 2 ** 31 - 1))
def test_holed_cdf_finds_the_item_of_a_per_row_cumulative_sum(n, rows, seed):
    """The draws' lookup (``ranking._HoledCdf``: the catalogue's one cumulative sum, each row's forbidden items cut
    out) gives, for every threshold, the item a cumulative sum over the row with its forbidden weights set to 0
    gives (brute force): integer weights (zeros among them), so both are exact; thresholds at every interval's
    ends and middles. The allowed weight at or below an allowed item, and the row totals, likewise."""
    from reco_sampled_plugin.ranking import _HoledCdf, forbidden_sorted

    rng = np.random.default_rng(seed)
    w = torch.as_tensor(rng.integers(0, 4, size=n), dtype=torch.float64)
    w[rng.integers(0, n)] += 1.0  # some weight
    width = int(rng.integers(0, n + 1))
    forb = torch.full((rows, max(width, 1)), -1, dtype=torch.int64)
    for r in range(rows):
        k = int(rng.integers(0, width + 1))
        forb[r, :k] = torch.as_tensor(rng.choice(n, size=k, replace=False))
    srt = forbidden_sorted(forb, None, n)
    hc = _HoledCdf.build(torch.cumsum(w, 0), w, srt)
    for r in range(rows):
        allowed = w.clone()
        allowed[forb[r][forb[r] >= 0]] = 0.0
        cdf = torch.cumsum(allowed, 0)
        total = float(cdf[-1])
        assert float(hc.total[r, 0]) == total
        if total == 0:
            continue
        ends = torch.cat([torch.zeros(1, dtype=torch.float64), cdf[:-1]])
        t = torch.unique(torch.cat([ends, (ends + cdf) / 2, cdf - 0.25])).clamp(0, total - 0.25)
        t = t[t < total]
        got = hc.item(t.view(1, -1).expand(rows, -1).contiguous())[r]
        want = torch.searchsorted(cdf, t, right=True)
        assert torch.equal(got, want), (r, t, got, want)
        assert (allowed[got] > 0).all()  # never a forbidden or weightless item
        ok = torch.nonzero(allowed > 0).view(-1)
        cum = hc.allowed_cdf(ok.view(1, -1).expand(rows, -1).contiguous())[r]
        assert torch.equal(cum, cdf[ok])


def test_draws_beyond_float64_resolution_are_refused_and_the_rest_draw_right():
    """Popularity draws look weights up in a float64 cumulative sum. A row whose drawable items hold less than 2^-40
    of the weight (its positive all but 1e-17 of it) drew its own positive or an excluded item as a negative, and a
    draw without replacement that needed an item of 1e-17 of the weight never ended: both are ValueErrors now.
    Just inside the bound (the drawable items 3 / (2^39 + 3) of the weight), every draw is a drawable item, with
    replacement and without."""
    from reco_sampled_plugin.design import SamplingDesign

    heavy = torch.tensor([1.0, 1.0, 1.0, 1e17], dtype=torch.float64)
    s = torch.randn(1, 4, generator=torch.Generator().manual_seed(0))
    for pos, exc in (([[3]], None), ([[0]], [[3]])):
        with pytest.raises(ValueError, match=r"^popularity: in 1 row\(s\) the items that may be drawn hold less than"):
            rsp.sampled_ranks(s, torch.tensor(pos), SamplingDesign(5, popularity=heavy),
                              exclude=None if exc is None else torch.tensor(exc))
    faint = torch.tensor([1e-17, 1.0, 1.0, 1.0], dtype=torch.float64)
    with pytest.raises(ValueError, match=r"^popularity: 3 distinct items per positive could not be drawn"):
        rsp.sampled_ranks(s, torch.tensor([[1]]), SamplingDesign(3, popularity=faint, replacement=False))
    w = torch.tensor([1.0, 1.0, 1.0, 2.0 ** 39], dtype=torch.float64)
    scores = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    pos = torch.full((50, 1), 3)
    for replacement, m in ((True, 200), (False, 3)):
        r = rsp.sampled_ranks(scores, pos, SamplingDesign(m, popularity=w, replacement=replacement),
                              generator=torch.Generator().manual_seed(1))
        assert bool(((r.negatives >= 0) & (r.negatives < 3)).all())


def test_keyed_popularity_draws_refuse_rows_beyond_float64_resolution():
    """The torchmetrics class's keyed popularity draws check what ``sampled_ranks`` checks: a row whose drawable
    items hold less than 2^-40 of the weight (its positive the rest) is refused with the batch (read at once on the
    CPU), and a batch inside the bound is counted."""
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics
    from reco_sampled_plugin.design import SamplingDesign

    heavy = torch.tensor([1.0, 1.0, 1.0, 1e17], dtype=torch.float64)
    metric = SampledRankingMetrics(["auc"], SamplingDesign(5, popularity=heavy), estimators=["hh"], seed=7)
    s = torch.randn(2, 4, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^popularity: in some row the items that may be drawn hold less than 2\^-40"):
        metric.update(s, torch.tensor([[3], [0]]))
    metric.update(s, torch.tensor([[1], [0]]))
    assert float(metric.hist.sum()) == 2.0
