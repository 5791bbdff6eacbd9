"""Cost against accuracy of the designs: fixed m against adaptive m up to a cap, from recorded results.

    python benchmarks/figures/cost_accuracy.py [--out docs/img]

Writes ``cost_accuracy.png`` from the tables of docs/research-notes.md, "Adaptive sampling with mes" (five recommenders,
20 repeats, ``benchmarks/adaptive_at_scale.py``): per data set and metric, the worst relative RMSE over the
recommenders (top) and the median width of the 95% interval relative to the exact value (bottom) against the mean m
per positive (the cost in scored pairs, beside the positive itself). Nothing is rerun.
"""

from __future__ import annotations

from pathlib import Path

from _recorded import figure_args, percent, save_figure, table_after

TABLES = {"ml-100k": "**ml-100k** (943 users", "ml-latest-small": "**ml-latest-small** (610 users"}


def designs() -> dict[str, list[dict]]:
    """{data set: [{"design", "metric", "worst_rmse", "width", "mean_m", "adaptive"}, ...]}."""
    out = {}
    for data, caption in TABLES.items():
        _, rows = table_after(caption)
        # columns: design, metric, worst rel. RMSE, mean rel. RMSE, worst |bias|, min coverage, median rel. width,
        # mean m, share at cap (the header's "|bias|" holds pipes: read the rows by position)
        if any(len(r) != 9 for r in rows):
            raise ValueError(f"{caption!r}: expected 9 columns per row; the recorded table changed")
        out[data] = [{"design": r[0], "metric": r[1], "worst_rmse": percent(r[2]), "width": percent(r[6]),
                      "mean_m": float(r[7]), "adaptive": "->" in r[0]} for r in rows]
    return out


def main(argv: list[str] | None = None) -> Path:
    args, plt = figure_args(argv, __doc__)

    data = designs()
    metrics = ["hit@10", "ndcg@10"]
    fig, axes = plt.subplots(2, 4, figsize=(15, 6.5), sharex=True)
    panels = [(d, m) for d in data for m in metrics]
    for c, (d, metric) in enumerate(panels):
        rows = [r for r in data[d] if r["metric"] == metric]
        for row_i, (key, label) in enumerate((("worst_rmse", "worst relative RMSE, %"),
                                              ("width", "median interval width / exact value, %"))):
            ax = axes[row_i][c]
            for adaptive, marker, colour, kind in ((False, "s", "tab:gray", "fixed m"),
                                                   (True, "o", "tab:green", "adaptive m -> cap")):
                sel = sorted((r for r in rows if r["adaptive"] == adaptive), key=lambda r: r["mean_m"])
                ax.plot([r["mean_m"] for r in sel], [100 * r[key] for r in sel], marker=marker, color=colour,
                        ls="-" if adaptive else ":", label=kind)
                for r in sel:
                    ax.annotate(r["design"].replace("m=", ""), (r["mean_m"], 100 * r[key]), fontsize=6,
                                xytext=(3, 3), textcoords="offset points")
            ax.set_xscale("log")
            ax.set_xticks([100, 200, 300, 500], ["100", "200", "300", "500"])
            ax.tick_params(axis="x", which="minor", labelbottom=False)
            ax.grid(True, which="both", alpha=0.2)
            if c == 0:
                ax.set_ylabel(label)
            if row_i == 0:
                ax.set_title(f"{d}, {metric.upper().replace('HIT', 'HR')}", fontsize=10)
            else:
                ax.set_xlabel("mean m per positive (cost)")
    axes[0][0].legend(fontsize=7)
    fig.suptitle("Cost against accuracy of the designs (mes, five recommenders, 20 repeats)")
    return save_figure(plt, fig, args.out, "cost_accuracy.png", dpi=90)


if __name__ == "__main__":
    print(main())
