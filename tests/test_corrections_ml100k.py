"""Real data: MovieLens 100k (shipped in the recbole wheel), the paper's recommenders X (iALS),
Y (ItemKNN q=3), Z (ItemKNN q=1, k'=10) and popularity; m = 100, 100 sampling repeats (Table 4).

Finding (see docs/corrections.md): on ml-100k (n ~ 1,600 candidates, so m = 100 is a 6% sample) the
uncorrected sampled metric is already nearly unbiased for most pairs, and bv (gamma = 0.1) trades its
small bias for variance: it does NOT order every pair at least as often as the uncorrected metric
(e.g. NDCG@10, iALS vs ItemKNN(q=3): 100 vs 92 of 100). What holds, and is tested: wherever the
uncorrected metric orders a pair wrongly in most runs, bv orders it correctly in most runs; and bv's
expected value is closer to the exact metric than the uncorrected one for every recommender.
The issue's literal claim is kept as a strict xfail so that the suite notices if it ever holds.
"""

import numpy as np
import pytest
import torch

datasets = pytest.importorskip("reco_sampled_plugin.datasets")
baselines = pytest.importorskip("reco_sampled_plugin.baselines")

from reco_sampled_plugin.consistency import consistency_report, ordering_agreement  # noqa: E402
from reco_sampled_plugin.ranking import exact_ranks  # noqa: E402

pytestmark = pytest.mark.slow
METRICS = ["recall@10", "ndcg@10", "ap"]


@pytest.fixture(scope="module")
def ml100k():
    try:
        split = datasets.load_ml100k()
    except (FileNotFoundError, ImportError) as exc:  # recbole wheel absent
        pytest.skip(f"MovieLens 100k not available: {exc}")
    users = split.test_users
    test = torch.from_numpy(split.test_items[users])
    train = split.train[users]
    exclude = torch.from_numpy(train.toarray() > 0)
    n_candidates = torch.from_numpy(split.n_items - np.diff(train.indptr)).to(torch.int64)
    models = baselines.train_all(split.train, seed=0)
    ranks = {
        name: exact_ranks(model.score(users), test, exclude, count_other_positives=False).reshape(-1)
        for name, model in models.items()
    }
    out = ordering_agreement(ranks, n_candidates, 100, METRICS, ["none", "bv:0.1"], repeats=100, seed=0)
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
    ranks, n, _ = ml100k
    rep = consistency_report(ranks, n, 100, METRICS, ["none", "bv:0.1"], repeats=0)
    for row in rep["table3"]:
        assert abs(row["bv:0.1"] - row["exact"]) < abs(row["none"] - row["exact"]), row


@pytest.mark.xfail(strict=True, reason="false on ml-100k: bv adds variance where sampling is nearly unbiased")
def test_issue_claim_bv_orders_every_pair_at_least_as_often(ml100k):
    _, _, out = ml100k
    for metric in METRICS:
        for pair, count_none in out["counts"][metric]["none"].items():
            assert out["counts"][metric]["bv:0.1"][pair] >= count_none, (metric, pair)
