"""Memory that grows with n or m, and exceptions of another type than ValueError.

Class 2: every allocation sized by n (up to 2^40) or m is either computed in closed form / by quadrature (the
identification's shape rows, the planner's default family, the hypergeometric band) or refused before allocating
against one bound, ``_checks.MAX_ELEMENTS`` (a ValueError naming the argument). The huge-n calls run under an
address-space limit (a subprocess with ``RLIMIT_AS``, or the :func:`memory_cap` context in this process), so a
regression fails fast with a MemoryError instead of eating the machine.

Class 3: a ``generator`` that is not a ``torch.Generator``, numpy arrays and lists where tensors are due (the
torchmetrics classes, factors), ``device="meta"``, a prior summing to zero, and ``leave_last_out_split`` where no
user has two items (a crash on valid input: the answer is an empty test matrix). Closed forms and brute force are
the oracles; hypothesis fuzzes the forms of every array argument and huge sizes under the memory cap.
"""

from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.corrections import correction_table
from reco_sampled_plugin.registry import Bv
from reco_sampled_plugin.mapping import fit_beta, mapping
from reco_sampled_plugin.metrics import metric_curve
from reco_sampled_plugin.priors import BetaPrior, CallablePrior, UniformPrior, VectorPrior, empirical_prior, fit_beta_prior
from reco_sampled_plugin.sampling_laws import expected_sampled, sampled_rank_pmf
from reco_sampled_plugin import planner
from reco_sampled_plugin._checks import MAX_ELEMENTS
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics
from reco_sampled_plugin.identification import _hypergeom_cdf, _shape_rows
from reco_sampled_plugin.quadrature import power_sums

ROOT = Path(__file__).resolve().parents[1]
HUGE = 1 << 40
CAP = 3 << 30  # address space of the subprocesses (torch and scipy loaded: about 1 GiB of it)
FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])


