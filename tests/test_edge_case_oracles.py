"""Silent wrong numbers at the edges. Each case found is pinned here against an independent oracle (brute
force, closed forms), and the dimensions it sits on are fuzzed with hypothesis:

* NaN leaking into an average: a user with no irrelevant candidate left (AUC 0/0) must be left out, not NaN * 0;
* merging states that do not belong together (``_MergeChecked``: ``merge_state``, ``forward``, DDP sync): refused
  with a ValueError naming what differs; compatible merges equal one state's accumulation;
* every result type carries its range and flags (``estimate`` of a correction table, ``paired_difference``);
* sampled ranks the design cannot produce (r~ in 2..m with n = 2) refused by every estimator (one shared check);
* numbers truncated or dropped without a word: fractional ranks (``empirical_prior``), a non-integer ``n_items``
  (``consistency_report``), a NaN threshold (``binarize``, loaders), complex input (splits, factors),
  ``Estimate.from_values`` with NaN, the ``pooled_n`` flag of the torchmetrics histogram; NaN in every numeric
  argument.
"""

from __future__ import annotations

import math
import socket
import warnings

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import _forkserver
import reco_sampled_plugin as rsp
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin.corrections import correction_table
from reco_sampled_plugin.user_metrics import user_metric_values
from reco_sampled_plugin import baselines, datasets, planner, registry
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics
from reco_sampled_plugin._estimate import Estimate
from reco_sampled_plugin.design import ExactShare
from reco_sampled_plugin.priors import empirical_prior
from reco_sampled_plugin.sampling_laws import sampled_rank_pmf

FAST = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
NAN = float("nan")


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # compute-before-update and top_unresolved explanations
        yield


# ------------------------------------------------------------------------------ AUC of users without a competitor
def _auc_oracle(scores: np.ndarray, pos: np.ndarray, exc: np.ndarray, count_other_positives: bool) -> float:
    """Brute force: per relevant item with at least one competitor (an irrelevant candidate; with
    ``count_other_positives`` any other candidate), the share of competitors it beats (distinct scores), averaged
    over those relevant items (NaN when none has one)."""
    values = []
    for b in range(scores.shape[0]):
        irr = ~pos[b] & ~exc[b]
        for j in np.flatnonzero(pos[b]):
            above_irr = (scores[b, irr] > scores[b, j]).sum()
            if count_other_positives:  # rank r among all candidates: the other positives compete too
                others = pos[b].copy()
                others[j] = False
                n = irr.sum() + others.sum() + 1
                if n > 1:  # AUC needs a competitor
                    r = 1 + above_irr + (scores[b, others] > scores[b, j]).sum()
                    values.append((n - r) / (n - 1))
            elif irr.sum() > 0:  # AUC needs an irrelevant candidate
                values.append(1.0 - above_irr / irr.sum())
    return float(np.mean(values)) if values else math.nan


@st.composite
def _masks(draw):
    b = draw(st.integers(1, 5))
    n = draw(st.integers(1, 7))
    cells = draw(st.lists(st.sampled_from("pxi"), min_size=b * n, max_size=b * n))  # positive, excluded, irrelevant
    grid = np.array(cells).reshape(b, n)
    if draw(st.booleans()):
        grid[0] = "p"  # one user with every item positive: no irrelevant candidate at all
    seed = draw(st.integers(0, 2**31 - 1))
    return grid == "p", grid == "x", seed


def test_auc_of_a_user_without_irrelevant_candidate_is_left_out():
    """The case found: one user with every item positive made the whole evaluation's AUC NaN (NaN * 0)."""
    scores = torch.tensor([[0.3, 0.1, 0.2, 0.4], [0.9, 0.1, 0.5, 0.3]])
    pos = torch.tensor([[True] * 4, [False, True, False, False]])
    m = ExactRankingMetrics(["auc", "ndcg@5"])
    m.update(scores, pos)
    out = m.compute()
    assert float(out["auc/exact"]) == pytest.approx(0.0)  # the second user's item beats none of its 3 competitors
    est = m.estimates()["auc/exact"]
    assert est.n_instances == 1 and "few_instances" in est.flags  # only that one relevant item counts for AUC
    only_first = ExactRankingMetrics(["auc"])
    only_first.update(scores[:1], pos[:1])
    e = only_first.estimates()["auc/exact"]
    assert math.isnan(e.value) and "no_instances" in e.flags  # nothing defined: the documented NaN, flagged


