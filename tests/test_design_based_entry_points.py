"""The exact share (``SamplingDesign(m, exact_share=...)``) at the entry points outside the core draws: the torchmetrics
class (score, factor and scorer batches; merge, forward, reset), ``evaluate_factors`` and rank files with the
``exact_rank`` / ``inclusion`` columns through ``reco-sampled estimate``.

The accelerator's form of the torchmetrics class (a static capacity of rows, nothing read back; forced on the CPU
with ``_READS_ON_CPU = False``) gives the same share; its overflow is refused at compute.

Oracle: the core's ``estimate(metric, SampledRanks.from_arrays(..., share_ranks=, inclusion=))`` on the same keyed
draws, the chosen positives' exact ranks from ``exact_ranks`` of the materialised score matrix and the keyed choice
``keyed_uniform(share seed, user id, item) < pi`` written out here.
"""

from __future__ import annotations

import functools

import numpy as np
import pytest
import scipy.sparse as sp
import torch
from hypothesis import given, settings, strategies as st

import reco_sampled_plugin as rsp
from _popularity_helpers import canonical_rows
from _profiles import examples
from reco_sampled_plugin._hash import keyed_uniform
from reco_sampled_plugin._keyed import MatrixScores, RowKeys, keyed_ranks
from reco_sampled_plugin.adapters import torchmetrics as tm
from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics
from reco_sampled_plugin.adapters._shared import RankingSettings
from reco_sampled_plugin.design import ExactShare, SamplingDesign
from reco_sampled_plugin.factors import evaluate_factors
from reco_sampled_plugin.ranking import exact_ranks_padded, padded_candidate_counts

N_ITEMS, M, SHARE, SEED = 300, 20, 0.3, 3
DESIGN = SamplingDesign(M, exact_share=ExactShare(SHARE, seed=5))


