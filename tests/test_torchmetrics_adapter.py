"""torchmetrics Metric classes in a plain torch loop equal the functional core; keyed negative sampling."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch

from reco_sampled_plugin import estimate, exact_ranks, metric_values, sampled_ranks  # noqa: E402
from reco_sampled_plugin import registry  # noqa: E402
from reco_sampled_plugin._rank_hist import sampled_rank_histogram  # noqa: E402
from reco_sampled_plugin import _hash, _keyed  # noqa: E402
from reco_sampled_plugin._hash import keyed_uniform  # noqa: E402
from reco_sampled_plugin._keyed import MatrixScores, RowKeys  # noqa: E402
from reco_sampled_plugin.adapters._shared import metric_key, padded_inputs  # noqa: E402
from reco_sampled_plugin.adapters import torchmetrics as tm  # noqa: E402
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics  # noqa: E402
from reco_sampled_plugin._estimate import Estimate  # noqa: E402
from reco_sampled_plugin.design import ExactShare, SamplingDesign  # noqa: E402
from reco_sampled_plugin.rank_distribution import pool_groups  # noqa: E402
from reco_sampled_plugin.ranking import padded_candidate_counts  # noqa: E402
from reco_sampled_plugin import SampledRanks, SamplingDesign, registry  # noqa: E402

METRICS = ("ndcg@10", "recall@5", "rr", "auc")  # canonical names (keys of the results)


def keyed_negatives(pos, exc, n_items, m, ids, seed=0, replacement=True, popularity=None):
    """The keyed negatives of m items drawn uniformly (or by ``popularity``) (``_keyed.keyed_negatives``)."""
    keys = RowKeys.of(seed, ids, pos.device)
    design = SamplingDesign(m, replacement=replacement, popularity=popularity)
    return _keyed.keyed_negatives(pos, exc, n_items, design, keys)


def keyed_sampled_ranks(scores, pos, exc, m, ids, seed=0, replacement=True):
    """(ranks, candidate counts) against the keyed negatives of uniform draws of m items from the score matrix."""
    design = SamplingDesign(m, replacement=replacement)
    keys = RowKeys.of(seed, ids, scores.device)
    ranks = _keyed.keyed_ranks(MatrixScores(scores), pos, exc, scores.shape[1], design, keys, "pessimistic").ranks
    return ranks, padded_candidate_counts(scores.shape[1], pos, exc, count_other_positives=False)


def _on(device, *tensors):
    return tuple(t.to(device) for t in tensors)


def _data(users=61, n=300, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(users, n, generator=g, dtype=torch.float64)
    scores[:, :20] = torch.round(scores[:, :20])  # ties
    order = torch.argsort(torch.rand(users, n, generator=g), dim=1)
    pos = order[:, :3].clone()
    pos[torch.arange(users) % 2 == 0, 1:] = -1  # one or three relevant items per user
    exclude = torch.zeros(users, n, dtype=torch.bool)
    for u in range(users):
        exclude[u, order[u, 3 : 3 + (u * 13) % 57]] = True
    return scores, pos, exclude


def _loop(metric, batches, **update):
    for s, p, e, i in batches:
        metric.update(s, p, e, **({"ids": i} if i is not None and isinstance(metric, SampledRankingMetrics) else {}))
    return metric


def _batches(scores, pos, exc, size, order=None, ids=True):
    idx = torch.arange(scores.shape[0]) if order is None else order
    for s in range(0, len(idx), size):
        j = idx[s : s + size]
        yield scores[j], pos[j], exc[j], (j if ids else None)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
@pytest.mark.parametrize("count_other", [False, True])
def test_exact_metric_equals_functional_core(ties, count_other, device):
    scores, pos, exc = _on(device, *_data())
    m = _loop(ExactRankingMetrics(METRICS, ties=ties, count_other_positives=count_other), _batches(scores, pos, exc, 16))
    r = exact_ranks(scores, pos, exc, ties=ties, count_other_positives=count_other)
    n_cand = 300 - exc.sum(1) - (0 if count_other else (pos >= 0).sum(1) - 1)
    valid = pos >= 0
    est = m.estimates()
    out = m.compute()
    n_flat = n_cand.unsqueeze(1).expand_as(pos)[valid]
    if ties == "average":  # the expectation over the orders of each tie group: M averaged over its positions
        cand = ~exc
        if not count_other:
            is_pos = torch.zeros_like(scores, dtype=torch.long).scatter_add_(1, pos.clamp(min=0), valid.long()) > 0
            cand = cand & ~is_pos
        s_pos = scores.gather(1, pos.clamp(min=0))
        above = ((scores.unsqueeze(1) > s_pos.unsqueeze(2)) & cand.unsqueeze(1)).sum(2)
        at_least = ((scores.unsqueeze(1) >= s_pos.unsqueeze(2)) & cand.unsqueeze(1)).sum(2) + (0 if count_other else 1)
        groups = list(zip((above + 1)[valid].tolist(), at_least[valid].tolist(), n_flat.tolist()))
    for name in METRICS:
        if ties == "average":
            v = torch.stack([metric_values(name, torch.arange(lo, hi + 1, device=scores.device), n).mean()
                             for lo, hi, n in groups])
        else:
            v = metric_values(name, r[valid], n_flat)
        ref = Estimate.from_values(v)
        assert est[f"{name}/exact"].value == pytest.approx(ref.value, abs=1e-12)
        assert est[f"{name}/exact"].stderr == pytest.approx(ref.stderr, rel=1e-9)
        assert est[f"{name}/exact"].n_instances == ref.n_instances == int(valid.sum())
        assert float(out[f"{metric_key(name)}/exact"]) == est[f"{name}/exact"].value


ESTIMATORS = ("none", "rank_estimate", "cls", "bv", "bound", "beta_fit", "mle")
OPTIONS = {"bv": {"gamma": 0.2}, "mle": {"n_bootstrap": 3}}
# the estimators as the class takes them: a name, or a method object with its options
METHODS = tuple(registry.method_class(e)(**OPTIONS[e]) if e in OPTIONS else e for e in ESTIMATORS)
LABELS = dict(zip(ESTIMATORS, ("sampled", "rank_estimate", "cls", "bv_gamma-0.2", "bound", "beta_fit",
                               "mle_n_bootstrap-3")))


def test_sampled_metric_equals_functional_core(device):
    scores, pos, exc = _on(device, *_data())
    m = SampledRankingMetrics(METRICS, n_samples=30, estimators=METHODS, max_n_groups=None)
    assert m.settings.estimators == METHODS and m.settings.labels == tuple(LABELS.values())
    _loop(m, _batches(scores, pos, exc, 16))
    p, e = padded_inputs(scores, pos, exc)
    ranks, n_cand = keyed_sampled_ranks(scores, p, e, 30, torch.arange(scores.shape[0]))
    hist = m.histogram()
    assert hist.n_groups == len(torch.unique(n_cand)) > 20 and hist.total == int((pos >= 0).sum())
    est = m.estimates()
    assert len(est) == len(METRICS) * len(ESTIMATORS)
    for name in METRICS:
        for method in ESTIMATORS:
            ref = estimate(
                name,
                SampledRanks.from_arrays(ranks, n_cand.unsqueeze(1), 30),
                registry.method_class(method)(**OPTIONS.get(method, {})),
            )
            got = est[f"{name}/{LABELS[method]}"]
            assert got.value == pytest.approx(ref.value, abs=1e-12), (name, method)
            assert got.stderr == pytest.approx(ref.stderr, rel=1e-9, abs=1e-15), (name, method)
    # pooled n groups: the same as the core estimator on the core's pooled histogram
    pooled = SampledRankingMetrics(METRICS, n_samples=30, estimators=("bv", "cls"), max_n_groups=8)
    _loop(pooled, _batches(scores, pos, exc, 16))
    ph = pool_groups(sampled_rank_histogram(ranks, n_cand.unsqueeze(1), 30), 8)[0]
    for name in METRICS:
        for method in ("bv", "cls"):
            assert float(pooled.compute()[f"{metric_key(name)}/{method}"]) == pytest.approx(estimate(name, ph, method=method).value, abs=1e-12)


def test_batching_and_order_do_not_matter_with_ids(device):
    scores, pos, exc = _on(device, *_data())
    kw = dict(metrics=("ndcg@10", "hit@10"), n_samples=25, estimators=("none", "bv"))
    a = _loop(SampledRankingMetrics(**kw), _batches(scores, pos, exc, 7))
    b = _loop(SampledRankingMetrics(**kw), _batches(scores, pos, exc, 61, order=torch.randperm(61, generator=torch.Generator().manual_seed(3))))
    assert torch.equal(a.hist, b.hist)
    assert a.compute() == b.compute()
    # without ids the running row count keys the draws: same order, any batch size, same result
    c = _loop(SampledRankingMetrics(**kw), _batches(scores, pos, exc, 5, ids=False))
    assert torch.equal(a.hist, c.hist)
    # another seed draws other negatives
    d = _loop(SampledRankingMetrics(**kw, seed=1), _batches(scores, pos, exc, 7))
    assert not torch.equal(a.hist, d.hist)


def test_keep_mask_drops_rows_and_reset(device):
    scores, pos, exc = _on(device, *_data())
    keep = torch.arange(61, device=device) % 4 != 1
    ex, sm = ExactRankingMetrics(METRICS), SampledRankingMetrics(METRICS, n_samples=10, estimators=("none",))
    ex.update(scores, pos, exc, keep=keep)
    sm.update(scores, pos, exc, ids=torch.arange(61), keep=keep)
    ex2, sm2 = ExactRankingMetrics(METRICS), SampledRankingMetrics(METRICS, n_samples=10, estimators=("none",))
    ex2.update(scores[keep], pos[keep], exc[keep])
    sm2.update(scores[keep], pos[keep], exc[keep], ids=torch.arange(61, device=device)[keep])
    assert torch.allclose(ex.sums, ex2.sums, rtol=0, atol=1e-12) and ex.count == ex2.count
    assert torch.equal(sm.hist, sm2.hist)
    sm.reset()
    assert sm.hist.shape == (0, 11)
    assert all(math.isnan(float(v)) for v in sm.compute().values())


def test_state_does_not_grow_with_users():
    g = torch.Generator().manual_seed(1)
    m = SampledRankingMetrics("hit@10", n_samples=50, estimators=("none",))
    for _ in range(20):  # 20,000 users with the same number of excluded items
        scores = torch.randn(1000, 500, generator=g)
        pos = torch.randint(0, 500, (1000,), generator=g)
        exc = (pos.unsqueeze(1) + torch.arange(1, 6)) % 500
        m.update(scores, pos, exc)
    assert m.hist.shape == (6, 51)  # n = 500 - 5 only: rows e = 0..5, one used
    assert m.histogram().n_groups == 1 and m.histogram().total == 20_000


def test_keyed_ranks_match_core_sampled_ranks_with_the_same_negatives():
    scores, pos, exc = _data()
    p, e = padded_inputs(scores, pos, exc)
    ids = torch.arange(61) * 7 + 3
    for replacement in (True, False):
        neg = keyed_negatives(p, e, 300, 40, ids, seed=5, replacement=replacement)
        ours, n_ours = keyed_sampled_ranks(scores, p, e, 40, ids, seed=5, replacement=replacement)
        core = sampled_ranks(scores, p, exclude=e, negatives=neg)  # validates: no positive or excluded item drawn
        assert torch.equal(ours, core.ranks) and torch.equal(n_ours, core.n_candidates)
        if not replacement:
            srt = torch.sort(neg, dim=2).values
            assert not bool(((srt[..., 1:] == srt[..., :-1]) & (srt[..., 1:] >= 0)).any())


def test_keyed_draws_are_uniform_and_follow_the_binomial_law():
    u = keyed_uniform(7, torch.arange(200_000))
    assert 0 <= float(u.min()) and float(u.max()) < 1
    counts = np.histogram(u.numpy(), bins=50, range=(0, 1))[0]
    chi2 = float(((counts - 4000.0) ** 2 / 4000.0).sum())
    assert chi2 < 90  # 49 degrees of freedom: p ~ 3e-4
    # small pool without replacement: every item equally likely
    pos = torch.zeros(20_000, 1, dtype=torch.int64)
    neg = keyed_negatives(pos, None, 13, 5, torch.arange(20_000), replacement=False)
    freq = torch.bincount(neg.reshape(-1), minlength=13)[1:].double()
    assert freq.sum() == 100_000 and float(((freq - freq.mean()) ** 2 / freq.mean()).sum()) < 40  # 11 dof
    # r~ - 1 ~ Binomial(m, (r - 1)/(n - 1)) for a relevant item of exact rank r
    n, m, r, users = 1000, 30, 201, 4000
    scores = -torch.arange(n, dtype=torch.float64).repeat(users, 1)  # item i has exact rank i + 1
    ranks, _ = keyed_sampled_ranks(scores, torch.full((users, 1), r - 1), None, m, torch.arange(users))
    x = ranks.double() - 1
    p = (r - 1) / (n - 1)
    assert float(x.mean()) == pytest.approx(m * p, abs=4 * math.sqrt(m * p * (1 - p) / users))
    assert float(x.var()) == pytest.approx(m * p * (1 - p), rel=0.1)


def _successive_sampling(w, allowed, m):
    """Closed form of successive sampling (each draw proportional to w among the allowed items not drawn yet) by
    enumerating every ordered m-tuple: (first-draw probabilities, inclusion probabilities, pairwise inclusion)."""
    first, inc, pair = np.zeros(len(w)), np.zeros(len(w)), np.zeros((len(w), len(w)))
    for seq in itertools.permutations(allowed, m):
        pr, left = 1.0, sum(w[j] for j in allowed)
        for j in seq:
            pr, left = pr * w[j] / left, left - w[j]
        first[seq[0]] += pr
        inc[list(seq)] += pr
        for a, b in itertools.permutations(seq, 2):
            pair[a, b] += pr
    return first, inc, pair


def test_keyed_popularity_draws_without_replacement_follow_successive_sampling(monkeypatch):
    """Popularity without replacement, keyed (an exponential race): over 40,000 keyed rows of a 7-item catalogue
    (item 0 the positive, item 4 excluded, item 2 of weight 0), the first draws, the inclusion and the pairwise
    inclusion frequencies match the closed form of successive sampling within 4.5 standard errors; no row repeats
    an item, and the positive, the excluded item and the weight-0 item are never drawn. Rows in tiles and the
    catalogue in blocks (a small RACE_TILE) draw the same items."""
    w = np.array([1.0, 2.0, 0.0, 4.0, 0.5, 6.0, 2.5])
    n, m, users = len(w), 3, 40_000
    pos, exc = torch.zeros(users, 1, dtype=torch.int64), torch.full((users, 1), 4)
    neg = keyed_negatives(pos, exc, n, m, torch.arange(users), seed=3, replacement=False,
                          popularity=torch.tensor(w))[:, 0]
    first, inc, pair = _successive_sampling(w, [1, 3, 5, 6], m)
    drawn = torch.nn.functional.one_hot(neg, n).sum(1).double()  # (users, n) counts per item
    assert float(drawn.max()) == 1 and float(drawn[:, [0, 2, 4]].sum()) == 0  # distinct; never forbidden
    got_first = torch.bincount(neg[:, 0], minlength=n).double().numpy() / users
    got_pair = (drawn.T @ drawn).numpy() / users  # the diagonal: inclusion
    for got, want in ((got_first, first), (np.diag(got_pair), inc), (got_pair, pair + np.diag(inc))):
        se = np.sqrt(want * (1 - want) / users)
        assert np.all(np.abs(got - want) <= 4.5 * se + 1e-12)
    assert got_first[1] < got_first[3] < got_first[5]  # the order of the weights (the law has resolution here)
    monkeypatch.setattr(_keyed, "RACE_TILE", 4)  # one row per tile, the catalogue in blocks of 4 items
    assert _keyed._race_tiles(1, n, m) == (1, 4)
    small = keyed_negatives(pos[:50], exc[:50], n, m, torch.arange(50), seed=3, replacement=False,
                            popularity=torch.tensor(w))[:, 0]
    assert torch.equal(small, neg[:50])


def test_keyed_popularity_draws_without_replacement_are_keyed(device):
    """Popularity without replacement on the adapters' data (several positives, exclusions, padding): the draws are
    a function of (seed, row id) alone (any batch of the rows gives the same items, and so the same state),
    distinct per positive, never a positive or an excluded item of the row (the core's check of given negatives),
    and the core ranks them to the keyed ranks. A row with a positive and fewer than m drawable items of weight > 0
    is refused; a row without one is not."""
    scores, pos, exc = _on(device, *_data())
    p, e = padded_inputs(scores, pos, exc)
    w = torch.linspace(0.2, 5.0, 300, dtype=torch.float64, device=device)
    w[::7] = 0.0  # never drawn
    design = SamplingDesign(40, replacement=False, popularity=w)
    ids = torch.arange(61, device=device) * 7 + 3
    neg = keyed_negatives(p, e, 300, 40, ids, seed=5, replacement=False, popularity=w)
    order = torch.randperm(61, generator=torch.Generator().manual_seed(1)).to(device)
    assert torch.equal(keyed_negatives(p[order], e[order], 300, 40, ids[order], seed=5, replacement=False,
                                       popularity=w), neg[order])
    srt = torch.sort(neg, dim=2).values
    valid = (p >= 0).unsqueeze(2)
    assert not bool(((srt[..., 1:] == srt[..., :-1]) & valid).any())
    assert not bool(((w[neg] == 0) & valid).any())
    core = sampled_ranks(scores, p, design, exclude=e, negatives=neg)  # validates: no positive or excluded item
    ours = _keyed.keyed_ranks(MatrixScores(scores), p, e, 300, design, RowKeys.of(5, ids, device), "pessimistic")
    assert torch.equal(ours.ranks, core.ranks) and ours.stats is None and core.popularity_stats is None
    kw = dict(metrics=("ndcg@10", "hit@10"), n_samples=design, estimators=("none",), seed=5)
    a = _loop(SampledRankingMetrics(**kw), ((s, q, x, i * 7 + 3) for s, q, x, i in _batches(scores, pos, exc, 7)))
    b = _loop(SampledRankingMetrics(**kw), ((s, q, x, i * 7 + 3) for s, q, x, i in
                                            _batches(scores, pos, exc, 61, order=order.cpu())))
    assert torch.equal(a.hist, b.hist) and a.compute() == b.compute() and float(a.hist.sum()) == float((p >= 0).sum())
    few = torch.zeros(300, dtype=torch.float64, device=device)
    few[:45] = 1.0  # 45 items of weight > 0: a row with 6 of them forbidden has 39 < m left
    rows = torch.tensor([[0, 1, -1], [-1, -1, -1]], device=device)
    with pytest.raises(ValueError, match=r"^popularity: some row has fewer than m = 40 irrelevant items of positive"):
        keyed_negatives(rows[:1], torch.arange(2, 6, device=device).view(1, 4), 300, 40, ids[:1], replacement=False,
                        popularity=few)
    keyed_negatives(rows[1:], torch.arange(0, 10, device=device).view(1, 10), 300, 40, ids[:1], replacement=False,
                    popularity=few)  # no positive: nothing to draw


# the hash of seed 3, round 0, ids 0 and 9, item 5, draws 0..3 (pinned: the keyed negatives of a run must not
# change between releases or backends)
_PINNED = [0.9351047086198584, 0.32336245026899335, 0.439275215185174, 0.7109518099663392]


def test_keyed_hash_is_pinned_and_takes_int_parts():
    """The keyed stream is pinned (a run's negatives must not change between releases); leading Python-int
    parts (the round counter, negative ones included) equal the same values as tensors; parts of
    different ranks broadcast right-aligned."""
    row = torch.tensor([0, 9]).view(2, 1, 1)
    item = torch.tensor([5]).view(1, 1, 1)
    draw = torch.arange(4).view(1, 1, 4)
    a = keyed_uniform(3, 0, row, item, draw)
    assert torch.equal(a, keyed_uniform(3, torch.tensor(0), row, item, draw))
    assert a[0, 0].tolist() == _PINNED
    c = keyed_uniform(3, -1, row, torch.arange(700).view(1, 700, 1), torch.arange(4))
    assert c.shape == (2, 700, 4) and torch.equal(c, keyed_uniform(3, torch.tensor(-1), row, torch.arange(700).view(700, 1), draw))
    assert torch.equal(c[:, 5:6], keyed_uniform(3, -1, row, item, draw))
    with pytest.raises(ValueError, match="last part must be a tensor"):
        keyed_uniform(3, 1, 2)


def test_keyed_hash_in_cache_sized_blocks_is_the_same_stream():
    """On the CPU large draws are hashed in blocks of the leading axis (temporaries in cache): the same numbers as
    each row hashed alone (and as the pinned stream), whatever the block size."""
    row = torch.arange(700).view(700, 1, 1) * 13 + 1
    item = torch.arange(700 * 2).view(700, 2, 1) % 997
    draw = torch.arange(100).view(1, 1, 100)
    big = keyed_uniform(3, 0, row, item, draw)  # 140,000 numbers: several blocks
    assert big.shape == (700, 2, 100)
    for r in (0, 1, 327, 699):
        assert torch.equal(big[r], keyed_uniform(3, 0, row[r], item[r], draw[0]))
    before = _hash._HASH_BLOCK
    try:
        _hash._HASH_BLOCK = 1 << 30
        assert torch.equal(big, keyed_uniform(3, 0, row, item, draw))
    finally:
        _hash._HASH_BLOCK = before
    flat = keyed_uniform(7, torch.arange(200_000))
    assert torch.equal(flat[123_456:123_460], keyed_uniform(7, torch.arange(123_456, 123_460)))


def _update_and_compute(metric, *args, **kwargs):
    """One update, then compute: a CPU refuses an invalid batch at update; an accelerator counts it without a read and
    refuses it at compute (its checks deferred, ``defers_checks``)."""
    metric.update(*args, **kwargs)
    metric.compute()


@pytest.mark.parametrize("reads", [True, False], ids=["reads", "deferred"])
def test_validation_errors(device, reads, monkeypatch):
    monkeypatch.setattr(tm, "_READS_ON_CPU", reads)  # False: the CPU runs an accelerator's path (checks deferred)
    with pytest.raises(ValueError, match="estimators"):
        SampledRankingMetrics("hit@10", estimators=("nope",))
    with pytest.raises(ValueError, match=r"^estimators: expected estimator names such as 'auto' or method objects"):
        SampledRankingMetrics("hit@10", estimators=("none", {"bv": {"gamma": 0.2}}))
    with pytest.raises(ValueError, match=r"^estimators: two estimators with the label 'bv'"):
        SampledRankingMetrics("hit@10", estimators=("bv", registry.Bv()))
    with pytest.raises(ValueError, match=r"^gamma: method 'mes' does not use it"):  # the method object checks
        SampledRankingMetrics("hit@10", estimators=(registry.Mes(gamma=0.2),))
    # one method object alone is one estimator; its options make its label (an MLflow-safe name)
    one = SampledRankingMetrics("hit@10", estimators=registry.Bv(gamma=0.25, prior=("beta", 2.0)))
    assert one.settings.labels == ("bv_gamma-0.25_prior-beta-2.0",)
    with pytest.raises(ValueError, match="ties"):
        ExactRankingMetrics("hit@10", ties="random")
    scores, pos, exc = _on(device, *_data())
    bad = scores.clone()
    bad[3, int(pos[3, 0])] = float("nan")
    with pytest.raises(ValueError, match="NaN"):  # at update on a CPU, at compute on an accelerator (checks deferred)
        _update_and_compute(ExactRankingMetrics("hit@10"), bad, pos, exc)
    m = SampledRankingMetrics("hit@10", n_samples=5, estimators=("none",))
    m.update(scores, pos, exc)
    with pytest.raises(ValueError, match="items"):
        m.update(scores[:, :200], torch.zeros(61, dtype=torch.int64, device=device))


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic"])
def test_update_factors_equals_update_on_the_score_matrix(ties, device):
    """update_factors (scores computed in tiles, negatives scored by dot products) gives the same states as
    update on U @ V.T + b: small integer factors and half-integer biases make every score exact, with many
    ties; the sampled histogram comes from the same keyed negatives."""
    g = torch.Generator().manual_seed(3)
    users, n, d = 45, 700, 5
    u = torch.randint(-2, 3, (users, d), generator=g).float()
    v = torch.randint(-2, 3, (n, d), generator=g).float()
    bias = torch.randint(-3, 4, (n,), generator=g).float() / 2
    order = torch.argsort(torch.rand(users, n, generator=g), dim=1)
    pos = order[:, :3].clone()
    pos[::2, 1:] = -1
    exc = order[:, 3:40].clone()
    exc[::3, 20:] = -1
    u, v, bias, pos, exc = _on(device, u, v, bias, pos, exc)
    kw = dict(ties=ties)
    a, b = ExactRankingMetrics(METRICS, **kw), ExactRankingMetrics(METRICS, **kw)
    sa = SampledRankingMetrics(METRICS, n_samples=25, estimators=("none", "bv"), max_n_groups=None, **kw)
    sb = SampledRankingMetrics(METRICS, n_samples=25, estimators=("none", "bv"), max_n_groups=None, **kw)
    for s in range(0, users, 16):
        j = slice(s, s + 16)
        ids = torch.arange(users)[j]
        a.update(u[j] @ v.T + bias, pos[j], exc[j])
        b.update_factors(u[j], v, pos[j], exc[j], item_bias=bias)
        sa.update(u[j] @ v.T + bias, pos[j], exc[j], ids=ids)
        sb.update_factors(u[j], v, pos[j], exc[j], ids=ids, item_bias=bias)
    assert torch.equal(a.sums, b.sums) and float(a.count) == float(b.count) == int((pos >= 0).sum())
    assert torch.equal(sa.hist, sb.hist) and sa.hist.sum() == int((pos >= 0).sum())
    assert sa.hist[:, 1:].sum() > 0  # not every positive first among its draws: ranks are informative
    ea, eb = sa.estimates(), sb.estimates()
    assert {k: e.value for k, e in ea.items()} == {k: e.value for k, e in eb.items()}


def test_update_factors_checks_its_inputs():
    g = torch.Generator().manual_seed(4)
    u, v = torch.randn(6, 4, generator=g), torch.randn(50, 4, generator=g)
    pos = torch.arange(6)
    sampled = SampledRankingMetrics("ndcg@10", n_samples=10)
    with pytest.raises(ValueError, match="item_factors: contains NaN"):
        sampled.update_factors(u, v.clone().index_fill_(0, torch.tensor([40]), math.nan), pos)
    with pytest.raises(ValueError, match="user_factors: contains NaN"):
        ExactRankingMetrics("ndcg@10").update_factors(u.clone().fill_(math.inf), v, pos)
    with pytest.raises(ValueError, match="item_factors: 3 factors"):
        sampled.update_factors(u, v[:, :3], pos)
    with pytest.raises(ValueError, match="positives: item indices"):
        sampled.update_factors(u, v, pos + 50)
    with pytest.raises(ValueError, match="ids: expected"):
        sampled.update_factors(u, v, pos, ids=torch.zeros(5, dtype=torch.int64))
    SampledRankingMetrics("ndcg@10", n_samples=10, check_finite=False).update_factors(u, v, pos)  # no check: fine


def test_forward_and_merge_state_equal_update():
    """``forward`` (a batch's value, then its state added to the running one) and ``merge_state`` combine
    histograms with different numbers of rows (rows appear as larger exclusions do); without ids, forward
    keeps the running row counter that keys the draws."""
    scores, pos, exc = _data()
    kw = dict(metrics=("ndcg@10", "hit@10"), n_samples=25, estimators=("none",))
    want = _loop(SampledRankingMetrics(**kw), _batches(scores, pos, exc, 7, ids=False))
    fwd = SampledRankingMetrics(**kw)
    for s, p, e, _ in _batches(scores, pos, exc, 7, ids=False):
        fwd(s, p, e)
    assert torch.equal(fwd.hist, want.hist) and fwd._rows_seen == 61
    assert fwd.compute() == want.compute()
    # one positive per user and no exclusions: every batch adds to row 0 only (the first forward broadcast to nothing)
    one = SampledRankingMetrics(**kw), SampledRankingMetrics(**kw)
    for s in range(0, 61, 10):
        one[0](scores[s : s + 10], pos[s : s + 10, 0], ids=torch.arange(s, min(s + 10, 61)))
        one[1].update(scores[s : s + 10], pos[s : s + 10, 0], ids=torch.arange(s, min(s + 10, 61)))
    assert torch.equal(one[0].hist, one[1].hist) and float(one[0].hist.sum()) == 61
    # merge_state: a state with fewer rows (no exclusions) and one with more
    a, b = SampledRankingMetrics(**kw), SampledRankingMetrics(**kw)
    a.update(scores[:30], pos[:30, 0], ids=torch.arange(30))
    b.update(scores[30:], pos[30:], exc[30:], ids=torch.arange(30, 61))
    both = SampledRankingMetrics(**kw)
    both.update(scores[:30], pos[:30, 0], ids=torch.arange(30))
    both.update(scores[30:], pos[30:], exc[30:], ids=torch.arange(30, 61))
    assert a.hist.shape[0] < b.hist.shape[0]
    a.merge_state(b)
    assert torch.equal(a.hist, both.hist) and a.compute() == both.compute()
    ex = ExactRankingMetrics(METRICS)
    for s, p, e, _ in _batches(scores, pos, exc, 7):
        ex(s, p, e)
    assert torch.allclose(ex.sums, _loop(ExactRankingMetrics(METRICS), _batches(scores, pos, exc, 7)).sums, rtol=0, atol=1e-12)


def test_compute_is_fresh_after_every_entry_point():
    """``update_factors`` / ``update_padded`` bypass torchmetrics' wrapped ``update``: a cached ``compute()``
    value must still be dropped (and no 'compute before update' warning raised)."""
    import warnings

    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(40, 8, generator=g), torch.randn(300, 8, generator=g)
    pos = torch.randint(0, 300, (40,), generator=g)
    for metric in (ExactRankingMetrics("ndcg@10"), SampledRankingMetrics("ndcg@10", n_samples=20, estimators=("none",))):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            metric.update_factors(u[:20], v, pos[:20], **({"ids": torch.arange(20)} if isinstance(metric, SampledRankingMetrics) else {}))
            first = metric.compute()
            metric.update_factors(u[20:], v, pos[20:], **({"ids": torch.arange(20, 40)} if isinstance(metric, SampledRankingMetrics) else {}))
            second = metric.compute()
        est = metric.estimates()
        assert {k: v for k, v in second.items() if not k.endswith(("_lo", "_hi"))} == {
            metric_key(k): torch.tensor(e.value, dtype=torch.float64) for k, e in est.items()}
        for name, e in est.items():  # sampled estimates lead with their 95% interval (exact values have none)
            k = metric_key(name)  # compute()'s keys are the logged ones
            if k.endswith("/exact"):
                assert f"{k}_lo" not in second
            else:
                assert (float(second[f"{k}_lo"]), float(second[f"{k}_hi"])) == pytest.approx(e.interval(0.95))
        assert first != second
        s, p = u @ v.T, pos.unsqueeze(1)
        metric.reset()
        metric.update_padded(s[:20], p[:20], None, *((torch.arange(20),) if isinstance(metric, SampledRankingMetrics) else ()))
        first = metric.compute()
        metric.update_padded(s[20:], p[20:], None, *((torch.arange(20, 40),) if isinstance(metric, SampledRankingMetrics) else ()))
        assert metric.compute() != first


def test_exact_metrics_do_not_depend_on_which_users_share_a_batch():
    """A user with fewer candidates than the cut-off (M(r) = [r <= k] is defined) alone in a batch gives the
    same sums as in a mixed batch; AUC leaves out relevant items without an irrelevant candidate (n = 1)."""
    scores = torch.tensor([[3.0, 2.0, 1.0, 0.0, -1.0, -2.0], [0.5, 1.0, 0.0, 2.0, 3.0, 4.0]])
    pos = torch.tensor([[1], [0]])
    exc = torch.tensor([[0, 1, 1, 1, 0, 0], [0, 0, 0, 0, 0, 0]], dtype=torch.bool)
    exc[0, 1] = False  # row 0: candidates {0, 1, 4, 5} (n = 4 < k = 5), the positive (item 1) at rank 2
    metrics = ("recall@5", "ndcg@5", "auc")
    together, apart = ExactRankingMetrics(metrics), ExactRankingMetrics(metrics)
    together.update(scores, pos, exc)
    apart.update(scores[:1], pos[:1], exc[:1])
    apart.update(scores[1:], pos[1:], exc[1:])
    assert torch.allclose(together.sums, apart.sums, rtol=0, atol=1e-15)
    est = together.estimates()
    # row 0: rank 2 of 4; row 1: rank 5 of 6 (items 5, 4, 3, 1 score higher)
    assert est["recall@5/exact"].value == pytest.approx((1 + 1) / 2)
    assert est["ndcg@5/exact"].value == pytest.approx((1 / math.log2(3) + 1 / math.log2(6)) / 2)
    assert est["auc/exact"].value == pytest.approx(((4 - 2) / 3 + (6 - 5) / 5) / 2)
    lone = ExactRankingMetrics(("auc", "hit@3"))
    lone.update(torch.tensor([[1.0, 0.0, 0.0]]), torch.tensor([[0]]), torch.tensor([[1, 2]]))  # only the positive is left
    est = lone.estimates()
    assert math.isnan(est["auc/exact"].value) and est["auc/exact"].n_instances == 0
    assert est["hit@3/exact"].value == 1.0 and est["hit@3/exact"].n_instances == 1


def test_positive_also_excluded_and_average_ties_are_refused():
    """A training mask that still holds a held-out item is a ValueError on the score path too (it would shrink
    the candidate count and corrupt the sampler's item map); 'average' ties are refused when sampled metrics
    are built (fractional sampled ranks), not at the first batch."""
    scores, pos, exc = _data()
    leak = exc.clone()
    leak[5, int(pos[5, 0])] = True
    for metric in (ExactRankingMetrics("hit@10"), SampledRankingMetrics("hit@10", n_samples=5, estimators=("none",))):
        with pytest.raises(ValueError, match="exclude one of their own positives"):
            metric.update(scores, pos, leak)
    with pytest.raises(ValueError, match="ties: 'average'"):
        SampledRankingMetrics("hit@10", ties="average")
    ExactRankingMetrics("hit@10", ties="average")  # exact metrics take it


@pytest.mark.parametrize("reads", [True, False], ids=["reads", "deferred"])
def test_rows_without_positives_need_no_sample_pool(device, reads, monkeypatch):
    """Without replacement, a row with no relevant item (or only padding) draws nothing, so a small pool there
    is fine; the other rows draw exactly what they draw in a batch of their own."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", reads)  # False: the CPU runs an accelerator's path (checks deferred)
    g = torch.Generator().manual_seed(0)
    scores = torch.randn(4, 30, generator=g)
    pos = torch.tensor([[2, 5], [-1, -1], [7, -1], [-1, -1]])
    exc = torch.full((4, 28), -1)
    exc[1] = torch.arange(2, 30)  # row 1: 2 items left, fewer than m
    scores, pos, exc = _on(device, scores, pos, exc)
    kw = dict(metrics=("hit@3",), n_samples=SamplingDesign(10, replacement=False), estimators=("none",))
    a, b = SampledRankingMetrics(**kw), SampledRankingMetrics(**kw)
    a.update(scores, pos, exc, ids=torch.arange(4))
    b.update(scores[[0, 2]], pos[[0, 2]], exc[[0, 2]], ids=torch.tensor([0, 2]))
    assert torch.equal(a.hist, b.hist) and float(a.hist.sum()) == 3
    with pytest.raises(ValueError, match="fewer than m = 10"):  # at update on a CPU, at compute on an accelerator
        _update_and_compute(a, scores[1:2], torch.tensor([[0]], device=device), exc[1:2], ids=torch.tensor([9]))


def test_metric_names_are_canonical_and_distinct():
    m = ExactRankingMetrics(("mrr", "hr@10"))
    assert m.settings.metric_names == ("rr", "hit@10")
    with pytest.raises(ValueError, match="'mrr' and 'rr' name the same metric"):
        SampledRankingMetrics(("mrr", "rr"))


def test_adaptive_metric_equals_the_core_on_the_same_draws():
    """adaptive_max: the keyed stage draws with the stopping rule applied by hand (stage s keyed by
    stage_seed(seed, s)) give the ranks and sizes whose core estimate(adaptive=) the metric returns, whatever the
    batching; the cost is in the details; bad options are refused."""
    from reco_sampled_plugin._keyed import stage_seed

    scores, pos_mask, exclude = _data(users=80, n=400, seed=3)
    pos, exc = padded_inputs(scores, pos_mask, exclude)
    ids = torch.arange(80)
    opts = dict(n_samples=SamplingDesign(4, adaptive_max=32), estimators=("none", registry.Mes(n_bootstrap=0)),
                max_n_groups=None, seed=7)
    one = SampledRankingMetrics(("ndcg@10", "hit@5"), **opts)
    one.update(scores, pos_mask, exclude, ids=ids)
    split = SampledRankingMetrics(("ndcg@10", "hit@5"), **opts)
    for lo, hi in ((0, 13), (13, 50), (50, 80)):
        split.update(scores[lo:hi], pos_mask[lo:hi], exclude[lo:hi], ids=ids[lo:hi])
    # by hand: every stage's keyed ranks for every positive, then the first stage where it is not first
    stages = [4, 8, 16, 32]
    per_stage = [keyed_sampled_ranks(scores, pos, exc, new, ids, stage_seed(7, s))[0]
                 for s, new in enumerate([4, 4, 8, 16])]
    n_cand = keyed_sampled_ranks(scores, pos, exc, 4, ids, 7)[1]
    ranks = per_stage[0].clone()
    sizes = torch.full_like(ranks, 4)
    done = ranks != 1
    for s in range(1, 4):
        go = ~done
        ranks[go] = per_stage[s][go]
        sizes[go] = stages[s]
        done = done | (ranks != 1)
    valid = pos >= 0
    r, m = ranks[valid], sizes[valid]
    n = n_cand.unsqueeze(1).expand_as(pos)[valid]
    assert not bool(((r == 1) & (m < 32)).any()) and bool((m > 4).any())
    got_one, got_split = one.estimates(), split.estimates()
    for metric in ("ndcg@10", "hit@5"):
        for method in ("none", "mes"):
            core = estimate(
                metric,
                SampledRanks.from_arrays(r, n, m, SamplingDesign(4, adaptive_max=32)),
                registry.method_class(method)(**{"n_bootstrap": 0} if method == "mes" else {}),
            )
            key = f"{metric}/{'sampled' if method == 'none' else 'mes_n_bootstrap-0'}"
            assert got_one[key].value == pytest.approx(core.value, rel=1e-12, abs=1e-15), key
            assert got_split[key].value == pytest.approx(core.value, rel=1e-12, abs=1e-15), key
            cost = got_one[key].details["adaptive"]
            assert cost["mean_samples"] == pytest.approx(float(m.double().mean()))
            assert cost["share_at_cap"] == pytest.approx(float((m == 32).double().mean()))
    with pytest.raises(ValueError, match="adaptive_max"):
        SampledRankingMetrics(("ndcg@10",), n_samples=SamplingDesign(4, adaptive_max=2), estimators=("mes",))
    with pytest.raises(ValueError, match="fixed m"):
        SampledRankingMetrics(("ndcg@10",), n_samples=SamplingDesign(4, adaptive_max=32), estimators=("bv",))
    with pytest.raises(ValueError, match="replacement"):
        SampledRankingMetrics(("ndcg@10",), n_samples=SamplingDesign(4, adaptive_max=32, replacement=False), estimators=("mes",))


# ------------------------------------------------------------------------ exact_at_cap (completion at the cap)
CAP_DESIGN = SamplingDesign(4, adaptive_max=32, exact_at_cap=True)
#: the threshold rule: drawing more while r~ <= 3, completing the positives within the top 3 at the cap
TOP3_DESIGN = SamplingDesign(4, adaptive_max=32, adaptive_top=3, exact_at_cap=True)
CAP_METHODS = ("none", registry.Mes(n_bootstrap=0), "auto")


def _cap_data(users=64, n=300, seed=5):
    """Factors, their scores, two positives per row near the top (the row's best item, which every stage leaves
    first, and one of ranks 2..40; every third row one), and up to 7 excluded items; ids not 0-based."""
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(users, 6, generator=g, dtype=torch.float64)
    v = torch.randn(n, 6, generator=g, dtype=torch.float64)
    scores = u @ v.T
    order = torch.argsort(scores, 1, descending=True)
    second = order[torch.arange(users), torch.randint(1, 40, (users,), generator=g)]
    pos = torch.stack([order[:, 0], second], 1)
    pos[::3, 1] = -1
    exc = order[:, 50:57].clone()
    exc[::2, 3:] = -1
    return u, v, scores, pos, exc, torch.arange(users) + 100


def _cap_core(scores, pos, exc, ids, seed=7, design=CAP_DESIGN):
    """The core's SampledRanks of the adapter's keyed draws (``_keyed``: the same stages), the positives still first at
    the cap completed here from the whole score matrix (``exact_ranks_padded`` among the irrelevant candidates)."""
    from reco_sampled_plugin.ranking import exact_ranks_padded

    n_items = scores.shape[1]
    keys = RowKeys.of(seed, ids, scores.device)
    first = _keyed.keyed_ranks(MatrixScores(scores), pos, exc, n_items, design, keys, "pessimistic")
    ranks, sizes, _ = _keyed.keyed_adaptive_ranks(MatrixScores(scores), pos, exc, n_items, first, design.adaptive,
                                                  keys, "pessimistic")
    done = (ranks > 0) & (ranks <= design.adaptive_top) & (sizes == 32)
    exact = torch.where(done, exact_ranks_padded(scores, pos, exc, "pessimistic", False), 0)
    n = torch.where(pos >= 0, padded_candidate_counts(n_items, pos, exc, False).unsqueeze(1), 0)
    return SampledRanks.from_arrays(ranks, n, sizes, design, exact_ranks=exact)


def _cap_metric(design=CAP_DESIGN):
    return SampledRankingMetrics(("ndcg@10", "hit@5"), design, CAP_METHODS, max_n_groups=None, seed=7)


def _same_as_core(metric, core):
    est = metric.estimates()
    for name in ("ndcg@10", "hit@5"):
        for method, label in zip(CAP_METHODS, metric.settings.labels):
            want = estimate(name, core, method)
            got = est[f"{name}/{label}"]
            assert (got.value, got.stderr) == (want.value, want.stderr), (name, label)


@pytest.mark.parametrize("design", [CAP_DESIGN, TOP3_DESIGN], ids=["first", "top3"])
@pytest.mark.parametrize("source", ["scores", "factors", "scorer", "scores-static", "factors-static"])
def test_exact_at_cap_equals_the_core_on_the_same_draws(source, design, monkeypatch):
    """exact_at_cap: the positives still first at the cap (``top3``: within the top 3, drawing more while r~ <= 3)
    are completed exactly (score rows, factor tiles, a scorer scoring the rows whole) and kept as (n, R) rows; every
    estimate equals the core's on the same keyed draws bit for bit (exact-group readers at R, ``none`` at r~),
    batches of any size. ``-static``: the accelerator's form on the CPU (the rows of the cap's stage ranked, nothing
    read back): the same estimates."""
    from reco_sampled_plugin.adapters import torchmetrics as tm

    if source.endswith("-static"):
        monkeypatch.setattr(tm, "_READS_ON_CPU", False)
        source = source.removesuffix("-static")
    u, v, scores, pos, exc, ids = _cap_data()
    core = _cap_core(scores, pos, exc, ids, design=design)
    done = int((core.exact_ranks > 0).sum())
    assert 40 < done < int((pos >= 0).sum()) and bool((core.exact_ranks > 1).any())  # completions, not only R = 1
    if design.adaptive_top > 1:  # the rule completes positives that were not first at the cap
        assert bool(((core.exact_ranks > 0) & (core.ranks > 1)).any())
    metric = _cap_metric(design)
    for lo, hi in ((0, 7), (7, 40), (40, 64)):
        sl = slice(lo, hi)
        if source == "scores":
            metric.update(scores[sl], pos[sl], exc[sl], ids=ids[sl])
        elif source == "factors":
            metric.update_factors(u[sl], v, pos[sl], exc[sl], ids=ids[sl])
        else:
            metric.update_from_scorer(lambda us, items: scores[us - 100].gather(1, items), pos[sl], 300, exc[sl],
                                      ids=ids[sl])
    assert int((metric.completed[:, 1] > 0).sum()) == done
    _same_as_core(metric, core)
    plain = metric.histogram(exact=False)
    assert not plain.has_exact and metric.histogram().has_exact and plain.total == metric.histogram().total
    if source == "scorer":  # the completed rows scored whole: their candidates in the pairs
        rows = int((core.exact_ranks > 0).any(1).sum())
        assert metric.scoring_cost().pairs > rows * (300 - 9) and metric.scoring_cost().stages == 4 + 1


@pytest.mark.parametrize("merge", ["a<-b", "b<-a", "forward"])
def test_exact_at_cap_merge_forward_and_reset(merge):
    """Two states merged (either order) or batches through forward give the one-state estimates bit for bit (the
    completed rows concatenated, in any order); reset empties the completed rows."""
    u, v, scores, pos, exc, ids = _cap_data()
    core = _cap_core(scores, pos, exc, ids)
    a, b = _cap_metric(), _cap_metric()
    if merge == "forward":
        a(scores[:25], pos[:25], exc[:25], ids=ids[:25])
        a(scores[25:], pos[25:], exc[25:], ids=ids[25:])
    else:
        a.update(scores[:25], pos[:25], exc[:25], ids=ids[:25])
        b.update(scores[25:], pos[25:], exc[25:], ids=ids[25:])
        (a.merge_state(b) if merge == "a<-b" else (b.merge_state(a), a := b))
    _same_as_core(a, core)
    a.reset()
    assert a.completed.shape == (0, 2) and a.hist.shape[0] == 0
    state = dict(_cap_metric().metric_state)
    state["completed"] = torch.zeros(0, 3, dtype=torch.float64)
    with pytest.raises(ValueError, match="^n_samples: the incoming exact_at_cap state"):
        _cap_metric().merge_state(state)


def test_compute_leads_with_the_interval_and_explains_an_unresolved_top(caplog):
    """By default the sampled metric and the default estimator, each with its 95% interval (``_lo`` /
    ``_hi``, ``Estimate.interval(0.95)``) and no standard error (``stderr=True``: sampling noise only, opt-in); an
    unresolved top is said once, in words, with the planner command."""
    import logging

    from reco_sampled_plugin import registry
    from reco_sampled_plugin.adapters import _shared

    scores, pos, exc = _data()
    m = SampledRankingMetrics(("ndcg@10", "auc"), n_samples=10, max_n_groups=None)
    assert m.settings.estimators == ("none", registry.DEFAULT_ESTIMATOR)
    _loop(m, _batches(scores, pos, exc, 16))
    _shared._EXPLAINED.clear()
    with caplog.at_level(logging.WARNING):
        out, est = m.compute(), m.estimates()
    labels = ("sampled", registry.DEFAULT_ESTIMATOR)
    # compute()'s keys are the logged ones (ndcg_at_10/auto, as the Lightning callback's after its stage)
    assert set(out) == {f"{n}/{lab}{end}" for n in ("ndcg_at_10", "auc") for lab in labels for end in ("", "_lo", "_hi")}
    for k, e in est.items():
        lo, hi = e.interval(0.95)
        key = metric_key(k)
        assert float(out[key]) == e.value and (float(out[f"{key}_lo"]), float(out[f"{key}_hi"])) == (lo, hi)
        assert 0.0 <= lo <= hi <= 1.0
    default = registry.DEFAULT_ESTIMATOR  # auto: mes for ndcg@10 here (K = 10 < b), gmod for auc (no top)
    assert "top_unresolved" in est[f"ndcg@10/{default}"].flags and "top_unresolved" not in est[f"auc/{default}"].flags
    assert est[f"ndcg@10/{default}"].details["auto"]["method"] == "mes"
    why = [r.getMessage() for r in caplog.records if "top_unresolved" in r.getMessage()]
    assert len(why) == 1, why  # once: the default estimate of ndcg@10 (not the plain sampled metric, not again)
    assert why[0].startswith("SampledRankingMetrics ndcg@10: top_unresolved: top of the ranking not resolved by m = 10")
    assert f"(reco-sampled plan --n-items 300 --n-users {int((pos >= 0).sum())} --metric ndcg@10" in why[0]
    se = SampledRankingMetrics("auc", n_samples=10, estimators=("none",), interval=False, stderr=True)
    _loop(se, _batches(scores, pos, exc, 16))
    assert set(se.compute()) == {"auc/sampled", "auc/sampled_stderr"}
    assert float(se.compute()["auc/sampled_stderr"]) == se.estimates()["auc/sampled"].stderr
    with pytest.raises(ValueError, match="interval"):
        SampledRankingMetrics("auc", interval="yes")


# ------------------------------------------------------------------ checks deferred to compute on an accelerator
def _valid_batch(seed, b=6, n=40, d=4):
    """A valid batch of both forms: scores, factors (scores = u @ v.T + bias), positives, exclusions, ids."""
    g = torch.Generator().manual_seed(seed)
    u, v, bias = torch.randn(b, d, generator=g), torch.randn(n, d, generator=g), torch.randn(n, generator=g)
    order = torch.argsort(torch.rand(b, n, generator=g), 1)
    pos, exc = order[:, :2].clone(), order[:, 2:5].clone()
    pos[1::2, 1] = -1
    exc[::3, -1] = -1
    return dict(scores=torch.addmm(bias, u, v.T), u=u, v=v, bias=bias, pos=pos, exc=exc,
                ids=torch.arange(seed * b, seed * b + b))


def _broken(check, batch):
    """``batch`` with the one defect the deferred check ``check`` flags (in row 2)."""
    bad = {k: t.clone() for k, t in batch.items()}
    n = bad["v"].shape[0]
    pos, exc = bad["pos"], bad["exc"]
    if check == "positives_range":
        pos[2, 0] = n
    elif check == "positives_duplicates":
        pos[2, 1] = pos[2, 0]
    elif check == "exclude_range":
        exc[2, 0] = -2
    elif check == "exclude_duplicates":
        exc[2, 1] = exc[2, 0]
    elif check == "exclude_clash":
        exc[2, 0] = pos[2, 0]
    elif check == "scores_finite":  # a relevant item's score (check_finite="positives" sees it too)
        bad["scores"][2, pos[2, 0]] = math.nan
    elif check in ("user_factors_finite", "item_factors_finite", "item_bias_finite"):
        key = {"user_factors_finite": "u", "item_factors_finite": "v", "item_bias_finite": "bias"}[check]
        bad[key].view(-1)[3] = math.inf
    elif check == "factors_overflow":  # finite float32 factors whose scores could overflow: |u| |v| >= max / 4
        bad["u"], bad["v"], bad["bias"] = bad["u"].float(), bad["v"].float(), bad["bias"].float()
        bad["u"][2] = 3e37
    elif check == "sample_pool":  # row 2: every item but its positives excluded
        others = torch.tensor([j for j in range(n) if j not in pos[2].tolist()])
        bad["exc"] = torch.full((exc.shape[0], n), -1, dtype=torch.int64)
        bad["exc"][:, : exc.shape[1]] = exc
        bad["exc"][2, : others.numel()] = others
    return bad


# check -> (metrics it is deferred in, the form of the batch, the message's start (also the CPU's error), or None
# where the CPU computes the batch instead of refusing it)
_DEFERRED = {
    "positives_range": (("exact", "sampled"), "scores", r"^positives: item indices must lie in", True),
    "positives_duplicates": (("exact", "sampled"), "scores", r"^positives: .*the same item twice", True),
    "exclude_range": (("exact", "sampled"), "factors", r"^exclude: item indices must lie in", True),
    "exclude_duplicates": (("exact", "sampled"), "scores", r"^exclude: .*the same item twice", True),
    "exclude_clash": (("exact", "sampled"), "factors", r"^exclude: .*one of (their|its) own positives", True),
    "scores_finite": (("exact", "exact_positives", "sampled"), "scores", r"^scores: NaN or inf", True),
    "user_factors_finite": (("exact", "sampled"), "factors", r"^user_factors: contains NaN or inf", True),
    "item_factors_finite": (("exact", "sampled"), "factors", r"^item_factors: contains NaN or inf", True),
    "item_bias_finite": (("exact", "sampled"), "factors", r"^item_bias: contains NaN or inf", True),
    # the CPU ranks the materialized scores instead (bound read at once); an accelerator ranks tiles: refused
    "factors_overflow": (("exact",), "factors", r"^user_factors: .*scores could overflow", False),
    "sample_pool": (("sampled",), "scores", r"^n_samples: some row has fewer than one irrelevant candidate", True),
}


def _deferring_metric(kind):
    if kind.startswith("exact"):
        return ExactRankingMetrics(("ndcg@10", "auc"), check_finite="positives" if kind == "exact_positives" else True)
    return SampledRankingMetrics(("ndcg@10", "auc"), n_samples=5, estimators=("none",))


def _feed_batch(metric, form, batch):
    if form == "scores":
        args = (batch["scores"], batch["pos"], batch["exc"])
        return metric.update(*args) if isinstance(metric, ExactRankingMetrics) else metric.update(*args, ids=batch["ids"])
    args = (batch["u"], batch["v"], batch["pos"], batch["exc"])
    if isinstance(metric, ExactRankingMetrics):
        return metric.update_factors(*args, item_bias=batch["bias"])
    return metric.update_factors(*args, ids=batch["ids"], item_bias=batch["bias"])


@pytest.mark.parametrize("reads_on_cpu", [True, False])
def test_sampled_factor_updates_refuse_products_that_overflow(reads_on_cpu, monkeypatch):
    """Finite float32 factors whose dot products overflow (1e20 x 1e20 x 3): ranked, every drawn item and positive
    scored inf and tied, sampled NDCG and AUC were 0 with zero-width intervals. Refused at once on the CPU, at
    compute where checks are deferred (the factor batches' overflow check), naming the factors; the same factors in
    float64 are ranked (their products are finite)."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", reads_on_cpu)
    u, v, pos = torch.full((4, 3), 1e20), torch.full((30, 3), 1e20), torch.tensor([[0], [5], [9], [29]])
    metric = SampledRankingMetrics(("ndcg@5", "auc"), n_samples=5, estimators=("none",))
    message = r"^user_factors: .*overflow"
    if reads_on_cpu:
        with pytest.raises(ValueError, match=message):
            metric.update_factors(u, v, pos)
    else:
        metric.update_factors(u, v, pos)
        with pytest.raises(ValueError, match=message + r".*\[check 'factors_overflow', first failed at update 1"):
            metric.compute()
    wide = SampledRankingMetrics(("ndcg@5", "auc"), n_samples=5, estimators=("none",))
    wide.update_factors(u.double(), v.double(), pos)
    assert all(math.isfinite(float(x)) for x in wide.compute().values())


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")  # a merged-into state without an update
@pytest.mark.parametrize("check,kind", [(c, k) for c, spec in _DEFERRED.items() for k in spec[0]])
def test_deferred_check_raises_at_compute_naming_the_check_and_update(check, kind, monkeypatch):
    """On an accelerator's path (``_READS_ON_CPU = False``) an invalid batch is counted without a read (computed on
    safe inputs: out-of-range indices as padding) and refused at compute, estimates and histogram with the CPU's error type and message start,
    the check and the first update that failed it; merged states (a metric or its state dict) carry the failure;
    reset clears it. On the CPU the same batch is refused at once (factors that could overflow: ranked there on the
    materialized scores instead)."""
    _, form, head, cpu_refuses = _DEFERRED[check]
    good = [_valid_batch(s) for s in range(3)]
    bad = _broken(check, good[1])
    if check == "factors_overflow":
        good = [{k: (t.float() if t.is_floating_point() else t) for k, t in g.items()} for g in good]
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    metric = _deferring_metric(kind)
    for batch in (good[0], bad, good[2]):  # updates 1, 2 (invalid: nothing raised), 3
        _feed_batch(metric, form, batch)
    pattern = rf"{head}.*\[check '{check}', first failed at update 2[:;]"
    reads = [metric.compute, metric.estimates] + ([metric.histogram] if kind == "sampled" else [])
    for read in reads:
        with pytest.raises(ValueError, match=pattern) as own:
            read()
    for incoming in (metric, metric.metric_state):  # a metric (its own message) or a state dict (the generic one)
        other = _deferring_metric(kind)
        if incoming is not metric:  # (a metric of no update of its own: the message is the incoming one's)
            _feed_batch(other, form, good[0])
        other.merge_state(incoming)
        with pytest.raises(ValueError, match=pattern) as merged:
            other.compute()
        if incoming is metric:
            assert str(merged.value) == str(own.value)
    metric.reset()
    assert not bool(metric.failed_checks.any())
    _feed_batch(metric, form, good[0])
    assert all(math.isfinite(float(v)) for v in metric.compute().values())
    monkeypatch.setattr(tm, "_READS_ON_CPU", True)  # the CPU: reads are free, the error comes at once
    cpu = _deferring_metric(kind)
    if cpu_refuses:
        with pytest.raises(ValueError, match=head):
            _feed_batch(cpu, form, bad)
        assert not bool(cpu.failed_checks.any())
    else:
        _feed_batch(cpu, form, bad)
        assert all(math.isfinite(float(v)) for v in cpu.compute().values())


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")
def test_deferred_checks_keep_the_earliest_failure_of_merged_states_and_forward(monkeypatch):
    """Merged states keep each check's earliest failing update (max of the encoded entries) and list the other
    failed checks; ``forward`` refuses its own invalid batch at once (its batch value is computed), naming its
    update number, after adding the batch (its flag) to the accumulated state, which it keeps: the earlier batches
    stay counted, the update count goes on, and an earlier failure stays the one reported."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    good = [_valid_batch(s) for s in range(4)]
    a, b = _deferring_metric("sampled"), _deferring_metric("sampled")
    for batch in (good[0], good[1], _broken("scores_finite", good[2])):  # a: scores at update 3
        _feed_batch(a, "scores", batch)
    for batch in (_broken("positives_duplicates", good[0]), _broken("scores_finite", good[3])):  # b: 1, 2
        _feed_batch(b, "scores", batch)
    a.merge_state(b)
    with pytest.raises(ValueError, match=r"^positives: .*\[check 'positives_duplicates', first failed at update 1; "
                                         r"also failed: 'scores_finite' \(update 2\)"):
        a.compute()
    c = _deferring_metric("exact")
    c(good[0]["scores"], good[0]["pos"], good[0]["exc"])
    with pytest.raises(ValueError, match=r"^scores: NaN or inf.*first failed at update 2:"):
        bad = _broken("scores_finite", good[1])
        c(bad["scores"], bad["pos"], bad["exc"])
    relevant = int((good[0]["pos"] >= 0).sum() + (good[1]["pos"] >= 0).sum())
    assert float(c.count) == relevant and c._update_count == 2  # both batches kept, counted
    with pytest.raises(ValueError, match=r"^scores: NaN or inf.*first failed at update 2:"):
        c.compute()
    d = _deferring_metric("sampled")  # an earlier failure (update 1, by update) outlives forward's failing batch
    _feed_batch(d, "scores", _broken("positives_duplicates", good[0]))
    with pytest.raises(ValueError, match=r"^scores: NaN or inf.*first failed at update 2:"):
        bad = _broken("scores_finite", good[1])
        d(bad["scores"], bad["pos"], bad["exc"], ids=bad["ids"])
    assert float(d.hist.sum()) == relevant
    with pytest.raises(ValueError, match=r"^positives: .*\[check 'positives_duplicates', first failed at update 1; "
                                         r"also failed: 'scores_finite' \(update 2\)"):
        d.compute()


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")
@pytest.mark.parametrize("kind", ["exact", "sampled"])
@pytest.mark.parametrize("how", ["merge_state", "merge_state_dict", "load_state_dict"])
def test_failed_check_added_after_a_compute_is_refused_at_the_next_compute(kind, how, monkeypatch):
    """A state computed once (torchmetrics caches the result), then given a failed batch's state by merging (a
    metric or its state dict) or loading: the next compute reads the new state and refuses it, as estimates does,
    rather than returning the cached value."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    good = _valid_batch(0)
    a, b = _deferring_metric(kind), _deferring_metric(kind)
    _feed_batch(a, "scores", good)
    assert all(math.isfinite(float(v)) for v in a.compute().values())
    _feed_batch(b, "scores", _broken("scores_finite", good))
    if how == "merge_state":
        a.merge_state(b)
    elif how == "merge_state_dict":
        a.merge_state(b.metric_state)
    else:
        a.persistent(True)
        b.persistent(True)
        a.load_state_dict(b.state_dict())
    for read in (a.compute, a.estimates):
        with pytest.raises(ValueError, match=r"^scores: NaN or inf.*\[check 'scores_finite', first failed at update 1"):
            read()


@pytest.mark.parametrize("case", ["exact", "exact_positives", "exact_factors", "sampled", "sampled_factors",
                                  "sampled_noreplace", "sampled_adaptive"])
def test_deferring_checks_changes_no_result_of_valid_batches(case, monkeypatch):
    """The same valid batches with the checks read at once (the CPU) and kept on the device (the accelerator's path):
    every state and every computed value the same bit for bit, and no deferred check failed."""
    got = []
    for reads in (True, False):
        monkeypatch.setattr(tm, "_READS_ON_CPU", reads)
        if case.startswith("exact"):
            metric = _deferring_metric("exact_positives" if case == "exact_positives" else "exact")
        else:
            design = SamplingDesign(5, replacement=case != "sampled_noreplace",
                                    adaptive_max=20 if case == "sampled_adaptive" else None)
            metric = SampledRankingMetrics(("ndcg@10", "auc", "recall@5"), n_samples=design, estimators=("none", "mes"))
        for seed in range(3):
            _feed_batch(metric, "factors" if case.endswith("factors") else "scores", _valid_batch(seed))
        got.append((metric.compute(), {k: v.clone() for k, v in metric.metric_state.items()}))
    (want, want_state), (have, have_state) = got
    assert not bool(have_state["failed_checks"].any())
    assert want.keys() == have.keys() and all(torch.equal(want[k], have[k]) for k in want)
    assert all(torch.equal(want_state[k], have_state[k]) for k in want_state)


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")
def test_deferred_error_message_is_the_failing_updates_own(monkeypatch):
    """A check's message carries the failing batch's numbers (its catalogue), not those of a later valid batch of
    another catalogue, as the CPU's error at that batch does; also after merging into a fresh metric."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", True)
    with pytest.raises(ValueError) as cpu:
        ExactRankingMetrics(("ndcg@10",)).update(torch.randn(2, 10), torch.tensor([[0], [12]]))
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    metric = ExactRankingMetrics(("ndcg@10",))
    metric.update(torch.randn(2, 10), torch.tensor([[0], [12]]))  # update 1: 12 outside 0..9
    metric.update(torch.randn(2, 50), torch.tensor([[0], [12]]))  # update 2: valid in 0..49
    fresh = ExactRankingMetrics(("ndcg@10",))
    fresh.merge_state(metric)
    for m in (metric, fresh):
        with pytest.raises(ValueError) as deferred:
            m.compute()
        assert str(deferred.value).startswith(str(cpu.value) + " [check 'positives_range', first failed at update 1")


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")
@pytest.mark.parametrize("kind", ["exact", "sampled"])
def test_deferred_out_of_range_indices_report_no_made_up_duplicate_or_clash(kind, monkeypatch):
    """Two different out-of-range positives (11, 12 of 10 items) beside an exclusion of the last item: only the
    range check fails (the CPU's one error); the safe copy the batch is computed on must not turn them into the
    same item, nor into the excluded one (no 'also failed')."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    metric = _deferring_metric(kind)
    scores = torch.randn(2, 10, dtype=torch.float64)
    _feed_batch(metric, "scores", dict(scores=scores, pos=torch.tensor([[11, 12], [0, -1]]),
                                       exc=torch.tensor([[9], [1]]), ids=torch.arange(2)))
    with pytest.raises(ValueError, match=r"^positives: item indices must lie in 0\.\.9 ") as err:
        metric.compute()
    assert "[check 'positives_range', first failed at update 1:" in str(err.value)
    assert "also failed" not in str(err.value)


@pytest.mark.parametrize("reads", [True, False], ids=["cpu", "deferred"])
def test_oversized_histogram_batch_reports_its_bad_input_first(reads, monkeypatch):
    """A batch whose histogram state would be too large and whose positives are out of range: the input's error
    (as on the CPU, where the index checks are read first), also on the deferred path (the call raises anyway, so
    its pending checks are read); no state changed."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", reads)
    metric = SampledRankingMetrics(["ndcg@10"], n_samples=2**24)
    with pytest.raises(ValueError, match=r"^positives: item indices must lie in 0\.\.99 "):
        metric.update(torch.rand(2, 100), [[0], [150]], exclude=torch.arange(2, 60).repeat(2, 1))
    assert metric.hist.shape[0] == 0 and not bool(metric.failed_checks.any())
    with pytest.raises(ValueError, match="the histogram state"):  # a valid input: the state's own error
        metric.update(torch.rand(2, 100), [[0], [1]], exclude=torch.arange(2, 60).repeat(2, 1))


@pytest.mark.parametrize("share", [False, True], ids=["popularity", "popularity_share"])
def test_deferred_popularity_rows_give_the_same_results_as_read_at_once(share, monkeypatch):
    """Drawn by popularity with replacement, the accelerator's path appends every slot of a batch to the ``pop``
    state (padded and not-kept slots with r~ = 0) instead of compacting the counted ones (a read): compute(),
    popularity_ranks() and the histogram are the same bit for bit as with the checks read at once, merged states
    too, and the counted rows are the same rows."""
    weights = torch.linspace(0.5, 2.0, 40, dtype=torch.float64)
    design = SamplingDesign(5, popularity=weights, exact_share=ExactShare(0.5) if share else None)
    got = []
    for reads in (True, False):
        monkeypatch.setattr(tm, "_READS_ON_CPU", reads)
        metrics = [SampledRankingMetrics(("ndcg@10", "auc"), n_samples=design, estimators=("none", "hh"))
                   for _ in range(2)]
        for seed in range(4):  # padded positives in every other row; row 0 of each batch not kept
            batch = _valid_batch(seed)
            keep = torch.ones(batch["pos"].shape[0], dtype=torch.bool)
            keep[0] = False
            metrics[seed % 2].update(batch["scores"], batch["pos"], batch["exc"], ids=batch["ids"], keep=keep)
        metrics[0].merge_state(metrics[1])
        metric = metrics[0]
        ranks = metric.popularity_ranks()
        rows = metric.pop
        got.append((metric.compute(), ranks, metric.histogram().counts, rows[rows[:, 0] > 0], rows.shape[0]))
    (want, want_ranks, want_hist, want_rows, n_read), (have, have_ranks, have_hist, have_rows, n_deferred) = got
    assert want.keys() == have.keys() and all(torch.equal(want[k], have[k]) for k in want)
    assert torch.equal(want_ranks.ranks, have_ranks.ranks) and torch.equal(want_ranks.n_candidates, have_ranks.n_candidates)
    for field in ("inv_q", "inv_q2", "beating", "unreachable", "profile", "beat_bins", "miss_bins", "positive_weight"):
        assert torch.equal(getattr(want_ranks.popularity_stats, field), getattr(have_ranks.popularity_stats, field))
    if share:
        assert torch.equal(want_ranks.share_ranks, have_ranks.share_ranks)
        assert torch.equal(want_ranks.inclusion, have_ranks.inclusion)
    assert np.array_equal(np.asarray(want_hist), np.asarray(have_hist))
    assert torch.equal(want_rows, have_rows)  # the counted rows, in the order appended
    assert n_read == want_rows.shape[0] < n_deferred == 4 * 6 * 2  # the read compacts; the deferred path keeps B x P


@pytest.mark.filterwarnings("ignore:The ``compute`` method:UserWarning")
@pytest.mark.parametrize("kind", ["exact", "sampled"])
def test_invalid_batch_is_counted_in_range_on_a_tiny_catalogue(kind, monkeypatch):
    """A duplicated positive where exclusions and positives outnumber the catalogue (E + P > n): the removed items
    counted exceed n, yet the accelerator's path counts the batch in range (histogram row clamped; refused at
    compute), never indexing outside its state."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    metric = _deferring_metric(kind)
    scores = torch.randn(2, 4, dtype=torch.float64)
    pos, exc = torch.tensor([[0, 0], [1, -1]]), torch.tensor([[1, 2, 3], [0, 2, -1]])
    _feed_batch(metric, "scores", dict(scores=scores, pos=pos, exc=exc, ids=torch.arange(2)))
    with pytest.raises(ValueError, match=r"^positives: .*\[check 'positives_duplicates', first failed at update 1"):
        metric.compute()
