"""Metric catalogue: names, M(r) closed forms, the paper's Table 1, torchmetrics parity, the demo."""

import numpy as np
import pytest
import torch
import torchmetrics.functional.retrieval as tmr

from reco_sampled_plugin import MetricSpec, metric_values, parse_metric, per_user_metrics
from reco_sampled_plugin.cli import main
from reco_sampled_plugin.toy import TABLE1_N_ITEMS, TABLE1_RANKS, toy_table

# Krichene & Rendle Table 1 (AUC, AP, NDCG, Recall@10), as printed
TABLE1 = {"A": [0.990, 0.010, 0.150, 0.000], "B": [0.555, 0.010, 0.122, 0.000], "C": [0.843, 0.101, 0.208, 0.200]}


@pytest.mark.parametrize(
    "name,kind,k,column",
    [
        ("ndcg@10", "ndcg", 10, "NDCG@10"),
        ("NDCG@10", "ndcg", 10, "NDCG@10"),
        ("recall@5", "recall", 5, "R@5"),
        ("precision@5", "precision", 5, "P@5"),
        ("p@3", "precision", 3, "P@3"),
        ("tp@3", "trunc_precision", 3, "TP@3"),
        ("ap@10", "ap", 10, "AP@10"),
        ("map@10", "ap", 10, "AP@10"),
        ("tap@4", "trunc_ap", 4, "TAP@4"),
        ("hit@10", "hit", 10, "Hit@10"),
        ("hr@10", "hit", 10, "Hit@10"),
        ("rr@10", "rr", 10, "RR@10"),
        ("mrr", "rr", None, "RR@all"),
        ("auc", "auc", None, "ROC_AUC"),
        ("roc_auc", "auc", None, "ROC_AUC"),
        ("pr_auc", "ap", None, "PR_AUC"),
        ("ap", "ap", None, "PR_AUC"),
    ],
)
def test_parse_names(name, kind, k, column):
    spec = parse_metric(name)
    assert spec == MetricSpec(kind, k)
    assert spec.column == column
    assert parse_metric(str(spec)) == spec


@pytest.mark.parametrize("bad,match", [("ndcg@0", "k must be >= 1"), ("ndcg@-3", "k must be >= 1"), ("foo@10", "unknown metric"),
                                       ("recall", "needs a cut-off"), ("auc@10", "no cut-off"), ("ndcg@", "cannot parse"), ("", "cannot parse")])
def test_parse_errors(bad, match):
    with pytest.raises(ValueError, match=match):
        parse_metric(bad)


def test_closed_forms():
    n = 50
    r = torch.arange(1, n + 1)
    rf = r.double()
    inside = (rf <= 10).double()
    torch.testing.assert_close(metric_values("auc", r, n), (n - rf) / (n - 1))
    torch.testing.assert_close(metric_values("precision@10", r, n), inside / 10)
    torch.testing.assert_close(metric_values("recall@10", r, n), inside)
    torch.testing.assert_close(metric_values("hit@10", r, n), inside)
    torch.testing.assert_close(metric_values("ap@10", r, n), inside / rf)
    torch.testing.assert_close(metric_values("mrr", r, n), 1 / rf)
    torch.testing.assert_close(metric_values("ndcg@10", r, n), inside / torch.log2(rf + 1))
    torch.testing.assert_close(metric_values("ndcg", r, n), 1 / torch.log2(rf + 1))
    # per-instance candidate counts broadcast
    got = metric_values("auc", torch.tensor([1, 5]), torch.tensor([10, 20]))
    torch.testing.assert_close(got, torch.tensor([1.0, 15 / 19], dtype=torch.float64))


