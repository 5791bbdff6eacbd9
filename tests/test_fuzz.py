"""Fuzzing the public API: bad and edge inputs of every class keep the promise.

The contract, for every generated input: either a ``ValueError`` whose message names one of the call's arguments, or
a result that is right in kind: empty for empty input, finite, inside the metric's range, with an honest flag or an
infinite standard error where the data cannot say more. Never another exception type, a silent NaN or a hang.

Classes of input: shapes (empty, mismatched), dtypes (bool, complex, half, float with fractions), non-finite and
huge values, non-integers where integers are due, out-of-range values, option values, files. Profiles (registered
in conftest.py): ``fast`` (default, part of ``make test``, about a minute in all) and ``long``
(``pytest tests/test_fuzz.py --hypothesis-profile long``).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

import reco_sampled_plugin as rsp
from reco_sampled_plugin.corrections import correction_table
from reco_sampled_plugin.registry import Bv
from reco_sampled_plugin.sampling_laws import expected_sampled, sampled_rank_pmf

METRICS = ("hit@10", "recall@5", "ndcg@10", "ndcg", "mrr", "ap", "auc", "precision@3", "rr@5")

# ----------------------------------------------------------------------------------------------- strategies
# a size argument (n_items, n_samples, ...): mostly sensible, often broken
sizes = st.one_of(
    st.integers(min_value=-3, max_value=3),
    st.integers(min_value=2, max_value=3000),
    st.sampled_from([2**31, 2**62, 10**30]),
    st.floats(allow_nan=True, allow_infinity=True, width=64),
    st.sampled_from([10.5, 100.0, -1.0, True, False, 1j, "100", None]),
)


@st.composite
def rank_tensors(draw, n_max: int = 3000):
    """Rank inputs: every dtype the user might pass, every shape class, values in and out of 1..n."""
    shape = draw(st.sampled_from([(0,), (1,), (7,), (3, 4), (2, 0), ()]))
    kind = draw(st.sampled_from(["int64", "int32", "float64_whole", "float64_frac", "float64_nan", "bool", "complex",
                                 "half", "list"]))
    count = int(np.prod(shape)) if shape else 1
    values = draw(st.lists(st.integers(min_value=-2, max_value=n_max + 5), min_size=count, max_size=count))
    arr = np.asarray(values, dtype=np.int64).reshape(shape)
    if kind == "int64":
        return torch.from_numpy(arr)
    if kind == "int32":
        return torch.from_numpy(arr.astype(np.int32))
    if kind == "float64_whole":
        return torch.from_numpy(arr.astype(np.float64))
    if kind == "float64_frac":
        return torch.from_numpy(np.asarray(arr.astype(np.float64) + 0.5))
    if kind == "float64_nan":
        out = np.array(arr, dtype=np.float64)
        if out.size:
            out.reshape(-1)[0] = np.nan
        return torch.from_numpy(out)
    if kind == "bool":
        return torch.from_numpy(np.asarray(arr > 1))
    if kind == "complex":
        return torch.from_numpy(arr.astype(np.complex128))
    if kind == "half":
        return torch.from_numpy(arr.astype(np.float16))
    return arr.tolist()


def _contract(call, names, check=None):
    """Run ``call``; a ValueError must name one of ``names``; any other exception fails; ``check`` the result."""
    try:
        out = call()
    except ValueError as exc:
        msg = str(exc)
        assert any(name in msg for name in names), f"ValueError does not name an argument {names}: {msg}"
        event("refused")
        return None
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
        pytest.fail(f"{type(exc).__name__} instead of a ValueError naming one of {names}: {exc}")
    event("accepted")
    if check is not None:
        check(out)
    return out


def _finite_in_unit(t) -> None:
    t = torch.as_tensor(t)
    assert t.is_floating_point(), t.dtype
    assert bool(torch.isfinite(t).all()), f"non-finite result {t}"
    assert bool(((t >= -1e-12) & (t <= 1 + 1e-12)).all()), f"outside [0, 1]: {t}"


FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ------------------------------------------------------------------------------------------- metric values
@FAST
@given(metric=st.sampled_from(METRICS), ranks=rank_tensors(), n=sizes)
def test_metric_values(metric, ranks, n):
    out = _contract(lambda: rsp.metric_values(metric, ranks, n), ("ranks", "n_items", "metric"), _finite_in_unit)
    if out is not None:
        assert out.shape == torch.as_tensor(ranks).shape


@FAST
@given(metric=st.sampled_from(METRICS), ranks=rank_tensors(), n=sizes, m=sizes,
       law=st.sampled_from(["binomial", "hypergeometric", "poisson"]))
def test_expected_sampled(metric, ranks, n, m, law):
    _contract(lambda: expected_sampled(metric, ranks, n, m, law), ("ranks", "n_items", "n_samples", "metric", "sampling"),
              _finite_in_unit)


@FAST
@given(ranks=rank_tensors(), n=sizes, m=sizes)
def test_sampled_rank_pmf(ranks, n, m):
    def check(p):
        assert bool(torch.isfinite(p).all()) and bool((p >= 0).all())
        if p.numel():
            np.testing.assert_allclose(p.sum(-1).numpy(), 1.0, atol=1e-9)

    _contract(lambda: sampled_rank_pmf(ranks, n, m), ("ranks", "n_items", "n_samples"), check)


# ------------------------------------------------------------------------------------------------ estimates
def _check_estimate(est) -> None:
    assert math.isfinite(est.value)
    assert est.stderr >= 0 and not math.isnan(est.stderr)
    lo, hi = est.interval(0.95)
    assert not (math.isnan(lo) or math.isnan(hi)) and lo <= hi


@FAST
@given(metric=st.sampled_from(METRICS), ranks=rank_tensors(n_max=60), n=sizes, m=sizes,
       method=st.sampled_from(["none", "bv", "cls", "bound", "beta", "linear", "mle", "mes", "rank_estimate"]),
       weights=st.one_of(st.none(), st.sampled_from([1e300, -1.0, float("nan"), 0.0, 2.0])))
def test_estimate(metric, ranks, n, m, method, weights):
    w = None if weights is None else torch.full(torch.as_tensor(ranks).shape, weights, dtype=torch.float64)
    opts = {"n_bootstrap": 0} if method in ("mle", "mes") else {}
    _contract(lambda: rsp.estimate(
        metric,
        rsp.SampledRanks.from_arrays(ranks, n, m),
        rsp.registry.method_class(method)(**opts),
        weights=w,
    ),
              ("ranks", "n_items", "n_samples", "metric", "weights", "method", "counts", "histogram"), _check_estimate)


@FAST
@given(option=st.sampled_from(["tol", "max_iter", "lam", "n_bootstrap", "foo", "seed"]),
       value=st.sampled_from([float("nan"), float("inf"), -1.0, 0, 1e300, "x", None]))
def test_estimate_options(option, value):
    ranks = torch.tensor([1, 2, 3, 5, 8, 13, 21, 1, 1, 2])
    _contract(lambda: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(ranks, 500, 30),
        rsp.registry.Mes(**{option: value}),
    ), (option,),
              _check_estimate)


@FAST
@given(metric=st.sampled_from(METRICS), n=sizes, m=sizes,
       method=st.sampled_from(["none", "bv", "cls", "ls", "rank_estimate"]),
       gamma=st.sampled_from([0.1, 0.0, 1.0, -0.5, 2.0, float("nan")]))
def test_correction_table(metric, n, m, method, gamma):
    def check(t):
        assert bool(torch.isfinite(torch.as_tensor(t)).all())

    _contract(lambda: correction_table(metric, n, m, Bv(gamma=gamma) if method == "bv" else method),
              ("n_items", "n_samples", "metric", "method", "gamma"), check)


# ------------------------------------------------------------------------------------------------- ranking
@FAST
@given(b=st.integers(0, 4), n=st.integers(0, 30), p=st.integers(0, 3), m=sizes,
       dtype=st.sampled_from([torch.float32, torch.float64, torch.float16, torch.int64, torch.bool]),
       poison=st.sampled_from([None, math.nan, math.inf]))
def test_sampled_and_exact_ranks(b, n, p, m, dtype, poison):
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(b, n, generator=g).to(dtype) if dtype != torch.bool else torch.rand(b, n, generator=g) > 0.5
    if poison is not None and scores.numel() and scores.is_floating_point():
        scores.view(-1)[0] = poison
    pos = torch.randint(0, max(n, 1), (b, p), generator=g) if n else torch.zeros(b, p, dtype=torch.int64)
    names = ("scores", "positives", "n_samples", "exclude")

    def check_ranks(r):
        r = r.ranks if hasattr(r, "ranks") else r
        assert r.shape[0] == b
        if r.numel():
            assert bool(torch.isfinite(r.double()).all()) and bool((r >= 0).all())

    _contract(lambda: rsp.exact_ranks(scores, pos), names, check_ranks)
    _contract(lambda: rsp.sampled_ranks(scores, pos, m, generator=g), names, check_ranks)


# ---------------------------------------------------------------------------------------- torchmetrics, CLI
@FAST
@given(m=sizes, cap=st.one_of(st.none(), sizes), est=st.sampled_from([("none",), ("bv",), ("mes",), ("magic",)]),
       opt=st.sampled_from([{}, {"gamma": float("nan")}, {"n_bootstrap": -1}, {"foo": 1}, {"tol": 0.0}]),
       poison=st.sampled_from([None, math.nan, math.inf]), keep_all=st.booleans())
def test_sampled_ranking_metrics(m, cap, est, opt, poison, keep_all):
    from reco_sampled_plugin import registry
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    def build():  # an estimator with options is its method object (options checked when it is built)
        methods = tuple(registry.method_class(e)(**opt) for e in est) if opt else est
        return SampledRankingMetrics(("ndcg@10", "auc"), n_samples=rsp.SamplingDesign(m, adaptive_max=cap),
                                     estimators=methods)

    metric = _contract(build, ("n_samples", "adaptive_max", "estimators", "method", "gamma", "n_bootstrap", "foo",
                               "tol"))
    if metric is None:
        return
    g = torch.Generator().manual_seed(1)
    scores = torch.randn(6, 200, generator=g)
    if poison is not None:
        scores[2, 7] = poison  # an irrelevant item: the default check_finite=True must see it
    pos = torch.tensor([[0], [1], [2], [3], [4], [5]])
    keep = torch.ones(6, dtype=torch.bool) if keep_all else torch.zeros(6, dtype=torch.bool)
    if _contract(lambda: metric.update(scores, pos, keep=keep), ("scores", "n_samples")) is None and poison is not None:
        return
    for key, e in metric.estimates().items():
        if keep_all:  # inside the range, or an unbounded estimator (bv, ls) outside it with the flag that says so
            assert math.isfinite(e.value), (key, e)
            assert 0.0 <= e.value <= 1.0 + 1e-12 or "outside_metric_range" in e.flags, (key, e)
            lo, hi = e.interval(0.95)
            assert 0.0 <= lo <= hi <= 1.0, (key, e)
        else:
            assert math.isnan(e.value) and "no_instances" in e.flags, (key, e)


@FAST
@given(lines=st.lists(st.one_of(
    st.tuples(st.integers(-3, 300), st.integers(-3, 5000), st.integers(-3, 200)).map(lambda t: f"{t[0]},{t[1]},{t[2]}"),
    st.sampled_from(["1e20,1000,100", "1.5,1000,100", "abc", "", "3,,100", "2;1000;100", "# comment",
                     "9999999999999999999999,10,10", "1,2,3,4"]),
), min_size=0, max_size=6))
def test_cli_estimate_rank_files(lines, tmp_path_factory):
    """Any rank file: exit 0 with a table, or exit 2 with one line 'reco-sampled: error: ...'; never a traceback."""
    import contextlib
    import io

    from reco_sampled_plugin.cli import main

    path = tmp_path_factory.mktemp("fuzz") / "ranks.csv"
    path.write_text("\n".join(lines) + "\n")
    err, out = io.StringIO(), io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(out):
        try:
            code = main(["estimate", str(path), "--metric", "hit@10", "--method", "none"])
        except SystemExit as exc:  # argparse usage errors
            code = exc.code
        except Exception as exc:  # noqa: BLE001
            pytest.fail(f"traceback from the CLI: {type(exc).__name__}: {exc}")
    assert code in (0, 2)
    if code == 2:
        text = err.getvalue().strip()
        assert text.startswith("reco-sampled: error:") and "\n" not in text, text
    else:
        assert "hit@10" in out.getvalue()
