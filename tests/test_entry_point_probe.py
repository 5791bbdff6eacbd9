"""A probe of every public entry point as a new user would call it (about 1,800 bad and edge inputs, kept
outside the project): each class of failure it found is pinned here, fixed at its root in the shared helpers.

* torch sparse tensors as ranks, weights, priors: a NotImplementedError from the elementwise checks (``_numeric``
  now refuses sparse layouts, for every array argument);
* raw ``torch.as_tensor`` conversions of user input (relevance, item bias, a correction table, a pilot, users):
  TypeError / RuntimeError ("could not infer dtype") instead of a ValueError naming the argument (``real_tensor``);
* ``parse_metric`` raising TypeError for a non-string metric; metric lists naming ``metric`` where the caller typed
  ``metrics`` (``_options.check_metric_names``);
* silent wrong numbers: ``candidate_counts`` read bool masks as padded indices (negative counts); ``as_design``
  returned an ``(m, cap)`` pair unconverted and unchecked; the mappings accepted draws without replacement of
  more items than exist; ``rounding`` ignored by every correction but ``rank_estimate``; the CLI's ``--gamma``
  ignored by methods without one; ``adaptive_cost`` of an empty histogram NaN;
* messages naming another argument: zero weights (``sampled_ranks``), an empty pair (``values``), the planner's
  pilot (``sampled_ranks``, "cannot convert float NaN to integer");
* AttributeError / TypeError / RuntimeError / FileNotFoundError from ``explain_flags``, ``adaptive_cost``,
  ``datasets`` and ``baselines`` (now ValueErrors; where an older type was documented, a ValueError that is also
  that type: ``_options.ArgumentTypeError``, ``NotFittedError``, ``MissingFileError``);
* allocations that grow with m or a repeat count: ``sampled_ranks`` (B x P x m negatives) and
  ``draw_sampled_ranks`` (repeats x ranks), refused against ``MAX_ELEMENTS`` before allocating.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import reco_sampled_plugin as rsp
from reco_sampled_plugin.corrections import correction_table, table_bias
from reco_sampled_plugin.design import as_design
from reco_sampled_plugin.mapping import fit_beta, mapping_estimate
from reco_sampled_plugin.priors import Prior, UniformPrior, VectorPrior, empirical_prior, fit_beta_prior
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin.user_metrics import user_metric_values
from reco_sampled_plugin import baselines, cli, datasets, planner
from reco_sampled_plugin._checks import MAX_ELEMENTS
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
NAN = float("nan")
RT = torch.tensor([1, 2, 5, 11, 3, 7, 1, 2, 4, 9])  # sampled ranks, m = 10


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def _raises_naming(call, name: str) -> str:
    """The ValueError of ``call``; its message must start with ``name`` (the argument the caller typed)."""
    with pytest.raises(ValueError) as info:
        call()
    assert str(info.value).startswith(name), str(info.value)
    return str(info.value)


# ------------------------------------------------------------------------------ array arguments of the wrong kind
def _sparse(values) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.float64).to_sparse()


ARRAY_ARGUMENTS = {  # name -> (argument name, call taking the bad value)
    "metric_values": ("ranks", lambda x: rsp.metric_values("ndcg@10", x, 20)),
    "user_metric_values": ("ranks", lambda x: user_metric_values("ndcg@10", x, 20)),
    "estimate.sampled_ranks": ("sampled_ranks", lambda x: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(x, 100, 10),
    )),
    "estimate.weights": ("weights", lambda x: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(RT, 100, 10),
        weights=x,
    )),
    "fit_beta": ("sampled_ranks", lambda x: fit_beta(x, 100, 10)),
    "fit_beta_prior": ("sampled_ranks", lambda x: fit_beta_prior(x, 10)),
    "empirical_prior": ("exact_ranks", lambda x: empirical_prior(x, 20)),
    "VectorPrior": ("prior", lambda x: VectorPrior(x)),
    "sampled_rank_histogram": ("sampled_ranks", lambda x: rsp.sampled_rank_histogram(x, 100, 10)),
    "paired_difference": ("sampled_ranks_b", lambda x: rsp.paired_difference("ndcg@10", RT, x, 100, 10)),
    "table_bias": ("table", lambda x: table_bias(x, "ndcg@10", 100, 10)),
    "per_user_metrics.relevance": ("relevance", lambda x: rsp.per_user_metrics(
        torch.randn(2, 5), torch.tensor([[True, False, False, False, False]] * 2), metrics=("ndcg@5",), relevance=x,
        as_frame=False)),
    "exact_ranks_from_factors.item_bias": ("item_bias", lambda x: rsp.exact_ranks_from_factors(
        torch.randn(2, 3), torch.randn(5, 3), torch.tensor([[0], [1]]), item_bias=x)),
}
WRONG_KINDS = {
    "torch_sparse": lambda: _sparse([1.0, 0.0, 2.0]),
    "scipy_sparse": lambda: sp.csr_matrix(np.eye(3)),
    "string": lambda: "abc",
    "object": lambda: object(),
    "ragged": lambda: [[1, 2], [3]],
    "complex": lambda: torch.tensor([1 + 1j, 2 + 0j]),
}


@pytest.mark.parametrize("kind", sorted(WRONG_KINDS))
@pytest.mark.parametrize("entry", sorted(ARRAY_ARGUMENTS))
def test_array_arguments_of_the_wrong_kind_are_named(entry, kind):
    """Every array argument: a sparse tensor (NotImplementedError from the elementwise checks before), a string, an
    object, a ragged list (TypeError / RuntimeError from a raw torch.as_tensor before) is a ValueError naming it."""
    name, call = ARRAY_ARGUMENTS[entry]
    _raises_naming(lambda: call(WRONG_KINDS[kind]()), name)


@FAST
@given(entry=st.sampled_from(sorted(ARRAY_ARGUMENTS)), kind=st.sampled_from(sorted(WRONG_KINDS)),
       dense=st.lists(st.integers(1, 5), min_size=1, max_size=6))
def test_fuzz_array_arguments(entry, kind, dense):
    """Any entry point, any wrong kind, also a sparse tensor holding valid ranks: never another exception type."""
    name, call = ARRAY_ARGUMENTS[entry]
    value = _sparse([float(v) for v in dense]) if kind == "torch_sparse" else WRONG_KINDS[kind]()
    _raises_naming(lambda: call(value), name)


def test_dense_twins_still_accepted():
    """The same values dense give the same results as before (the refusal is of the layout, not the values)."""
    ranks = torch.tensor([1, 3, 25])
    assert torch.equal(rsp.metric_values("hit@10", ranks, 100), torch.tensor([1.0, 1.0, 0.0], dtype=torch.float64))
    rel = torch.tensor([[2.0, 0, 0, 0, 0], [1.0, 0, 0, 0, 0]])
    out = rsp.per_user_metrics(torch.tensor([[5.0, 1, 2, 3, 4], [0.0, 1, 2, 3, 4]]),
                               torch.tensor([[True, False, False, False, False]] * 2),
                               metrics=("ndcg@5",), relevance=rel, as_frame=False)
    # one relevant item per user: NDCG = 1 / log2(1 + rank), ranks 1 and 5
    assert torch.allclose(out["NDCG@5"], torch.tensor([1.0, 1 / math.log2(6)], dtype=torch.float64))


# ------------------------------------------------------------------------------------------------- metric names
@pytest.mark.parametrize("bad", [3, None, ["ndcg@10"], b"ndcg@10", 1.5])
def test_parse_metric_of_a_non_string_is_a_value_error(bad):
    _raises_naming(lambda: rsp.parse_metric(bad), "metric")
    _raises_naming(lambda: rsp.metric_values(bad, torch.tensor([1]), 10), "metric")
    _raises_naming(lambda: rsp.estimate(bad, rsp.SampledRanks.from_arrays(RT, 100, 10)), "metric")


@pytest.mark.parametrize("call", [
    lambda: ExactRankingMetrics(metrics=["ndcg@10", "zz"]),
    lambda: SampledRankingMetrics(metrics=["zz@3"]),
    lambda: rsp.per_user_metrics(torch.randn(2, 5), torch.tensor([[True] + [False] * 4] * 2), metrics=["zz"]),
    lambda: fit_rank_distribution(rsp.SampledRanks.from_arrays(RT, 100, 10)).metrics(["ndcg@10", "zz"]),
], ids=["exact", "sampled", "per_user_metrics", "rank_distribution"])
def test_an_unknown_name_in_a_metric_list_names_metrics(call):
    assert "'zz" in _raises_naming(call, "metrics:")


# -------------------------------------------------------------------------------------------- candidate counts
@FAST
@given(rows=st.integers(1, 5), n=st.integers(1, 8), data=st.data())
def test_candidate_counts_from_masks_against_brute_force(rows, n, data):
    """Bool masks (read as padded indices before: every True column an 'index >= 0', so counts went negative)
    against counting by hand, for both ``count_other_positives``."""
    cells = np.array(data.draw(st.lists(st.sampled_from("pxi"), min_size=rows * n, max_size=rows * n))).reshape(rows, n)
    pos, exc = torch.from_numpy(cells == "p"), torch.from_numpy(cells == "x")
    for cop in (True, False):
        want = [n - int(exc[b].sum()) - (0 if cop else max(int(pos[b].sum()) - 1, 0)) for b in range(rows)]
        got = rsp.candidate_counts(n, pos, exc, count_other_positives=cop)
        assert got.tolist() == want
        # the padded-index form gives the same counts
        idx = [torch.nonzero(r).reshape(-1).tolist() for r in pos]
        width = max((len(i) for i in idx), default=0)
        padded = torch.tensor([i + [-1] * (width - len(i)) for i in idx], dtype=torch.int64).reshape(rows, width)
        assert rsp.candidate_counts(n, padded, exc, count_other_positives=cop).tolist() == want


def test_candidate_counts_refuses_what_does_not_fit_the_catalogue():
    mask = torch.zeros(3, 20, dtype=torch.bool)
    mask[:, 0] = True
    _raises_naming(lambda: rsp.candidate_counts(1, mask, None), "positives")  # was [-19, -19, -19]
    _raises_naming(lambda: rsp.candidate_counts(20, torch.tensor([[25]] * 3), None), "positives")
    _raises_naming(lambda: rsp.candidate_counts(20, mask, mask), "exclude")  # a positive also excluded
    _raises_naming(lambda: rsp.candidate_counts("20", mask, None), "n_items")


# ---------------------------------------------------------------------------------------------------- designs
def test_as_design_takes_a_design_or_an_int():
    """A SamplingDesign is returned as is, an int m is SamplingDesign(m); anything else (the 0.1 (m, cap) pair
    included) is refused naming the argument."""
    d = rsp.SamplingDesign(5, adaptive_max=20)
    assert as_design(d) is d and as_design(5) == rsp.SamplingDesign(5) and as_design(None) is None
    _raises_naming(lambda: as_design((5, 20)), "n_samples")
    _raises_naming(lambda: as_design((1, 2, 3)), "n_samples")
    _raises_naming(lambda: as_design("5"), "n_samples")
    _raises_naming(lambda: as_design(0, name="design"), "design")
    _raises_naming(lambda: rsp.SamplingDesign(10, adaptive_max=5), "adaptive_max")  # the cap below the first stage


@pytest.mark.parametrize("method", sorted(rsp.registry.names()))
def test_draws_without_replacement_of_more_items_than_exist_are_refused_by_every_method(method):
    """m = 10 draws without replacement among n - 1 = 4 irrelevant items cannot happen: the mappings (which assume
    no law) gave a number, the others refused; now every method refuses, naming n_samples."""
    extra = {"a": 1.0} if method == "beta" else {}
    _raises_naming(lambda: rsp.estimate(
        "hit@1",
        rsp.SampledRanks.from_arrays(torch.tensor([2, 1]), 5, 10, rsp.SamplingDesign(10, replacement=False)),
        rsp.registry.method_class(method)(**extra),
    ), "n_samples")
    if method == "linear":  # with replacement the same data are fine: f(1) = 1, so HR@1 = SHR@1 = share of r~ = 1
        est = rsp.estimate("hit@1", rsp.SampledRanks.from_arrays(torch.tensor([2, 1]), 5, 10), method)
        assert est.value == pytest.approx(0.5)


# ------------------------------------------------------------------------------------------ options not used
def test_rounding_is_refused_where_the_method_does_not_use_it():
    _raises_naming(lambda: correction_table("ndcg@10", 100, 10, rsp.registry.Bv(rounding="linear")), "rounding")
    _raises_naming(lambda: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(RT, 100, 10),
        rsp.registry.Cls(rounding="linear"),
    ), "rounding")
    # rank_estimate: eq. 20 with linear interpolation, against the closed form M(1 + (n - 1)(r~ - 1) / m)
    table = correction_table("recall@10", 100, 10, rsp.registry.RankEstimate(rounding="linear"))
    pos = 1 + 99 * (np.arange(1, 12) - 1) / 10
    lo = np.floor(pos)
    frac = pos - lo
    hit = lambda r: (r <= 10).astype(float)  # noqa: E731
    assert np.allclose(table.numpy(), (1 - frac) * hit(lo) + frac * hit(lo + 1))


def _cli(argv: list[str]) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main(argv)
    return rc, out.getvalue(), err.getvalue()


def test_cli_option_without_a_method_that_uses_it(tmp_path):
    f = tmp_path / "ranks.txt"
    f.write_text("1,100,10\n3,100,10\n5,100,10\n")
    rc, _, err = _cli(["estimate", str(f), "--method", "mes", "--option", "gamma=0.3", "--no-progress"])
    assert rc == 2 and err.startswith("reco-sampled: error: --option: gamma") and "Traceback" not in err
    rc, out, _ = _cli(["estimate", str(f), "--method", "bv", "--option", "gamma=0.3", "--no-progress"])
    assert rc == 0
    sample = rsp.SampledRanks.from_arrays(torch.tensor([1, 3, 5]), 100, 10)
    want = rsp.estimate("ndcg@10", sample, rsp.registry.Bv(gamma=0.3)).value
    assert f"{want:.4f}"[:5] in out  # the bv value with gamma 0.3 is printed
    rc, _, _ = _cli(["estimate", str(f), "--method", "mes", "--no-progress"])  # no --option: fine
    assert rc == 0


# --------------------------------------------------------------------------------- messages naming the argument
def test_zero_weights_name_weights():
    for call in (lambda w: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(RT, 100, 10), weights=w),
                 lambda w: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(RT, 100, 10), "mle", weights=w),
                 lambda w: rsp.identified_interval("ndcg@10", RT, 100, 10, weights=w),
                 lambda w: mapping_estimate("hit@10", RT, 100, 10, weights=w)):
        _raises_naming(lambda: call(torch.zeros(len(RT))), "weights")
    # no ranks at all
    _raises_naming(lambda: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(RT[:0], 100, 10)), "sampled_ranks")


def test_paired_difference_of_nothing_names_its_argument():
    _raises_naming(lambda: rsp.paired_difference("ndcg@10", RT[:0], RT[:0], 100, 10), "sampled_ranks_a")


@pytest.mark.parametrize("bad", [3, 1.5, object(), [3]])
def test_explain_flags_of_a_non_list(bad):
    _raises_naming(lambda: rsp.explain_flags(bad), "flags")


def test_explain_flags_still_explains():
    assert rsp.explain_flags(()) == [] and rsp.explain_flags(None) == []
    assert [s.split(":")[0] for s in rsp.explain_flags(["few_instances", "few_instances"])] == ["few_instances"]


def test_adaptive_cost_checks_its_arguments():
    hist = rsp.sampled_rank_histogram(torch.tensor([1, 2, 3]), 1000, torch.tensor([40, 10, 20]))
    _raises_naming(lambda: rsp.adaptive_cost("x", rsp.AdaptiveDesign(10, 40)), "hist")
    _raises_naming(lambda: rsp.adaptive_cost(hist, "x"), "design")
    _raises_naming(lambda: rsp.adaptive_cost(hist, rsp.SamplingDesign(10)), "design")  # not adaptive
    empty = rsp.sampled_rank_histogram(torch.tensor([1]), 1000, 10, weights=torch.zeros(1))
    _raises_naming(lambda: rsp.adaptive_cost(empty, rsp.AdaptiveDesign(10, 40)), "hist")  # was NaN
    _raises_naming(lambda: rsp.adaptive_cost(hist, (10, 40)), "design")  # a design is a SamplingDesign, not a pair
    c = rsp.adaptive_cost(hist, rsp.SamplingDesign(10, adaptive_max=40))
    assert c.mean_samples == pytest.approx((40 + 10 + 20) / 3) and c.max_samples == 40
    assert c.share_at_cap == pytest.approx(1 / 3)


def _pilot(ranks, n_items=100, n_samples=None, design=None) -> rsp.SampledRanks:
    """A pilot's SampledRanks built from parts (no checks: the planner checks them)."""
    return rsp.SampledRanks(ranks, n_items, design=rsp.SamplingDesign(10) if design is None else design,
                            n_samples=n_samples)


