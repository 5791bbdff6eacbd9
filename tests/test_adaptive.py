"""Adaptive sampling: the design, its stopping law, the cost report, estimate(adaptive=) and honest
intervals under the stopping law."""

import math

import numpy as np
import pytest
import torch
from scipy import stats

import reco_sampled_plugin as rsp
from reco_sampled_plugin._adaptive_law import adaptive_cost, expected_samples, stage_event_cdf
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks, adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.design import AdaptiveDesign, adaptive_design, design_spec, parse_design
from reco_sampled_plugin._rank_hist import as_histogram


def _log_uniform_ranks(n: int, size: int, seed: int) -> np.ndarray:
    """P(R = r) = log((r + 1) / r) / log(n + 1): about 1/r, monotone from rank 1."""
    u = np.random.default_rng(seed).uniform(0.0, 1.0, size)
    return np.minimum(np.floor(np.exp(u * math.log(n + 1.0))), n).astype(np.int64)


def test_design_stages_and_validation():
    d = AdaptiveDesign(100, 1000)
    assert d.stages.tolist() == [100, 200, 400, 800] and d.cap == 800
    assert AdaptiveDesign(50, 50).stages.tolist() == [50]
    assert adaptive_design(100, None) is None
    for m, cap, msg in ((100, 50, "adaptive_max"), (0, 100, "n_samples"), (-3, 100, "n_samples"), (10, -1, "adaptive_max"),
                        (2.5, 10, "n_samples")):
        with pytest.raises(ValueError, match=msg):
            AdaptiveDesign(m, cap)
    with pytest.raises(ValueError, match="n_samples"):
        adaptive_design(None, 100)


def test_stage_event_law_matches_enumeration():
    """P(E(s, i) | p) against the stopping law summed by brute force over every stopping point."""
    d = AdaptiveDesign(3, 12)  # stages 3, 6, 12
    stages = d.stages.tolist()
    for p in (0.0, 0.05, 0.3, 0.9, 1.0):
        # brute force: probability of stopping at stage s with j beats among its new draws
        stop = {}
        surv = 1.0
        prev = 0
        for s, size in enumerate(stages):
            new = size - prev
            for j in range(new + 1):
                pj = stats.binom.pmf(j, new, p)
                if j == 0 and s < len(stages) - 1:
                    continue
                stop[(s, j)] = surv * pj
            surv *= (1 - p) ** new
            prev = size
        assert sum(stop.values()) == pytest.approx(1.0, abs=1e-12)
        for s, size in enumerate(stages):
            new = size - (stages[s - 1] if s else 0)
            i = np.arange(1, new + 2)
            got = stage_event_cdf(np.array([p]), d, s, i)[0]
            want = [sum(v for (t, j), v in stop.items() if t > s or (t == s and j + 1 <= ii)) for ii in i]
            np.testing.assert_allclose(got, want, atol=1e-12)


def test_simulated_adaptive_draws_follow_the_law():
    """Event frequencies of 200k simulated positives at one exact rank within 4 standard errors of the law."""
    n, r = 5000, 7
    d = AdaptiveDesign(20, 320)
    drawn = adaptive_sampled_ranks_from_exact(torch.full((200_000,), r), n, rsp.SamplingDesign(20, adaptive_max=320),
                                              generator=torch.Generator().manual_seed(3))
    ranks, sizes = drawn.ranks, drawn.n_samples
    p = (r - 1) / (n - 1)
    for s, size in enumerate(d.stages.tolist()):
        i = np.array([1, 2, 4])
        law = stage_event_cdf(np.array([p]), d, s, i)[0]
        emp = [float(((sizes > size) | ((sizes == size) & (ranks <= ii))).double().mean()) for ii in i]
        se = np.sqrt(law * (1 - law) / 200_000)
        assert np.all(np.abs(np.array(emp) - law) <= 4 * se + 1e-9), (s, emp, law)


