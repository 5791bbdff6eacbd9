"""A popularity-sampled world simulated from ``pl_fit``'s fitted model: the planner's forecasts of popularity designs
(:func:`~reco_sampled_plugin.planner.plan` with a popularity pilot; docs/popularity.md, "Planning a popularity
design").

The world is the model ``pl_fit`` fits (``_popularity_fit``'s module docstring), with the pilot's fitted values:

* **Users**: the pilot's positives, each with its row's drawable candidates per popularity class (``profile``), its
  candidate count n and its positive's weight (the strata's covariate); all of them in order when the plan asks
  for as many users as the pilot has positives, else ``n_users`` of them drawn with replacement (by their
  frequency weights).
* **Exact ranks**: R from the prior of the user's stratum at that stratum's maximum-likelihood tilt curve (the free
  fit's where its niche test rejected, else the constrained fit's): the planner takes ``pl_fit``'s g-modelling prior
  (``PopularityFit.spline_prior``) as fitted, the world that reproduces the pilot's own draws
  (:meth:`PopularityWorld.pilot_check`; ``from_pilot(prior="em", smooth=...)`` gives the penalised-EM prior,
  smoothed as the uniform planner smooths a pilot's fit); truncated to 1..n, uniform over the ranks of a cell
  (:func:`draw_from_cells`).
* **The items above the positive**: the R - 1 first items of a Plackett-Luce ranking of the row's drawable
  candidates with weights v_c^beta(R) (v_c the class's mean weight, beta(R) the curve at R's cell): exponential
  clocks E_j / v_j^beta, the R - 1 smallest (the fixed-horizon model whose conditional-Poisson form the likelihood
  uses, |A| = R - 1 exactly).
* **Draws**: m with replacement by the candidate design's weights over the drawable candidates (each class's mean
  weight for its items), so which draws beat the positive, the distinct drawn items per class and the
  Hansen-Hurwitz sums follow as in a real draw (:class:`~reco_sampled_plugin._popularity.PopularityStats`).

The simulated :class:`~reco_sampled_plugin.ranking.SampledRanks` carry the candidate design and these statistics,
so ``estimate(metric, sampled)`` runs on them exactly as on a real draw. A candidate design's weights must put
every item in the pilot's popularity class (``_popularity.weight_bins``): any positive power of the pilot's weights
does (RecBole's alpha; equal classes checked on ml-100k and ml-latest-small counts for alpha 0.25-3), and the
world's classes are then the design's.

What it assumes: the pilot's fitted model is the truth. Where the recommender departs from it (users whose tilt
differs within a stratum, a niche top the test does not see) the forecast is of the model's world, not the
recommender's (docs/popularity.md, "Planning a popularity design", measured against real draws).

Memory: each chunk of rows holds (rows, L) clocks, L the longest row's drawable candidates, with rows x L at most
:data:`CHUNK_CELLS`, and (rows, m) draws.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator

import numpy as np
import torch

from ._popularity import POP_BINS, PopularityStats, weight_bins
from .design import SamplingDesign

if TYPE_CHECKING:
    from .ranking import SampledRanks

__all__ = ["PopularityWorld", "Stratum", "draw_from_cells", "CHUNK_CELLS", "NO_CLASS_COUNTS"]

#: Why a pilot without class counts cannot give a world.
NO_CLASS_COUNTS = ("pilot: these popularity-sampled ranks carry no popularity-class counts (PopularityStats.profile; "
                   "a rank file keeps only the Hansen-Hurwitz sums), which the planner's popularity world is fitted "
                   "on; draw the pilot with sampled_ranks(..., SamplingDesign(m, popularity=w)), "
                   "sampled_ranks_from_scorer or evaluate_factors")

#: Simulated pilots of :meth:`PopularityWorld.pilot_check`.
PILOT_CHECK_REPLICATES = 10

#: The most clocks (rows x L) one chunk of the simulation holds.
CHUNK_CELLS = 1 << 22


def draw_from_cells(edges: np.ndarray, probs: np.ndarray, n: np.ndarray, repeats: int,
                    rng: np.random.Generator) -> np.ndarray:
    """(repeats, len(n)) int64 ranks drawn from cell probabilities ``probs`` on the rank grid ``edges`` (cell c:
    ranks edges[c] + 1 .. edges[c + 1], uniform within a cell), truncated to 1..n_i for each column i (the cell that
    holds n_i cut at n_i). ``n`` at most ``edges[-1]``."""
    width = np.diff(edges)
    cum = np.concatenate([[0.0], np.cumsum(probs)])
    top = np.interp(n.astype(np.float64), edges.astype(np.float64), cum)  # P(R <= n)
    t = rng.random((repeats, len(n))) * top
    c = np.clip(np.searchsorted(cum, t, side="right") - 1, 0, len(probs) - 1)
    frac = (t - cum[c]) / np.maximum(probs[c], 1e-300)
    r = edges[c] + 1 + np.floor(np.clip(frac, 0.0, 1.0) * width[c]).astype(np.int64)
    return np.clip(np.minimum(r, edges[c + 1]), 1, n).astype(np.int64)


@dataclass(frozen=True)
class Stratum:
    """One stratum's world: its prior over the cells, beta per cell, and the tilt pair it came from."""

    prior: np.ndarray
    beta: np.ndarray
    pair: tuple[float, float]
    niche: bool