# ------------------------------------------------------------------------------------------------ helpers
def _run_capped(snippets: dict[str, str], cli: list[list[str]] = (), timeout: float = 500.0) -> dict:
    """One subprocess under RLIMIT_AS = CAP: first the CLI commands ``cli`` in turn (``main()`` as the console script
    calls it, each command's stderr its own), then each snippet (it sets ``out``). Returns {"cli": [[exit status,
    stderr] per command], "snippets": {name: ["ok", out], ["ValueError", message] or [other type, message]},
    "stderr": the process's own stderr}."""
    child = textwrap.dedent(f"""
        import json, resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({CAP}, {CAP}))
        request = json.loads(sys.stdin.read())
        cli = []
        if request["cli"]:  # first, in a process that has run nothing else (the console script's own start)
            import contextlib, io, traceback
            from reco_sampled_plugin.cli import main
            for args in request["cli"]:
                err = io.StringIO()
                with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                    try:
                        code = main(args)
                    except SystemExit as exc:  # sys.exit(main()): None is 0, a message is printed with status 1
                        code = exc.code if isinstance(exc.code, int) else 0 if exc.code is None else 1
                    except BaseException:
                        traceback.print_exc()
                        code = 1
                cli.append([code, err.getvalue()])
        import numpy as np, torch
        import reco_sampled_plugin as rsp
        from reco_sampled_plugin import planner
        result = {{}}
        for name, code in request["snippets"].items():
            scope = {{"np": np, "torch": torch, "rsp": rsp, "planner": planner}}
            try:
                exec(code, scope)
                result[name] = ["ok", scope.get("out")]
            except BaseException as exc:
                result[name] = [type(exc).__name__, str(exc)[:400]]
        print(json.dumps({{"cli": cli, "snippets": result}}))
    """)
    env = dict(os.environ, PYTHONPATH=str(ROOT), OMP_NUM_THREADS="1")
    proc = subprocess.run([sys.executable, "-c", child], input=json.dumps({"cli": list(cli), "snippets": snippets}),
                          capture_output=True, text=True, timeout=timeout, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return {**json.loads(proc.stdout.strip().splitlines()[-1]), "stderr": proc.stderr}


def _vm_size() -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmSize:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmSize")  # pragma: no cover


@contextlib.contextmanager
def memory_cap(extra: int = 2 << 30):
    """This process's address space limited to what it holds now plus ``extra`` bytes (the soft limit, restored
    after): an allocation that grows with n fails at once with a MemoryError."""
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = _vm_size() + extra
    if hard != resource.RLIM_INFINITY:
        limit = min(limit, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _value_error_naming(call, *names: str) -> str:
    with pytest.raises(ValueError) as info:
        call()
    msg = str(info.value)
    assert any(msg.startswith(n) or f"{n}:" in msg for n in names), msg
    return msg


# ----------------------------------------------------------------------- class 2: huge n under the memory cap
HUGE_CALLS = {
    # cheap answers (closed form / quadrature): a finite value in range
    "interval_ndcg": "e = rsp.estimate('ndcg@10', rsp.SampledRanks.from_arrays([1, 2, 3, 1], 2**40, 100));"
                     " out = list(e.interval())",
    "interval_mle": "e = rsp.estimate('recall@10', rsp.SampledRanks.from_arrays([1, 2, 3, 1] * 20, 2**40, 100), 'mle');"
                    " out = list(e.interval())",
    "identified_mixed_n": "r = rsp.identified_interval('ap', [1, 2, 3, 1], n_items=[2**40, 2**39, 2**40 - 5, 10**6],"
                          " n_samples=100); out = [r.lo, r.hi]",
    "identified_hypergeometric": "r = rsp.identified_interval('ndcg', [1, 2, 3, 1], n_items=2**40, n_samples=100,"
                                 " sampling='hypergeometric'); out = [r.lo, r.hi]",
    "identified_m_max": "r = rsp.identified_interval('ndcg@10', [1, 2, 3, 1], n_items=2**40, n_samples=2**24);"
                        " out = [r.lo, r.hi]",
    "plan_default_family": "p = planner.plan(2**40, 50, 'recall@10', 0.05, repeats=2); out = p.truth",
    "plan_per_user_n": "p = planner.plan(np.array([2**40, 2**39] * 10), 20, 'ndcg@10', 0.05, repeats=2); out = p.truth",
    # refused before allocating: a ValueError naming the argument
    "metric_curve": "out = rsp.metrics.metric_curve('ndcg@10', 2**40)",
    "empirical_prior": "out = rsp.priors.empirical_prior([1, 2, 3], 2**40)",
    "uniform_weights": "out = rsp.priors.UniformPrior().weights(2**40)",
    "beta_weights": "out = rsp.priors.BetaPrior(0.5).weights(2**40)",
    "callable_weights": "out = rsp.priors.CallablePrior(lambda r, n: 1.0 / r).weights(2**40)",
    "distribution_prior": "d = rsp.rank_distribution.fit_rank_distribution("
                          "rsp.SampledRanks.from_arrays([1, 2, 3, 1], 2**40, 100)); out = d.prior()",
    "hypergeometric_draw": "out = rsp.simulate_sampled_ranks(torch.tensor([1, 2**39]), 2**40, 100,"
                           " sampling='hypergeometric')",
}
HUGE_CALLS["every_estimator"] = (
    "out = {m: [rsp.estimate('ndcg@10', rsp.SampledRanks.from_arrays([1, 2, 3, 1], 2**40, 100),"
    " rsp.registry.method_class(m)(**({'a': 1.0} if m == 'beta' else {}))).value]"
    " for m in rsp.registry.names(metric='ndcg@10')}"
)
# huge m: the 20,013-node Gauss rule's eigenvectors (rank_estimate at m = 20,000: 3 GiB, MemoryError after 20 s
# before), and a fit's likelihood over every observed r~ of m = 2^20 (66 GiB before)
HUGE_CALLS["rank_estimate_huge_m"] = ("out = rsp.estimate('ndcg@10', rsp.sampled_rank_histogram(torch.tensor([1, 2, 3]),"
                                      " 10**6, 20000), 'rank_estimate').value")
HUGE_CALLS["fit_of_every_rank_of_huge_m"] = ("out = rsp.estimate('ndcg@10', rsp.sampled_rank_histogram("
                                             "torch.arange(1, 2**20 + 2), 2**40, 2**20), 'mes').value")
REFUSED = {"metric_curve", "empirical_prior", "uniform_weights", "beta_weights", "callable_weights",
           "distribution_prior", "hypergeometric_draw", "rank_estimate_huge_m", "fit_of_every_rank_of_huge_m"}


def _cli_commands(ranks: Path) -> tuple:
    """(argv, expected exit status) of the CLI at n = 2^40 (estimate, plan) and 2^41 (refused) on a rank file."""
    return (
        (["estimate", str(ranks), "--n-items", str(HUGE), "-m", "100"], 0),
        (["plan", "--n-items", str(HUGE), "--n-users", "5", "--metric", "recall@10", "--target-rel-error", "0.05",
          "--repeats", "2"], 0),
        (["estimate", str(ranks), "--n-items", str(2 * HUGE), "-m", "100"], 2),
    )


@pytest.fixture(scope="module")
def capped_run(tmp_path_factory) -> dict:
    """The huge-n snippets and the CLI commands (on a five-line rank file) in one capped subprocess: one start of
    the interpreter, torch and the package for both tests below (the CLI's commands run first, as in a fresh
    console script)."""
    ranks = tmp_path_factory.mktemp("cli") / "ranks.txt"
    ranks.write_text("1\n2\n3\n1\n5\n")
    commands = _cli_commands(ranks)
    return {**_run_capped(HUGE_CALLS, [args for args, _ in commands]), "commands": commands}


@pytest.fixture(scope="module")
def huge_results(capped_run) -> dict[str, list]:
    return capped_run["snippets"]


@pytest.mark.parametrize("name", sorted(HUGE_CALLS))
def test_huge_n_under_memory_cap(huge_results, name):
    kind, out = huge_results[name]
    assert kind != "MemoryError", f"{name}: an allocation grew with n ({out})"
    if name in REFUSED:
        assert kind == "ValueError", (kind, out)
        assert out.startswith("n_samples" if name.endswith("huge_m") else "n_items"), out
        return
    assert kind == "ok", (kind, out)
    values = [v for vs in out.values() for v in vs] if isinstance(out, dict) else np.atleast_1d(out).tolist()
    assert all(math.isfinite(v) for v in values), out
    if name.startswith(("interval", "identified")):
        lo, hi = out
        assert 0.0 <= lo <= hi <= 1.0


def test_bound_message_names_the_bound():
    msg = _value_error_naming(lambda: metric_curve("recall@10", MAX_ELEMENTS + 1), "n_items")
    assert "2^27" in msg and "MAX_ELEMENTS" in msg
    # at the bound's edge a curve is still served when small; the curve is the metric at every rank
    curve = metric_curve("ndcg@10", 1000)
    expected = rsp.metric_values("ndcg@10", torch.arange(1, 1001), 1000)
    torch.testing.assert_close(curve, expected)


def test_cli_huge_n_under_memory_cap(capped_run):
    """The CLI at n = 2^40 under the address-space cap: estimate and plan succeed, n = 2^41 is refused in one line
    (exit status 2); no traceback. The three commands run in turn in one capped process (main() as the console
    script calls it, each command's stderr its own), before the snippets of test_huge_n_under_memory_cap."""
    assert "Traceback" not in capped_run["stderr"], capped_run["stderr"][-2000:]
    for (args, code), (got, stderr) in zip(capped_run["commands"], capped_run["cli"], strict=True):
        assert got == code, (args, stderr[-2000:])
        assert "Traceback" not in stderr
        if code == 2:
            lines = stderr.strip().splitlines()
            assert len(lines) == 1 and lines[0].startswith("reco-sampled: error: "), stderr


def test_cli_memory_error_is_one_line():
    from reco_sampled_plugin import cli

    assert MemoryError in cli._USER_ERRORS
    assert cli._message(MemoryError("Unable to allocate 8 TiB")).startswith("out of memory (Unable to allocate")


def test_correction_system_bounded():
    """A solved table's system P(r~ | r) (rank nodes x (m + 1), four working copies) is refused before allocating
    when a vector prior enumerates a million ranks; bv_mle switches to its callable prior there instead."""
    n = 10**6
    with memory_cap():
        msg = _value_error_naming(
            lambda: correction_table("ndcg@10", n, 100, Bv(prior=np.full(n, 1.0 / n))), "n_samples")
        est = rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays([1, 2, 3, 50, 7], n, 100), "bv_mle")
    assert "MAX_ELEMENTS" in msg
    assert math.isfinite(est.value) and -1e-9 <= est.value <= 1.0  # bv may leave the range by rounding (flagged)


def test_histograms_bounded():
    """A histogram holds m + 1 counts per distinct (n, m) group (and the torchmetrics state per row of excluded
    counts): many groups at a large m are refused before allocating, naming n_samples; few groups are served. The
    torchmetrics state is refused from the batch's shapes, before any negative is drawn or scored (a scorer is never
    called)."""
    ones = torch.ones(1000, dtype=torch.int64)
    with memory_cap():
        _value_error_naming(lambda: rsp.sampled_rank_histogram(ones, HUGE, 2**24 - torch.arange(1000)), "n_samples")
        _value_error_naming(lambda: rsp.estimate(
            "ndcg@10",
            rsp.SampledRanks.from_arrays(ones, HUGE - torch.arange(1000), 2**20),
        ), "n_samples")
        metric = SampledRankingMetrics(["ndcg@10"], n_samples=2**24)
        msg = _value_error_naming(lambda: metric.update(torch.rand(2, 100), [[0], [1]],
                                                        exclude=torch.arange(2, 60).repeat(2, 1)), "n_samples")
        assert "the histogram state (59 rows" in msg and "MAX_ELEMENTS" in msg
        calls = []

        def scorer(users, items):
            calls.append(items.shape)
            return torch.zeros(items.shape, dtype=torch.float64)

        _value_error_naming(lambda: metric.update_from_scorer(scorer, [[0], [1]], 100,
                                                              exclude=torch.arange(2, 60).repeat(2, 1)), "n_samples")
        assert calls == []  # refused before the draws were scored
        assert metric.hist.shape[0] == 0 and int(metric.n_items) == 0  # no state changed
        hist = rsp.sampled_rank_histogram(ones[:3], HUGE, 2**24)
        est = rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(ones, HUGE - torch.arange(1000), 100))
    assert hist.n_groups == 1 and hist.total == 3
    assert math.isfinite(est.value)