@pytest.mark.parametrize("r, m, cap", [(1, 20, 320), (3, 20, 320), (40, 20, 320), (7, 50, 700), (900, 10, 80)])
def test_expected_samples_match_simulation(r, m, cap):
    """E[M_final | R] and P(first at the cap | R) in closed form against 100k simulated positives (4 standard
    errors), the completion share through exact_at_cap; p = 0 and p = 1 exactly."""
    n, reps = 1000, 100_000
    d = AdaptiveDesign(m, cap)
    s = adaptive_sampled_ranks_from_exact(torch.full((reps,), r), torch.full((reps,), n),
                                          rsp.SamplingDesign(m, adaptive_max=cap, exact_at_cap=True),
                                          generator=torch.Generator().manual_seed(r))
    mean, first = expected_samples(np.array([(r - 1) / (n - 1)]), d)
    sizes = s.n_samples.double()
    assert abs(float(sizes.mean()) - mean[0]) <= 4 * float(sizes.std()) / math.sqrt(reps) + 1e-6
    done = float((s.exact_ranks > 0).double().mean())
    assert abs(done - first[0]) <= 4 * math.sqrt(first[0] * (1 - first[0]) / reps) + 1e-9
    m0, f0 = expected_samples(np.array([0.0, 1.0]), d)
    assert m0.tolist() == [float(d.cap), float(m)] and f0.tolist() == [1.0, 0.0]


def test_adaptive_from_scores_equals_exact_rank_law():
    """From scores: sizes are stages, first-ranked positives only at the cap, and the share reaching each stage
    matches the law for a positive of known exact rank."""
    n_items, b = 400, 4000
    scores = torch.arange(n_items, 0, -1, dtype=torch.float64).expand(b, n_items).contiguous()  # item 0 best
    pos = torch.full((b, 1), 9)  # exact rank 10 among 400 candidates
    drawn = adaptive_sampled_ranks(scores, pos, rsp.SamplingDesign(8, adaptive_max=64),
                                   generator=torch.Generator().manual_seed(0))
    ranks, sizes = drawn.ranks, drawn.n_samples
    d = AdaptiveDesign(8, 64)
    assert set(sizes.unique().tolist()) <= set(d.stages.tolist())
    assert not bool(((ranks == 1) & (sizes < 64)).any())
    p = 9 / 399
    for s, size in enumerate(d.stages.tolist()):
        law = float(stage_event_cdf(np.array([p]), d, s, np.array([1]))[0, 0])
        emp = float(((sizes > size) | ((sizes == size) & (ranks <= 1))).double().mean())
        assert abs(emp - law) <= 4 * math.sqrt(law * (1 - law) / b) + 1e-9


def test_cost_report_by_hand():
    ranks = torch.tensor([3, 2, 1, 5, 1, 1])
    sizes = torch.tensor([10, 20, 40, 40, 40, 10])
    hist = as_histogram(ranks[:5], 1000, sizes[:5])
    c = adaptive_cost(hist, AdaptiveDesign(10, 40))
    assert c.mean_samples == pytest.approx((10 + 20 + 40 + 40 + 40) / 5)
    assert c.max_samples == 40 and c.share_at_cap == pytest.approx(3 / 5) and c.share_first_at_cap == pytest.approx(2 / 5)
    assert c.start == 10 and c.cap == 40
    # a histogram the design cannot produce is refused, as estimate() refuses it (a cost of m = 32 > cap 16 before)
    with pytest.raises(ValueError, match=r"^n_samples: size 80 is not a stage"):
        adaptive_cost(as_histogram(ranks[:3], 1000, torch.tensor([10, 20, 80])), AdaptiveDesign(10, 40))
    with pytest.raises(ValueError, match=r"^sampled_ranks: positives ranked first among m = 10 samples stopped"):
        adaptive_cost(as_histogram(ranks[5:], 1000, sizes[5:]), AdaptiveDesign(10, 40))


