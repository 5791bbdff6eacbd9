"""Plan a sampled evaluation before running it: which sampling design reaches a target accuracy, and at what cost.

:func:`plan` forecasts, by Monte Carlo, how well an estimator recovers a full-catalogue metric from sampled ranks
under each candidate design, for a given catalogue size, number of users and rank distribution:

1. **Shape** (the distribution of the users' exact ranks R): a pilot's sampled ranks when given (fitted with
   ``fit_rank_distribution(pilot, registry.Mes(...))``; adaptive pilots take their per-positive final sizes and
   their design), else the default family :data:`DEFAULT_FAMILY`. ``Plan.shape_source`` says which.
2. For each design and each of ``repeats`` replicates: ``n_users`` exact ranks are drawn from the shape (the
   same sets for every design: common random numbers), the design's sampled ranks are drawn from them
   (with replacement, as :func:`~reco_sampled_plugin.simulate.simulate_sampled_ranks` /
   :func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks_from_exact`), and ``estimate(...)`` (``method``,
   ``n_bootstrap=0``) is compared with the exact metric of that set of users, the value a user of the plan
   would compare against. A rank-distribution estimator's repeats of a design are fitted together
   (:class:`~reco_sampled_plugin.rank_distribution.ReplicateFits`: one histogram pass, the (n, m) groups pooled once
   on the sum of the repeats, one likelihood, one batched solver in which each repeat stops on its own rule; the
   same forecasts as one fit per repeat up to the solvers' stopping and, where groups are pooled, each bin's
   representative n: within 0.05-0.35 Monte Carlo se in tests/test_planner_speed.py); designs with
   ``exact_at_cap`` fit their repeats' histograms as ``fit_rank_distribution`` of a list does.
   How the plan spends its own time is :class:`PlanExecution`'s. With ``screen=True`` (the default) each design
   first runs :data:`SCREEN_REPEATS` replicates and stops there when every one of them misses the target, or when
   their relative RMSE exceeds :data:`SCREEN_FACTOR` x the target (``DesignForecast.screened``): a forecast from
   those alone. With ``forecast_all=False`` (the default) the designs start cheapest first (scored pairs per
   user) and a design costlier than one already found to meet the target is not forecast
   (``DesignForecast.pruned``; it cannot be the pick): the pick and every forecast up to its cost are those of
   ``forecast_all=True``, bit for bit.
3. Reported per design (:class:`DesignForecast`), relative to the shape's truth T (the mean over the replicates of
   the sets' exact metrics): rel_bias = mean(e)/T, rel_sd = sd(e)/T (ddof 1), rel_error =
   sqrt(rel_bias^2 + rel_sd^2), e = estimate - exact metric of the set; and the cost, the mean number of
   sampled items per user (fixed m: m; adaptive: the mean final m) and the (user, item) pairs a scorer scores per
   user, 1 + that (the positive and every drawn item once: the unit of
   :class:`~reco_sampled_plugin.scorer_ranks.ScoringCost`'s ``pairs``; full ranking: n per user, its candidates).
   Beside the point error, the interval the user will read: ``rel_width``, the median over the first
   :data:`WIDTH_REPEATS` sets of the width of ``estimate(metric, sampled, method).interval(0.95)`` (the plan's method
   as given: ``auto``'s choice, bootstrap, twin gaps, the identified interval of ``top_unresolved`` /
   ``cap_reached``) relative to the set's exact metric, for the designs meeting the point target; a design meets
   the plan's target when its rel_error <= ``target_rel_error`` and rel_width / 2 <= ``target_rel_halfwidth``
   (default: full ranking's own half-width, ``Plan.full_rel_width / 2``, combined with 1.96 x the point target).
4. **Time**, given seconds per scored pair (``seconds_per_pair=``, or measured on a pilot run through
   :func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer`: its ``cost.scorer_seconds / cost.pairs``):
   each design's predicted scoring time for the ``n_users`` users, pairs x n_users x seconds_per_pair, next to
   full ranking's. It is the scorer's time alone (the loop's own draws and counting are not in it: a pilot reports
   them as ``cost.loop_seconds``) and assumes one pair costs the same in a sampled and in a full evaluation (on a
   GPU full ranking's larger batches may cost less per pair: measure both where it matters).

Conventions (package-wide): ranks are 1-based, ``n`` counts a user's candidates (the relevant item included),
``m`` the sampled irrelevant items. One sampled rank resolves b = (n - 1)/(m + 1) + 1 exact ranks; adaptive
sampling (m doubling while a positive ranks first, up to the cap) resolves the top down to (n - 1)/(cap + 1) + 1.

Pilot fit: ``fit_rank_distribution(pilot, registry.Mes(n_bootstrap=0, max_rel_n_spread=0.1))`` (candidate counts
pooled onto a geometric grid of the pilot's own n), then smoothed in log rank (Gaussian kernel, sd 0.4, mass kept):
the fit is close to maximum likelihood and puts the top's mass on a few single ranks, spikes the data do not require, and a
plan drawn from spikes misjudges how the top's shape moves the estimators (compared with simulation on ml-100k and
ml-latest-small, two recommenders each, the smoothing brought mean |log(predicted / simulated)| of the relative
error from 0.18 to 0.16; sd 1.0 made it 0.32).

Rescaling a pilot: the fitted P(R) is the fit's own model for users whose n lies within the pilot's range of
candidate counts [n_lo, n_hi] (P(R) truncated to 1..n). For a user with n outside that range the ranks are drawn
for the nearest end n_ref of the range and moved onto the relative-rank scale p ~ (R - 1)/(n - 1): each pilot
rank spreads uniformly over its share of the new catalogue (R = 1 + floor((R_ref - 1 + U) n / n_ref), U uniform
on [0, 1)), so a uniform P(R) stays uniform and the share of the catalogue above the positive is kept.

Popularity designs (``SamplingDesign(m, popularity=w)``): forecast from a popularity pilot's SampledRanks, whose
``pl_fit`` model (tilt curves, rank priors and the users' popularity-class profiles) becomes the world
(:class:`~reco_sampled_plugin._popularity_world.PopularityWorld`): exact ranks from its priors (pl_fit's
g-modelling prior at the chosen tilt, as fitted: the world that reproduces the pilot's own draws), the items above
each positive a Plackett-Luce draw with weights w^beta(R), and each replicate's popularity draw simulated class by class and estimated as a real one; uniform
designs are forecast from the same exact ranks, so both laws share one table (docs/popularity.md, "Planning a
popularity design", measured against real draws on ml-100k and ml-latest-small).

Designs with an exact share (``SamplingDesign(m, exact_share=ExactShare(...))``, uniform draws): each replicate draws
the share as the loop does (pi from ``_design_based.share_inclusion`` of the replicate's sampled ranks: an active
share fits the model first; a positive chosen when a uniform < pi; its exact rank the replicate's own) and is
estimated as the user will read it (``estimate(metric, sampled, method)``: ``diff``), point and interval together;
its cost adds share x (mean n - 1) pairs per user (``DesignForecast.share_pairs``). The forecast was checked against
simulation on real exact ranks (tests/test_planner_share.py: within 1.5x), so the default grid includes active shares.

Default family (no pilot): P(R) = 1/2 (1/R)/H_n + 1/2 (1/n) on 1..n (H_n the n-th harmonic number): half the
positives with a Zipf-like head, half anywhere; HR@10 about 0.15 at n = 10^4. Default designs
(:func:`default_designs`): fixed m in {50, 100, 200, 500, 1000, 2000} below n - 1, and adaptive from m0 = 100
(m0 = (n - 1) // 8 for n < 801) with caps {800, 3200, 12800} up to the first cap >= n - 1.

The forecast is only as good as the shape: with a pilot, its noise enters the forecast. An adaptive pilot resolves
the positives that keep ranking first, not those near a cut-off K (they stop doubling early), so with a few hundred
users its metric at K = 10 can be 15-30% off and the forecast's relative error with it (measured in
tests/test_planner.py: predicted and simulated relative errors within 30% in 15 of 16 cases on ml-100k and
ml-latest-small). Each forecast carries its Monte Carlo standard error; ``meets_target`` compares the point
forecast with the target. With the default family the forecast is a rough guide. Timing (the 2-core machine with
nothing else running, each design's fits on one thread, designs on both cores: see :func:`plan`): the default grid
(9 designs, 180 fits) for ``n_items = 50_000, n_users = 6000, repeats = 20`` takes 1.3-1.9 s after the imports; a
1,000-user adaptive pilot on 47,303..49,981 candidates per user, 11 designs, 4.1-6.2 s (8-12 s one design at a
time before the screening rule; BENCHMARKS.md, "The planner's own time").
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import hashlib
import logging
import math
import os
import threading
from collections import OrderedDict
from concurrent.futures import FIRST_EXCEPTION, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, Sequence

import numpy as np
import torch
from scipy import special

from . import registry
from ._blas import one_blas_thread, one_torch_thread
from ._checks import (MAX_ELEMENTS, MAX_SAMPLES, ArgumentTypeError, check_elements, check_int, check_rank_values,
                      check_size, check_sizes, renamed)
from ._options import check_bool, check_positive_float
from ._adaptive_law import check_adaptive_histogram, expected_samples
from .design import AdaptiveDesign, ExactShare, SamplingDesign, design_spec
from .metric_names import MetricSpec, parse_metric
from ._popularity_world import NO_CLASS_COUNTS, PopularityWorld
from .ranking import SampledRanks

if TYPE_CHECKING:
    from .rank_distribution import RankDistribution
    from ._types import TensorLike

logger = logging.getLogger(__name__)

__all__ = [
    "DEFAULT_FAMILY",
    "DEFAULT_FIXED_M",
    "DEFAULT_ADAPTIVE_START",
    "DEFAULT_ADAPTIVE_CAPS",
    "DEFAULT_SHARES",
    "DesignForecast",
    "Plan",
    "plan",
    "PlanExecution",
    "default_designs",
    "SCREEN_FACTOR",
    "DEFAULT_WORKERS",
    "SCREEN_REPEATS",
    "WIDTH_REPEATS",
    "pilot_design",
    "pilot_resolution",
    "add_plan_parser",  # the CLI's (cli.py), re-exported
    "run_plan",  # the CLI's (cli.py), re-exported
]

DEFAULT_FAMILY = "default: 50/50 mixture of P(R) proportional to 1/R and uniform P(R) on 1..n"
DEFAULT_FIXED_M = (50, 100, 200, 500, 1000, 2000)
DEFAULT_ADAPTIVE_START = 100
DEFAULT_ADAPTIVE_CAPS = (800, 3200, 12800)
#: Active exact shares of the default grid (:func:`default_designs`), on its largest adaptive design without
#: completion, for the methods that read a share (``auto``, ``diff``). Their forecast is validated against
#: simulation on real exact ranks (tests/test_planner_share.py: within 1.5x).
DEFAULT_SHARES = (0.01, 0.03, 0.1)
#: The continuation rule of the default grid's threshold designs (:func:`default_designs`): adaptive sampling from m0
#: drawn while r~ <= 3 and completed at the cap, at every cap m0 2^s from max(8 m0, n / 16) up to n / 3, so nearly
#: every positive that may be in the top 10 is ranked exactly (docs/research-notes.md, "The threshold rule"): a cap
#: above n / 3 leaves bins of fewer than 3 ranks, so r~ <= 3 stops short of the top 10; one below n / 16 completes
#: every positive down to rank ~50 (on the scorer workload 13-26% of full ranking's pairs, never the pick).
DEFAULT_ADAPTIVE_TOP = 3
_PILOT_N_SPREAD = 0.1
#: Replicates a design runs first under ``PlanExecution(screen=True)``: if each of them misses the target
#: (|estimate - exact| above target x truth), or their relative RMSE exceeds :data:`SCREEN_FACTOR` x the target,
#: the design is reported as missing it from these alone. RMSE >= min |error|, so the forecast still exceeds the
#: target; a design whose true relative RMSE is at the target is screened out with probability
#: P(|e| > target)^5 = 0.317^5 = 0.3% by the first rule and 8.4e-6 by the second for Gaussian errors (1.4% by the
#: second for Student-t(3) errors).
SCREEN_REPEATS = 5
#: The second screening rule: the first :data:`SCREEN_REPEATS` replicates' relative RMSE above this multiple of the
#: target. For errors of true RMSE = the target, P(screened by this rule) is 8.4e-6 for Gaussian errors (chi-square
#: with 5 df above 31.25), 0 for biased ones (bias 0.8, sd 0.6 of the target; 2e6 simulated sets of 5) and 1.4% for
#: Student-t(3); of Gaussian designs at 3x / 4x the target the two rules together screen 66% / 87% (the all-miss
#: rule alone 22% / 33%). A screened design that meets the target would only cost the plan a costlier pick, never
#: a pick that misses.
SCREEN_FACTOR = 2.5
#: Replicates whose 95% interval a design's ``rel_width`` is the median of (popularity designs: all of them): the
#: first ones, each estimated as the user will (``estimate(metric, sampled, method)`` with the plan's method as
#: given: ``auto``'s choice, its bootstrap, twin gaps and identified intervals), only for designs meeting the point
#: target (the others cannot be the pick). The widths of a design's replicates vary far less than its errors
#: (benchmarks/bench_plan.py --cases width: forecast within 0.8-1.3x of the measured median on ml-100k and
#: ml-latest-small).
WIDTH_REPEATS = 5
#: The replicate interval widths this process has estimated (:meth:`_Replicates.widths`), by what the estimate reads:
#: the metric, the method object (only where every option is a value: :func:`_plain_value`), the registry's entries
#: and ``AUTO_CHOICES``, the design, the replicate's sampled ranks, n, sizes and completed ranks (their bytes, dtype
#: and shape) and the plan's ``workers`` as given. The estimate is a deterministic function of these, so a
#: plan of the same draws (the same seed at another target, with or without pruning or screening) reads the very
#: width it would estimate again; plans on other threads estimate their own. At most :data:`_WIDTHS_MAX` (floats;
#: the least recently used dropped).
_WIDTHS: OrderedDict[tuple, float] = OrderedDict()
_WIDTHS_MAX = 4096
_WIDTHS_LOCK = threading.Lock()
#: The normal quantile of a 95% interval, z = 1.96.
_Z95 = 1.959963984540054
#: Threads of ``PlanExecution(workers=None)`` (at most the CPUs available and one per design). Measured on the scorer
#: benchmark's plan (an H100 host's device run, 2026-11-26; 3 rounds each): on its 16 cores 1.3-1.8 s at 2 threads,
#: 1.6-2.9 s at 1, 2.1-2.5 s at 4, 2.4-3.4 s at 11 (one per design); on the 2-core machine 1.1-1.6 s at 2 and
#: 1.4-1.5 s at 1. The fits' Python between their numpy kernels holds the GIL, so more threads contend for it.
DEFAULT_WORKERS = 2
# the rank-distribution fit of a pilot's shape (whatever method is forecast: the pilot needs a fitted distribution).
# Not ``auto``: a gmod-fitted (smooth) world flatters gmod, the estimator ``auto`` forecasts for adaptive designs, on
# recommenders whose top is irregular (tests/test_planner.py, ItemKNN(q=3): forecasts 0.58-0.69 of the simulated
# error with a gmod pilot fit, 0.81-1.19 with mes); the mes world carries a shape gmod must estimate across.
_PILOT_FIT = "mes"
# sd of the Gaussian kernel in log rank that smooths a pilot's fit (module docstring)
_PILOT_SMOOTH = 0.4
# a rank-distribution estimator's repeats of a design (without exact_at_cap) are fitted together by
# ``rank_distribution.ReplicateFits``: groups pooled once on the sum of the repeats, one likelihood, one batched
# solver (BENCHMARKS.md, "The planner's own time"); False: the per-repeat histograms of ``fit_rank_distribution``
# (tests/test_planner_speed.py compares the two)
_JOINT_FITS = True
# the popularity world's rank prior (``_popularity_world.PopularityWorld.from_pilot``): (``"em"`` or ``"spline"``,
# smoothed in log rank as a uniform pilot's fit or not); benchmarks/planner_popularity.py --world compares them.
# ``("spline", False)``: pl_fit's own prior as fitted, the world that reproduces the pilot's draws
# (``PopularityWorld.pilot_check``; smoothing in log rank made the mean exact rank exp(0.4^2 / 2) = 1.08x deeper and
# missed the pilots' mean sampled rank by |z| ~ 4), with the same calibration against real draws within the noise
# (docs/popularity.md, "Planning a popularity design")
_POPULARITY_WORLD: tuple[str, bool] = ("spline", False)


# ------------------------------------------------------------------------------------------------ results
@dataclass(frozen=True)
class DesignForecast:
    """The forecast of one design.

    Attributes:
        n_samples: m, the (first-stage) number of sampled irrelevant items per positive.
        adaptive_max: the cap of adaptive sampling (rounded down to m 2^s), None for fixed m.
        mean_samples: expected sampled items scored per user (fixed: m; adaptive: the mean final m).
        rel_bias, rel_sd, rel_error: relative bias, standard deviation and root mean squared error
            sqrt(rel_bias^2 + rel_sd^2) of the estimate against each drawn set's exact metric (module docstring).
        rel_error_se: Monte Carlo standard error of ``rel_error`` (delta method over the replicates).
        resolution: exact ranks one sampled rank spans at the top, (n - 1)/(M + 1) + 1 at the mean n, M = m or the
            cap.
        meets_target: rel_error <= the plan's point target and rel_width / 2 <= its interval target (both are
            the plan's ``target``).
        replacement: the draws are with replacement (binomial law; False: without, hypergeometric).
        pairs_se: Monte Carlo standard error of :attr:`pairs` (0 for a fixed m).
        scoring_seconds: predicted scorer time for the plan's ``n_users`` users, :attr:`pairs` x n_users x the
            plan's ``seconds_per_pair``; NaN without one.
        method: the estimator forecast for this design (``auto``'s choice, e.g. ``gmod`` for an adaptive design).
        exact_at_cap: the adaptive design completes the positives still within the top at the cap
            (``SamplingDesign``'s ``exact_at_cap``); their estimates read those positives' exact ranks.
        completion_pairs: expected pairs per user its completion scores: the share of positives still within the
            top at the cap times their n - 1 irrelevant candidates (0 without ``exact_at_cap``).
        popularity_power: a popularity design (forecast in a popularity pilot's world, :mod:`._popularity_world`):
            the exponent a of its weights as a power of the pilot's, w = c w_pilot^a (1: the pilot's own law); None
            for uniform draws.
        popularity: a popularity design's weights (``SamplingDesign(m, popularity=...)``), None for uniform draws.
        rel_width: the median width of the 95% interval the user will read, ``estimate(metric, sampled,
            method).interval(0.95)`` with the plan's method as given (``auto``: its choice per draw, its bootstrap,
            twin gaps and the identified interval of ``top_unresolved`` / ``cap_reached``), relative to each set's
            exact metric, over the first :data:`WIDTH_REPEATS` replicates (popularity designs: every replicate;
            there it also holds what the draws leave unidentified, the model's top and the tilt's likelihood set).
            NaN for designs not forecast (screened, pruned) or missing the point target (they cannot be the
            pick). :attr:`rel_halfwidth` is half of it.
        repeats: Monte Carlo replicates behind the forecast (the plan's ``repeats``, or :data:`SCREEN_REPEATS` for
            a screened design); 0: not recorded.
        screened: every one of the first :data:`SCREEN_REPEATS` replicates missed the target, or their relative
            RMSE exceeded :data:`SCREEN_FACTOR` x the target, so the design was settled as missing it and its other
            replicates were not fitted (``PlanExecution(screen=True)``).
        pruned: not forecast: the design scores more pairs per user than the recommended one, so it cannot be the
            pick (``PlanExecution(forecast_all=False)``, the default); its cost fields hold, its error fields are
            NaN and ``meets_target`` is False. Never set when no design is recommended.
        exact_share: the design's :class:`~reco_sampled_plugin.design.ExactShare` (its estimate is ``diff``'s, whose
            interval holds by design), None without one.
        share_pairs: expected pairs per user the exact share scores: the share times the mean n - 1 irrelevant
            candidates of a chosen positive's row (the mean inclusion probability is the share, uniform or
            active); 0 without a share.
        adaptive_top: an adaptive design's continuation rule (``SamplingDesign``'s ``adaptive_top``: a positive
            draws more while r~ <= it; 1 for fixed m).
    """

    n_samples: int
    adaptive_max: int | None
    mean_samples: float
    rel_bias: float
    rel_sd: float
    rel_error: float
    meets_target: bool
    rel_error_se: float = math.nan
    resolution: float = math.nan
    replacement: bool = True
    pairs_se: float = math.nan
    scoring_seconds: float = math.nan
    method: str | None = None
    exact_at_cap: bool = False
    completion_pairs: float = 0.0
    repeats: int = 0
    screened: bool = False
    pruned: bool = False
    popularity_power: float | None = None
    popularity: torch.Tensor | None = field(default=None, repr=False, compare=False)
    rel_width: float = math.nan
    exact_share: ExactShare | None = None
    share_pairs: float = 0.0
    adaptive_top: int = 1

    @property
    def rel_halfwidth(self) -> float:
        """Half the median 95% interval width relative to the value, ``rel_width / 2``: the interval the user
        reads is about value +- that (what the plan's interval target bounds)."""
        return self.rel_width / 2.0

    @property
    def pairs(self) -> float:
        """Expected (user, item) pairs scored per user: the positive and its sampled items, 1 + ``mean_samples``
        (adaptive: every stage's new draws; the unit of ``ScoringCost.pairs``), plus ``completion_pairs`` and
        ``share_pairs``."""
        return 1.0 + self.mean_samples + self.completion_pairs + self.share_pairs

    @property
    def label(self) -> str:
        """``"m = 100"``, ``"m = 100 (no repl.)"``, ``"adaptive 100->3200"``, ``"m = 100 popularity"`` (the pilot's
        weights) or ``"m = 100 popularity^0.5"`` (their square root); an exact share adds ``" + exact 0.02 active"``."""
        share = self.exact_share
        return self._sampling_label() + ("" if share is None else f" + exact {share.share:g} {share.choice}")

    def _sampling_label(self) -> str:
        if self.popularity_power is not None:
            a = self.popularity_power
            return f"m = {self.n_samples} popularity" + ("" if abs(a - 1.0) < 1e-9 else f"^{a:.3g}")
        if self.adaptive_max is None:
            return f"m = {self.n_samples}" + ("" if self.replacement else " (no repl.)")
        top = "" if self.adaptive_top == 1 else f" top {self.adaptive_top}"
        return f"adaptive {self.n_samples}->{self.adaptive_max}{top}" + (" exact" if self.exact_at_cap else "")

    def sampling_design(self, name: str = "n_samples") -> SamplingDesign:
        """:attr:`design` (:class:`~reco_sampled_plugin.design.PlannedDesign`: a forecast is taken wherever a design
        is)."""
        return self.design

    @property
    def spec(self) -> str | None:
        """The design's one-line spec (:func:`~reco_sampled_plugin.design.design_spec`: ``"100:3200"``,
        ``"100:12800+0.03:active"``), what ``reco-sampled plan --design`` and RecBole's ``rsp_design`` take; None
        for a popularity design (its weights: pass the forecast or its design itself)."""
        return None if self.popularity is not None else design_spec(self.design)

    @property
    def design(self) -> SamplingDesign:
        """The forecast's design as a :class:`~reco_sampled_plugin.design.SamplingDesign`."""
        if self.popularity is not None:
            return SamplingDesign(self.n_samples, popularity=self.popularity)
        return SamplingDesign(self.n_samples, replacement=self.replacement, adaptive_max=self.adaptive_max,
                              adaptive_top=self.adaptive_top, exact_at_cap=self.exact_at_cap,
                              exact_share=self.exact_share)


@dataclass(frozen=True, eq=False)
class Plan:
    """What :func:`plan` forecasts (see the module docstring for the conventions).

    Attributes:
        metric: the metric's canonical name (``"ndcg@10"``).
        n_items: the catalogue size n (int), or the per-user candidate counts (int64 array).
        n_users: users (one held-out positive each) per evaluation.
        target: the point target: the largest relative RMSE of a design's estimate.
        target_halfwidth: the interval target: the largest median half-width of a design's 95% interval relative to
            the value (``DesignForecast.rel_halfwidth``); a design meets the plan's target when it meets both.
        shape_source: where the rank distribution came from (the pilot's fit, or :data:`DEFAULT_FAMILY`).
        truth: the metric under the shape (mean of the drawn sets' exact metrics).
        forecasts: one :class:`DesignForecast` per design, in the order given.
        recommended: the cheapest design (fewest scored pairs per user, hence least predicted scoring time)
            meeting the target with fewer pairs than ranking every item; None: no sampled design does, rank all n
            items.
        method, repeats, seed: the estimator and the Monte Carlo settings.
        seconds: wall time the plan took.
        seconds_per_pair: scorer seconds per scored (user, item) pair behind the predicted times (None: no times).
        seconds_per_pair_source: where it came from (``"given"``, or the pilot's measured cost).
        notes: warnings about the forecast in words (e.g. a pilot that does not resolve the metric's top:
            :func:`pilot_design`); printed under the recommendation.
        full_rel_width: full ranking's own 95% interval width relative to the value (2 z sd / sqrt(n_users) / T per
            set of users, the median; z = 1.96): the users' spread, which no design removes.
    """

    metric: str
    n_items: int | np.ndarray
    n_users: int
    target: float
    shape_source: str
    truth: float
    forecasts: tuple[DesignForecast, ...]
    recommended: DesignForecast | None
    method: str = registry.DEFAULT_ESTIMATOR
    repeats: int = 20
    seed: int = 0
    seconds: float = field(default=math.nan, compare=False)
    seconds_per_pair: float | None = None
    seconds_per_pair_source: str | None = None
    notes: tuple[str, ...] = ()
    target_halfwidth: float = math.nan
    full_rel_width: float = math.nan
    # the replicates behind the forecasts (:func:`plan` sets them; :meth:`at_target` reads them)
    _replicates: _PlanReplicates | None = field(default=None, init=False, repr=False, compare=False)

    def at_target(self, target_rel_error: float | None = None, *,
                  target_rel_halfwidth: float | None = None) -> Plan:
        """The plan at other targets, from this plan's own replicates (no estimator runs): the forecasts and the
        pick that :func:`plan` with these two arguments, and every other argument as this plan's, gives, bit for
        bit (the same draws, estimates, screening and pruning rules and interval widths).

        Args:
            target_rel_error: the point target, the largest acceptable relative RMSE of the estimate (a fraction
                of the metric's value: 0.05 is 5%); None: this plan's (:attr:`target`).
            target_rel_halfwidth: the interval target, the largest acceptable median half-width of the 95%
                interval relative to the value (a fraction: 0.1 is value +- 10%); None: :func:`plan`'s default at
                the point target, sqrt(h_full^2 + (1.96 target_rel_error)^2) with h_full half of
                :attr:`full_rel_width` (not this plan's :attr:`target_halfwidth` where that was given).

        Returns:
            a :class:`Plan` for the same metric, shape and designs: :attr:`target`, :attr:`target_halfwidth`,
            :attr:`forecasts` and :attr:`recommended` at the new targets, the rest as this plan's (``seconds``
            included: the time of the replicates it reads), and this plan's replicates (its own ``at_target`` reads
            the same ones).

        Raises:
            ValueError: a target that is not a finite number > 0, or a forecast the new pick depends on that this
                plan did not run far enough: a design screened here but not at the new target, pruned here (costlier
                than this plan's pick) and needed now, or whose interval was not estimated (it missed this plan's
                point target) and is needed now. From a plan made with ``PlanExecution(forecast_all=True)`` every
                tighter target (a ``target_rel_error`` at most this plan's, any ``target_rel_halfwidth``) is
                available: a design screened here is screened there too, and one meeting the tighter point target
                met this one, so its interval was estimated. A looser target only where no design it needs was
                screened or pruned here, or missed this plan's point target while meeting the new one.
        """
        return _at_target(self, target_rel_error, target_rel_halfwidth)

    @property
    def full_cost(self) -> float:
        """Items scored per user by full ranking besides the positive (mean n - 1)."""
        return float(np.mean(self.n_items)) - 1.0

    @property
    def full_pairs(self) -> float:
        """(user, item) pairs full ranking scores per user: mean n, every candidate (the catalogue minus the
        user's excluded items; ``ScoringCost.full_pairs`` / users)."""
        return float(np.mean(self.n_items))

    @property
    def full_scoring_seconds(self) -> float:
        """Predicted scorer time of full ranking for the ``n_users`` users: full_pairs x n_users x
        seconds_per_pair (NaN without a seconds_per_pair)."""
        return _scoring_seconds(self.full_pairs, self.n_users, self.seconds_per_pair)

    def format(self) -> str:
        """A readable table of the forecasts and a one-line recommendation."""
        n = self.n_items
        n_text = f"{n:,}" if np.ndim(n) == 0 else f"{int(np.min(n)):,}" + (
            f"..{int(np.max(n)):,}" if np.max(n) > np.min(n) else "") + " (per user)"
        lines = [
            f"Plan for {self.metric} (estimator {self.method}): n_items = {n_text}, {self.n_users:,} users, "
            f"target relative error {self.target:.1%}, 95% interval within +-{self.target_halfwidth:.1%} of the value",
            f"rank distribution: {self.shape_source}",
            f"{self.metric} under it: {self.truth:.4g}; {self.repeats} Monte Carlo repeats, seed {self.seed}; "
            f"interval: the median over {WIDTH_REPEATS} repeats of estimate(...).interval(0.95), the estimate you will "
            f"read, for the designs meeting the point target",
        ]
        timed = self.seconds_per_pair is not None
        if timed:
            lines.append(f"scoring time: {self.seconds_per_pair:.3g} s per scored pair ({self.seconds_per_pair_source})"
                         f"; times are the scorer's for {self.n_users:,} users")
        time_head = f"{'time':>10}" if timed else ""
        w = max([26] + [len(f.label) + 1 for f in self.forecasts])  # the design column (a share's label is longer)
        lines += [
            "",
            f"{'design':<{w}}{'estimator':<10}{'pairs/user':>12}{'of full':>9}{time_head}{'resolution':>12}{'rel.bias':>10}"
            f"{'rel.sd':>9}{'rel.error':>11}{'(MC se)':>9}{'interval':>10}  meets",
        ]
        full = self.full_pairs
        for f in self.forecasts:
            if f.pruned:  # its cost alone: it scores more pairs than the pick
                when = f"{_duration(f.scoring_seconds):>10}" if timed else ""
                lines.append(f"{f.label:<{w}}{f.method or self.method:<10}{f.pairs:>12,.0f}{f.pairs / full:>9.1%}{when}"
                             f"{f.resolution:>12.1f}{'-':>10}{'-':>9}{'-':>11}{'':>9}{'-':>10}  not forecast: costlier than the pick")
                continue
            err = f"{f.rel_error:.1%}" if math.isfinite(f.rel_error) else "inf"
            se = f"({f.rel_error_se:.1%})" if math.isfinite(f.rel_error_se) else ""
            when = f"{_duration(f.scoring_seconds):>10}" if timed else ""
            lines.append(
                f"{f.label:<{w}}{f.method or self.method:<10}{f.pairs:>12,.0f}{f.pairs / full:>9.1%}{when}{f.resolution:>12.1f}{f.rel_bias:>10.1%}"
                f"{f.rel_sd:>9.1%}{err:>11}{se:>9}{_plus_minus(f.rel_halfwidth):>10}  {'yes' if f.meets_target else 'no'}"
                + (f" (screened: {f.repeats} repeats)" if f.screened else "")
            )
        when = f"{_duration(self.full_scoring_seconds):>10}" if timed else ""
        full_ok = "yes" if not self.full_rel_width / 2.0 > self.target_halfwidth else "no (the users' spread)"
        lines.append(f"{'full ranking':<{w}}{'exact':<10}{full:>12,.0f}{1.0:>9.1%}{when}{1.0:>12.1f}{0.0:>10.1%}{0.0:>9.1%}"
                     f"{0.0:>11.1%}{'':>9}{_plus_minus(self.full_rel_width / 2.0):>10}  {full_ok}")
        if any(f.pruned for f in self.forecasts):
            lines.append("(not forecast: designs scoring more pairs than the pick, which cannot be the pick; "
                         "PlanExecution(forecast_all=True) or --forecast-all forecasts every design)")
        lines.append("")
        lines.append(self.recommendation())
        lines += [f"Note: {note}" for note in self.notes]
        return "\n".join(lines)

    def sampling_design(self, name: str = "n_samples") -> SamplingDesign:
        """The recommended design (:class:`~reco_sampled_plugin.design.PlannedDesign`: a plan is taken wherever a
        design is); a ValueError naming ``name`` where the plan recommends full ranking."""
        if self.recommended is None:
            raise ValueError(f"{name}: the plan recommends no sampled design (none meets its target below full "
                             "ranking): rank all items, or plan again with a looser target")
        return self.recommended.design

    def recommendation(self) -> str:
        """The one-line recommendation."""
        r = self.recommended
        full_time = (f", predicted scoring time {_duration(self.full_scoring_seconds)}"
                     if self.seconds_per_pair is not None else "")
        full_half = self.full_rel_width / 2.0
        if r is None:
            floor = (f"; full ranking's own 95% interval is about +-{full_half:.1%} (the users' spread: more users "
                     f"narrow it)" if full_half > self.target_halfwidth else "")
            return (f"Recommendation: no sampled design meets a relative error of {self.target:.1%} with a 95% "
                    f"interval within +-{self.target_halfwidth:.1%}; rank all items ({self.full_pairs:,.0f} scored "
                    f"pairs per user{full_time}) or relax the target{floor}.")
        when = (f"; predicted scoring time {_duration(r.scoring_seconds)} against "
                f"{_duration(self.full_scoring_seconds)} for full ranking" if self.seconds_per_pair is not None
                else "")
        model = ", what the draws leave to pl_fit's model included" if r.popularity is not None else ""
        return (f"Recommendation: {r.label} (about {r.pairs:,.0f} scored pairs per user, {r.pairs / self.full_pairs:.1%} "
                f"of full ranking's {self.full_pairs:,.0f}{when}; predicted relative error {r.rel_error:.1%} <= "
                f"{self.target:.1%}, 95% interval about +-{r.rel_halfwidth:.1%} of the value <= "
                f"+-{self.target_halfwidth:.1%}{model}): n_samples={r.design!r}" + _spec_step(r.spec) + ".")


def _spec_step(spec: str | None) -> str:
    """The recommendation's spec of the design, as the CLI and a RecBole YAML file take it (quoted: YAML 1.1 reads
    an unquoted ``10:40`` as the base-60 integer 640)."""
    if spec is None:
        return ""
    return f"; design spec {spec} (RecBole: rsp_design: \"{spec}\"; reco-sampled plan --design {spec})"


def _plus_minus(half: float) -> str:
    """``"+-12.3%"`` (``"-"`` for NaN)."""
    return f"+-{half:.1%}" if math.isfinite(half) else "-"


def _scoring_seconds(pairs_per_user: float, n_users: int, seconds_per_pair: float | None) -> float:
    """pairs_per_user x n_users x seconds_per_pair (NaN without a seconds_per_pair)."""
    return math.nan if seconds_per_pair is None else pairs_per_user * n_users * seconds_per_pair


def _duration(seconds: float) -> str:
    """``"0.42 s"``, ``"12.5 s"``, ``"8.3 min"``, ``"2.1 h"``, ``"3.4 d"`` (``"-"`` for NaN)."""
    if not math.isfinite(seconds):
        return "-"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds:.3g} s"


