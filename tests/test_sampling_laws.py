"""Sampling laws and expected sampled metrics against scipy.stats and the paper's Table 2."""

import numpy as np
import pytest
import scipy.stats as st
import torch

from reco_sampled_plugin import metric_values
from reco_sampled_plugin.sampling_laws import expected_sampled, sampled_rank_pmf

TABLE1 = {
    "A": [100, 100, 100, 100, 100],
    "B": [40, 40, 8437, 9266, 4482],
    "C": [212, 2, 743, 5342, 1548],
}
# Krichene & Rendle's Table 2 computed analytically: E[M(r~)] (binomial, n = 10,000, m = 99) for AUC, AP, NDCG,
# Recall@10
TABLE2_ANALYTIC = {
    "A": [0.990, 0.637, 0.729, 1.000],
    "B": [0.555, 0.341, 0.447, 0.400],
    "C": [0.843, 0.326, 0.460, 0.569],
}
# Krichene & Rendle Table 2 as printed (one Monte Carlo run of 1000 repeats)
TABLE2_PRINTED = {
    "A": [0.990, 0.630, 0.724, 1.000],
    "B": [0.555, 0.336, 0.444, 0.400],
    "C": [0.843, 0.325, 0.460, 0.567],
}
METRICS = ["auc", "ap", "ndcg", "recall@10"]


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
def test_pmf_matches_scipy(law):
    n, m = 10_000, 99
    ranks = [1, 2, 50, 5000, 9999, 10_000]
    got = sampled_rank_pmf(torch.tensor(ranks), n, m, law).numpy()
    j = np.arange(m + 1)
    for row, r in zip(got, ranks):
        if law == "binomial":
            want = st.binom(m, (r - 1) / (n - 1)).pmf(j)
        else:
            want = st.hypergeom(n - 1, r - 1, m).pmf(j)
        np.testing.assert_allclose(row, want, rtol=1e-10, atol=1e-15)


@pytest.mark.parametrize("name", list(TABLE1))
def test_table2_analytic_and_printed(name):
    r = torch.tensor(TABLE1[name])
    got = [float(expected_sampled(mt, r, 10_000, 99).mean()) for mt in METRICS]
    np.testing.assert_allclose(got, TABLE2_ANALYTIC[name], atol=5e-4)
    np.testing.assert_allclose(got, TABLE2_PRINTED[name], atol=0.01)
    hyper = [float(expected_sampled(mt, r, 10_000, 99, "hypergeometric").mean()) for mt in METRICS]
    np.testing.assert_allclose(hyper, got, atol=1e-3)


@pytest.mark.parametrize("law", ["binomial", "hypergeometric"])
@pytest.mark.parametrize("m", [1, 10, 99, 1000])
def test_sampled_auc_is_unbiased(law, m):
    n = 5000
    r = torch.arange(1, n + 1)
    np.testing.assert_allclose(
        expected_sampled("auc", r, n, m, law).numpy(), metric_values("auc", r, n).numpy(), atol=1e-12
    )


def test_extreme_sizes_stay_finite():
    for law in ("binomial", "hypergeometric"):
        r = torch.tensor([1, 2, 3, 10**4, 10**7, 10**8 - 1, 10**8])
        p = sampled_rank_pmf(r, 10**8, 10**4, law)
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p.sum(-1), torch.ones(len(r), dtype=torch.float64), rtol=0, atol=1e-12)
        e = expected_sampled("ndcg", r, 10**8, 10**4, law)
        assert torch.isfinite(e).all() and (e > 0).all()


def test_recall_expectation_is_binomial_cdf():
    # eq. 18: E[Recall@k(r~)] = CDF(k - 1; m, (r-1)/(n-1))
    n, m, k = 20_000, 100, 10
    r = torch.tensor([1, 10, 100, 500, 1000, 20_000])
    want = st.binom(m, (r.numpy() - 1) / (n - 1)).cdf(k - 1)
    np.testing.assert_allclose(expected_sampled(f"recall@{k}", r, n, m).numpy(), want, rtol=1e-10)


def test_bad_input_names_argument():
    with pytest.raises(ValueError, match="sampling"):
        expected_sampled("auc", torch.tensor([1]), 100, 10, "poisson")
    with pytest.raises(ValueError, match="n_samples"):
        expected_sampled("auc", torch.tensor([1]), 100, 100, "hypergeometric")
    with pytest.raises(ValueError, match="ranks"):
        expected_sampled("auc", torch.tensor([101]), 100, 10)
    with pytest.raises(ValueError, match="k = 20"):
        expected_sampled("recall@20", torch.tensor([1]), 100, 10)


def test_check_law_takes_the_design_names_only():
    """One spelling per law, that of ``SamplingDesign.law``; anything else is a ValueError naming ``sampling``."""
    from reco_sampled_plugin.design import SamplingDesign
    from reco_sampled_plugin.sampling_laws import check_law

    assert check_law(SamplingDesign(5).law) == "binomial"
    assert check_law(SamplingDesign(5, replacement=False).law) == "hypergeometric"
    for bad in ("with_replacement", "replacement", "without_replacement", "Binomial", "HYPERGEOMETRIC", "popularity",
                1, None):
        with pytest.raises(ValueError, match="^sampling: unknown law"):
            check_law(bad)
    with pytest.raises(ValueError, match="^sampling: unknown law"):
        expected_sampled("ndcg@5", torch.tensor([3]), 100, 9, "without_replacement")
