"""AUC under the default ``auto`` at a fixed m: ``none``, the sampled AUC (what auto runs for AUC,
``registry.AUTO_CHOICES["auc"]``), against ``gmod`` (auto's first candidate) and ``mes`` (what it ran once a positive
ranked first), on real exact ranks: error, interval coverage and width against the exact AUC.

Exact ranks: the benchmark recommenders of ``baselines.train_benchmark`` on ml-100k and ml-latest-small
(leave-last-out, training items excluded: per-user n). For each m and repeat, sampled ranks are drawn from the exact
ones (``simulate_sampled_ranks``, uniform with replacement); each method's ``estimate("auc", ...)`` is compared with
the users' exact AUC (the oracle: the metric of the exact ranks).

Run:  python benchmarks/auc_default.py [--repeats 20] [--ms 50 100 500] [--datasets ml-100k ml-latest-small]
"""

from __future__ import annotations

import argparse
import platform
import time

import numpy as np
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import registry
from reco_sampled_plugin.metrics import metric_values
from reco_sampled_plugin.simulate import simulate_sampled_ranks

from accuracy_at_scale import exact_rank_data


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--ms", type=int, nargs="+", default=[50, 100, 500])
    ap.add_argument("--datasets", nargs="+", default=["ml-100k", "ml-latest-small"])
    args = ap.parse_args()
    print(f"machine: {platform.machine()} {torch.get_num_threads()} threads, torch {torch.__version__}")
    print("| data | recommender | m | exact AUC | method | mean abs error | coverage of interval(0.95) | mean width |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- |")
    for data in args.datasets:
        ranks, n_u = exact_rank_data(data)[:2]
        n = torch.as_tensor(np.asarray(n_u), dtype=torch.int64)
        for model, r in ranks.items():
            r = torch.as_tensor(np.asarray(r), dtype=torch.int64)
            truth = float(metric_values("auc", r.double(), n).mean())
            for m in args.ms:
                g = torch.Generator().manual_seed(m)
                out = {k: [] for k in ("mes", "gmod", "none")}
                for _ in range(args.repeats):
                    s = simulate_sampled_ranks(r, n, m, generator=g)
                    sampled = rsp.SampledRanks.from_arrays(s, n, m)
                    for k in out:
                        e = rsp.estimate("auc", sampled, k)
                        lo, hi = e.interval(0.95)
                        out[k].append((abs(e.value - truth), lo <= truth <= hi, hi - lo))
                for k, v in out.items():
                    a = np.asarray(v, dtype=np.float64)
                    print(f"| {data} | {model} | {m} | {truth:.4f} | {k}{' (auto)' if k == registry.AUTO_CHOICES['auc'] else ''} | "
                          f"{a[:, 0].mean():.4f} | {a[:, 1].mean():.2f} | {a[:, 2].mean():.4f} |", flush=True)


if __name__ == "__main__":
    t0 = time.time()
    main()
    print(f"({time.time() - t0:.0f} s)")
