"""pl_fit with a per-positive latent tilt (docs/research-notes.md, "Richer tilt curves: measured, not adopted").

Each positive has its own tilt class k: a constant beta of ``_popularity_fit.BETAS``, or a two-knot curve. A joint
prior over (rank cell c, class k) is fitted by penalised EM on ``PopularityFit``'s existing per-beta likelihood
tables (no new likelihood code):

* m1: a joint pi(c, k); m2: pi(c) x rho(k) over the constant betas; m3: pi(c) x rho(curve), the curves two-knot
  (beta_top, beta_deep) both on ``M3_GRID`` (niche tops included); m2s / m3s: the spline prior refitted at the
  fitted rho (the counterpart of the default's value);
* m2tp / m3tp / a_tp: pi(c) fixed to the histogram of the exact ranks on the fit's cells (the true prior), only rho
  fitted (a_tp: the default curve under the true prior): the composition model judged alone.

Smoothing as ``_em``: ``PSEUDO_COUNT`` pseudo-positives spread as its base over cells times uniform over classes.
Value: the mean over units of each unit's posterior mean of the cell metric. The draws are those of
``popularity_tilt_curves.py`` (``popularity_accuracy.load()``; generator seed 10,000 x repeat + m). One JSON line
per (draw, count); ``--summarise`` prints the tables.

    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_tilt_mixture.py --dataset ml-latest-small --out lsm.jsonl
    OMP_NUM_THREADS=1 python benchmarks/studies/popularity_tilt_mixture.py --dataset ml-100k --out m100k.jsonl
    python benchmarks/studies/popularity_tilt_mixture.py --summarise lsm.jsonl m100k.jsonl
"""

from __future__ import annotations

import os

for _v in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_v, "1")

import json  # noqa: E402
import math  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from collections import defaultdict  # noqa: E402

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/ (siblings)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # benchmarks/studies/
import popularity_tilt_curves as tc  # noqa: E402

from reco_sampled_plugin import _popularity_fit as pf  # noqa: E402

METRICS, SPECS = tc.METRICS, tc.SPECS
MAX_ITER = 5000
TOL = 1e-9  # per unit weight, on the log-likelihood gain of one step (finer than _em's 1e-8: slower mixtures)
M3_GRID = (-1.0, 0.0, 1.0, 2.0, 3.0, 5.0, 8.0, 16.0)
BANDS = ((1, 1), (2, 10), (11, 100), (101, 10 ** 9))


def mix_em(T: np.ndarray, w: np.ndarray, base: np.ndarray, mode: str, pi0: np.ndarray,
           fixed_pi: np.ndarray | None = None):
    """T (K, N, C) log-likelihoods; mode 'joint' (pi (K, C)) or 'product' (pi (C) x rho (K); fixed_pi: pi fixed).
    Returns (joint prior (K, C), loglik, iterations, S (K, C) the posterior mass sum_i w_i post_i(k, c))."""
    K, N, C = T.shape
    mx = T.max(axis=(0, 2))
    ok = np.isfinite(mx)
    L = np.exp(T[:, ok, :] - mx[ok][None, :, None])  # (K, n, C)
    Lf = np.ascontiguousarray(L.transpose(1, 0, 2).reshape(int(ok.sum()), K * C))  # (n, K*C)
    wk = w[ok]
    tot = float(wk.sum())
    pseudo = pf.PSEUDO_COUNT * np.outer(np.full(K, 1.0 / K), base)  # (K, C): base x uniform
    if mode == "joint":
        joint = np.outer(np.full(K, 1.0 / K), pi0)
    else:
        pi = (fixed_pi if fixed_pi is not None else pi0).copy()
        rho = np.full(K, 1.0 / K)
        joint = np.outer(rho, pi)
    prev = -math.inf
    it = 0
    for it in range(1, MAX_ITER + 1):  # EM iterations
        mix = np.maximum(Lf @ joint.ravel(), 1e-300)
        ll = float(wk @ np.log(mix))
        S = joint * ((wk / mix) @ Lf).reshape(K, C)  # posterior mass per (k, c)
        if mode == "joint":
            joint = (S + pseudo) / (tot + pf.PSEUDO_COUNT)
        else:
            rho = (S.sum(1) + pf.PSEUDO_COUNT / K) / (tot + pf.PSEUDO_COUNT)
            if fixed_pi is None:
                pi = (S.sum(0) + pf.PSEUDO_COUNT * base) / (tot + pf.PSEUDO_COUNT)
            joint = np.outer(rho, pi)
        if ll - prev < TOL * tot:
            break
        prev = ll
    mix = np.maximum(Lf @ joint.ravel(), 1e-300)
    ll = float(wk @ np.log(mix)) + float(wk @ mx[ok])
    S = joint * ((wk / mix) @ Lf).reshape(K, C)
    return joint, ll, it, S