@FAST
@given(masks=_masks(), cop=st.booleans(), factors=st.booleans())
def test_exact_auc_matches_brute_force_with_users_without_competitors(masks, cop, factors):
    pos, exc, seed = masks
    g = torch.Generator().manual_seed(seed)
    b, n = pos.shape
    if factors:
        u, v = torch.randn(b, 3, generator=g, dtype=torch.float64), torch.randn(n, 3, generator=g, dtype=torch.float64)
        scores = u @ v.T
    else:
        scores = torch.randperm(b * n, generator=g).reshape(b, n).to(torch.float64)  # distinct: no ties
    if len(torch.unique(scores)) < scores.numel():
        return
    m = ExactRankingMetrics(["auc", "hit@1"], count_other_positives=cop)
    if factors:
        m.update_factors(u, v, torch.from_numpy(pos), torch.from_numpy(exc))
    else:
        m.update(scores, torch.from_numpy(pos), torch.from_numpy(exc))
    want = _auc_oracle(scores.numpy(), pos, exc, cop)
    got = float(m.compute()["auc/exact"])
    if math.isnan(want):
        assert math.isnan(got) and "no_instances" in m.estimates()["auc/exact"].flags
    else:
        assert got == pytest.approx(want, abs=1e-12)
    assert not math.isnan(float(m.compute()["hit_at_1/exact"])) or not pos.any()


@pytest.mark.parametrize("ties", ["pessimistic", "average"])
def test_auc_left_out_with_ties_average(ties):
    """The tie-expectation path (ties="average") leaves the user out as well."""
    scores = torch.tensor([[0.5, 0.5, 0.5], [0.2, 0.7, 0.7]])
    pos = torch.tensor([[True, True, True], [True, False, False]])
    m = ExactRankingMetrics(["auc"], ties=ties)
    m.update(scores, pos)
    assert float(m.compute()["auc/exact"]) == 0.0  # user 2's item is below both competitors


