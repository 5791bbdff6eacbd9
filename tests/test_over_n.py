"""Tables for many candidate counts (``_over_n.tables_over_n`` through ``corrections.tables_by_n``): every row
against the exact per-n table, on the ranges users meet (one data set's n, a wide catalogue range, without
replacement), for smooth and non-smooth methods; the bounded cost; the estimators' values with many n."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

from reco_sampled_plugin import _over_n, SampledRanks
from reco_sampled_plugin.corrections import clear_correction_cache, correction_from_options, table_array, tables_by_n
from reco_sampled_plugin.estimators import estimate


def _corr(method, gamma=0.1, law="binomial", rounding="floor"):
    """The correction of ``method`` with its options (those it does not read are dropped) under ``law``."""
    return correction_from_options(method, law, {"gamma": gamma, "rounding": rounding})


def _exact(metric, ns, m, method, gamma, law, rounding="floor"):
    return np.stack([table_array(metric, int(n), m, _corr(method, gamma, law, rounding)) for n in ns])


@pytest.mark.parametrize("method,gamma", [("bv", 0.1), ("bv", 1.0), ("cls", 0.0), ("rank_estimate", 0.0), ("none", 0.0)])
@pytest.mark.parametrize("metric", ["hit@10", "ndcg@10", "ap"])
@pytest.mark.parametrize("lo,hi,law", [(946, 1663, "binomial"), (2000, 60000, "binomial"), (300, 900, "hypergeometric")])
def test_rows_match_exact_tables(method, gamma, metric, lo, hi, law):
    ns = np.unique(np.rint(np.exp(np.linspace(np.log(lo), np.log(hi), 90))).astype(np.int64))
    clear_correction_cache()
    got = tables_by_n(metric, ns, 40, _corr(method, gamma, law))
    want = _exact(metric, ns, 40, method, gamma, law)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-9 * max(1.0, np.abs(want).max()))


def test_rank_estimate_linear_rounding_rows_are_exact():
    ns = np.arange(500, 700, 3)
    got = tables_by_n("ndcg@10", ns, 60, _corr("rank_estimate", rounding="linear"))
    np.testing.assert_array_equal(got, _exact("ndcg@10", ns, 60, "rank_estimate", 0.1, "binomial", "linear"))


def test_smooth_tables_cost_a_bounded_number_of_solves():
    """1,000 distinct n, bv HR@10: 9 nodes + 4 checks suffice on a narrow range, at most 2^2 pieces x 21 on a wide one."""
    built = []

    def build(n):
        built.append(n)
        return table_array("hit@10", n, 50, _corr("bv"))

    _, info = _over_n.tables_over_n(build, np.arange(1500, 2500))
    assert info["built"] == len(built) == 13 and info["interpolated"] == 1000 - 13
    built.clear()
    _, info = _over_n.tables_over_n(build, np.unique(np.geomspace(1000, 100000, 1000).astype(np.int64)))
    assert info["built"] <= 4 * (_over_n.NODES + _over_n.CHECKS)


def test_kinked_tables_fall_back_to_exact():
    """A family with a kink (an active set that changes with n, as cls's can): verification fails, halving gains
    little, and every row is the exact table; nothing interpolated across the kink."""
    ns = np.arange(100, 400)
    build = lambda n: np.array([max(0.0, n - 237.0) / 1000.0, 1.0 / n])  # noqa: E731
    tabs, info = _over_n.tables_over_n(build, ns)
    np.testing.assert_allclose(tabs, np.stack([build(int(n)) for n in ns]), rtol=0, atol=1e-12)
    assert 0 < info["built"] < 2 * len(ns)


def test_a_non_finite_or_wrong_interpolant_is_never_returned():
    """A table family with a jump inside the range (not smooth at all): the rows are the exact ones."""
    ns = np.arange(100, 400)
    build = lambda n: np.array([float(n > 263), 1.0 / n])  # noqa: E731
    tabs, _ = _over_n.tables_over_n(build, ns)
    assert np.all(np.isfinite(tabs))
    np.testing.assert_allclose(tabs, np.stack([build(int(n)) for n in ns]), rtol=0, atol=1e-12)


@settings(max_examples=examples(15), deadline=None)
@given(lo=st.integers(50, 5000), ratio=st.floats(1.05, 30.0), count=st.integers(1, 300), seed=st.integers(0, 10))
def test_fuzz_bv_rows_within_tolerance(lo, ratio, count, seed):
    rng = np.random.default_rng(seed)
    hi = max(lo + 1, int(lo * ratio))
    ns = np.unique(rng.integers(lo, hi + 1, count))
    got = tables_by_n("ndcg@5", ns, 20, _corr("bv"))
    np.testing.assert_allclose(got, _exact("ndcg@5", ns, 20, "bv", 0.1, "binomial"), rtol=0, atol=1e-9)


@pytest.mark.parametrize("method", ["bv", "cls", "rank_estimate", "linear", "bound", "none"])
def test_estimates_with_many_n_match_the_per_n_sum(method):
    """estimate() over 400 distinct n equals the count-weighted mean of each positive's exact per-n table value."""
    from reco_sampled_plugin.mapping import mapping_table

    gen = torch.Generator().manual_seed(3)
    n = torch.randint(800, 1200, (3000,), generator=gen)
    r = torch.randint(1, 42, (3000,), generator=gen)
    est = estimate("ndcg@10", SampledRanks.from_arrays(r, n, 40), method)
    if method in ("linear", "bound"):
        per = [mapping_table("ndcg@10", int(ni), 40, method)[int(ri) - 1] for ni, ri in zip(n, r)]
    else:
        per = [table_array("ndcg@10", int(ni), 40, _corr(method))[int(ri) - 1] for ni, ri in zip(n, r)]
    assert est.value == pytest.approx(float(np.mean(per)), rel=0, abs=1e-9)
