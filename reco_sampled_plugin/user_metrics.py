"""Per-user ranking metrics for users with one or more relevant items (recometrics' definitions).

Given the exact 1-based ranks of a user's |T| relevant items among that user's ``n`` candidates
(other relevant items competing, training items excluded), with r_(1) < r_(2) < ... sorted:

============  =====================================================================
P@k           hits@k / k                        (hits@k = #{i : r_i <= k})
TP@k          hits@k / min(k, |T|)
R@k           hits@k / |T|
AP@k          (1 / |T|) * sum_{j : r_(j) <= k} j / r_(j)
TAP@k         the same sum / min(k, |T|)
NDCG@k        sum_{r_i <= k} g_i / log2(r_i + 1)  /  IDCG@k (gains g = 1, or graded relevance)
Hit@k         [hits@k > 0]
RR@k          1 / r_(1) if r_(1) <= k else 0
ROC_AUC       sum_j (N - (r_(j) - j)) / (|T| N),    N = n - |T| irrelevant candidates
PR_AUC        AP@n
============  =====================================================================

Without ``@k`` the cut-off is the user's ``n``. NaN rules (recometrics): a user without relevant
items, or a single candidate, gets NaN everywhere; P@k, TP@k, R@k and Hit@k are NaN when the user has k or fewer
candidates (they would not depend on the ranking); every metric but NDCG is NaN when the user
has no irrelevant candidate left. NaN users are left out of means (:func:`mean_metrics` says how many).
"""

from __future__ import annotations

import math
from numbers import Real
from typing import TYPE_CHECKING, Any, Iterable, Mapping, Sequence, TypeGuard

import numpy as np
import torch

from ._checks import as_tensor, check_generator, check_rank_values, real_tensor, check_sizes, check_weights
from .metric_names import MetricSpec, parse_metric
from . import _graphs
from ._deferred import defer_checks, defer_flags
from ._inputs import Check, check_flags, run_checks, score_tensor
from ._options import check_bool, check_metric_names
from .ranking import TIE_BOUNDS, capture_inputs, check_ties, padded_candidate_counts, queued_exact_ranks
from .tie_expectation import HIT_COUNTS, expected_metric_values, ideal_dcg, undefined_users

if TYPE_CHECKING:
    from ._types import TensorLike
    import pandas as pd

__all__ = ["user_metric_values", "per_user_metrics", "mean_metrics", "DEFAULT_METRICS"]

DEFAULT_METRICS = (
    "precision@10",
    "tp@10",
    "recall@10",
    "ap@10",
    "tap@10",
    "ndcg@10",
    "hit@10",
    "rr@10",
    "auc",
    "pr_auc",
)