# ------------------------------------------------------------------------------------------- merges of states
def _data(n_items: int, seed: int, b: int = 24):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n_items, generator=g)
    pos = torch.randint(0, n_items, (b, 2), generator=g)
    pos[: b // 2, 1] = -1  # padded: one or two positives per row
    pos[:, 1] = torch.where(pos[:, 1] == pos[:, 0], -1, pos[:, 1])
    return scores, pos


SAMPLED_BASE = dict(metrics=("hit@5", "ndcg@10"), n_samples=10, estimators=("none", "bv"))
# one field changed at a time, and the name the refusal must start with
SAMPLED_CHANGES = {
    "n_samples": ("n_samples", {"n_samples": 12}),
    "replacement": ("n_samples", {"n_samples": rsp.SamplingDesign(10, replacement=False)}),
    "adaptive": ("n_samples", {"n_samples": rsp.SamplingDesign(10, adaptive_max=40), "estimators": ("none",)}),
    "metrics": ("metrics", {"metrics": ("hit@5", "ndcg@5")}),
    "estimators": ("estimators", {"estimators": ("none", "cls")}),
    "method options": ("estimators", {"estimators": ("none", registry.Bv(gamma=0.3))}),
    "ties": ("ties", {"ties": "optimistic"}),
    "max_n_groups": ("max_n_groups", {"max_n_groups": 3}),
}


def _filled(kw: dict, n_items: int = 40, seed: int = 0):
    m = SampledRankingMetrics(**kw)
    scores, pos = _data(n_items, seed)
    m.update(scores, pos, ids=torch.arange(seed * 100, seed * 100 + scores.shape[0]))
    return m


def test_merge_of_another_catalogue_is_refused_not_misread():
    """The case found: a state of another catalogue merged into one of 100 items read the other's rows under
    n = 100 (bv hit@10 0.004 where the right merge gives 0.10)."""
    a = _filled(dict(SAMPLED_BASE), n_items=100, seed=1)
    b = _filled(dict(SAMPLED_BASE), n_items=300, seed=2)
    before = a.hist.clone()
    with pytest.raises(ValueError, match=r"^n_items: the incoming state counts a catalogue of 300 items, this one 100"):
        a.merge_state(b)
    with pytest.raises(ValueError, match=r"^n_items"):
        a.merge_state(dict(b.metric_state))
    assert torch.equal(a.hist, before)  # nothing was added


@pytest.mark.parametrize("kind", ["exact", "sampled", "popularity", "adaptive", "share"])
def test_merge_of_a_state_dict_with_non_finite_values_is_refused(kind):
    """A ``metric_state`` dict is checked for values too: a NaN or inf sum or histogram (every output NaN with no
    flag, or a later error naming ``counts``) is refused naming the state, nothing added; the metric's own states,
    every design's, merge."""
    scores, pos = _data(100, 3)
    designs = {"sampled": 10, "popularity": rsp.SamplingDesign(10, popularity=torch.rand(100) + 0.1),
               "adaptive": rsp.SamplingDesign(10, adaptive_max=40),
               "share": rsp.SamplingDesign(10, exact_share=ExactShare(0.3))}
    make = (lambda: ExactRankingMetrics(("ndcg@10",))) if kind == "exact" else (
        lambda: SampledRankingMetrics(("ndcg@10",), designs[kind], estimators=("none",)))
    a, b = make(), make()
    for m, seed in ((a, 0), (b, 1)):
        m.update(scores, pos, **({} if kind == "exact" else {"ids": torch.arange(seed * 100, seed * 100 + 24)}))
    a.merge_state(dict(b.metric_state))  # finite: taken
    name = "sums" if kind == "exact" else "hist"
    before = {k: v.clone() for k, v in a.metric_state.items()}
    for bad in (math.nan, math.inf):
        state = dict(b.metric_state)
        state[name] = state[name].clone().reshape(-1).index_fill(0, torch.tensor([0]), bad).reshape(state[name].shape)
        with pytest.raises(ValueError, match=rf"^incoming_state: '{name}' holds NaN or inf"):
            a.merge_state(state)
        assert all(torch.equal(v, before[k]) for k, v in a.metric_state.items())


def test_forward_with_another_catalogue_is_refused():
    a = SampledRankingMetrics(**SAMPLED_BASE)
    s, p = _data(40, 0)
    a(s, p)
    before = a.hist.clone()
    s2, p2 = _data(50, 1)
    with pytest.raises(ValueError, match=r"^scores: 50 items, but earlier batches had 40"):
        a(s2, p2)
    assert torch.equal(a.hist, before)


def test_loaded_state_keeps_its_catalogue():
    """A state loaded from a state dict counts its catalogue: a batch of another size is refused."""
    a = _filled(dict(SAMPLED_BASE), n_items=50)
    a.persistent(True)
    b = SampledRankingMetrics(**SAMPLED_BASE)
    b.persistent(True)
    b.load_state_dict(a.state_dict())
    s, p = _data(60, 3)
    with pytest.raises(ValueError, match=r"^scores: 60 items, but earlier batches had 50"):
        b.update(s, p)


@FAST
@given(change=st.sampled_from(sorted(SAMPLED_CHANGES)), as_dict=st.booleans())
def test_merge_of_differently_configured_sampled_states_is_refused(change, as_dict):
    name, kw = SAMPLED_CHANGES[change]
    a = _filled(dict(SAMPLED_BASE), seed=0)
    b = _filled({**SAMPLED_BASE, **kw}, seed=1)
    before = a.hist.clone()
    shape_differs = b.hist.shape[1] != a.hist.shape[1]
    if as_dict and not shape_differs:
        a.merge_state(dict(b.metric_state))  # a dict carries no settings: same shapes and catalogue are accepted
        return
    with pytest.raises(ValueError, match=rf"^{name}: "):
        a.merge_state(dict(b.metric_state) if as_dict else b)
    assert torch.equal(a.hist, before)


@FAST
@given(seeds=st.lists(st.integers(0, 50), min_size=2, max_size=4, unique=True), order=st.randoms())
def test_compatible_merges_equal_one_state(seeds, order):
    """Any number of compatible states merged, in any order, equal one state that saw every batch."""
    one = SampledRankingMetrics(**SAMPLED_BASE)
    parts = []
    for s in seeds:
        scores, pos = _data(40, s)
        ids = torch.arange(s * 100, s * 100 + scores.shape[0])
        one.update(scores, pos, ids=ids)
        part = SampledRankingMetrics(**SAMPLED_BASE)
        part.update(scores, pos, ids=ids)
        parts.append(part)
    order.shuffle(parts)
    merged = parts[0]
    for p in parts[1:]:
        merged.merge_state(p)
    rows = max(merged.hist.shape[0], one.hist.shape[0])
    pad = lambda h: torch.cat([h, h.new_zeros(rows - h.shape[0], h.shape[1])])  # noqa: E731
    assert torch.equal(pad(merged.hist), pad(one.hist))
    got, want = merged.compute(), one.compute()
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)