@pytest.mark.parametrize("pilot, name", [
    (_pilot(torch.tensor([NAN, 1.0])), "pilot.ranks"),
    ("abc", "pilot"),
    (_pilot("abc"), "pilot.ranks"),
    (_pilot(torch.tensor([50])), "pilot.ranks"),  # r~ > m + 1
    (_pilot(RT, torch.tensor(100), n_samples=torch.tensor(NAN)), "pilot.n_samples"),
    (_pilot(RT, "100"), "pilot.n_candidates"),
    (_pilot(RT, torch.full((3,), 100)), "pilot"),  # 3 candidate counts for 10 ranks
    (rsp.SampledRanks(RT, torch.tensor(100)), "pilot"),  # no design
    # adaptive: sizes that are not stages of the design
    (_pilot(RT, torch.tensor(100), torch.full((10,), 10), rsp.SamplingDesign(4, adaptive_max=16)), "pilot"),
])
def test_plan_pilot_arguments_are_named(pilot, name):
    _raises_naming(lambda: planner.plan(1000, 100, "ndcg@10", 0.1, repeats=2, pilot=pilot,
                                              execution=planner.PlanExecution(progress=False)), name)


# ------------------------------------------------------------------------------------------ datasets, baselines
def test_datasets_arguments(tmp_path):
    _raises_naming(lambda: datasets.load_interactions(3), "path")
    missing = str(tmp_path / "none.csv")
    with pytest.raises(ValueError, match="none.csv"):  # a ValueError with the path ...
        datasets.load_interactions(missing)
    with pytest.raises(FileNotFoundError):  # ... that is still the FileNotFoundError callers catch
        datasets.load_interactions(missing)
    _raises_naming(lambda: datasets.binarize("x", 3.0), "interactions")
    _raises_naming(lambda: datasets.leave_last_out("x"), "interactions")