def test_estimate_adaptive_checks_and_cost():
    exact = _log_uniform_ranks(20_000, 2000, 0)
    drawn = adaptive_sampled_ranks_from_exact(torch.as_tensor(exact), 20_000,
                                              rsp.SamplingDesign(100, adaptive_max=3200),
                                              generator=torch.Generator().manual_seed(1))
    ranks, sizes = drawn.ranks, drawn.n_samples
    est = rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(ranks, 20_000, sizes, rsp.SamplingDesign(100, adaptive_max=3200)),
        rsp.registry.Auto(n_bootstrap=0),
    )
    cost = est.details["adaptive"]
    assert cost["mean_samples"] == pytest.approx(float(sizes.double().mean()))
    assert cost["max_samples"] == int(sizes.max()) and cost["cap"] == 3200 and cost["start"] == 100
    assert cost["share_first_at_cap"] == pytest.approx(float(((sizes == 3200) & (ranks == 1)).double().mean()))
    assert "cap_reached" in est.flags and "top_unresolved" in est.flags  # NDCG still depends on the cap's bin
    # the same fit as without the declaration: the stopping rule leaves the likelihood unchanged
    plain = rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(ranks, 20_000, sizes),
        rsp.registry.Auto(n_bootstrap=0),
    )
    assert est.value == plain.value
    with pytest.raises(ValueError, match="fixed m"):
        rsp.estimate(
            "hit@10",
            rsp.SampledRanks.from_arrays(ranks, 20_000, sizes, rsp.SamplingDesign(100, adaptive_max=3200)),
            "bv",
        )
    with pytest.raises(ValueError, match="binomial"):
        rsp.SamplingDesign(100, replacement=False, adaptive_max=3200)
    with pytest.raises(ValueError, match="not a stage"):
        rsp.estimate(
            "hit@10",
            rsp.SampledRanks.from_arrays(ranks, 20_000, sizes, rsp.SamplingDesign(100, adaptive_max=1600)),
        )
    with pytest.raises(ValueError, match="stopped below the cap"):  # a fixed-m design declared adaptive
        rsp.estimate(
            "hit@10",
            rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 3]), 20_000, 100,
                                         rsp.SamplingDesign(100, adaptive_max=3200)),
        )
    with pytest.raises(ValueError, match="n_samples"):  # negative sizes
        rsp.estimate(
            "hit@10",
            rsp.SampledRanks.from_arrays(torch.tensor([2, 3]), 20_000, torch.tensor([-100, 100]),
                                         rsp.SamplingDesign(100, adaptive_max=3200)),
        )
    with pytest.raises(ValueError, match="^n_samples: "):  # a bad size, named as the caller named it
        adaptive_sampled_ranks_from_exact(torch.tensor([3, 4]), 100, -2)
    with pytest.raises(ValueError, match=r"^n_samples: SamplingDesign\(8\) is not adaptive"):  # an int m: fixed
        rsp.adaptive_sampled_ranks(torch.randn(2, 50), torch.tensor([[1], [2]]), 8)
    with pytest.raises(ValueError, match="^n_samples: expected a SamplingDesign"):  # the (m, cap) pair: a design
        rsp.adaptive_sampled_ranks(torch.randn(2, 50), torch.tensor([[1], [2]]), (8, 64))
    with pytest.raises(ValueError, match="^n_samples: "):  # 0.1's loose cap after m: refused at m
        adaptive_sampled_ranks_from_exact(torch.tensor([3, 4]), 100, 8, 64)
    with pytest.raises(ValueError, match="adaptive_max"):
        rsp.SamplingDesign(8, adaptive_max=4)
    with pytest.raises(ValueError, match="adaptive_max"):
        rsp.estimate(
            "hit@10",
            rsp.SampledRanks.from_arrays(ranks, 20_000, sizes, rsp.SamplingDesign(100, adaptive_max=50)),
        )


