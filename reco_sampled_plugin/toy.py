"""The running example of Krichene & Rendle (section 3.2, Table 1): three recommenders A, B, C
evaluated on five instances with one relevant item each among n = 10,000 items."""

from __future__ import annotations

import torch

from .metrics import metric_values
from .sampling_laws import expected_sampled

__all__ = ["TABLE1_RANKS", "TABLE1_N_ITEMS", "TOY_METRICS", "toy_table", "format_table"]

TABLE1_N_ITEMS = 10_000
TABLE1_RANKS: dict[str, list[int]] = {
    "A": [100, 100, 100, 100, 100],
    "B": [40, 40, 8437, 9266, 4482],
    "C": [212, 2, 743, 5342, 1548],
}
TOY_METRICS = ("auc", "ap", "ndcg", "recall@10")


def toy_table(n_samples: int = 99, sampling: str = "binomial") -> dict[str, dict[str, tuple[float, float]]]:
    """{recommender: {metric: (exact, expected sampled)}} for the paper's Table 1 ranks.

    The exact values reproduce Table 1; the expected sampled values (m = ``n_samples``) are the
    analytic means behind the paper's Monte Carlo Table 2.
    """
    out: dict[str, dict[str, tuple[float, float]]] = {}
    for name, ranks in TABLE1_RANKS.items():
        r = torch.tensor(ranks)
        out[name] = {
            metric: (
                float(metric_values(metric, r, TABLE1_N_ITEMS).mean()),
                float(expected_sampled(metric, r, TABLE1_N_ITEMS, n_samples, sampling).mean()),
            )
            for metric in TOY_METRICS
        }
    return out


def format_table(table: dict[str, dict[str, tuple[float, float]]], n_samples: int) -> str:
    """Plain-text rendering of :func:`toy_table`, exact and sampled side by side."""
    metrics = list(next(iter(table.values())))
    head = f"{'':4}" + "".join(f"{m:>22}" for m in metrics)
    sub = f"{'':4}" + "".join(f"{'exact':>11}{f'sampled':>11}" for _ in metrics)
    lines = [
        f"Krichene & Rendle Table 1 (n = {TABLE1_N_ITEMS:,}) and expected sampled metrics (m = {n_samples})",
        head,
        sub,
    ]
    for name, row in table.items():
        lines.append(f"{name:4}" + "".join(f"{e:11.3f}{s:11.3f}" for e, s in row.values()))
    best_exact = {m: max(table, key=lambda k: table[k][m][0]) for m in metrics}
    best_sampled = {m: max(table, key=lambda k: table[k][m][1]) for m in metrics}
    lines.append(f"{'best':4}" + "".join(f"{best_exact[m]:>11}{best_sampled[m]:>11}" for m in metrics))
    return "\n".join(lines)