def _batch(b: int = 160, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    u, v = torch.randn(b, 6, generator=g, dtype=torch.float64), torch.randn(N_ITEMS, 6, generator=g, dtype=torch.float64)
    pos = torch.stack([torch.randperm(N_ITEMS, generator=g)[:2] for _ in range(b)])
    pos[::7, 1] = -1  # some rows hold one positive
    return u, v, pos, torch.arange(b) + 1000


def _core(scores, pos, ids, design=DESIGN, seed=SEED):
    """The core's SampledRanks of the adapter's keyed draws with the share chosen and ranked here."""
    share = design.exact_share
    kr = keyed_ranks(MatrixScores(scores), pos, None, N_ITEMS, design, RowKeys.of(seed, ids, scores.device),
                     "pessimistic")
    valid = pos >= 0
    chosen = valid & (keyed_uniform(share.seed, ids.view(-1, 1), pos.clamp(min=0)) < share.share)
    exact = exact_ranks_padded(scores, pos, None, "pessimistic", False)
    n = padded_candidate_counts(N_ITEMS, pos, None, False).unsqueeze(1).expand(pos.shape)
    return rsp.SampledRanks.from_arrays(kr.ranks, torch.where(valid, n, 0), M, design,
                                        share_ranks=torch.where(chosen, exact, 0),
                                        inclusion=torch.where(valid, torch.tensor(SHARE, dtype=torch.float64), 0.0))


def _metric(**kw):
    return SampledRankingMetrics(["ndcg@10", "hit@10"], DESIGN, estimators=["none", "auto", "diff"], seed=SEED, **kw)


def _feed(metric, source: str, u: torch.Tensor, v: torch.Tensor, pos: torch.Tensor, ids: torch.Tensor) -> None:
    """``metric`` updated in batches of 48 users from ``source``: score matrices, factors or a scorer of the pairs."""
    scores = u @ v.T
    for s in range(0, len(ids), 48):
        sl = slice(s, s + 48)
        if source == "scores":
            metric.update(scores[sl], pos[sl], ids=ids[sl])
        elif source == "factors":
            metric.update_factors(u[sl], v, pos[sl], ids=ids[sl])
        else:
            metric.update_from_scorer(lambda us, items: scores[us - 1000].gather(1, items), pos[sl], N_ITEMS,
                                      ids=ids[sl])


@pytest.mark.parametrize("source", ["scores", "factors", "scorer", "scores-static", "factors-static"])
def test_torchmetrics_share_equals_the_core(source, monkeypatch):
    """Every batch form gives the core's estimate: the same share rows and counts; to 1e-6 relative, since the
    adapter's histogram lists its two candidate counts n in ascending order and the core's in order of appearance,
    so the model's fit (the predictions f) adds its terms in another order and stops its iterations elsewhere.
    ``-static``: the accelerator's form on the CPU (a static capacity of rows, nothing read back): the same share."""
    if source.endswith("-static"):
        monkeypatch.setattr(tm, "_READS_ON_CPU", False)
        source = source.removesuffix("-static")
    u, v, pos, ids = _batch()
    scores = u @ v.T
    core = _core(scores, pos, ids)
    metric = _metric()
    _feed(metric, source, u, v, pos, ids)
    est = metric.estimates()
    for metric_name in ("ndcg@10", "hit@10"):
        want = rsp.estimate(metric_name, core, "auto")
        for label in ("auto", "diff"):
            got = est[f"{metric_name}/{label}"]
            assert got.details["method"] == "diff" and got.details["n_exact"] == int((core.share_ranks > 0).sum())
            assert got.value == pytest.approx(want.value, rel=1e-6), (metric_name, label)
            assert got.stderr == pytest.approx(want.stderr, rel=1e-6), (metric_name, label)
    if source == "scorer":  # the chosen rows scored whole: their candidates in the pairs
        chosen_rows = int((core.share_ranks > 0).any(1).sum())
        assert metric.scoring_cost().pairs > chosen_rows * (N_ITEMS - 2)


@functools.lru_cache(maxsize=1)
def _one_state() -> tuple:
    """``compute()``'s ndcg@10 ``auto`` and hit@10 ``auto_hi`` of one state fed ``_batch()`` at once (the same for every
    example of :func:`test_merge_forward_and_reset_equal_one_state`, so made once)."""
    u, v, pos, ids = _batch()
    one = _metric()
    one.update(u @ v.T, pos, ids=ids)
    got = one.compute()
    return got["ndcg_at_10/auto"].item(), got["hit_at_10/auto_hi"].item()


@settings(max_examples=examples(10), deadline=None)
@given(cut=st.integers(1, 159), order=st.booleans(), forward=st.booleans())
def test_merge_forward_and_reset_equal_one_state(cut, order, forward):
    """Two states merged (either order; or batches through forward) equal one state bit for bit; reset empties it."""
    u, v, pos, ids = _batch()
    scores = u @ v.T
    one_ndcg, one_hit_hi = _one_state()  # one state fed every row at once
    a, b = _metric(), _metric()
    if forward:
        a(scores[:cut], pos[:cut], ids=ids[:cut])
        a(scores[cut:], pos[cut:], ids=ids[cut:])
    else:
        a.update(scores[:cut], pos[:cut], ids=ids[:cut])
        b.update(scores[cut:], pos[cut:], ids=ids[cut:])
        (a.merge_state(b) if order else (b.merge_state(a), a := b))
    assert a.compute()["ndcg_at_10/auto"].item() == one_ndcg
    assert a.compute()["hit_at_10/auto_hi"].item() == one_hit_hi
    a.reset()
    assert a.share.shape == (0, 5) and a.hist.shape[0] == 0


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")  # the merged-into state had no update
@pytest.mark.parametrize("source", ["scores", "factors"])
def test_static_capacity_overflow_is_refused_at_compute_and_reset(source, monkeypatch):
    """The accelerator's form with a capacity too small for the batch (forced: 2 rows where about 40 hold a chosen
    positive): counted on the device, refused at compute (never a share with chosen positives missing); merged
    states carry the count; reset clears it."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    u, v, pos, ids = _batch(48)
    monkeypatch.setattr(tm, "share_capacity", lambda rows, slots, share: 2)
    metric, other = _metric(), _metric()
    (metric.update(u @ v.T, pos, ids=ids) if source == "scores" else metric.update_factors(u, v, pos, ids=ids))
    assert int(metric.share_overflow) == 1 and metric.share.shape == (2 * 2, 5)
    other.merge_state(metric)
    for m in (metric, other):
        with pytest.raises(RuntimeError, match="^exact share: in 1 batch"):
            m.compute()
    metric.reset()
    assert int(metric.share_overflow) == 0 and metric.share.shape == (0, 5)


def test_static_capacity_refuses_factors_that_could_overflow(monkeypatch):
    """The accelerator's form ranks the share's rows in tiles without reading the factors' overflow bound per batch:
    the bound of the rows holding a chosen positive joins the batch's one validation read and refuses them (float32
    scores of |u| |v| >= max / 4); a large row without a chosen positive is not ranked, so not refused."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    u, v, pos, ids = _batch(48)
    u, v = u.to(torch.float32), v.to(torch.float32)
    chosen = ((pos >= 0) & (keyed_uniform(5, ids.view(-1, 1), pos.clamp(min=0)) < SHARE)).any(1)
    big_chosen, big_other = int(chosen.nonzero()[0]), int((~chosen).nonzero()[0])
    big = torch.full((6,), 1e37)  # |u| |v| = 2.4e37 x 4.4 >= 8.5e37, every score finite (|s| <= 1.1e38)
    metric = _metric()
    metric.update_factors(torch.where(torch.arange(48).view(-1, 1) == big_other, big, u), v, pos, ids=ids)
    assert not bool(metric.failed_checks.any())  # on an accelerator the flag is kept, read at compute
    metric.update_factors(torch.where(torch.arange(48).view(-1, 1) == big_chosen, big, u), v, pos, ids=ids)
    with pytest.raises(ValueError, match=r"^user_factors: .* scores could overflow.*'factors_overflow', first failed "
                                         r"at update 2"):
        metric.compute()