def test_adaptive_identified_interval_covers_truth():
    """Simulation with known truth (log-uniform ranks, n = 20,000, m = 100 -> 3200): the honest interval of
    NDCG@10 and HR@1 covers the exact metric of the users in at least 18 of 20 repeats (95% nominal: 20
    repeats miss more than 2 with probability 0.08 if coverage is exactly 0.95; the intervals are conservative)."""
    n = 20_000
    hits = {"ndcg@10": 0, "hit@1": 0}
    widths = []
    for rep in range(20):
        exact = _log_uniform_ranks(n, 1500, 100 + rep)
        drawn = adaptive_sampled_ranks_from_exact(torch.as_tensor(exact), n, rsp.SamplingDesign(100, adaptive_max=3200),
                                                  generator=torch.Generator().manual_seed(rep))
        ranks, sizes = drawn.ranks, drawn.n_samples
        for metric in hits:
            truth = float(rsp.metric_values(metric, torch.as_tensor(exact), n).mean())
            est = rsp.estimate(
                metric,
                rsp.SampledRanks.from_arrays(ranks, n, sizes, rsp.SamplingDesign(100, adaptive_max=3200)),
                rsp.registry.Auto(n_bootstrap=0),
            )
            assert est.identification is not None
            ident = est.identification.interval(0.95)
            assert "several_m" not in ident.flags and "identification_failed" not in ident.flags
            lo, hi = est.interval(0.95)
            hits[metric] += lo <= truth <= hi
            widths.append(hi - lo)
    assert hits["ndcg@10"] >= 18 and hits["hit@1"] >= 18, hits
    # against a fixed-m design at the same start (m = 100, b = 199): HR@10 becomes identified (the cap's bin,
    # b = 7.2, lies above K), NDCG@10 stays partially identified (its weights change inside the cap's bin) but
    # narrower (measured: 0.12 against 0.20)
    exact = _log_uniform_ranks(n, 1500, 100)
    fixed = rsp.simulate_sampled_ranks(torch.as_tensor(exact), n, 100, generator=torch.Generator().manual_seed(0))
    drawn = adaptive_sampled_ranks_from_exact(torch.as_tensor(exact), n, rsp.SamplingDesign(100, adaptive_max=3200),
                                              generator=torch.Generator().manual_seed(0))
    ranks, sizes = drawn.ranks, drawn.n_samples
    lo_f, hi_f = rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(fixed, n, 100),
                              rsp.registry.Auto(n_bootstrap=0)).interval(0.95)
    assert np.median(widths[0::2]) < 0.75 * (hi_f - lo_f)
    hr_fixed = rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(fixed, n, 100), rsp.registry.Auto(n_bootstrap=0))
    hr_adaptive = rsp.estimate(
        "hit@10",
        rsp.SampledRanks.from_arrays(ranks, n, sizes, rsp.SamplingDesign(100, adaptive_max=3200)),
        rsp.registry.Auto(n_bootstrap=0),
    )
    assert hr_adaptive.identification is None and "top_unresolved" not in hr_adaptive.flags
    w_f = np.subtract(*hr_fixed.interval()[::-1])
    w_a = np.subtract(*hr_adaptive.interval()[::-1])
    assert w_a < 0.25 * w_f


def test_pooling_keeps_adaptive_groups_inside_the_catalogue():
    """Regression: quantile pooling of many (n, m) groups kept each bin's n at least m + 1, which moved adaptive
    stages with m > n (a cap beyond the catalogue, legal with replacement) outside it; a pooled group's n must be
    one of its groups' n."""
    from reco_sampled_plugin.rank_distribution import pool_groups

    n_u = np.random.default_rng(0).integers(900, 1700, 900)
    exact = np.minimum(_log_uniform_ranks(2000, 900, 1), n_u)
    drawn = adaptive_sampled_ranks_from_exact(torch.as_tensor(exact), torch.as_tensor(n_u),
                                              rsp.SamplingDesign(100, adaptive_max=3200),
                                              generator=torch.Generator().manual_seed(2))
    ranks, sizes = drawn.ranks, drawn.n_samples
    hist = as_histogram(ranks, torch.as_tensor(n_u), sizes)
    pooled, changed = pool_groups(hist, 16)
    assert changed and pooled.n_items.max() <= n_u.max() and pooled.n_items.min() >= n_u.min()
    assert set(pooled.n_samples.tolist()) == set(hist.n_samples.tolist())