def test_baselines_arguments():
    x = sp.csr_matrix(np.array([[1.0, 0, 1], [0, 1, 0]]))
    with pytest.raises(TypeError, match="^train"):  # the documented type, and a ValueError too
        baselines.Popularity().fit(x.toarray())
    _raises_naming(lambda: baselines.Popularity().fit(x.toarray()), "train")
    nan = x.copy()
    nan.data[0] = NAN
    _raises_naming(lambda: baselines.Popularity().fit(nan), "train")  # NaN != 0 was an interaction
    with pytest.raises(RuntimeError, match="fit"):
        baselines.EASE().score(np.arange(2))
    with pytest.raises(ValueError, match="fit"):
        baselines.EASE().score(np.arange(2))
    pop = baselines.Popularity().fit(x)
    _raises_naming(lambda: pop.score("a"), "users")
    assert torch.equal(pop.score(np.array([0, 1])).cpu().to(torch.float64),
                       torch.tensor([[1.0, 1.0, 1.0]] * 2, dtype=torch.float64))  # item counts 1, 1, 1
    _raises_naming(lambda: baselines.held_out_ranks("x", None), "models")
    _raises_naming(lambda: baselines.held_out_ranks({"pop": pop}, None), "split")


# ------------------------------------------------------------------------------------ memory that grows with m
def test_draws_that_grow_with_m_or_repeats_are_refused_before_allocating():
    """sampled_ranks held B x P x m negatives (64 x 1 x 2^24: an 8 GiB allocation failing as a RuntimeError) and
    draw_sampled_ranks repeats x ranks (10^9 x 2: 15 GiB, a MemoryError): both refused naming the argument."""
    scores = torch.randn(64, 100)
    pos = torch.zeros(64, 100, dtype=torch.bool)
    pos[:, 0] = True
    msg = _raises_naming(lambda: rsp.sampled_ranks(scores, pos, 1 << 24), "n_samples")
    assert str(MAX_ELEMENTS) in msg
    _raises_naming(lambda: rsp.draw_sampled_ranks(torch.tensor([1, 5]), 1000, 100, repeats=10**9), "repeats")
    # just below the bound both still run
    assert rsp.sampled_ranks(scores[:2], pos[:2], 1000).ranks.shape == (2, 1)
    assert rsp.draw_sampled_ranks(torch.tensor([1, 5]), 1000, 100, repeats=1000).shape == (1000, 2)


