"""Accuracy per estimator as small multiples: one panel per estimator, error against m, from recorded results.

    python benchmarks/figures/accuracy_small_multiples.py [--out docs/img]

Replaces one plot of 13 overlapping lines. Reads the recorded tables of docs/research-notes.md (nothing is rerun):

* ``accuracy_ml100k_by_m.png``: ml-100k, four recommenders, 100 repeats; mean relative error averaged over
  K = 1..50 for HR@K and NDCG@K ("Accuracy on MovieLens 100k", ``benchmarks/accuracy_ml100k.py``);
* ``accuracy_at_scale_by_m.png``: ml-100k and ml-latest-small, five recommenders, 50 repeats; worst relative error
  over the recommenders of HR@10 and NDCG@10, with the posterior-mean oracle in grey ("At catalogue scale",
  ``benchmarks/accuracy_at_scale.py``).
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from _recorded import ROOT, finish_panels, percent, table_after

ML100K_MEAN = "**Averaged over K = 1..50 and the recommenders"
AT_SCALE = {("ml-100k", "HR@10"): "**ml-100k, HIT@10: worst relative error",
            ("ml-100k", "NDCG@10"): "**ml-100k, NDCG@10: worst relative error",
            ("ml-latest-small", "HR@10"): "**ml-latest-small, HIT@10: worst relative error",
            ("ml-latest-small", "NDCG@10"): "**ml-latest-small, NDCG@10: worst relative error"}


def ml100k_mean_errors() -> tuple[list[int], dict[str, dict[str, list[float]]]]:
    """ms and {estimator: {"HR": [error per m], "NDCG": [...]}} of the ml-100k table (mean over K = 1..50)."""
    header, rows = table_after(ML100K_MEAN)
    cols = [(re.match(r"(HIT|NDCG) m=(\d+)", h).groups(), j) for j, h in enumerate(header) if re.match(r"(HIT|NDCG) m=", h)]
    ms = sorted({int(m) for (_, m), _ in cols})
    out = {}
    for row in rows:
        out[row[0]] = {("HR" if kind == "HIT" else kind): [percent(row[j]) for (k2, m), j in cols if k2 == kind]
                       for kind in ("HIT", "NDCG")}
    return ms, out


def at_scale_errors() -> tuple[list[int], dict[str, dict[tuple[str, str], list[float]]]]:
    """ms and {estimator: {(data set, metric): [worst error per m]}} of the catalogue-scale tables."""
    out: dict[str, dict] = {}
    ms: list[int] = []
    for key, caption in AT_SCALE.items():
        header, rows = table_after(caption)
        ms = [int(re.search(r"\d+", h).group()) for h in header[1:]]
        for row in rows:
            out.setdefault(row[0], {})[key] = [percent(c) for c in row[1:]]
    return ms, out


def _panels(plt, names, ncols=5):
    nrows = -(-len(names) // ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(3.0 * ncols, 2.4 * nrows), sharex=True, sharey=True,
                             squeeze=False)
    for ax in axes.flat[len(names):]:
        ax.set_visible(False)
    return fig, axes.flat


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "docs" / "img")
    args = parser.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    args.out.mkdir(parents=True, exist_ok=True)
    paths = []

    ms, errors = ml100k_mean_errors()
    names = list(errors)
    fig, axes = _panels(plt, names)
    for ax, name in zip(axes, names):
        for kind, style in (("HR", "-o"), ("NDCG", "--s")):
            ax.plot(ms, [100 * e for e in errors[name][kind]], style, ms=3, label=kind)
        ax.set_title(name, fontsize=9)
        ax.axhline(5, color="0.6", lw=0.8, ls=":")
        ax.grid(True, which="both", alpha=0.2)
    paths.append(finish_panels(
        plt, fig, axes, ms, args.out, "accuracy_ml100k_by_m.png", xlabel="m (sampled items per positive)",
        ylabel="mean relative error, % (over K = 1..50)", legend_size=7,
        title="ml-100k, four recommenders, 100 repeats: error of each estimator against m (dotted: 5%)"))

    ms, errors = at_scale_errors()
    oracle = errors.pop("oracle")
    names = list(errors)
    fig, axes = _panels(plt, names)
    colours = {"ml-100k": "tab:blue", "ml-latest-small": "tab:red"}
    for ax, name in zip(axes, names):
        for (data, metric), values in errors[name].items():
            style = "-o" if metric == "HR@10" else "--s"
            ax.plot(ms, [100 * e for e in values], style, ms=3, color=colours[data], label=f"{data} {metric}")
            ax.plot(ms, [100 * e for e in oracle[(data, metric)]], style, ms=2, color="0.7", lw=0.8)
        ax.set_title(name, fontsize=9)
        ax.grid(True, which="both", alpha=0.2)
    paths.append(finish_panels(
        plt, fig, axes, ms, args.out, "accuracy_at_scale_by_m.png", xlabel="m (sampled items per positive)",
        ylabel="worst relative error over recommenders, %", legend_size=6,
        title="HR@10 and NDCG@10, five recommenders, 50 repeats (grey: the posterior-mean oracle)"))
    return paths


if __name__ == "__main__":
    for p in main():
        print(p)