# ------------------------------------------------------------------------------ the threshold rule (adaptive_top)
def _threshold_stops(d: AdaptiveDesign, p: float) -> dict:
    """Brute force: P(stop at stage s with A beats among its M_s draws) of the rule 'draw on while A <= t - 1',
    summed over every path of per-stage new beats (the oracle of the threshold law)."""
    stages, t = d.stages.tolist(), d.top
    paths = {0: 1.0}  # beats so far -> probability of reaching the next stage with them
    stop, prev = {}, 0
    for s, size in enumerate(stages):
        new, nxt = size - prev, {}
        for a, w in paths.items():
            for j in range(new + 1):
                v = w * stats.binom.pmf(j, new, p)
                if a + j <= t - 1 and s < len(stages) - 1:
                    nxt[a + j] = nxt.get(a + j, 0.0) + v
                else:
                    stop[(s, a + j)] = stop.get((s, a + j), 0.0) + v
        paths, prev = nxt, size
    return stop


@pytest.mark.parametrize("m, cap, top", [(3, 12, 2), (4, 16, 3), (2, 16, 2)])
def test_threshold_law_matches_enumeration(m, cap, top):
    """adaptive_top = t: every stopping point's probability is Binomial(A; M_s, p) times a factor free of p (the
    likelihood fits read final (M, r~) as if M were fixed); the band's events E(s, i) and the expected cost in
    closed form equal the sums over every path."""
    d = AdaptiveDesign(m, cap, top)
    stages = d.stages.tolist()
    ps = (0.0, 0.02, 0.2, 0.55, 0.9, 1.0)
    stops = {p: _threshold_stops(d, p) for p in ps}
    for p in ps:
        assert sum(stops[p].values()) == pytest.approx(1.0, abs=1e-12)
        assert all(a >= top for (s, a), v in stops[p].items() if s < len(stages) - 1 and v > 0)
    for key in stops[0.2]:  # the factor P(stop at key) / Binomial(A; M_s, p), the same for every 0 < p < 1
        s, a = key
        factors = [stops[p].get(key, 0.0) / stats.binom.pmf(a, stages[s], p) for p in ps[1:-1]]
        np.testing.assert_allclose(factors, factors[0], rtol=1e-9)
    for p in ps:
        for s, size in enumerate(stages):
            i = np.arange(1, size + 2)
            got = stage_event_cdf(np.array([p]), d, s, i)[0]
            want = [sum(v for (t, a), v in stops[p].items() if t > s or (t == s and a + 1 <= ii)) for ii in i]
            np.testing.assert_allclose(got, want, atol=1e-12)
        mean, at_cap = expected_samples(np.array([p]), d)
        assert mean[0] == pytest.approx(sum(v * stages[s] for (s, a), v in stops[p].items()), abs=1e-10)
        last = len(stages) - 1
        assert at_cap[0] == pytest.approx(sum(v for (s, a), v in stops[p].items() if s == last and a < top), abs=1e-12)