# ------------------------------------------------------------------------------------------------- shapes
class _DefaultShape:
    """P(R) = 1/2 (1/R)/H_n + 1/2 (1/n) on 1..n, for each user's n."""

    source = DEFAULT_FAMILY

    def draw(self, n_u: np.ndarray, repeats: int, rng: np.random.Generator) -> np.ndarray:
        shape = (repeats, len(n_u))
        uniform = 1 + np.floor(rng.random(shape) * n_u).astype(np.int64)
        t = rng.random(shape) * harmonic_number(n_u)
        harmonic = harmonic_inverse(t)  # smallest R with H_R >= t: O(1) memory per draw, whatever n is
        r = np.where(rng.random(shape) < 0.5, harmonic, uniform)
        return np.clip(r, 1, n_u).astype(np.int64)


def harmonic_number(r: TensorLike) -> np.ndarray:
    """H_r = sum_{i=1}^r 1/i in closed form, psi(r + 1) + Euler's gamma (no sum over 1..r), for whole r >= 0."""
    return special.digamma(np.asarray(r, dtype=np.float64) + 1.0) + np.euler_gamma


def harmonic_inverse(t: TensorLike) -> np.ndarray:
    """The smallest whole R >= 1 with H_R >= t, for t >= 0: R ~ exp(t - gamma) - 1/2 (H_R = ln(R + 1/2) + gamma
    + O(1/R^2)), then moved by single steps until H_{R-1} < t <= H_R (a step or two; the loop is over
    corrections, not over draws)."""
    t = np.asarray(t, dtype=np.float64)
    r = np.maximum(np.floor(np.exp(np.minimum(t - np.euler_gamma, 700.0)) - 0.5), 1.0)
    for _ in range(64):
        up = harmonic_number(r) < t
        down = (r > 1) & (harmonic_number(r - 1.0) >= t)
        if not (up.any() or down.any()):
            break
        r = r + up - down
    return r.astype(np.int64)