def mix_value(T: np.ndarray, joint: np.ndarray, w: np.ndarray, cms: dict) -> dict:
    """Mean over units of the posterior mean of each metric under the mixture prior ``joint`` (K, C)."""
    with np.errstate(divide="ignore"):
        lp = T + np.log(np.maximum(joint, 0.0))[:, None, :]  # (K, N, C)
    lp = np.where(np.isfinite(lp), lp, -np.inf)
    mx = lp.max(axis=(0, 2), keepdims=True)
    e = np.exp(lp - np.where(np.isfinite(mx), mx, 0.0))
    post = e.sum(0)  # (N, C)
    post /= np.maximum(post.sum(1, keepdims=True), 1e-300)
    tot = float(w.sum())
    return {s: float(w @ (post * cm).sum(1)) / tot for s, cm in cms.items()}


def spline_values(f, logl: np.ndarray, cms: dict) -> dict:
    """The value under the g-modelling spline prior refitted on the (N, C) log-likelihood ``logl`` (a copy of
    PopularityFit._fit_spline on a given likelihood: here the tilt mixture's, rho fixed)."""
    from scipy.optimize import minimize

    from reco_sampled_plugin._gspline import G_DF, G_PENALTY, g_basis, spline_objective

    mx = logl.max(1, keepdims=True)
    ok = np.isfinite(mx[:, 0])
    lik = np.exp(logl[ok] - mx[ok])
    allowed = f.allowed[ok].astype(np.float64)
    wk = f.units.w[ok]

    def loglik(p):
        mix = np.maximum(lik @ p, 1e-300)
        inside = np.maximum(allowed @ p, 1e-300)
        return (float(wk @ np.log(mix)) - float(wk @ np.log(inside)),
                (wk / mix) @ lik - (wk / inside) @ allowed)

    objective, prior_of = spline_objective(np.log(np.diff(f.edges).astype(np.float64)), g_basis(f.edges, G_DF),
                                           G_PENALTY, max(float(wk.sum()), 1e-300), loglik)
    res = minimize(objective, np.zeros(G_DF), jac=True, method="L-BFGS-B",
                   options={"maxiter": 5000, "ftol": 1e-10, "gtol": 1e-9})
    post = pf._rows_posterior(logl, prior_of(res.x)[None, :])
    tot = float(f.units.w.sum())
    return {s: float(f.units.w @ (post * cm).sum(1)) / tot for s, cm in cms.items()}


def band_summary(S: np.ndarray, class_beta: np.ndarray, r_mid: np.ndarray) -> list:
    """Posterior-mass-weighted mean class beta per rank band, and the band's mass share."""
    out = []
    tot = S.sum()
    for lo, hi in BANDS:
        sel = (r_mid >= lo - 0.5) & (r_mid < hi + 0.5)
        m = S[:, sel].sum(1)
        out.append([float(m @ class_beta / max(m.sum(), 1e-300)), float(m.sum() / tot)])
    return out