def test_share_capacity_tail_is_below_1e_9():
    """The capacity's overflow probability, Binomial(T, s) beyond it (scipy), stays below 1e-9 where it is largest
    (large T, s near 0.17) and at small T; s = 1 takes every row."""
    from scipy.stats import binom

    for t, s in ((10**6, 0.1736), (10**5, 0.5), (1000, 0.05), (40, 0.3), (3, 0.01)):
        cap = tm.share_capacity(t, t, s)
        assert binom.sf(cap, t, s) < 1e-9, (t, s, cap)
    assert binom.sf(tm.share_capacity(10**6, 10**6, 0.1736), 10**6, 0.1736) > 1e-10  # 6 sigma, not more
    assert tm.share_capacity(7, 14, 1.0) == 7 and tm.share_capacity(100, 200, 0.05) == 37  # 10 + 6 (3.08) + 8
    # the picked rows: those holding a chosen slot first, in row order, then the others in row order
    chosen = torch.rand(200, 2, generator=torch.Generator().manual_seed(0)) < 0.05
    picked, over = tm.share_capacity_rows(chosen, 0.05)
    held, rest = chosen.any(1).nonzero().squeeze(1), (~chosen.any(1)).nonzero().squeeze(1)
    assert 0 < held.numel() < picked.numel() == tm.share_capacity(200, 400, 0.05) < 200 and int(over) == 0
    assert torch.equal(picked, torch.cat([held, rest])[: picked.numel()])
    assert int(tm.share_capacity_rows(torch.ones(200, 2, dtype=torch.bool), 0.05)[1]) == 1


# a popularity design with a uniform exact share: the share's R and pi travel in each positive's ``pop`` row
POP_W = torch.linspace(0.5, 3.0, N_ITEMS, dtype=torch.float64)
POP_DESIGN = SamplingDesign(M, popularity=POP_W, exact_share=ExactShare(SHARE, seed=5))


def _pop_core(scores, pos, ids):
    """The core's SampledRanks of the adapter's keyed popularity draws (their per-positive statistics) with the share
    chosen and ranked here, as ``_core``."""
    kr = keyed_ranks(MatrixScores(scores), pos, None, N_ITEMS, POP_DESIGN, RowKeys.of(SEED, ids, scores.device),
                     "pessimistic")
    plain = _core(scores, pos, ids)  # the same ExactShare: the same keyed choice and exact ranks
    return rsp.SampledRanks(kr.ranks, plain.n_candidates, None, POP_DESIGN, popularity_stats=kr.stats,
                            share_ranks=plain.share_ranks, inclusion=plain.inclusion)