# ------------------------------------------------------------------------- class 2: the closed forms, checked
@pytest.mark.parametrize("s", [0.0, 0.3, 1.0, 1.0 + 1e-9, 1.7, 2.0, 5.0])
def test_power_sums_match_brute_force(s):
    cells = [(1, 1), (1, 64), (1, 65), (1, 100_000), (3, 3000), (65, 200_000), (1000, 1_000_000), (7, 6)]
    lo, hi = np.array(cells).T
    got = power_sums(lo, hi, s)
    want = np.array([(np.arange(a, b + 1, dtype=np.float64) ** -s).sum() for a, b in cells])
    np.testing.assert_allclose(got, want, rtol=1e-13, atol=0)
    # H_n for n = 2^40 (ln n + gamma + 1/(2n), the rest below float64's resolution)
    assert power_sums(1, HUGE, 1.0) == pytest.approx(math.log(HUGE) + np.euler_gamma + 0.5 / HUGE, rel=1e-15)


@pytest.mark.parametrize("gamma", [None, 0.5, 1.0, 2.0])
def test_shape_rows_match_enumeration(gamma):
    """The identification's shape rows against the enumeration they replaced (sums of r^-gamma over each cell)."""
    edges = np.array([0, 1, 2, 3, 5, 9, 17, 40, 100, 1000, 5000, 20000])
    zone = 5000
    got = _shape_rows(edges, zone, gamma)
    c_zone = int(np.searchsorted(edges, zone, side="right")) - 1
    widths = np.diff(edges[: c_zone + 1]).astype(np.float64)
    if gamma is None:
        ref = np.ones(c_zone)
    else:
        r = np.arange(1, int(edges[c_zone]) + 1, dtype=np.float64)
        ref = np.add.reduceat(r ** (-gamma), edges[:c_zone]) / widths
    rows = np.zeros((c_zone - 1, len(edges) - 1))
    idx = np.arange(c_zone - 1)
    sign = 1.0 if gamma is None else -1.0
    rows[idx, idx + 1] = sign / (widths[1:] * ref[1:])
    rows[idx, idx] = -sign / (widths[:-1] * ref[:-1])
    want = rows / np.abs(rows).max(axis=1, keepdims=True)
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-15)


