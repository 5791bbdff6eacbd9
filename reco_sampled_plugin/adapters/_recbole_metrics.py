"""RecBole adapter, metrics: the plugin's metric classes, computed from the per-positive table.

Four families (:data:`~._recbole_settings.FAMILIES`): ``Corrected*``, ``Mapped*`` and ``RankDist*`` estimate a
full-catalogue metric from sampled ranks (the one estimation contract, ``estimate(metric, sample, method)``), each with
the one estimator of its family listed in ``rsp_estimators`` (``registry.recbole_choices``); ``Exact*``
recompute RecBole's list metrics from exact ranks. Values shared by the metrics of one evaluation (weights,
the rank histogram) are computed once and cached on the table RecBole hands to each.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from reco_sampled_plugin import registry
from reco_sampled_plugin._estimate import explain_flags, interval_values
from reco_sampled_plugin._rank_hist import _bincount_histogram, _group_ids, sampled_rank_histogram
from reco_sampled_plugin import estimators  # the contract, estimators._estimate (to be renamed estimate)
from reco_sampled_plugin.metric_names import MetricSpec, parse_metric
from reco_sampled_plugin.metrics import metric_from_float_ranks
from reco_sampled_plugin._popularity import POP_BINS, PROFILE_FIELDS, PopularityStats
from reco_sampled_plugin._share import ShareRows
from reco_sampled_plugin.design import ExactShare, SamplingDesign
from reco_sampled_plugin.ranking import SampledRanks

from ._recbole_ranks import (_AT_CAP, _HH_BEATING, _HH_S1, _HH_S2, _HH_UNREACHABLE, _ITEM, _M, _N_COLS, _N_IRR,
                             _N_POS, _POP, _R_FULL, _R_IRR, _R_SAMPLED, _USER, PLUGIN_KEY)
from ._recbole_settings import (_ESTIMATED_KINDS, FAMILIES, _Settings, _settings, class_name, estimate_key, log_once,
                                note_definitions, note_leave_one_out)

#: the public module the classes are documented in (``reco_sampled_plugin.adapters.recbole``)
_PUBLIC_MODULE = __name__.rsplit(".", 1)[0] + ".recbole"


def _grid_n(n: np.ndarray, step: float) -> np.ndarray:
    """Round candidate counts to a geometric grid (relative step ``step``) so tables are shared: computed
    once per distinct count (each user's positives share one)."""
    values, index = _group_ids(n.astype(np.int64))
    lg = math.log1p(step)
    return np.round(np.exp(np.round(np.log(values) / lg) * lg))[index]


def _recbole() -> tuple[Any, Any]:
    from recbole.evaluator.base_metric import AbstractMetric
    from recbole.utils import EvaluatorType

    return AbstractMetric, EvaluatorType


class _Metric:
    """Shared implementation of the plugin's RecBole metrics (mixed into RecBole's AbstractMetric)."""

    family: str = ""
    kind: str = ""  # core kind ("recall", ...) or RecBole list metric ("Recall", ...) for the exact family
    metric_need = [PLUGIN_KEY]
    smaller = False

    def __init__(self, config: Any) -> None:
        super().__init__(config)  # type: ignore[call-arg]
        self.config = config
        settings = _settings(config)
        if settings is None:  # constructed outside a config that names it
            raise ValueError("metrics: the plugin metric is not listed in the config's metrics")
        self.settings: _Settings = settings
        self.name = type(self).__name__.lower()
        note_definitions(config, self.settings)  # once per process: uncorrected values, leave-one-out definitions

    # keys and values -------------------------------------------------------------------------
    def _cutoffs(self) -> list[int | None]:
        return [None] if self.kind == "auc" else list(self.settings.topk)

    def _key(self, k: int | None) -> str:
        return self.name if k is None else f"{self.name}@{k}"

    def _round(self, value: float) -> float:
        return round(float(value), self.settings.decimal_place)

    def calculate_metric(self, dataobject: Any) -> dict:
        table = dataobject.get(PLUGIN_KEY)
        if table.shape[0] == 0:
            raise ValueError(f"{self.name}: no held-out items were evaluated")
        users, weights = _users_and_weights(table, self.settings.weighting)
        if float(table[:, _N_POS].max()) > 1:  # some user holds out several items: the definitions differ
            note_leave_one_out(self.config, self.settings)
        out: dict[str, float] = {}
        for k in self._cutoffs():
            out.update(self._values(table, users, weights, k))
        return out

    def _values(self, table: torch.Tensor, users: torch.Tensor, weights: torch.Tensor, k: int | None) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError


def _table_cache(table: torch.Tensor) -> dict:
    """Per-evaluation values shared by the plugin's metrics, cached on the table RecBole hands to each."""
    return table.__dict__.setdefault("_rsp_cache", {})


def _users_and_weights(table: torch.Tensor, weighting: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each positive's user row and weight (``user``: 1/|T_u|, each user counts once; ``item``: 1)."""
    cache = _table_cache(table)
    key = ("weights", weighting)
    if key not in cache:
        users = table[:, _USER].to(torch.int64)
        weights = 1.0 / table[:, _N_POS] if weighting == "user" else torch.ones(table.shape[0], dtype=torch.float64)
        cache[key] = (users, weights)
    return cache[key]


def _exact_ranks(table: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """The exact ranks among irrelevant items and whether all are known (none beyond the computed top), or
    None when the table has none (sampled modes)."""
    cache = _table_cache(table)
    if "exact" not in cache:
        r_irr = table[:, _R_IRR]
        cache["exact"] = (r_irr, bool((r_irr > 0).all())) if bool((r_irr != 0).all()) else None
    return cache["exact"]


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> float:
    """The weighted mean; NaN when every weight is 0 (nothing to average)."""
    total = float(weights.sum())
    return float(values @ weights) / total if total > 0 else math.nan


def _capped_metric(spec: MetricSpec, ranks: torch.Tensor, n: torch.Tensor, all_known: bool | None = None) -> torch.Tensor:
    """M(r) of the table's ranks (valid by construction: no re-validation), where ranks beyond the computed
    top (-1) score 0 (cut-off metrics only reach here). ``all_known``: whether every rank is > 0, if known."""
    if all_known is None:
        all_known = bool((ranks > 0).all())
    if all_known:
        return metric_from_float_ranks(spec, ranks, n)
    known = ranks > 0
    out = torch.zeros_like(ranks)
    if bool(known.any()):
        out[known] = metric_from_float_ranks(spec, ranks[known], n[known])
    return out


class _EstimatedMetric(_Metric):
    """A full-catalogue metric estimated from sampled ranks (corrections, mappings, rank distributions)."""

    def _method(self) -> registry.Method:
        """The method object of this family (``rsp_estimators`` and ``rsp_estimator_options``; RankDist*: the
        bootstrap only where a standard error or an interval is reported, ``_recbole_settings._family_methods``)."""
        return self.settings.methods[self.family]

    def _values(self, table: torch.Tensor, users: torch.Tensor, weights: torch.Tensor, k: int | None) -> dict:
        s = self.settings
        spec = parse_metric(self.kind if k is None else f"{self.kind}@{k}")
        base = self._key(k)
        key = estimate_key(base, self._method().name)  # each key names its estimator
        method = self._method()
        # carries its design (law, adaptive stages); exact_at_cap: the completed positives at R for the estimators
        # that read exact groups, at r~ for the others (as the core's SampledRanks.histogram)
        hist = _sampled_inputs(table, weights, s, spec.k or 2, exact=type(method).entry.exact_groups)
        design = s.design.adaptive if s.design is not None else None  # adaptive: rsp_adaptive_max (full or uniN)
        family = type(method).entry.family
        popn = _popularity_ranks(table, s.exact_share)
        if popn is not None and family != "none":
            # popN: the draws' own statistics through the core (the registry's popularity estimators; none keeps the
            # histogram, as the law-free sampled metric needs nothing more)
            # (auto runs hh or pl_fit there, which take no bootstrap: the adapter's n_bootstrap and seed are dropped)
            if family == "auto":
                method = type(method)(**s.options.get(method.name, {}))
            result = estimators.estimate(spec, popn, method, weights=_sampled_weights(table, weights))
        else:
            result = estimators.estimate(spec, hist, method)
        out = {key: self._round(result.value)}
        # the 95% interval right after its point (Estimate.interval: honest about the unresolved top); stderr opt-in
        out.update({k2: self._round(v) for k2, v in interval_values(key, result, interval=s.interval,
                                                                    stderr=s.stderr).items()})
        if design is not None and "adaptive" in result.details:  # what adaptive sampling cost (weighted like the
            # estimate; diff's estimate on a share reports none)
            cost = result.details["adaptive"]
            out[f"{base}/adaptive_mean_samples"] = self._round(cost["mean_samples"])
            out[f"{base}/adaptive_max_samples"] = int(cost["max_samples"])
            out[f"{base}/adaptive_share_at_cap"] = self._round(cost["share_at_cap"])
        if "top_unresolved" in result.flags and family != "none":
            why = explain_flags(["top_unresolved"], metric=str(spec), n_items=int(np.max(hist.n_items)),
                                users=int(users.unique().numel()),
                                design=popn.design if popn is not None else s.design)[0]
            log_once(f"reco_sampled_plugin: {class_name(self.name)}{'' if k is None else f'@{k}'}: {why}")
        if s.side_by_side:
            out[f"{base}/sampled"] = self._round(_sampled_inputs(table, weights, s, spec.k or 2).sampled_metric(spec))
            exact = _exact_ranks(table)
            if exact is not None:
                r_irr, all_known = exact
                if spec.k is None and not all_known:  # pragma: no cover - full ranks are forced for AUC
                    raise RuntimeError("reco_sampled_plugin: exact ranks beyond the top for a metric without cut-off")
                n_irr = table[:, _N_IRR]
                values = _capped_metric(spec, r_irr, n_irr, all_known)
                w = weights
                if spec.kind == "auc":  # AUC needs an irrelevant candidate (n = 1 gives 0/0): left out otherwise
                    w = torch.where(n_irr > 1, weights, torch.zeros_like(weights))
                    values = torch.where(n_irr > 1, values, torch.zeros_like(values))
                out[f"{base}/exact"] = self._round(_weighted_mean(values, w))
        return out


def _popularity_ranks(table: torch.Tensor, share: ExactShare | None = None) -> SampledRanks | None:
    """popN tables: the positives' :class:`~reco_sampled_plugin.ranking.SampledRanks` under the sampler's popularity
    design (with ``share``, ``rsp_exact_share``: its exact ranks and inclusion probabilities once drawn, the table's
    ``_rsp_share``), carrying each positive's Hansen-Hurwitz statistics (the ``hh_*`` columns) and its exact
    candidate count (no ``rsp_n_grid``: the estimate reads n per positive); None for other modes. Cached on the
    table."""
    cache = _table_cache(table)
    if "popularity" not in cache:
        weights = table.__dict__.get("_rsp_popularity")
        rows = table[:, _R_SAMPLED] > 0
        if weights is None or not bool((table[rows, _POP] == 1).all()) or not bool(rows.any()):
            cache["popularity"] = None
        else:
            t = table[rows]
            m = int(t[0, _M])
            counts = t[:, _N_COLS:].reshape(t.shape[0], -1, POP_BINS).to(torch.float32).unbind(1)  # popN: pl_fit's
            profile, beat_bins, miss_bins = counts if len(counts) == len(PROFILE_FIELDS) else (None, None, None)
            w = weights.to(torch.float64)
            stats = PopularityStats(t[:, _HH_BEATING], t[:, _HH_S1], t[:, _HH_S2],
                                    t[:, _HH_UNREACHABLE].to(torch.int64), profile, beat_bins, miss_bins,
                                    w[t[:, _ITEM].to(torch.int64).clamp(0, w.shape[0] - 1).to(w.device)].cpu())
            design = SamplingDesign.trusted(m, popularity=weights, exact_share=share)
            drawn = table.__dict__.get("_rsp_share")
            exact, pi = (None, None) if drawn is None or share is None else (drawn[0][rows], drawn[1][rows])
            cache["popularity"] = SampledRanks(t[:, _R_SAMPLED], t[:, _N_IRR], None, design, popularity_stats=stats,
                                               share_ranks=exact, inclusion=pi)
    return cache["popularity"]


def share_sample(table: torch.Tensor, s: _Settings) -> SampledRanks:
    """The table's positives as :class:`~reco_sampled_plugin.ranking.SampledRanks` under the evaluation's design with
    its exact share (``s.exact_share``; popN: the sampler's popularity weights and the draws' statistics), before
    the share is drawn: what its inclusion probabilities are computed from (``_recbole_stages.run_share``). Not
    cached (the estimates read the table once the share is on it)."""
    popn = _popularity_ranks(table, s.exact_share)
    _table_cache(table).pop("popularity", None)
    if popn is not None:
        return popn
    m = table[:, _M].to(torch.int64)
    design = _share_design(table, s)
    return SampledRanks(table[:, _R_SAMPLED].to(torch.int64), table[:, _N_IRR].to(torch.int64), None, design,
                        m if design.adaptive_max is not None else None)


def _share_design(table: torch.Tensor, s: _Settings) -> SamplingDesign:
    """The design of a sampled-mode table with an exact share: the settings' (one N for every phase), else this
    phase's N (its ``m`` column) with the share."""
    if s.design is not None:
        return s.design
    return SamplingDesign.trusted(int(table[0, _M]), exact_share=s.exact_share)


def _share_rows(table: torch.Tensor, rows: Any, n_est: np.ndarray, w: np.ndarray) -> ShareRows | None:
    """The exact share's rows (``RankHistogram.share``) of the positives ``rows`` of a table whose share is drawn
    (``_rsp_share``), at the histogram's candidate counts ``n_est`` and weights ``w``; None without a share."""
    drawn = table.__dict__.get("_rsp_share")
    if drawn is None:
        return None
    exact, pi = (x.numpy(force=True)[rows] for x in drawn)
    chosen = exact > 0
    columns = table.numpy(force=True)[rows]
    return ShareRows(n_est[chosen].astype(np.int64), columns[chosen, _M].astype(np.int64),
                     columns[chosen, _R_SAMPLED].astype(np.float64), exact[chosen].astype(np.float64),
                     pi[chosen].astype(np.float64), w[chosen].astype(np.float64), census=bool((pi >= 1.0).all()))


def _sampled_weights(table: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
    """The weights of the positives that have a sampled rank (the rows of :func:`_popularity_ranks`)."""
    return weights[table[:, _R_SAMPLED] > 0]


def _sampled_inputs(table: torch.Tensor, weights: torch.Tensor, s: _Settings, k_floor: int, exact: bool = False) -> Any:
    """The rank histogram (candidate counts on the ``rsp_n_grid`` grid, at least max(m + 1, K)) of the
    positives that have a sampled rank, with their weights, carrying the settings' design (its law and adaptive
    stages; popN: the uniform N, which the plain sampled metric reads); computed once per evaluation table and
    shared by every estimated metric (cached on the table, which RecBole hands to each metric). ``exact`` with an
    ``exact_at_cap`` design: the positives completed at the cap (the ``exact_at_cap`` column) in exact groups at
    their R (``sampled_rank_histogram(..., exact_ranks=)``, at the same grid's n), else at their r~."""
    exact = exact and s.design is not None and s.design.exact_at_cap
    cache = _table_cache(table)
    key = (s.weighting, s.n_grid, s.replacement, k_floor, exact)
    if key not in cache:
        columns = table.numpy(force=True)  # the adapter's tables live on the CPU: a view
        sampled = columns[:, _R_SAMPLED]
        have = sampled > 0
        rows = slice(None) if have.all() else have  # full mode with rsp_m, or a sampled mode: every positive
        r, n, m, w = sampled[rows], columns[rows, _N_IRR], columns[rows, _M], weights.numpy(force=True)[rows]
        m1 = m + 1
        n_est = np.maximum(_grid_n(n, s.n_grid), np.maximum(m1, float(k_floor))) if s.n_grid > 0 else n
        if not s.replacement:
            n_est = np.maximum(n_est, m1)
        if exact:  # the core's exact groups (checked: a handful of arrays, once per evaluation)
            hist = sampled_rank_histogram(r, n_est, m, weights=w, exact_ranks=columns[rows, _AT_CAP])
        elif r.shape[0]:  # whole numbers in range by construction: no re-validation
            hist = _bincount_histogram(r, n_est, m, w)
        else:
            hist = sampled_rank_histogram(r, n_est, m, weights=w)  # the empty histogram
        share = _share_rows(table, rows, n_est, w)
        if share is None:
            cache[key] = hist.with_design(s.design)
        else:  # the exact share travels with the counts (RankHistogram.share): diff reads it
            cache[key] = hist.with_design(_share_design(table, s)).with_share(share)
    return cache[key]


class _ExactMetric(_Metric):
    """RecBole's list metric (same definition and averaging over users) from the plugin's exact ranks."""

    def _values(self, table: torch.Tensor, users: torch.Tensor, weights: torch.Tensor, k: int | None) -> dict:
        assert k is not None  # RecBole's list metrics are read at each topk
        r = table[:, _R_FULL]
        n_users = int(users.max()) + 1
        hit = ((r > 0) & (r <= k)).to(torch.float64)
        n_pos = torch.zeros(n_users, dtype=torch.float64).scatter_reduce_(0, users, table[:, _N_POS], "amax", include_self=False)
        present = torch.zeros(n_users, dtype=torch.bool)
        present[users] = True
        hits_u = torch.zeros(n_users, dtype=torch.float64).index_add_(0, users, hit)
        kind = self.kind
        if kind == "Recall":
            per_user = hits_u / n_pos.clamp(min=1)
        elif kind == "Hit":
            per_user = (hits_u > 0).to(torch.float64)
        elif kind == "Precision":
            per_user = hits_u / k
        elif kind == "NDCG":
            dcg = torch.where(hit > 0, 1.0 / torch.log2(r.clamp(min=1) + 1.0), torch.zeros_like(r))
            dcg_u = torch.zeros(n_users, dtype=torch.float64).index_add_(0, users, dcg)
            ideal_len = torch.clamp(n_pos, max=k).to(torch.int64)
            ideal = torch.cumsum(1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float64)), 0)
            per_user = dcg_u / ideal[(ideal_len - 1).clamp(min=0)]
        elif kind == "MRR":
            rr = torch.where(hit > 0, 1.0 / r.clamp(min=1), torch.zeros_like(r))
            per_user = torch.zeros(n_users, dtype=torch.float64).scatter_reduce_(0, users, rr, "amax", include_self=True)
        elif kind == "MAP":
            # AP@k = sum over hits of (hits up to and including it) / rank, divided by min(|T_u|, k)
            order = torch.argsort(users * (k + 2) + torch.where(hit > 0, r, torch.full_like(r, k + 1)))
            u_sorted, h_sorted, r_sorted = users[order], hit[order], r[order]
            cum = torch.cumsum(h_sorted, 0)
            start = torch.zeros(n_users, dtype=torch.float64).scatter_reduce_(0, u_sorted, cum - h_sorted, "amin", include_self=False)
            within = cum - start[u_sorted]
            terms = torch.where(h_sorted > 0, within / r_sorted.clamp(min=1), torch.zeros_like(r_sorted))
            ap_u = torch.zeros(n_users, dtype=torch.float64).index_add_(0, u_sorted, terms)
            per_user = ap_u / torch.clamp(n_pos, max=k).clamp(min=1)
        else:  # pragma: no cover - the class table lists the kinds
            raise ValueError(f"unknown exact metric {kind!r}")
        return {self._key(k): self._round(float(per_user[present].mean()))}


def _build_classes() -> dict[str, type]:
    AbstractMetric, EvaluatorType = _recbole()
    classes: dict[str, type] = {}
    for family, (prefix, kinds) in FAMILIES.items():
        base = _ExactMetric if family == "exact" else _EstimatedMetric
        for kind in kinds:
            name = prefix + kind
            core_kind = kind if family == "exact" else _ESTIMATED_KINDS[kind]
            doc = (
                f"RecBole's {kind}@k recomputed from the plugin's exact ranks (full mode)."
                if family == "exact"
                else f"{kind} estimated from sampled ranks by the {family} estimators (see docs/recbole.md)."
            )
            cls = type(
                name,
                (base, AbstractMetric),
                {
                    "family": family,
                    "kind": core_kind,
                    "metric_type": EvaluatorType.RANKING,
                    "metric_need": [PLUGIN_KEY],
                    "smaller": False,
                    "__doc__": doc,
                    "__module__": _PUBLIC_MODULE,
                },
            )
            classes[name.lower()] = cls
    return classes


_METRIC_CLASSES: dict[str, Any] = _build_classes()  # RecBole AbstractMetric subclasses (untyped)


def metric_classes() -> dict[str, type]:
    """The plugin's RecBole metric classes by lower-case name (as RecBole registers them)."""
    return dict(_METRIC_CLASSES)