EXACT_CHANGES = {
    "metrics": {"metrics": ("ndcg@10", "hit@5")},  # same number of rows: only the settings can tell
    "ties": {"ties": "optimistic"},
    "count_other_positives": {"count_other_positives": True},
}


@pytest.mark.parametrize("change", sorted(EXACT_CHANGES))
def test_merge_of_differently_configured_exact_states_is_refused(change):
    base = dict(metrics=("ndcg@10", "recall@10"))
    a, b = ExactRankingMetrics(**base), ExactRankingMetrics(**{**base, **EXACT_CHANGES[change]})
    for m, seed in ((a, 0), (b, 1)):
        m.update(*_data(30, seed))
    with pytest.raises(ValueError, match=rf"^{change}: cannot merge"):
        a.merge_state(b)
    three = ExactRankingMetrics(metrics=("ndcg@10", "recall@10", "mrr"))
    three.update(*_data(30, 2))
    with pytest.raises(ValueError, match=r"^metrics: the incoming state holds sums of shape \(3, 3\)"):
        a.merge_state(dict(three.metric_state))
    with pytest.raises(ValueError, match=r"^incoming_state"):
        a.merge_state({"sums": a.sums})  # a state without its count


def test_exact_merge_equals_one_state():
    one, a, b = (ExactRankingMetrics(("ndcg@10", "auc")) for _ in range(3))
    for m, seed in ((a, 0), (b, 1)):
        s, p = _data(30, seed)
        m.update(s, p)
        one.update(s, p)
    a.merge_state(b)
    assert torch.allclose(a.sums, one.sums, rtol=0, atol=1e-12) and torch.equal(a.count, one.count)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


DDP_SCENARIOS = [  # (kind, settings of process 1, the name the refusal starts with; None: compatible)
    ("sampled", {}, None),
    ("sampled", {"n_items": 50}, "n_items"),
    ("sampled", {"n_samples": 12}, "n_samples"),
    ("exact", {"metrics": ("hit@5", "mrr")}, "metrics"),
    ("popularity_share", {}, None),  # per-positive rows (pl_fit's statistics, R and pi) gathered across processes
    ("atcap", {}, None),  # exact_at_cap: the processes' completed rows (5 and 3: padded), gathered, joined
]
# a popularity design with a uniform exact share: its rows are read in one canonical order, so DDP equals one process
POP_SHARE = dict(metrics=("hit@5", "ndcg@10"), estimators=("auto",),
                 n_samples=rsp.SamplingDesign(10, popularity=torch.linspace(1.0, 2.0, 40, dtype=torch.float64),
                                              exact_share=ExactShare(0.5, seed=1)))
# exact_at_cap: its exact-group estimate (the completed positives at their exact ranks)
AT_CAP = dict(metrics=("hit@5",), n_samples=rsp.SamplingDesign(4, adaptive_max=8, exact_at_cap=True),
              estimators=("none", registry.Mes(n_bootstrap=0)))
_KEYS = {"sampled": "hit_at_5/sampled", "exact": "hit_at_5/exact", "atcap": "hit_at_5/mes_n_bootstrap-0",
         "popularity_share": "ndcg_at_10/auto"}