def _pop_metric():
    return SampledRankingMetrics(["ndcg@10", "hit@10"], POP_DESIGN, estimators=["none", "auto", "diff"], seed=SEED)


@pytest.fixture(scope="module")
def pop_core():
    """The core's SampledRanks of ``_batch(96)``'s keyed popularity draws with the share (:func:`_pop_core`) and its
    ``auto`` estimates, made once for every batch form."""
    u, v, pos, ids = _batch(96)  # pl_fit's cost grows with the positives
    core = _pop_core(u @ v.T, pos, ids)
    return core, {name: rsp.estimate(name, core, "auto") for name in ("ndcg@10", "hit@10")}


@functools.lru_cache(maxsize=1)
def _one_pop_state() -> tuple:
    """The share ranks and estimates of one popularity state fed ``_batch(80)`` at once (the same for every example
    of :func:`test_popularity_share_is_order_free`, so made once)."""
    u, v, pos, ids = _batch(80)
    one = _pop_metric()
    one.update(u @ v.T, pos, ids=ids)
    return one.popularity_ranks().share_ranks, {k: (e.value, e.stderr) for k, e in one.estimates().items()}


@pytest.mark.parametrize("source", ["scores", "factors-static", "scorer"])
def test_torchmetrics_popularity_share_equals_the_core(source, monkeypatch, pop_core):
    """A popularity design with a uniform exact share, every batch form (``-static``: the accelerator's capacity of
    rows): each positive's state row holds the core's sampled rank, pl_fit statistics, exact rank R (the keyed
    choice, ranked on the score matrix) and pi, bit for bit; ``auto`` and ``diff`` are the core's ``estimate`` on
    those positives in the state's order bit for bit (``diff`` with ``pl_fit``'s predictions), and on the core's
    row-major order to 1e-12 (pl_fit's sums in another order)."""
    if source.endswith("-static"):
        monkeypatch.setattr(tm, "_READS_ON_CPU", False)
        source = source.removesuffix("-static")
    u, v, pos, ids = _batch(96)  # pl_fit's cost grows with the positives
    core, rowwise_of = pop_core  # _pop_core(u @ v.T, pos, ids) and its auto estimates
    metric = _pop_metric()
    _feed(metric, source, u, v, pos, ids)
    state = metric.popularity_ranks()
    assert np.array_equal(canonical_rows(state), canonical_rows(core)) and 30 < int((state.share_ranks > 0).sum()) < 120
    est = metric.estimates()
    for name in ("ndcg@10", "hit@10"):
        want, rowwise = rsp.estimate(name, state, "diff"), rowwise_of[name]
        assert want.details["model"] == "pl_fit" and want.details["n_exact"] == int((core.share_ranks > 0).sum())
        for label in ("auto", "diff"):
            got = est[f"{name}/{label}"]
            assert (got.value, got.stderr) == (want.value, want.stderr), (name, label)
            assert got.value == pytest.approx(rowwise.value, rel=1e-12) and got.stderr == pytest.approx(
                rowwise.stderr, rel=1e-12)