def _smooth_log_rank(edges: np.ndarray, probs: np.ndarray, bandwidth: float) -> np.ndarray:
    """Cell probabilities smoothed in log rank: each cell's mass spread over the cells with weights
    width_i exp(-(log c_i - log c_j)^2 / (2 h^2)) (c: the cell's geometric centre), normalised per source cell,
    so the total mass is kept."""
    e = edges.astype(np.float64)
    centre = np.log(np.sqrt((e[:-1] + 1.0) * e[1:]))
    kernel = np.exp(-0.5 * ((centre[:, None] - centre[None, :]) / bandwidth) ** 2) * np.diff(e)[:, None]
    kernel /= kernel.sum(axis=0, keepdims=True)
    out = kernel @ probs
    return out / out.sum()


class _PilotShape:
    """The pilot's fitted P(R), smoothed in log rank (module docstring: truncated within the pilot's n range,
    rescaled outside)."""

    def __init__(self, dist: RankDistribution, source: str, resolution: float = math.nan) -> None:
        self.resolution = resolution  # exact ranks one sampled rank spans at the pilot's largest m (or cap), mean n
        self.edges = dist.edges.astype(np.int64)
        self.probs = _smooth_log_rank(self.edges, np.asarray(dist.probs, dtype=np.float64), _PILOT_SMOOTH)
        hist = dist.histogram
        occupied = hist.n_items[hist.totals > 0]
        self.n_lo, self.n_hi = int(occupied.min()), int(min(occupied.max(), self.edges[-1]))
        self.source = source

    def draw(self, n_u: np.ndarray, repeats: int, rng: np.random.Generator) -> np.ndarray:
        from ._popularity_world import draw_from_cells

        n_ref = np.clip(n_u, self.n_lo, self.n_hi)
        shape = (repeats, len(n_u))
        r = draw_from_cells(self.edges, self.probs, n_ref, repeats, rng)
        moved = n_ref != n_u
        if moved.any():  # onto the relative-rank scale of the user's own n
            scaled = 1 + np.floor((r - 1 + rng.random(shape)) * (n_u / n_ref)).astype(np.int64)
            r = np.where(moved, scaled, r)
        return np.clip(r, 1, n_u).astype(np.int64)


def _unpack_pilot(pilot: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, SamplingDesign | None,
                                       torch.Tensor | None]:
    """(ranks, n, m, adaptive design or None, exact ranks or None) of a :class:`~reco_sampled_plugin.ranking.
    SampledRanks` pilot (padding dropped; adaptive: each positive's final m; an ``exact_at_cap`` pilot: the exact
    ranks of its completed positives, 0 elsewhere), which carries its own sizes and design; a ValueError names
    ``pilot``."""
    if not isinstance(pilot, SampledRanks):
        raise ValueError(f"pilot: expected the SampledRanks of a pilot draw (they carry n, m and the design; "
                         f"SampledRanks(ranks, n_candidates, design=SamplingDesign(m)) for ranks from elsewhere), "
                         f"got {type(pilot).__name__}")
    design = pilot.design
    if not isinstance(design, SamplingDesign):
        raise ValueError("pilot: these SampledRanks carry no design; give SampledRanks(ranks, n_candidates, "
                         "design=SamplingDesign(m)) (adaptive: with n_samples, each positive's final m)")
    try:  # the parts' own checks, named as the pilot's
        ranks = check_rank_values(pilot.ranks, "pilot.ranks", whole=True, padding=True).cpu()
        n = torch.as_tensor(check_sizes(pilot.n_candidates, "pilot.n_candidates", 0)).cpu()
        m = torch.as_tensor(check_sizes(pilot.sizes(), "pilot.n_samples", 0)).cpu()
        if ranks.dim() == 2 and n.dim() == 1 and n.shape[0] == ranks.shape[0]:
            n = n.unsqueeze(1)  # one n per row (sampled_ranks), shared by the row's positives
        keep = ranks > 0  # padding dropped; the plan runs on the CPU whatever device the pilot was drawn on
        n, m = n.expand(ranks.shape)[keep], m.expand(ranks.shape)[keep]
    except RuntimeError as exc:  # shapes that do not broadcast
        raise ValueError(f"pilot: its ranks, n_candidates and n_samples do not fit together ({exc})") from None
    n = torch.as_tensor(check_sizes(n, "pilot.n_candidates", 2))
    m = torch.as_tensor(check_sizes(m, "pilot.n_samples", 1, maximum=MAX_SAMPLES))
    adaptive = design if design.adaptive_max is not None else None
    exact = None
    if design.exact_at_cap and pilot.exact_ranks is not None:  # completed at the cap: their exact ranks are data too
        exact = check_rank_values(pilot.exact_ranks, "pilot.exact_ranks", whole=True, padding=True).cpu()
        exact = exact.expand(ranks.shape)[keep].to(torch.int64)
    return ranks[keep], n, m, adaptive, exact