def _ddp_metric(kind: str, kw: dict):
    if kind == "exact":
        return ExactRankingMetrics(**{"metrics": ("hit@5", "auc"), **kw})
    if kind == "atcap":
        return SampledRankingMetrics(**AT_CAP)
    if kind == "popularity_share":
        return SampledRankingMetrics(**{**POP_SHARE, **kw})
    return SampledRankingMetrics(**{**SAMPLED_BASE, "estimators": ("none",), **kw})


def _ddp_worker(rank: int, port: int, queue) -> None:
    import os

    import torch.distributed as dist

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    warnings.simplefilter("ignore")
    try:
        for i, (kind, other, _) in enumerate(DDP_SCENARIOS):
            kw = {} if rank == 0 else dict(other)
            n_items = kw.pop("n_items", 40)
            scores, pos = _data(n_items, rank)
            m = _ddp_metric(kind, kw)
            if kind == "exact":
                m.update(scores, pos)
            else:
                m.update(scores, pos, ids=torch.arange(rank * 100, rank * 100 + scores.shape[0]))
            try:
                queue.put((i, rank, "ok", float(m.compute()[_KEYS[kind]])))
            except ValueError as exc:
                queue.put((i, rank, "ValueError", str(exc)))
    finally:
        dist.destroy_process_group()


