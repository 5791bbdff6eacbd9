"""Framework-free pieces shared by the torchmetrics and Lightning adapters.

* :class:`RankingSettings`: the metric settings of both (metrics, design, estimators, seed, ties...), checked once
  when built.
* :class:`RankingBatch` / :class:`FactorBatch` / :class:`ScorerBatch`: what a step (or a user scoring function)
  hands to the adapters: scores, the factors they come from, or nothing to score (a scorer scores the draws).
  Their sampled ranks are keyed draws (``reco_sampled_plugin._keyed``): a pure function of (seed, instance id,
  positive item), the same whichever process, batch or position evaluates an instance.
* Histogram rows -> :class:`~reco_sampled_plugin.RankHistogram` (optionally pooling n).
* The labels estimators are reported under.

Nothing here imports torchmetrics or Lightning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import re
from dataclasses import KW_ONLY, dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterable, Mapping, NamedTuple, Sequence

import numpy as np
import torch

from reco_sampled_plugin import RankHistogram, registry
from reco_sampled_plugin._checks import check_dense
from reco_sampled_plugin._options import (check_bool, check_choice, check_count, check_metric_names, check_names,
                                          check_seed)
from reco_sampled_plugin.design import SamplingDesign, as_design
from reco_sampled_plugin.rank_distribution import pool_groups
from reco_sampled_plugin.ranking import DETERMINISTIC_TIES, prepare_index

if TYPE_CHECKING:
    from reco_sampled_plugin.design import AdaptiveDesign
    from reco_sampled_plugin._estimate import Estimate

__all__ = [
    "RankingSettings",
    "check_share_design",
    "RankingBatch",
    "FactorBatch",
    "ScorerBatch",
    "as_ranking_batch",
    "ADAPTER_TIES",
    "padded_inputs",
    "histogram_from_rows",
    "metric_key",
    "estimator_label",
    "estimator_methods",
]

# ties the adapters support: deterministic ones (``random`` would depend on the batch layout)
ADAPTER_TIES = DETERMINISTIC_TIES


@dataclass(frozen=True)
class RankingSettings:
    """The metric settings of the torchmetrics classes and the Lightning callback, checked once when built (a
    ValueError naming the option) and shared: ``SampledRankingMetrics.from_settings(s)``,
    ``ExactRankingMetrics.from_settings(s)``, ``RankingMetricsCallback(s)``.

    Args:
        metrics: metric names (``"ndcg@10"``, ``"recall@10"``, ``"hit@10"``, ``"mrr"``, ``"auc"``...); one string
            alone is one metric. Kept as given (a tuple); :attr:`metric_names` holds their canonical forms, the
            names results are keyed and logged under.
        n_samples: m sampled irrelevant items per relevant item (RecBole's ``uni100``: m = 100), or a
            :class:`~reco_sampled_plugin.design.SamplingDesign`: uniform draws (with or without replacement,
            adaptive: ``SamplingDesign(m, adaptive_max=cap)``) or popularity draws (``SamplingDesign(m,
            popularity=w)``, with or without replacement: without, only ``none`` estimates, as in the core); None:
            no sampled metrics. Kept as given; :attr:`design` is the
            SamplingDesign (an int m is ``SamplingDesign(m)``). ``SamplingDesign(m, adaptive_max=cap,
            exact_at_cap=True)`` also ranks the positives still first at the cap exactly (kept one row each: their
            n and exact rank R). A uniform exact share (``SamplingDesign(m, exact_share=ExactShare(s))``,
            popularity draws with replacement included; not ``choice="active"``, not popularity draws without
            replacement: :func:`check_share_design`; the Ray adapter and the core take an active share) also ranks
            the keyed share of the positives exactly; ``auto`` (and ``diff``) then give the design-based estimate
            (under a popularity design from ``pl_fit``'s predictions).
        estimators: the estimators run on the sampled ranks, each a registered name (``registry.names()``) or a
            method object with its options (``registry.Bv(gamma=0.2)``, ``Mes(n_bootstrap=8)``: checked when
            built), whose entry supports the design; ``"none"`` is the plain sampled metric. Each is reported under
            its label (:func:`estimator_label`: ``bv_gamma-0.2``); two with one label are refused. Default
            ``("none", registry.DEFAULT_ESTIMATOR)``. Kept as given; :attr:`methods` and :attr:`labels` beside.
            Not read without a design.
        exact: also compute exact (full-catalogue) metrics (the callback; ``ExactRankingMetrics`` is exact).
        seed: key of the negative draws (same seed, same instance id -> same negatives).
        ties: ``"pessimistic"`` (default), ``"optimistic"``, or ``"average"`` (exact metrics only: it would give
            fractional sampled ranks, so it is refused with a design).
        count_other_positives: exact metrics: False (default) ranks each relevant item among the irrelevant
            candidates only (the quantity sampled metrics estimate); True among all candidates, the other positives
            included.
        max_n_groups: at most this many distinct candidate counts n are handed to the estimators; beyond, n is
            pooled into count-quantile bins (count-weighted median n per bin), as the core's ``mle`` does. None:
            every distinct n gets its own table. Default 64.
        check_finite: True (default: every score), ``"positives"`` (only the relevant items' scores: a NaN
            irrelevant score then silently shifts ranks) or False (the cost is measured in
            :mod:`reco_sampled_plugin.adapters.torchmetrics`). Factor inputs are checked unless False.
    """

    metrics: str | Iterable[str] = ("ndcg@10", "recall@10")
    n_samples: int | SamplingDesign | None = 100
    estimators: str | registry.Method | Sequence[str | registry.Method] = ("none", registry.DEFAULT_ESTIMATOR)
    _: KW_ONLY
    exact: bool = True
    seed: int = 0
    ties: str = "pessimistic"
    count_other_positives: bool = False
    max_n_groups: int | None = 64
    check_finite: bool | str = True
    metric_names: tuple[str, ...] = dataclasses.field(init=False, repr=False, compare=False)
    design: SamplingDesign | None = dataclasses.field(init=False, repr=False, compare=False)
    methods: tuple = dataclasses.field(init=False, repr=False, compare=False)
    labels: tuple = dataclasses.field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        put = lambda name, value: object.__setattr__(self, name, value)  # noqa: E731 - frozen: set once, here
        names = check_names(self.metrics, "metrics")  # one name alone is one metric, not its letters
        put("metrics", names)
        put("metric_names", _metric_names(names))
        put("exact", check_bool(self.exact, "exact"))
        design = _sampled_design(self.n_samples)
        if not self.exact and design is None:
            raise ValueError("exact=False and n_samples=None: nothing to compute")
        put("design", design)
        methods: tuple = ()
        labels: tuple = ()
        if design is not None:
            estimators, methods, labels = estimator_methods(self.estimators)
            _check_supported(design, methods, labels)
            if not self.exact:  # with exact metrics beside, a metric no estimator takes is still reported (exact)
                _check_every_metric_estimated(self.metric_names, methods)
            put("estimators", estimators)
        put("methods", methods)
        put("labels", labels)
        put("seed", check_seed(self.seed, "seed"))
        put("ties", check_ties(self.ties))
        if self.ties == "average" and design is not None:
            raise ValueError("ties: 'average' gives fractional sampled ranks; sampled metrics take 'pessimistic' or "
                             "'optimistic' (exact metrics alone accept 'average': n_samples=None)")
        put("count_other_positives", check_bool(self.count_other_positives, "count_other_positives"))
        put("max_n_groups", None if self.max_n_groups is None else check_count(self.max_n_groups, "max_n_groups", 1))
        put("check_finite", _check_finite_option(self.check_finite))


def _check_every_metric_estimated(metrics: tuple[str, ...], methods: tuple["registry.Method", ...]) -> None:
    """A sampled metric that none of the estimators takes would have no output at all (``hh``: AUC only; the
    pairs an estimator does not take are left out of ``compute()``): refused here, naming what takes it."""
    for metric in metrics:
        takes = registry.names(metric=metric)
        if not any(m.name in takes for m in methods):
            given = tuple(m.name for m in methods)
            raise ValueError(f"estimators: none of {given} estimates {metric} (its estimators: {takes}); add one, "
                             "such as 'auto', or drop the metric")


def _metric_names(names: tuple[str, ...]) -> tuple[str, ...]:
    canonical = tuple(str(s) for s in check_metric_names(names))  # the names results are keyed and logged under
    for i, c in enumerate(canonical):
        if c in canonical[:i]:
            raise ValueError(f"metrics: {names[canonical.index(c)]!r} and {names[i]!r} name the same metric ({c!r})")
    return canonical


def _check_finite_option(value: Any) -> bool | str:
    """True, False (numpy bools too, as every bool option) or ``"positives"``."""
    if isinstance(value, np.bool_):
        value = bool(value)
    choices: tuple[bool | str, ...] = (True, False, "positives")
    return check_choice(value, choices, "check_finite")


def _sampled_design(n_samples: Any) -> SamplingDesign | None:
    """The design the adapters' keyed draws take (None: no sampled metrics): uniform (with or without replacement,
    adaptive, ``exact_at_cap`` too) or popularity (with or without replacement), with a uniform exact share or none
    (:func:`check_share_design`)."""
    design = as_design(n_samples)  # the one coercion (design.py): m in 1..MAX_SAMPLES, the cap, the law
    if design is None:
        return None
    draw = "adaptive_sampled_ranks" if design.adaptive is not None else "sampled_ranks"  # sampled_ranks: one stage
    check_share_design(design, "n_samples", "SampledRankingMetrics (nor by RankingMetricsCallback)",
                       f"draw with {draw} or sampled_ranks_from_scorer and estimate(metric, sampled)")
    if design.law not in ("binomial", "hypergeometric", "popularity"):  # a new law: refused
        raise ValueError(f"n_samples: the keyed draws of SampledRankingMetrics are uniform or by popularity; "
                         f"{design!r} ({design.law} draws) is not supported")
    return design


def check_share_design(design: SamplingDesign, name: str, who: str, instead: str, *, active: bool = False) -> None:
    """The exact shares an adapter (``who``: the torchmetrics class, the Ray adapter) draws: uniform ones, with any
    design, popularity draws with replacement included (their pl_fit statistics are per positive, the share's exact
    rank and pi travel in the same row; ``SamplingDesign`` refuses a share with popularity draws without
    replacement); a ValueError naming ``name``, unless ``active`` (the adapter makes two passes over the data,
    pass 1 for the fit of the whole sample that sets pi: the Ray adapter), for an active share (one streaming pass
    does not hold that fit while it counts; with a popularity design each positive's pi is its own pl_fit prediction,
    not a function of its (n, m, r~) cell). ``instead``: what to call instead."""
    share = design.exact_share
    if share is None:
        return
    if share.choice != "uniform" and not active and design.popularity is not None:
        raise ValueError(f"{name}: an active exact share (choice='active') with a popularity design is not "
                         f"supported by {who}: each positive's inclusion probability would depend on its own pl_fit "
                         "prediction, fitted on the whole sample, which one streaming pass does not hold while it "
                         "counts (nor can a table of (n, m, r~) cells carry it to the batches); the Ray adapter "
                         "(adapters.ray.evaluate_dataset: two passes) and the core (sampled_ranks or "
                         "sampled_ranks_from_scorer, then estimate(metric, sampled)) take it; a uniform exact share "
                         f"(ExactShare(share)) with this popularity design is supported here; or {instead}")
    if share.choice != "uniform" and not active:  # pi would need a fit of every batch's sampled ranks
        raise ValueError(f"{name}: an active exact share (choice='active') sets each positive's probability from "
                         "the model's fit of the whole sample, which a streaming metric does not hold while it "
                         f"counts; use ExactShare(share) (uniform) here, or {instead}")


def _check_supported(design: SamplingDesign, methods: Sequence[registry.Method], labels: Sequence[str]) -> None:
    """Every estimator's registry entry supports ``design`` (a ValueError naming ``estimators`` and what does)."""
    bad = [lab for lab, e in zip(labels, methods) if not type(e).entry.supports(design)]
    if bad and design.adaptive is not None:
        raise ValueError(f"estimators: {bad} assume one fixed m per relevant item; with an adaptive design use "
                         f"some of {registry.names(adaptive=True)}")
    if bad:
        raise ValueError(f"estimators: {bad} do not support {design.describe()}; use some of "
                         f"{registry.names(design=design)}")


class RankingBatch(NamedTuple):
    """One batch of an evaluation, as the adapters consume it: the scores of every item for B instances."""

    scores: torch.Tensor
    """(B, n) scores of every item for B instances (users), on any device."""
    positives: torch.Tensor
    """Held-out relevant items: a (B, n) bool mask, (B, P) int64 item indices padded with -1, or (B,) one each."""
    exclude: torch.Tensor | None = None
    """Items left out of the ranking (training items), in the forms of ``positives``, or None."""
    ids: torch.Tensor | None = None
    """Optional (B,) int64 instance ids (user indices). They key the sampled negatives, so an instance gets the same
    negatives whatever batch or process evaluates it."""


class FactorBatch(NamedTuple):
    """One batch of a factor model, handed over as factors instead of scores.

    The scores are ``user_factors @ item_factors.T + item_bias``; the adapters compute them in
    cache-sized tiles and count while they are hot (:mod:`reco_sampled_plugin.factor_ranks`), so the
    (B, n) matrix is never stored: evaluating costs about what computing the scores alone would.
    """

    user_factors: torch.Tensor
    """(B, d) factors of the B instances."""
    item_factors: torch.Tensor
    """(n, d) factors of every item (the same tensor each batch; its largest norm is cached)."""
    positives: torch.Tensor
    """As in :class:`RankingBatch`."""
    exclude: torch.Tensor | None = None
    """As in :class:`RankingBatch`."""
    ids: torch.Tensor | None = None
    """As in :class:`RankingBatch`."""
    item_bias: torch.Tensor | None = None
    """Optional (n,) per-item offset added to every score."""


class ScorerBatch(NamedTuple):
    """One batch evaluated through a scorer: no scores at all, the scorer scores the positives and the
    keyed negatives drawn for them (``_keyed.keyed_ranks`` with ``ScorerScores``), never a full row."""

    positives: torch.Tensor
    """As in :class:`RankingBatch`."""
    n_items: int
    """The catalogue size n (items 0..n - 1)."""
    exclude: torch.Tensor | None = None
    """As in :class:`RankingBatch`."""
    ids: torch.Tensor | None = None
    """As in :class:`RankingBatch`."""
    users: torch.Tensor | None = None
    """Optional (B,) int64 user ids handed to the scorer (default: the instance ids)."""


def as_ranking_batch(obj: Any, where: str = "validation_step") -> RankingBatch | FactorBatch | ScorerBatch:
    """Read a :class:`RankingBatch` from a mapping (keys ``scores``, ``positives``, optional
    ``exclude``, ``ids``) or an object with those attributes; a :class:`FactorBatch` when it holds
    ``user_factors`` and ``item_factors`` (optional ``item_bias``) instead of ``scores``; a :class:`ScorerBatch`
    when it holds neither but ``n_items`` (optional ``users``): the caller's scorer scores it."""
    if isinstance(obj, (RankingBatch, FactorBatch, ScorerBatch)):
        return obj
    if isinstance(obj, Mapping):
        get: Callable[..., Any] = obj.get
    else:
        def get(key: str, default: Any = None) -> Any:
            return getattr(obj, key, default)
    scores, positives = get("scores"), get("positives")
    uf, vf = get("user_factors"), get("item_factors")
    if positives is not None and scores is None and isinstance(uf, torch.Tensor) and isinstance(vf, torch.Tensor):
        return FactorBatch(uf, vf, positives, get("exclude"), get("ids"), get("item_bias"))
    if positives is not None and scores is None and uf is None and get("n_items") is not None:
        return ScorerBatch(positives, get("n_items"), get("exclude"), get("ids"), get("users"))
    if not isinstance(scores, torch.Tensor) or positives is None:
        raise ValueError(
            f"{where}: expected a dict (or object) with 'scores' (B x n tensor) or 'user_factors' (B x d) and "
            f"'item_factors' (n x d), or 'n_items' (a scorer scores the drawn items), 'positives' and optionally "
            f"'exclude', 'ids' and 'users'; got {type(obj).__name__}"
            + (f" with keys {sorted(obj)}" if isinstance(obj, Mapping) else "")
            + ". Return them from the step or pass score_fn= to the callback."
        )
    return RankingBatch(scores, positives, get("exclude"), get("ids"))


def check_ties(ties: str) -> str:
    if not isinstance(ties, str) or ties not in ADAPTER_TIES:
        raise ValueError(f"ties: the adapters support the deterministic policies {ADAPTER_TIES}, got {ties!r}")
    return ties


def padded_inputs(scores: torch.Tensor, positives: Any, exclude: Any, pending: list | None = None,
                  bucket: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positives and exclusions as (B, P) / (B, E) int64 tensors padded with -1, validated once (in range,
    no duplicates, no positive also excluded); ``pending``: the value checks appended to it unread instead;
    ``bucket``: masks' widths in powers of two where calls are replayed (``ranking.prepare_index``)."""
    check_dense(scores, "scores")
    b, n = scores.shape
    return prepare_index(positives, exclude, b, n, scores.device, pending=pending, bucket=bucket)


# -------------------------------------------------------------------------------- histograms
def histogram_from_rows(counts: np.ndarray, n_items: int, n_samples: int,
                        max_groups: int | None) -> tuple[RankHistogram, bool]:
    """RankHistogram from dense rows: ``counts[e]`` holds the sampled-rank counts of instances with
    n = n_items - e candidates. Groups are ordered by n; more than ``max_groups`` distinct n are
    pooled into quantile bins (the core's ``mle`` pooling: count-weighted median n per bin). Returns the
    histogram and whether it was pooled (the estimates' flag ``pooled_n``)."""
    rows = np.flatnonzero(counts.sum(1) > 0)[::-1]  # ascending n
    hist = RankHistogram(
        np.asarray(n_items - rows, dtype=np.int64),
        np.full(len(rows), n_samples, dtype=np.int64),
        tuple(np.array(counts[r], dtype=np.float64) for r in rows),
    )
    if max_groups is not None and hist.n_groups > max_groups:
        return pool_groups(hist, max_groups)[0], True
    return hist, False


def adaptive_columns(design: AdaptiveDesign) -> tuple[np.ndarray, int]:
    """Column offset of each stage in an adaptive histogram row and the row width: stage s holds r~ = 1..w_s, w_s =
    new_s + 1 at stage 0 and new_s + t after it (:func:`stage_widths`)."""
    offsets = np.concatenate([[0], np.cumsum(stage_widths(design))])
    return offsets[:-1], int(offsets[-1])


def stage_widths(design: AdaptiveDesign) -> np.ndarray:
    """The largest r~ a positive stopping at each stage can have: new_s + 1 at stage 0 (M_0 draws), new_s + t after
    it (at most t - 1 beats before the stage's new_s draws; t the design's ``top``, 1 for Li et al.'s rule)."""
    news = np.diff(np.concatenate([[0], design.stages]))
    return news + np.where(np.arange(len(news)) == 0, 1, design.top)


def adaptive_histogram_from_rows(counts: np.ndarray, n_items: int, design: AdaptiveDesign,
                                 max_groups: int | None) -> tuple[RankHistogram, bool]:
    """RankHistogram (groups (n, M_s), ascending in n then M_s: the core's order, ``_rank_hist._bincount_histogram``)
    from adaptive rows: ``counts[e]`` holds, stage after stage, the counts of r~ = 1..new_s + 1 of instances with
    n = n_items - e that stopped at stage s (:func:`adaptive_columns`); and whether it was pooled (as
    :func:`histogram_from_rows`)."""
    offsets, _ = adaptive_columns(design)
    widths = stage_widths(design)
    ns: list[int] = []
    ms: list[int] = []
    rows_out: list[np.ndarray] = []
    for s, size in enumerate(design.stages.tolist()):  # a few stages
        block = counts[:, offsets[s] : offsets[s] + widths[s]]
        rows = np.flatnonzero(block.sum(1) > 0)[::-1]  # ascending n
        full = np.zeros((len(rows), size + 1))
        full[:, : widths[s]] = block[rows]
        ns.extend((n_items - rows).tolist())
        ms.extend([size] * len(rows))
        rows_out.extend(full)
    order = np.lexsort((ms, ns))
    hist = RankHistogram(np.asarray(ns, dtype=np.int64)[order], np.asarray(ms, dtype=np.int64)[order],
                         tuple(rows_out[g] for g in order))
    if max_groups is not None and hist.n_groups > max_groups * len(design.stages):
        return pool_groups(hist, max_groups * len(design.stages))[0], True
    return hist, False


def completed_histogram_from_rows(counts: np.ndarray, n_items: int, design: SamplingDesign, completed: np.ndarray,
                                  max_groups: int | None) -> tuple[RankHistogram, bool]:
    """The histogram with exact groups of an ``exact_at_cap`` design (what ``SampledRanks.histogram()`` gives the
    core's likelihood estimators): the adaptive rows ``counts`` (every positive at its r~, :func:`adaptive_columns`)
    less the ``completed`` positives ((k, 2) rows: n and exact rank R), which counted at r~ <= t of the cap's stage
    (every positive there is completed: those cells are emptied, after checking they hold as many positives per n as
    ``completed``), then their exact groups (n, n - 1) with the counts at R (``_rank_hist.sampled_rank_histogram``);
    and whether it was pooled (:func:`~reco_sampled_plugin.rank_distribution.pool_groups`, exact groups among
    themselves)."""
    from reco_sampled_plugin._rank_hist import sampled_rank_histogram

    adaptive = design.adaptive
    assert adaptive is not None and design.exact_at_cap  # called for exact_at_cap designs only
    n = completed[:, 0].astype(np.int64)
    left = counts.copy()  # whole counts in float64: the sums are exact
    cap = int(adaptive_columns(adaptive)[0][-1])  # r~ = 1 of the cap's stage
    done = np.bincount(n_items - n, minlength=left.shape[0]).astype(np.float64)
    if len(done) > left.shape[0] or not np.array_equal(left[:, cap:cap + adaptive.top].sum(1), done):
        raise ValueError("completed: the completed positives do not match the histogram's positives within the top "
                         "at the cap (a state assembled from different designs?)")
    left[:, cap:cap + adaptive.top] = 0.0
    hist, _ = adaptive_histogram_from_rows(left, n_items, adaptive, None)
    if len(n):
        r = torch.from_numpy(completed[:, 1].astype(np.int64))
        hist = hist.concat(sampled_rank_histogram(torch.ones_like(r), torch.from_numpy(n), torch.from_numpy(n - 1),
                                                  exact_ranks=r))
    if max_groups is not None and hist.n_groups > max_groups * len(adaptive.stages):
        return pool_groups(hist, max_groups * len(adaptive.stages))[0], True
    return hist, False


# ------------------------------------------------------------------------------------- names
def estimator_label(method: "str | registry.Method") -> str:
    """The label an estimator's values are keyed and logged under: its registry name (``none``, the plain sampled
    metric: ``sampled``), then each option it sets away from the default as ``_<option>-<value>``, options in
    name order (``Bv(gamma=0.2)``: ``bv_gamma-0.2``; ``Mes(n_bootstrap=0, lam=1.0)``: ``mes_lam-1.0_n_bootstrap-0``).
    Only letters, digits, ``_``, ``-`` and ``.`` (MLflow's metric names allow them); a value that is not a
    number, string, bool or a tuple of them (a vector prior, a ``TopShape``) is written ``h`` and 8 hex digits of
    a stable hash of its value."""
    m = registry.as_method(method)
    base = "sampled" if m.name == "none" else m.name
    return base + "".join(f"_{k}-{_label_value(v)}" for k, v in sorted(m.given().items()))


def _label_value(v: Any) -> str:
    """An option value in a label (:func:`estimator_label`)."""
    if isinstance(v, (bool, int, float, str, np.bool_, np.integer, np.floating)):
        text = str(v.item() if isinstance(v, np.generic) else v)
    elif isinstance(v, (tuple, list)) and all(isinstance(x, (bool, int, float, str)) for x in v):
        text = "-".join(str(x) for x in v)
    else:
        data = np.asarray(v).tobytes() if isinstance(v, (np.ndarray, torch.Tensor)) else repr(v).encode()
        text = "h" + hashlib.blake2b(data, digest_size=4).hexdigest()
    return re.sub(r"[^A-Za-z0-9_.\-]", "-", text)


def estimator_methods(estimators: Any, name: str = "estimators") -> tuple[tuple[Any, ...], tuple["registry.Method", ...],
                                                                          tuple[str, ...]]:
    """``estimators`` (registry names or method objects such as ``Bv(gamma=0.2)``; one alone is one) as given,
    as method objects and as labels (:func:`estimator_label`); a ValueError naming ``name`` for anything else, an
    unknown name, none at all, or two with the same label."""
    items: tuple[Any, ...]
    if isinstance(estimators, (str, registry.Method)):
        items = (estimators,)
    elif isinstance(estimators, (bytes, bytearray, Mapping)) or not hasattr(estimators, "__iter__"):
        raise ValueError(f"{name}: expected a list of estimator names such as 'auto' or method objects such as "
                         f"Bv(gamma=0.2), got {estimators!r}")
    else:
        items = tuple(estimators)
    bad = [e for e in items if not isinstance(e, (str, registry.Method))]
    if bad:
        raise ValueError(f"{name}: expected estimator names such as 'auto' or method objects such as Bv(gamma=0.2), "
                         f"got {bad[0]!r} in {list(items)!r}")
    known = registry.names()
    unknown = [e for e in items if isinstance(e, str) and e not in known]
    if unknown or not items:
        raise ValueError(f"{name}: unknown {unknown}; use some of {known}")
    methods = tuple(registry.as_method(e) for e in items)
    labels = tuple(estimator_label(m) for m in methods)
    twice = [lab for i, lab in enumerate(labels) if lab in labels[:i]]
    if twice:
        raise ValueError(f"{name}: two estimators with the label {twice[0]!r} (the same method and options)")
    return items, methods, labels


def metric_key(metric: str) -> str:
    """A logger-safe form of a metric name: ``ndcg@10`` -> ``ndcg_at_10`` (MLflow rejects ``@``)."""
    return str(metric).replace("@", "_at_")


def stderr_from_sums(s1: float, s2: float, count: float) -> float:
    """Standard error of a mean from the sum, the sum of squares and the count (inf for at most one instance: no
    spread to measure)."""
    if count <= 1:
        return math.inf
    var = max(s2 - s1 * s1 / count, 0.0) / (count - 1.0)
    return math.sqrt(var / count)


_EXPLAINED: set[str] = set()
#: the flags that widen an interval (said once per process, in words: ``_estimate.explain_flags``)
_WIDENING_FLAGS = ("top_unresolved", "cap_reached")


def explain_once(logger: logging.Logger, where: str, est: Estimate, **context: Any) -> None:
    """Log once per process (warning, on the calling module's ``logger``) why ``est``'s interval is wide: each of its
    widening flags in words, with the ``reco-sampled plan`` command (``context``: metric, n_items, n_samples, users)."""
    from reco_sampled_plugin._estimate import explain_flags

    flags = [f for f in est.flags if f in _WIDENING_FLAGS]
    for line in explain_flags(flags, **context) if flags else ():
        message = f"{where}: {line}"
        if message not in _EXPLAINED:
            _EXPLAINED.add(message)
            logger.warning(message)
