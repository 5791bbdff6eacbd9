"""Exact, sampled and expected sampled metrics from a batch of scores, on CPU or GPU.

    python examples/core_quickstart.py [--device cuda]
"""

import argparse

import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin.sampling_laws import expected_sampled


def main(device: str = "cpu") -> dict[str, float]:
    gen = torch.Generator().manual_seed(0)
    n_users, n_items, d = 500, 2_000, 16
    user_f = torch.randn(n_users, d, generator=gen).to(device)
    item_f = torch.randn(n_items, d, generator=gen).to(device)
    scores = user_f @ item_f.T  # (users x items)

    # each user: 10 training items (excluded from ranking) and 1 held-out relevant item
    picks = torch.argsort(torch.rand(n_users, n_items, generator=gen), dim=1)[:, :11].to(device)
    train, test = picks[:, :10], picks[:, 10]

    ranks = rsp.exact_ranks(scores, test, exclude=train)[:, 0]  # 1-based ranks among 1,990 candidates
    sampled = rsp.sampled_ranks(scores, test, n_samples=100, exclude=train, generator=gen)
    n = sampled.n_candidates  # 1,990 per user: catalogue - training items

    out = {}
    for metric in ("recall@10", "ndcg@10", "auc"):
        exact = rsp.metric_values(metric, ranks, n).mean()
        observed = rsp.metric_values(metric, sampled.ranks[:, 0], 101).mean()
        expected = expected_sampled(metric, ranks, n, 100).mean()
        out[metric] = float(exact)
        print(f"{metric:10} exact {exact:.4f}   sampled (m=100) {observed:.4f}   expected sampled {expected:.4f}")
    table = rsp.per_user_metrics(scores, test, ["ndcg@10", "recall@10", "auc"], exclude=train)
    print(table.describe().loc[["count", "mean"]])
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu")
    main(parser.parse_args().device)