def test_hypergeometric_band_cdf_matches_scipy():
    from scipy import stats

    pts = np.array([[1, 2, 50, 51], [300, 999, 1000, 1001]])
    n, m, k = 1001, 100, np.array([0, 1, 2, 4, 8, 16, 32, 64, 99])
    got = _hypergeom_cdf(pts, n, m, k)
    want = stats.hypergeom.cdf(k.astype(float), n - 1, pts[..., None] - 1.0, m)
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_harmonic_draws_match_the_cumulative_sum():
    """The planner's default family: the closed-form inverse of H draws exactly what searchsorted on the cumulative
    sum H_1..H_n drew (the enumeration it replaced), and H_n agrees with the sum."""
    n = 100_000
    cum = np.cumsum(1.0 / np.arange(1, n + 1))
    np.testing.assert_allclose(planner.harmonic_number(np.arange(1, n + 1)), cum, rtol=1e-14)
    t = np.random.default_rng(3).random(200_000) * cum[-1]
    np.testing.assert_array_equal(planner.harmonic_inverse(t), np.searchsorted(cum, t, side="left") + 1)
    assert planner.harmonic_inverse(np.array([0.0, 1.0, 1.5 + 1e-12]))[:3].tolist() == [1, 1, 3]


@FAST
@given(n=st.one_of(st.integers(min_value=MAX_ELEMENTS + 1, max_value=HUGE), st.sampled_from([HUGE, HUGE - 1, 2**30])),
       which=st.sampled_from(["curve", "empirical", "uniform", "beta", "callable", "pmf", "expected", "values",
                              "mapping", "table", "fit_beta"]))
