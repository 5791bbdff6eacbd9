"""Metrics under ties="average" are expectations over the orders of tied items: checked against brute-force
enumeration of every order consistent with the scores (issue 18: P@2 was 1.5 with three tied relevant items)."""

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


def _brute_force(spec, s: torch.Tensor, rel: torch.Tensor, gains) -> float:
    """Mean of the metric over every order of the items consistent with the scores (ties in any order)."""
    n = s.numel()
    values = []
    for order in itertools.permutations(range(n)):
        if any(s[order[a]] < s[order[a + 1]] for a in range(n - 1)):
            continue
        position = {item: i + 1 for i, item in enumerate(order)}
        ranks = torch.tensor([[position[int(i)] for i in rel]])
        values.append(float(user_metric_values(spec, ranks, torch.tensor([n]), gains)[0]))
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