def _popularity_pilot(pilot: SampledRanks, n_items: Any, n_users: int,
                      seed: int) -> tuple[PopularityWorld, np.ndarray, np.ndarray]:
    """(world, n per simulated user, the same for ``Plan.n_items``) of a popularity-sampled pilot: its fitted
    ``pl_fit`` model (:class:`~reco_sampled_plugin._popularity_world.PopularityWorld`), whose users are the pilot's
    positives, so ``n_items`` must be the catalogue its weights cover."""
    assert pilot.design is not None and pilot.design.popularity is not None  # the caller's test
    if pilot.popularity_stats is None or not pilot.popularity_stats.has_profile:
        raise ValueError(NO_CLASS_COUNTS)
    catalogue = int(pilot.design.popularity.numel())
    if np.ndim(n_items) != 0 or int(n_items) != catalogue:
        raise ValueError(f"n_items: with a popularity pilot the simulated users are the pilot's positives (their "
                         f"candidates and popularity classes), so give the catalogue its weights cover, {catalogue:,}, "
                         f"not {n_items if np.ndim(n_items) == 0 else 'per-user counts'}")
    prior, smoothed = _POPULARITY_WORLD
    world = PopularityWorld.from_pilot(pilot, n_users, np.random.default_rng([seed, 28]), prior=prior,
                                       smooth=(lambda edges, p: _smooth_log_rank(edges, p, _PILOT_SMOOTH))
                                       if smoothed else None)
    world.pilot_check(pilot, seed=seed)
    return world, world.n, world.n.copy()


def _world_seed(seed: int, j: int) -> int:
    """The seed of replicate ``j``'s world (the items above each positive), shared by every popularity design."""
    return (seed * 1_000_003 + 104_729 * (j + 1)) % (1 << 63)


def _seconds_per_pair(seconds_per_pair: Any, cost: Any) -> tuple[float | None, str | None]:
    """(seconds per scored pair, its source): ``seconds_per_pair`` when given, else measured on a scorer-loop
    pilot (its ``cost``: scorer seconds / pairs), else (None, None)."""
    if seconds_per_pair is not None:
        return check_positive_float(seconds_per_pair, "seconds_per_pair"), "given"
    if cost is None or cost.pairs <= 0 or not cost.scorer_seconds > 0:
        return None, None
    loop = f"; the loop's own time {cost.loop_seconds / cost.scorer_seconds:.0%} of it, not in the times"
    return cost.scorer_seconds / cost.pairs, (f"measured on the pilot: {cost.pairs:,} pairs in "
                                              f"{cost.scorer_seconds:.3g} s of scorer time{loop}")


def _pilot_shape(ranks: torch.Tensor, n_items: torch.Tensor, n_samples: torch.Tensor, adaptive: SamplingDesign | None,
                 exact: torch.Tensor | None = None, spec: MetricSpec | None = None) -> _PilotShape:
    """The rank distribution fitted on a pilot's sampled ranks, n and m per positive (:func:`_unpack_pilot`); the
    positives an ``exact_at_cap`` pilot completed (``exact`` > 0) enter as exact groups, the point mass at their R
    (as every estimator reads them), so a pilot completed at a low cap resolves the top it forecasts."""
    from ._rank_hist import as_histogram, sampled_rank_histogram
    from .rank_distribution import fit_rank_distribution

    if ranks.numel() == 0:
        raise ValueError("pilot: no sampled ranks")
    try:  # the histogram's own checks (range, broadcast) name its arguments: say the planner's
        hist = as_histogram(ranks, n_items, n_samples) if exact is None or not bool((exact > 0).any()) \
            else sampled_rank_histogram(ranks, n_items, n_samples, exact_ranks=exact)
        hist.check_nonempty()
    except ValueError as exc:
        raise ValueError(renamed(str(exc), {"sampled_ranks": "pilot.ranks", "n_items": "pilot.n_candidates",
                                            "n_samples": "pilot.n_samples"})) from None
    design = None if adaptive is None else adaptive.adaptive
    if design is not None:
        try:
            check_adaptive_histogram(hist, design)
        except ValueError as exc:
            raise ValueError(f"pilot: {exc}") from None
        design_text = f", adaptive m = {design.n_samples}->{design.cap}"
    else:
        ms = hist.n_samples[hist.totals > 0]
        design_text = f", m = {int(ms.min())}" + (f"..{int(ms.max())}" if ms.max() > ms.min() else "")
    # n pooled onto a geometric grid of the pilot's own counts (the default quantile pooling moves adaptive groups
    # with m >= n to n = m + 1, outside the catalogue)
    fit = _PILOT_FIT
    if registry.get(fit).family == "auto":
        from ._auto import auto_method

        fit = auto_method(spec if spec is not None else parse_metric("hit@10"), hist, design)[0]
    dist = fit_rank_distribution(hist, registry.method_class(fit)(n_bootstrap=0, max_rel_n_spread=_PILOT_N_SPREAD))
    ns = hist.n_items[hist.totals > 0]
    n_text = f"n = {int(ns.min()):,}" + (f"..{int(ns.max()):,}" if ns.max() > ns.min() else "")
    source = f"pilot: {fit} fit on {int(round(hist.total)):,} sampled ranks ({n_text}{design_text})"
    occupied = hist.totals > 0
    n_mean = float(np.average(hist.n_items[occupied], weights=hist.totals[occupied]))
    top_m = float(design.cap if design is not None else hist.n_samples[occupied].max())
    return _PilotShape(dist, source, (n_mean - 1.0) / (top_m + 1.0) + 1.0)


# ------------------------------------------------------------------------------------------------ designs
#: Why the planner needs a popularity pilot to forecast popularity designs.
_POPULARITY_PILOT = ("a popularity design's accuracy depends on how the items above each positive vary with the "
                     "weights, which uniform ranks do not show: pass the SampledRanks of a popularity-sampled pilot "
                     "(pilot=sampled_ranks(..., SamplingDesign(m, popularity=w))), whose fitted pl_fit model the "
                     "planner simulates (docs/popularity.md, 'Planning a popularity design')")


def _popularity_power(weights: torch.Tensor, pilot: torch.Tensor) -> float:
    """a of w = c w_pilot^a: the least-squares slope of log w on log w_pilot over the items of weight > 0 (1 where
    the pilot's weights are all equal)."""
    keep = pilot > 0
    x, y = torch.log(pilot[keep].double().cpu()), torch.log(weights[keep].double().cpu())
    xc = x - x.mean()
    var = float((xc * xc).sum())
    return 1.0 if var <= 0 else float((xc * (y - y.mean())).sum()) / var


def _check_below_full(m: int, n_min: int) -> None:
    if m >= n_min - 1:
        raise ValueError(f"designs: m = {m} is not below n_items - 1 = {n_min - 1}; rank all items instead")


def _check_design(design: Any, n_min: int, method: str, world: PopularityWorld | None = None) -> SamplingDesign:
    """One candidate :class:`~reco_sampled_plugin.design.SamplingDesign` checked for the plan (uniform draws, fixed
    or adaptive, ``exact_at_cap``; popularity draws where ``world``, a popularity pilot's
    :class:`~reco_sampled_plugin._popularity_world.PopularityWorld`, is given), returned as the plan simulates it:
    an adaptive cap rounded down to m 2^s. The estimator must support it (``registry.get(method).supports``)."""
    if not isinstance(design, SamplingDesign):
        raise ValueError(f"designs: each design is a SamplingDesign (SamplingDesign(m), SamplingDesign(m, "
                         f"adaptive_max=cap), ...), got {design!r}")
    m, entry = design.n_samples, registry.get(method)
    if design.exact_share is not None:
        return _check_share_design(design, n_min, method)
    if design.law == "popularity":
        if world is None:
            raise ValueError(f"designs: {design.describe()} draws by popularity; {_POPULARITY_PILOT}")
        if not design.replacement:
            raise ValueError(f"designs: {design.describe()} draws without replacement, which no popularity "
                             "estimator corrects (no Hansen-Hurwitz weights); draw with replacement")
        world.check_design(design.popularity)
        _check_below_full(m, n_min)
        if not entry.supports(design):
            raise ValueError(f"designs: {method!r} does not correct popularity designs; use one of "
                             f"{registry.names(design=design)}")
        return design
    if design.adaptive_max is None:
        _check_below_full(m, n_min)
        if not entry.supports(design):
            raise ValueError(f"designs: {method!r} does not support draws without replacement; use one of "
                             f"{registry.names(design=design)}")
        return design
    if not entry.supports(SamplingDesign(m, adaptive_max=design.adaptive_max)):
        raise ValueError(f"designs: adaptive sampling needs one of the methods {registry.names(adaptive=True)}, "
                         f"not {method!r}")
    _check_below_full(m, n_min)
    return SamplingDesign(m, adaptive_max=design.cap, adaptive_top=design.adaptive_top,
                          exact_at_cap=design.exact_at_cap)


def _check_share_design(design: SamplingDesign, n_min: int, method: str) -> SamplingDesign:
    """A design with an exact share checked for the plan: uniform draws (fixed or adaptive), read by ``diff``
    (``method`` ``auto`` or ``diff``; any other estimator ignores the share, whose pairs would be spent for
    nothing). Returned as simulated (an adaptive cap rounded down to m 2^s)."""
    share = design.exact_share
    if registry.get(method).family not in ("auto", "design_based"):
        raise ValueError(f"designs: {design.describe()} has an exact share, which only 'diff' (and 'auto', which "
                         f"runs it there) reads; {method!r} would ignore it: plan with method='auto' or 'diff', or "
                         "give the design without exact_share")
    if design.law == "popularity":
        raise ValueError(f"designs: {design.describe()} draws by popularity with an exact share, which the planner "
                         "does not forecast (its popularity world simulates no exact share); plan the share on "
                         "uniform draws, or give the design without exact_share")
    _check_below_full(design.n_samples, n_min)
    if design.adaptive_max is None:
        return design
    return SamplingDesign(design.n_samples, adaptive_max=design.cap, adaptive_top=design.adaptive_top,
                          exact_share=share)


