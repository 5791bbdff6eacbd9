"""Real data: MovieLens 100k (shipped in the recbole wheel), the paper's recommenders X (iALS),
Y (ItemKNN q=3), Z (ItemKNN q=1, k'=10) and popularity; m = 100, 100 sampling repeats (Table 4).

Finding (see docs/corrections.md): on ml-100k (n ~ 1,600 candidates, so m = 100 is a 6% sample) the
uncorrected sampled metric is already nearly unbiased for most pairs, and bv (gamma = 0.1) trades its
small bias for variance: it does NOT order every pair at least as often as the uncorrected metric
(e.g. NDCG@10, iALS vs ItemKNN(q=3): 100 vs 92 of 100). What holds, and is tested: wherever the
uncorrected metric orders a pair wrongly in most runs, bv orders it correctly in most runs; and bv's
expected value is closer to the exact metric than the uncorrected one for every recommender.
The claim as first stated (bv orders every pair at least as often) is kept as a strict xfail so that the suite
notices if it ever holds.
"""

import numpy as np
import pytest
import torch

from reco_sampled_plugin import baselines, datasets
from reco_sampled_plugin.consistency import consistency_report  # noqa: E402
from reco_sampled_plugin.ranking import exact_ranks  # noqa: E402

pytestmark = pytest.mark.slow
METRICS = ["recall@10", "ndcg@10", "ap"]


@pytest.fixture(scope="module")
def ml100k(ml100k_split, ml100k_models):
    split = ml100k_split  # the session's split and trained recommenders (tests/conftest.py)
    users = split.test_users
    test = torch.from_numpy(split.test_items[users])
    train = split.train[users]
    exclude = torch.from_numpy(train.toarray() > 0)
    n_candidates = torch.from_numpy(split.n_items - np.diff(train.indptr)).to(torch.int64)
    models = ml100k_models
    ranks = {
        name: exact_ranks(model.score(users), test, exclude, count_other_positives=False).reshape(-1)
        for name, model in models.items()
    }
    out = consistency_report(ranks, n_candidates, 100, METRICS, ["none", "bv:0.1"], repeats=100, seed=0)
    return ranks, n_candidates, out


def test_exact_ranks_and_distinct_recommenders(ml100k):
    ranks, n, out = ml100k
    for r in ranks.values():
        assert int(r.min()) >= 1 and bool((r <= n).all())
    for metric in METRICS:
        values = sorted(out["exact"][metric].values())
        assert all(b - a > 1e-3 for a, b in zip(values, values[1:])), (metric, out["exact"][metric])


def test_bv_fixes_the_pairs_the_uncorrected_metric_gets_wrong(ml100k):
    _, _, out = ml100k
    wrong = 0
    for metric in METRICS:
        for pair, count_none in out["counts"][metric]["none"].items():
            count_bv = out["counts"][metric]["bv:0.1"][pair]
            if count_none < 50:
                wrong += 1
                assert count_bv > 50 and count_bv > count_none, (metric, pair, count_bv, count_none)
    assert wrong >= 1  # ItemKNN(q=3) vs ItemKNN(q=1,k'=10) on Recall@10: 6 of 100 uncorrected


def test_bv_expected_value_closer_to_exact(ml100k):
    _, _, rep = ml100k  # the report's Table 3 (the same with or without its Monte Carlo runs)
    for row in rep["table3"]:
        assert abs(row["bv:0.1"] - row["exact"]) < abs(row["none"] - row["exact"]), row


@pytest.mark.xfail(strict=True, reason="false on ml-100k: bv adds variance where sampling is nearly unbiased")
def test_the_claim_that_bv_orders_every_pair_at_least_as_often(ml100k):
    _, _, out = ml100k
    for metric in METRICS:
        for pair, count_none in out["counts"][metric]["none"].items():
            assert out["counts"][metric]["bv:0.1"][pair] >= count_none, (metric, pair)


@pytest.fixture(scope="module")
def rank_distribution_runs(ml100k):
    """m = 100, 20 repeats: HR@10 and NDCG@10 from the uncorrected metric and batched mle / mes fits."""
    from reco_sampled_plugin._rank_hist import pool_by_n, sampled_rank_histogram
    from reco_sampled_plugin.metrics import metric_values
    from reco_sampled_plugin.rank_distribution import fit_rank_distribution
    from reco_sampled_plugin.simulate import draw_sampled_ranks

    ranks, n, _ = ml100k
    metrics, m, repeats = ["hit@10", "ndcg@10"], 100, 20
    exact, est = {}, {"none": {}, "mle": {}, "mes": {}}
    for i, (name, r) in enumerate(ranks.items()):
        exact[name] = np.array([float(metric_values(mt, r, n).mean()) for mt in metrics])
        draws = draw_sampled_ranks(r.numpy(), n.numpy(), m, repeats=repeats, seed=100 + i)
        est["none"][name] = np.stack(
            [[float(metric_values(mt, torch.as_tensor(d), m + 1).mean()) for mt in metrics] for d in draws]
        )
        hists = [pool_by_n(sampled_rank_histogram(d, n.numpy(), m), 0.1) for d in draws]
        for method in ("mle", "mes"):
            est[method][name] = np.stack([f.values(metrics) for f in fit_rank_distribution(hists, method)])

    def rel_err(method):  # (recommenders, metrics)
        return np.array([np.mean(np.abs(est[method][k] - exact[k]) / exact[k], axis=0) for k in ranks])

    def agreement(method):  # per (pair, metric) with exact values > 5% apart: share of repeats ordered right
        out, names = [], list(ranks)
        for a in range(len(names)):
            for b in range(a + 1, len(names)):
                ea, eb = exact[names[a]], exact[names[b]]
                same = np.sign(est[method][names[a]] - est[method][names[b]]) == np.sign(ea - eb)
                out.extend(same.mean(axis=0)[np.abs(ea - eb) / np.maximum(ea, eb) > 0.05])
        return np.array(out)

    best = min(("mle", "mes"), key=lambda mt: rel_err(mt).mean())
    return best, rel_err, agreement


def test_best_rank_distribution_estimator_beats_uncorrected(rank_distribution_runs):
    """The fitted estimators on ml-100k (docs/research-notes.md, "Accuracy on MovieLens 100k"; full table:
    benchmarks/accuracy_ml100k.py). At m = 100 the better of mle / mes has a smaller mean relative error than the
    uncorrected sampled metric for HR@10 and NDCG@10 on every recommender; on ordering it fixes what the uncorrected
    metric gets wrong: every pair the uncorrected metric orders wrongly in most repeats it orders rightly in most, and
    its worst pair is better. (Its mean agreement is lower: see the xfail below.)"""
    best, rel_err, agreement = rank_distribution_runs
    assert np.all(rel_err(best) < rel_err("none")), (best, rel_err(best), rel_err("none"))
    assert np.all(rel_err(best) < 0.5)  # the uncorrected metric is off by 300-600% here
    ours, plain = agreement(best), agreement("none")
    assert np.any(plain < 0.5)  # the case exists on this data (HR@10, ItemKNN q=3 vs q=1)
    assert np.all(ours[plain < 0.5] > 0.5), (ours, plain)
    assert ours.min() > plain.min()


@pytest.mark.xfail(strict=True, reason="false on ml-100k: the uncorrected metric orders most pairs right "
                   "every time (low variance), the estimators trade that for variance (docs/research-notes.md)")
def test_the_claim_that_the_best_rank_distribution_orders_pairs_at_least_as_often(rank_distribution_runs):
    best, _, agreement = rank_distribution_runs
    assert agreement(best).mean() >= agreement("none").mean()
