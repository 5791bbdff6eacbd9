"""gmod against mes and the oracle where the top is resolved: mean absolute relative error of HR@10 and
NDCG@10 over repeats, for the five recommenders of ``baselines.train_benchmark``.

Exact ranks of the held-out items on ml-100k or ml-latest-small; sampled ranks drawn from them (adaptive 100 ->
3,200, or a fixed m); every estimator sees the same histogram and likelihood (``rank_distribution``'s model,
groups pooled as ``estimate()`` pools them). Two targets per fitted prior: ``users`` (the mean of the positives'
posterior means, ``RankDistribution.metric(target="users")``, gmod's estimate) and ``population`` (sum_R P(R) M(R),
mes's estimate). The oracle is the posterior mean under the recommender's own exact ranks, on the same cells.

    python benchmarks/studies/gmod_oracle.py --dataset ml-100k --design adaptive --repeats 8
    python benchmarks/studies/gmod_oracle.py --dataset ml-latest-small --design 500 --dfs 8 10 14 --penalties 0.3 1 3
    python benchmarks/studies/gmod_oracle.py --coverage --repeats 10   # estimate() itself: error, coverage, width
    python benchmarks/studies/gmod_oracle.py --synthetic --repeats 8 --top-penalties 0.01 0.1   # resolved synthetic worlds
    python benchmarks/studies/gmod_oracle.py --resolution --dataset ml-100k --design adaptive   # the design's resolution

``--top-penalties T ...``: also fit the **free-top** variant, the spline plus one free
log-mass per single-rank cell at the top whose design resolution (:func:`design_resolution`, from the groups' (n, m)
alone) is at most ``--top-max-resolution`` ranks, each shrunk towards the spline by T times its squared
resolution (free where the design resolves the rank, held to the spline where it does not). Measured in
docs/research-notes.md ("Free masses at the resolved top"): it does not win, so it stays here, not in ``gmod``.

``--coverage``: ``estimate(metric, sampled, method=...)`` for ``mes``, ``gmod`` and ``auto`` (the default) at their
defaults (bootstraps included): mean |relative error|, coverage of ``interval(0.95)`` of the users' exact metric, median relative width.
``--first-repeat``, ``--recommender``, ``--metrics`` and ``--methods`` narrow it to one cell with many draws, e.g.
``--coverage --dataset ml-100k --design 500 --repeats 1000 --first-repeat 1000 --recommender "ItemKNN(q=3)"
--metrics hit@10 --methods gmod mes``.

``--coverage`` and ``--user-sets`` also take ``--design START-CAP`` (adaptive START -> CAP, e.g. ``100-12800``).

``--user-sets SETS``: coverage over users as well as draws, with known truth (:func:`user_sets`): SETS user sets
drawn from a smooth population made of each recommender's exact ranks (log-rank jitter ``--jitter``), ``--repeats``
draws of each; the coverage over all pairs and per set (conditional on the users, as a user evaluates one fixed set).

``--two-point``: what no estimator can do (:func:`two_point_bound`). For each recommender, a second world whose
users' exact ranks differ by one rank for some users (those moves that change the metric most per unit of
information) and whose sampled ranks are nearly indistinguishable from the first's: Le Cam's two-point bound,
E_1|T - theta_1| + E_2|T - theta_2| >= |theta_1 - theta_2| (1 - TV), gives every estimator T a mean absolute
error of at least half that in one of the two worlds; TV <= min(sqrt(KL / 2), sqrt(1 - exp(-KL))) (Pinsker,
Bretagnolle-Huber), KL the sum
over the moved users of E[draws | R] KL(Bernoulli(p_R) || Bernoulli(p_R')), p_R = (R - 1)/(n - 1) (Wald's identity:
a positive's draws are Bernoulli(p_R) trials whose stopping, at a fixed m or at the adaptive stages, reads only the
draws). Printed next to the oracle's mean relative error in each world (``--repeats`` draws): where
|theta_1 - theta_2| (1 - TV) exceeds 2 (O_1 theta_1 + O_2 theta_2), no estimator is within 2x the oracle on both
worlds, so none can promise "within 2x the oracle" (``gmod``'s first accuracy goal) for recommenders of that kind.
Also printed: `gmod`'s error on the data (the same draws) over max(oracle, bound), the target that any estimator
can be held to.
``--second-world METRIC``: every other mode on that second world (each recommender's exact ranks moved as the
bound for METRIC at ``--design`` moves them), e.g. to see which estimator wins there.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
from typing import NamedTuple  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from reco_sampled_plugin import metric_values, sampled_rank_histogram  # noqa: E402
from reco_sampled_plugin import rank_distribution as rd, registry  # noqa: E402
from reco_sampled_plugin._adaptive_law import expected_samples  # noqa: E402
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact  # noqa: E402
from reco_sampled_plugin.design import AdaptiveDesign, SamplingDesign  # noqa: E402
from reco_sampled_plugin.simulate import simulate_sampled_ranks  # noqa: E402
from scipy import optimize  # noqa: E402

METRICS = ("hit@10", "ndcg@10")
COVERAGE_METHODS = ("mes", "gmod", "auto")  # --coverage: estimate() with each, at its defaults


#: --second-world METRIC DESIGN: every recommender's exact ranks replaced by the second world of its two-point bound
SECOND_WORLD: tuple[str, str] | None = None


def exact_ranks(dataset: str, seed: int = 0):
    from reco_sampled_plugin import baselines, datasets

    split = datasets.load_ml100k() if dataset == "ml-100k" else datasets.load_ml_latest_small()
    ranks, n_u = baselines.held_out_ranks(baselines.train_benchmark(split.train, seed=seed), split)
    if SECOND_WORLD is not None:
        ranks = {k: two_point_bound(r, n_u, *SECOND_WORLD)[2] for k, r in ranks.items()}
    return ranks, n_u


def users_and_population(model, pi: np.ndarray, cell_metric: np.ndarray) -> tuple[float, float]:
    """(users' value: mean of posterior means, population value) of the prior ``pi`` on the model's cells."""
    prob = model.mix(pi)
    post = np.where(model.counts > 0, model.mix(pi * cell_metric) / np.maximum(prob, 1e-300), 0.0)
    return float((model.counts * post).sum() / model.counts.sum()), float(pi @ cell_metric)


def design_resolution(model) -> np.ndarray:
    """(C,) the design's resolution at each cell's rank R (ranks): 1 / sqrt(I(R)), the Fisher information of the
    final Binomial(r~ - 1; M, p), p = (R - 1)/(n - 1), I(R) = E[M | R] / ((n - 1)^2 p (1 - p)) (the adaptive stopping
    factor is free of R). E[M | R] from the groups' m alone (no counts): a doubling chain of m is an adaptive
    design, stopping at stage s with probability (1 - p)^(M_{s-1}) - (1 - p)^(M_s) (the last stage takes the rest);
    otherwise the mean of the distinct m. n: the median of the groups' n."""
    ms = np.unique(model.m).astype(np.float64)
    n = float(np.median(model.n))
    pts, wts = rd.cell_points(model.edges)
    r = (pts * wts).sum(1)
    p = np.clip((r - 1.0) / (n - 1.0), 0.0, 1.0 - 1e-12)
    if len(ms) > 1 and np.allclose(ms[1:] / ms[:-1], 2.0):
        reach = np.exp(np.outer(np.log1p(-p), np.r_[0.0, ms[:-1]]))  # (C, S): P(reach stage s | R)
        mean_m = (reach - np.c_[reach[:, 1:], np.zeros(len(p))]) @ ms
    else:
        mean_m = np.full(len(p), ms.mean())
    return np.sqrt(np.maximum(r - 1.0, 0.0) * (n - 1.0) * (1.0 - p) / mean_m)


def fit_free_top(model, counts: np.ndarray, tau: float, max_resolution: float, df: int = rd.G_DF,
                 penalty: float = rd.G_PENALTY, floor: float = 1.0) -> np.ndarray:
    """The free-top variant of ``gmod`` (module docstring): log P(cell) = log width + spline(log R) + delta_c,
    delta_c free for the leading single-rank cells with resolution <= ``max_resolution``, penalised by
    tau max(resolution, floor)^2 delta_c^2 (log-likelihood units), the spline by ``gmod``'s own penalty."""
    basis = rd._g_basis(model.edges, df)
    d2 = np.diff(np.eye(df), 2, axis=0)
    res = design_resolution(model)
    width = np.diff(model.edges)
    free = np.flatnonzero(np.cumprod(width == 1))
    free = free[res[free] <= max_resolution]
    ind = np.zeros((len(width), len(free)))
    ind[free, np.arange(len(free))] = 1.0
    basis = np.c_[basis, ind]
    pen = np.zeros((basis.shape[1],) * 2)
    pen[:df, :df] = penalty * (d2.T @ d2)
    pen[df:, df:] = np.diag(tau * np.maximum(res[free], floor) ** 2)
    logw, inside, total = np.log(width.astype(np.float64)), model.inside.astype(np.float64), counts.sum()
    totals_g, has = model.totals(counts), counts > 0

    def pi_of(a: np.ndarray) -> np.ndarray:
        z = logw + basis @ a
        e = np.exp(z - z.max())
        return e / e.sum()

    def objective(a: np.ndarray) -> tuple[float, np.ndarray]:  # as rank_distribution._g_objective
        pi = pi_of(a)
        ll, dll = rd._truncated_loglik(model, pi, counts, totals_g, has, inside)
        grad_pi = -dll / total
        grad_z = pi * (grad_pi - np.dot(pi, grad_pi))
        return -ll / total + float(a @ pen @ a) / total, basis.T @ grad_z + 2.0 * (pen @ a) / total

    res_ = optimize.minimize(objective, np.zeros(basis.shape[1]), jac=True, method="L-BFGS-B",
                             options={"maxiter": 5000, "ftol": 1e-10, "gtol": 1e-9})
    return pi_of(res_.x)


def run(dataset: str, design: str, repeats: int, dfs, penalties, top_penalties=(), top_max_resolution=np.inf,
        oracle_only: bool = False, given: tuple[dict, np.ndarray] | None = None) -> dict:
    """{(prior, target, metric, recommender): the relative errors (signed) of ``repeats`` draws}."""
    ranks, n_u = exact_ranks(dataset) if given is None else given
    nt = torch.from_numpy(n_u)
    errors: dict = {}
    for name, r in ranks.items():
        rt = torch.from_numpy(r)
        exact = {s: float(metric_values(s, rt, nt).double().mean()) for s in METRICS}
        for rep in range(repeats):
            g = torch.Generator().manual_seed(1000 + rep)
            if design == "adaptive":
                s = adaptive_sampled_ranks_from_exact(rt, nt, SamplingDesign(100, adaptive_max=3200), generator=g)
                hist = sampled_rank_histogram(s.ranks, s.n_candidates, s.n_samples)
            else:
                m = int(design)
                hist = sampled_rank_histogram(simulate_sampled_ranks(rt, nt.double(), m, "binomial", g), nt, m)
            model = rd._build_model(hist, "binomial", 16, 0.05, 0.25)
            pts, wts = rd.cell_points(model.edges)
            cells = {s: (metric_values(s, torch.from_numpy(pts.reshape(-1)), int(model.edges[-1])).numpy()
                         .reshape(pts.shape) * wts).sum(1) for s in METRICS}
            truth = np.histogram(r - 0.5, bins=model.edges)[0].astype(np.float64)  # cells (e_c, e_c+1]
            fits = {"oracle": truth / truth.sum()}
            if not oracle_only:
                fits["mes"] = rd.fit_rank_distribution(hist, registry.Mes(n_bootstrap=0)).probs
            for df in dfs:
                for pen in penalties:
                    opts = registry.Gmod(df=df, penalty=pen, tol=1e-7, max_iter=5000, trace=False)
                    fits[f"gmod(df={df}, penalty={pen:g})"] = rd.G_FITTER.fit(model, None, model.counts, opts)[0]
            for tau in top_penalties:
                fits[f"free-top(T={tau:g}, res<={top_max_resolution:g})"] = fit_free_top(
                    model, model.counts, tau, top_max_resolution)
            for label, pi in fits.items():
                for s in METRICS:
                    users, pop = users_and_population(model, pi, cells[s])
                    for target, v in (("users", users), ("population", pop)):
                        errors.setdefault((label, target, s, name), []).append(v / exact[s] - 1.0)  # signed
    return errors


def coverage(dataset: str, design: str, repeats: int, first: int = 0, only: str | None = None,
             metrics=METRICS, methods=COVERAGE_METHODS) -> None:
    """``estimate()`` itself: per recommender (those whose name contains ``only``, if given), metric and method, the
    mean |relative error|, coverage of ``interval(0.95)`` of the users' exact metric (with its Monte Carlo standard
    error) and median relative width, over draws ``first`` .. ``first + repeats - 1`` (seed 2000 + draw index)."""
    import reco_sampled_plugin as rsp

    ranks, n_u = exact_ranks(dataset)
    ranks = {k: v for k, v in ranks.items() if only is None or only in k}
    nt = torch.from_numpy(n_u)
    print(f"{dataset}, design {design}, {repeats} repeats: mean |relative error|, coverage of interval(0.95), "
          "median relative width")
    print("| recommender | metric | " + " | ".join(methods) + " |\n| --- | --- |" + " --- |" * len(methods))
    for name, r in ranks.items():
        rt = torch.from_numpy(r)
        rows: dict = {}
        for rep in range(first, first + repeats):
            sampled = draw_sampled(rt, nt, design, 2000 + rep)
            for s in metrics:
                exact = float(metric_values(s, rt, nt).double().mean())
                for method in methods:
                    e = rsp.estimate(s, sampled, method=method)
                    lo, hi = e.interval(0.95)
                    rows.setdefault((s, method), []).append((abs(e.value / exact - 1), lo <= exact <= hi,
                                                             (hi - lo) / exact))
        for s in metrics:
            cells = []
            for method in methods:
                a = np.array(rows[(s, method)], dtype=np.float64)
                se = np.sqrt(a[:, 1].mean() * (1 - a[:, 1].mean()) / len(a))
                cells.append(f"{a[:, 0].mean():.3f}, {a[:, 1].mean():.3f} +- {se:.3f}, {np.median(a[:, 2]):.2f}")
            print(f"| {name} | {s} | " + " | ".join(cells) + " |")
            for a, b in zip(methods, methods[1:]):  # paired: the same draws
                d = np.array(rows[(s, a)], dtype=np.float64)[:, 0] - np.array(rows[(s, b)], dtype=np.float64)[:, 0]
                print(f"  {name} {s}: |error| of {a} - {b}, paired: {d.mean():+.4f} +- {d.std(ddof=1) / np.sqrt(len(d)):.4f}")


def draw_sampled(rt: torch.Tensor, nt: torch.Tensor, design: str, seed: int):
    """``SampledRanks`` of one draw from exact ranks ``rt`` (candidates ``nt``): ``"adaptive"`` (100 -> 3,200),
    ``"START-CAP"`` (adaptive START -> CAP, e.g. ``"100-12800"``) or a fixed m."""
    import reco_sampled_plugin as rsp

    g = torch.Generator().manual_seed(seed)
    if design == "adaptive":
        return adaptive_sampled_ranks_from_exact(rt, nt, SamplingDesign(100, adaptive_max=3200), generator=g)
    if "-" in design:
        start, cap = (int(x) for x in design.split("-"))
        return adaptive_sampled_ranks_from_exact(rt, nt, SamplingDesign(start, adaptive_max=cap), generator=g)
    m = int(design)
    return rsp.SampledRanks(simulate_sampled_ranks(rt, nt.double(), m, "binomial", g), nt, None, rsp.SamplingDesign(m))


def user_sets(dataset: str, design: str, sets: int, draws: int, jitter: float, only: str | None = None,
              metrics=METRICS, methods=("gmod", "mes")) -> None:
    """Coverage over users as well as draws, with known truth: a smooth population made from each recommender's
    exact ranks (each user's rank times exp(``jitter`` Z), Z standard normal, rounded and kept in 1..n: smooth on the
    log-rank scale, the spike at rank 1 kept), ``sets`` user sets drawn from it (seed 3000 + set), ``draws`` sampled
    draws of each (seed 4000 + set * draws + draw). Per method: coverage of ``interval(0.95)`` of each set's exact
    metric over all (set, draw) pairs (Monte Carlo SE from the spread over sets), the conditional coverage of each
    set (its draws only): the lowest and the share of sets below 0.90; the median relative width; and for the
    lowest set the users' deviation: (mean estimate - exact) over the mean posterior sd of the users' value."""
    import reco_sampled_plugin as rsp

    ranks, n_u = exact_ranks(dataset)
    ranks = {k: v for k, v in ranks.items() if only is None or only in k}
    nt = torch.from_numpy(n_u)
    print(f"{dataset}, design {design}: {sets} user sets from a smooth population (jitter {jitter:g}) x {draws} draws: "
          "coverage of interval(0.95) over sets and draws, conditional coverage per set (lowest, share below "
          "0.90), median relative width; the lowest set's deviation in posterior sds")
    print("| recommender | metric | " + " | ".join(methods) + " |\n| --- | --- |" + " --- |" * len(methods))
    for name, r in ranks.items():
        rows: dict = {}
        for k in range(sets):
            rng = np.random.default_rng(3000 + k)
            ranks_k = np.clip(np.rint(r * np.exp(jitter * rng.standard_normal(len(r)))), 1, n_u).astype(np.int64)
            rt = torch.from_numpy(ranks_k)
            for d in range(draws):
                sampled = draw_sampled(rt, nt, design, 4000 + k * draws + d)
                for s in metrics:
                    exact = float(metric_values(s, rt, nt).double().mean())
                    for method in methods:
                        e = rsp.estimate(s, sampled, method=method)
                        lo, hi = e.interval(0.95)
                        post = e.details.get("stderr_parts", {}).get("posterior", float("nan"))
                        rows.setdefault((s, method), []).append((k, lo <= exact <= hi, (hi - lo) / exact,
                                                                 e.value - exact, post))
        for s in metrics:
            cells = []
            for method in methods:
                a = np.array(rows[(s, method)], dtype=np.float64)
                per_set = np.array([a[a[:, 0] == k, 1].mean() for k in range(sets)])
                worst = int(per_set.argmin())
                w = a[a[:, 0] == worst]
                dev = w[:, 3].mean() / np.mean(w[:, 4]) if np.all(np.isfinite(w[:, 4])) else float("nan")
                cells.append(f"{a[:, 1].mean():.3f} +- {per_set.std(ddof=1) / np.sqrt(sets):.3f}, lowest "
                             f"{per_set.min():.2f} ({dev:+.1f} sd), {np.mean(per_set < 0.9):.0%} below 0.90, "
                             f"{np.median(a[:, 2]):.2f}")
            print(f"| {name} | {s} | " + " | ".join(cells) + " |", flush=True)


def expected_draws(r: np.ndarray, n: np.ndarray, design: str) -> np.ndarray:
    """E[draws | R] of each positive: m for a fixed m; for adaptive 100 -> 3,200 (stages 100, 200, ..., 3,200, the
    next stage drawn while no draw has beaten the positive) sum_s (M_s - M_{s-1}) (1 - p)^(M_{s-1})
    (``_adaptive_law.expected_samples``)."""
    if design != "adaptive":
        return np.full(r.shape, float(design))
    return expected_samples((r - 1.0) / (n - 1.0), AdaptiveDesign(100, 3200))[0]


def kl_bernoulli(p: np.ndarray, q: np.ndarray) -> np.ndarray:
    """KL(Bernoulli(p) || Bernoulli(q)) in nats, elementwise: one uniform draw's information about a positive at
    exact rank R rather than R' (p = (R - 1)/(n - 1), q likewise); inf where q misses an outcome p can produce."""
    with np.errstate(divide="ignore", invalid="ignore"):
        a = np.where(p > 0, p * np.log(p / q), 0.0)
        b = np.where(p < 1, (1 - p) * np.log((1 - p) / (1 - q)), 0.0)
    return a + b


class Prefix(NamedTuple):
    """The best set of moves of :func:`best_prefix`: indices into its candidate arrays, the bound, the metric gap
    |theta_1 - theta_2| (absolute), the summed KL (nats) and the TV bound."""
    moves: np.ndarray
    bound: float
    gap: float
    kl: float
    tv: float


def best_prefix(users: np.ndarray, gain: np.ndarray, cost: np.ndarray, theta: float, raises: bool,
                max_gap: float = np.inf) -> Prefix | None:
    """Le Cam's bound over one family of second worlds. Candidate moves (one user, its metric change ``gain`` > 0 on
    the mean, its KL ``cost`` in nats, all in one direction of the metric: ``raises``) are taken in order of gain per
    nat, each user's best move only (moves of one user do not add); the prefix with the largest bound
    gap (1 - TV) / (2 max(theta_1, theta_2)) is kept, TV <= min(sqrt(KL / 2), sqrt(1 - exp(-KL))) (Pinsker,
    Bretagnolle-Huber; KL adds over users, whose draws are independent); prefixes whose gap exceeds ``max_gap`` theta
    are left out (a second world of the same kind). None when there is no finite move."""
    ok = np.isfinite(cost) & (gain > 0)
    if not ok.any():
        return None
    idx = np.flatnonzero(ok)
    order = idx[np.argsort(-gain[idx] / np.maximum(cost[idx], 1e-300), kind="stable")]
    _, at = np.unique(users[order], return_index=True)  # each user's best-ratio move only
    order = order[np.sort(at)]
    g_cum, kl_cum = np.cumsum(gain[order]), np.cumsum(cost[order])
    tv = np.minimum(np.sqrt(kl_cum / 2.0), np.sqrt(-np.expm1(-kl_cum)))
    # relative to the larger of the two worlds' values: valid in whichever world attains it
    bound = g_cum * (1.0 - tv) / 2.0 / (theta + (g_cum if raises else 0.0))
    bound[g_cum > max_gap * theta] = -np.inf
    k = int(bound.argmax())
    if not np.isfinite(bound[k]):
        return None
    return Prefix(order[: k + 1], float(bound[k]), float(g_cum[k]), float(kl_cum[k]), float(tv[k]))


def two_point_bound(r: np.ndarray, n: np.ndarray, metric: str, design: str,
                    reach: int = 10) -> tuple[float, str, np.ndarray]:
    """Le Cam's two-point lower bound (module docstring) on the mean absolute error, relative to the larger of the
    two worlds' metrics (the first: these users' exact ranks ``r``), that a second world forces on every estimator in
    one of the two worlds: some users moved by
    1..``reach`` ranks, all up or all down and all changing the metric the same way, each user once, taken in order
    of metric change per nat of KL; the best prefix. TV <= min(sqrt(KL / 2), sqrt(1 - exp(-KL))) (Pinsker,
    Bretagnolle-Huber). Returns (bound, a description of the second world, its exact ranks)."""
    r, n = r.astype(np.float64), n.astype(np.float64)

    def values(ranks: np.ndarray) -> np.ndarray:
        return metric_values(metric, torch.from_numpy(ranks), torch.from_numpy(n)).numpy()

    base = values(r)
    theta = float(base.mean())
    draws = expected_draws(r, n, design)
    best, what, world = 0.0, "", r.astype(np.int64)
    for sign in (-1.0, 1.0):
        for up in (True, False):  # the metric raised, or lowered, by every move
            users, gain, cost, dest = [], [], [], []
            for j in range(1, reach + 1):
                r2 = r + sign * j
                ok = (r2 >= 1) & (r2 <= n)
                r2 = np.where(ok, r2, r)
                delta = (values(r2) - base) / len(r)
                keep = np.flatnonzero(ok & ((delta > 0) if up else (delta < 0)))
                users.append(keep)
                gain.append(np.abs(delta[keep]))
                cost.append(draws[keep] * kl_bernoulli((r[keep] - 1) / (n[keep] - 1), (r2[keep] - 1) / (n[keep] - 1)))
                dest.append(r2[keep])
            u, g, c, d = (np.concatenate(x) for x in (users, gain, cost, dest))
            pick = best_prefix(u, g, c, theta, up)
            if pick is not None and pick.bound > best:
                moves = np.stack([r[u[pick.moves]], d[pick.moves]], 1).astype(np.int64)
                pairs, counts = np.unique(moves, axis=0, return_counts=True)
                best = pick.bound
                world = r.astype(np.int64)
                world[u[pick.moves]] = d[pick.moves].astype(np.int64)
                what = (", ".join(f"{cnt} at {a} -> {b}" for (a, b), cnt in zip(pairs, counts))
                        + f" (KL {pick.kl:.2f} nats, TV <= {pick.tv:.2f}, |theta_1 - theta_2| = {pick.gap / theta:.1%})")
    return best, what, world


def two_point(dataset: str, design: str, repeats: int) -> None:
    """Per recommender and metric: the oracle's mean relative error O_1 on the data and O_2 on the second world (each
    world's oracle knows its own exact ranks), the bound, and the ratio |theta_1 - theta_2| (1 - TV) /
    (2 (O_1 theta_1 + O_2 theta_2)): above 1, no estimator is within 2x the oracle on both worlds (if it were,
    E_1|T - theta_1| + E_2|T - theta_2| <= 2 (O_1 theta_1 + O_2 theta_2), below Le Cam's bound)."""
    ranks, n_u = exact_ranks(dataset)
    oracle = run(dataset, design, repeats, (rd.G_DF,), (rd.G_PENALTY,), given=(ranks, n_u))  # oracle, mes, gmod
    gmod = f"gmod(df={rd.G_DF}, penalty={rd.G_PENALTY:g})"
    print(f"{dataset}, design {design}: Le Cam's two-point bound on every estimator's mean |relative error| (in the "
          f"worse of two worlds), against the oracle's in each world ({repeats} draws)")
    print("| recommender | metric | oracle (data / second world) | bound | bound / 2 x oracle, both worlds | "
          "`gmod` on the data (bias) | `gmod` / max(oracle, bound) | the second world |"
          "\n| --- | --- | --- | --- | --- | --- | --- | --- |")
    nt = torch.from_numpy(n_u)
    for s in METRICS:
        worlds = {name: two_point_bound(r, n_u, s, design) for name, r in ranks.items()}
        second = run(dataset, design, repeats, (), (), oracle_only=True,
                     given=({name: w[2] for name, w in worlds.items()}, n_u))
        for name, r in ranks.items():
            b, what, world = worlds[name]
            t1 = float(metric_values(s, torch.from_numpy(r), nt).double().mean())
            t2 = float(metric_values(s, torch.from_numpy(world), nt).double().mean())
            o1 = float(np.mean(np.abs(oracle[("oracle", "users", s, name)])))
            o2 = float(np.mean(np.abs(second[("oracle", "users", s, name)])))
            gap_tv = b * 2.0 * max(t1, t2)  # |theta_1 - theta_2| (1 - TV)
            g1 = float(np.mean(np.abs(oracle[(gmod, "users", s, name)])))
            g_bias = float(np.mean(oracle[(gmod, "users", s, name)]))
            print(f"| {name} | {s} | {o1:.1%} / {o2:.1%} | {b:.1%} | {gap_tv / (2 * (o1 * t1 + o2 * t2)):.2f} | "
                  f"{g1:.1%} ({g_bias:+.1%}) | {g1 / max(o1, b):.2f} | {what} |", flush=True)


# --synthetic: P(R) proportional to 1/(2R) + 1/(2n) times factors at 0-based rank indices (docs/research-notes.md,
# "The twin margin")
SYNTHETIC_WORLDS = {
    "smooth": {},
    "spikes inside the top 10": {1: 3.0, 4: 3.0, 6: 3.0, 3: 0.2, 5: 0.2},
    "spike at K + 1, holes at K - 1, K": {2: 4.0, 6: 4.0, 10: 4.0, 4: 0.1, 8: 0.1, 9: 0.1},
}


def synthetic(repeats: int, top_penalties, n: int = 300, users: int = 1500, m: int = 1200, cap: int = 9600) -> None:
    """Resolved synthetic worlds (adaptive m -> cap with m well above n): mean |relative error| of the users' value
    of HR@10 / NDCG@10 under the oracle, gmod, mes and the free-top priors (same histograms and likelihood)."""
    labels = ["oracle", "gmod", "mes"] + [f"free top T={t:g}" for t in top_penalties]
    print(f"synthetic, n = {n}, {users} positives, adaptive {m} -> {cap}, {repeats} repeats: mean |relative error|")
    print("| world | metric | " + " | ".join(labels) + " |\n| --- | --- |" + " --- |" * len(labels))
    for kind, factors in SYNTHETIC_WORLDS.items():
        w = 0.5 / np.arange(1, n + 1.0) + 0.5 / n
        for i, f in factors.items():
            w[i] *= f
        errors: dict = {}
        for rep in range(repeats):
            rt = torch.from_numpy(np.random.default_rng(rep).choice(n, size=users, p=w / w.sum()) + 1)
            nt = torch.full((users,), n)
            s = adaptive_sampled_ranks_from_exact(rt, nt, SamplingDesign(m, adaptive_max=cap),
                                                  generator=torch.Generator().manual_seed(rep))
            hist = sampled_rank_histogram(s.ranks, s.n_candidates, s.n_samples)
            model = rd._build_model(hist, "binomial", 16, 0.05, 0.25)
            pts, wts = rd.cell_points(model.edges)
            truth = np.histogram(rt.numpy() - 0.5, bins=model.edges)[0].astype(np.float64)
            opts = registry.Gmod(df=rd.G_DF, penalty=rd.G_PENALTY, tol=1e-7, max_iter=5000, trace=False)
            fits = {"oracle": truth / truth.sum(), "gmod": rd.G_FITTER.fit(model, None, model.counts, opts)[0],
                    "mes": rd.fit_rank_distribution(hist, registry.Mes(n_bootstrap=0)).probs}
            for t in top_penalties:
                fits[f"free top T={t:g}"] = fit_free_top(model, model.counts, t, np.inf)
            for metric in METRICS:
                cell = (metric_values(metric, torch.from_numpy(pts.reshape(-1)), n).numpy().reshape(pts.shape) * wts).sum(1)
                exact = float(metric_values(metric, rt, nt).double().mean())
                for label, pi in fits.items():
                    errors.setdefault((label, metric), []).append(abs(users_and_population(model, pi, cell)[0] / exact - 1))
        for metric in METRICS:
            print(f"| {kind} | {metric} | " + " | ".join(f"{np.mean(errors[(lb, metric)]):.3f}" for lb in labels) + " |")


def resolution(dataset: str, design: str) -> None:
    """The design's resolution at a few ranks, from the model of one draw (the groups' (n, m), not the counts)."""
    ranks, n_u = exact_ranks(dataset)
    r, nt = torch.from_numpy(next(iter(ranks.values()))), torch.from_numpy(n_u)
    g = torch.Generator().manual_seed(0)
    if design == "adaptive":
        s = adaptive_sampled_ranks_from_exact(r, nt, SamplingDesign(100, adaptive_max=3200), generator=g)
        hist = sampled_rank_histogram(s.ranks, s.n_candidates, s.n_samples)
    else:
        hist = sampled_rank_histogram(simulate_sampled_ranks(r, nt.double(), int(design), "binomial", g), nt, int(design))
    model = rd._build_model(hist, "binomial", 16, 0.05, 0.25)
    res = design_resolution(model)
    at = [1, 2, 3, 5, 10, 20]
    cell = np.searchsorted(model.edges, at, side="left") - 1
    print(f"{dataset}, design {design}: resolution (ranks) at R = " + ", ".join(f"{a}: {res[c]:.1f}" for a, c in zip(at, cell)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dataset", default="ml-100k", choices=("ml-100k", "ml-latest-small"))
    ap.add_argument("--design", default="adaptive", help="'adaptive' (100 -> 3,200) or a fixed m")
    ap.add_argument("--repeats", type=int, default=8)
    ap.add_argument("--dfs", type=int, nargs="+", default=[rd.G_DF])
    ap.add_argument("--penalties", type=float, nargs="+", default=[rd.G_PENALTY])
    ap.add_argument("--top-penalties", type=float, nargs="*", default=[],
                    help="also the free-top variant at these penalties T (module docstring)")
    ap.add_argument("--top-max-resolution", type=float, default=float("inf"),
                    help="free masses only at single-rank cells whose design resolution is at most this (ranks)")
    ap.add_argument("--synthetic", action="store_true",
                    help="only the resolved synthetic worlds (SYNTHETIC_WORLDS), with the --top-penalties variants")
    ap.add_argument("--resolution", action="store_true",
                    help="only the design's resolution (ranks) at R = 1, 2, 3, 5, 10, 20 (design_resolution)")
    ap.add_argument("--coverage", action="store_true", help="estimate() at the defaults: error, coverage, width")
    ap.add_argument("--first-repeat", type=int, default=0, help="--coverage: the first draw's index (seed 2000 + index)")
    ap.add_argument("--recommender", default=None, help="--coverage: only recommenders whose name contains this")
    ap.add_argument("--metrics", nargs="*", default=None, help="--coverage: these metrics (default: HR@10, NDCG@10)")
    ap.add_argument("--methods", nargs="*", default=None, help="--coverage: these methods (default: mes, gmod, auto)")
    ap.add_argument("--user-sets", type=int, default=0, metavar="SETS",
                    help="coverage over SETS user sets of a smooth population, --repeats draws each")
    ap.add_argument("--jitter", type=float, default=0.15, help="--user-sets: sd of the log-rank jitter")
    ap.add_argument("--two-point", action="store_true",
                    help="Le Cam's two-point bound on every estimator's error against the oracle's (two_point_bound)")
    ap.add_argument("--second-world", default=None, metavar="METRIC",
                    help="run on the second world of each recommender's two-point bound for METRIC at --design")
    args = ap.parse_args()
    if args.second_world is not None:
        global SECOND_WORLD
        SECOND_WORLD = (args.second_world, args.design)
    if args.two_point:
        two_point(args.dataset, args.design, args.repeats)
        return
    if args.user_sets:
        user_sets(args.dataset, args.design, args.user_sets, args.repeats, args.jitter, args.recommender,
                  args.metrics or METRICS, args.methods or ("gmod", "mes"))
        return
    if args.coverage:
        coverage(args.dataset, args.design, args.repeats, args.first_repeat, args.recommender, args.metrics or METRICS,
                 args.methods or COVERAGE_METHODS)
        return
    if args.resolution:
        resolution(args.dataset, args.design)
        return
    if args.synthetic:
        synthetic(args.repeats, args.top_penalties)
        return
    errors = run(args.dataset, args.design, args.repeats, args.dfs, args.penalties, args.top_penalties,
                 args.top_max_resolution)
    recs = sorted({k[3] for k in errors})
    print(f"{args.dataset}, design {args.design}, {args.repeats} repeats: mean |relative error| (mean relative error)")
    for s in METRICS:
        print(f"\n| {s} | target | " + " | ".join(recs) + " |")
        print("| --- | --- | " + " | ".join("---" for _ in recs) + " |")
        for label, target in sorted({(k[0], k[1]) for k in errors}):
            if target == "population" and label != "mes":
                continue
            mae = {r: float(np.mean(np.abs(errors[(label, target, s, r)]))) for r in recs}
            cells = " | ".join(f"{mae[r]:.3f} ({np.mean(errors[(label, target, s, r)]):+.3f})"
                               + (f" ({mae[r] / np.mean(np.abs(errors[('oracle', 'users', s, r)])):.1f}x)"
                                  if label != "oracle" else "") for r in recs)
            print(f"| {label} | {target} | {cells} |")


if __name__ == "__main__":
    main()