def run_one(units, count: int, prior_true: np.ndarray) -> dict:
    edges = pf.rank_edges(int(units.n.max()))
    t0 = time.time()
    f = pf.PopularityFit(units, edges, count)
    t_base = time.time() - t0
    w = units.w
    cms = {s: f.cell_metric(spec) for s, spec in SPECS.items()}
    out = {"count": count, "t_base": t_base, "niche": f.niche, "niche_lr": f.niche_lr,
           "a_key": [float(f.betas[i]) for i in f.best], "a_ll": f.loglik}
    out["a"] = {s: f.estimate(spec)[0] for s, spec in SPECS.items()}
    out["a_em"] = {s: f.estimate(spec, prior="em")[0] for s, spec in SPECS.items()}
    post = pf._rows_posterior(f._assemble(f.curves[f.best][2]), prior_true[None, :])
    out["a_tp"] = {s: float(w @ (post * cm).sum(1)) / float(w.sum()) for s, cm in cms.items()}
    pi0 = f.curves[f.best][1]
    T = f.tables  # (16, N, C)
    betas = np.asarray(f.betas)
    # m3's curves
    pairs = [(int(np.argmin(np.abs(betas - a))), int(np.argmin(np.abs(betas - b)))) for a in M3_GRID for b in M3_GRID]
    t3 = time.time()
    T3 = np.stack([f._assemble(f._cell_beta(i, j)) for i, j in pairs])
    t_t3 = time.time() - t3
    for name, TT, mode, fixed, cb in (("m1", T, "joint", None, betas), ("m2", T, "product", None, betas),
                                      ("m3", T3, "product", None, None),
                                      ("m2tp", T, "product", prior_true, betas),
                                      ("m3tp", T3, "product", prior_true, None)):
        t1 = time.time()
        joint, ll, it, S = mix_em(TT, w, f._base, mode, pi0, fixed)
        d = mix_value(TT, joint, w, cms)
        d.update(ll=ll, iters=it, t=time.time() - t1 + (t_t3 if name == "m3" else 0.0))
        rho = joint.sum(1)
        if cb is not None:
            d["rho"] = [float(x) for x in rho]
            d["bands"] = band_summary(S, cb, f.r_mid)
        else:
            top = {}
            for (i, j), r in zip(pairs, rho):
                top[f"{betas[i]:g},{betas[j]:g}"] = float(r)
            d["rho_curves"] = top
            d["bands_top"] = band_summary(S, np.array([betas[i] for i, _ in pairs]), f.r_mid)
            d["bands_deep"] = band_summary(S, np.array([betas[j] for _, j in pairs]), f.r_mid)
            d["niche_share"] = float(sum(r for (i, j), r in zip(pairs, rho) if betas[i] < betas[j]))
        if name in ("m2", "m3"):  # the spline prior refitted at the fitted rho (the analogue of the default's value)
            t2 = time.time()
            with np.errstate(divide="ignore"):
                lr = np.log(np.maximum(rho, 0.0))[:, None, None] + TT
            mxl = lr.max(0)
            fin = np.isfinite(mxl)
            logl = np.where(fin, np.log(np.exp(lr - np.where(fin, mxl, 0.0)[None]).sum(0)) + np.where(fin, mxl, 0.0),
                            -np.inf)
            out[name + "s"] = spline_values(f, logl, cms)
            out[name + "s"]["t"] = time.time() - t2
        out[name] = d
    return out


def _describe(r: dict, tr: dict) -> str:
    return (" ".join(f"{k} {r[k]['t']:.1f}s/{r[k]['iters']}" for k in ("m1", "m2", "m3")) + " | " + " ".join(
        f"{s}: " + " ".join(f"{k} {r[k][s] / tr[s] - 1:+.3f}"
                            for k in ("a", "a_em", "m1", "m2", "m3", "m2s", "m3s", "a_tp", "m2tp", "m3tp"))
        for s in METRICS))


def main() -> None:
    args = tc.parse_args(__doc__)
    if args.summarise:
        summarise(args.summarise)
    else:
        tc.drive(args, run_one, _describe)


RECS, SHORT, REF = tc.RECS, tc.SHORT, tc.REF
RULES = ("a", "a_em", "m1", "m2", "m3", "m2s", "m3s")
TP_RULES = ("a_tp", "m2tp", "m3tp")
BETAS = pf.BETAS


def table(sel, rules, recs_here, ds, m, goal=None, count=None):
    print("| rule | HR worst (ratio) | HR bias " + " ".join(SHORT[x] for x in recs_here)
          + " | NDCG worst (ratio) | NDCG bias |")
    print("| --- | --- | --- | --- | --- |")
    for rule in rules:
        cols = []
        for k, s in enumerate(METRICS):
            errs = {x: [r[rule][s] / r["truth"][s] - 1 for r in sel if r["recommender"] == x] for x in recs_here}
            bias = [np.mean(errs[x]) for x in recs_here]
            worst = max(np.mean(np.abs(errs[x])) for x in recs_here)
            ref = REF[(ds, m)][k]
            cols.append(f"{worst:.3f} ({worst / ref:.2f}) | " + " ".join(f"{b:+.3f}" for b in bias))
            if goal is not None and len(recs_here) == 5:
                goal[(count, rule)][0] += worst / ref <= 1.5
                goal[(count, rule)][1] += 1
        print(f"| {rule} | " + " | ".join(cols) + " |")