def _adaptive_start(n: int) -> int:
    """m0 of the default adaptive designs (and of :func:`pilot_design`): 100, or (n - 1) // 8 below n = 801."""
    return min(DEFAULT_ADAPTIVE_START, max(1, (n - 1) // 8))


def default_designs(n_items: int, method: str = registry.DEFAULT_ESTIMATOR,
                    metric: str | MetricSpec = "ndcg@10") -> list[SamplingDesign]:
    """The default grid for catalogues of (at least) ``n_items`` candidates.

    Fixed m in :data:`DEFAULT_FIXED_M` with m < n - 1; adaptive sampling from m0 = min(100, (n - 1) // 8) with the
    caps of :data:`DEFAULT_ADAPTIVE_CAPS` that are at least 2 m0, up to and including the first cap >= n - 1 (a
    larger one resolves nothing more); adaptive designs only for the methods that take them
    (``registry.names(adaptive=True)``). Last, where the largest cap stays below
    n - 1 (and n - 1 <= MAX_SAMPLES, the largest m of the exact groups it is read as), that design with
    ``exact_at_cap`` (the positives still first at the cap ranked exactly): without it the flag ``cap_reached``
    widens the interval the user reads to what the top leaves unidentified (on the README's plan, +-28% of NDCG@10
    for a point error of 2.7%), and the plan's interval target would find no sampled design. Then the threshold
    designs: adaptive sampling from m0 drawing while r~ <= :data:`DEFAULT_ADAPTIVE_TOP` and completed at the cap, at
    each cap m0 2^s from max(8 m0, n / 16) up to n / 3 (what a 2% target on HR@10 needs: the positives that may be
    hits ranked exactly). Then, for ``auto`` and
    ``diff``, the largest adaptive design with an active exact share of each of :data:`DEFAULT_SHARES` (``diff``'s
    interval holds by design; each costs its share of n - 1 pairs per user), its inclusion probabilities set by the
    spread of ``metric`` (the planned one; ``ExactShare.metric``).
    """
    n = check_size(n_items, "n_items", 2)
    out = [SamplingDesign(m) for m in DEFAULT_FIXED_M if m < n - 1]
    if method in registry.names(adaptive=True) and n > 2:  # n = 2: nothing to sample below full ranking
        m0 = _adaptive_start(n)
        for cap in DEFAULT_ADAPTIVE_CAPS:
            if cap >= 2 * m0 and m0 < n - 1:
                out.append(SamplingDesign(m0, adaptive_max=AdaptiveDesign(m0, cap).cap))
                if cap >= n - 1:
                    break
        last = out[-1]
        # the completed positives are read as exact groups, m = n - 1 (at most MAX_SAMPLES)
        if last.adaptive_max is not None and last.adaptive_max < n - 1 <= MAX_SAMPLES:
            completed = dataclasses.replace(last, exact_at_cap=True)
            if registry.get(method).supports(completed):
                out.append(completed)
        if n - 1 <= MAX_SAMPLES and DEFAULT_ADAPTIVE_TOP <= m0:
            caps = [m0 << s for s in range(3, 64) if n // 16 <= m0 << s <= n // 3]
            out += [d for d in (SamplingDesign(m0, adaptive_max=cap, adaptive_top=DEFAULT_ADAPTIVE_TOP,
                                               exact_at_cap=True) for cap in caps) if registry.get(method).supports(d)]
        if registry.get(method).family in ("auto", "design_based") and last.adaptive_max is not None:
            out += [dataclasses.replace(last, exact_share=ExactShare(s, choice="active", metric=str(metric)))
                    for s in DEFAULT_SHARES]
    return out


def pilot_resolution(metric: str | MetricSpec) -> float | None:
    """The resolution b (exact ranks per sampled rank at the top) a pilot should reach for the planner to forecast
    ``metric``: max(2, K / 2) for a cut-off K, 2 for top-weighted metrics without one (``rr``, ``ndcg``, ``ap``),
    None for ``auc`` (linear in the rank: any pilot will do).

    Why K / 2: a pilot whose top bin is wider than the cut-off leaves the fit to guess how the first bin's mass
    splits around K, and for small metrics the guess decides the forecast. Measured on the scorer benchmark's world
    (50,000 items, NDCG@10 0.0128; 1,000 pilot users, BENCHMARKS.md): an adaptive pilot to cap 3,200 (b = 16.6)
    left the ``mes`` and ``gmod`` fits' NDCG@10 apart by 1.5-2.7x (0.0043 / 0.0115) and the forecasts 2-12x off;
    to cap 12,800 (b = 4.9) the two fits agreed within 11%. From 6 pilot draws each (``benchmarks/studies/planner_pilot.py``)
    the planner picked a design meeting its 10% target (simulated 5.6-7.7%) 5 times from the resolved pilot and 4
    times from the coarse one, full ranking otherwise (never a design that misses)."""
    spec = parse_metric(metric)
    if spec.kind == "auc":
        return None
    return 2.0 if spec.k is None else max(2.0, spec.k / 2.0)


def pilot_design(n_items: int, metric: str | MetricSpec, *, n_samples: int | None = None) -> SamplingDesign:
    """A pilot design whose top is resolved for ``metric`` (:func:`pilot_resolution`): adaptive sampling from
    ``n_samples`` (default: the default grid's m0, min(100, (n - 1) // 8)) doubling to the first cap ``n_samples`` x 2^s with (n - 1)/(cap + 1) + 1 <= that resolution
    (``n_items``: the largest n of the evaluation); fixed ``n_samples`` for ``auc`` or where it already resolves it.

    A pilot costs about 1 + m + (the doublings of the positives still first) pairs per user: few, as only the
    positives near the top keep doubling (the scorer benchmark: 728 pairs per user for 100 -> 12,800 at n = 50,000).

    Raises:
        ValueError: ``n_items`` below 3 or ``n_samples`` not below n - 1, an unknown metric.
    """
    n = check_size(n_items, "n_items", 3)
    m = _adaptive_start(n) if n_samples is None else check_int(n_samples, "n_samples", minimum=1)
    if m >= n - 1:
        raise ValueError(f"n_samples: m = {m} is not below n_items - 1 = {n - 1}; rank all items instead")
    b = pilot_resolution(metric)
    if b is None or (n - 1) / (m + 1) + 1 <= b:
        return SamplingDesign(m)
    cap = m
    while (n - 1) / (cap + 1) + 1 > b:
        cap *= 2
    return SamplingDesign(m, adaptive_max=cap)


def _zero_truth_note(truth: float, spec: MetricSpec, n_users: int, truths: np.ndarray | None = None) -> tuple[str, ...]:
    """Why every relative error is inf (``Plan.notes``): the simulated users' exact metric is 0; or why relative
    widths may be: some simulated sets of users have an exact metric of 0."""
    if truth == 0.0:
        return (f"the {n_users} simulated users' exact {spec} is 0 (no positive inside its cut-off), so relative "
                "errors are undefined (inf): forecast for more users (n_users; --n-users), or a metric with a larger "
                "cut-off",)
    zero = 0 if truths is None else int(np.count_nonzero(truths == 0))
    if truths is None or zero == 0:
        return ()
    return (f"{zero} of {len(truths)} simulated sets of {n_users} users have an exact {spec} of 0, whose relative "
            "interval widths are inf (a median of inf where they are half or more): forecast for more users "
            "(n_users; --n-users), or a metric with a larger cut-off",)


def _pilot_notes(shape: _PilotShape | _DefaultShape | PopularityWorld, spec: MetricSpec, n_max: int) -> tuple[str, ...]:
    """Why a pilot may mislead the forecast (``Plan.notes``): its top is coarser than :func:`pilot_resolution`."""
    need = pilot_resolution(spec)
    have = shape.resolution if isinstance(shape, _PilotShape) else math.nan  # the default family has no pilot
    if need is None or not math.isfinite(have) or have <= need:
        return ()
    better = pilot_design(n_max, spec)
    design = (f"m = {better.n_samples}" if better.adaptive_max is None
              else f"adaptive {better.n_samples}->{better.adaptive_max}")
    return (f"the pilot resolves the top only to b = {have:.1f} exact ranks per sampled rank (coarser than "
            f"{need:g} for {spec}): the forecasts rest on the fit's guess of how the top bin splits, and for small "
            f"metrics they can be several times off; run the pilot as {design} "
            f"(planner.pilot_design({n_max}, '{spec}')) and plan again",)


# ---------------------------------------------------------------------------------------------------- plan
@dataclass(frozen=True)
class PlanExecution:
    """How :func:`plan` spends its own CPU time: which shortcuts it takes and on how many threads. The forecasts
    of the designs that matter, and so the recommendation, are the same whatever these are (screening aside, which
    settles far designs from their first replicates); checked at construction.

    Attributes:
        screen: run each design's first :data:`SCREEN_REPEATS` replicates, and stop there when every one of them
            misses the target or their relative RMSE exceeds :data:`SCREEN_FACTOR` x the target
            (``DesignForecast.screened``; the table says so): the designs far from the target (fixed m with an
            unresolved top, typically) cost a quarter of their fits. False: every design runs the plan's
            ``repeats`` replicates (as for checking forecasts against simulation).
        forecast_all: forecast every design. False (the default): designs start cheapest first (in scored pairs
            per user), and a design that scores more pairs than one already found to meet the target is not
            forecast (``DesignForecast.pruned``: it cannot be the pick); the recommendation and every forecast of a
            design up to the pick's cost are those of ``forecast_all=True``, bit for bit, and the designs costlier
            than the pick are reported as pruned whether or not they ran (so the table is the same whatever the
            threads). True: every design's error is forecast (tables for comparison, checks against simulation).
        workers: threads that forecast designs side by side (each design on one thread; the same plan, bit for bit,
            whatever the number). None: :data:`DEFAULT_WORKERS` (2), at most the CPUs this process may use and one
            per design (one where threadpoolctl, which holds BLAS to one thread per design, is not installed); 1:
            one after the other.
        progress: a bar over the estimator fits on stderr (True, False; None: when stderr is a terminal).
    """

    screen: bool = True
    forecast_all: bool = False
    workers: int | None = None
    progress: bool | None = None

    def __post_init__(self) -> None:
        if self.workers is not None:
            object.__setattr__(self, "workers", check_int(self.workers, "workers", minimum=1))
        if self.progress is not None:
            object.__setattr__(self, "progress", check_bool(self.progress, "progress"))
        object.__setattr__(self, "screen", check_bool(self.screen, "screen"))
        object.__setattr__(self, "forecast_all", check_bool(self.forecast_all, "forecast_all"))


@contextlib.contextmanager
def _one_thread() -> Iterator[None]:
    """Run on one torch thread (and one BLAS thread where threadpoolctl is installed), restored afterwards.

    The plan runs hundreds of small fits; on a shared 2-core machine their threads oversubscribe the cores and
    spin (measured: 3 s on one thread, 50-60 s on the default two while another process was busy)."""
    with one_torch_thread(), one_blas_thread():  # without threadpoolctl BLAS keeps its threads
        yield


@dataclass(frozen=True)
class _Settings:
    """A plan's inputs, checked once (:func:`_check_settings`; a popularity pilot's world then replaces the users'
    candidate counts, :func:`_choose_shape`)."""

    spec: MetricSpec
    method: registry.Method
    n_u: np.ndarray  # (n_users,) int64: each simulated user's candidates n
    n_keep: int | np.ndarray  # Plan.n_items
    n_users: int
    target: float
    repeats: int
    seed: int
    execution: PlanExecution
    seconds_per_pair: float | None = None
    seconds_per_pair_source: str | None = None
    target_halfwidth: float | None = None  # None: settled from full ranking's interval (:func:`_interval_target`)

    @property
    def n_min(self) -> int:
        return int(self.n_u.min())


def _check_k(spec: MetricSpec, n_min: int, where: str) -> None:
    if spec.k is not None and spec.k > n_min:
        raise ValueError(f"metric: cut-off K = {spec.k} is larger than {where}")


def _check_settings(n_items: Any, n_users: Any, metric: str | MetricSpec, target: Any, method: Any, repeats: Any,
                    seed: Any, execution: Any, target_halfwidth: Any = None) -> _Settings:
    """:class:`_Settings` of :func:`plan`'s arguments (a ValueError naming the first bad one)."""
    n_users = check_int(n_users, "n_users", minimum=1, maximum=MAX_ELEMENTS)  # per-user arrays (memory rule)
    try:
        scalar = np.ndim(n_items) == 0
    except ValueError:  # a ragged list (numpy cannot shape it): check_sizes names it
        scalar = False
    if scalar:
        n_scalar = check_size(n_items, "n_items", 2)
        n_u = np.full(n_users, n_scalar, dtype=np.int64)
        n_keep: int | np.ndarray = n_scalar
    else:
        # whole numbers >= 2 (no str, bool, NaN): the one size check, per user
        sizes = check_sizes(n_items, "n_items", 2)
        assert isinstance(sizes, torch.Tensor)  # per-user counts (not a scalar): a tensor
        n_u = sizes.detach().cpu().numpy().reshape(-1).astype(np.int64)
        if len(n_u) != n_users:
            raise ValueError(f"n_items: {len(n_u)} per-user counts for n_users = {n_users}")
        n_keep = n_u.copy()
    target = check_positive_float(target, "target_rel_error")  # not "0.05", not True
    if target_halfwidth is not None:
        target_halfwidth = check_positive_float(target_halfwidth, "target_rel_halfwidth")
    repeats = check_int(repeats, "repeats", minimum=2)
    check_elements(repeats * n_users, "repeats", f"the simulated exact ranks (repeats x n_users = {repeats} x {n_users})")
    spec = parse_metric(metric)
    method_obj = registry.as_method(method)  # an unknown method: the registry's ValueError naming ``method``
    _check_k(spec, int(n_u.min()), f"the catalogue (n_items = {int(n_u.min())})")
    seed = check_int(seed, "seed", minimum=0)
    if not isinstance(execution, PlanExecution):
        raise ValueError(f"execution: expected a planner.PlanExecution (screen, forecast_all, workers), "
                         f"got {execution!r}")
    return _Settings(spec, method_obj, n_u, n_keep, n_users, target, repeats, seed, execution,
                     target_halfwidth=target_halfwidth)


def _choose_shape(pilot: Any, n_items: Any, seconds_per_pair: Any,
                  s: _Settings) -> tuple[_DefaultShape | _PilotShape | PopularityWorld, _Settings]:
    """The shape the plan draws exact ranks from (a popularity pilot's world, a pilot's fit, or the default family)
    and the settings it settles: a world's users' candidate counts, the seconds per scored pair."""
    cost = None
    shape: _DefaultShape | _PilotShape | PopularityWorld
    if isinstance(pilot, SampledRanks) and pilot.design is not None and pilot.design.law == "popularity":
        shape, n_u, n_keep = _popularity_pilot(pilot, n_items, s.n_users, s.seed)
        _check_k(s.spec, int(n_u.min()), f"a pilot user's candidates ({int(n_u.min())})")
        s = dataclasses.replace(s, n_u=n_u, n_keep=n_keep)
        cost = pilot.cost
    elif pilot is not None:
        shape = _pilot_shape(*_unpack_pilot(pilot), spec=s.spec)
        cost = pilot.cost
    else:
        shape = _DefaultShape()
    spp, source = _seconds_per_pair(seconds_per_pair, cost)
    return shape, dataclasses.replace(s, seconds_per_pair=spp, seconds_per_pair_source=source)


def _candidate_designs(designs: Any, s: _Settings, world: PopularityWorld | None) -> list[SamplingDesign]:
    """The designs to forecast, checked (:func:`_check_design`): ``designs``, or :func:`default_designs` of the
    smallest n (with a popularity world: the pilot's own law at the default fixed m first)."""
    n_min, method = s.n_min, s.method.name
    if designs is None:  # the defaults: a refusal is of the caller's method or catalogue, never of ``designs``
        out = default_designs(n_min, method, s.spec)
        if world is not None:  # the pilot's own law at the default fixed m, before the uniform grid
            own = world.pilot_design.popularity
            try:
                out = [_check_design(SamplingDesign(m, popularity=own), n_min, method, world)
                       for m in DEFAULT_FIXED_M if m < n_min - 1] + out
            except ValueError as exc:
                raise ValueError(renamed(str(exc), {"designs": "method"}) + " (the default designs of a popularity "
                                 "pilot draw by its law)") from None
        if not out:
            raise ValueError(f"n_items: no default design below full ranking for n_items = {n_min} with method "
                             f"{method!r} (fixed m in {DEFAULT_FIXED_M} need m < n - 1); pass designs, or rank all "
                             "items")
    else:
        if isinstance(designs, (SamplingDesign, str, bytes, dict)) or not isinstance(designs, Iterable):
            raise ArgumentTypeError(f"designs: expected a list of SamplingDesigns ([SamplingDesign(100), "
                                    f"SamplingDesign(100, adaptive_max=3200), ...]) or None, got {designs!r}")
        out = [_check_design(d, n_min, method, world) for d in designs]
    if not out:
        raise ValueError(f"designs: no candidate design below full ranking for n_items = {n_min}")
    return out


def _check_workers(workers: Any, n_designs: int) -> int:
    """``PlanExecution.workers``: None -> :data:`DEFAULT_WORKERS` threads, at most the CPUs this process may run on
    and one per design (1 without threadpoolctl: BLAS would then keep its own threads in every design's thread,
    workers x cores threads on a many-core host); else an int >= 1."""
    if workers is None:
        try:
            import threadpoolctl  # noqa: F401  (limits BLAS to one thread per design: _one_thread)
        except ImportError:
            return 1
        try:
            cpus = len(os.sched_getaffinity(0))
        except AttributeError:  # not on Linux
            cpus = os.cpu_count() or 1
        return max(1, min(cpus, n_designs, DEFAULT_WORKERS))
    return min(check_int(workers, "workers", minimum=1), max(1, n_designs))


@dataclass(frozen=True)
class _Draws:
    """The exact ranks every design is forecast on (common random numbers) and their metric."""

    exact_np: np.ndarray  # (repeats, n_users) int64
    exact: torch.Tensor  # the same, as a tensor
    n_t: torch.Tensor  # (n_users,) int64 candidates n
    truths: np.ndarray  # (repeats,) each set's exact metric
    truth: float  # their mean: the shape's truth T
    n_mean: float  # mean n: full ranking's pairs per user
    full_width: float = math.nan  # full ranking's 95% interval width relative to the value (Plan.full_rel_width)


def _draw_exact(shape: _DefaultShape | _PilotShape | PopularityWorld, s: _Settings) -> _Draws:
    """``repeats`` sets of ``n_users`` exact ranks from the shape, on the plan's seed."""
    from .metrics import metric_values

    rng = np.random.default_rng(s.seed)
    exact_np = shape.draw(s.n_u, s.repeats, rng)  # (repeats, n_users), shared by every design
    exact, n_t = torch.from_numpy(exact_np), torch.from_numpy(s.n_u)
    values = metric_values(s.spec, exact, n_t).double()
    truths = values.mean(dim=1).numpy()  # each set's exact metric
    # full ranking's own interval, value +- z sd / sqrt(U): the users' spread
    sd = values.std(dim=1, correction=1).numpy() if s.n_users > 1 else np.full(s.repeats, math.inf)
    with np.errstate(divide="ignore", invalid="ignore"):  # a set whose metric is 0: no relative width holds it
        full = np.where(truths != 0, 2.0 * _Z95 * sd / math.sqrt(s.n_users) / np.abs(truths), math.inf)
    return _Draws(exact_np, exact, n_t, truths, float(truths.mean()), float(s.n_u.mean()), float(np.median(full)))


def _interval_target(s: _Settings, draws: _Draws) -> float:
    """The plan's interval target (``target_rel_halfwidth``): as given, else the half-width of an unbiased design
    whose sampling error is the point target on top of full ranking's interval, sqrt(h_full^2 + (z target)^2)
    (h_full: half of ``Plan.full_rel_width``; z = 1.96): the interval a design meeting the point target should
    show, so a design whose interval is wider than its point error explains (an unresolved top, an identified
    interval, a twin gap) misses it."""
    if s.target_halfwidth is not None:
        return s.target_halfwidth
    return _default_halfwidth(draws.full_width, s.target)


def _default_halfwidth(full_width: float, target: float) -> float:
    """The default interval target at the point target ``target``: sqrt(h_full^2 + (z target)^2), h_full half of
    full ranking's relative width ``full_width`` (z target alone where that is not finite)."""
    half = full_width / 2.0
    return math.hypot(half, _Z95 * target) if math.isfinite(half) else _Z95 * target


def _design_order_key(design: SamplingDesign) -> tuple[bool, int]:
    """Largest designs first (fixed m by m, then adaptive by cap): :func:`_map_designs`' order without pruning."""
    return design.adaptive_max is None, design.n_samples if design.adaptive_max is None else design.adaptive_max


def _map_designs(forecast: Callable[[int], DesignForecast], designs: Sequence[SamplingDesign],
                 workers: int, order: Sequence[int] | None = None) -> list[DesignForecast]:
    """``forecast(d)`` for every design, returned in design order, started in ``order`` on ``workers`` threads.

    The designs are independent (each its own generator over the shared exact ranks), so the forecasts are the
    same, bit for bit, whatever the threads and their order. Threads, not processes: the fits spend most of their
    time in numpy and scipy.sparse kernels that release the GIL (2 threads on 2 cores: 1.5x on the scorer
    benchmark's plan), share the prepared caches, and fork no torch. ``order`` None: the largest designs start
    first (:func:`_design_order_key`) so that a long fit does not start last (pruning plans pass the cheapest first
    instead). Each task runs in a copy of the caller's context (context variables hold). A design that raises: the
    designs not yet started are cancelled, the running ones finish, and the first failure in design order among
    the designs that ran is raised."""
    if workers <= 1 or len(designs) <= 1:
        done = {d: forecast(d) for d in (range(len(designs)) if order is None else order)}
        return [done[d] for d in range(len(designs))]
    if order is None:
        order = sorted(range(len(designs)), key=lambda d: _design_order_key(designs[d]), reverse=True)
    with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="reco-sampled-plan") as pool:
        futures = {d: pool.submit(contextvars.copy_context().run, forecast, d) for d in order}
        try:
            wait(futures.values(), return_when=FIRST_EXCEPTION)
        except BaseException:  # interrupted while waiting: no design not yet started starts
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        if any(f.done() and not f.cancelled() and f.exception() is not None for f in futures.values()):
            pool.shutdown(wait=True, cancel_futures=True)  # the designs not yet started never start
            failed = [d for d in range(len(designs))
                      if not futures[d].cancelled() and futures[d].exception() is not None]
            error = futures[failed[0]].exception()
            assert error is not None  # a failed design's exception
            raise error
        return [futures[d].result() for d in range(len(designs))]


def _pruned_forecast(f: DesignForecast) -> DesignForecast:
    """A design not forecast (``DesignForecast.pruned``): its cost fields kept, NaN errors, not meeting the target
    (the same object whether the design was stopped early or its forecast is masked afterwards)."""
    return dataclasses.replace(f, rel_bias=math.nan, rel_sd=math.nan, rel_error=math.nan, meets_target=False,
                               rel_error_se=math.nan, repeats=0, screened=False, pruned=True, rel_width=math.nan)


def _cheapest_first(designs: Sequence[SamplingDesign], exact: torch.Tensor, n_t: torch.Tensor) -> list[int]:
    """The designs' indices by expected scored pairs per user, cheapest first: fixed m costs 1 + m; an adaptive
    design 1 + E[M_final] (+ (n - 1) P(first at the cap) with exact completion) over the forecasts' exact ranks, in
    closed form (:func:`_adaptive_law.expected_samples`). An order for pruning only: which designs are pruned is settled
    by their forecasts' own costs."""
    n = n_t.double()
    p = ((exact.double() - 1.0) / (n - 1.0).clamp(min=1.0)).numpy()  # (repeats, users)
    cost = []
    for design in designs:
        adaptive, share = design.adaptive, _share_pairs(design, n_t)
        if adaptive is None:
            cost.append(1.0 + design.n_samples + share)
            continue
        mean, first = expected_samples(p, adaptive)
        extra = float((first * (n - 1.0).numpy()).mean()) if design.exact_at_cap else 0.0
        cost.append(1.0 + float(mean.mean()) + extra + share)
    return sorted(range(len(designs)), key=lambda d: (cost[d], d))


def _screens(err: np.ndarray, tolerance: float) -> bool:
    """The screening rules on the first replicates' errors (estimate - exact, metric units) against the target's
    absolute tolerance: every one misses it, or their RMSE exceeds :data:`SCREEN_FACTOR` x it."""
    return bool(np.all(np.abs(err) > tolerance)) or bool(np.sqrt(np.mean(err**2)) > SCREEN_FACTOR * tolerance)


# ------------------------------------------------------------------------------------- one design's forecast
@dataclass(frozen=True)
class _Simulation:
    """One design's sampled ranks over every replicate (``repeats`` x ``n_users``) and the pairs they cost."""

    sampled: torch.Tensor  # sampled ranks (popularity designs: the exact ranks, drawn per replicate later)
    sizes: torch.Tensor | None  # adaptive: each positive's final m
    done: torch.Tensor | None  # exact_at_cap: the exact ranks of the positives still first at the cap, 0 elsewhere
    mean_samples: float
    completion_pairs: float
    pairs_se: float
    share_pairs: float = 0.0  # an exact share: its expected pairs per user (:func:`_share_pairs`)

    @property
    def pairs(self) -> float:
        return 1.0 + self.mean_samples + self.completion_pairs + self.share_pairs


def _simulate(design: SamplingDesign, draws: _Draws, gen: torch.Generator) -> _Simulation:
    """The design's draws from the shared exact ranks (fixed m: :func:`~reco_sampled_plugin.simulate.
    simulate_sampled_ranks`; adaptive: :func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks_from_exact`,
    the same draws with or without completion, which draws nothing) and their cost in pairs per user."""
    from .adaptive import adaptive_sampled_ranks_from_exact
    from .simulate import simulate_sampled_ranks

    m, exact, n_t = design.n_samples, draws.exact, draws.n_t
    done = sizes = None
    if design.popularity is not None:  # simulated in the replicates (each a popularity draw of the world)
        sampled = exact
    elif design.adaptive_max is None:
        sampled = simulate_sampled_ranks(exact, n_t, m, design.law, gen)
    else:
        res = adaptive_sampled_ranks_from_exact(exact, n_t, design, generator=gen)
        sampled, sizes, done = res.ranks, res.n_samples, res.exact_ranks
    mean_samples = float(m) if sizes is None else float(sizes.double().mean())
    # completion: each positive still first at the cap scores its n - 1 irrelevant candidates
    extra = None if done is None else (done > 0).double() * (n_t.double() - 1.0)
    completion_pairs = 0.0 if extra is None else float(extra.mean())
    # the pairs' Monte Carlo se: the spread of each simulated positive's pairs over repeats x n_users
    per = None if sizes is None else sizes.double() + (0.0 if extra is None else extra)
    pairs_se = 0.0 if per is None else float(per.std() / math.sqrt(per.numel()))
    return _Simulation(sampled, sizes, done, mean_samples, completion_pairs, pairs_se, _share_pairs(design, n_t))


def _share_pairs(design: SamplingDesign, n_t: torch.Tensor) -> float:
    """Expected pairs per user of ``design``'s exact share: a chosen positive's row scores its n - 1 irrelevant
    candidates (``scorer_ranks.complete_from_scorer``), and the mean inclusion probability is the share (uniform:
    each pi; active: pi's mean by construction, ``_design_based.inclusion_probabilities``), so share x mean(n - 1)
    (exact for a uniform share, for an active one where pi does not follow n); 0 without a share."""
    if design.exact_share is None:
        return 0.0
    return design.exact_share.share * float((n_t.double() - 1.0).mean())


def _design_method(design: SamplingDesign, sim: _Simulation, s: _Settings, n_t: torch.Tensor) -> registry.Method:
    """The estimator run on the design: the plan's method, ``auto`` resolved as estimate() resolves it (on the
    first replicate), with the options given of it that the run takes; methods that fit a distribution run with
    ``n_bootstrap=0`` (the slow bootstrap skipped) and ``trace=False``."""
    from ._rank_hist import as_histogram
    from ._auto import auto_method

    run = s.method.name
    if design.exact_share is not None:  # auto runs diff on a sample with an exact share (_check_share_design)
        run = "diff"
    elif registry.get(run).family == "auto":
        if design.popularity is not None:
            run = registry.popularity_auto(s.spec, design)
        else:
            first = as_histogram(sim.sampled[0], n_t, design.n_samples if sim.sizes is None else sim.sizes[0])
            run = auto_method(s.spec, first, design.adaptive)[0]
    run_cls = registry.method_class(run)
    takes = run_cls.entry.option_names + registry.COMMON_OPTIONS
    opts: dict[str, Any] = {k: v for k, v in s.method.given().items() if k in takes}
    if run_cls.entry.fits_distribution:  # the replicates' spread is the error: no bootstrap, no per-fit trace
        opts["n_bootstrap"] = 0
        if "trace" in takes:
            opts["trace"] = False
    return run_cls(**opts)


def _plain_value(value: Any) -> bool:
    """Whether ``value`` is equal to another only by its content and cannot change in place: None, numbers,
    strings, and tuples or frozen dataclasses (a method object, ``TopShape``) of such values."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, tuple):
        return all(_plain_value(v) for v in value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type) and getattr(value, "__dataclass_params__").frozen:
        return all(_plain_value(getattr(value, f.name)) for f in dataclasses.fields(value))
    return False


class _Replicates:
    """A design's estimates, replicate by replicate (:meth:`fill`), against the shared exact ranks: a popularity
    draw of the world each; or a rank-distribution estimator's replicates fitted together (one likelihood, one
    batched solve; ``exact_at_cap``: one histogram each); or one estimator run each (vectorised over users)."""

    def __init__(self, design: SamplingDesign, sim: _Simulation, run: registry.Method, s: _Settings,
                 shape: _DefaultShape | _PilotShape | PopularityWorld, draws: _Draws, gen: torch.Generator,
                 tick: Callable[[int], None]) -> None:
        self.design, self.sim, self.run, self.s = design, sim, run, s
        self.shape, self.draws, self.gen, self.tick = shape, draws, gen, tick
        self.est = np.empty(s.repeats)
        self.width = np.full(s.repeats, math.nan)  # popularity designs: each replicate's 95% interval width
        self.has_width = np.zeros(s.repeats, dtype=bool)  # the widths estimated (:meth:`run_record`)
        entry = registry.get(run.name)
        # a rank-distribution estimator's value is its fit's (the population's or the users'), as estimate() gives it
        self.batched = entry.family == "rank_distribution"
        self.fit_target: str = entry.fitter_object().target if self.batched else "population"
        self._joint: Any = None  # the design's repeats prepared once (first use): rank_distribution.ReplicateFits

    def fill(self, js: range) -> None:
        """Fill ``est[j]`` (and ``width[j]``) for j in ``js``."""
        if self.design.exact_share is not None:
            self._shares(js)
        elif self.design.popularity is not None:
            self._popularity(js)
        elif self.batched and self.sim.done is None and _JOINT_FITS and self.run.max_rel_n_spread is None:
            # every repeat on one likelihood (ReplicateFits pools no grid of n: max_rel_n_spread takes the next path)
            self._joint_fits(js)
        elif self.batched:  # the repeats' fits share one likelihood when their pooled groups agree
            self._histogram_fits(js)
        else:
            self._runs(js)

    def run_record(self, used: int) -> _DesignRun:
        """What the forecast read: the first ``used`` replicates' estimates and the widths estimated (copies)."""
        return _DesignRun(self.est[:used].copy(), self.width.copy(), self.has_width.copy())

    def _sizes(self, j: int | None = None) -> Any:
        m, sizes = self.design.n_samples, self.sim.sizes
        return m if sizes is None else (sizes if j is None else sizes[j])

    def widths(self, js: range) -> None:
        """Fill ``width[j]`` for j in ``js`` with the 95% interval the user will read of replicate j's draws: their
        SampledRanks (the design's own, completion included) through ``estimate(metric, sampled, method)`` with the
        plan's method as given (``auto`` chooses per draw; bootstrap, twin gaps and identified intervals as at any
        entry point)."""
        from .estimators import estimate

        for j in js:
            done = None if self.sim.done is None else self.sim.done[j]
            key = self._width_key(j, done)
            kept = None
            if key is not None:
                with _WIDTHS_LOCK:
                    kept = _WIDTHS.get(key)
                    if kept is not None:
                        _WIDTHS.move_to_end(key)
            if kept is None:  # estimated outside the lock (seconds); two threads may both estimate one, alike
                drawn = SampledRanks.from_arrays(self.sim.sampled[j], self.draws.n_t, self._sizes(j), self.design,
                                                 exact_ranks=done)
                lo, hi = estimate(self.s.spec, drawn, self.s.method).interval(0.95)
                kept = hi - lo
                if key is not None:
                    with _WIDTHS_LOCK:
                        _WIDTHS[key] = kept
                        while len(_WIDTHS) > _WIDTHS_MAX:
                            _WIDTHS.popitem(last=False)
            self.width[j] = kept
            self.has_width[j] = True

    def _width_key(self, j: int, done: torch.Tensor | None) -> tuple | None:
        """:data:`_WIDTHS`' key of replicate ``j``'s width, or None (not kept) where the method object holds a value
        by identity (:func:`_plain_value`). Uniform designs only (the popularity and share designs' replicates hold their own widths)."""
        d = self.design
        assert d.popularity is None and d.exact_share is None  # _rel_width's rule
        h = hashlib.blake2b(digest_size=20)
        for part in (self.sim.sampled[j], self.draws.n_t, self._sizes(j), done):
            if part is None:
                h.update(b"none;")
                continue
            arr = np.ascontiguousarray(torch.as_tensor(part).detach().cpu().numpy())
            h.update(f"{arr.dtype.str}{arr.shape};".encode())
            h.update(arr.tobytes())
        if not _plain_value(self.s.method):  # an option held by identity (a tensor, a callable): not kept
            return None
        # the registry as estimate() reads it: auto's choices and every entry (a method replaced by register(...,
        # replace=True) changes the key; entries and choices are values: names, references and option tables)
        table = (registry.entries(), tuple(sorted((k, v) for k, v in registry.AUTO_CHOICES.items())))
        key = (self.s.spec, self.s.method, table, d.n_samples, d.replacement, d.adaptive_max, d.exact_at_cap,
               self.s.execution.workers, h.hexdigest())
        try:
            hash(key)
        except TypeError:
            return None
        return key

    def _popularity(self, js: range) -> None:
        from .estimators import estimate

        assert isinstance(self.shape, PopularityWorld)
        for j in js:  # a popularity draw of the world per replicate, estimated as a real one
            drawn = self.shape.sampled(self.draws.exact_np[j], self.design.popularity, self.design.n_samples,
                                       _world_seed(self.s.seed, j), self.gen)
            e = estimate(self.s.spec, drawn, self.run)
            lo, hi = e.interval(0.95)
            self.est[j], self.width[j], self.has_width[j] = e.value, hi - lo, True
            self.tick(1)

    def _shares(self, js: range) -> None:
        """A design with an exact share: per replicate, the share drawn as the loop draws it (pi from
        ``_design_based.share_inclusion`` of the replicate's sampled ranks: an active share's model fit, phase 2;
        each positive chosen when a uniform < pi), its exact ranks the replicate's own, and the estimate and 95%
        interval the user will read (``estimate(metric, sampled, method)``: ``diff``). The estimate's model fit and
        predictions of the sampled ranks are pi's, the replicates' likelihoods on the same groups one
        (``_design_based.reusing_fits``: the same bits, computed once)."""
        from ._design_based import reusing_fits, share_inclusion
        from ._share import with_share_arrays
        from .estimators import estimate

        share = self.design.exact_share
        assert share is not None  # fill's test
        with reusing_fits():
            for j in js:
                drawn = SampledRanks.from_arrays(self.sim.sampled[j], self.draws.n_t, self._sizes(j), self.design)
                pi = share_inclusion(drawn, share)
                chosen = torch.rand(len(pi), generator=self.gen, dtype=torch.float64) < torch.from_numpy(pi)
                exact = torch.where(chosen, self.draws.exact[j], torch.zeros_like(self.draws.exact[j]))
                e = estimate(self.s.spec, with_share_arrays(drawn, exact, pi), self.s.method)
                lo, hi = e.interval(0.95)
                self.est[j], self.width[j], self.has_width[j] = e.value, hi - lo, True
                self.tick(1)

    def _joint_fits(self, js: range) -> None:
        from .rank_distribution import ReplicateFits

        if self._joint is None:
            self._joint = ReplicateFits(self.sim.sampled, self.draws.n_t, self._sizes(), self.run,
                                        sampling=self.design.law)
        for j, dist in zip(js, self._joint.fit(js)):
            self.est[j] = dist.values([self.s.spec], target=self.fit_target)[0]  # the spread is over replicates
        self.tick(len(js))

    def _histogram_fits(self, js: range) -> None:
        from ._rank_hist import as_histogram, sampled_rank_histogram
        from .rank_distribution import fit_rank_distribution

        sampled, n_t, done = self.sim.sampled, self.draws.n_t, self.sim.done
        hists = [as_histogram(sampled[j], n_t, self._sizes(j)) if done is None
                 else sampled_rank_histogram(sampled[j], n_t, self._sizes(j), exact_ranks=done[j]) for j in js]
        for j, dist in zip(js, fit_rank_distribution(hists, self.run, sampling=self.design.law)):
            self.est[j] = dist.values([self.s.spec], target=self.fit_target)[0]  # the spread is over replicates
        self.tick(len(js))

    def _runs(self, js: range) -> None:
        from .estimators import estimate

        m, cap = self.design.n_samples, self.design.adaptive_max
        # the estimator reads the sampled ranks: an adaptive design's completion changes no r~
        drawn_as = (SamplingDesign(m, replacement=self.design.replacement) if cap is None
                    else SamplingDesign(m, adaptive_max=cap, adaptive_top=self.design.adaptive_top))
        for j in js:
            drawn = SampledRanks.from_arrays(self.sim.sampled[j], self.draws.n_t, self._sizes(j), drawn_as)
            self.est[j] = estimate(self.s.spec, drawn, self.run).value
            self.tick(1)


def _error_fields(err: np.ndarray, truth: float) -> dict[str, Any]:
    """rel_bias, rel_sd, rel_error and rel_error_se of the errors ``err`` (estimate - each set's exact metric)
    relative to the truth T (infinite relative errors where T = 0 and an error is not)."""
    bias = float(err.mean())
    sd = float(err.std(ddof=1))
    mse = bias**2 + sd**2
    # delta method on mean(e^2): se(rmse) = sd(e^2) / sqrt(R) / (2 rmse)
    se_rmse = float(np.std(err**2, ddof=1) / math.sqrt(len(err)) / (2.0 * math.sqrt(mse))) if mse > 0 else 0.0
    scale = abs(truth)
    rel = (lambda v: v / scale) if scale > 0 else (lambda v: math.inf if v != 0 else 0.0)
    return {"rel_bias": rel(bias), "rel_sd": rel(sd), "rel_error": rel(math.sqrt(mse)), "rel_error_se": rel(se_rmse)}


class _Pruning:
    """The pairs per user of the cheapest design found so far to meet the target below full ranking (pruning:
    ``forecast_all=False``): a design that scores more cannot be the pick. Shared by the designs' threads."""

    def __init__(self) -> None:
        self.limit = math.inf
        self._lock = threading.Lock()

    def excludes(self, pairs: float) -> bool:
        return pairs > self.limit

    def found(self, pairs: float) -> None:
        with self._lock:
            self.limit = min(self.limit, pairs)


@dataclass(frozen=True)
class _DesignRun:
    """What one design's forecast read, for :meth:`Plan.at_target`: the estimates of the replicates it ran (the
    first ``len(est)``, in order) and the 95% interval widths it estimated (``has_width``; NaN elsewhere)."""

    est: np.ndarray  # (replicates run,) each replicate's estimate
    width: np.ndarray  # (repeats,) each replicate's interval width where estimated
    has_width: np.ndarray  # (repeats,) bool: the width was estimated


@dataclass(frozen=True)
class _PlanReplicates:
    """A plan's replicates, kept on the :class:`Plan` (``Plan._replicates``) for :meth:`Plan.at_target`: one
    :class:`_DesignRun` per design (None: pruned before any replicate ran), each set's exact metric, full ranking's
    pairs per user, and the execution's settings that decide which replicates a forecast reads."""

    runs: tuple[_DesignRun | None, ...]
    truths: np.ndarray  # (repeats,) each set's exact metric
    n_mean: float  # full ranking's pairs per user (mean n)
    repeats: int
    screen: bool
    forecast_all: bool


@dataclass(frozen=True)
class _PlanRun:
    """What every design's forecast shares: the settings, the shape, its exact ranks, the progress bar's tick and
    the pruning limit."""

    s: _Settings
    shape: _DefaultShape | _PilotShape | PopularityWorld
    draws: _Draws
    tick: Callable[[int], None]
    pruning: _Pruning
    runs: list[_DesignRun | None]  # per design (its index), what its forecast read: :meth:`Plan.at_target`'s input


def _forecast_design(run: _PlanRun, d: int, design: SamplingDesign) -> DesignForecast:
    """Design ``d``'s Monte Carlo forecast: its own generator, the shared exact ranks, so independent of the order
    (and thread) in which the designs run. Screening: the first :data:`SCREEN_REPEATS` replicates, the rest only
    if they do not settle it; pruned (its cost alone) when a cheaper design meets the target already."""
    s, draws, repeats = run.s, run.draws, run.s.repeats
    gen = torch.Generator().manual_seed(s.seed * 1_000_003 + 7919 * (d + 1))
    sim = _simulate(design, draws, gen)
    method = _design_method(design, sim, s, draws.n_t)
    popular, power = design.popularity is not None, None
    if popular:  # a popularity pilot's world (_check_design's rule): the weights' power of the pilot's
        assert isinstance(run.shape, PopularityWorld)
        power = _popularity_power(design.popularity, run.shape.weights)
    costs: dict[str, Any] = dict(
        n_samples=design.n_samples, adaptive_max=design.adaptive_max, mean_samples=sim.mean_samples,
        resolution=(draws.n_mean - 1.0) / (design.cap + 1.0) + 1.0, replacement=design.replacement,
        pairs_se=sim.pairs_se, scoring_seconds=_scoring_seconds(sim.pairs, s.n_users, s.seconds_per_pair),
        exact_at_cap=design.exact_at_cap, completion_pairs=sim.completion_pairs, method=method.name,
        popularity_power=power, popularity=design.popularity, exact_share=design.exact_share,
        share_pairs=sim.share_pairs, adaptive_top=design.adaptive_top)
    pruned = _pruned_forecast(DesignForecast(rel_bias=math.nan, rel_sd=math.nan, rel_error=math.nan,
                                             meets_target=False, **costs))
    if run.pruning.excludes(sim.pairs):  # a cheaper design meets the target already: this one cannot be the pick
        run.tick(repeats)
        return pruned
    reps = _Replicates(design, sim, method, s, run.shape, draws, gen, run.tick)
    used = min(repeats, SCREEN_REPEATS) if s.execution.screen else repeats
    reps.fill(range(used))
    screened = used < repeats and draws.truth != 0 and _screens(reps.est[:used] - draws.truths[:used],
                                                                s.target * abs(draws.truth))
    if screened:  # the first replicates miss the target (all of them, or by 2.5x in RMSE): the rest not fitted
        run.tick(repeats - used)
    elif used < repeats:
        if run.pruning.excludes(sim.pairs):
            run.tick(repeats - used)
            run.runs[d] = reps.run_record(used)
            return pruned
        reps.fill(range(used, repeats))
        used = repeats
    errors = _error_fields(reps.est[:used] - draws.truths[:used], draws.truth)
    rel_width = _rel_width(reps, used) if errors["rel_error"] <= s.target else math.nan
    assert s.target_halfwidth is not None  # settled before the designs run (_plan)
    meets = bool(errors["rel_error"] <= s.target and rel_width / 2.0 <= s.target_halfwidth)
    if meets and sim.pairs < draws.n_mean and not s.execution.forecast_all:
        run.pruning.found(sim.pairs)  # designs costlier than this one need not be forecast
    run.runs[d] = reps.run_record(used)
    return DesignForecast(meets_target=meets, repeats=used, screened=screened, rel_width=rel_width, **errors, **costs)


def _width_count(f: DesignForecast | SamplingDesign, used: int) -> int:
    """How many first replicates a design's ``rel_width`` is the median of: :data:`WIDTH_REPEATS` (popularity and
    share designs: every one used, their replicates hold their own intervals)."""
    return min(used, WIDTH_REPEATS) if f.popularity is None and f.exact_share is None else used


def _median_rel_width(width: np.ndarray, truths: np.ndarray) -> float:
    """The median of the first ``len(truths)`` widths relative to those sets' exact metrics (inf for a set whose
    metric is 0: no relative width holds it; finite while fewer than half the sets are such)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(truths != 0, width[: len(truths)] / np.abs(truths), math.inf)
    return float(np.median(rel))


def _rel_width(reps: _Replicates, used: int) -> float:
    """The median over replicates of the 95% interval's width relative to each set's exact metric
    (``DesignForecast.rel_width``): the popularity replicates' own intervals, else the first :data:`WIDTH_REPEATS`
    replicates estimated as the user will (:meth:`_Replicates.widths`); a set whose metric is 0 counts as inf."""
    truths = reps.draws.truths[:used]
    k = _width_count(reps.design, used)
    if reps.design.popularity is None and reps.design.exact_share is None:  # the others' replicates hold theirs
        reps.widths(range(k))
    return _median_rel_width(reps.width, truths[:k])


def _forecast_designs(designs: Sequence[SamplingDesign], s: _Settings,
                      shape: _DefaultShape | _PilotShape | PopularityWorld, draws: _Draws,
                      runs: list[_DesignRun | None]) -> list[DesignForecast]:
    """Every design's forecast (in design order), ``workers`` at a time, with a progress bar over the fits;
    cheapest first when pruning (``forecast_all=False``). ``runs`` (one None per design) receives what each
    design's forecast read (:class:`_DesignRun`; None where it ran no replicate)."""
    from ._progress import progress_bar

    workers = _check_workers(s.execution.workers, len(designs))
    bar = progress_bar(total=len(designs) * s.repeats, desc=f"plan {s.spec}: {s.method.name} fits", enabled=s.execution.progress,
                       unit="fit")
    bar_lock = threading.Lock()  # designs may run on several threads

    def tick(k: int) -> None:
        with bar_lock:
            bar.update(k)

    run = _PlanRun(s, shape, draws, tick, _Pruning(), runs)
    order = None if s.execution.forecast_all else _cheapest_first(designs, draws.exact, draws.n_t)
    try:
        return _map_designs(lambda d: _forecast_design(run, d, designs[d]), designs, workers, order)
    finally:
        bar.close()


def _recommend(forecasts: list[DesignForecast], n_mean: float,
               forecast_all: bool) -> tuple[list[DesignForecast], DesignForecast | None]:
    """(the table's forecasts, the pick): the cheapest design in scored pairs (and so in predicted time: the same
    seconds per pair for every design) meeting the target below full ranking's n pairs per user, or None. Without
    ``forecast_all`` every design costlier than the pick is reported as pruned, whatever the threads ran."""
    ok = [f for f in forecasts if f.meets_target and f.pairs < n_mean]
    recommended = min(ok, key=lambda f: f.pairs) if ok else None
    if not forecast_all:
        limit = math.inf if recommended is None else recommended.pairs
        forecasts = [f if f.pairs <= limit else _pruned_forecast(f) for f in forecasts]
    return forecasts, recommended


def _forecast_at(f: DesignForecast, run: _DesignRun | None, kept: _PlanReplicates, truth: float, target: float,
                 halfwidth: float) -> DesignForecast | None:
    """Design ``f``'s forecast at another target from the replicates it ran (:func:`_forecast_design`'s rules on
    the same numbers: screening, the errors, the width where the point target is met, meeting both targets), or
    None where that forecast needs a replicate or a width the plan did not run."""
    if run is None:
        return None
    repeats, truths = kept.repeats, kept.truths
    used = min(repeats, SCREEN_REPEATS) if kept.screen else repeats
    screened = used < repeats and truth != 0 and _screens(run.est[:used] - truths[:used], target * abs(truth))
    if not screened:
        used = repeats
    if len(run.est) < used:  # screened (or pruned) at the plan's own target: the other replicates never ran
        return None
    errors = _error_fields(run.est[:used] - truths[:used], truth)
    rel_width = math.nan
    if errors["rel_error"] <= target:
        k = _width_count(f, used)
        if not run.has_width[:k].all():  # the point target missed at the plan's own target: no interval estimated
            return None
        rel_width = _median_rel_width(run.width, truths[:k])
    meets = bool(errors["rel_error"] <= target and rel_width / 2.0 <= halfwidth)
    return dataclasses.replace(f, meets_target=meets, repeats=used, screened=screened, rel_width=rel_width,
                               pruned=False, **errors)


def _at_target(p: Plan, target_rel_error: Any, target_rel_halfwidth: Any) -> Plan:
    """:meth:`Plan.at_target`: each design's forecast at the targets from the plan's replicates, then
    :func:`_recommend`; a ValueError where a design the pick depends on was not forecast far enough."""
    kept = p._replicates
    if kept is None:
        raise ValueError("at_target: this Plan holds no replicates (it was not returned by plan()); plan again at "
                         "the target")
    target = p.target if target_rel_error is None else check_positive_float(target_rel_error, "target_rel_error")
    halfwidth = (_default_halfwidth(p.full_rel_width, target) if target_rel_halfwidth is None
                 else check_positive_float(target_rel_halfwidth, "target_rel_halfwidth"))
    at = [_forecast_at(f, run, kept, p.truth, target, halfwidth) for f, run in zip(p.forecasts, kept.runs)]
    ok = [g for g in at if g is not None and g.meets_target and g.pairs < kept.n_mean]
    pick = min(ok, key=lambda g: g.pairs) if ok else None
    limit = math.inf if pick is None or kept.forecast_all else pick.pairs
    missing = [f.label for f, g in zip(p.forecasts, at) if g is None and f.pairs <= limit]
    if missing:
        raise ValueError(
            f"at_target: at a target of {target:.4g} (interval +-{halfwidth:.4g}) the forecast of "
            f"{', '.join(missing)} needs replicates or intervals this plan did not run (screened, pruned, or its "
            f"point target missed at {p.target:.4g}): plan again at that target, or re-pick from a plan made with "
            "PlanExecution(forecast_all=True) at the loosest target you consider")
    table = [g if g is not None else _pruned_forecast(f) for f, g in zip(p.forecasts, at)]
    forecasts, recommended = _recommend(table, kept.n_mean, kept.forecast_all)
    out = dataclasses.replace(p, target=target, target_halfwidth=halfwidth, forecasts=tuple(forecasts),
                              recommended=recommended)
    object.__setattr__(out, "_replicates", kept)
    return out


def plan(
    n_items: int | TensorLike,
    n_users: int,
    metric: str | MetricSpec,
    target_rel_error: float,
    *,
    pilot: SampledRanks | None = None,
    designs: Sequence[SamplingDesign] | None = None,
    method: str | registry.Method = registry.DEFAULT_ESTIMATOR,
    target_rel_halfwidth: float | None = None,
    repeats: int = 20,
    seed: int = 0,
    seconds_per_pair: float | None = None,
    execution: PlanExecution = PlanExecution(),
) -> Plan:
    """Forecast the accuracy and cost of sampled evaluation designs, and recommend the cheapest that meets a target:
    its estimate within ``target_rel_error`` of the metric (relative RMSE) and the 95% interval the user will read
    within +- ``target_rel_halfwidth`` of the value (median over draws).

    Args:
        n_items: catalogue size n (every user ranks n candidates), or per-user candidate counts (length n_users,
            e.g. the catalogue minus each user's training items). With a popularity pilot: the catalogue its weights
            cover (the simulated users are the pilot's positives, with their own candidate counts).
        n_users: users (one held-out positive each) in the evaluation.
        metric: e.g. ``"ndcg@10"``, ``"hit@10"``, ``"mrr"``.
        target_rel_error: the point target, the largest acceptable relative RMSE of the estimate (0.05: 5%).
        target_rel_halfwidth: the interval target, the largest acceptable median half-width of the 95% interval
            the user will read (``estimate(metric, sampled, method).interval(0.95)``, flags and all), relative to
            the value (0.1: the interval about value +- 10%; ``DesignForecast.rel_halfwidth``). None (default): the
            half-width an unbiased design meeting the point target shows on top of full ranking's own interval,
            sqrt(h_full^2 + (1.96 target_rel_error)^2) (h_full: half of ``Plan.full_rel_width``, the users'
            spread), so that a design whose interval is wider than its point error explains (an unresolved top, a
            reached cap) is not the pick. ``Plan.target_halfwidth`` is the one used.
        pilot: the :class:`~reco_sampled_plugin.ranking.SampledRanks` of a pilot draw, which give the shape of the
            rank distribution and carry their n, m and design (ranks from elsewhere: ``SampledRanks(ranks,
            n_candidates, design=SamplingDesign(m))``, adaptive ones with ``n_samples=`` each positive's final m);
            without it the default family :data:`DEFAULT_FAMILY` is used. From
            :func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer` they also carry the scorer's
            measured cost, and its seconds per pair time the plan unless ``seconds_per_pair`` is given. A popularity
            draw's SampledRanks (``SamplingDesign(m, popularity=w)``, with its class counts) make the plan's world
            ``pl_fit``'s fitted model of them (:mod:`~reco_sampled_plugin._popularity_world`: its users, tilt curves
            and rank priors; docs/popularity.md, "Planning a popularity design"): popularity designs are forecast by
            simulated popularity draws estimated as real ones, uniform designs from the same exact ranks.
        designs: candidate designs, :class:`~reco_sampled_plugin.design.SamplingDesign` objects (uniform draws
            with or without replacement, or adaptive; popularity draws with replacement with a popularity pilot,
            whose weights put every item in the pilot's popularity class, e.g. any positive
            power of the pilot's weights), with an exact share (uniform draws; ``method`` ``auto`` or ``diff``, which
            read it); default :func:`default_designs` of the smallest n (with a popularity pilot: its own law at the
            fixed m of :data:`DEFAULT_FIXED_M` first).
        method: the estimator to forecast: a registered name (``reco_sampled_plugin.registry.names()``) that
            supports the designs, or its options object (``registry.Gmod(df=8)``; fits run without bootstrap);
            default ``auto``.
        repeats: Monte Carlo replicates per design (each a fresh set of n_users exact ranks).
        seed: seeds every draw (the same seed gives the same plan).
        seconds_per_pair: the scorer's seconds per scored (user, item) pair (e.g. a scorer-loop run's
            ``cost.scorer_seconds / cost.pairs``): each design's and full ranking's predicted scoring time for the
            ``n_users`` users is pairs x n_users x seconds_per_pair (``DesignForecast.scoring_seconds``,
            ``Plan.full_scoring_seconds``). None: measured on a scorer-loop pilot when there is one, else no times.
        execution: how the plan spends its own CPU time (:class:`PlanExecution`): screening far designs after
            their first :data:`SCREEN_REPEATS` replicates (``screen``, default on), forecasting only the designs
            that can be the pick (``forecast_all``, default off), the threads (``workers``, default
            :data:`DEFAULT_WORKERS`) and a progress bar (``progress``); the recommendation is the same whatever
            they are (screening aside, which settles far designs from their first replicates).

    Returns:
        a :class:`Plan` (``print(plan(...).format())`` for a table).

    Raises:
        ValueError: non-positive sizes, a target <= 0, an unknown metric or method, a cut-off K above n, a design
            that is not a SamplingDesign or has m >= n - 1, a popularity design without a popularity pilot (or whose weights leave
            the pilot's classes, or drawn without replacement), a popularity pilot without class counts (a rank
            file's) or with an ``n_items`` other than its catalogue, a pilot that is not SampledRanks with a design,
            adaptive pilot sizes that do not fit the design, no candidate design, or a ``seconds_per_pair`` that is
            not a finite number > 0, or an ``execution`` that is not a PlanExecution.

    Each design's fits run on one torch (and BLAS) thread, restored afterwards (:func:`_one_thread`);
    ``execution.workers`` designs at a time.
    """
    with _one_thread():
        return _plan(n_items, n_users, metric, target_rel_error, pilot=pilot, designs=designs, method=method,
                     target_halfwidth=target_rel_halfwidth, repeats=repeats, seed=seed,
                     seconds_per_pair=seconds_per_pair, execution=execution)


def _plan(n_items: Any, n_users: Any, metric: str | MetricSpec, target_rel_error: Any, *, pilot: Any, designs: Any,
          method: Any, target_halfwidth: Any, repeats: Any, seed: Any, seconds_per_pair: Any, execution: Any) -> Plan:
    """:func:`plan`'s steps: the settings checked once, the shape, the candidate designs, the shared exact ranks,
    every design's forecast, the pick."""
    import time

    t_start = time.perf_counter()
    s = _check_settings(n_items, n_users, metric, target_rel_error, method, repeats, seed, execution,
                        target_halfwidth)
    shape, s = _choose_shape(pilot, n_items, seconds_per_pair, s)
    world = shape if isinstance(shape, PopularityWorld) else None
    designs = _candidate_designs(designs, s, world)
    draws = _draw_exact(shape, s)
    s = dataclasses.replace(s, target_halfwidth=_interval_target(s, draws))
    runs: list[_DesignRun | None] = [None] * len(designs)
    forecasts, recommended = _recommend(_forecast_designs(designs, s, shape, draws, runs), draws.n_mean,
                                        s.execution.forecast_all)
    logger.debug("plan %s: %d design(s) forecast with %d repeats in %.1f s; recommended: %s", s.spec, len(forecasts),
                 s.repeats, time.perf_counter() - t_start, "full ranking (no design meets the target)" if recommended
                 is None else f"m = {recommended.n_samples}, adaptive cap {recommended.adaptive_max}")
    result = Plan(
        metric=str(s.spec), n_items=s.n_keep, n_users=s.n_users, target=s.target, shape_source=shape.source,
        truth=draws.truth, forecasts=tuple(forecasts), recommended=recommended, method=s.method.name,
        repeats=s.repeats, seed=s.seed, seconds=time.perf_counter() - t_start, seconds_per_pair=s.seconds_per_pair,
        seconds_per_pair_source=s.seconds_per_pair_source,
        notes=(_pilot_notes(shape, s.spec, int(s.n_u.max())) if world is None else world.notes())
        + _zero_truth_note(draws.truth, s.spec, s.n_users, draws.truths),
        target_halfwidth=_interval_target(s, draws), full_rel_width=draws.full_width,
    )
    object.__setattr__(result, "_replicates", _PlanReplicates(tuple(runs), draws.truths.copy(), draws.n_mean,
                                                              s.repeats, s.execution.screen,
                                                              s.execution.forecast_all))
    return result