def test_adaptive_sampled_ranks_takes_scores_as_sampled_ranks_does():
    """Lists of scores reached ``scores.device`` (an AttributeError); arrays, lists and tensors now give the same
    draws for the same generator, and bad scores are named."""
    scores = torch.randn(4, 20, generator=torch.Generator().manual_seed(3))
    pos = torch.zeros(4, 20, dtype=torch.bool)
    pos[:, 0] = True

    def draw(s, p):
        return rsp.adaptive_sampled_ranks(s, p, rsp.SamplingDesign(5, adaptive_max=20),
                                          generator=torch.Generator().manual_seed(0)).ranks

    want = draw(scores, pos)
    assert torch.equal(draw(scores.numpy(), pos.numpy()), want)
    assert torch.equal(draw(scores.tolist(), pos.tolist()), want)
    _raises_naming(lambda: draw("abc", pos), "scores")
    _raises_naming(lambda: draw(scores.to_sparse(), pos), "scores")


@pytest.mark.parametrize("replacement", [True, False])
def test_keyed_draws_in_row_chunks_equal_the_whole_batch(replacement):
    """The torchmetrics classes (and the Lightning callback) draw B x P x m negatives; a batch of 256 users at
    m = 2^20 asked for 2 GiB at once (a RuntimeError from the allocator under a 3 GiB cap). They now draw in row
    chunks, which is exact because the keys are per row: any split of the rows gives the whole batch's ranks."""
    from reco_sampled_plugin._keyed import FactorScores, MatrixScores, RowKeys, keyed_negatives, keyed_ranks

    g = torch.Generator().manual_seed(0)
    b, n, m = 40, 300, 50
    design = rsp.SamplingDesign(m, replacement=replacement)
    scores = torch.randn(b, n, generator=g)
    pos = torch.randint(0, n, (b, 3), generator=g)
    pos[::2, 2] = -1
    keys = RowKeys.of(5, torch.arange(b) * 7, scores.device)

    def ranks(source, rows):
        return keyed_ranks(source.take(rows), pos[rows], None, n, design, keys.take(rows), "pessimistic").ranks

    whole = ranks(MatrixScores(scores), slice(None))
    parts = [ranks(MatrixScores(scores), slice(lo, lo + 7)) for lo in range(0, b, 7)]
    assert torch.equal(torch.cat(parts), whole)
    u, v = torch.randn(b, 4, generator=g), torch.randn(n, 4, generator=g)
    whole = ranks(FactorScores(u, v), slice(None))
    parts = [ranks(FactorScores(u, v), slice(lo, lo + 7)) for lo in range(0, b, 7)]
    assert torch.equal(torch.cat(parts), whole)
    # the ranks themselves, by brute force from the keyed negatives: 1 + drawn items scoring at least as high
    neg = keyed_negatives(pos, None, n, design, keys).numpy()
    s, ps = scores.numpy(), pos.numpy()
    want = [[1 + int((s[i, neg[i, j]] >= s[i, ps[i, j]]).sum()) if ps[i, j] >= 0 else 0 for j in range(3)]
            for i in range(b)]
    assert ranks(MatrixScores(scores), slice(None)).tolist() == want