def test_ddp_sync_of_incompatible_states_is_refused_on_every_process():
    """Two gloo processes (fresh, their worker pickled: forked from the test process's fork server,
    tests/_forkserver.py): alike, the synced value equals one process that saw both batches; configured
    differently, every process raises the same ValueError naming the difference (no hang, no wrong sum)."""
    ctx = _forkserver.context(__name__)
    queue = ctx.Queue()
    port = _free_port()
    procs = [ctx.Process(target=_ddp_worker, args=(r, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    results = sorted(queue.get(timeout=300) for _ in range(2 * len(DDP_SCENARIOS)))
    for p in procs:
        p.join(60)
    want = {}
    for kind in ("sampled", "popularity_share", "atcap"):
        one = _ddp_metric(kind, {})
        # popularity_share: the processes' rows in the other order (the same bits: rows read in a canonical order)
        for r in ((1, 0) if kind == "popularity_share" else (0, 1)):
            s, p = _data(40, r)
            one.update(s, p, ids=torch.arange(r * 100, r * 100 + s.shape[0]))
        want[kind] = float(one.compute()[_KEYS[kind]])
    assert int((one.completed[:, 1] > 0).sum()) > 0  # the atcap metric's completed rows
    for i, (kind, _, name) in enumerate(DDP_SCENARIOS):
        got = [res[2:] for res in results if res[0] == i]
        if name is None:
            assert got == [("ok", want[kind])] * 2
        else:
            assert all(g[0] == "ValueError" and g[1].startswith(f"{name}: the processes'") for g in got), got


# ------------------------------------------------------------------------------------- ranges and flags of results
def test_paired_difference_flags_a_value_outside_its_range():
    """The case found: a difference of ls-corrected NDCGs of -8 (outside [-1, 1]) came without a flag."""
    d = rsp.paired_difference("ndcg@10", torch.tensor([1, 2]), torch.tensor([5, 11]), 1000, 10, method="ls")
    table = correction_table("ndcg@10", 1000, 10, "ls")
    va, vb = table[torch.tensor([1, 2]) - 1], table[torch.tensor([5, 11]) - 1]
    raw = d.details["unclipped_value"]
    assert raw == pytest.approx(float((va - vb).mean()))  # the oracle: the mean of the per-instance differences
    assert raw < -1 and "outside_metric_range" in d.flags and d.details["flags"] == d.flags
    assert d.value == -1.0  # the point at the range's nearest end, as estimate()'s
    assert d.metric_range == (-1.0, 1.0) and d.interval() == (-1.0, 1.0)  # clipped, never beyond
    one = rsp.paired_difference("ndcg@10", torch.tensor([1]), torch.tensor([5]), 1000, 10, method="ls")
    # NDCG@10 with one sampled bin of ~91 ranks: the top is unresolved for both models, and so is their difference
    assert one.interval() == (-1.0, 1.0) and set(one.flags) == {"few_instances", "outside_metric_range", "top_unresolved"}


@FAST
@given(ranks=st.lists(st.integers(1, 11), min_size=1, max_size=6), shift=st.integers(-5, 5),
       method=st.sampled_from(["ls", "cls", "bv", "none", "rank_estimate"]),
       metric=st.sampled_from(["ndcg@10", "hit@5", "ap", "auc"]))
def test_corrected_results_carry_range_and_flags(ranks, shift, method, metric):
    a = torch.tensor(ranks)
    b = torch.clamp(a + shift, 1, 11)
    lo, hi = (1 / 200, 1.0) if metric == "ap" else (0.0, 1.0)  # closed form: AP of one item at rank n = 200 is 1/n
    for est, bounds in ((rsp.estimate(metric, rsp.SampledRanks.from_arrays(a, 200, 10), method), (lo, hi)),
                        (rsp.paired_difference(metric, a, b, 200, 10, method=method), (lo - hi, hi - lo))):
        assert est.metric_range == bounds
        raw = est.details.get("unclipped_value", est.value)
        outside = not (bounds[0] <= raw <= bounds[1])
        assert ("outside_metric_range" in est.flags) == outside
        assert est.value == min(max(raw, bounds[0]), bounds[1])  # the point in the range
        i_lo, i_hi = est.interval()
        assert bounds[0] <= i_lo <= est.value <= i_hi <= bounds[1]  # never (-inf, inf): the range at worst
        assert (len(ranks) == 1) == ("few_instances" in est.flags)


# ------------------------------------------------------------------------- sampled ranks the design cannot produce
ESTIMATORS = ("none", "rank_estimate", "ls", "cls", "bv", "bv_mle", "linear", "bound", "beta_fit", "mle", "mes")


@pytest.mark.parametrize("method", ESTIMATORS)
def test_every_estimator_refuses_ranks_the_law_cannot_produce(method):
    """With n = 2 every draw is the one irrelevant item: r~ is 1 or m + 1. The likelihood methods refused r~ = 2;
    the corrections and mappings estimated from it."""
    with pytest.raises(ValueError, match=r"^sampled_ranks: r~ = 2 cannot occur with n_items = 2 and n_samples = 10"):
        rsp.estimate("hit@1", rsp.SampledRanks.from_arrays(torch.tensor([2, 1, 11]), 2, 10), method)


@FAST
@given(n=st.integers(2, 6), m=st.integers(1, 6), law=st.sampled_from(["binomial", "hypergeometric"]),
       r=st.integers(1, 7), method=st.sampled_from(["bv", "ls", "none", "rank_estimate"]))
def test_support_check_refuses_exactly_the_impossible_ranks(n, m, law, r, method):
    """Oracle: r~ is possible iff some exact rank 1..n gives it a positive probability under the law's pmf."""
    if r > m + 1 or (law == "hypergeometric" and m > n - 1):
        return
    pmf = sampled_rank_pmf(torch.arange(1, n + 1), n, m, law)  # (n, m + 1)
    possible = bool((pmf[:, r - 1] > 0).any())
    ranks = torch.tensor([r, 1])
    try:
        design = rsp.SamplingDesign(m, replacement=law == "binomial")
        rsp.estimate("hit@1", rsp.SampledRanks.from_arrays(ranks, n, m, design), method)
        refused = False
    except ValueError as exc:
        assert str(exc).startswith(f"sampled_ranks: r~ = {r} cannot occur"), exc
        refused = True
    assert refused == (not possible)


# ---------------------------------------------------------------------------------- truncated or dropped silently
def test_estimate_from_values_refuses_nan():
    with pytest.raises(ValueError, match=r"^values: must be finite, got nan"):
        Estimate.from_values([1.0, NAN])
    with pytest.raises(ValueError, match=r"^values"):
        Estimate.from_values(torch.tensor([1.0, math.inf]))
    with pytest.raises(ValueError, match=r"^values"):
        Estimate.from_values([1 + 1j, 2.0])
    e = Estimate.from_values([0.0, 1.0])
    assert e.value == 0.5 and e.stderr == pytest.approx(0.5)  # sd (ddof 1) 0.7071 / sqrt(2)


def test_empirical_prior_refuses_fractional_ranks_and_sizes():
    with pytest.raises(ValueError, match=r"^exact_ranks: must be whole-number ranks, got 1.5"):
        empirical_prior([1.5, 2], 10)
    with pytest.raises(ValueError, match=r"^n_items: must be whole numbers"):
        empirical_prior([1, 2], 10.5)
    with pytest.raises(ValueError, match=r"^exact_ranks: contains NaN"):
        empirical_prior([NAN, 2], 10)
    p = empirical_prior(torch.tensor([1.0, 2.0, 2.0]), 4, smoothing=0.0)  # whole floats are fine
    np.testing.assert_allclose(p.weights(4), [1 / 3, 2 / 3, 0, 0])


def test_rank_distribution_pmf_refuses_fractional_ranks():
    """``pmf(1.5)`` read rank 1's cell (numpy's int64 cast truncates); whole floats stay fine."""
    d = fit_rank_distribution(rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 3, 5, 9, 11]), 100, 10), "mle")
    with pytest.raises(ValueError, match=r"^r: must be whole-number ranks, got 1.5"):
        d.pmf([1.5])
    with pytest.raises(ValueError, match=r"^r: contains NaN"):
        d.pmf([NAN])
    np.testing.assert_array_equal(d.pmf([1.0, 7.0]), d.pmf([1, 7]))
    assert d.pmf(np.arange(1, 101)).sum() == pytest.approx(1.0)  # the oracle: a distribution over 1..n


