"""``pl_fit``'s prior of the value: the g-modelling (log-spline) prior refitted at the fitted tilt
(``rank_prior="spline"``, the default) against the EM prior the tilt is chosen with (``rank_prior="em"``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import metric_values, popularity
from reco_sampled_plugin._popularity_fit import PRIORS, _rows_posterior
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.metric_names import parse_metric

from test_popularity_topk import _model_catalogue


def _uniform_world(seed: int, n: int = 2000, users: int = 1500, m: int = 300):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(users, n, generator=g, dtype=torch.float64)
    pos = torch.randint(0, n, (users, 1), generator=g)
    scores[torch.arange(users), pos[:, 0]] += 2.8
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(m, popularity=torch.ones(n)), generator=g)
    exact = rsp.exact_ranks(scores, pos, count_other_positives=False).view(-1)
    return s, exact, n, m


@pytest.mark.parametrize("seed", [0, 1])
def test_uniform_weights_spline_prior_agrees_with_gmod(seed):
    """Under uniform weights the spline prior is g-modelling on the uniform binomial likelihood: the value agrees
    with ``gmod``'s (its own likelihood code, histogram groups and cell grid; the same basis and penalty) within two
    standard errors of the sampling noise, and both lie within 4 standard errors of the exact value."""
    s, exact, n, m = _uniform_world(seed)
    for metric in ("hit@10", "ndcg@10"):
        truth = float(metric_values(metric, exact, torch.full_like(exact, n)).double().mean())
        a = rsp.estimate(metric, s, method="pl_fit")
        b = rsp.estimate(metric, rsp.SampledRanks.from_arrays(s.ranks.view(-1), n, m), rsp.registry.Gmod(n_bootstrap=0))
        assert a.details["rank_prior"] == "spline"
        assert abs(a.value - b.value) < 2 * a.stderr, (metric, a.value, b.value, a.stderr)
        assert abs(a.value - truth) < 4 * a.stderr and abs(b.value - truth) < 4 * a.stderr, (metric, truth)


def test_em_prior_is_the_posterior_mean_under_the_fits_em_prior():
    """``rank_prior="em"``: the mean over positives of the posterior mean of the metric under the EM prior of the
    chosen (beta_top, beta_deep), recomputed here from the fit's tables; the default differs from it (another
    prior), and the interval holds both values."""
    scores, pos, w, _ = _model_catalogue(2, beta=1.5)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(50, popularity=w), generator=torch.Generator().manual_seed(5))
    f = popularity.pl_fit(s)
    for metric in ("hit@10", "ndcg@10", "mrr"):
        spec = parse_metric(metric)
        _, prior, idx = f.curves[f.best]
        post = _rows_posterior(f._assemble(idx), prior[None, :])
        direct = float(f.units.w @ (post * f.cell_metric(spec)).sum(1)) / float(f.units.w.sum())
        em = rsp.estimate(metric, s, rsp.registry.PlFit(rank_prior="em"))
        spline = rsp.estimate(metric, s, method="pl_fit")
        assert em.value == pytest.approx(direct, rel=1e-12) and em.details["rank_prior"] == "em"
        assert spline.value != pytest.approx(em.value, rel=1e-6)
        lo, hi = spline.interval(0.95)
        assert lo <= min(em.value, spline.value) and max(em.value, spline.value) <= hi
        (lo_s, hi_s), (lo_e, hi_e) = spline.details["identified"], em.details["identified"]
        assert lo_s <= min(lo_e, spline.value) and max(hi_e, spline.value) <= hi_s  # the EM hull and the spline values


def test_spline_prior_is_a_smooth_density_on_the_cells():
    """The prior is a distribution over the fit's cells, positive everywhere, cached per (beta_top, beta_deep);
    per rank (mass / cell width) it is smooth in log r: no per-rank spikes (its second differences in log density
    over the single-rank cells are at most half the EM prior's)."""
    for seed in (4, 6):
        scores, pos, w, _ = _model_catalogue(seed, beta=1.0)
        s = rsp.sampled_ranks(scores, pos, SamplingDesign(50, popularity=w),
                              generator=torch.Generator().manual_seed(9))
        _check_smooth(popularity.pl_fit(s))


def _check_smooth(f) -> None:
    p = f.spline_prior(f.best)
    assert p is f.spline_prior(f.best)
    assert p.shape == (len(f.edges) - 1,) and np.all(p > 0) and p.sum() == pytest.approx(1.0, abs=1e-12)
    width = np.diff(f.edges).astype(np.float64)
    single = np.flatnonzero(width == 1)[:30]
    rough = lambda q: float(np.abs(np.diff(np.log(q[single] / width[single]), 2)).mean())  # noqa: E731
    assert rough(p) < 0.5 * rough(f.curves[f.best][1]), (rough(p), rough(f.curves[f.best][1]))


def test_rank_prior_checked():
    scores, pos, w, _ = _model_catalogue(1)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(30, popularity=w), generator=torch.Generator().manual_seed(1))
    with pytest.raises(ValueError, match="^rank_prior"):
        rsp.estimate("hit@10", s, rsp.registry.PlFit(rank_prior="npmle"))
    f = popularity.pl_fit(s)
    with pytest.raises(ValueError, match="^prior"):
        f.estimate(parse_metric("hit@10"), prior="npmle")
    assert PRIORS == ("spline", "em")


def test_spline_prior_maximises_the_truncated_penalised_likelihood():
    """The prior's coefficients are a maximum of sum_i w_i log(sum_c P_c L_ic / sum_{c <= n_i} P_c) - |D2 a|^2,
    recomputed here from the fit's tables (each positive's prior truncated at its own n: per-user candidate counts);
    no small step in 20 random directions increases it."""
    from reco_sampled_plugin.rank_distribution import G_DF, G_PENALTY, _g_basis

    scores, pos, w, _ = _model_catalogue(3, users=300, beta=1.5)
    g = torch.Generator().manual_seed(2)
    keep = torch.randint(0, 40, (300, 1), generator=g)  # training items: 0..39 per user, so n from 261 to 300
    exclude = torch.argsort(torch.rand(300, 300, generator=g), dim=1)[:, :40]  # distinct items per row
    exclude = torch.where((exclude == pos) | (torch.arange(40)[None, :] >= keep), -1, exclude)
    s = rsp.sampled_ranks(scores, pos, SamplingDesign(60, popularity=w), exclude=exclude, generator=g)
    f = popularity.pl_fit(s)
    assert len(np.unique(f.units.n)) > 5
    f.spline_prior(f.best)
    alpha = f._spline[f.best][1]
    logl = f._assemble(f.curves[f.best][2])
    basis = _g_basis(f.edges, G_DF)
    logw = np.log(np.diff(f.edges).astype(np.float64))
    d2 = np.diff(np.eye(G_DF), 2, axis=0)

    def objective(a):
        z = logw + basis @ a
        p = np.exp(z - z.max())
        p /= p.sum()
        with np.errstate(divide="ignore"):
            mix = np.log(np.exp(logl) @ p)
        inside = np.log(f.allowed.astype(np.float64) @ p)
        return float(f.units.w @ (mix - inside)) - G_PENALTY * float(np.sum((d2 @ a) ** 2))

    best = objective(alpha)
    rng = np.random.default_rng(0)
    for _ in range(20):
        d = rng.standard_normal(G_DF)
        d /= np.linalg.norm(d)
        for step in (1e-2, -1e-2):
            assert objective(alpha + step * d) <= best + 1e-9 * abs(best)
    assert f.spline_unconverged == 0