def summarise(paths: list[str]) -> None:
    """The tables of ``paths`` (JSON lines of this script)."""
    rows = [json.loads(line) for p in paths for line in open(p)]
    cells = sorted({(r["dataset"], r["alpha"], r["m"]) for r in rows}, key=lambda k: (k[0], -k[2], -k[1]))
    goal = defaultdict(lambda: [0, 0])
    for count in (0, 32):
        for ds, alpha, m in cells:
            sel = [r for r in rows if (r["dataset"], r["alpha"], r["m"], r["count"]) == (ds, alpha, m, count)]
            if not sel:
                continue
            reps = sorted({r["rep"] for r in sel})
            recs_here = [x for x in RECS if any(r["recommender"] == x for r in sel)]
            print(f"\n### {ds} alpha={alpha} m={m} count={count} reps={reps} recs={len(recs_here)}/5")
            table(sel, RULES, recs_here, ds, m, goal, count)
            print("\ntrue prior (pi(c) = histogram of exact ranks):\n")
            table(sel, TP_RULES, recs_here, ds, m)
            print("\nper recommender: default (top,deep) niche_LR | m2 rho mean beta, P(beta<=0) | m2 loglik gain "
                  "2(ll_m2 - ll_a), m1 2(ll_m1 - ll_a), m3 | times base / m1 / m2 / m3 (iters)")
            for x in recs_here:
                parts = []
                for r in sorted([r for r in sel if r["recommender"] == x], key=lambda r: r["rep"]):
                    rho = np.array(r["m2"]["rho"])
                    mb = float(rho @ np.array(BETAS))
                    neg = float(rho[np.array(BETAS) <= 0].sum())
                    parts.append(f"r{r['rep']}: a({r['a_key'][0]:g},{r['a_key'][1]:g}) LR {r['niche_lr']:.0f} | "
                                 f"E[b] {mb:.2f} P(b<=0) {neg:.2f} | "
                                 + " ".join(f"{k} {2 * (r[k]['ll'] - r['a_ll']):.0f}" for k in ("m2", "m1", "m3"))
                                 + f" | {r['t_base']:.1f}s / " + " / ".join(f"{r[k]['t']:.1f}s({r[k]['iters']})"
                                                                          for k in ("m1", "m2", "m3")))
                print(f"  {SHORT[x]}: " + " ;; ".join(parts))
    print("\n### goal (worst / reference <= 1.5): met / cells (each metric x (dataset, m, alpha) cell)")
    for count in (0, 32):
        print(f"count={count}: " + ", ".join(f"{rule} {goal[(count, rule)][0]}/{goal[(count, rule)][1]}"
                                             for rule in RULES if goal[(count, rule)][1]))
    print("\n### ItemKNN(q=3) fitted mixtures (count=0): m2 rho(beta) (> 0.02 shown); m2tp rho; m1 / m2 mean beta by "
          "band r=1 | 2-10 | 11-100 | >100 (posterior mass share); m3 top curves (top,deep) and niche share")
    for r in sorted([r for r in rows if r["recommender"] == "ItemKNN(q=3)" and r["count"] == 0],
                    key=lambda r: (r["dataset"], -r["m"], -r["alpha"], r["rep"])):
        def rho_s(d):
            return " ".join(f"{b:g}:{p:.2f}" for b, p in zip(BETAS, d["rho"]) if p > 0.02)

        def bands(b):
            return " | ".join(f"{x:.2f} ({s:.2f})" for x, s in b)

        top = sorted(r["m3"]["rho_curves"].items(), key=lambda kv: -kv[1])[:4]
        print(f"- {r['dataset']} a={r['alpha']} m={r['m']} rep={r['rep']}: default a({r['a_key'][0]:g},"
              f"{r['a_key'][1]:g})\n  m2 rho: {rho_s(r['m2'])}\n  m2tp rho: {rho_s(r['m2tp'])}\n"
              f"  m1 bands: {bands(r['m1']['bands'])}\n  m2 bands: {bands(r['m2']['bands'])}\n"
              f"  m3 top: " + ", ".join(f"({k}):{v:.2f}" for k, v in top)
              + f"; niche share {r['m3']['niche_share']:.2f}; m3tp niche share {r['m3tp']['niche_share']:.2f}")


if __name__ == "__main__":
    main()