def test_threshold_draws_follow_the_law():
    """The threshold rule drawn from exact ranks and from scores: the frequency of every stopping point (final M,
    r~) of 100k positives at one exact rank within 4.5 standard errors of the enumerated law; completion at the cap
    takes exactly the positives with r~ <= t there."""
    n, r, reps = 400, 10, 100_000
    design = rsp.SamplingDesign(4, adaptive_max=32, adaptive_top=3, exact_at_cap=True)
    law = _threshold_stops(design.adaptive, (r - 1) / (n - 1))
    scores = torch.arange(n, 0, -1, dtype=torch.float64).expand(reps // 10, n)  # item r - 1 has exact rank r
    drawn = [adaptive_sampled_ranks_from_exact(torch.full((reps,), r), n, design,
                                               generator=torch.Generator().manual_seed(5))]
    drawn += [adaptive_sampled_ranks(scores, torch.full((reps // 10, 1), r - 1), design,
                                     generator=torch.Generator().manual_seed(s)) for s in range(10)]
    ranks = torch.cat([drawn[0].ranks.reshape(-1), torch.cat([d.ranks.reshape(-1) for d in drawn[1:]])])
    sizes = torch.cat([drawn[0].n_samples.reshape(-1), torch.cat([d.n_samples.reshape(-1) for d in drawn[1:]])])
    done = torch.cat([drawn[0].exact_ranks.reshape(-1), torch.cat([d.exact_ranks.reshape(-1) for d in drawn[1:]])])
    stages = design.adaptive.stages.tolist()
    for half in (slice(0, reps), slice(reps, 2 * reps)):  # from exact ranks; from scores
        rk, sz, dn = ranks[half], sizes[half], done[half]
        for (s, a), v in law.items():
            emp = float(((sz == stages[s]) & (rk == a + 1)).double().mean())
            assert abs(emp - v) <= 4.5 * math.sqrt(v * (1 - v) / reps) + 1e-9, (s, a, emp, v)
        assert torch.equal(dn > 0, (sz == 32) & (rk <= 3)) and bool((dn[dn > 0] == r).all())


def test_threshold_design_spec_and_validation():
    d = rsp.SamplingDesign(100, adaptive_max=3200, adaptive_top=3, exact_at_cap=True)
    assert design_spec(d) == "100:3200:top3:exact" and parse_design("100:3200:top3:exact") == d
    assert parse_design("100:3200:top3+0.05:uniform") == rsp.SamplingDesign(
        100, adaptive_max=3200, adaptive_top=3, exact_share=0.05)
    assert d != rsp.SamplingDesign(100, adaptive_max=3200, exact_at_cap=True) and d.adaptive.top == 3
    assert "r~ <= 3" in d.describe() and "adaptive_top=3" in repr(d)
    assert rsp.SamplingDesign(100, adaptive_max=3200, adaptive_top=1) == rsp.SamplingDesign(100, adaptive_max=3200)
    for kw, msg in ((dict(adaptive_top=3), "^adaptive_top: .*give adaptive_max"),
                    (dict(adaptive_max=800, adaptive_top=0), "^adaptive_top"),
                    (dict(adaptive_max=800, adaptive_top=101), "^adaptive_top"),
                    (dict(adaptive_max=800, adaptive_top=True), "^adaptive_top"),
                    (dict(adaptive_max=800, adaptive_top=2.5), "^adaptive_top")):
        with pytest.raises(ValueError, match=msg):
            rsp.SamplingDesign(100, **kw)
    for bad in ("100:3200:top:exact", "100:3200:top0", "100:top3", "100:3200:exact:top3", "100:3200:top3:top3"):
        with pytest.raises(ValueError):
            parse_design(bad)


def test_threshold_estimates_recover_the_truth_and_checks_refuse_impossible_stops():
    """mle on threshold draws (t = 3, with and without completion at the cap) of 12 sets of 3,000 log-uniform
    ranks: the mean error of HR@10 and NDCG@10 within 4 standard errors of 0 over the sets; a histogram with
    positives stopped at r~ <= t below the cap is refused for that design."""
    n = 5000
    truth_sets, est = [], {True: [], False: []}
    for rep in range(12):
        exact = torch.as_tensor(_log_uniform_ranks(n, 3000, 200 + rep))
        truth_sets.append([float(rsp.metric_values(k, exact, n).mean()) for k in ("hit@10", "ndcg@10")])
        for at_cap in (True, False):
            design = rsp.SamplingDesign(50, adaptive_max=800, adaptive_top=3, exact_at_cap=at_cap)
            drawn = adaptive_sampled_ranks_from_exact(exact, n, design, generator=torch.Generator().manual_seed(rep))
            est[at_cap].append([rsp.estimate(k, drawn, "mle").value for k in ("hit@10", "ndcg@10")])
    truth = np.asarray(truth_sets)
    for at_cap in (True, False):
        err = np.asarray(est[at_cap]) - truth
        se = err.std(0, ddof=1) / math.sqrt(len(err))
        assert np.all(np.abs(err.mean(0)) <= 4 * se + 1e-4), (at_cap, err.mean(0), se)
    plain = adaptive_sampled_ranks_from_exact(torch.as_tensor(_log_uniform_ranks(n, 3000, 1)), n,
                                              rsp.SamplingDesign(50, adaptive_max=800),
                                              generator=torch.Generator().manual_seed(0))
    assert bool(((plain.ranks == 2) & (plain.n_samples < 800)).any())  # stopped at r~ = 2: impossible with t = 3
    with pytest.raises(ValueError, match=r"within the top 3 \(adaptive_top\) among m = \d+ samples stopped below"):
        rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(plain.ranks, n, plain.n_samples, rsp.SamplingDesign(
            50, adaptive_max=800, adaptive_top=3)), "mle")


def test_mask_positives_of_ragged_rows_equal_their_index_form(monkeypatch):
    """Mask positives whose rows differ in count: a later stage draws for rows whose longest list is shorter than
    the batch's (the mask's stage positives are trimmed to it); their ranks are put back in the batch's width (a
    RuntimeError of mismatched sizes before). Where draws are keyed (an accelerator's seeded draws: the same items
    whatever the width) they equal the index form's from the same generator state; on the CPU's generator stream
    the stages' shapes differ, so only what the scores fix is compared (rows of last positives stop at m = 4 with
    r~ = 5, rows of first positives draw on)."""
    from reco_sampled_plugin import _graphs, _inputs, counting

    g = torch.Generator().manual_seed(0)
    b, n = 40, 60
    scores = torch.randn(b, n, generator=g)
    counts = torch.where(torch.arange(b) % 2 == 0, 4, 2)  # even rows 4 positives, odd rows 2
    order = torch.argsort(torch.rand(b, n, generator=g), 1)
    pos = torch.where(torch.arange(4) < counts[:, None], order[:, :4].sort(1).values, -1)
    pos = torch.where(pos >= 0, pos, n).sort(1).values
    pos = torch.where(pos < n, pos, -1)
    mask = torch.zeros(b, n + 1, dtype=torch.bool).scatter_(1, torch.where(pos >= 0, pos, n), True)[:, :n]
    top = torch.where(pos >= 0, pos, pos[:, :1])  # padding: the row's first positive again
    scores.scatter_(1, top, torch.where(torch.arange(b)[:, None] % 2 == 0, -10.0, 10.0).expand(top.shape).clone())
    # the odd rows' positives first, the even rows' last: only rows of 2 positives draw again (the mask's stage
    # positives trimmed to width 2 of the batch's 4)
    design = rsp.SamplingDesign(4, adaptive_max=64)
    cpu = rsp.adaptive_sampled_ranks(scores, mask, design, generator=torch.Generator().manual_seed(1))
    assert bool((cpu.ranks[::2] == 5).all()) and bool((cpu.n_samples[::2] == 4).all())
    assert bool((cpu.n_samples[1::2, :2] > 4).all()) and bool((cpu.ranks[1::2, 2:] == 0).all())
    monkeypatch.setattr(_graphs, "_fake", [True])  # keyed draws, as on an accelerator
    monkeypatch.setattr(counting, "_numpy_blocked", [True])
    monkeypatch.setattr(counting, "_cpu_chunks", [False])
    monkeypatch.setattr(_inputs, "_numpy_scan", [False])
    have = rsp.adaptive_sampled_ranks(scores, mask, design, generator=torch.Generator().manual_seed(1))
    want = rsp.adaptive_sampled_ranks(scores, pos, design, generator=torch.Generator().manual_seed(1))
    assert torch.equal(have.ranks, want.ranks) and torch.equal(have.n_samples, want.n_samples)