def test_consistency_report_refuses_a_fractional_catalogue():
    ranks = {"a": torch.tensor([1, 5, 9]), "b": torch.tensor([2, 3, 40])}
    with pytest.raises(ValueError, match=r"^n_items: must be whole numbers \(a count\), got 100.5"):
        rsp.consistency_report(ranks, 100.5, 10, repeats=0)
    with pytest.raises(ValueError, match=r"^n_items"):
        rsp.consistency_report(ranks, NAN, 10, repeats=0)
    whole = rsp.consistency_report(ranks, 100.0, 10, repeats=0, metrics=("hit@5",), methods=("none",))
    assert whole["table3"][0]["exact"] == pytest.approx(2 / 3)  # ranks 1 and 5 of 1, 5, 9 at or under 5


def _interactions():
    return datasets.Interactions(user=np.array([0, 0, 1]), item=np.array([0, 1, 1]), rating=np.array([4.0, 2.0, 5.0]),
                                 timestamp=None, user_ids=np.array(["u0", "u1"]), item_ids=np.array(["i0", "i1"]))


@pytest.mark.parametrize("threshold", [NAN, math.inf, -math.inf, "3", True, 1j])
def test_threshold_must_be_a_finite_number(threshold):
    with pytest.raises(ValueError, match=r"^threshold: expected a finite number"):
        datasets.binarize(_interactions(), threshold)
    with pytest.raises(ValueError, match=r"^threshold"):  # refused before any file is read
        datasets.load_ml100k(threshold)
    with pytest.raises(ValueError, match=r"^threshold"):
        datasets.load_ml_latest_small(threshold)


def test_binarize_threshold_keeps_what_it_says():
    out = datasets.binarize(_interactions(), 4)
    assert out.user.tolist() == [0, 1] and out.item.tolist() == [0, 1] and out.rating.tolist() == [1.0, 1.0]


def test_complex_input_is_not_made_real():
    x = np.eye(4) * (1 + 1j)
    with pytest.raises(ValueError, match=r"^X: complex values"):
        rsp.split_train_test(x)
    with pytest.raises(ValueError, match=r"^X: complex values"):
        rsp.split_train_test(torch.from_numpy(x))
    with pytest.raises(ValueError, match=r"^X: complex values"):
        rsp.split_train_test(sp.csr_matrix(x))
    with pytest.raises(ValueError, match=r"^timestamps: expected real numbers"):
        rsp.leave_last_out_split(sp.csr_matrix(np.ones((3, 3))), np.ones((3, 3)) * (1 + 2j))
    with pytest.raises(ValueError, match=r"^timestamps: expected real numbers"):
        rsp.leave_last_out_split(sp.csr_matrix(np.ones((3, 3))), sp.csr_matrix(np.ones((3, 3)) * (1 + 2j)))
    train = sp.csr_matrix(np.array([[1.0, 0, 0], [0, 1, 0]]))
    with pytest.raises(ValueError, match=r"^X_test: complex values"):
        rsp.evaluate_factors(train, sp.csr_matrix(np.array([[0, 1j, 0], [0, 0, 1]])), np.ones((2, 2)), np.ones((3, 2)))


