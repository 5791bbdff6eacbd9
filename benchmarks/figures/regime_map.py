"""The regime map: where each estimator is used, as K against the resolution b = (n - 1)/(m + 1) + 1.

    python benchmarks/figures/regime_map.py [--out docs/img]

Left: the resolution b of one sampled rank against m for typical catalogue sizes n (an adaptive design's cap plays
the part of m). Right: the cut-off K against b. Above the diagonal (K >= b) the sampled ranks resolve the cut-off
of HR@K / Recall@K / Precision@K: the default estimator ``auto`` runs ``gmod`` there and the interval is the
sampling interval; below it (K < b) the shape inside the first sampled bin is not identified: ``auto`` runs ``mes``,
the interval spans every value the data allow, and the way out is adaptive sampling (a cap with b_cap <= K) or
exact ranking. NDCG, AP and RR weigh ranks inside the first bin at any K, so they are identified only where b < 2.
Computed from the formula; no data.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from _recorded import save_figure

ROOT = Path(__file__).resolve().parents[2]
CATALOGUES = {"ml-100k (1,682 items)": 1_682, "ml-latest-small (9,742)": 9_742, "10^5 items": 100_000,
              "10^6 items": 1_000_000}
MARKS = [("ml-100k, m = 100", 1_682, 100), ("ml-latest-small, m = 100", 9_742, 100),
         ("ml-latest-small, cap 3,200", 9_742, 3_200), ("10^6 items, m = 100", 1_000_000, 100),
         ("10^6 items, cap 102,400", 1_000_000, 102_400)]


def resolution(n_items, n_samples):
    """b = (n - 1)/(m + 1) + 1: the exact ranks one sampled rank covers."""
    return (np.asarray(n_items, dtype=float) - 1.0) / (np.asarray(n_samples, dtype=float) + 1.0) + 1.0


def main(argv: list[str] | None = None) -> Path:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    m = np.logspace(1, 6, 200)
    for label, n in CATALOGUES.items():
        keep = m < n
        left.loglog(m[keep], resolution(n, m[keep]), label=label)
    left.axhline(10, color="0.4", ls=":", lw=1)
    left.text(12, 11.5, "K = 10", color="0.3", fontsize=8)
    left.axhline(2, color="0.4", ls="--", lw=1)
    left.text(12, 2.3, "b = 2: NDCG/AP/RR resolved below", color="0.3", fontsize=8)
    left.set(xlabel="m (sampled items per positive; adaptive: the cap)", ylabel="resolution b = (n - 1)/(m + 1) + 1",
             title="How many exact ranks one sampled rank covers")
    left.legend(fontsize=8)
    left.grid(True, which="both", alpha=0.2)

    b = np.logspace(0, 4.3, 200)
    right.set_xscale("log")
    right.set_yscale("log")
    k_top = 1e3
    right.fill_between(b, b, k_top, color="tab:green", alpha=0.15)
    right.fill_between(b, 1, b, color="tab:orange", alpha=0.15)
    right.axvspan(1, 2, color="tab:blue", alpha=0.12)
    right.plot(b, b, color="k", lw=1)
    right.text(1.05, 300, "b < 2: NDCG, AP, RR\nidentified too", fontsize=8, color="tab:blue")
    right.text(3, 120, "K >= b: resolved\nHR@K, Recall@K, Precision@K\nauto runs gmod; sampling interval",
               fontsize=9, color="darkgreen")
    right.text(150, 1.4, "K < b: top unresolved\nauto runs mes; the interval spans\nwhat the data allow: "
               "sample adaptively\n(cap with b_cap <= K) or rank exactly", fontsize=9, color="saddlebrown")
    for label, n, mm in MARKS:
        x = float(resolution(n, mm))
        right.axvline(x, color="0.5", lw=0.8, ls=":")
        right.text(x * 1.05, 1.15 if "cap" in label else 3.0, label, rotation=90, fontsize=7, color="0.25",
                   va="bottom")
    right.set(xlim=(1, b[-1]), ylim=(1, k_top), xlabel="resolution b", ylabel="cut-off K",
              title="Which regime, which estimator (AUC: always resolved)")
    return save_figure(plt, fig, args.out, "regime_map.png", dpi=100)


if __name__ == "__main__":
    print(main())
