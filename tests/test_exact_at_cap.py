"""Exact completion at the cap of adaptive sampling (``SamplingDesign(..., exact_at_cap=True)``).

Oracles: the score-matrix path (``adaptive_sampled_ranks``) for the scorer loop, brute-force ranks from the full
rows for the exact ranks, the same design without the option for the draws, known exact ranks for the estimates,
and the point-mass likelihood written out by hand.
"""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import rank_distribution as rd, registry
from reco_sampled_plugin._rank_hist import RankHistogram, pool_by_n, sampled_rank_histogram
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks, adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.metrics import metric_from_float_ranks
from reco_sampled_plugin.ranking import SampledRanks
from reco_sampled_plugin.scorer_ranks import sampled_ranks_from_scorer


def _problem(seed: int, b: int = 30, n: int = 240, p: int = 3, coarse: bool = False):
    """Scores with a strong top (items 0..5 score high, so some positives stay first at the cap), padded positives,
    exclusions; ``coarse``: scores rounded to create ties."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g, dtype=torch.float64)
    scores[:, :6] += 4.0
    if coarse:
        scores = torch.round(scores * 2) / 2
    pos = torch.stack([torch.randperm(n - 6, generator=g)[:p] + 6 for _ in range(b)])
    pos[: b // 2, 0] = torch.arange(b // 2) % 6  # a top item as a positive (the others are not top items)
    pos[::4, 2] = -1  # padding
    exc = torch.stack([torch.randperm(n, generator=g)[: 12] for _ in range(b)])
    exc = torch.where((exc.unsqueeze(2) == pos.unsqueeze(1)).any(2), torch.full_like(exc, -1), exc)
    return scores, pos, exc


class CountingScorer:
    """Reads the score matrix, records every call's shape (the oracle of the cost and the ``max_pairs`` budget)."""

    def __init__(self, scores: torch.Tensor) -> None:
        self.scores, self.shapes = scores, []

    def __call__(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        self.shapes.append(tuple(items.shape))
        return self.scores[users.unsqueeze(1), items]


def _brute_exact(scores, pos, exc, ties):
    """Exact rank of every valid positive among its row's irrelevant candidates and itself, by counting
    (pessimistic: ties above; optimistic: below; average: their mean); (lo, hi) bounds for ``random``."""
    b, p = pos.shape
    lo = torch.zeros(b, p, dtype=torch.float64)
    hi = torch.zeros(b, p, dtype=torch.float64)
    for r in range(b):  # an oracle: plain loops
        forbidden = set(pos[r][pos[r] >= 0].tolist()) | set(exc[r][exc[r] >= 0].tolist())
        cand = torch.tensor([i for i in range(scores.shape[1]) if i not in forbidden])
        for k in range(p):
            if pos[r, k] < 0:
                continue
            s = scores[r, pos[r, k]]
            lo[r, k] = 1 + int((scores[r, cand] > s).sum())
            hi[r, k] = 1 + int((scores[r, cand] >= s).sum())
    return lo, hi


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average", "random"])
@pytest.mark.parametrize("coarse", [False, True])
@pytest.mark.parametrize("top", [1, 3])
def test_scorer_loop_equals_matrix_path_with_completion(ties, coarse, top):
    """The scorer loop's ranks, sizes, completions and cost against the score-matrix path; ``top``: the design's
    continuation rule (``adaptive_top``: drawing more while r~ <= top, completing those within it at the cap)."""
    scores, pos, exc = _problem(3, coarse=coarse)
    n = scores.shape[1]
    design = SamplingDesign(8, adaptive_max=64, adaptive_top=top, exact_at_cap=True)
    mat = adaptive_sampled_ranks(scores, pos, design, exclude=exc, generator=torch.Generator().manual_seed(5), ties=ties)
    max_pairs = 100  # below n: candidate lists split into column blocks
    scorer = CountingScorer(scores)
    loop = sampled_ranks_from_scorer(scorer, pos, n, design, exclude=exc, generator=torch.Generator().manual_seed(5),
                                     max_pairs=max_pairs, ties=ties)
    done = mat.exact_ranks > 0
    assert int(done.sum()) >= 5  # the problem completes several positives
    assert torch.equal(loop.ranks, mat.ranks)
    assert torch.equal(loop.exact_ranks, mat.exact_ranks)
    assert torch.equal(loop.n_samples, mat.n_samples)
    assert torch.equal(loop.n_candidates, mat.n_candidates)
    # completed: exactly the positives still within the top at the cap
    assert torch.equal(done, (mat.ranks > 0) & (mat.ranks <= top) & (mat.n_samples == design.cap))
    if top > 1:
        assert bool((done & (mat.ranks > 1)).any())
    # the cost: every scored pair counted, no call above max_pairs
    assert loop.cost.pairs == sum(a * b for a, b in scorer.shapes)
    assert loop.cost.calls == len(scorer.shapes)
    assert max(a * b for a, b in scorer.shapes) <= max_pairs
    # the completion's pairs: at least each completed row's irrelevant candidates, once per row
    plain = sampled_ranks_from_scorer(CountingScorer(scores), pos, n, SamplingDesign(8, adaptive_max=64,
                                                                                    adaptive_top=top), exclude=exc,
                                      generator=torch.Generator().manual_seed(5), max_pairs=max_pairs, ties=ties)
    rows = done.any(1)
    irrelevant = (mat.n_candidates - 1)[rows]
    extra = loop.cost.pairs - plain.cost.pairs
    assert int(irrelevant.sum()) <= extra <= int(rows.sum()) * int(irrelevant.max())
    assert loop.cost.stages == plain.cost.stages + 1


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average", "random"])
def test_exact_ranks_equal_brute_force_ranks_from_the_row(ties):
    scores, pos, exc = _problem(11, coarse=True)
    design = SamplingDesign(8, adaptive_max=32, exact_at_cap=True)
    got = adaptive_sampled_ranks(scores, pos, design, exclude=exc, generator=torch.Generator().manual_seed(2), ties=ties)
    done = got.exact_ranks > 0
    assert int(done.sum()) >= 5
    lo, hi = _brute_exact(scores, pos, exc, ties)
    e = got.exact_ranks.to(torch.float64)
    want = {"pessimistic": hi, "optimistic": lo, "average": (lo + hi) / 2}.get(ties)
    if want is not None:
        assert torch.equal(e[done], want[done])
    else:  # a random order of the tie group: within its bounds, a whole rank
        assert bool(((e[done] >= lo[done]) & (e[done] <= hi[done])).all())
        assert bool((e[done] == e[done].round()).all())
    assert bool((got.exact_ranks[~done] == 0).all())
    assert got.exact_ranks.dtype == (torch.float64 if ties == "average" else torch.int64)


def test_without_the_option_nothing_changes_and_completion_draws_nothing():
    scores, pos, exc = _problem(7)
    g1, g2 = torch.Generator().manual_seed(9), torch.Generator().manual_seed(9)
    plain = adaptive_sampled_ranks(scores, pos, SamplingDesign(8, adaptive_max=64), exclude=exc, generator=g1,
                                   ties="random")
    full = adaptive_sampled_ranks(scores, pos, SamplingDesign(8, adaptive_max=64, exact_at_cap=True), exclude=exc,
                                  generator=g2, ties="random")
    assert plain.exact_ranks is None
    assert torch.equal(plain.ranks, full.ranks) and torch.equal(plain.n_samples, full.n_samples)
    assert torch.equal(torch.rand(4, generator=g1), torch.rand(4, generator=g2))  # the generators agree after
    # the uncorrected sampled metric reads r~ either way
    for metric in ("hit@10", "ndcg@10"):
        assert rsp.estimate(metric, plain, method="none").value == rsp.estimate(metric, full, method="none").value
    # simulated from exact ranks: the same draws, the given exact ranks where completed
    r = torch.tensor([1, 1, 2, 3, 50, 400, 1, 7] * 10)
    a = adaptive_sampled_ranks_from_exact(r, 1000, SamplingDesign(4, adaptive_max=32),
                                          generator=torch.Generator().manual_seed(1))
    b = adaptive_sampled_ranks_from_exact(r, 1000, SamplingDesign(4, adaptive_max=32, exact_at_cap=True),
                                          generator=torch.Generator().manual_seed(1))
    assert torch.equal(a.ranks, b.ranks)
    done = (b.ranks == 1) & (b.n_samples == 32)
    assert bool(done.any()) and torch.equal(b.exact_ranks, torch.where(done, r, torch.zeros_like(r)))


def test_estimate_with_completion_raises_no_cap_flag():
    scores, pos, exc = _problem(3)
    design = SamplingDesign(8, adaptive_max=64)
    plain = adaptive_sampled_ranks(scores, pos, design, exclude=exc, generator=torch.Generator().manual_seed(5))
    full = adaptive_sampled_ranks(scores, pos, SamplingDesign(8, adaptive_max=64, exact_at_cap=True), exclude=exc,
                                  generator=torch.Generator().manual_seed(5))
    for method in ("mle", "mes", "gmod"):
        before = rsp.estimate("ndcg@10", plain, rsp.registry.method_class(method)(n_bootstrap=0))
        after = rsp.estimate("ndcg@10", full, rsp.registry.method_class(method)(n_bootstrap=0))
        assert "cap_reached" in before.flags and "top_unresolved" in before.flags
        assert "cap_reached" not in after.flags and "top_unresolved" not in after.flags
        assert after.details["adaptive"]["share_first_at_cap"] == 0.0
        assert after.details["adaptive"]["share_completed"] == pytest.approx(
            float((full.exact_ranks > 0).sum()) / float((full.ranks > 0).sum()))
    # hit@1 too: an exact group's top is resolved to single ranks
    assert "top_unresolved" not in rsp.estimate("hit@1", full, rsp.registry.Mle(n_bootstrap=0)).flags


def _truth(metric, r, n):
    return float(metric_from_float_ranks(parse_metric(metric), r.double(), torch.full(r.shape, float(n))).mean())


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_completion_is_at_least_as_accurate_where_the_top_is_unresolved(seed):
    """n = 20000, m = 20 -> 160: the cap's bin holds ~125 exact ranks, so HR@10 / NDCG@10 sit inside it. Measured
    (6 seeds): errors 0.03-0.13 without completion, < 0.003 (gmod) and < 0.013 (mes, the entropy's pull) with."""
    n, m_pos = 20000, 1000
    u = torch.rand(m_pos, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    r = torch.clamp(torch.ceil(n * u**5), 1, n).long()
    for method, tol in (("mes", 0.015), ("gmod", 0.005)):
        for metric in ("hit@10", "ndcg@10"):
            errs = []
            for exact in (False, True):
                design = SamplingDesign(20, adaptive_max=160, exact_at_cap=exact)
                s = adaptive_sampled_ranks_from_exact(r, n, design, generator=torch.Generator().manual_seed(seed))
                est = rsp.estimate(metric, s, rsp.registry.method_class(method)(n_bootstrap=0))
                errs.append(abs(est.value - _truth(metric, r, n)))
            assert errs[1] <= errs[0], (method, metric, errs)
            assert errs[1] < tol, (method, metric, errs)


def test_every_positive_completed_gives_the_exact_value():
    """Exact ranks 1..5 among n = 100000 with m = 1 -> 2: every positive stays first at the cap (p < 5e-5), so
    every one is completed and the histogram is exact groups only. mle and gmod return the exact metric; mes
    up to its entropy term (measured: < 2e-3)."""
    r = torch.ceil(5 * torch.rand(300, generator=torch.Generator().manual_seed(4), dtype=torch.float64)).long()
    s = adaptive_sampled_ranks_from_exact(r, 100000, SamplingDesign(1, adaptive_max=2, exact_at_cap=True),
                                          generator=torch.Generator().manual_seed(3))
    assert bool((s.exact_ranks == r).all())
    for metric in ("hit@1", "hit@3", "hit@10", "ndcg@10"):
        truth = _truth(metric, r, 100000)
        for method, tol in (("mle", 1e-12), ("gmod", 1e-9), ("mes", 2e-3)):
            est = rsp.estimate(metric, s, rsp.registry.method_class(method)(n_bootstrap=0))
            assert est.value == pytest.approx(truth, abs=tol), (metric, method)
            assert "cap_reached" not in est.flags and "top_unresolved" not in est.flags


def test_an_exact_groups_likelihood_is_the_identity():
    """On single-rank cells an exact group's P(r~ = i | cell) is 1 at the cell holding rank i, 0 elsewhere: the
    identity; on a wider cell 1 / width. The same ranks as a sampled group of m = n - 1 with replacement are not."""
    n = 40
    counts = np.zeros(n)
    ranks = np.array([1, 2, 3, 5, 8, 13, 21, 34])
    counts[ranks - 1] = np.arange(1, len(ranks) + 1)
    support = tuple(int(i) for i in ranks - 1)  # flat keys g (m_max + 1) + i with g = 0
    model = rd._likelihood((n,), (n - 1,), "binomial", 0.05, 0.25, (), support, (True,))
    edges = model.edges
    widths = np.diff(edges)
    cell = np.searchsorted(edges, ranks, side="left") - 1
    want = np.zeros((len(widths), len(ranks)))
    want[cell, np.arange(len(ranks))] = 1.0 / widths[cell]
    np.testing.assert_array_equal(model.lik, want)
    single = widths[cell] == 1
    assert single[:4].all()  # the top ranks: single-rank cells, the identity
    np.testing.assert_array_equal(model.lik[cell[single]][:, single], np.eye(int(single.sum())))
    sampled = rd._likelihood((n,), (n - 1,), "binomial", 0.05, 0.25, (), support, (False,))
    assert not np.allclose(sampled.lik, want)
    # the fit: mle of exact ranks only is their empirical distribution on single-rank cells
    hist = RankHistogram(np.array([n]), np.array([n - 1]), (counts,), np.array([True]))
    dist = rd.fit_rank_distribution(hist, registry.Mle(n_bootstrap=0))
    emp = counts / counts.sum()
    for rr in ranks[:4]:
        assert dist.pmf([rr])[0] == pytest.approx(emp[rr - 1], abs=1e-6)


def test_exact_groups_are_never_pooled_with_sampled_ones():
    r = torch.tensor([1, 2, 3, 1, 4, 2, 1, 1])
    n = torch.tensor([100, 100, 120, 120, 130, 140, 150, 151])
    m = torch.tensor([10, 10, 10, 20, 20, 10, 10, 10])
    e = torch.tensor([0, 0, 0, 0, 0, 0, 7, 9])
    hist = sampled_rank_histogram(r, n, m, exact_ranks=e)
    assert hist.exact.tolist() == [False] * 5 + [True, True]
    assert hist.n_samples[hist.exact].tolist() == [149, 150]
    for pooled in (rd.pool_groups(hist, 1)[0], rd.pool_groups(hist, 16, 0.5)[0], pool_by_n(hist, 0.5)):
        ex = pooled.exact_part()
        assert ex.total == 2 and pooled.sampled_part().total == 6
        assert (ex.n_samples == ex.n_items - 1).all() and (ex.n_items >= 150).all()
        # the exact counts stay at their ranks 7 and 9 (under a larger n)
        assert sorted(int(i) + 1 for c in ex.counts for i in np.flatnonzero(c)) == [7, 9]
    assert rd.pool_groups(hist, 1)[0].exact_part().n_groups == 1  # two exact groups -> one bin of the largest n
    merged = hist.merge(hist)
    assert merged.exact.sum() == 2 and merged.total == 16


def test_option_is_validated_and_refused_where_state_cannot_hold_exact_ranks():
    with pytest.raises(ValueError, match=r"^exact_at_cap: .*adaptive_max"):
        SamplingDesign(10, exact_at_cap=True)
    with pytest.raises(ValueError, match=r"^exact_at_cap"):
        SamplingDesign(10, adaptive_max=40, exact_at_cap="yes")
    design = SamplingDesign(10, adaptive_max=40, exact_at_cap=True)
    assert design != SamplingDesign(10, adaptive_max=40) and "exact" in design.describe() and "exact_at_cap" in repr(design)
    hist = sampled_rank_histogram(torch.tensor([2, 1, 4]), 100, 10, exact_ranks=torch.tensor([0, 3, 0]))
    for method in ("bv", "none", "rank_estimate"):  # an exact R is no sampled rank among n - 1 draws
        with pytest.raises(ValueError, match=r"^sample: the histogram has exact groups"):
            rsp.estimate("ndcg@10", hist, method=method)
    assert np.isfinite(rsp.estimate("ndcg@10", hist, rsp.registry.Mle(n_bootstrap=0)).value)
    from reco_sampled_plugin.rank_files import write_rank_file

    full = adaptive_sampled_ranks_from_exact(torch.tensor([1, 1, 5]), 1000, design,
                                             generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^sampled: exact_at_cap .*rank file"):
        write_rank_file("unused.csv", full)
    from reco_sampled_plugin.adapters.lightning import RankingSettings  # the streaming states hold it (their tests)

    assert RankingSettings(n_samples=design, estimators=["mes"]).design == design


@pytest.mark.parametrize("method", ["mes", "gmod", "auto"])
def test_evaluate_factors_completes_from_its_exact_pass_as_the_core_completes_from_the_row(method):
    """evaluate_factors with an exact_at_cap design: the draws of the score-matrix path (same scores, exclusions,
    generator), the completed test items' exact ranks equal to those the core ranks from the rows
    (``complete_at_cap``; here read from the exact pass), and the estimates the core's on those draws, whose
    exact groups they read (they differ from the same draws without the completion)."""
    scores, pos, exc = _problem(2)
    b, n = scores.shape
    pos = torch.sort(torch.where(pos < 0, n, pos), 1).values  # slots in item order, as the CSR rows hold them
    pos = torch.where(pos == n, -1, pos)
    rows = torch.arange(b).unsqueeze(1)
    x_test = sp.csr_matrix((np.ones(int((pos >= 0).sum())), (rows.expand_as(pos)[pos >= 0], pos[pos >= 0])), (b, n))
    x_train = sp.csr_matrix((np.ones(int((exc >= 0).sum())), (rows.expand_as(exc)[exc >= 0], exc[exc >= 0])), (b, n))
    design = SamplingDesign(8, adaptive_max=64, exact_at_cap=True)
    res = rsp.evaluate_factors(x_train, x_test, scores, torch.eye(n, dtype=torch.float64), metrics=["ndcg@10"],
                               n_samples=design, method=method, seed=4, as_df=False)  # scores = scores @ I
    core = adaptive_sampled_ranks(scores, pos, design, exclude=exc, generator=torch.Generator().manual_seed(4))
    s, valid = res.sampled, pos >= 0
    assert torch.equal(s.users, rows.expand_as(pos)[valid]) and torch.equal(s.items, pos[valid])
    assert torch.equal(s.sampled_ranks, core.ranks[valid]) and torch.equal(s.sample_sizes, core.n_samples[valid])
    done = s.completed_ranks > 0
    assert int(done.sum()) >= 3 and torch.equal(s.completed_ranks, core.exact_ranks[valid])
    assert torch.equal(done, (s.sampled_ranks == 1) & (s.sample_sizes == 64))
    assert torch.equal(s.completed_ranks[done], s.exact_ranks[done])
    est = res.estimates["NDCG@10"]
    want = rsp.estimate("ndcg@10", core, method)
    assert est.value == pytest.approx(want.value, rel=1e-12) and est.stderr == pytest.approx(want.stderr, rel=1e-12)
    hist = SampledRanks.from_arrays(s.sampled_ranks, s.n_candidates, s.sample_sizes, design,
                                    exact_ranks=s.completed_ranks).histogram()
    assert hist.exact.sum() >= 1 and (hist.n_samples[hist.exact] == hist.n_items[hist.exact] - 1).all()
    bare = rsp.estimate("ndcg@10", SampledRanks.from_arrays(s.sampled_ranks, s.n_candidates, s.sample_sizes,
                                                            SamplingDesign(8, adaptive_max=64)), method)
    assert bare.value != est.value and "cap_reached" not in est.flags
    assert res.summary["NDCG@10"]["share_at_cap"] == pytest.approx(float((s.sample_sizes == 64).double().mean()))


def test_planner_counts_the_completion_pairs_the_loop_measures():
    """Scores -item (item i has exact rank i + 1; no exclusions, one positive per row): the loop's pairs are
    1 + final m + (n - 1) per completed positive exactly; the plan, fitted on a pilot of the same users (fixed
    m = 1000), forecasts them within its and the loop's Monte Carlo error (measured: 1068 +- 30 against 1142)."""
    from reco_sampled_plugin import planner

    n, users = 5000, 600
    u = torch.rand(users, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    r = torch.clamp(torch.ceil(n * u**4), 1, n).long()

    def scorer(user_ids, items):
        return -items.double()

    design = SamplingDesign(50, adaptive_max=400, exact_at_cap=True)
    loop = sampled_ranks_from_scorer(scorer, r - 1, n, design, generator=torch.Generator().manual_seed(1))
    exact_r, sizes = loop.exact_ranks[:, 0], loop.n_samples[:, 0]  # (B, 1): one positive per row
    done = (exact_r > 0).double()
    assert torch.equal(exact_r[exact_r > 0], r[exact_r > 0])
    per_user = 1.0 + sizes.double() + done * (n - 1)
    assert loop.cost.pairs == int(per_user.sum())
    pilot = sampled_ranks_from_scorer(scorer, r - 1, n, 1000, generator=torch.Generator().manual_seed(2))
    plan = planner.plan(n, users, "ndcg@10", 0.2, pilot=pilot, designs=[design, SamplingDesign(50, adaptive_max=400)],
                        repeats=8, execution=planner.PlanExecution(forecast_all=True, progress=False))
    exact, plain = plan.forecasts
    assert exact.exact_at_cap and exact.design == design and "exact" in exact.label
    assert exact.pairs == pytest.approx(1.0 + exact.mean_samples + exact.completion_pairs)
    assert plain.completion_pairs == 0.0 and exact.completion_pairs > 0
    se = float(np.hypot(exact.pairs_se, float(per_user.std()) / users**0.5))
    assert abs(exact.pairs - float(per_user.mean())) < 3 * se
    assert exact.rel_error < plain.rel_error  # the top is resolved


def test_fit_of_exact_groups_does_not_flag_the_top_for_k_1():
    """RankDistribution.metric reads an exact group's resolution as 1 (its counts are exact ranks): HR@1 of a
    histogram whose only positives at the top are completed ones is not flagged top_unresolved."""
    from reco_sampled_plugin import rank_distribution as rd
    from reco_sampled_plugin._rank_hist import sampled_rank_histogram

    n = 500
    exact = torch.tensor([1, 1, 2, 3, 5, 8, 40, 120, 300, 499])
    ranks = torch.tensor([1, 1, 1, 1, 1, 1, 2, 3, 5, 9])
    sizes = torch.tensor([64, 64, 64, 64, 64, 64, 16, 8, 8, 8])
    done = torch.where(ranks == 1, exact, torch.zeros_like(exact))
    hist = sampled_rank_histogram(ranks, n, sizes, exact_ranks=done)
    dist = rd.fit_rank_distribution(hist, registry.Mle(n_bootstrap=0))
    est = dist.metric("hit@1")
    assert "top_unresolved" not in est.flags


@pytest.mark.parametrize("m,cap", [(4, 16), (3, 10)])  # the last stage 16; 6 (3 * 2 <= 10 < 3 * 4)
def test_methods_of_sampled_ranks_read_the_completed_positives_at_the_cap(m, cap):
    """A histogram with exact groups under an exact_at_cap design (the state of the Ray adapter, merged blocks):
    a method that reads sampled ranks alone (``none``, the one that takes adaptive designs) takes each completed positive at r~ = 1 among the last
    stage's draws, which is where the draws left it: the histogram equals ``histogram(exact=False)`` of the
    SampledRanks, and the estimates equal theirs."""
    design = SamplingDesign(m, adaptive_max=cap, exact_at_cap=True)
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(300, 200, generator=g)
    pos = torch.stack([torch.randperm(200, generator=g)[:2] for _ in range(300)])
    sampled = adaptive_sampled_ranks(scores, pos, design, generator=g)
    hist = sampled.histogram(exact=True).with_design(design)
    assert hist.has_exact and hist.exact_part().total > 10
    view = hist.completed_as_sampled()
    want = sampled.histogram(exact=False)
    assert not view.has_exact and view.same_groups(want) and np.array_equal(view.flat_counts, want.flat_counts)
    assert int(view.n_samples.max()) == int(design.adaptive.stages[-1])
    for metric in ("ndcg@10", "auc"):
        a, b = rsp.estimate(metric, hist, "none"), rsp.estimate(metric, sampled, "none")
        assert (a.value, a.stderr) == (b.value, b.stderr)