def test_torchmetrics_state_refuses_a_row_too_wide_to_draw():
    """One user's P x m above MAX_ELEMENTS cannot be chunked: refused naming n_samples."""
    metric = SampledRankingMetrics(n_samples=1 << 24, estimators=("none",))
    pos = torch.arange(16).reshape(1, 16)  # 16 positives x 2^24 = 2^28 draws for one user
    _raises_naming(lambda: metric.update(torch.randn(1, 100), pos), "n_samples")


def test_the_abstract_prior_is_refused_by_name():
    """``Prior()`` (the base class of ``reco_sampled_plugin.priors``) reached its NotImplementedError inside the corrections."""
    _raises_naming(lambda: correction_table("ndcg@10", 100, 10, rsp.registry.Bv(prior=Prior())), "prior")
    _raises_naming(lambda: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(RT, 100, 10),
        rsp.registry.Bv(prior=Prior()),
    ), "prior")
    # its subclasses as before: a uniform prior object is the default
    assert torch.equal(correction_table("ndcg@10", 100, 10, rsp.registry.Bv(prior=UniformPrior())),
                       correction_table("ndcg@10", 100, 10))


def test_a_huge_entropy_weight_is_served_not_overflowed():
    """lam = 1e300 (found by the fuzz suite's long profile) overflowed inside the L-BFGS (a RuntimeWarning, then
    NaN); the objective is now divided by max(lam, 1), so any finite weight gives the base measure's value without a
    warning: 1e12, 1e100 and 1e300 agree."""
    ranks = torch.tensor([1, 2, 3, 5, 8, 13, 21, 1, 1, 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        sample = rsp.SampledRanks.from_arrays(ranks, 500, 30)
        a, b, c = (rsp.estimate("ndcg@10", sample, rsp.registry.Mes(lam=lam)).value for lam in (1e12, 1e100, 1e300))
    assert a == pytest.approx(b, rel=1e-6) and b == pytest.approx(c, rel=1e-6)