class SortedRanks:
    """Ranks sorted per user with padding at +inf, and the derived quantities every metric shares."""

    def __init__(self, ranks: torch.Tensor, n_candidates: torch.Tensor, relevance: torch.Tensor | None) -> None:
        r = ranks.to(torch.float64)
        valid = r > 0
        r = torch.where(valid, r, torch.full_like(r, math.inf))
        self.ranks, order = torch.sort(r, dim=1)
        self.valid = torch.isfinite(self.ranks)
        self.n_pos = valid.sum(1).to(torch.float64)
        self.n = n_candidates.to(torch.float64)
        p = r.shape[1]
        self.position = torch.arange(1, p + 1, dtype=torch.float64, device=r.device).expand_as(self.ranks)
        self.gain = None if relevance is None else relevance.to(torch.float64).gather(1, order).masked_fill(~self.valid, 0.0)
        self._at: dict[int | None, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._undefined: dict[tuple[str, int | None], torch.Tensor] = {}

    def cutoff(self, spec: MetricSpec) -> torch.Tensor:
        return self.at(spec.k)[0]

    def at(self, k: int | None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(cut-off per user (B,), ranks within it (B, P), their count (B,) float64) at ``k`` (None: n), computed
        once per k and shared by the metrics at that cut-off (ten metrics @10: five operators each saved)."""
        got = self._at.get(k)
        if got is None:
            cut = self.n if k is None else torch.full_like(self.n, float(k))
            inside = self.ranks <= cut.unsqueeze(1)
            got = self._at[k] = (cut, inside, inside.sum(1).to(torch.float64))
        return got

    def undefined(self, kind: str, k: int | None) -> torch.Tensor:
        """(B,) :func:`undefined_users` of metric ``kind`` at ``k``, computed once per rule and cut-off (the hit
        counts', NDCG's and the other metrics' rules differ)."""
        rule = "count" if kind in HIT_COUNTS else "ndcg" if kind == "ndcg" else "other"
        got = self._undefined.get((rule, k))
        if got is None:
            got = self._undefined[(rule, k)] = undefined_users(kind, self.at(k)[0], self.n_pos, self.n)
        return got


def values_from_sorted(spec: MetricSpec, s: SortedRanks) -> torch.Tensor:
    k, inside, hits = s.at(spec.k)
    t = s.n_pos
    kind = spec.kind
    if kind == "precision":
        out = hits / k
    elif kind == "trunc_precision":
        out = hits / torch.minimum(k, t)
    elif kind == "recall":
        out = hits / t
    elif kind == "hit":
        out = (hits > 0).to(torch.float64)
    elif kind in ("ap", "trunc_ap"):
        prec_at_hit = torch.where(inside, s.position / s.ranks, torch.zeros_like(s.ranks))
        total = prec_at_hit.sum(1)
        out = total / (t if kind == "ap" else torch.minimum(k, t))
    elif kind == "rr":
        first = s.ranks[:, 0] if s.ranks.shape[1] else torch.full_like(t, math.inf)
        out = torch.where(first <= k, 1.0 / first, torch.zeros_like(first))
    elif kind == "ndcg":
        discount = math.log(2.0) / torch.log1p(torch.where(s.valid, s.ranks, torch.ones_like(s.ranks)))
        gain = torch.ones_like(s.ranks) if s.gain is None else s.gain
        dcg = torch.where(inside, gain * discount, torch.zeros_like(discount)).sum(1)
        idcg = ideal_dcg(gain, s.valid, k)  # the ideal order does not depend on the ranks (nor on the gains' slots)
        out = dcg / idcg
        out = torch.where(idcg > 0, out, torch.full_like(out, math.nan))
    elif kind == "auc":
        n_neg = s.n - t
        beaten = torch.where(s.valid, n_neg.unsqueeze(1) - (s.ranks - s.position), torch.zeros_like(s.ranks))
        out = beaten.sum(1) / (t * n_neg)
    else:  # pragma: no cover
        raise ValueError(f"metric: unsupported kind {kind!r}")
    return out.masked_fill(s.undefined(kind, spec.k), math.nan)


def _check_rank_inputs(ranks: Any, n_candidates: Any,
                       relevance: Any) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    r = check_rank_values(ranks, "ranks", padding=True)
    if r.dim() == 1:
        r = r.unsqueeze(1)
    if r.dim() != 2:
        raise ValueError(f"ranks: expected (users x positives) padded with 0, got shape {tuple(r.shape)}")
    n = torch.as_tensor(check_sizes(n_candidates, "n_candidates", 0, device=r.device), device=r.device)
    if n.dim() == 0:
        n = n.expand(r.shape[0])
    if n.shape != (r.shape[0],):
        raise ValueError(f"n_candidates: expected shape ({r.shape[0]},), got {tuple(n.shape)}")
    if r.numel() and (bool((r < 0).any()) or bool((r > n.unsqueeze(1)).any())):
        raise ValueError("ranks: must lie in 1..n_candidates (0 marks padding)")
    rel = None if relevance is None else _check_relevance(relevance, r)
    return r, n, rel


def _check_relevance(relevance: Any, r: torch.Tensor) -> torch.Tensor:
    """Relevance aligned with the (B, P) ranks ``r``: a bool mask, or non-negative weights."""
    rel = as_tensor(relevance, "relevance", device=r.device)
    if rel.dim() == 1:
        rel = rel.unsqueeze(1)
    if rel.shape != r.shape:
        raise ValueError(f"relevance: expected the ranks' shape {tuple(r.shape)}, got {tuple(rel.shape)}")
    if rel.dtype != torch.bool:  # binary relevance as a mask is fine; graded relevance must be weights
        rel = check_weights(rel, "relevance")
    return rel


def _check_one_ordering(s: "SortedRanks", integer: bool) -> None:
    """Raise unless each user's ranks can be those of distinct relevant items (``ranks`` of user_metric_values).

    Integer ranks (every tie policy but ``"average"``) must be distinct within a user: two relevant items at
    rank 1 would give P@1 = 2. Fractional ranks (``ties="average"``: a tie group shares its mean position) must
    be averages of distinct positions 1..n: sorted, the j smallest sum to at least 1 + ... + j and the j largest
    to at most n + (n - 1) + ... + (n - j + 1) (an AUC outside [0, 1] otherwise)."""
    r, valid = s.ranks, s.valid
    if r.shape[1] < 2 or r.shape[0] == 0:
        return
    if integer:
        bad = ((r[:, 1:] == r[:, :-1]) & valid[:, 1:]).any(1)
    else:
        r0 = torch.where(valid, r, torch.zeros_like(r))
        prefix = torch.cumsum(r0, 1)
        j = s.position
        suffix = prefix[:, -1:] - (prefix - r0)  # sum of the ranks from this one to the user's last
        top = s.n_pos.unsqueeze(1) - j + 1  # how many ranks that is
        n = s.n.unsqueeze(1)
        tol = 1e-9 * torch.clamp(n, min=1.0) * j
        low = prefix < j * (j + 1) / 2 - tol
        high = suffix > top * n - top * (top - 1) / 2 + tol
        bad = ((low | high) & valid).any(1)
    if bool(bad.any()):
        row = int(bad.nonzero()[0, 0])
        raise ValueError(
            f"ranks: {int(bad.sum())} user(s) list ranks that distinct relevant items cannot have (first: row {row}, "
            f"{s.ranks[row][s.valid[row]].tolist()}); each relevant item of a user has its own rank, as exact_ranks "
            "returns them (count_other_positives=True)"
        )


def user_metric_values(metric: str | MetricSpec, ranks: TensorLike, n_candidates: TensorLike,
                       relevance: TensorLike | None = None) -> torch.Tensor:
    """One metric per user from the exact ranks of that user's relevant items.

    Args:
        metric: e.g. ``"ndcg@10"``, ``"ap@10"``, ``"auc"``, ``"pr_auc"``.
        ranks: (B, P) 1-based exact ranks among the user's candidates, padded with 0
            (as returned by :func:`exact_ranks` with ``count_other_positives=True``).
        n_candidates: (B,) candidates per user (the catalogue minus excluded items).
        relevance: optional (B, P) non-negative graded relevance for NDCG (binary otherwise).

    Returns:
        (B,) float64 values, NaN where the metric is undefined for that user (see module doc).

    Raises:
        ValueError: naming the argument: ranks that are bool, complex, NaN, outside 0..n_candidates, or that
            distinct relevant items cannot have (the same integer rank twice in a row, e.g. ``[[1, 1]]``);
            n_candidates that are not whole counts or not one per user.
    """
    spec = parse_metric(metric)
    r, n, rel = _check_rank_inputs(ranks, n_candidates, relevance)
    sorted_ranks = SortedRanks(r, n, rel)
    _check_one_ordering(sorted_ranks, not r.is_floating_point())
    return values_from_sorted(spec, sorted_ranks)


def _expand(metrics: Iterable[str | MetricSpec], cumulative: bool) -> list[MetricSpec]:
    specs = list(check_metric_names(metrics))
    cumulative = check_bool(cumulative, "cumulative")
    if not cumulative:
        return specs
    out: list[MetricSpec] = []
    for spec in specs:
        if spec.k is None:
            out.append(spec)
        else:
            out.extend(MetricSpec(spec.kind, k) for k in range(1, spec.k + 1))
    return out


def _check_cutoffs(specs: Sequence[MetricSpec], n: int) -> int:
    """``n``, the candidates of every user, where each cut-off k of ``specs`` is at most n; else a ValueError naming
    ``metrics``."""
    for spec in specs:
        if spec.k is not None and spec.k > n:
            raise ValueError(f"metrics: k = {spec.k} in {str(spec)!r} is larger than the candidate list ({n} items)")
    return n


def _kernel_ties(ties: str) -> str:
    """The counting kernels' tie policy of ``ties`` (checked): ``"average"`` counts each positive's tie group
    [lo, hi] (``TIE_BOUNDS``), over whose orders the metrics then take their expectation."""
    check_ties(ties)
    return TIE_BOUNDS if ties == "average" else ties


def _is_factors(scores: object) -> TypeGuard[tuple[Any, ...]]:
    """A tuple is factors unless it is score rows: every entry a number or a flat list / tuple of numbers (nested
    tuples of numbers, as a list of rows would be); factors given as lists of lists stay factors, and entries that are
    not matrices are refused by name (``user_factors``, ...)."""
    def row(x: object) -> bool:
        return isinstance(x, Real) or (isinstance(x, (tuple, list)) and all(isinstance(y, Real) for y in x))

    return isinstance(scores, tuple) and not all(row(x) for x in scores)


def per_user_metrics(
    scores: TensorLike | tuple[TensorLike, ...],
    positives: TensorLike,
    metrics: Sequence[str | MetricSpec] = DEFAULT_METRICS,
    exclude: TensorLike | None = None,
    relevance: TensorLike | None = None,
    ties: str = "pessimistic",
    *,
    cumulative: bool = False,
    as_frame: bool = True,
    generator: torch.Generator | None = None,
    check_finite: bool = True,
) -> "pd.DataFrame | dict[str, torch.Tensor]":
    """Per-user metrics straight from a score batch or a factor model, like recometrics' ``calc_reco_metrics(as_df=True)``.

    Args:
        scores: (B, n) scores, or the factors whose product they are, as a tuple ``(user_factors, item_factors)``
            or ``(user_factors, item_factors, item_bias)``: scores ``user_factors @ item_factors.T (+ item_bias)``
            ((B, d), (n, d), (n,)), ranked in cache-sized tiles without storing them
            (:func:`~reco_sampled_plugin.factor_ranks.exact_ranks_from_factors`; NaN/inf factors raise). A tuple of
            flat rows of numbers is score rows, any other tuple factors.
        positives: relevant items, (B, n) bool mask or (B, P) int64 padded with -1.
        metrics: metric names; default: the ten of the catalogue at k = 10.
        exclude: training items to leave out of the ranking.
        relevance: graded relevance for NDCG: (B, n) dense values read at the positives, or (B, P)
            aligned with padded index positives.
        ties: tie policy of :func:`exact_ranks`; with ``"average"`` every metric is its expectation over uniformly
            random orders of each group of tied items (:mod:`~reco_sampled_plugin.tie_expectation`: exact, in
            closed form), e.g. HR@1 = 0.5 for a relevant item tied with one irrelevant item at the top.
            From factors: pessimistic, optimistic or average.
        cumulative: expand every ``metric@k`` into ``metric@1 .. metric@k``.
        as_frame: return a pandas DataFrame (recometrics column names, e.g. ``NDCG@10``, ``ROC_AUC``);
            False returns a dict of (B,) float64 tensors keyed the same way.
        generator: the draws of ``ties="random"``.
        check_finite: raise a ValueError naming the rows with NaN or inf scores (checked inside the
            counting pass; nearly free). Factors are always checked.

    On CUDA, with index tensors, a call whose shapes were seen before is replayed from a CUDA graph (one launch; the
    same values; docs/gpu.md, "Calls replayed from CUDA graphs").
    """
    specs = _expand(metrics, cumulative)
    as_frame = check_bool(as_frame, "as_frame")
    check_finite = check_bool(check_finite, "check_finite")
    kernel_ties = _kernel_ties(ties)
    check_generator(generator)
    if _is_factors(scores):  # factors: (B, d) and (n, d) matrices (a tuple of (n,) tensors is refused)
        from .factor_ranks import (capture_factor_inputs, check_factors, factor_tensors, queued_factor_ranks,
                                   ranks_and_index_from_factors)

        if len(scores) not in (2, 3):
            raise ValueError(f"scores: a tuple is (user_factors, item_factors) or (user_factors, item_factors, "
                             f"item_bias), got {len(scores)} entries")
        user_factors, item_factors, item_bias = check_factors(*scores)
        n = _check_cutoffs(specs, int(item_factors.shape[0]))
        inputs = (capture_factor_inputs(user_factors, item_factors, item_bias, positives, exclude)
                  if specs and relevance is None and ties != "random" else None)
        if inputs is not None:  # CUDA: replayed from a CUDA graph where the shapes repeat (:mod:`._graphs`)
            has = (item_bias is not None, exclude is not None)

            def queued(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                ranks, pos, exc, checks = queued_factor_ranks(*factor_tensors(tensors, *has), kernel_ties, True)
                values = _metrics_from_ranks(specs, ranks, pos, exc, n, None)
                return torch.stack(list(values.values())), check_flags(checks)

            stacked, flags = _graphs.run("per_user_metrics_factors", (tuple(specs), kernel_ties, has), queued, inputs)
            out = _replayed(specs, stacked, flags, as_frame)
            if out is not None:
                return out
        ranks, pos, exc = ranks_and_index_from_factors(user_factors, item_factors, positives, exclude, kernel_ties,
                                                       item_bias=item_bias)
        return _finish(_metrics_from_ranks(specs, ranks, pos, exc, n, relevance), [], as_frame)
    inputs = (capture_inputs(scores, positives, exclude) if specs and relevance is None and generator is None
              and ties != "random" else None)
    if inputs is not None:
        # an accelerator: the call replayed from a CUDA graph where its shapes repeat (:mod:`._graphs`)
        notes: list[tuple[str, str]] = []

        def queued(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            values, checks = _metrics_queued(specs, tensors[0], tensors[1], tensors[2] if len(tensors) > 2 else None,
                                             kernel_ties, None, check_finite)
            notes[:] = [(c.name, c.message) for c in checks]
            return torch.stack(list(values.values())), check_flags(checks)

        stacked, flags = _graphs.run("per_user_metrics", (tuple(specs), kernel_ties, check_finite), queued, inputs,
                                     notes)
        out = _replayed(specs, stacked, flags, as_frame, notes)
        if out is not None:
            return out
    values, checks = _metrics_queued(specs, scores, positives, exclude, kernel_ties, generator, check_finite, relevance)
    return _finish(values, checks, as_frame)


def _replayed(specs: Sequence[MetricSpec], stacked: torch.Tensor, flags: torch.Tensor, as_frame: bool,
              named: Sequence[tuple[str, str]] = ()) -> "pd.DataFrame | dict[str, torch.Tensor] | None":
    """A replayed call's (len(specs), B) values as returned, its checks' ``flags`` read (with a frame's copy to the
    host; a dict's kept unread inside a ``deferred_checks`` block, ``named`` their checks); None where a check is set
    (the caller runs the call eagerly for its error or its other path)."""
    values = {spec.column: v for spec, v in zip(specs, stacked.unbind(0))}
    if not as_frame:
        return None if not defer_flags(flags, named) and any(flags.tolist()) else values
    return _frame(values, flags)


def _metrics_queued(specs: Sequence[MetricSpec], scores: Any, positives: Any, exclude: Any, kernel_ties: str,
                    generator: torch.Generator | None, check_finite: bool,
                    relevance: TensorLike | None = None) -> tuple[dict[str, torch.Tensor], list[Check]]:
    """:func:`per_user_metrics`' work on scores queued and its checks not read: the index checks deferred (out-of-range
    entries ranked as padding meanwhile) and the NaN/inf rows of the counting pass, for one read after the work."""
    scores = score_tensor(scores)
    n = _check_cutoffs(specs, scores.shape[1])
    ranks, pos, exc, pending = queued_exact_ranks(scores, positives, exclude, kernel_ties, True, generator,
                                                  check_finite)
    if relevance is not None:  # validated after the inputs' checks (their errors first)
        run_checks(pending)
        pending = []
    return _metrics_from_ranks(specs, ranks, pos, exc, n, relevance), pending


def _finish(values: dict[str, torch.Tensor], checks: list[Check], as_frame: bool) -> "pd.DataFrame | dict[str, torch.Tensor]":
    """The values as returned, their checks read: with a frame's copy to the host, or at once for a dict (inside a
    ``deferred_checks`` block: at its end)."""
    if not as_frame:
        defer_checks(checks)
        return values
    if not checks:
        return _frame(values, None)
    flags = check_flags(checks)
    frame = _frame(values, flags)
    if frame is None:  # a check failed: its error
        run_checks(checks)
        frame = _frame(values, None)
    return frame


def _frame(values: dict[str, torch.Tensor], flags: torch.Tensor | None) -> "pd.DataFrame | None":
    """A DataFrame of the per-user ``values`` (one copy to the host, with ``flags`` if given: None where one is set)."""
    try:
        import pandas as pd
    except ImportError as exc:  # pragma: no cover - depends on the environment
        raise ImportError("per_user_metrics(as_frame=True) needs pandas: pip install pandas (from a clone: pip install '.[pandas]')") from exc
    names = list(values)
    cols = [values[name].detach().reshape(-1) for name in names]
    parts = cols + ([flags.to(torch.float64)] if flags is not None else [])
    if not parts:
        return pd.DataFrame({})
    host = torch.cat(parts).cpu().numpy()  # one copy to the host for the frame (and the checks' flags)
    if flags is not None:
        if host[len(host) - flags.numel():].any():
            return None
        host = host[: len(host) - flags.numel()]
    if not names:
        return pd.DataFrame({})
    return pd.DataFrame(host.reshape(len(names), -1).T, columns=names)


def _metrics_from_ranks(specs: Sequence[MetricSpec], ranks: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n: int,
                        relevance: TensorLike | None) -> dict[str, torch.Tensor]:
    """The per-user values of ``specs`` from padded exact ranks (other positives competing), or from (B, P, 2)
    tie groups [lo, hi] (``ties="average"``: expectations over the orders of tied items)."""
    b = pos.shape[0]
    n_cand = padded_candidate_counts(n, pos, exc)
    rel = None
    if relevance is not None:
        rel = real_tensor(relevance, "relevance", "a bool mask or non-negative relevance weights", booleans=True).to(ranks.device)
        if rel.shape == (b, n):
            rel = rel.gather(1, pos.clamp(min=0)).masked_fill(pos < 0, 0)
    bounds = ranks if ranks.dim() == 3 else None
    if bounds is not None:
        ranks = bounds[..., 0]
    if rel is not None:  # the ranks and counts come from exact_ranks: valid by construction, only relevance is checked
        rel = _check_relevance(rel, ranks)
    if bounds is not None:
        result = {spec.column: expected_metric_values(spec, bounds[..., 0], bounds[..., 1], n_cand, rel, max_position=n)
                  for spec in specs}
    else:
        sorted_ranks = SortedRanks(ranks, n_cand, rel)
        result = {spec.column: values_from_sorted(spec, sorted_ranks) for spec in specs}
    return result


def mean_metrics(values: "pd.DataFrame | Mapping[str, TensorLike]") -> dict[str, tuple[float, int, int]]:
    """Mean of each metric over users with a defined value: {name: (mean, n_used, n_nan)}.

    ``values`` is a DataFrame or dict of per-user values from :func:`per_user_metrics`.
    """
    if not (isinstance(values, dict) or hasattr(values, "columns")):
        raise ValueError(f"values: expected a DataFrame or dict of per-user values (per_user_metrics), got "
                         f"{type(values).__name__}")
    items = list(values.items() if isinstance(values, dict) else ((c, values[c]) for c in values.columns))
    if not items:
        return {}
    cols = [real_tensor(v if isinstance(v, torch.Tensor) else getattr(v, "to_numpy", lambda: v)(), f"values[{k!r}]")
            .to(torch.float64) for k, v in items]
    device = cols[0].device
    stats = []
    for t in cols:  # per metric (B,) values: mean over the defined ones, nothing read back yet
        t = t.reshape(-1).to(device)
        ok = ~torch.isnan(t)
        used = ok.sum()
        mean = torch.where(ok, t, torch.zeros_like(t)).sum() / used  # NaN when no user has a value
        stats.append(torch.stack([mean, used.to(torch.float64), (t.numel() - used).to(torch.float64)]))
    host = torch.stack(stats).tolist()  # one synchronisation for every metric
    return {name: (m if used else math.nan, int(used), int(nan)) for (name, _), (m, used, nan) in zip(items, host)}
