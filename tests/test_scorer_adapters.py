"""The adapters' scorer path: SampledRankingMetrics.update_from_scorer and the Lightning callback's scorer= evaluate
through a pointwise scorer, never a score matrix, and give the state (histogram) the score path gives on the
materialised matrix with the same instance ids: fixed m, without replacement, adaptive stages; a failing scorer
leaves the state as it was; 2 DDP processes (gloo) equal 1."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st
from _profiles import examples

sys.path.insert(0, str(Path(__file__).resolve().parent))
import _forkserver  # noqa: E402
import _lightning_helpers as H  # noqa: E402

from reco_sampled_plugin import SamplingDesign, registry  # noqa: E402
from reco_sampled_plugin.adapters._shared import adaptive_histogram_from_rows  # noqa: E402
from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")

N = 300
DESIGNS = {
    "fixed": dict(n_samples=10),
    "no_replacement": dict(n_samples=SamplingDesign(10, replacement=False)),
    "small_pool_no_replacement": dict(n_samples=SamplingDesign(40, replacement=False)),  # pools of <= 4m: the top-k keyed draw
    "adaptive": dict(n_samples=SamplingDesign(4, adaptive_max=64), estimators=("none", registry.Mes(n_bootstrap=2))),
    "adaptive_top3": dict(n_samples=SamplingDesign(4, adaptive_max=64, adaptive_top=3),
                          estimators=("none", registry.Mes(n_bootstrap=2))),
}


class MatrixScorer:
    """A scorer that reads a materialised (users x n) score matrix pair by pair, recording each call's shape."""

    def __init__(self, scores: torch.Tensor) -> None:
        self.scores = scores
        self.shapes: list[tuple[int, int]] = []

    def __call__(self, users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        assert users.dtype == torch.int64 and items.dtype == torch.int64 and users.shape == items.shape[:1]
        self.shapes.append(tuple(items.shape))
        return self.scores[users.unsqueeze(1), items]


def _data(seed: int = 0, b: int = 40, n: int = N, ties: bool = True):
    """Scores with ties (rounded), 1-2 positives per row (padded with -1), exclusions of 0..n/2 items; every third
    row of the mask has no positive at all (a row with nothing to rank)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g)
    if ties:
        scores = scores.round(decimals=1)
    order = torch.argsort(torch.rand(b, n, generator=g), dim=1)
    pos = order[:, :2].clone()
    pos[torch.arange(b) % 3 != 0, 1] = -1
    pos[torch.arange(b) % 7 == 6] = -1  # rows without a positive
    exclude = torch.zeros(b, n, dtype=torch.bool)
    for r in range(b):
        exclude[r, order[r, 2:2 + (r * 37) % (n // 2)]] = True
    return scores, pos, exclude


def _pair(kw):
    return SampledRankingMetrics(["ndcg@10", "hit@5"], **kw), SampledRankingMetrics(["ndcg@10", "hit@5"], **kw)


def _state(metric):
    return metric.hist.clone(), int(metric.n_items), metric._rows_seen


def _assert_same_state(a, b):
    assert a.hist.shape == b.hist.shape
    assert torch.equal(a.hist, b.hist)
    assert int(a.n_items) == int(b.n_items)


# ---------------------------------------------------------------------------------- the same state as from scores
@pytest.mark.parametrize("design", sorted(DESIGNS))
def test_scorer_state_equals_score_state(design, device):
    """Batches of different sizes, ids given (shuffled), users != ids, a keep mask, small max_pairs: the scorer
    path's histogram equals the score path's on the materialised matrix, and so do the estimates (on every
    device: the scorer gets its items on the positives' device)."""
    scores, pos, exclude = (x.to(device) for x in _data())
    kw = dict(DESIGNS[design], max_n_groups=None)
    by_scores, by_scorer = (m.to(device) for m in _pair(kw))
    ids = (torch.randperm(40, generator=torch.Generator().manual_seed(3)) + 1000).to(device)
    users = torch.arange(40, device=device)
    keep = torch.arange(40, device=device) % 5 != 4
    scorer = MatrixScorer(scores)
    for lo, hi in ((0, 13), (13, 14), (14, 40)):
        by_scores.update(scores[lo:hi], pos[lo:hi], exclude[lo:hi], ids=ids[lo:hi], keep=keep[lo:hi])
        by_scorer.update_from_scorer(scorer, pos[lo:hi], N, exclude[lo:hi], ids=ids[lo:hi], users=users[lo:hi],
                                     keep=keep[lo:hi], max_pairs=50)
    _assert_same_state(by_scores, by_scorer)
    assert by_scores.hist.sum() == int(((pos >= 0) & keep.unsqueeze(1)).sum())
    got, want = by_scorer.compute(), by_scores.compute()
    assert got.keys() == want.keys()
    for k in want:
        assert torch.equal(got[k], want[k]) or (torch.isnan(got[k]) and torch.isnan(want[k])), k
    assert max(r * c for r, c in scorer.shapes) <= 50  # the max_pairs budget, call by call
    cost = by_scorer.scoring_cost()
    assert cost.pairs == sum(r * c for r, c in scorer.shapes) and cost.calls == len(scorer.shapes)


@pytest.mark.parametrize("design", ["fixed", "adaptive"])
def test_default_ids_and_forms_match_the_score_path(design):
    """No ids (the running row counter keys both paths alike), numpy positives as a bool mask, exclusions as padded
    indices; users default to the instance ids."""
    scores, pos, exclude = _data(seed=1, b=30)
    mask = torch.zeros(30, N, dtype=torch.bool)
    valid = pos >= 0
    mask[torch.arange(30).unsqueeze(1).expand_as(pos)[valid], pos[valid]] = True
    exc_idx = torch.full((30, N), -1)
    for r in range(30):
        e = exclude[r].nonzero().squeeze(1)
        exc_idx[r, :len(e)] = e
    by_scores, by_scorer = _pair(DESIGNS[design])
    seen = []

    def scorer(users, items):
        seen.append(users.clone())
        return scores[users.unsqueeze(1), items]

    for lo, hi in ((0, 11), (11, 30)):
        by_scores.update(scores[lo:hi], mask[lo:hi].numpy(), exc_idx[lo:hi])
        by_scorer.update_from_scorer(scorer, mask[lo:hi].numpy(), N, exc_idx[lo:hi])
    _assert_same_state(by_scores, by_scorer)
    assert set(torch.cat(seen).tolist()) == {r for r in range(30) if valid[r].any()}  # the row counter


@settings(max_examples=examples(15), deadline=None)
@given(seed=st.integers(0, 10_000), m=st.integers(1, 12), b=st.integers(1, 9), n=st.integers(15, 60),
       replacement=st.booleans(), max_pairs=st.integers(1, 40), seed_key=st.integers(0, 2**40))
def test_scorer_equals_scores_hypothesis(seed, m, b, n, replacement, max_pairs, seed_key):
    scores, pos, exclude = _data(seed=seed, b=b, n=n)
    exclude[:, n // 3:] = False  # a pool of at least 2n/3 - 2 items: enough for m without replacement
    kw = dict(n_samples=SamplingDesign(m, replacement=replacement), seed=seed_key)
    by_scores, by_scorer = _pair(kw)
    by_scores.update(scores, pos, exclude)
    scorer = MatrixScorer(scores)
    by_scorer.update_from_scorer(scorer, pos, n, exclude, max_pairs=max_pairs)
    _assert_same_state(by_scores, by_scorer)
    assert all(r * c <= max_pairs for r, c in scorer.shapes)
    assert by_scorer.scoring_cost().pairs == int((pos >= 0).sum()) * (1 + m)  # the positives once, each draw once


def test_adaptive_scores_only_the_positives_still_first():
    """Pairs scored = sum over positives of 1 + the final number of draws M (read from the adaptive histogram, an
    independent count): a positive that stops at stage s never draws (or scores) the later stages' items; the
    positives' scores are never asked for twice."""
    scores, pos, exclude = _data(seed=2, ties=False)
    scores = scores + 3.0 * torch.arange(N) / N  # high ranks for high item indices: many positives go on
    design = SamplingDesign(4, adaptive_max=256)
    metric = SampledRankingMetrics(["ndcg@10"], design, estimators=("none",), max_n_groups=None)
    scorer = MatrixScorer(scores)
    metric.update_from_scorer(scorer, pos, N, exclude)
    hist, _ = adaptive_histogram_from_rows(metric.hist.numpy(), N, metric._adaptive, None)
    want = sum(float(c.sum()) * (1 + m) for c, m in zip(hist.counts, hist.n_samples))
    cost = metric.scoring_cost()
    assert cost.pairs == want
    assert len(set(hist.n_samples.tolist())) >= 3  # several stages reached: the check is not vacuous
    assert cost.stages == len(metric._adaptive.stages)
    n_exc = exclude.sum(1)
    assert cost.full_pairs == int(((N - n_exc) * (pos >= 0).any(1)).sum())
    assert cost.share_of_full == pytest.approx(cost.pairs / cost.full_pairs)


# ---------------------------------------------------------------------------------- state, merge, sync, reset
def test_merge_reset_and_forward_unchanged():
    """Two halves through the scorer merged = the whole through scores; reset empties the state and the cost."""
    scores, pos, exclude = _data(seed=4)
    whole = SampledRankingMetrics(["ndcg@10"], n_samples=8)
    whole.update(scores, pos, exclude, ids=torch.arange(40))
    a, b = SampledRankingMetrics(["ndcg@10"], n_samples=8), SampledRankingMetrics(["ndcg@10"], n_samples=8)
    scorer = MatrixScorer(scores)
    a.update_from_scorer(scorer, pos[:17], N, exclude[:17], ids=torch.arange(17), users=torch.arange(17))
    b.update_from_scorer(scorer, pos[17:], N, exclude[17:], ids=torch.arange(17, 40), users=torch.arange(17, 40))
    a.merge_state(b)
    _assert_same_state(a, whole)
    assert a.compute().keys() == whole.compute().keys()
    assert a.scoring_cost().pairs > 0
    a.reset()
    assert a.hist.numel() == 0 and a.scoring_cost().pairs == 0 and a.scoring_cost().calls == 0


def _nan_scorer(users, items):
    out = torch.rand(items.shape, device=items.device)
    out[0, 0] = float("nan")
    return out


def _wrong_shape(users, items):
    return torch.zeros(items.shape[0], items.shape[1] + 1, device=items.device)


def _wrong_dtype(users, items):
    return torch.zeros(items.shape, dtype=torch.bool, device=items.device)


def _wrong_device(users, items):
    return torch.zeros(items.shape, device="meta")


def _not_a_tensor(users, items):
    return items.tolist()


class _FailsOnCall:
    """Good answers until call ``k``, which raises (a scorer that dies mid-batch: earlier calls were fine)."""

    def __init__(self, scores, k):
        self.scores, self.k, self.calls = scores, k, 0

    def __call__(self, users, items):
        self.calls += 1
        if self.calls == self.k:
            raise RuntimeError("CUDA out of memory (simulated)")
        return self.scores[users.unsqueeze(1), items]


@pytest.mark.parametrize("bad,match", [
    (_nan_scorer, "non-finite"), (_wrong_shape, "shape"), (_wrong_dtype, "dtype"), (_wrong_device, "device"),
    (_not_a_tensor, "list"), ("fails_mid_batch", "RuntimeError"), ("fails_in_a_stage", "RuntimeError")])
def test_a_failing_scorer_leaves_the_state_as_it_was(bad, match, device):
    """The ValueError names the scorer and the call; hist, n_items and the row counter are unchanged, so the next
    good batch gives what it gives without the failure (default ids included)."""
    scores, pos, exclude = (x.to(device) for x in _data(seed=5))
    kw = DESIGNS["adaptive"] if bad == "fails_in_a_stage" else dict(n_samples=6)
    metric, reference = (m.to(device) for m in _pair(kw))
    good = MatrixScorer(scores)
    for m in (metric, reference):
        m.update_from_scorer(good, pos[:10], N, exclude[:10])
    before = _state(metric)
    cost_before = metric.scoring_cost()
    if bad == "fails_mid_batch":
        bad = _FailsOnCall(scores, 3)
    elif bad == "fails_in_a_stage":
        bad = _FailsOnCall(scores, 2)  # call 1: stage 0 (max_pairs large), call 2: the first adaptive stage
    name = getattr(bad, "__qualname__", None) or type(bad).__name__
    with pytest.raises(ValueError, match=match) as err:
        metric.update_from_scorer(bad, pos[10:30], N, exclude[10:30], max_pairs=10**6 if
                                  isinstance(bad, _FailsOnCall) and bad.k == 2 else 40)
    assert f"scorer {name!r}" in str(err.value) and "call " in str(err.value) and "rows from row" in str(err.value)
    after = _state(metric)
    assert torch.equal(before[0], after[0]) and before[1:] == after[1:]
    assert metric.scoring_cost() == cost_before
    for m in (metric, reference):  # the next batch: the same default ids as if the failure never happened
        m.update_from_scorer(good, pos[30:], N, exclude[30:])
    _assert_same_state(metric, reference)


def test_a_first_batch_that_fails_leaves_no_catalogue_behind():
    """A failure on the very first batch leaves the catalogue unset: a later batch of another catalogue is
    accepted, as on a fresh metric."""
    scores, pos, exclude = _data(seed=6)
    metric = SampledRankingMetrics(["ndcg@10"], n_samples=5)
    with pytest.raises(ValueError, match="scorer"):
        metric.update_from_scorer(_wrong_shape, pos, N, exclude)
    small = scores[:, :200]
    keep_pos = torch.where(pos < 200, pos, -1)
    metric.update_from_scorer(MatrixScorer(small), keep_pos, 200, exclude[:, :200])
    fresh = SampledRankingMetrics(["ndcg@10"], n_samples=5)
    fresh.update(small, keep_pos, exclude[:, :200])
    _assert_same_state(metric, fresh)


def test_bad_arguments_are_named():
    scores, pos, exclude = _data(seed=7, b=5)
    metric = SampledRankingMetrics(["ndcg@10"], n_samples=5)
    good = MatrixScorer(scores)
    cases = [
        (dict(scorer="score"), "scorer"), (dict(max_pairs=0), "max_pairs"), (dict(max_pairs=2.0), "max_pairs"),
        (dict(users=torch.arange(4)), "users"), (dict(users=torch.rand(5)), "users"), (dict(n_items=0), "n_items"),
        (dict(keep=torch.ones(4, dtype=torch.bool)), "keep"), (dict(ids=torch.rand(5)), "ids"),
        (dict(positives=torch.full((5, 1), N)), "positives"),
    ]
    for override, name in cases:
        args = {**dict(scorer=good, positives=pos, n_items=N, exclude=exclude), **override}
        with pytest.raises(ValueError, match=name):
            metric.update_from_scorer(**args)
        assert metric.hist.numel() == 0 and metric._rows_seen == 0
    metric2 = SampledRankingMetrics(["ndcg@10"], n_samples=5)
    metric2.update(scores, pos, exclude)
    with pytest.raises(ValueError, match="items"):  # another catalogue than the earlier batches
        metric2.update_from_scorer(good, pos, N + 1)


# ------------------------------------------------------------------------------------------------ Lightning
def _trainer(tmp_path, callbacks, **kw):
    import lightning.pytorch as pl

    args = dict(accelerator="cpu", devices=1, logger=False, enable_checkpointing=False, enable_model_summary=False,
                enable_progress_bar=False, default_root_dir=str(tmp_path))
    args.update(kw)
    return pl.Trainer(callbacks=callbacks, **args)


def _loader(batch_size=8):
    from torch.utils.data import DataLoader

    return DataLoader(H.UserDataset(), batch_size=batch_size)


METRICS = ("ndcg@10", "hit@5")
CB = dict(n_samples=12, estimators=("none", "bv"), max_n_groups=None)
ADAPTIVE = dict(n_samples=SamplingDesign(4, adaptive_max=32), estimators=("none", registry.Mes(n_bootstrap=2)),
                max_n_groups=None)


def _callbacks(scorer, **extra):
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    extra = extra if scorer is None else dict(extra, scorer=scorer, max_pairs=64)
    return [RankingMetricsCallback(RankingSettings(METRICS, exact=False, **CB), **extra),
            RankingMetricsCallback(RankingSettings(METRICS, exact=False, **ADAPTIVE), prefix="ad_", **extra)]


@pytest.mark.parametrize("scorer", ["score_pairs", "callable", "score_fn"])
def test_callback_scorer_logs_what_the_score_path_logs(tmp_path, scorer):
    """The same model evaluated from its full score rows and through its scorer (a method name, or a callable given
    to the callback; the batch from the step or from score_fn): the same results, bit for bit; the cost is logged
    and only the drawn pairs were scored."""
    by_scores = _callbacks(None)
    _trainer(tmp_path / "s", by_scores).validate(H.ScorerModule(protocol="step"), _loader(), verbose=False)
    # score_fn: the callback reads the ScorerBatch from score_fn(pl_module, batch), not from the step
    by_scorer = _callbacks(H.pair_scorer if scorer == "callable" else "score_pairs",
                           **({"score_fn": H.score_fn} if scorer == "score_fn" else {}))
    model = H.ScorerModule(protocol="scorer")
    trainer = _trainer(tmp_path / "p", by_scorer)
    trainer.validate(model, _loader(), verbose=False)
    for a, b in zip(by_scores, by_scorer):
        got, want = b.results["validate"], a.results["validate"]
        assert got.keys() == want.keys() and len(got) == len(METRICS) * 2
        for k in want:
            assert (got[k].value, got[k].stderr, got[k].n_instances) == \
                (want[k].value, want[k].stderr, want[k].n_instances), k
    n_pos = int((H.synthetic_data()[2] >= 0).sum())
    fixed = by_scorer[0].scoring_costs["val"]
    assert fixed.pairs == n_pos * (1 + CB["n_samples"])
    assert model.pairs_scored == fixed.pairs + by_scorer[1].scoring_costs["ad_val"].pairs
    logged = trainer.callback_metrics
    assert float(logged["val/scoring/pairs"]) == fixed.pairs
    assert float(logged["val/scoring/share_of_full"]) == pytest.approx(fixed.share_of_full, rel=1e-6)
    assert fixed.share_of_full < 0.1
    assert "val/ndcg_at_10/bv" in logged and "ad_val/adaptive/mean_samples" in logged


def test_callback_scorer_protocol_errors(tmp_path):
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    with pytest.raises(ValueError, match="scorer: exact metrics"):
        RankingMetricsCallback(RankingSettings(METRICS), scorer="score_pairs")
    sampled = RankingSettings(METRICS, exact=False, **CB)
    with pytest.raises(ValueError, match="scorer"):
        RankingMetricsCallback(sampled, scorer=3)
    with pytest.raises(ValueError, match="max_pairs"):
        RankingMetricsCallback(sampled, scorer="score_pairs", max_pairs=0)
    cb = RankingMetricsCallback(sampled)  # no scorer: a batch without scores is refused
    with pytest.raises(ValueError, match="scorer="):
        _trainer(tmp_path / "a", [cb]).validate(H.ScorerModule(), _loader(), verbose=False)
    cb = RankingMetricsCallback(sampled, scorer="no_such_method")
    with pytest.raises(ValueError, match="no_such_method"):
        _trainer(tmp_path / "b", [cb]).validate(H.ScorerModule(), _loader(), verbose=False)


def _spawned(tmp_path, tag, devices, strategy="auto"):
    folder = tmp_path / tag
    folder.mkdir()
    callbacks = _callbacks("score_pairs")
    trainer = _trainer(tmp_path / f"root_{tag}", callbacks + [H.DumpResults(str(folder)),
                                                              H.DumpScoringCosts(str(folder))],
                       devices=devices, strategy=strategy)
    trainer.validate(H.ScorerModule(return_ids=False), _loader(), verbose=False)
    return {p.name: json.loads(p.read_text()) for p in sorted(folder.glob("*.json"))}


@pytest.mark.slow
def test_callback_scorer_ddp_two_processes_equal_one(tmp_path):
    """37 users over 2 gloo processes (the DistributedSampler pads user 0 onto process 1 and the callback drops it
    before scoring): every synced estimate equals the 1-process run's, fixed and adaptive, and so does the scoring
    cost summed over the processes (the padding row is never scored)."""
    two = _spawned(tmp_path, "ddp", devices=2, strategy=_forkserver.lightning_ddp())
    one = _spawned(tmp_path, "one", devices=1)
    assert sorted(two) == ["cost0_of2.json", "cost1_of2.json", "rank0_of2.json", "rank1_of2.json"]
    c0, c1, c_ref = two.pop("cost0_of2.json"), two.pop("cost1_of2.json"), one.pop("cost0_of1.json")
    assert c0["pairs_scored_here"] + c1["pairs_scored_here"] == c_ref["pairs_scored_here"]
    for k in ("val", "ad_val"):
        assert c0[k] == c1[k] and c0[k][0] == c_ref[k][0] and c0[k][2] == c_ref[k][2], k  # pairs, full pairs
    assert c0["val"][0] + c0["ad_val"][0] == c_ref["pairs_scored_here"]
    r0, r1, ref = two["rank0_of2.json"], two["rank1_of2.json"], one["rank0_of1.json"]
    assert len(ref) == len(METRICS) * 4
    n_pos = int((H.synthetic_data()[2] >= 0).sum())
    for k in ref:
        assert r0[k] == r1[k], k
        assert np.allclose(r0[k], ref[k], rtol=0, atol=1e-12), k
        assert r0[k][2] == n_pos
