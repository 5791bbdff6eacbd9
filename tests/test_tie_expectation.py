"""Metrics under ties="average" are expectations over the orders of tied items: checked against brute-force
enumeration of every order consistent with the scores (the case found: P@2 was 1.5 with three tied relevant items)."""

import itertools
import math

import pytest
import torch

from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.tie_expectation import expected_metric_values
from reco_sampled_plugin.user_metrics import user_metric_values

METRICS = ["precision@2", "tp@3", "recall@2", "ap@3", "tap@2", "ndcg@3", "ndcg", "hit@1", "hit@2", "rr@2", "rr", "auc",
           "pr_auc"]


def _bounds(s: torch.Tensor, rel: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lo = torch.tensor([[1 + int((s > s[i]).sum()) for i in rel]], dtype=torch.float64)
    hi = torch.tensor([[int((s >= s[i]).sum()) for i in rel]], dtype=torch.float64)
    return lo, hi


def _orders(s: torch.Tensor) -> list[tuple[int, ...]]:
    """Every order of the items consistent with the scores (ties in any order): the permutations whose scores never
    increase."""
    v = s.tolist()
    return [order for order in itertools.permutations(range(len(v)))
            if not any(v[order[a]] < v[order[a + 1]] for a in range(len(v) - 1))]


def _brute_force(spec, s: torch.Tensor, rel: torch.Tensor, gains) -> float:
    """Mean of the metric over every order of the items consistent with the scores (ties in any order): the metric
    of each order's ranks (one row per order, as many users), averaged."""
    n = s.numel()
    orders = _orders(s)
    ranks = torch.tensor([[order.index(int(i)) + 1 for i in rel] for order in orders])
    values = user_metric_values(spec, ranks, torch.full((len(orders),), n),
                                None if gains is None else gains.expand(len(orders), -1)).tolist()
    return sum(values) / len(values)


@pytest.mark.parametrize("seed", range(6))
def test_expectation_equals_enumeration_of_tie_orders(seed):
    g = torch.Generator().manual_seed(seed)
    checked = 0
    for _ in range(25):
        n = int(torch.randint(2, 7, (1,), generator=g))
        s = torch.randint(0, 3, (n,), generator=g).double()  # three score levels: heavy ties
        rel = torch.randperm(n, generator=g)[: int(torch.randint(1, n + 1, (1,), generator=g))]
        gains = torch.rand(n, generator=g, dtype=torch.float64) + 0.1
        lo, hi = _bounds(s, rel)
        for name in METRICS:
            spec = parse_metric(name)
            if spec.k is not None and spec.k > n:
                continue
            for gain in [None] + ([gains[rel].unsqueeze(0)] if spec.kind == "ndcg" else []):
                want = _brute_force(spec, s, rel, gain)
                got = float(expected_metric_values(spec, lo, hi, torch.tensor([n]), gain)[0])
                if math.isnan(want):
                    assert math.isnan(got), (name, s.tolist(), rel.tolist())
                else:
                    assert got == pytest.approx(want, abs=1e-12), (name, s.tolist(), rel.tolist())
                    checked += 1
    assert checked > 100


def test_the_issue_cases():
    # three relevant items tied at the top of six: P@2 = 1 (not 1.5); one relevant item tied with one irrelevant at
    # the top: HR@1 = 0.5 (not 0, the metric at position 1.5)
    lo, hi = torch.tensor([[1.0, 1.0, 1.0]]), torch.tensor([[3.0, 3.0, 3.0]])
    n = torch.tensor([6])
    assert float(expected_metric_values(parse_metric("precision@2"), lo, hi, n)[0]) == 1.0
    assert float(expected_metric_values(parse_metric("hit@1"), lo, hi, n)[0]) == 1.0
    one_lo, one_hi = torch.tensor([[1.0]]), torch.tensor([[2.0]])
    assert float(expected_metric_values(parse_metric("hit@1"), one_lo, one_hi, n)[0]) == pytest.approx(0.5)
    assert float(expected_metric_values(parse_metric("ndcg@1"), one_lo, one_hi, n)[0]) == pytest.approx(0.5)
    assert float(expected_metric_values(parse_metric("rr"), one_lo, one_hi, n)[0]) == pytest.approx(0.75)


@pytest.mark.parametrize("name", METRICS)
def test_without_ties_it_is_the_metric_of_the_ranks(name):
    g = torch.Generator().manual_seed(7)
    b, p, n = 40, 5, 30
    ranks = torch.stack([torch.randperm(n, generator=g)[:p] + 1 for _ in range(b)])
    ranks[::3, 3:] = 0  # padding
    ranks[::7, :] = 0  # users without relevant items (NaN)
    n_cand = torch.randint(p + 2, n + 1, (b,), generator=g).maximum(ranks.max(1).values)
    spec = parse_metric(name)
    want = user_metric_values(spec, ranks, n_cand)
    got = expected_metric_values(spec, ranks, ranks, n_cand, max_position=n)
    torch.testing.assert_close(got, want, equal_nan=True, rtol=0, atol=1e-12)


def _per_user_brute_force(names, scores, pos, exc):
    """Per user: the mean over every order of the candidates consistent with the scores (excluded items left out)."""
    out = {name: [] for name in names}
    for u in range(scores.shape[0]):
        cand = [i for i in range(scores.shape[1]) if i not in exc[u].tolist()]
        s = scores[u, cand]
        rel = torch.tensor([cand.index(int(i)) for i in pos[u] if i >= 0])
        for name in names:
            out[name].append(_brute_force(parse_metric(name), s, rel, None))
    return out


def test_per_user_metrics_average_ties_are_expectations():
    import reco_sampled_plugin as rsp

    g = torch.Generator().manual_seed(11)
    b, n = 5, 8
    scores = torch.randint(0, 3, (b, n), generator=g).double()  # heavy ties
    order = torch.stack([torch.randperm(n, generator=g) for _ in range(b)])
    pos = order[:, :3].clone()
    pos[1, 2] = -1
    exc = order[:, 3:4].clone()
    names = ["precision@2", "recall@3", "ndcg@3", "ap@3", "hit@1", "rr@3", "auc"]
    got = rsp.per_user_metrics(scores, pos, names, exclude=exc, ties="average", as_frame=False)
    want = _per_user_brute_force(names, scores, pos, exc)
    for name in names:
        column = parse_metric(name).column
        torch.testing.assert_close(got[column], torch.tensor(want[name], dtype=torch.float64), equal_nan=True)
    # from factors (integer-valued scores: the tiles compute them exactly) the same numbers
    u = scores  # scores = u @ v.T with v the identity
    via_factors = rsp.per_user_metrics((u, torch.eye(n, dtype=torch.float64)), pos, names, exclude=exc,
                                       ties="average", as_frame=False)
    for name in names:
        column = parse_metric(name).column
        torch.testing.assert_close(via_factors[column], got[column], equal_nan=True)


def test_evaluate_factors_average_ties_are_expectations():
    import numpy as np
    import scipy.sparse as sp

    import reco_sampled_plugin as rsp

    g = torch.Generator().manual_seed(5)
    b, n = 6, 7
    u = torch.randint(0, 2, (b, n), generator=g).double()  # scores u @ I: ties everywhere
    order = torch.stack([torch.randperm(n, generator=g) for _ in range(b)])
    test = np.zeros((b, n))
    train = np.zeros((b, n))
    for r in range(b):
        test[r, order[r, :2].numpy()] = 1
        train[r, order[r, 2].item()] = 1
    names = ["precision@2", "ndcg@3", "hit@1", "rr@3", "ap@3"]
    frame = rsp.evaluate_factors(sp.csr_matrix(train), sp.csr_matrix(test), u.numpy(), np.eye(n), metrics=names,
                                 ties="average", min_items_pool=2)
    pos = order[:, :2]
    exc = order[:, 2:3]
    want = _per_user_brute_force(names, u, pos, exc)
    for name in names:
        column = parse_metric(name).column
        np.testing.assert_allclose(frame[column].to_numpy(), np.array(want[name]), atol=1e-12)


@pytest.mark.parametrize("name", ["hit@1", "hit@3", "precision@2", "recall@3", "ndcg@3", "ndcg", "ap", "mrr", "rr@2",
                                  "auc"])
def test_single_item_expectation_is_the_mean_of_m_over_the_tie_group(name):
    from reco_sampled_plugin.metrics import metric_values
    from reco_sampled_plugin.tie_expectation import expected_single_item_values

    n = 12
    lo = torch.tensor([1, 1, 2, 3, 5, 12, 4])
    hi = torch.tensor([1, 2, 6, 3, 12, 12, 9])
    want = torch.stack([metric_values(name, torch.arange(int(a), int(b) + 1), n).mean() for a, b in zip(lo, hi)])
    got = expected_single_item_values(parse_metric(name), lo, hi, n, max_position=n)
    torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


def test_torchmetrics_exact_average_ties_are_expectations():
    from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics
    from reco_sampled_plugin.metrics import metric_values

    # one relevant item tied with one irrelevant item at the top, another tied with two items lower down
    scores = torch.tensor([[3.0, 3.0, 1.0, 0.0], [5.0, 2.0, 2.0, 2.0]])
    pos = torch.tensor([[0], [3]])
    names = ["hit@1", "ndcg@2", "mrr", "auc"]
    metric = ExactRankingMetrics(names, ties="average")
    metric.update(scores, pos)
    got = metric.compute()
    groups = [(1, 2), (2, 4)]  # positions of each relevant item's tie group among its 4 candidates
    for name in names:
        want = sum(float(metric_values(name, torch.arange(a, b + 1), 4).mean()) for a, b in groups) / 2
        key = {"mrr": "rr/exact"}.get(name, f"{name.replace('@', '_at_')}/exact")
        assert float(got[key]) == pytest.approx(want, abs=1e-12), (name, got[key])
    # the same from factors (scores = u @ I)
    metric_f = ExactRankingMetrics(names, ties="average")
    metric_f.update_factors(scores, torch.eye(4), pos)
    assert {k: float(v) for k, v in metric_f.compute().items()} == pytest.approx({k: float(v) for k, v in got.items()})