def test_table1_exactly():
    for name, ranks in TABLE1_RANKS.items():
        r = torch.tensor(ranks)
        got = [float(metric_values(m, r, TABLE1_N_ITEMS).mean()) for m in ("auc", "ap", "ndcg", "recall@10")]
        np.testing.assert_allclose(got, TABLE1[name], atol=5e-4)
    table = toy_table()
    exact_best = {m: max(table, key=lambda k: table[k][m][0]) for m in ("ap", "ndcg", "recall@10")}
    sampled_best = {m: max(table, key=lambda k: table[k][m][1]) for m in ("ap", "ndcg", "recall@10")}
    assert set(exact_best.values()) == {"C"} and "C" not in sampled_best.values()


def test_metric_values_bad_input():
    with pytest.raises(ValueError, match="ranks"):
        metric_values("ndcg@10", torch.tensor([0]), 100)
    with pytest.raises(ValueError, match="ranks"):
        metric_values("ndcg@10", torch.tensor([101]), 100)
    with pytest.raises(ValueError, match="larger than the candidate list"):
        metric_values("recall@20", torch.tensor([1]), 10)
    with pytest.raises(ValueError, match="n_items"):
        metric_values("auc", torch.tensor([1]), 1)
    with pytest.raises(ValueError, match="ranks"):
        metric_values("ndcg", torch.tensor([float("nan")]), 10)
    # candidate counts never widen the ranks' shape (AUC gave (4, 6) values for 6 ranks, NDCG@5 (6,))
    r, n = torch.tensor([1, 2, 3, 6, 1, 4]), torch.tensor([[9], [9], [9], [10]])
    for metric in ("ndcg@5", "auc", "ap"):
        with pytest.raises(ValueError, match=r"^n_items: shape \(4, 1\) does not broadcast to the shape \(6,\)"):
            metric_values(metric, r, n)
        assert metric_values(metric, r.view(2, 3), torch.tensor([[9], [10]])).shape == (2, 3)  # per row: taken


def test_per_user_metrics_bad_k():
    with pytest.raises(ValueError, match="larger than the candidate list"):
        per_user_metrics(torch.randn(2, 5), torch.tensor([0, 1]), ["recall@10"])
    with pytest.raises(ValueError, match="relevance"):
        per_user_metrics(torch.randn(2, 5), torch.tensor([0, 1]), ["ndcg@3"], relevance=torch.tensor([[-1.0], [1.0]]))


def test_torchmetrics_parity():
    """Shared metrics agree with torchmetrics' retrieval functions, user by user (no ties)."""
    gen = torch.Generator().manual_seed(4)
    b, n, k = 40, 30, 5
    scores = torch.randn(b, n, generator=gen, dtype=torch.float64)
    target = torch.rand(b, n, generator=gen) < 0.15
    target[:, 0] = True
    exclude = (torch.rand(b, n, generator=gen) < 0.2) & ~target
    got = per_user_metrics(scores, target, [f"ndcg@{k}", f"recall@{k}", f"precision@{k}", f"rr@{k}", f"hit@{k}", "auc"],
                           exclude=exclude, as_frame=False)
    fns = {f"NDCG@{k}": tmr.retrieval_normalized_dcg, f"R@{k}": tmr.retrieval_recall, f"P@{k}": tmr.retrieval_precision,
           f"RR@{k}": tmr.retrieval_reciprocal_rank, f"Hit@{k}": tmr.retrieval_hit_rate}
    for u in range(b):  # the oracle loops; the code under test does not
        keep = ~exclude[u]
        preds, tgt = scores[u, keep], target[u, keep]
        for col, fn in fns.items():
            assert float(got[col][u]) == pytest.approx(float(fn(preds, tgt, top_k=k)), abs=1e-6), col  # torchmetrics works in float32
        assert float(got["ROC_AUC"][u]) == pytest.approx(float(tmr.retrieval_auroc(preds, tgt)), abs=1e-6)


def test_demo_prints_the_table(capsys):
    assert main(["demo"]) == 0
    out = capsys.readouterr().out
    assert "0.637" in out and "0.101" in out and "reverses" in out
    assert main(["demo", "-m", "0"]) == 2
    assert "n_samples" in capsys.readouterr().err