class PopularityWorld:
    """The world of the module docstring, fitted on a popularity pilot.

    Attributes:
        n: (n_users,) int64 candidate counts of the simulated users.
        weights: the pilot's popularity weights (CPU float64), whose classes every candidate design must share.
        source: the world in words (for ``Plan.shape_source``).
        resolution: exact ranks one sampled rank spans at the pilot's m, (mean n - 1)/(m + 1) + 1.
    """

    def __init__(self, edges: np.ndarray, strata: list[Stratum], profile: np.ndarray, n: np.ndarray,
                 stratum: np.ndarray, covariate: np.ndarray | None, log_v: np.ndarray, pilot_design: SamplingDesign,
                 source: str = "") -> None:
        """A world from its parts (:meth:`from_pilot` fits them on a pilot): the rank grid ``edges``, one
        :class:`Stratum` per stratum, per user the drawable candidates per class ``profile`` (users, POP_BINS),
        candidate count ``n``, stratum index and log positive weight ``covariate`` (or None), the classes' mean log
        weight ``log_v`` (POP_BINS,) and the popularity design whose classes the world's are."""
        assert pilot_design.popularity is not None
        self.edges, self.strata = np.asarray(edges, dtype=np.int64), strata
        self.profile = np.round(profile).astype(np.int64)
        self.n, self.stratum = np.asarray(n, dtype=np.int64), np.asarray(stratum, dtype=np.int64)
        self.covariate = covariate
        self.log_v = np.asarray(log_v, dtype=np.float64) - float(np.max(log_v))
        self.pilot_design = pilot_design
        self.weights = pilot_design.popularity.detach().to(torch.float64).cpu()
        self.classes = weight_bins(self.weights)
        self.resolution = (float(self.n.mean()) - 1.0) / (pilot_design.n_samples + 1.0) + 1.0
        self.source = source
        #: :meth:`pilot_check`'s result (empty until run)
        self.check: dict = {}

    @classmethod
    def from_pilot(cls, pilot: SampledRanks, n_users: int, rng: np.random.Generator,
                   smooth: Callable[[np.ndarray, np.ndarray], np.ndarray] | None = None,
                   prior: str = "em") -> "PopularityWorld":
        """The world of ``pl_fit`` fitted on the popularity-sampled ``pilot`` (its default options), with
        ``n_users`` users (the pilot's positives in order where it has as many, else drawn with replacement by
        their frequency weights, with ``rng``)."""
        from ._popularity_fit import StratifiedFit, fit
        from .popularity import popularity_draws

        design = pilot.design
        assert design is not None and design.popularity is not None  # a popularity draw (the planner's test)
        try:
            units = popularity_draws(pilot).units  # its refusals, named for the pilot
        except ValueError as exc:
            raise ValueError(str(exc).replace("sampled_ranks:", "pilot:", 1)) from None
        if units is None:
            raise ValueError(NO_CLASS_COUNTS)
        f = fit(units)
        fits = f.fits if isinstance(f, StratifiedFit) else [f]
        groups = f.groups if isinstance(f, StratifiedFit) else [np.arange(len(units.n))]
        strata = []
        for g in fits:
            key = g.best_free if g.niche else g.best
            p = g.spline_prior(key) if prior == "spline" else g.curves[key][1]
            if smooth is not None:
                p = smooth(g.edges, p)
            strata.append(Stratum(p, g.betas[g.curves[key][2]], g.beta_of(key), g.niche))
        stratum = np.empty(len(units.n), dtype=np.int64)
        for s, rows in enumerate(groups):
            stratum[rows] = s
        n_pilot = len(units.n)
        if n_users == n_pilot:
            pick = np.arange(n_pilot)
        else:
            pick = rng.choice(n_pilot, size=n_users, replace=True, p=units.w / units.w.sum())
        tilts = "; ".join(f"beta {s.pair[0]:g} -> {s.pair[1]:g}" + (" (niche top)" if s.niche else "")
                          for s in strata)
        resampled = "" if n_users == n_pilot else f", resampled to {n_users:,} users"
        source = (f"pilot: pl_fit on {n_pilot:,} popularity-sampled positives (m = {design.n_samples}; "
                  f"{len(strata)} strat{'a' if len(strata) > 1 else 'um'}: {tilts}){resampled}; simulated popularity "
                  "draws")
        return cls(f.edges, strata, units.profile[pick], units.n[pick], stratum[pick],
                   None if units.covariate is None else units.covariate[pick], units.log_v, design, source)

    def pilot_check(self, pilot: SampledRanks, replicates: int = PILOT_CHECK_REPLICATES, seed: int = 0) -> dict:
        """How well the world reproduces the pilot's own draws (a posterior predictive check): ``replicates``
        simulated draws of the pilot's design, and for the share of positives ranked first, the mean sampled rank
        and each class's share of beating items among its distinct drawn items, the pilot's value, the simulations'
        mean and z = (pilot - mean) / sd of the simulations (``max_class_z``: the largest |z| over the classes the
        draws reach). Kept as :attr:`check` by the planner and quoted in its notes."""
        design = pilot.design
        assert design is not None and pilot.popularity_stats is not None

        def stats(ranks: torch.Tensor, st: PopularityStats) -> np.ndarray:
            keep = ranks.reshape(-1) > 0
            r = ranks.reshape(-1)[keep].double().cpu()
            assert st.beat_bins is not None and st.miss_bins is not None
            beat = st.beat_bins.reshape(-1, POP_BINS)[keep].double().cpu().sum(0)
            drawn = beat + st.miss_bins.reshape(-1, POP_BINS)[keep].double().cpu().sum(0)
            share = torch.where(drawn > 0, beat / drawn.clamp_min(1.0), torch.full_like(drawn, math.nan))
            return np.concatenate([[float((r == 1).double().mean()), float(r.mean())], share.numpy()])

        obs = stats(pilot.ranks, pilot.popularity_stats)
        rng = np.random.default_rng([seed, 29])
        sims = []
        for j in range(replicates):  # a handful of simulated pilots
            exact = self.draw(self.n, 1, rng)[0]
            sim = self.sampled(exact, self.weights, int(design.n_samples), seed * 7919 + j,
                               torch.Generator().manual_seed(seed * 104_729 + j))
            assert sim.popularity_stats is not None
            sims.append(stats(sim.ranks, sim.popularity_stats))
        a = np.asarray(sims)
        with np.errstate(invalid="ignore", divide="ignore"):
            z = (obs - a.mean(0)) / a.std(0, ddof=1)
        cls_z = z[2:][np.isfinite(z[2:])]
        self.check = {"first": (float(obs[0]), float(a[:, 0].mean()), float(z[0])),
                      "mean_rank": (float(obs[1]), float(a[:, 1].mean()), float(z[1])),
                      "max_class_z": float(np.abs(cls_z).max()) if len(cls_z) else math.nan,
                      "replicates": replicates}
        return self.check

    def notes(self) -> tuple[str, ...]:
        """What the forecasts of this world assume (``Plan.notes``), with :meth:`pilot_check`'s result when run."""
        out = ["popularity designs are forecast in pl_fit's fitted model of the pilot (its tilt curves and rank "
               "priors, simulated draws): where the recommender departs from the model the real errors are larger "
               "(measured on ml-100k and ml-latest-small, five recommenders, m 100 and 500: the forecast of HR@10 / "
               "NDCG@10 was 0.36-2.34x the real relative error in 32 cells, median 0.93, below half "
               "of it in 4, where pl_fit is biased on the real recommender); read each popularity design's 95% "
               "interval width beside its error (docs/popularity.md, 'Planning a popularity design')"]
        c = self.check
        if c:
            (f_obs, f_sim, f_z), (r_obs, r_sim, r_z) = c["first"], c["mean_rank"]
            worst = max(abs(f_z), abs(r_z), c["max_class_z"] if math.isfinite(c["max_class_z"]) else 0.0)
            out.append(f"the world against the pilot's own draws ({c['replicates']} simulated pilots): share ranked "
                       f"first {f_obs:.3f} vs {f_sim:.3f} (z {f_z:+.1f}), mean sampled rank {r_obs:.1f} vs "
                       f"{r_sim:.1f} (z {r_z:+.1f}), beating share per popularity class: largest |z| "
                       f"{c['max_class_z']:.1f}" + ("; the world misses the pilot (|z| > 4): its forecasts are "
                                                     "less reliable" if worst > 4 else ""))
        if any(s.niche for s in self.strata):
            out.append("a stratum's niche-top test rejected beta_top >= beta_deep on the pilot: the world takes the "
                       "free fit's (niche) tilt, and pl_fit's hedge between the two branches is part of the error "
                       "forecast")
        return tuple(out)

    # ---------------------------------------------------------------------------------------------- checks
    def check_design(self, weights: torch.Tensor) -> None:
        """Refuse (ValueError naming ``designs``) a candidate design whose weights do not put every item in the
        pilot's popularity class."""
        w = weights.detach().to(torch.float64).cpu()
        if w.shape != self.weights.shape:
            raise ValueError(f"designs: a popularity design's weights cover {w.numel():,} items, the pilot's "
                             f"{self.weights.numel():,}")
        if not torch.equal((w > 0), (self.weights > 0)) or not torch.equal(weight_bins(w), self.classes):
            raise ValueError("designs: a popularity design's weights must put every item in the pilot's popularity "
                             "class (equal steps of log w, _popularity.weight_bins), as any positive power of the "
                             "pilot's weights does (RecBole's alpha); the world simulates draws class by class")

    # ----------------------------------------------------------------------------------------------- draws
    def draw(self, n_u: np.ndarray, repeats: int, rng: np.random.Generator) -> np.ndarray:
        """(repeats, n_users) exact ranks, each user's from its stratum's prior truncated to 1..n."""
        out = np.empty((repeats, len(self.n)), dtype=np.int64)
        for s, st in enumerate(self.strata):  # two strata at most
            cols = np.flatnonzero(self.stratum == s)
            if len(cols):
                out[:, cols] = draw_from_cells(self.edges, st.prior, self.n[cols], repeats, rng)
        return out

    def sampled(self, exact: np.ndarray, weights: torch.Tensor, m: int, world_seed: int,
                generator: torch.Generator) -> SampledRanks:
        """The :class:`~reco_sampled_plugin.ranking.SampledRanks` of one simulated popularity draw of ``m`` items
        per user by ``weights`` (checked by :meth:`check_design`) at the exact ranks ``exact`` (n_users,). The
        items above each positive come from ``world_seed`` alone (the same for every design of a replicate: common
        random numbers); the draws from ``generator``."""
        from .ranking import SampledRanks

        w = weights.detach().to(torch.float64).cpu()
        cls_w = torch.zeros(POP_BINS, dtype=torch.float64).scatter_add_(0, self.classes, w)
        cls_n = torch.zeros(POP_BINS, dtype=torch.float64).scatter_add_(0, self.classes, (w > 0).double())
        mean_w = torch.where(cls_n > 0, cls_w / cls_n.clamp_min(1.0), torch.zeros_like(cls_w))
        users = len(self.n)
        parts = [self._chunk(rows, cls, above, mean_w, m, generator)
                 for rows, cls, above in self._composition(exact, world_seed)]
        beating, s1, s2, beat_bins, miss_bins = (torch.cat([p[i] for p in parts]) for i in range(5))
        positive = None
        if self.covariate is not None:  # the positive's pilot weight exp(log w), 0 for a positive of weight 0
            positive = self._positive_weight(w, torch.from_numpy(np.exp(self.covariate)))
        stats = PopularityStats(beating.double(), s1, s2, torch.zeros(users, dtype=torch.int64),
                                torch.from_numpy(self.profile).float(), beat_bins.float(), miss_bins.float(),
                                positive)
        return SampledRanks((beating + 1).to(torch.int64), torch.from_numpy(self.n),
                            design=SamplingDesign.trusted(m, popularity=w), popularity_stats=stats)

    def above_counts(self, exact: np.ndarray, world_seed: int) -> np.ndarray:
        """(n_users, POP_BINS) the items above each positive per class at the exact ranks ``exact``, as
        :meth:`sampled` draws them for ``world_seed`` (the world's composition, for checks)."""
        out = [torch.zeros(cls.shape[0], POP_BINS + 1, dtype=torch.float64).scatter_add_(
            1, cls, above.double())[:, :POP_BINS] for _, cls, above in self._composition(exact, world_seed)]
        return torch.cat(out).numpy()

    def _composition(self, exact: np.ndarray, world_seed: int) -> Iterator[tuple[slice, torch.Tensor, torch.Tensor]]:
        """(rows, class of each slot, the slots above the positive) per chunk of rows (:meth:`_above`; (rows, L)
        clocks at most :data:`CHUNK_CELLS`), the clocks drawn from ``world_seed`` alone."""
        log_v = torch.from_numpy(self.log_v)
        length = int(self.profile.sum(1).max())
        rows_per = max(1, CHUNK_CELLS // max(length, 1))
        world = torch.Generator().manual_seed(int(world_seed))
        beta = self._betas(exact)
        for r0 in range(0, len(self.n), rows_per):
            rows = slice(r0, min(len(self.n), r0 + rows_per))
            yield (rows, *self._above(rows, exact[rows], beta[rows], length, log_v, world))

    def _betas(self, exact: np.ndarray) -> np.ndarray:
        """beta(R) of each user: its stratum's curve at the cell of its exact rank."""
        out = np.empty(len(self.n))
        cell = np.clip(np.searchsorted(self.edges, exact, side="left") - 1, 0, len(self.edges) - 2)
        for s, st in enumerate(self.strata):
            cols = self.stratum == s
            out[cols] = st.beta[cell[cols]]
        return out

    def _positive_weight(self, w: torch.Tensor, pilot_weight: torch.Tensor) -> torch.Tensor:
        """Each user's positive's weight under the design's weights ``w``: the mean design weight of the pilot
        items of the same pilot weight (a positive power of the pilot's keeps their order, so the strata's split)."""
        pw = self.weights
        order = torch.argsort(pw)
        at = torch.searchsorted(pw[order], pilot_weight).clamp(max=len(pw) - 1)
        return torch.where(pilot_weight > 0, w[order][at], torch.zeros_like(pilot_weight))

    def _above(self, rows: slice, exact: np.ndarray, beta: np.ndarray, length: int, log_v: torch.Tensor,
               world: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
        """(class of each slot (B, L), C past the row's items; the slots above the positive (B, L) bool) of the rows
        ``rows``: the items of a row laid out class by class, A the R - 1 smallest clocks E_j / v_j^beta."""
        prof = torch.from_numpy(self.profile[rows])
        b = prof.shape[0]
        slots = torch.arange(length).expand(b, length).contiguous()
        cls = torch.searchsorted(prof.cumsum(1), slots, right=True)
        valid = cls < POP_BINS
        # Plackett-Luce with weights v^beta: the R - 1 smallest clocks E_j / v_j^beta (log scale)
        clocks = torch.empty(b, length, dtype=torch.float64).exponential_(generator=world).log_()
        clocks = clocks - torch.from_numpy(beta)[:, None] * log_v[cls.clamp(max=POP_BINS - 1)]
        clocks = torch.where(valid, clocks, torch.full_like(clocks, math.inf))
        k = torch.from_numpy(np.minimum(exact - 1, self.profile[rows].sum(1)))  # |A| = R - 1
        thr = clocks.sort(1).values.gather(1, (k - 1).clamp(min=0)[:, None])[:, 0]
        thr = torch.where(k > 0, thr, torch.full_like(thr, -math.inf))
        return cls, clocks <= thr[:, None]

    def _chunk(self, rows: slice, cls: torch.Tensor, above: torch.Tensor, mean_w: torch.Tensor, m: int,
               generator: torch.Generator) -> tuple:
        """(beating, S1, S2, beat_bins, miss_bins) of the rows ``rows``, whose slots' classes and items above the
        positive are ``cls``, ``above`` (:meth:`_composition`)."""
        prof = torch.from_numpy(self.profile[rows])  # (B, C)
        b, length = above.shape
        cum = prof.cumsum(1)
        # m draws: the class by its mass, then an item of the class uniformly (its items weigh its mean)
        mass = prof.double() * mean_w[None, :]
        total = mass.sum(1)
        draw_cls = torch.multinomial(mass, m, replacement=True, generator=generator)  # (B, m)
        start = (cum - prof).gather(1, draw_cls)
        within = torch.floor(torch.rand(b, m, dtype=torch.float64, generator=generator)
                             * prof.gather(1, draw_cls).double()).to(torch.int64)
        slot = start + within
        beat = above.gather(1, slot)
        inv_q = total[:, None] / mean_w[draw_cls]
        z = torch.where(beat, inv_q, torch.zeros_like(inv_q))
        drawn = torch.zeros(b, length, dtype=torch.bool).scatter_(1, slot, True)
        beat_bins = torch.zeros(b, POP_BINS + 1, dtype=torch.float64).scatter_add_(
            1, cls, (drawn & above).double())[:, :POP_BINS]
        miss_bins = torch.zeros(b, POP_BINS + 1, dtype=torch.float64).scatter_add_(
            1, cls, (drawn & ~above).double())[:, :POP_BINS]
        return beat.sum(1), z.sum(1), (z * z).sum(1), beat_bins, miss_bins