@settings(max_examples=examples(6), deadline=None)
@given(cut=st.integers(1, 79), order=st.booleans(), seed=st.integers(0, 2**16))
def test_popularity_share_is_order_free(cut, order, seed):
    """A popularity design with a share: the rows in any order (a permutation of the users with their ids), split
    into two states merged in either order, give one state's estimates and rows bit for bit; reset empties both."""
    u, v, pos, ids = _batch(80)
    scores = u @ v.T
    one_share_ranks, want = _one_pop_state()  # one state fed every row at once
    perm = torch.randperm(len(ids), generator=torch.Generator().manual_seed(seed))
    a, b = _pop_metric(), _pop_metric()
    a.update(scores[perm[:cut]], pos[perm[:cut]], ids=ids[perm[:cut]])
    b.update(scores[perm[cut:]], pos[perm[cut:]], ids=ids[perm[cut:]])
    (a.merge_state(b) if order else (b.merge_state(a), a := b))
    assert torch.equal(a.popularity_ranks().share_ranks, one_share_ranks)
    assert {k: (e.value, e.stderr) for k, e in a.estimates().items()} == want
    a.reset()
    assert a.pop.shape == (0, len(tm._POP_COLUMNS) + 2) and int(a.share_overflow) == 0 and not hasattr(a, "share")


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")  # the merged-into state had no update
def test_popularity_share_static_capacity_overflow_is_refused(monkeypatch):
    """The accelerator's form under a popularity design: a capacity too small for the batch is counted and refused
    at compute (and by popularity_ranks), never a share with chosen positives unranked."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    monkeypatch.setattr(tm, "share_capacity", lambda rows, slots, share: 2)
    u, v, pos, ids = _batch(48)
    metric = _pop_metric()
    metric.update(u @ v.T, pos, ids=ids)
    assert int(metric.share_overflow) == 1
    # a row per relevant item (r~ > 0), in a fixed block of one row per slot (padding r~ = 0: nothing read per batch)
    assert int((metric.pop[:, 0] > 0).sum()) == int((pos >= 0).sum()) and metric.pop.shape[0] == pos.numel()
    for read in (metric.compute, metric.popularity_ranks):
        with pytest.raises(RuntimeError, match="^exact share: in 1 batch"):
            read()


def test_torchmetrics_share_refusals():
    with pytest.raises(ValueError, match="^n_samples: an active exact share.* draw with sampled_ranks or"):
        _ = SampledRankingMetrics("ndcg@10", SamplingDesign(M, exact_share=ExactShare(0.2, choice="active")))
    with pytest.raises(ValueError, match="^n_samples: an active exact share.* draw with adaptive_sampled_ranks or"):
        _ = SampledRankingMetrics("ndcg@10", SamplingDesign(M, adaptive_max=4 * M, exact_share=ExactShare(0.2, choice="active")))
    w = torch.ones(N_ITEMS, dtype=torch.float64)
    active = SamplingDesign(M, popularity=w, exact_share=ExactShare(0.2, choice="active"))
    for build in (lambda: SampledRankingMetrics("ndcg@10", active), lambda: RankingSettings(n_samples=active)):
        with pytest.raises(ValueError, match=r"^n_samples: an active exact share \(choice='active'\) with a "
                                             r"popularity design .* its own pl_fit prediction.* the Ray adapter "
                                             r"\(adapters\.ray\.evaluate_dataset: two passes\) and the core .* take "
                                             r"it; a uniform exact share"):
            build()  # the torchmetrics class, and the settings of the Lightning callback
    with pytest.raises(ValueError, match="^exact_share: not with popularity draws without replacement"):
        SamplingDesign(M, popularity=w, replacement=False, exact_share=ExactShare(0.2))  # refused for every entry point
    state = dict(_pop_metric().metric_state)
    state["pop"] = torch.zeros(0, len(tm._POP_COLUMNS), dtype=torch.float64)  # without the share's columns
    with pytest.raises(ValueError, match="^n_samples: the incoming popularity state"):
        _pop_metric().merge_state(state)
    other = SampledRankingMetrics(["ndcg@10", "hit@10"], SamplingDesign(M), estimators=["none", "auto", "diff"],
                                  seed=SEED)
    with pytest.raises(ValueError, match="^n_samples: cannot merge"):
        _metric().merge_state(other)
    state = dict(_metric().metric_state)
    state["share"] = torch.zeros(0, 4, dtype=torch.float64)
    with pytest.raises(ValueError, match="^n_samples: the incoming exact-share state"):
        _metric().merge_state(state)


@pytest.mark.parametrize("choice", ["uniform", "active"])
def test_evaluate_factors_share_equals_the_core(choice):
    """evaluate_factors' design-based estimate is the core's on its sampled ranks, the share chosen by user index and
    item with pi from the whole sample (``share_inclusion``), exact ranks from the score matrix."""
    from reco_sampled_plugin._design_based import share_inclusion

    rng = np.random.default_rng(0)
    users, items, d = 120, 250, 6
    uf, vf = rng.normal(size=(users, d)), rng.normal(size=(items, d))
    test = sp.csr_matrix((np.ones(users), (np.arange(users), rng.integers(0, items, users))), shape=(users, items))
    design = SamplingDesign(M, exact_share=ExactShare(0.4, choice=choice, metric="hit@10", seed=2))
    res = evaluate_factors(None, test, uf, vf, k=10, metrics=["ndcg@10"], n_samples=design, method="auto", seed=4)
    s = res.sampled
    drawn = rsp.SampledRanks.from_arrays(s.sampled_ranks, s.n_candidates, M, design)
    pi = torch.as_tensor(share_inclusion(drawn, design.exact_share))
    chosen = keyed_uniform(2, s.users, s.items) < pi
    full = rsp.exact_ranks(torch.as_tensor(uf @ vf.T)[s.users], s.items.view(-1, 1)).view(-1)
    assert torch.equal(s.share_ranks, torch.where(chosen, full, 0)) and torch.equal(s.inclusion, pi)
    core = rsp.SampledRanks.from_arrays(s.sampled_ranks, s.n_candidates, M, design, share_ranks=s.share_ranks,
                                        inclusion=pi)
    want, got = rsp.estimate("ndcg@10", core, "auto"), res.estimates["NDCG@10"]
    assert got.details["method"] == "diff" and (got.value, got.stderr) == (want.value, want.stderr)
    assert res.summary.loc["NDCG@10", "corrected"] == want.value


@pytest.mark.parametrize("choice", ["uniform", "active"])
def test_rank_file_round_trip_and_cli(tmp_path, capsys, choice):
    """write_rank_file -> read_rank_file -> estimate equals the draw's estimate; the CLI prints auto:diff's value."""
    from reco_sampled_plugin.cli import main
    from reco_sampled_plugin.rank_files import read_rank_file, write_rank_file

    u, v, pos, _ = _batch(100)
    design = SamplingDesign(M, exact_share=ExactShare(0.3, choice=choice, seed=1))
    s = rsp.sampled_ranks(u @ v.T, pos, design, generator=torch.Generator().manual_seed(1))
    path = write_rank_file(tmp_path / "r.csv", s)
    back = read_rank_file(path).sampled()
    want = rsp.estimate("ndcg@10", s, "auto")
    got = rsp.estimate("ndcg@10", back, "auto")
    assert (got.value, got.stderr) == (want.value, want.stderr) and got.details["method"] == "diff"
    assert main(["estimate", str(path), "--metric", "ndcg@10"]) == 0
    line = next(ln for ln in capsys.readouterr().out.splitlines() if "auto:diff" in ln)
    assert f"{want.value:.5f}" in line


@pytest.mark.parametrize("body, match", [
    ("sampled_rank,n_candidates,n_samples,exact_rank\n1,100,10,3\n", "needs the header"),
    ("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n1,100,10,3\n", ":2: expected 5 fields"),
    ("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n1,100,10,101,0.5\n", ":2: exact_rank 101 outside"),
    ("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n1,100,10,0,0.5\n", ":2: exact_rank 0 outside"),
    ("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n1,100,10,3,0\n", ":2: inclusion '0' must be"),
    ("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n1,100,10,3,\n", ":2: empty field"),
    ("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n12,100,10,3,0.5\n", ":2: sampled rank 12"),
    ("sampled_rank,n_candidates,n_samples,exact_rank,inclusion\n", "no ranks found"),
], ids=["no-inclusion", "short-line", "rank-above-n", "zero-rank", "zero-pi", "empty-pi", "bad-sampled", "empty"])
def test_rank_file_share_bad_input(tmp_path, body, match):
    from reco_sampled_plugin.rank_files import RankFile, read_rank_file

    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ValueError, match=match):
        read_rank_file(path)
    one = np.ones(2, dtype=np.int64)
    with pytest.raises(ValueError, match="^exact_rank: give exact_rank and inclusion together"):
        RankFile(one, one * 10, one, exact_rank=one)
    with pytest.raises(ValueError, match="^inclusion: entry 1 is 1.5"):
        RankFile(one, one * 10, one, exact_rank=one, inclusion=np.array([0.5, 1.5]))
