"""Correction tables: brute force (explicit A, O(n m^2)) against the quadrature fast path (O(m^3)).

Run:  python benchmarks/bench_correction_tables.py
Prints a Markdown table (seconds, cold caches, fast path best of 3) for n = 1e4 .. 1e8, m = 100 and 1000, both laws, for
bv (gamma = 0.1) and cls on Recall@10, and the speed targets. Brute force runs only where the explicit
pmf matrix has at most 1.1e8 entries (else "n/a"); its agreement with the fast table is reported.
"""

from __future__ import annotations

import time

import numpy as np
import torch

from reco_sampled_plugin.corrections import clear_correction_cache, correction_table
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.metrics import metric_curve
from reco_sampled_plugin.quadrature import gauss_discrete_uniform
from reco_sampled_plugin.sampling_laws import sampled_rank_pmf

BRUTE_MAX_ENTRIES = 11 * 10**7


def brute_bv(metric: str, n: int, m: int, law: str, gamma: float) -> np.ndarray:
    gram = np.zeros((m + 1, m + 1))
    h = np.zeros(m + 1)
    c = np.zeros(m + 1)
    step = max(1, (1 << 22) // (m + 1))
    mv_all = metric_curve(metric, n).numpy()
    for s in range(0, n, step):
        r = torch.arange(s + 1, min(n, s + step) + 1)
        p = sampled_rank_pmf(r, n, m, law).numpy()
        mv = mv_all[s : s + step]
        gram += p.T @ p / n
        h += p.T @ mv / n
        c += p.sum(0) / n
    return np.linalg.solve((1 - gamma) * gram + gamma * np.diag(c), h)


def design(m: int, law: str) -> SamplingDesign:
    """The fixed-m design of the law ``law`` (``"binomial"``: with replacement)."""
    return SamplingDesign(m, replacement=law == "binomial")


def cold(fn):
    clear_correction_cache()
    gauss_discrete_uniform.cache_clear()
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def main() -> None:
    torch.set_num_threads(torch.get_num_threads())
    cold(lambda: correction_table("recall@10", 10**4, 100, "bv"))  # warm up BLAS / imports
    print("| law | n | m | brute force bv (s) | fast bv (s, best of 3) | fast cls (s, best of 3) | max rel. diff bv |")
    print("|---|---|---|---|---|---|---|")
    for law in ("binomial", "hypergeometric"):
        for m in (100, 1000):
            for n in (10**4, 10**5, 10**6, 10**7, 10**8):
                runs = [cold(lambda: correction_table("recall@10", n, design(m, law), "bv").numpy()) for _ in range(3)]
                t_fast, fast = min(t for t, _ in runs), runs[0][1]
                t_cls = min(cold(lambda: correction_table("recall@10", n, design(m, law), "cls"))[0] for _ in range(3))
                if n * (m + 1) <= BRUTE_MAX_ENTRIES:
                    t0 = time.perf_counter()
                    brute = brute_bv("recall@10", n, m, law, 0.1)
                    t_brute = f"{time.perf_counter() - t0:.3f}"
                    diff = f"{np.abs(fast - brute).max() / np.abs(brute).max():.1e}"
                else:
                    t_brute, diff = "n/a", "n/a"
                print(f"| {law} | {n:.0e} | {m} | {t_brute} | {t_fast:.4f} | {t_cls:.4f} | {diff} |", flush=True)
    print()
    print("Targets (cold cache, best of 3):")
    for metric, method, n, m, limit in [
        ("recall@10", "bv", 10**8, 1000, 2.0),
        ("auc", "bv", 10**8, 1000, 2.0),
        ("recall@10", "cls", 10**8, 1000, 2.0),
        ("ndcg@10", "bv", 10**6, 100, 0.1),
        ("auc", "cls", 10**6, 100, 0.1),
    ]:
        for law in ("binomial", "hypergeometric"):
            best = min(cold(lambda: correction_table(metric, n, design(m, law), method))[0] for _ in range(3))
            status = "ok" if best < limit else "MISSED"
            print(f"- {method} {metric} n={n:.0e} m={m} {law}: {best:.4f} s (target < {limit} s) {status}")


if __name__ == "__main__":
    main()