def test_torchmetrics_histogram_flags_pooled_n():
    """Pooling to max_n_groups happens before estimate() sees the histogram: the flag was lost."""
    scores, pos = _data(40, 0, b=40)
    exc = torch.arange(40).reshape(40, 1) % 7  # 7 exclusion counts: 0..6 excluded items per row
    exc = torch.where(torch.arange(6).unsqueeze(0) < exc, torch.arange(6).unsqueeze(0) + 30, -1)
    pos = pos.clamp(max=29)
    pos[:, 1] = torch.where((pos[:, 1] == pos[:, 0]) | (pos[:, 1] < 0), -1, pos[:, 1])
    kw = dict(metrics=("hit@5",), n_samples=10, estimators=("none", "bv"))
    pooled, exact = SampledRankingMetrics(**kw, max_n_groups=2), SampledRankingMetrics(**kw, max_n_groups=None)
    for m in (pooled, exact):
        m.update(scores, pos, exc, ids=torch.arange(40))
    assert exact.histogram().n_groups > 2 and pooled.histogram().n_groups <= 2
    for key, est in pooled.estimates().items():
        assert "pooled_n" in est.flags and "pooled_n" in est.details["flags"], key
    for key, est in exact.estimates().items():
        assert "pooled_n" not in est.flags, key


# ------------------------------------------------------------------------------ NaN in every numeric argument
R = torch.tensor([1, 3, 5, 11])
NAN_CASES = {
    "n_items": lambda v: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(R, v, 10), "bv"),
    "n_samples": lambda v: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(R, 100, v), "bv"),
    "gamma": lambda v: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(R, 100, 10), rsp.registry.Bv(gamma=v)),
    "max_rel_n_spread": lambda v: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(R, 100, 10),
        rsp.registry.Bv(max_rel_n_spread=v),
    ),
    "prior": lambda v: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(R, 100, 10),
        rsp.registry.Ls(prior=np.r_[np.ones(99), v]),
    ),
    "a": lambda v: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(R, 100, 10), rsp.registry.Beta(a=v)),
    "weights": lambda v: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(R, 100, 10),
        "bv",
        weights=torch.tensor([1.0, v, 1.0, 1.0]),
    ),
    "sampled_ranks": lambda v: rsp.estimate(
        "ndcg@10",
        rsp.SampledRanks.from_arrays(torch.tensor([1.0, v]), 100, 10),
        "bv",
    ),
    "smoothing": lambda v: empirical_prior([1, 2], 10, v),
    "exact_ranks": lambda v: empirical_prior([1.0, v], 10),
    "threshold": lambda v: datasets.binarize(_interactions(), v),
    "values": lambda v: Estimate.from_values([0.5, v]),
    "relevance": lambda v: user_metric_values("ndcg@5", torch.tensor([[1, 3]]), 10, relevance=torch.tensor([[1.0, v]])),
    "target_rel_error": lambda v: planner.plan(1000, 100, "hit@10", v),
    "Bv.gamma": lambda v: SampledRankingMetrics("hit@5", 10, (registry.Bv(gamma=v),)),
    "level": lambda v: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(R, 100, 10), "bv").interval(v),
    "q": lambda v: baselines.ItemKNN(q=v),
    "dense_threshold": lambda v: baselines.ItemKNN(dense_threshold=v),
    "reg": lambda v: baselines.EASE(reg=v),
    "init_std": lambda v: baselines.ImplicitALS(init_std=v),
    "alpha": lambda v: baselines.ImplicitALS(alpha=v),
}


@FAST
@given(arg=st.sampled_from(sorted(NAN_CASES)), value=st.sampled_from([NAN, math.inf, -math.inf]))
def test_non_finite_in_every_numeric_argument_is_named(arg, value):
    with pytest.raises(ValueError) as info:
        NAN_CASES[arg](value)
    name = arg.rsplit(".", 1)[-1]  # a nested option is named itself: "gamma: must lie in [0, 1]"
    assert str(info.value).startswith(name + ":"), (arg, str(info.value))
