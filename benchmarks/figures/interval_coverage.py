"""Coverage and width of the 95% intervals, from the recorded catalogue-scale results (nothing is rerun).

    python benchmarks/figures/interval_coverage.py [--out docs/img]

Writes ``interval_coverage.png`` from the tables of docs/research-notes.md, "At catalogue scale" (five recommenders,
m in {50, 100, 500}, 50 repeats, ``benchmarks/accuracy_at_scale.py``):

* left: worst coverage of ``Estimate.interval(0.95)`` over the recommenders and over HR@K / NDCG@K with
  K in {1, 5, 10, 20, 50, 100}, per estimator, data set and m (``none`` estimates the sampled metric: 0);
* middle: where the top is unresolved, the worst coverage of ``mes``'s sampling-only interval and of ``bv``'s
  against the honest interval (always 1.00);
* right: the honest interval's median width relative to the sampling interval's and to the exact value.
"""

from __future__ import annotations

from pathlib import Path

from _recorded import figure_args, save_figure, table_after

WORST = {"ml-100k": "**ml-100k: worst coverage over recommenders", "ml-latest-small":
         "**ml-latest-small: worst coverage over recommenders"}
HONEST = "**Honest vs sampling-only intervals where the top is unresolved**"


def worst_coverage() -> tuple[list[str], dict[str, dict[str, list[float]]]]:
    """m labels and {data set: {estimator: [worst coverage per m]}}."""
    out, ms = {}, []
    for data, caption in WORST.items():
        header, rows = table_after(caption)
        ms = [h.replace(" ", "") for h in header[1:]]
        out[data] = {row[0]: [float(c) for c in row[1:]] for row in rows}
    return ms, out


def honest_rows() -> list[dict]:
    """The rows of the honest-vs-sampling table as dicts (data set, m, coverages, width ratios)."""
    _, rows = table_after(HONEST)
    out = []
    for r in rows:
        out.append({"data": r[0], "m": int(r[1]), "mes_sampling_worst": float(r[3].split("/")[0]),
                    "honest_worst": float(r[4]), "width_vs_sampling": float(r[5].rstrip("x")),
                    "width_vs_exact": float(r[6].rstrip("x")), "bv_sampling_worst": float(r[7].split("/")[0])})
    return out


def main(argv: list[str] | None = None) -> Path:
    args, plt = figure_args(argv, __doc__)
    import numpy as np

    ms, cov = worst_coverage()
    rows = honest_rows()
    fig, (a0, a1, a2) = plt.subplots(1, 3, figsize=(15, 5), gridspec_kw={"width_ratios": [1.6, 1, 1]})
    names = [n for n in cov["ml-100k"] if n != "none"]
    y = np.arange(len(names))
    markers = ["o", "s", "^"]
    for d, (data, colour) in enumerate((("ml-100k", "tab:blue"), ("ml-latest-small", "tab:red"))):
        for j, m in enumerate(ms):
            a0.scatter([cov[data][n][j] for n in names], y + (d - 0.5) * 0.3, marker=markers[j], color=colour,
                       s=22, alpha=0.8, label=f"{data}, {m}")
    a0.axvline(0.95, color="k", lw=0.8, ls="--")
    a0.set_yticks(y, names)
    a0.invert_yaxis()
    a0.set(xlabel="worst coverage of interval(0.95) (all cells)", xlim=(0, 1.02),
           title="Coverage per estimator (dashed: 0.95)")
    a0.legend(fontsize=7, loc="lower left")

    labels = [f"{r['data'].replace('ml-latest-small', 'mls')}\nm={r['m']}" for r in rows]
    x = np.arange(len(rows))
    w = 0.27
    a1.bar(x - w, [r["bv_sampling_worst"] for r in rows], w, label="bv(0.1) sampling interval", color="tab:orange")
    a1.bar(x, [r["mes_sampling_worst"] for r in rows], w, label="mes sampling interval", color="tab:purple")
    a1.bar(x + w, [r["honest_worst"] for r in rows], w, label="honest interval (every estimator)", color="tab:green")
    a1.axhline(0.95, color="k", lw=0.8, ls="--")
    a1.set_xticks(x, labels, fontsize=7)
    a1.set(ylim=(0, 1.4), ylabel="worst coverage", title="Where the top is unresolved")
    a1.legend(fontsize=7, loc="upper center")

    a2.bar(x - w / 2, [r["width_vs_sampling"] for r in rows], w, label="honest / sampling width", color="tab:green")
    a2.bar(x + w / 2, [r["width_vs_exact"] for r in rows], w, label="honest width / exact value", color="tab:gray")
    a2.set_xticks(x, labels, fontsize=7)
    a2.set(ylabel="median ratio", title="The price: width of the honest interval")
    a2.legend(fontsize=7)
    fig.suptitle("Intervals on ml-100k and ml-latest-small (five recommenders, 50 repeats per cell)")
    return save_figure(plt, fig, args.out, "interval_coverage.png", dpi=90)


if __name__ == "__main__":
    print(main())