def test_fuzz_huge_sizes_under_memory_cap(n, which):
    """Any n up to 2^40: a finite answer or a ValueError naming the size, never a MemoryError (the cap makes an
    allocation that grows with n fail at once)."""
    calls = {
        "curve": lambda: metric_curve("ap", n),
        "empirical": lambda: empirical_prior([1, 2], n),
        "uniform": lambda: UniformPrior().weights(n),
        "beta": lambda: BetaPrior(2.0).weights(n),
        "callable": lambda: CallablePrior(lambda r, k: 1.0 / r).weights(n),
        "pmf": lambda: sampled_rank_pmf(torch.tensor([1, n // 2]), n, 1000),
        "expected": lambda: expected_sampled("ndcg", torch.tensor([1, n // 3, n]), n, 1000),
        "values": lambda: rsp.metric_values("ap", torch.tensor([1, n]), n),
        "mapping": lambda: mapping([1, 5], n, 1000),
        "table": lambda: correction_table("recall@10", n, 50, Bv(prior=BetaPrior(0.5))),
        "fit_beta": lambda: fit_beta([1, 2, 3], n, 100).a,
    }
    with memory_cap():
        try:
            out = calls[which]()
        except ValueError as exc:
            assert str(exc).startswith(("n_items", "n_samples")), exc
            return
        except MemoryError as exc:  # pragma: no cover - the regression this test is for
            pytest.fail(f"{which}: an allocation grew with n = {n} ({exc})")
    values = torch.as_tensor(np.asarray(out, dtype=np.float64))
    assert bool(torch.isfinite(values).all())


# ------------------------------------------------------------------------------- class 3: generator arguments
def _scores():
    g = torch.Generator().manual_seed(0)
    return torch.rand(4, 30, generator=g, dtype=torch.float64), torch.tensor([[0], [5], [7], [29]])


GENERATOR_CALLS = {
    "exact_ranks": lambda gen: rsp.exact_ranks(*_scores(), ties="random", generator=gen),
    "sampled_ranks": lambda gen: rsp.sampled_ranks(*_scores(), 5, generator=gen).ranks,
    "adaptive_sampled_ranks": lambda gen: rsp.adaptive_sampled_ranks(
        *_scores(), rsp.SamplingDesign(5, adaptive_max=20), generator=gen).ranks,
    "per_user_metrics": lambda gen: rsp.per_user_metrics(*_scores(), metrics=["ndcg@5"], ties="random",
                                                         generator=gen, as_frame=False)["NDCG@5"],
    "simulate_sampled_ranks": lambda gen: rsp.simulate_sampled_ranks(torch.tensor([1, 5, 30]), 30, 5, generator=gen),
    "adaptive_sampled_ranks_from_exact": lambda gen: adaptive_sampled_ranks_from_exact(
        torch.tensor([1, 5, 30]), 30, rsp.SamplingDesign(5, adaptive_max=20), generator=gen).ranks,
}


@pytest.mark.parametrize("name", sorted(GENERATOR_CALLS))
@pytest.mark.parametrize("bad", [5, "seed", np.random.default_rng(0), 1.5, torch.tensor(3)])
def test_generator_not_a_torch_generator(name, bad):
    msg = _value_error_naming(lambda: GENERATOR_CALLS[name](bad), "generator")
    assert "torch.Generator" in msg


@pytest.mark.parametrize("name", sorted(GENERATOR_CALLS))
def test_generator_still_reproducible(name):
    a = GENERATOR_CALLS[name](torch.Generator().manual_seed(11))
    b = GENERATOR_CALLS[name](torch.Generator().manual_seed(11))
    torch.testing.assert_close(a, b, equal_nan=True)


# ------------------------------------------------------------------- class 3: numpy and lists in torchmetrics
def _batch(seed: int = 0):
    rng = np.random.default_rng(seed)
    scores = rng.random((5, 40))
    positives = np.array([[0, 3], [1, -1], [2, 39], [10, -1], [20, 21]])
    keep = np.array([True, True, False, True, True])
    return scores, positives, keep


@pytest.mark.parametrize("form", ["numpy", "list"])
def test_torchmetrics_accept_numpy_and_lists(form):
    scores, positives, keep = _batch()
    conv = (lambda a: a) if form == "numpy" else (lambda a: a.tolist())
    ids = np.arange(5)
    for make, extra in ((lambda: ExactRankingMetrics(["ndcg@10", "auc"]), {}),
                        (lambda: SampledRankingMetrics(["ndcg@10", "recall@10"], n_samples=10, seed=3),
                         {"ids": conv(ids)})):
        want, got = make(), make()
        want.update(torch.from_numpy(scores), torch.from_numpy(positives), keep=torch.from_numpy(keep),
                    **{k: torch.from_numpy(ids) for k in extra})
        got.update(conv(scores), conv(positives), keep=conv(keep), **extra)
        w, g = want.compute(), got.compute()
        assert w.keys() == g.keys()
        for key in w:
            torch.testing.assert_close(g[key], w[key], equal_nan=True)


@pytest.mark.parametrize("cls", [ExactRankingMetrics, SampledRankingMetrics])
@pytest.mark.parametrize("arg, bad", [
    ("scores", sp.csr_matrix(np.ones((5, 40)))), ("scores", np.ones((5, 40)) + 1j), ("scores", [[0.1, 0.2], [0.3]]),
    ("scores", "scores"), ("scores", np.ones((5, 40)) > 0), ("positives", sp.csr_matrix(np.eye(5, 40))),
    ("positives", [[0, 1], [2]]), ("keep", "yes"), ("keep", [[True], [False, True]]),
])
def test_torchmetrics_bad_forms_name_the_argument(cls, arg, bad):
    scores, positives, keep = _batch()
    kwargs = {"scores": scores, "positives": positives, "keep": keep, arg: bad}
    metric = cls(n_samples=10) if cls is SampledRankingMetrics else cls()
    _value_error_naming(lambda: metric.update(kwargs.pop("scores"), kwargs.pop("positives"), **kwargs), arg)


# ---------------------------------------------------------------------------------- class 3: factors, devices
def _factor_data():
    rng = np.random.default_rng(1)
    dense = (rng.random((6, 12)) < 0.3).astype(np.float64)
    dense[np.arange(6), np.arange(6)] = 1.0  # every user has a test item
    return sp.csr_matrix(dense), rng.standard_normal((6, 3)), rng.standard_normal((12, 3))


def test_evaluate_factors_lists_equal_arrays():
    X, u, v = _factor_data()
    want = rsp.evaluate_factors(None, X, u, v, k=3, as_df=False)
    got = rsp.evaluate_factors(None, X, u.tolist(), v.tolist(), k=3, as_df=False)
    for key in want:
        torch.testing.assert_close(torch.as_tensor(got[key]), torch.as_tensor(want[key]), equal_nan=True)


def test_factor_functions_lists_equal_arrays():
    _, u, v = _factor_data()
    pos = [[0], [1], [2], [3], [4], [5]]
    torch.testing.assert_close(rsp.exact_ranks_from_factors(u.tolist(), v.tolist(), pos),
                               rsp.exact_ranks_from_factors(u, v, pos))
    want = rsp.per_user_metrics((u, v), pos, metrics=["ndcg@5"], as_frame=False)
    got = rsp.per_user_metrics((u.tolist(), v.tolist()), pos, metrics=["ndcg@5"], as_frame=False)
    torch.testing.assert_close(got["NDCG@5"], want["NDCG@5"])


@pytest.mark.parametrize("bad", [[[1.0, 2.0], [3.0]], "factors", sp.csr_matrix(np.ones((6, 3))),
                                 np.ones((6, 3)) + 1j, torch.ones(6, 3, device="meta")])
def test_bad_factor_forms_name_the_argument(bad):
    X, u, v = _factor_data()
    _value_error_naming(lambda: rsp.evaluate_factors(None, X, bad, v, k=3), "user_factors")
    _value_error_naming(lambda: rsp.exact_ranks_from_factors(u, bad, [[0]] * 6), "item_factors")
    _value_error_naming(lambda: rsp.per_user_metrics((bad, v), [[0]] * 6, metrics=["ndcg@5"]),
                        "user_factors")


_ABSENT = [d for d in ("cuda", "cuda:0") if not torch.cuda.is_available()] + [f"cuda:{torch.cuda.device_count()}"]


@pytest.mark.parametrize("device", ["meta", torch.device("meta"), "no-such-device", 3.5, *_ABSENT])
def test_device_meta_or_bad_refused(device):
    """Devices torch cannot parse, ``meta``, and accelerators this machine has not (an AssertionError of torch's deep
    inside before, on a CPU-only build) are a ValueError naming ``device``."""
    X, u, v = _factor_data()
    _value_error_naming(lambda: rsp.evaluate_factors(None, X, u, v, k=3, device=device), "device")
    _value_error_naming(lambda: metric_curve("ndcg@10", 50, device=device), "device")
    _value_error_naming(lambda: correction_table("ndcg@10", 100, 10, device=device), "device")
    from reco_sampled_plugin.baselines import Popularity

    _value_error_naming(lambda: Popularity(device=device), "device")


# ------------------------------------------------------------------------------------------ class 3: priors
@pytest.mark.parametrize("n", [30, 1000, 10**7])
def test_prior_summing_to_zero(n, capfd):
    zero = lambda r, k: 0.0 * r  # noqa: E731
    for prior in (zero, CallablePrior(zero)):
        _value_error_naming(lambda: correction_table("ndcg@10", n, 10, Bv(prior=prior)), "prior")
        _value_error_naming(lambda: rsp.estimate(
            "ndcg@10",
            rsp.SampledRanks.from_arrays([1, 2], n, 10),
            rsp.registry.Bv(prior=prior),
        ), "prior")
    assert capfd.readouterr().err == ""  # no LAPACK message on stderr


def test_callable_prior_of_one_argument():
    msg = _value_error_naming(lambda: correction_table("ap", 1000, 10, Bv(prior=lambda r: 1.0 / r)), "prior")
    assert "(r, n)" in msg


def test_empirical_prior_is_the_smoothed_histogram():
    p = empirical_prior([1, 1, 3], 4, smoothing=1.0).p
    np.testing.assert_allclose(p, np.array([3.0, 1.0, 2.0, 1.0]) / 7.0)
    _value_error_naming(lambda: empirical_prior([1.5], 4), "exact_ranks")
    _value_error_naming(lambda: empirical_prior([5], 4), "exact_ranks")
    _value_error_naming(lambda: empirical_prior([1], 4.5), "n_items")


# --------------------------------------------------------------------------- class 3: leave_last_out_split
@pytest.mark.parametrize("form", ["scipy", "dense", "torch"])
def test_leave_last_out_no_user_with_two_items(form):
    x = np.eye(4, 6) * np.array([2.0, 3.0, 4.0, 5.0])[:, None]
    conv = {"scipy": sp.csr_matrix, "dense": np.asarray, "torch": torch.as_tensor}[form]
    train, test = rsp.leave_last_out_split(conv(x), conv(x))
    to_np = lambda a: a.toarray() if sp.issparse(a) else np.asarray(a)  # noqa: E731
    np.testing.assert_array_equal(to_np(train), x)  # every interaction stays in train
    np.testing.assert_array_equal(to_np(test), np.zeros_like(x))  # an empty test matrix of X's shape


def test_leave_last_out_empty_and_mixed():
    empty = sp.csr_matrix((3, 5))
    train, test = rsp.leave_last_out_split(empty, empty)
    assert train.shape == test.shape == (3, 5) and train.nnz == test.nnz == 0
    x = sp.csr_matrix(np.array([[1.0, 1.0, 0.0], [0.0, 1.0, 0.0]]))
    ts = sp.csr_matrix(np.array([[1.0, 2.0, 0.0], [0.0, 5.0, 0.0]]))
    train, test = rsp.leave_last_out_split(x, ts)
    np.testing.assert_array_equal(test.toarray(), [[0, 1, 0], [0, 0, 0]])
    np.testing.assert_array_equal(train.toarray(), [[1, 0, 0], [0, 1, 0]])


# ------------------------------------------------------------ fuzz: the forms of every array argument touched
def _forms(draw, arr: np.ndarray):
    """One form of ``arr``: tensor, numpy, list (same values), or a broken one (complex, sparse, ragged, string)."""
    kind = draw(st.sampled_from(["tensor", "numpy", "list", "complex", "sparse", "ragged", "string"]))
    if kind == "tensor":
        return kind, torch.from_numpy(arr)
    if kind == "numpy":
        return kind, arr
    if kind == "list":
        return kind, arr.tolist()
    if kind == "complex":
        return kind, arr.astype(np.complex128)
    if kind == "sparse":
        return kind, sp.csr_matrix(arr.reshape(arr.shape[0], -1) if arr.ndim else arr.reshape(1, 1))
    if kind == "ragged":
        return kind, [arr.reshape(-1).tolist(), [1]]
    return kind, "values"


@st.composite
def array_forms(draw, arr: np.ndarray):
    return _forms(draw, arr)


SCORES = np.random.default_rng(5).random((4, 25))
POSITIVES = np.array([[0, 3], [1, -1], [24, 2], [7, 8]])
RANKS = np.array([1, 2, 5, 3, 1])
U = np.random.default_rng(6).standard_normal((4, 3))
V = np.random.default_rng(7).standard_normal((25, 3))


def _same(a, b) -> None:
    if isinstance(a, dict):
        for k in a:
            _same(a[k], b[k])
        return
    as_t = lambda x: x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x))  # noqa: E731
    torch.testing.assert_close(as_t(a), as_t(b), equal_nan=True)


FUZZ_CALLS = {
    "exact_ranks.scores": ("scores", SCORES, lambda x: rsp.exact_ranks(x, POSITIVES)),
    "exact_ranks.positives": ("positives", POSITIVES, lambda x: rsp.exact_ranks(SCORES, x)),
    "sampled_ranks.scores": ("scores", SCORES,
                             lambda x: rsp.sampled_ranks(x, POSITIVES, 5, generator=torch.Generator().manual_seed(1)).ranks),
    "per_user_metrics.scores": ("scores", SCORES,
                                lambda x: rsp.per_user_metrics(x, POSITIVES, metrics=["ndcg@5"], as_frame=False)),
    "exact_ranks_from_factors.user_factors": ("user_factors", U,
                                              lambda x: rsp.exact_ranks_from_factors(x, V, POSITIVES)),
    "exact_ranks_from_factors.item_factors": ("item_factors", V,
                                              lambda x: rsp.exact_ranks_from_factors(U, x, POSITIVES)),
    "empirical_prior.exact_ranks": ("exact_ranks", RANKS, lambda x: empirical_prior(x, 10).p),
    "simulate.exact_ranks": ("exact_ranks", RANKS, lambda x: rsp.simulate_sampled_ranks(
        x, 10, 5, generator=torch.Generator().manual_seed(2))),
    "paired_difference.sampled_ranks_a": ("sampled_ranks_a", RANKS,
                                          lambda x: rsp.paired_difference("ndcg@10", x, RANKS[::-1].copy(), 100, 10).value),
    "fit_beta_prior.sampled_ranks": ("sampled_ranks", RANKS, lambda x: fit_beta_prior(x, 10).a),
    "consistency_report.exact_ranks": ("exact_ranks", RANKS, lambda x: rsp.consistency_report(
        {"a": x, "b": RANKS + 1}, 100, 10, metrics=["ndcg@10"], methods=["none"], repeats=2)["table3"][0]["none"]),
    "VectorPrior.p": ("prior", np.full(10, 0.1), lambda x: VectorPrior(x).p),
    "mean_metrics.values": ("values", np.array([0.5, np.nan, 0.25]), lambda x: rsp.mean_metrics({"ndcg": x})),
    "torchmetrics.scores": ("scores", SCORES, lambda x: _tm_update(x, POSITIVES)),
    "torchmetrics.positives": ("positives", POSITIVES, lambda x: _tm_update(SCORES, x)),
}


@functools.lru_cache(maxsize=None)
def _reference(name: str):
    """``FUZZ_CALLS[name]`` on its tensor form: computed once per call, not once per example (every call is
    deterministic: its generators are seeded; the torchmetrics ones cost ~0.1 s each)."""
    _, base, call = FUZZ_CALLS[name]
    return call(torch.from_numpy(base))


def _tm_update(scores, positives):
    metric = SampledRankingMetrics(["ndcg@10", "auc"], n_samples=6, seed=4)
    metric.update(scores, positives)
    return metric.compute()


@settings(FAST, max_examples=examples(150))  # 15 calls x 7 forms
@given(name=st.sampled_from(sorted(FUZZ_CALLS)), data=st.data())
def test_fuzz_array_forms(name, data):
    """Tensors, numpy arrays and lists give the same result; complex, sparse, ragged and string inputs a ValueError
    naming the argument; nothing else escapes."""
    arg, base, call = FUZZ_CALLS[name]
    kind, value = data.draw(array_forms(base))
    want = _reference(name)
    try:
        got = call(value)
    except ValueError as exc:
        assert kind not in ("tensor", "numpy", "list"), f"{kind} refused: {exc}"
        assert str(exc).startswith(arg) or f"{arg}:" in str(exc), exc
        return
    except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
        pytest.fail(f"{name} with a {kind}: {type(exc).__name__}: {exc}")
    assert kind in ("tensor", "numpy", "list"), f"{kind} accepted"
    _same(got, want)
