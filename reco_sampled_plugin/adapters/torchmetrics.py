"""torchmetrics ``Metric`` classes for exact, sampled and corrected ranking metrics.

Two metrics, usable in a plain torch loop or inside Lightning; their states are sufficient
statistics declared with ``dist_reduce_fx`` "sum" (or "max"), so distributed sync is a sum and
memory does not grow with the number of users:

* :class:`ExactRankingMetrics`: per configured metric the sum and the sum of squares of M(r) over
  relevant items and how many it was defined for (AUC needs an irrelevant candidate), and the number of
  relevant items seen (K x 3 + 1 numbers).
* :class:`SampledRankingMetrics`: the sampled-rank histogram, m + 1 counts per distinct candidate
  count n (one row per n = n_items - e, e = excluded items + other positives of the row), so at most
  n_items x (m + 1) numbers whatever the number of users. At ``compute`` the histogram, which carries the
  design, goes to the one estimation contract (``estimate(metric, histogram, method)``) once per (metric,
  estimator): any registered estimator, by name or as a method object with its options (``Bv(gamma=0.2)``).

A model that is expensive to score: :meth:`SampledRankingMetrics.update_from_scorer` takes a pointwise scorer instead
of the score matrix and scores only the positives and their keyed negatives; the state is the one
``update`` gives on the materialised matrix, and :meth:`~SampledRankingMetrics.scoring_cost` records the calls' cost.

Results are per relevant item (the single-relevant-item form M(r) of the papers): with one held-out
item per user, per user. Negatives are keyed by (seed, instance id, positive item), see
``reco_sampled_plugin/_keyed.py``; pass ``ids`` (user indices) to make results independent of batching and of
the number of processes. Rows with ``keep`` False (e.g. DistributedSampler padding) are not counted.

States are added together (``merge_state``, ``forward``, DDP sync) only when they belong together: the same
catalogue, design, metric list and estimators with their options (``_MergeChecked``); otherwise a ValueError names the first
difference, on every process in DDP.

Nothing counted (no update, every row dropped by ``keep``, or AUC without an irrelevant candidate): ``compute()``
gives NaN, as before any update, and :meth:`estimates` the Estimate (NaN value, NaN stderr, 0 instances) with
the flag ``no_instances``, so an empty state is never mistaken for a number. One relevant item: stderr inf and
the flag ``few_instances``. An estimator that fails at ``compute`` (e.g. a cut-off above the catalogue) warns and
gives NaN with the flag ``estimator_failed`` (the others still run). An estimator's options are those of its method
object (``estimators=("auto", Bv(gamma=0.2))``), checked when the object is built.

Non-finite scores: the default ``check_finite=True`` refuses NaN or inf anywhere in the score matrix, because
a NaN on an irrelevant item silently changes every rank it is compared with (AUC, NDCG...). Measured cost on
1024 x 100,000 float32 scores (2 CPU cores): :class:`ExactRankingMetrics` checks inside its counting pass,
which reads every score anyway: 11.3 ms per update with the check vs 11.4 ms without (free);
:class:`SampledRankingMetrics` on scores only reads m items per relevant item, so the check is one extra pass:
9.7 ms vs 2.1 ms per update (about 5 ms per 1e8 scores, small beside computing them). ``"positives"`` (only the
relevant items' scores: a NaN irrelevant score then goes unnoticed) or ``False`` are opt-in speed for trusted
scores. (The sampled check is now one ``aminmax`` pass, finite iff both ends are, as the core's ``finite_rows``.)

On an accelerator a score or factor update of a fixed-m design never waits for the device (exact; sampled with
replacement, uniform or by popularity; with an exact share): every check of the batch (indices in range, without
duplicates or clashes; finite scores or factors; pools large enough to draw from; factors that could overflow) is a
flag kept on the device in the ``failed_checks`` state (the first failing update per check: :data:`DEFERRED_CHECKS`,
reduced by max, so merged and synced states keep the earliest; cleared by ``reset``), the batch computed on safe
inputs (out-of-range indices read as padding, histogram rows clamped into the state) and never reported: ``compute()``,
``estimates()``, ``histogram()`` and ``popularity_ranks()`` read the flags in one synchronisation and raise the CPU's
ValueError with the check's name and update appended. Data-dependent work still reads: one read per adaptive stage
(which rows go on) and, uniform without replacement, the small pools' width and one duplicate check (popularity
without replacement adds none: a race over every item). On the CPU (``_READS_ON_CPU``) the checks are read at once,
one read per batch: free there, and an immediate error is kinder. Nothing per batch reads a state back: histogram
rows are grown from the batch's shapes (e <= E + P - 1) and filled by an accumulating scatter, and the catalogue size
is checked against the host's record. An exact share adds no read to score and factor batches there (a static
capacity of rows, :func:`share_capacity`; its rare overflow is counted on the device and refused at compute); scorer
batches read their chosen rows. ``exact_at_cap`` adds none to score and factor batches there either: the rows that
drew the cap's stage, known on the host since that stage's read, are ranked exactly (every positive still first at
the cap lies in them; R kept where it is), and a factor batch's overflow bound for their tiles is one more flag; a
design of one stage (cap < 2 m) reads its completed rows once, and scorer batches read them (the calls synchronise
anyway). ``tests/test_gpu_readiness_adapters.py`` counts them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import math
import time
import warnings
from typing import Any, Callable, Iterable, Mapping, NamedTuple, Sequence, TypeVar

import numpy as np
import torch
from torchmetrics import Metric

from reco_sampled_plugin._checks import check_elements, check_int, check_size, real_tensor
from reco_sampled_plugin import _graphs
from reco_sampled_plugin._deferred import DEFERRABLE, earliest_failure, mark_failed, message_at, note_message
from reco_sampled_plugin._inputs import Check, factor_finite_checks, finite_flags, run_checks, score_tensor
from reco_sampled_plugin._keyed import (AdaptiveRanks, DeviceChecks, DrawnScores, FactorScores, MatrixScores, RowKeys,
                                        ScorerScores, keyed_adaptive_ranks, keyed_ranks)
from reco_sampled_plugin._options import check_bool
from reco_sampled_plugin._estimate import Estimate, interval_values
from reco_sampled_plugin import registry
from reco_sampled_plugin._popularity import POP_BINS, PROFILE_FIELDS
from reco_sampled_plugin._rank_hist import RankHistogram
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin import estimators  # the contract, estimators._estimate (to be renamed estimate)
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin._types import TensorLike
from reco_sampled_plugin.ranking import SampledRanks
from reco_sampled_plugin.metrics import metric_from_float_ranks as _metric_from_float_ranks  # patched by name in tests
from reco_sampled_plugin.factor_ranks import (capture_factor_inputs, check_factors, factor_ranks_padded, factor_tensors,
                                              overflow_flag, overflow_rows, score_limit)
from reco_sampled_plugin.ranking import (TIE_BOUNDS, capturable_index, capture_inputs, complete_at_cap,
                                         padded_candidate_counts, exact_ranks_padded, exact_ranks_padded_finite,
                                         prepare_index)
from reco_sampled_plugin.scorer_ranks import (DEFAULT_MAX_PAIRS, Scorer, ScorerCalls, ScoringCost, check_scorer,
                                              check_users, complete_from_scorer, full_ranking_pairs)
from reco_sampled_plugin._share import ShareRows, keyed_choice
from reco_sampled_plugin.adaptive import completion_targets
from reco_sampled_plugin.tie_expectation import expected_single_item_values

from ._shared import (
    RankingSettings,
    adaptive_columns,
    adaptive_histogram_from_rows,
    completed_histogram_from_rows,
    explain_once,
    histogram_from_rows,
    metric_key,
    padded_inputs,
    stderr_from_sums,
)

logger = logging.getLogger(__name__)

__all__ = ["RankingSettings", "ExactRankingMetrics", "SampledRankingMetrics", "estimate_values"]

# the ``pop`` state's columns (popularity designs): one row per relevant item
# (then pl_fit's class counts: POP_BINS columns each of the profile, beat_bins and miss_bins; then the positive's
# own popularity weight, pl_fit's strata)
_POP_COLUMNS = ("sampled_rank", "n_candidates", "hh_s1", "hh_s2", "hh_beating", "hh_unreachable") + tuple(
    f"{f}_{c}" for f in PROFILE_FIELDS for c in range(POP_BINS)) + ("positive_weight",)
_POP_CLASS_AT = 6  # the first class-count column
_POP_WEIGHT_AT = _POP_CLASS_AT + len(PROFILE_FIELDS) * POP_BINS  # the positive's weight
# with a (uniform) exact share, two more columns in the same row: the positive's exact rank R (0: not chosen) and
# its inclusion probability pi, so the share lines up with pl_fit's statistics positive by positive, in any order
_POP_SHARE_COLUMNS = ("exact_rank", "inclusion")
# the ``share`` state's columns (an exact share): one row per chosen relevant item (on an accelerator one per slot of
# the rows within the static capacity, exact_rank 0 where not chosen: no read of how many were chosen; dropped at
# compute)
_SHARE_COLUMNS = ("n_candidates", "n_samples", "sampled_rank", "exact_rank", "inclusion")
# the ``completed`` state's columns (``exact_at_cap``): one row per positive still first at the cap, ranked exactly (on
# an accelerator one per slot of the rows that drew the cap's stage, exact_rank 0 where not completed; dropped at
# compute)
_CAP_COLUMNS = ("n_candidates", "exact_rank")
#: On the CPU a read of which rows hold a chosen (an exact share) or completed (``exact_at_cap``) positive costs nothing
#: (no device to wait for): only those rows are ranked and kept. On an accelerator (and on the CPU with this False: how
#: the tests probe the accelerator's path) score and factor batches rank a static set of rows instead, nothing read
#: back: the share a static capacity (:func:`share_capacity`), the completion the rows of the cap's stage (read with
#: that stage already).
_READS_ON_CPU = True
#: The validity checks an update keeps on the device where reads are not free (:func:`defers_checks`: an accelerator, or the
#: CPU with ``_READS_ON_CPU`` False): ``{name: message}``, the message raised at compute for a state that holds a
#: failed batch (the updating instance's own message, with its numbers, where it has one), in the order reported when
#: two failed at the same update. The ``failed_checks`` state holds one entry per check (:data:`~reco_sampled_plugin._deferred.FIRST` - the first
#: update that failed it, 0: never), reduced by max: merged and synced states keep each check's earliest failure.
DEFERRED_CHECKS: dict[str, str] = {
    **DEFERRABLE,  # the inputs' and the scores' checks, as a deferred_checks block keeps them
    "user_factors_finite": "user_factors: contains NaN or inf; ranks would be meaningless",
    "item_factors_finite": "item_factors: contains NaN or inf; ranks would be meaningless",
    "item_bias_finite": "item_bias: contains NaN or inf; ranks would be meaningless",
    "factors_overflow": "user_factors: |u| |v| (+ |item_bias|) reaches a quarter of the largest value of the "
                        "factors' dtype, where scores could overflow (exact ranks in tiles), or the dot products of "
                        "drawn items overflowed (sampled ranks): scale the factors or give them in float64",
}
_CHECK_SLOT = {name: i for i, name in enumerate(DEFERRED_CHECKS)}
_SCORES_MESSAGE = DEFERRED_CHECKS["scores_finite"]


def defers_checks(device: torch.device) -> bool:
    """Whether an update on ``device`` keeps its validity checks on the device, read at compute (an accelerator: a
    read would wait for it), rather than reading them at once (the CPU: reads are free and an immediate error is
    kinder)."""
    return not (_READS_ON_CPU and torch.device(device).type == "cpu")


def estimate_values(estimates: Mapping[str, Estimate], *, interval: bool = True,
                    stderr: bool = False) -> dict[str, torch.Tensor]:
    """``{key: value}`` of ``{name: Estimate}`` (``name`` ``"ndcg@10/auto"``), with ``<key>_lo`` / ``<key>_hi``
    (``Estimate.interval(0.95)``) and ``<key>_stderr`` (sampling noise only) beside each when asked for (float64
    tensors). ``key`` is the logged key, ``metric_key(name)``: ``ndcg_at_10/auto``, what the Lightning callback logs
    after its stage (``val/ndcg_at_10/auto``), accepted by every logger (MLflow refuses ``@``)."""
    interval, stderr = check_bool(interval, "interval"), check_bool(stderr, "stderr")  # also with no estimates
    out: dict[str, torch.Tensor] = {}
    for name, e in estimates.items():
        k = metric_key(name)
        out[k] = torch.tensor(e.value, dtype=torch.float64)
        for key, v in interval_values(k, e, interval=interval, stderr=stderr).items():
            out[key] = torch.tensor(v, dtype=torch.float64)
    return out


def _empty_estimate(n_instances: float, details: dict) -> Estimate:
    """The Estimate of nothing counted: NaN value and stderr, flagged ``no_instances``."""
    return Estimate(math.nan, math.nan, n_instances, {**details, "flags": ("no_instances",)}, ("no_instances",))


def _with_flag(est: Estimate, flag: str) -> Estimate:
    """``est`` with ``flag`` added (once) to its flags and to ``details["flags"]``."""
    if flag in est.flags:
        return est
    flags = tuple(est.flags) + (flag,)
    return dataclasses.replace(est, flags=flags, details={**dict(est.details), "flags": flags})


def _check_scores(scores: torch.Tensor, pos: torch.Tensor, check_finite: bool | str, checks: DeviceChecks | None = None) -> None:
    """``True``: every score finite (one pass over the matrix); ``"positives"``: the relevant items' scores.

    The failure flag is added to ``checks`` (read later with the batch's other checks: one host synchronisation
    for all of them), or read at once when ``checks`` is None."""
    own = checks is None
    checks = DeviceChecks() if checks is None else checks  # own: read here
    if check_finite is True and scores.numel():
        checks.add(~finite_flags(scores),  # one aminmax pass, no temporary
                   _SCORES_MESSAGE, "scores_finite")
    elif check_finite == "positives" and pos.numel():
        ps = scores.gather(1, pos.clamp(min=0))
        checks.add(~(torch.isfinite(ps) | (pos < 0)).all(),
                   "scores: NaN or inf score for a relevant item; ranks would be meaningless", "scores_finite")
    if own and len(checks):
        checks.read()


def _check_factors_finite(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, checks: DeviceChecks) -> None:
    """NaN or inf factors or bias (then scores would be), as flags in ``checks`` (no synchronisation here)."""
    for flag, message in factor_finite_checks(u, v, bias):
        checks.add(flag, message, f"{message.partition(':')[0]}_finite")


def _check_slots(named: Sequence[Check], none: torch.Tensor) -> tuple[torch.Tensor, list[tuple[str, str]]]:
    """The named checks' flags OR-ed per :data:`DEFERRED_CHECKS` entry, a (len(DEFERRED_CHECKS),) bool on the flags'
    device (``none``, a False there, where no check of an entry ran), nothing read; and each check's (name, message)."""
    device = none.device
    flags: list[torch.Tensor | None] = [None] * len(DEFERRED_CHECKS)
    for c in named:
        i = _CHECK_SLOT[c.name]
        bad = _to(c.bad if c.bad.dim() == 0 else c.bad.reshape(()), device)
        before = flags[i]
        flags[i] = bad if before is None else before | bad
    failed = torch.stack([none if f is None else f.to(torch.bool) for f in flags])
    return failed, [(c.name, c.message or DEFERRED_CHECKS[c.name]) for c in named]


def _captured_flags(named: Sequence[Check], device: torch.device, notes: list[tuple[str, str]]) -> torch.Tensor:
    """Inside a captured update: its checks as :func:`_check_slots`' flags (unread), their (name, message) in
    ``notes``. A check of another name is read at once (none on the captured paths: the read fails the capture,
    which then runs eagerly)."""
    run_checks([c for c in named if c.name not in _CHECK_SLOT])
    failed, notes[:] = _check_slots([c for c in named if c.name in _CHECK_SLOT],
                                    torch.zeros((), dtype=torch.bool, device=device))
    return failed


def _to(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device`` (no call at all when it is there already)."""
    return x if x.device == device else x.to(device)


def _index_like(x: Any, name: str, what: str, device: torch.device) -> torch.Tensor:
    """``x`` (a tensor, numpy array or list) as a tensor on ``device`` (the one conversion, ``_checks.real_tensor``:
    strings, ragged lists, sparse matrices, complex numbers and ``meta`` tensors give a ValueError naming ``name``)."""
    return _to(real_tensor(x, name, what, booleans=True), torch.device(device))


def _check_finite_states(state: Mapping[str, Any]) -> None:
    """A ``metric_state`` dict given to ``merge_state`` holds finite numbers in its floating states (sums, counts,
    histograms): a NaN or inf one would make every output NaN, silently, or fail later naming another argument."""
    floats = [(k, v) for k, v in state.items() if isinstance(v, torch.Tensor) and v.is_floating_point() and v.numel()]
    if not floats:
        return
    bad = torch.stack([(~torch.isfinite(v)).any() for _, v in floats]).tolist()
    for (name, _), nonfinite in zip(floats, bad):
        if nonfinite:
            raise ValueError(f"incoming_state: {name!r} holds NaN or inf")


def _keep_mask(keep: Any, batch: int, device: torch.device) -> torch.Tensor | None:
    if keep is None:
        return None
    k = _index_like(keep, "keep", f"a ({batch},) bool tensor", device)
    if k.dtype != torch.bool or k.shape != (batch,):
        raise ValueError(f"keep: expected a ({batch},) bool tensor, got {tuple(k.shape)} {k.dtype}")
    return k


def _keep_on(keep: Any, device: torch.device) -> bool:
    """Whether a batch on ``device`` may be replayed as far as ``keep`` goes: checks deferred there
    (:func:`defers_checks`) and ``keep`` None or a tensor on that device (copied into the graph, checked in it)."""
    return defers_checks(device) and (keep is None or (isinstance(keep, torch.Tensor) and keep.device == device))


def _updated(metric: Metric) -> None:
    """What torchmetrics' wrapped ``update`` does before a batch, for the entry points it does not wrap
    (``update_padded``, ``update_factors_padded``): a cached ``compute()`` result is stale now."""
    metric._computed = None
    metric._update_count += 1


def _pad_rows(hist: torch.Tensor, rows: int) -> torch.Tensor:
    """``hist`` with zero rows appended up to ``rows`` (histogram rows grow as larger exclusions appear)."""
    if hist.shape[0] >= rows:
        return hist
    return torch.cat([hist, hist.new_zeros(rows - hist.shape[0], hist.shape[1])])


def read_exact_ranks(source: DrawnScores, chosen: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None,
                     n_items: int, ties: str, pos_scores: torch.Tensor) -> torch.Tensor:
    """Exact ranks R (among the row's irrelevant candidates and the positive, ``ranking.complete_at_cap``) of the
    ``chosen`` (B, P) positives, 0 elsewhere, reading which rows hold one (one synchronisation): a score matrix's
    rows; a factor model's rows (``factor_ranks_padded``: tiles, never the (B, n) matrix); a scorer's rows scored
    whole (``scorer_ranks.complete_from_scorer``, their pairs in the calls' count). :func:`rows_exact_ranks`
    is the form without a read. The exact share's chosen positives and ``exact_at_cap``'s completed ones alike."""
    if isinstance(source, MatrixScores):
        scores = source.scores
        return complete_at_cap(chosen, pos, exc, n_items, ties, None, lambda idx: scores[idx])
    if isinstance(source, FactorScores):
        out = torch.zeros(chosen.shape, dtype=torch.int64, device=chosen.device)
        rows = chosen.any(1).nonzero().squeeze(1)
        if rows.numel():
            r, _ = factor_ranks_padded(source.u[rows], source.v, source.bias, pos[rows],
                                       None if exc is None else exc[rows], ties, False)
            out[rows] = torch.where(chosen[rows], r.to(torch.int64), 0)
        return out
    assert isinstance(source, ScorerScores)
    return complete_from_scorer(source.calls, chosen, pos, exc, source.users, pos_scores, n_items, ties, None)


def share_capacity(rows: int, slots: int, share: float) -> int:
    """The rows of a batch a static-shape exact share ranks: ``min(B, ceil(T s + 6 sqrt(T s (1 - s)) + 8))`` for B
    rows of T = B P slots and share s. The rows holding a chosen positive number at most the chosen slots,
    Binomial(V, s) for V <= T valid ones, so they exceed the capacity with probability at most the Binomial(T, s)
    tail beyond 6 standard deviations + 8: below 1e-9 per batch for every T and s (computed with scipy's
    ``binom.sf``: largest 9.1e-10, at T = 10^6 and s = 0.17; the normal tail at 6 sigma, 9.9e-10, bounds it as T
    grows). An overflow is counted and refused at compute (``SampledRankingMetrics``: never silently dropped)."""
    mean = slots * share
    return min(rows, math.ceil(mean + 6.0 * math.sqrt(mean * (1.0 - share)) + 8.0))


def share_capacity_rows(chosen: torch.Tensor, share: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(picked (k,) int64 row indices, overflow 0-dim int64) of a (B, P) ``chosen`` mask, nothing read back: the
    :func:`share_capacity` k rows, those holding a chosen positive first, in row order (a stable sort of the rows'
    flags), and 1 when more rows than k hold one (the rows past k then go unranked: refused at compute)."""
    b, p = chosen.shape
    k = share_capacity(b, b * p, share)
    held = chosen.any(1)
    picked = torch.sort((~held).to(torch.uint8), stable=True).indices[:k]
    return picked, (held.sum() > k).to(torch.int64)


def rows_exact_ranks(source: DrawnScores, picked: torch.Tensor, chosen: torch.Tensor, pos: torch.Tensor,
                     exc: torch.Tensor | None, ties: str) -> torch.Tensor:
    """:func:`read_exact_ranks` of the ``picked`` rows only ((k, P) int64: R where ``chosen``, 0 elsewhere), from a
    score matrix's rows or a factor model's (tiles; the overflow bound is the batch's validation flag,
    :func:`tile_factor_check`), nothing read back."""
    exc_k = None if exc is None else exc[picked]
    if isinstance(source, MatrixScores):
        r = exact_ranks_padded(source.scores[picked], pos[picked], exc_k, ties, False)
    else:
        assert isinstance(source, FactorScores)
        r, _ = factor_ranks_padded(source.u[picked], source.v, source.bias, pos[picked], exc_k, ties, False,
                                   bounded=True)
    return torch.where(chosen[picked], r.to(torch.int64), 0)


def tile_factor_check(source: FactorScores, picked: Any, chosen: torch.Tensor, checks: DeviceChecks,
                      what: str = "the exact share") -> None:
    """The overflow bound ``factor_ranks_padded`` reads, for the ``picked`` rows (an index tensor or a slice) holding
    a ``chosen`` positive, as a flag of the batch's one validation read: refused where a score of theirs could
    overflow (``factor_ranks.overflow_rows``, or a bias of ``score_limit`` or more), since the tiles' scores are not
    materialized and checked there. ``what`` ranks the rows (named in the message)."""
    big = (overflow_rows(source.u[picked], source.v) & chosen[picked].any(1)).any()
    if source.bias is not None and source.bias.numel():
        big = big | (source.bias.detach().abs().amax().to(torch.float64) >= score_limit(source.u.dtype))
    checks.add(big, f"user_factors: |u| |v| (+ |item_bias|) reaches {score_limit(source.u.dtype):.3g}, where "
                    f"{source.u.dtype} scores could overflow; {what} ranks its rows in tiles on this device: "
                    "scale the factors or give them in float64", "factors_overflow")


def _field_hash(text: str) -> int:
    """A stable 62-bit hash of a configuration field's text (the same in every process, unlike ``hash``)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "little") >> 2


_M = TypeVar("_M", bound="_MergeChecked")


class _ForwardBatchFailed(Exception):
    """``forward``'s own batch failed a deferred check: its ``compute`` gives no value, so that torchmetrics still
    adds the batch's state (its failed flag) to the accumulated one and restores it; ``forward`` then raises."""


class _MergeChecked(Metric):
    """The one compatibility check of every stateful metric class before states are added together
    (``merge_state``, ``forward``'s batch state, DDP sync): a ValueError naming what differs instead of a sum of
    states that do not belong together (a silently wrong estimate, or a RuntimeError from tensor sizes).

    A class lists in :meth:`_merge_fields` the settings its states depend on (``{name: text}``) and in
    :meth:`_check_incoming` checks a state's tensors against its own (shapes, catalogue size).

    Also what both classes share: their settings (:class:`RankingSettings`, checked once when built; a metric of
    settings already built: :meth:`from_settings`) and torchmetrics' class attributes."""

    full_state_update = False
    is_differentiable = False
    higher_is_better = True

    settings: RankingSettings
    failed_checks: torch.Tensor  # per DEFERRED_CHECKS entry: FIRST - the first update that failed it (0: none)
    _in_forward = False  # inside ``forward`` (its reset keeps the host's records)
    _forward_base = 0  # the update count before ``forward``'s batch
    _forward_error: ValueError | None = None  # forward's own batch failed: raised once the state is restored

    def _add_check_state(self) -> None:
        """The ``failed_checks`` state (:data:`DEFERRED_CHECKS`: what an update on an accelerator keeps on the
        device instead of reading it) and the host's record of each failed check's own message."""
        self.add_state("failed_checks", torch.zeros(len(DEFERRED_CHECKS), dtype=torch.int64), dist_reduce_fx="max")
        # per check, (first update, message) each time its message text changed (its numbers: the catalogue size)
        self._check_messages: dict[str, list[tuple[int, str]]] = {}
        self._no_flag: dict[torch.device, torch.Tensor] = {}

    def _update_number(self) -> int:
        """The number of the update in progress (1 for the first after construction or ``reset``), also inside
        ``forward`` (which resets the state for its batch)."""
        return self._forward_base + 1 if self._in_forward else self._update_count

    def _defer_checks(self, checks: Sequence[Check]) -> None:
        """Add a batch's pending checks (``_inputs.Check``, unread) to the ``failed_checks`` state, nothing read
        back: each named one's flag, OR-ed per :data:`DEFERRED_CHECKS` entry, marks this update where it failed
        (the earliest kept). A check of another name is read at once (none on the paths that defer)."""
        now = [c for c in checks if c.name not in _CHECK_SLOT]
        if now:
            run_checks(now)
        if len(now) == len(checks):
            return
        named = [c for c in checks if c.name in _CHECK_SLOT]
        device = named[0].bad.device  # the inputs' device: the flags are combined there, then moved once
        none = self._no_flag.get(device)
        if none is None:  # one False per device, made once
            none = self._no_flag[device] = torch.zeros((), dtype=torch.bool, device=device)
        failed, notes = _check_slots(named, none)
        self._add_failed(failed, notes)

    def _add_failed(self, failed: torch.Tensor, notes: Sequence[tuple[str, str]]) -> None:
        """Mark this update in ``failed_checks`` where ``failed`` (a bool per :data:`DEFERRED_CHECKS` entry) is set,
        and note each check's message (``notes``: (name, message))."""
        for name, message in notes:
            self._note_message(name, message, self._update_number())
        state = self.failed_checks
        self.failed_checks = mark_failed(state, _to(failed, state.device), self._update_number())  # a copy and three

    def _note_message(self, name: str, message: str, update: int) -> None:
        """Record check ``name``'s message from ``update`` on (a new entry only where its text changed)."""
        note_message(self._check_messages, name, message, update)

    def _message(self, name: str, update: int) -> str:
        """The message check ``name`` had at ``update`` (the last recorded at or before it; the generic text where
        none was recorded: e.g. a loaded state)."""
        return message_at(self._check_messages, name, update, DEFERRED_CHECKS[name])

    def _raise_deferred(self) -> None:
        """Raise the ValueError of the earliest failed deferred check (one read of the ``failed_checks`` state),
        naming the check and the first update at which it failed; nothing when none failed."""
        first = earliest_failure(self.failed_checks.tolist(), list(DEFERRED_CHECKS), "update")
        if first is None:
            return
        update, name, also = first
        error = ValueError(f"{self._message(name, update)} [check {name!r}, first failed at "
                         f"update {update}{also}: an update on an accelerator keeps its checks on the device and they "
                         "are read at compute; a state holding a failed batch reports no results until reset()]")
        if self._in_forward:  # forward's batch: refused by forward once torchmetrics restored the accumulated state
            self._forward_error = error
            raise _ForwardBatchFailed
        raise error

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        self._in_forward, self._forward_base = True, self._update_count  # the batch's update number
        self._forward_error = None
        try:
            out = super().forward(*args, **kwargs)
        finally:
            self._in_forward = False
        error, self._forward_error = self._forward_error, None
        if error is not None:  # the batch's state (its flag) is already in the accumulated one, which is kept
            raise error
        return out

    def _compute_or_none(self, values: Callable[[], dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        """``values()``, or nothing for ``forward``'s own batch that failed a deferred check (raised by forward)."""
        try:
            return values()
        except _ForwardBatchFailed:
            return {}

    def reset(self) -> None:
        super().reset()
        if not self._in_forward:  # forward restores the accumulated state (and its failed checks) after the batch
            self._check_messages = {}

    @classmethod
    def from_settings(cls: type[_M], settings: RankingSettings, **kwargs: Any) -> _M:
        """The metric of ``settings`` (checked when they were built; e.g. one object shared with the Lightning
        callback); ``kwargs``: the class's own keywords (``interval``, ``stderr``) and torchmetrics' ``Metric``
        keywords."""
        if not isinstance(settings, RankingSettings):
            raise ValueError(f"settings: expected a RankingSettings, got {type(settings).__name__}")
        metric = cls.__new__(cls)
        metric._build(settings, **kwargs)
        return metric

    def _build(self, settings: RankingSettings, **kwargs: Any) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def _merge_fields(self) -> dict[str, str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def _check_incoming(self, state: Mapping[str, Any]) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def merge_state(self, incoming_state: dict[str, Any] | Metric) -> None:
        """Add another state (a metric of this class, or its ``metric_state`` dict) to this one; refused with a
        ValueError naming the setting or size that differs (a dict carries no settings: its shapes and
        catalogue size are checked)."""
        if isinstance(incoming_state, Metric) and isinstance(incoming_state, type(self)):
            mine, theirs = self._merge_fields(), incoming_state._merge_fields()
            differ = [k for k in mine if mine[k] != theirs.get(k)]
            if differ:
                listing = "; ".join(f"{k}: {mine[k]} here, {theirs.get(k)} in the incoming state" for k in differ)
                raise ValueError(f"{differ[0]}: cannot merge states of differently configured "
                                 f"{type(self).__name__} ({listing})")
        if isinstance(incoming_state, Mapping):  # a bare dict: its values checked too (one read; never per batch)
            _check_finite_states(incoming_state)
        super().merge_state(incoming_state)
        if isinstance(incoming_state, _MergeChecked):  # the other state's own messages of its failed checks
            for name, told in incoming_state._check_messages.items():  # (at an update both record: this one's)
                kept = self._check_messages.setdefault(name, [])
                recorded = {first for first, _ in kept}
                kept.extend(entry for entry in told if entry[0] not in recorded)
                kept.sort(key=lambda entry: entry[0])

    def _reduce_states(self, incoming_state: dict[str, Any]) -> None:
        self._validate_incoming(incoming_state)
        super()._reduce_states(incoming_state)
        self._forget_computed()

    def _forget_computed(self) -> None:
        """Drop torchmetrics' cached ``compute()`` result after another state was added or loaded (its
        ``merge_state`` and state loading keep it), so that the next ``compute()`` reads the new state and its
        failed checks; ``forward`` drops it itself after its batch."""
        if not self._in_forward:
            self._computed = None

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._forget_computed()
        self._check_messages = {}  # the loaded state's updates are not this one's: its checks' generic messages

    def _validate_incoming(self, incoming_state: Any) -> None:
        """The incoming state has this class's state names, as tensors, and passes :meth:`_check_incoming`."""
        if not isinstance(incoming_state, Mapping) or set(incoming_state) != set(self._defaults):
            keys = sorted(incoming_state) if isinstance(incoming_state, Mapping) else type(incoming_state).__name__
            raise ValueError(f"incoming_state: expected the states {sorted(self._defaults)} of "
                             f"{type(self).__name__}, got {keys}")
        bad = [k for k, v in incoming_state.items() if not isinstance(v, torch.Tensor)]
        if bad:
            raise ValueError(f"incoming_state: {bad[0]!r} must be a tensor, got {type(incoming_state[bad[0]]).__name__}")
        if incoming_state["failed_checks"].shape != self.failed_checks.shape:
            raise ValueError(f"incoming_state: 'failed_checks' has shape {tuple(incoming_state['failed_checks'].shape)}, "
                             f"this one {tuple(self.failed_checks.shape)} (one entry per deferred check)")
        self._check_incoming(incoming_state)

    def _sync_sizes(self) -> list[tuple[str, int]]:
        """Sizes that must agree across processes, 0 where this process has nothing (e.g. no batch yet)."""
        return []

    def _check_sync(self, process_group: Any = None) -> None:
        """Before a DDP sync: every process's settings (:meth:`_merge_fields`) and sizes (:meth:`_sync_sizes`)
        agree, else the same ValueError on every process (one small all-reduce, no hang)."""
        import torch.distributed as dist

        fields = self._merge_fields()
        sizes = self._sync_sizes()
        big = 1 << 62
        values = [_field_hash(v) for v in fields.values()] + [v for _, v in sizes]
        lows = [-v for v in values[: len(fields)]] + [-(v if v > 0 else big) for _, v in sizes]
        device = getattr(self, next(iter(self._defaults))).device
        t = torch.tensor(values + lows, dtype=torch.int64, device=device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX, group=process_group or self.process_group)
        hi, lo = t[: len(values)].tolist(), [-v for v in t[len(values):].tolist()]
        names = list(fields) + [name for name, _ in sizes]
        # a setting differs where its hashes do; a size where the processes that counted something disagree
        differ = [name for i, (name, a, b) in enumerate(zip(names, hi, lo)) if a != b and (i < len(fields) or a > 0)]
        if differ:
            raise ValueError(f"{differ[0]}: the processes' {type(self).__name__} states differ in {differ} and "
                             "cannot be synced; configure every process alike (one catalogue, one design)")


class ExactRankingMetrics(_MergeChecked):
    """Exact (full-catalogue) ranking metrics, averaged over relevant items.

    Args:
        metrics: names such as ``"ndcg@10"``, ``"recall@10"``, ``"mrr"``, ``"auc"``.
        ties: ``"pessimistic"`` (default), ``"optimistic"`` or ``"average"``.
        count_other_positives: False (default) ranks each relevant item among the irrelevant
            candidates only (the quantity sampled metrics estimate; the same as True with one
            held-out item per user); True ranks it among all candidates, the other positives included.
        check_finite: True (default: every score, checked inside the counting pass that reads them all, at
            no measurable cost), ``"positives"`` (the relevant items' scores only: a NaN or inf irrelevant score
            then silently shifts ranks) or False (no check). See the module docstring for the measured cost.

    ``update(scores, positives, exclude=None, keep=None)``, or ``update_factors(user_factors,
    item_factors, positives, exclude=None, keep=None, item_bias=None)`` for a factor model (scores in
    cache-sized tiles, never stored); ``compute()`` returns
    ``{"<metric key>/exact": float64 tensor}`` (``ndcg_at_10/exact``, the logged key); :meth:`estimates` returns :class:`Estimate` objects with
    standard errors. The options are those of :class:`RankingSettings` (``from_settings`` takes them as one
    object); :attr:`settings` holds them.
    """

    # torchmetrics states (``add_state``)
    sums: torch.Tensor
    count: torch.Tensor

    def __init__(
        self,
        metrics: str | Iterable[str] = ("ndcg@10", "recall@10"),
        *,
        ties: str = "pessimistic",
        count_other_positives: bool = False,
        check_finite: bool | str = True,
        **kwargs: Any,
    ) -> None:
        self._build(RankingSettings(metrics, None, ties=ties, count_other_positives=count_other_positives,
                                    check_finite=check_finite), **kwargs)

    def _build(self, settings: RankingSettings, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.settings = settings
        self.specs = tuple(parse_metric(m) for m in self.settings.metric_names)
        # per metric: sum of M(r), sum of M(r)^2, number of relevant items it is defined for
        self.add_state("sums", torch.zeros(len(self.specs), 3, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("count", torch.zeros((), dtype=torch.float64), dist_reduce_fx="sum")
        self._add_check_state()

    def update(self, scores: torch.Tensor, positives: TensorLike, exclude: TensorLike | None = None,
               keep: torch.Tensor | None = None) -> None:
        """Add a batch: (B, n) scores, positives and exclusions (bool masks or padded indices); tensors, numpy arrays
        or lists. On CUDA, index tensors of shapes seen before are added by a replayed CUDA graph (docs/gpu.md)."""
        scores = score_tensor(scores)
        inputs = capture_inputs(scores, positives, exclude) if _keep_on(keep, scores.device) else None
        if inputs is not None:  # CUDA, index inputs: replayed from a CUDA graph where the batch's shapes repeat
            self._update_captured(inputs + (() if keep is None else (keep,)), exclude is not None,
                                  has_keep=keep is not None)
            return
        pending: list[Check] | None = [] if defers_checks(scores.device) else None
        pos, exc = padded_inputs(scores, positives, exclude, pending)
        self._update_padded(scores, pos, exc, keep, pending)

    def _update_captured(self, inputs: tuple[torch.Tensor, ...], has_exclude: bool, prepared: bool = False,
                         has_keep: bool = False, bias: bool | None = None) -> torch.Tensor | None:
        """:meth:`update` of index inputs (``prepared``: :meth:`update_padded`'s validated padded ones, and a keep mask
        last where ``has_keep``) on a device that defers its checks, as one call that :mod:`._graphs` replays: the
        batch's sums, count and failed checks computed from the inputs alone (nothing read, no state touched), then
        added to the states (five operators). ``bias`` not None: the inputs are factors (u, v[, bias], positives[,
        exclusions]: :meth:`update_factors`), their NaN/inf flags and overflow bound among the checks (the item
        norm computed in the graph, never the cached one); returns the positives' scores (None for scores)."""
        notes: list[tuple[str, str]] = []

        def batch(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            keep = _keep_mask(tensors[-1], tensors[0].shape[0], tensors[0].device) if has_keep else None
            ranks, pos, exc, named, n_items, extra = self._captured_ranks(tensors[:len(tensors) - has_keep],
                                                                          has_exclude, prepared, bias)
            sums, count = self._rank_sums(ranks, pos, exc, n_items, keep)
            failed = _captured_flags(named, tensors[0].device, notes)
            return (sums, count, failed) + (extra if prepared else ())  # the positives' scores: update_factors_padded

        options = ("exact_update", self.specs, self._kernel_ties, self.settings.count_other_positives,
                   self.settings.check_finite, has_exclude, prepared, has_keep, bias)
        sums, count, failed, *extra = _graphs.run("ExactRankingMetrics.update", options, batch, inputs, notes)
        self._add_failed(failed, notes)
        self._add_sums(sums, count)
        return extra[0] if extra else None

    def _captured_ranks(self, tensors: Sequence[torch.Tensor], has_exclude: bool, prepared: bool, bias: bool | None) \
            -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[Check], int, tuple[torch.Tensor, ...]]:
        """(ranks, padded positives, padded exclusions, the checks unread, n_items, (the positives' scores,) for
        factors) of a captured batch (:meth:`_update_captured`)."""
        pending: list[Check] = []
        if bias is None:
            scores, exclude = tensors[0], tensors[2] if has_exclude else None
            pos, exc = (tensors[1], exclude) if prepared else padded_inputs(scores, tensors[1], exclude, pending)
            ranks, checks = self._deferred_ranks(scores, pos, exc)
            return ranks, pos, exc, pending + checks, scores.shape[1], ()
        u, v, b, pos, exc = factor_tensors(tensors, bias, has_exclude)
        if not prepared:
            pos, exc = prepare_index(pos, exc, u.shape[0], v.shape[0], u.device, pending=pending)
        flags = DeviceChecks(defer=True)
        _check_factors_finite(u, v, b, flags)
        flags.add(overflow_flag(u, v, b, cached=False), DEFERRED_CHECKS["factors_overflow"], "factors_overflow")
        ranks, s_pos = factor_ranks_padded(u, v, b, pos, exc, self._kernel_ties, self.settings.count_other_positives,
                                           bounded=True)
        assert s_pos is not None  # bounded: the tiles ranked, never materialized scores
        return ranks, pos, exc, pending + flags.pending(), v.shape[0], (s_pos,)

    def update_padded(self, scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None,
                      keep: torch.Tensor | None = None) -> None:
        """:meth:`update` on validated padded index tensors (as from ``_shared.padded_inputs``)."""
        _updated(self)
        inputs = capture_inputs(scores, pos, exc) if _keep_on(keep, scores.device) else None
        if inputs is not None:
            self._update_captured(inputs + (() if keep is None else (keep,)), exc is not None, True, keep is not None)
            return
        self._update_padded(scores, pos, exc, keep, [] if defers_checks(scores.device) else None)

    def _update_padded(self, scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None,
                       keep: torch.Tensor | None, pending: list[Check] | None = None) -> None:
        """``pending`` (a list, the inputs' unread checks: where :func:`defers_checks`): the scores' checks join them in the
        ``failed_checks`` state, nothing read back; None: every check read at once."""
        if not scores.is_floating_point() or scores.dim() != 2:
            raise ValueError(f"scores: expected a floating (B, n) matrix, got {tuple(scores.shape)} {scores.dtype}")
        ties = self._kernel_ties
        cop = self.settings.count_other_positives
        if pending is not None:
            ranks, checks = self._deferred_ranks(scores, pos, exc)
            self._add_ranks(ranks, pos, exc, scores.shape[1], keep)
            self._defer_checks(pending + checks)
            return
        if self.settings.check_finite is True:  # in the counting pass, which reads every score anyway (free)
            ranks = exact_ranks_padded(scores, pos, exc, ties, cop, check_finite=True)
        else:
            _check_scores(scores, pos, self.settings.check_finite)  # "positives": one read; False: nothing
            ranks = exact_ranks_padded(scores, pos, exc, ties, cop)
        self._add_ranks(ranks, pos, exc, scores.shape[1], keep)

    def _deferred_ranks(self, scores: torch.Tensor, pos: torch.Tensor,
                        exc: torch.Tensor | None) -> tuple[torch.Tensor, list[Check]]:
        """A batch's ranks and the scores' checks, unread (a device that defers its checks): the counting pass's finite
        rows (``check_finite=True``) or ``check_finite``'s own check."""
        ties, cop = self._kernel_ties, self.settings.count_other_positives
        checks = DeviceChecks(defer=True)
        if self.settings.check_finite is True:  # the counting pass's finite rows, unread
            ranks, finite = exact_ranks_padded_finite(scores, pos, exc, ties, cop, None, True, False)
            if finite is not None:
                checks.add(~finite.all(), _SCORES_MESSAGE, "scores_finite")
        else:
            _check_scores(scores, pos, self.settings.check_finite, checks)
            ranks = exact_ranks_padded(scores, pos, exc, ties, cop)
        return ranks, checks.pending()

    def update_factors(self, user_factors: TensorLike, item_factors: TensorLike, positives: TensorLike,
                       exclude: TensorLike | None = None, keep: torch.Tensor | None = None,
                       item_bias: TensorLike | None = None) -> None:
        """:meth:`update` for the scores ``user_factors @ item_factors.T (+ item_bias)``, computed in
        cache-sized tiles and never stored (:func:`~reco_sampled_plugin.exact_ranks_from_factors`);
        NaN/inf factors raise."""
        u, v, bias = check_factors(user_factors, item_factors, item_bias)
        inputs = capture_factor_inputs(u, v, bias, positives, exclude) if _keep_on(keep, u.device) else None
        if inputs is not None:  # CUDA, index inputs: replayed from a CUDA graph where the batch's shapes repeat
            _updated(self)
            self._update_captured(inputs + (() if keep is None else (keep,)), exclude is not None,
                                  has_keep=keep is not None, bias=bias is not None)
            return
        pending: list[Check] | None = [] if defers_checks(u.device) else None
        pos, exc = prepare_index(positives, exclude, u.shape[0], v.shape[0], u.device, pending=pending)
        self._update_factors(u, v, bias, pos, exc, keep, pending)

    def update_factors_padded(self, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, pos: torch.Tensor,
                              exc: torch.Tensor | None, keep: torch.Tensor | None = None) -> torch.Tensor | None:
        """:meth:`update_factors` on validated inputs; returns the positives' scores (for sampled ranks)."""
        inputs = capture_factor_inputs(u, v, bias, pos, exc) if _keep_on(keep, u.device) else None
        if inputs is not None:
            _updated(self)
            return self._update_captured(inputs + (() if keep is None else (keep,)), exc is not None, True,
                                         keep is not None, bias is not None)
        return self._update_factors(u, v, bias, pos, exc, keep, [] if defers_checks(u.device) else None)

    def _update_factors(self, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, pos: torch.Tensor,
                        exc: torch.Tensor | None, keep: torch.Tensor | None,
                        pending: list[Check] | None) -> torch.Tensor | None:
        """``pending`` None: the factors checked by the overflow bound's read (``factor_ranks_padded``); a list
        (where :func:`defers_checks`): their NaN/inf flags and the bound (``factor_ranks.overflow_flag``: refused where
        scores could overflow, never ranked on materialized scores instead) join the ``failed_checks`` state, the
        scores ranked in tiles, nothing read back."""
        _updated(self)
        ties, cop = self._kernel_ties, self.settings.count_other_positives
        if pending is None:
            ranks, s_pos = factor_ranks_padded(u, v, bias, pos, exc, ties, cop)
        else:
            checks = DeviceChecks(defer=True)
            _check_factors_finite(u, v, bias, checks)
            checks.add(overflow_flag(u, v, bias), DEFERRED_CHECKS["factors_overflow"], "factors_overflow")
            ranks, s_pos = factor_ranks_padded(u, v, bias, pos, exc, ties, cop, bounded=True)
            pending = pending + checks.pending()
        self._add_ranks(ranks, pos, exc, v.shape[0], keep)
        if pending is not None:
            self._defer_checks(pending)
        return s_pos

    @property
    def _kernel_ties(self) -> str:
        """``average``: the ranking kernels return each positive's tie group [lo, hi] (metrics = expectations)."""
        return TIE_BOUNDS if self.settings.ties == "average" else self.settings.ties

    def _add_ranks(self, ranks: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                   keep: torch.Tensor | None) -> None:
        """Add a batch's :meth:`_rank_sums` to the states."""
        self._add_sums(*self._rank_sums(ranks, pos, exc, n_items, keep))

    def _add_sums(self, sums: torch.Tensor, count: torch.Tensor) -> None:
        self.sums += _to(sums, self.sums.device)
        self.count += _to(count, self.count.device)

    def _rank_sums(self, ranks: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                   keep: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
        """A batch's (len(metrics), 3) sums (of M(r), of M(r)^2, the relevant items counted) and its count of
        relevant items, over the valid slots as masked sums over every slot: no boolean indexing, nothing read back.
        ``ranks``: (B, P), or (B, P, 2) tie groups [lo, hi] for ``ties="average"`` (each M(r) is then its mean
        over the group's positions: the expectation over the orders of the tie)."""
        bounds = ranks if ranks.dim() == 3 else None
        if bounds is not None:
            ranks = bounds[..., 0]
        n = padded_candidate_counts(n_items, pos, exc, self.settings.count_other_positives)
        valid = pos >= 0
        k = _keep_mask(keep, pos.shape[0], pos.device)
        if k is not None:
            valid = valid & k.unsqueeze(1)
        # padded slots get a harmless rank 1 of 2 candidates (then weight 0): no inf or NaN to mask
        r = torch.where(valid, ranks.to(torch.float64), 1.0)  # in 1..n by construction
        nn = torch.where(valid, n.unsqueeze(1).to(torch.float64), 2.0)
        w = valid.to(torch.float64)
        values, weights = [], []
        if bounds is not None:
            hi = torch.where(valid, bounds[..., 1].to(torch.float64), 1.0)
        for spec in self.specs:
            if bounds is None:
                values.append(_metric_from_float_ranks(spec, r, nn))  # a cut-off k >= n is defined: [r <= k]
            else:
                values.append(expected_single_item_values(spec, r, hi, nn, max_position=n_items))
            weights.append(w * (nn > 1) if spec.kind == "auc" else w)  # AUC needs an irrelevant candidate
        # every metric's (sum, sum of squares, weight) in one set of reductions (a fixed number of kernels, not one
        # set per metric); a left-out slot's value (AUC of n = 1 is 0/0) must not reach the sums
        wk = torch.stack(weights)
        v = torch.where(wk > 0, torch.stack(values), 0.0)
        return torch.stack([v.sum((1, 2)), (v * v).sum((1, 2)), wk.sum((1, 2))], 1), w.sum()

    def _merge_fields(self) -> dict[str, str]:
        return {"metrics": repr(self.settings.metric_names), "ties": repr(self.settings.ties),
                "count_other_positives": repr(self.settings.count_other_positives)}

    def _check_incoming(self, state: Mapping[str, Any]) -> None:
        if state["sums"].shape != self.sums.shape or state["count"].numel() != 1:
            raise ValueError(f"metrics: the incoming state holds sums of shape {tuple(state['sums'].shape)}, this one "
                             f"{tuple(self.sums.shape)} (one row per metric of {self.settings.metric_names})")

    def _sync_dist(self, dist_sync_fn: Callable | None = None, process_group: Any = None) -> None:
        """Check that every process is configured alike (:meth:`_check_sync`), then let torchmetrics sum."""
        self._check_sync(process_group)
        if dist_sync_fn is None:
            super()._sync_dist(process_group=process_group)
        else:
            super()._sync_dist(dist_sync_fn, process_group)

    def _estimates(self) -> dict[str, Estimate]:
        self._raise_deferred()
        sums = self.sums.detach().cpu().tolist()
        out = {}
        for name, (s1, s2, count) in zip(self.settings.metric_names, sums):
            details = {"method": "exact", "metric": name}
            if count <= 0:
                out[f"{name}/exact"] = _empty_estimate(count, details)
            elif count <= 1:  # one relevant item: no spread to measure
                out[f"{name}/exact"] = Estimate(s1 / count, math.inf, count, {**details, "flags": ("few_instances",)},
                                                ("few_instances",), metric_range=(0.0, 1.0))
            else:  # every metric of the catalogue lies in [0, 1]: so does its interval
                out[f"{name}/exact"] = Estimate(s1 / count, stderr_from_sums(s1, s2, count), count, details,
                                                metric_range=(0.0, 1.0))
        return out

    def estimates(self) -> dict[str, Estimate]:
        """``{"<metric>/exact": Estimate}`` over everything seen (synced across processes)."""
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=True):
            return self._estimates()

    def compute(self) -> dict[str, torch.Tensor]:
        """``{"<metric key>/exact": value}`` (``ndcg_at_10/exact``: the logged key, ``metric_key``)."""
        return self._compute_or_none(lambda: {metric_key(k): torch.tensor(e.value, dtype=torch.float64)
                                              for k, e in self._estimates().items()})


class _Ranked(NamedTuple):
    """A batch's ranks (``SampledRankingMetrics._rank_batch``): ``ranks`` (B, P) r~; ``sizes`` (B, P) the final m of
    an adaptive design (None for a fixed m); ``stats`` the popularity statistics (popularity designs with replacement,
    else None); ``pos_scores`` (B, P) the positives' scores; ``completed`` the ``completed`` state's rows of an
    ``exact_at_cap`` design (else None)."""

    ranks: torch.Tensor
    sizes: torch.Tensor | None
    stats: Any
    pos_scores: torch.Tensor
    completed: torch.Tensor | None = None


class SampledRankingMetrics(_MergeChecked):
    """Sampled metrics (m irrelevant items per relevant item) and their corrected estimates.

    Args:
        metrics, n_samples, estimators, seed, ties, max_n_groups, check_finite: the settings of
            :class:`RankingSettings` (:attr:`settings` holds them; ``from_settings`` takes them as one object).
            Popularity designs (``SamplingDesign(m, popularity=w)``: keyed inverse-cdf draws, from scores, factors
            or a scorer alike) also keep each relevant item's Hansen-Hurwitz statistics, one row per relevant item
            concatenated across processes, which the registry's popularity estimators read (``hh`` for AUC;
            docs/popularity.md); with a uniform exact share each row also holds the positive's exact rank (0 where
            not chosen) and pi, read in one canonical order (:meth:`popularity_ranks`), and ``auto`` / ``diff``
            correct ``pl_fit``'s predictions on the share. Without replacement (``replacement=False``: a keyed
            exponential race, successive sampling as the core draws it) no such statistics exist (as in the
            core): the histogram is the state, and only ``none`` estimates (the other estimators are refused when
            built).
            Adaptive designs (``SamplingDesign(m, adaptive_max=cap)``, ``reco_sampled_plugin.adaptive``): a
            relevant item ranked first among its m draws draws m more (keyed per stage) until it is not first or m
            would exceed the cap; estimators that take them: ``registry.names(adaptive=True)`` (``auto``, the
            default, among them); the state becomes one row per n of sum over stages of (new draws + 1) counts (about
            ``adaptive_max`` numbers per distinct n); each estimate's ``details["adaptive"]`` holds the cost.
            With ``exact_at_cap=True`` the relevant items still first at the cap are then ranked exactly among their
            whole candidate list (score batches: the rows at hand; factor batches: the rows' scores in tiles; scorer
            batches: the rows scored whole, ``scorer_ranks.complete_from_scorer``) and kept one row each (n, R) in
            the ``completed`` state, concatenated across processes: 16 bytes per completed item (the share at the
            cap, ``details["adaptive"]["share_at_cap"]``, of the relevant items; on an accelerator one row per
            slot of the rows that drew the cap's stage, R = 0 where not completed, dropped at compute). The
            estimators that read exact groups (``mle``, ``mes``, ``gmod``, ``auto``) get the histogram with the
            completed items at R (``completed_histogram_from_rows``: the core's ``SampledRanks.histogram()``);
            ``none`` their r~, as in the core.
            A (metric, estimator) pair the registry does not list (``registry.names(metric=...)``: ``hh`` estimates
            AUC only) is not reported. ``ties="average"`` is refused (fractional sampled ranks).
        interval: ``compute()`` also returns ``"<metric key>/<label>_lo"`` and ``"_hi"``, the 95% interval of each
            estimate (``Estimate.interval(0.95)``: widened where the top is unresolved; default True).
        stderr: ``compute()`` also returns ``"<metric>/<label>_stderr"``, the standard error: sampling noise only
            (default False).

    ``update(scores, positives, exclude=None, ids=None, keep=None)``: ``ids`` (B,) instance ids key
    the negatives (default: a running row counter, which depends on batch order).
    :meth:`update_from_scorer` adds the same batch through a scorer instead of scores (the same keyed draws, only
    the positives and their drawn items scored: the same state); :meth:`scoring_cost` what that cost. ``compute()``
    returns ``{"<metric>/<label>": float64 tensor}`` with the interval's ``_lo`` / ``_hi`` (and ``_stderr`` when
    asked for); :meth:`estimates` the :class:`Estimate` objects (``.interval(0.95)``, ``.flags``);
    :meth:`histogram` the synced :class:`~reco_sampled_plugin.RankHistogram`. An interval widened because the top
    is unresolved is explained once per process (a warning on the ``reco_sampled_plugin`` logger, with the planner
    command).
    """

    # torchmetrics states (``add_state``; ``pop`` for popularity designs with replacement only)
    hist: torch.Tensor
    share: torch.Tensor  # with an exact share only, not under a popularity design (its ``pop`` rows hold the share)
    share_overflow: torch.Tensor  # with an exact share only: batches past the static capacity (0-dim int64)
    completed: torch.Tensor  # exact_at_cap only: (n, R) of each positive completed at the cap
    n_items: torch.Tensor
    pop: torch.Tensor

    def __init__(
        self,
        metrics: str | Iterable[str] = ("ndcg@10", "recall@10"),
        n_samples: int | SamplingDesign = 100,
        estimators: Sequence[str | registry.Method] = ("none", registry.DEFAULT_ESTIMATOR),
        *,
        seed: int = 0,
        ties: str = "pessimistic",
        max_n_groups: int | None = 64,
        check_finite: bool | str = True,
        interval: bool = True,
        stderr: bool = False,
        **kwargs: Any,
    ) -> None:
        self._build(RankingSettings(metrics, n_samples, estimators, exact=False, seed=seed, ties=ties,
                                    max_n_groups=max_n_groups, check_finite=check_finite),
                    interval=interval, stderr=stderr, **kwargs)

    def _build(self, settings: RankingSettings, interval: bool = True, stderr: bool = False, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.interval = check_bool(interval, "interval")
        self.stderr = check_bool(stderr, "stderr")
        if settings.design is None:
            raise ValueError("n_samples: SampledRankingMetrics needs a sampling design; the settings have none "
                             "(n_samples=None)")
        self.settings = settings
        self._design = design = settings.design  # the sampled metrics' design (never None here)
        # popularity: the weights on the host (moved to each batch's device), and a hash for the merge checks
        self._pop_weights = None if design.popularity is None else design.popularity.detach().cpu()
        self._pop_hash = None if self._pop_weights is None else \
            hashlib.sha256(self._pop_weights.numpy().tobytes()).hexdigest()[:16]
        # the per-positive statistics (the ``pop`` state): popularity draws with replacement only (without, the
        # draws are not independent and the core keeps none either: the histogram says everything)
        self._pop_rows = design.popularity is not None and design.replacement
        self._adaptive = design.adaptive  # the stages of an adaptive design (None for a fixed m)
        # rows e = 0.. of m + 1 counts for n = n_items - e; rows are added as larger e appear
        width = self._design.n_samples + 1 if self._adaptive is None else adaptive_columns(self._adaptive)[1]
        self.add_state("hist", torch.zeros(0, width, dtype=torch.float64), dist_reduce_fx="sum")
        self.add_state("n_items", torch.zeros((), dtype=torch.int64), dist_reduce_fx="max")
        self._share = design.exact_share  # a uniform exact share (_shared.check_share_design refuses the others)
        # the ``pop`` rows' columns: with a share, each positive's exact rank and pi beside its statistics
        self._pop_columns = _POP_COLUMNS + (_POP_SHARE_COLUMNS if self._share is not None else ())
        if self._pop_rows:  # per relevant item: r~, n, S1, S2, beating draws, unreachable (concatenated; r~ = 0:
            # a slot not counted, kept by an update that reads nothing, dropped at compute)
            self.add_state("pop", torch.zeros(0, len(self._pop_columns), dtype=torch.float64), dist_reduce_fx="cat")
        # the ``share`` rows (per chosen relevant item: n, m, r~, R, pi; concatenated across processes) where no
        # ``pop`` rows hold the share
        self._share_table = self._share is not None and not self._pop_rows
        if self._share_table:
            self.add_state("share", torch.zeros(0, len(_SHARE_COLUMNS), dtype=torch.float64), dist_reduce_fx="cat")
        if self._share is not None:
            # batches whose chosen rows exceeded the static capacity (share_capacity_rows): refused at compute
            self.add_state("share_overflow", torch.zeros((), dtype=torch.int64), dist_reduce_fx="sum")
        self._at_cap = design.exact_at_cap
        if self._at_cap:  # per completed relevant item: n, R (concatenated across processes)
            self.add_state("completed", torch.zeros(0, len(_CAP_COLUMNS), dtype=torch.float64), dist_reduce_fx="cat")
        self._add_check_state()
        self._rows_seen = 0  # default instance keys when no ids are given
        self._in_forward = False
        self._n_items_host: int | None = 0  # the catalogue size this process's batches had (None: read the state)
        self._offsets: dict = {}
        self._scoring: ScoringCost | None = None  # what update_from_scorer cost (host-side, per process)

    # ------------------------------------------------------------------------------- update
    def update(self, scores: torch.Tensor, positives: TensorLike, exclude: TensorLike | None = None,
               ids: TensorLike | None = None, keep: torch.Tensor | None = None) -> None:
        """Add a batch: (B, n) scores, positives, exclusions, optional instance ids and keep mask; tensors, numpy
        arrays or lists. A batch whose histogram state (a row of the design's m + 1 counts, or adaptive columns, per
        count e <= E + P - 1 of excluded items and other positives) would exceed ``MAX_ELEMENTS`` is a ValueError naming ``n_samples``, raised from the shapes before any
        negative is drawn or ranked (the same for :meth:`update_factors` and :meth:`update_from_scorer`); no state
        changes."""
        scores = score_tensor(scores)
        if self._captures(scores.device, keep):
            inputs = capture_inputs(scores, positives, exclude)
            if inputs is not None and self._update_captured(inputs[:1], inputs[1:], ids, keep=keep):
                return
        pending: list[Check] | None = [] if defers_checks(scores.device) else None
        pos, exc = padded_inputs(scores, positives, exclude, pending)
        self._update_padded(scores, pos, exc, ids, keep, pending)

    def update_padded(self, scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None,
                      ids: TensorLike | None = None, keep: torch.Tensor | None = None) -> None:
        """:meth:`update` on validated padded index tensors."""
        _updated(self)
        if self._captures(scores.device, keep):
            inputs = capture_inputs(scores, pos, exc)
            if inputs is not None and self._update_captured(inputs[:1], inputs[1:], ids, True, keep):
                return
        self._update_padded(scores, pos, exc, ids, keep, [] if defers_checks(scores.device) else None)

    def _captures(self, device: torch.device, keep: Any = None) -> bool:
        """Whether batches on ``device`` may be replayed from CUDA graphs (:mod:`._graphs`): a fixed-m uniform
        design with replacement, an exact share included (its static capacity's rows returned by the graph; adaptive
        stages, popularity rows and draws without replacement read sizes back or keep host-side rows), where checks
        are deferred, ``keep`` None or a tensor there."""
        d = self._design
        return self._adaptive is None and d.popularity is None and d.replacement and _keep_on(keep, device)

    def _update_captured(self, source: tuple[torch.Tensor, ...], index: tuple[torch.Tensor, ...], ids: TensorLike | None,
                         prepared: bool = False, keep: torch.Tensor | None = None,
                         factors: tuple[bool, bool, bool] | None = None, mark: bool = False) -> bool:
        """A batch as one call that :mod:`._graphs` replays (:meth:`_captures`): ``source`` the (B, n) scores, or with
        ``factors`` = (has bias, has the positives' scores, check the factors' finiteness) the factors (u, v[, bias][,
        positives' scores]); ``index`` the positives[, exclusions] (``prepared``: validated padded ones); ``keep`` a
        mask on their device. The batch's histogram increment (its rows x columns counts) and failed checks are
        computed from these and the instance ids alone (nothing read, no state touched), then added to the states.
        The host's checks (catalogue size, the histogram's rows) run first; False where they refuse the batch (the
        eager path then raises as it would, told not to count the update again), nothing else changed. ``mark``:
        count the update first (:func:`_updated`: the entry points torchmetrics does not wrap), as their eager path
        does. An input refused inside the call (its shapes or dtypes, checked where the eager path checks them before
        it changes anything) leaves the host's counters as they were (the update uncounted unless ``prepared``)."""
        saved = (self._n_items_host, self._rows_seen, self._update_count)
        if mark:
            _updated(self)
        has_exclude = len(index) == 2
        b, device = index[0].shape[0], index[0].device
        n_items = source[1].shape[0] if factors else source[0].shape[1]
        self._check_n_items(n_items)
        try:
            rows = self._check_hist_rows(index[0], index[1] if has_exclude else None, n_items, None)
        except ValueError:
            return False
        width, n_src = self.hist.shape[1], len(source)
        notes: list[tuple[str, str]] = []

        def batch(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
            checks = DeviceChecks(defer=True)
            drawn, pos, exc = self._captured_source(tensors[:n_src], tensors[n_src:n_src + 1 + has_exclude], factors,
                                                    prepared, n_items, checks)
            keys = RowKeys.of(self.settings.seed, tensors[n_src + 1 + has_exclude], device)
            kept = _keep_mask(tensors[-1], b, device) if keep is not None else None
            plan = self._share_plan(drawn, pos, keys, kept, checks)  # an exact share: its static capacity's rows
            ranked = self._rank_batch(drawn, pos, exc, n_items, keys, checks, None, kept)
            n_cand = padded_candidate_counts(n_items, pos, exc, count_other_positives=False)
            idx, w = self._hist_cells(ranked.ranks, n_cand, pos, kept, None, rows, n_items)
            increment = torch.zeros(rows * width, dtype=torch.float64, device=device)
            increment.index_put_((idx,), w.to(torch.float64), accumulate=True)
            out = (increment.view(rows, width), _captured_flags(checks.pending(), device, notes))
            shared = self._share_rows(drawn, ranked, plan, pos, exc, n_items)
            if shared is None:
                return out
            assert shared[1] is not None  # a static capacity (checks deferred): its overflow flag, never read
            return out + (shared[0], shared[1])

        settings, share = self.settings, self._share
        options = ("sampled_update", self._design.n_samples, settings.seed, settings.ties, settings.check_finite,
                   factors, has_exclude, prepared, keep is not None, rows, width,
                   None if share is None else (share.share, share.seed))
        try:
            key = self._ids(ids, b, device).to(torch.int64)
            increment, failed, *shared = _graphs.run("SampledRankingMetrics.update", options, batch,
                                                     source + index + (key,) + (() if keep is None else (keep,)), notes)
        except Exception:
            self._n_items_host, self._rows_seen = saved[:2]
            if mark and not prepared:
                self._update_count = saved[2]
            raise
        self._add_failed(failed, notes)
        self.n_items = torch.full((), n_items, dtype=torch.int64, device=self.n_items.device)  # as eagerly: always
        self._grow_hist(rows)
        (self.hist if rows == self.hist.shape[0] else self.hist[:rows]).add_(_to(increment, self.hist.device))
        if shared:  # the exact share's rows (every slot of the picked rows) and its capacity's overflow flag
            self.share = torch.cat([self.share, _to(shared[0], self.share.device)])
            self.share_overflow += _to(shared[1], self.share_overflow.device)
        return True

    def _captured_source(self, source: Sequence[torch.Tensor], index: Sequence[torch.Tensor],
                         factors: tuple[bool, bool, bool] | None, prepared: bool, n_items: int,
                         checks: DeviceChecks) -> tuple[DrawnScores, torch.Tensor, torch.Tensor | None]:
        """(drawn-score source, padded positives, padded exclusions) of a captured batch (:meth:`_update_captured`),
        the inputs' and the scores' (or factors') checks added to ``checks``, unread."""
        pending: list[Check] = []
        exclude = index[1] if len(index) == 2 else None
        if factors is None:
            scores = source[0]
            pos, exc = (index[0], exclude) if prepared else padded_inputs(scores, index[0], exclude, pending)
            checks.include(pending)
            _check_scores(scores, pos, self.settings.check_finite, checks)
            return MatrixScores(scores), pos, exc
        has_bias, has_pos_scores, finite = factors
        u, v = source[0], source[1]
        bias = source[2] if has_bias else None
        if prepared:
            pos, exc = index[0], exclude
        else:
            pos, exc = prepare_index(index[0], exclude, u.shape[0], n_items, u.device, pending=pending)
        checks.include(pending)
        if finite:
            _check_factors_finite(u, v, bias, checks)
        return FactorScores(u, v, bias, source[-1] if has_pos_scores else None), pos, exc

    def _update_padded(self, scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, ids: TensorLike | None,
                       keep: torch.Tensor | None, pending: list[Check] | None = None) -> None:
        """``pending``: the inputs' unread checks where :func:`defers_checks` (the batch's checks join them in the
        ``failed_checks`` state, nothing read back), None where the batch's checks are read at once."""
        if not scores.is_floating_point() or scores.dim() != 2:
            raise ValueError(f"scores: expected a floating (B, n) matrix, got {tuple(scores.shape)} {scores.dtype}")
        b, n_items = scores.shape
        self._check_n_items(n_items)
        checks = DeviceChecks(defer=pending is not None)  # every check of the batch, read back once (or deferred)
        checks.include(pending or [])  # the inputs' checks first (the order they are read and reported in)
        _check_scores(scores, pos, self.settings.check_finite, checks)
        keys = RowKeys.of(self.settings.seed, self._ids(ids, b, scores.device), scores.device)
        if self._pop_weights is not None and self._pop_weights.shape[0] != n_items:
            raise ValueError(f"n_samples: the design's popularity weights count {self._pop_weights.shape[0]} "
                             f"items, the scores {n_items}")
        self._add_batch(MatrixScores(scores), pos, exc, n_items, keys, keep, checks)
        if pending is not None:
            self._defer_checks(checks.pending())

    def _add_batch(self, source: DrawnScores, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, keys: RowKeys,
                   keep: torch.Tensor | None, checks: DeviceChecks | None, slots: torch.Tensor | None = None) -> None:
        """Rank a batch against its keyed negatives, scored by ``source`` (:meth:`_rank_batch`), and add it to the
        state (:meth:`_add_ranked`)."""
        self._check_hist_rows(pos, exc, n_items, checks)  # a state too large is refused before any draw
        plan = self._share_plan(source, pos, keys, keep, checks)
        if self._at_cap and isinstance(source, FactorScores) and checks is not None and self._static_completion(source, pos):
            tile_factor_check(source, slice(None), pos >= 0, checks, "exact_at_cap")  # any row may reach the cap
        ranked = self._rank_batch(source, pos, exc, n_items, keys, checks, slots, keep)
        self._add_ranked(ranked, pos, exc, n_items, keep, self._share_rows(source, ranked, plan, pos, exc, n_items))

    def _share_plan(self, source: DrawnScores, pos: torch.Tensor, keys: RowKeys, keep: torch.Tensor | None,
                    checks: DeviceChecks | None) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None] | None:
        """(chosen, picked, overflow) of a batch, before it is ranked (None without a share): ``chosen`` (B, P) the
        valid, kept positives whose keyed uniform of (share seed, instance id, item) lies below the share
        (``_share.keyed_choice``, as the core's draws choose); ``picked`` and ``overflow`` the static capacity's
        rows and overflow flag (:func:`share_capacity_rows`) where nothing may be read back (score and factor
        batches on an accelerator; a factor batch's overflow bound joins ``checks``), both None where the chosen
        rows are read: on the CPU (free there), and for scorer batches everywhere (the scorer loop synchronises at
        every call anyway, for its timing and checks, and a static capacity would score up to twice the rows)."""
        share = self._share
        if share is None:
            return None
        valid = pos >= 0
        k = _keep_mask(keep, pos.shape[0], pos.device)
        if k is not None:
            valid = valid & k.unsqueeze(1)
        chosen = valid & keyed_choice(share.seed, keys.ids, pos, share.share)
        if isinstance(source, ScorerScores) or not defers_checks(pos.device):
            return chosen, None, None
        picked, overflow = share_capacity_rows(chosen, share.share)
        if isinstance(source, FactorScores) and checks is not None:
            tile_factor_check(source, picked, chosen, checks)
        return chosen, picked, overflow

    def _share_rows(self, source: DrawnScores, ranked: _Ranked, plan: tuple | None, pos: torch.Tensor,
                    exc: torch.Tensor | None, n_items: int) -> tuple[torch.Tensor, torch.Tensor | None] | None:
        """(the ``share`` state's rows (:data:`_SHARE_COLUMNS`), the overflow flag or None) of a ranked batch and
        its :meth:`_share_plan` (None without a share): the chosen positives ranked exactly, by
        :func:`read_exact_ranks` (then only their rows are kept) or, with a static capacity, by
        :func:`rows_exact_ranks` (then every slot of the picked rows, R = 0 where not chosen). With ``pop``
        rows (a popularity design), the (B, P) exact ranks instead (0 where not chosen; the picked rows' scattered
        back, nothing read): each positive's ``pop`` row takes its own (:meth:`_add_popularity`)."""
        if plan is None:
            return None
        chosen, picked, overflow = plan
        ranks, sizes, pos_scores = ranked.ranks, ranked.sizes, ranked.pos_scores
        ties = self.settings.ties
        n = padded_candidate_counts(n_items, pos, exc, count_other_positives=False).unsqueeze(1).expand(pos.shape)
        m = torch.full_like(ranks, self._design.n_samples) if sizes is None else sizes
        if picked is None:
            exact = read_exact_ranks(source, chosen, pos, exc, n_items, ties, pos_scores)
            if not self._share_table:
                return torch.where(chosen, exact, 0), None
        else:
            exact = rows_exact_ranks(source, picked, chosen, pos, exc, ties)
            if not self._share_table:
                return torch.zeros(pos.shape, dtype=torch.int64, device=pos.device).index_copy(0, picked, exact), \
                    overflow
            chosen, n, m, ranks = chosen[picked], n[picked], m[picked], ranks[picked]
        f64 = torch.float64
        assert self._share is not None
        rows = torch.stack([n.to(f64), m.to(f64), ranks.to(f64), torch.where(chosen, exact, 0).to(f64),
                            torch.full(chosen.shape, self._share.share, dtype=f64, device=chosen.device)],
                           -1).reshape(-1, len(_SHARE_COLUMNS))
        return (rows[chosen.reshape(-1)], None) if picked is None else (rows, overflow)

    def _rank_batch(self, source: DrawnScores, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                    keys: RowKeys, checks: DeviceChecks | None, slots: torch.Tensor | None = None,
                    keep: torch.Tensor | None = None) -> _Ranked:
        """The ranks of a batch (:class:`_Ranked`): the design's first stage
        (:func:`~reco_sampled_plugin._keyed.keyed_ranks`), then an adaptive design's later stages
        (:func:`~reco_sampled_plugin._keyed.keyed_adaptive_ranks`) and an ``exact_at_cap`` design's completion
        (:meth:`_completed_rows`). ``checks``: the batch's pending validation flags, read once after the first
        stage's draw (without replacement: with the small-pool sizes); None: each draw reads its own. ``slots``: the
        slots to rank (default every positive); ``keep``: the rows counted (the others are not completed)."""
        ties = self.settings.ties
        first = keyed_ranks(source, pos, exc, n_items, self._design, keys, ties, slots=slots, checks=checks)
        if checks is not None:
            checks.read()  # the batch's one validation read
        if self._adaptive is None:
            return _Ranked(first.ranks, None, first.stats, first.pos_scores)
        stages = keyed_adaptive_ranks(source, pos, exc, n_items, first, self._adaptive, keys, ties)
        completed = None
        if self._at_cap:
            completed = self._completed_rows(source, stages, first.pos_scores, pos, exc, n_items, keep)
        return _Ranked(stages.ranks, stages.sizes, None, first.pos_scores, completed)

    def _static_completion(self, source: DrawnScores, pos: torch.Tensor) -> bool:
        """Whether an ``exact_at_cap`` batch completes the rows of the cap's stage without a read (score and factor
        batches on an accelerator, designs of more than one stage) rather than reading the completed rows."""
        assert self._adaptive is not None
        return len(self._adaptive.stages) > 1 and not isinstance(source, ScorerScores) and defers_checks(pos.device)

    def _completed_rows(self, source: DrawnScores, stages: AdaptiveRanks, pos_scores: torch.Tensor, pos: torch.Tensor,
                        exc: torch.Tensor | None, n_items: int, keep: torch.Tensor | None) -> torch.Tensor:
        """The ``completed`` state's rows (:data:`_CAP_COLUMNS`: n, R) of the kept positives still first at the cap
        (``adaptive.completion_targets``), ranked exactly among their rows' candidates. Read where a read is free or
        made anyway (the CPU, scorer batches, a design of one stage): only the completed rows, by
        :func:`read_exact_ranks`; else every slot of the cap stage's rows (read with that stage), by
        :func:`rows_exact_ranks` (R = 0 where not completed; a factor batch's overflow bound was in its validation
        read), nothing read back."""
        assert self._adaptive is not None  # exact_at_cap designs are adaptive
        need = completion_targets(stages.ranks, stages.sizes, self._adaptive)
        k = _keep_mask(keep, pos.shape[0], pos.device)
        if k is not None:
            need = need & k.unsqueeze(1)
        n = padded_candidate_counts(n_items, pos, exc, count_other_positives=False).unsqueeze(1).expand(pos.shape)
        if stages.last is None or not self._static_completion(source, pos):
            exact = read_exact_ranks(source, need, pos, exc, n_items, self.settings.ties, pos_scores)
            return torch.stack([n[need], exact[need]], 1).to(torch.float64)
        picked = stages.last
        exact = rows_exact_ranks(source, picked, need, pos, exc, self.settings.ties)
        return torch.stack([n[picked], exact], -1).to(torch.float64).reshape(-1, len(_CAP_COLUMNS))

    def _add_ranked(self, ranked: _Ranked, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                    keep: torch.Tensor | None, shared: tuple[torch.Tensor, torch.Tensor | None] | None = None) -> None:
        """Add :meth:`_rank_batch`'s ranks to the histogram (which refuses the batch whole before any change), then
        the popularity statistics and the exact share's rows (:meth:`_share_rows`: in the ``share`` state, or in the
        ``pop`` rows under a popularity design) and the completed rows (nothing half-written)."""
        n_cand = padded_candidate_counts(n_items, pos, exc, count_other_positives=False)
        self._add_ranks(ranked.ranks, n_cand, pos, exc, n_items, keep, ranked.sizes)
        if ranked.stats is not None:
            self._add_popularity(ranked.ranks, n_cand, ranked.stats, pos, keep, None if shared is None else shared[0])
        if shared is not None:
            if self._share_table:
                self.share = torch.cat([self.share, _to(shared[0], self.share.device)])
            if shared[1] is not None:
                self.share_overflow += _to(shared[1], self.share_overflow.device)
        if ranked.completed is not None:
            self.completed = torch.cat([self.completed, _to(ranked.completed, self.completed.device)])

    def update_factors(self, user_factors: TensorLike, item_factors: TensorLike, positives: TensorLike,
                       exclude: TensorLike | None = None, ids: TensorLike | None = None, keep: torch.Tensor | None = None,
                       item_bias: TensorLike | None = None) -> None:
        """:meth:`update` for the scores ``user_factors @ item_factors.T (+ item_bias)`` without forming
        them: the keyed negatives (the same items as from scores) are scored by one dot product each."""
        u, v, bias = check_factors(user_factors, item_factors, item_bias)
        finite = bool(self.settings.check_finite)
        counted = False
        if self._captures(u.device, keep):
            inputs = capture_factor_inputs(u, v, bias, positives, exclude)
            source = (u, v) + (() if bias is None else (bias,))
            if inputs is not None:
                if self._update_captured(source, inputs[len(source):], ids, keep=keep,
                                         factors=(bias is not None, False, finite), mark=True):
                    return
                counted = True
        pending: list[Check] | None = [] if defers_checks(u.device) else None
        pos, exc = prepare_index(positives, exclude, u.shape[0], v.shape[0], u.device, pending=pending)
        self._update_factors(u, v, bias, pos, exc, ids, keep, None, finite, pending, counted)

    def _add_popularity(self, ranks: torch.Tensor, n_cand: torch.Tensor, stats: Any, pos: torch.Tensor,
                        keep: torch.Tensor | None, exact: torch.Tensor | None = None) -> None:
        """Append the valid, kept slots' (r~, n, S1, S2, beating draws, unreachable, then ``pl_fit``'s class counts
        and the positive's weight; with an exact share, ``exact`` (B, P) its exact rank R, 0 where not chosen, and
        pi) to the ``pop`` state (one row per relevant item; the DDP sync concatenates the processes' rows). Where the
        batch's checks stay on the device (:func:`defers_checks`) nothing is read: every one of the B x P slots gets
        a row, those not counted (padding, ``keep`` False) with r~ = 0, dropped at compute (as a sync's padding
        rows); else the counted rows only (a boolean selection: one read)."""
        valid = pos >= 0
        k = _keep_mask(keep, pos.shape[0], pos.device)
        if k is not None:
            valid = valid & k.unsqueeze(1)
        if defers_checks(pos.device):  # a fixed block of B x P rows: no compaction (a nonzero: a read on CUDA)
            ranks = torch.where(valid, ranks, torch.zeros_like(ranks))

            def take(x: torch.Tensor) -> torch.Tensor:
                return x.reshape(-1, *x.shape[2:])
        else:
            def take(x: torch.Tensor) -> torch.Tensor:
                return x[valid]
        n = n_cand.view(-1, 1).expand(pos.shape)
        share: list[torch.Tensor] = []
        if exact is not None:
            assert self._share is not None
            pi = torch.full(exact.shape, self._share.share, dtype=torch.float64, device=exact.device)
            share = [take(torch.stack([exact.to(torch.float64), pi], -1))]
        cols = torch.cat([take(torch.stack([ranks.to(torch.float64), n.to(torch.float64), stats.inv_q, stats.inv_q2,
                                            stats.beating, stats.unreachable.to(torch.float64)], -1))]
                         + [take(getattr(stats, f)).to(torch.float64) for f in PROFILE_FIELDS]
                         + [take(stats.positive_weight).to(torch.float64).unsqueeze(1)] + share, 1)
        self.pop = torch.cat([self.pop, _to(cols, self.pop.device)])

    def popularity_ranks(self) -> SampledRanks:
        """The state's relevant items as the :class:`~reco_sampled_plugin.ranking.SampledRanks` of the popularity
        design, carrying each one's Hansen-Hurwitz statistics (synced across processes); what the registry's
        popularity estimators read (``estimate(metric, sampled, method=...)``), in one canonical order (the rows
        sorted by every column: the same bits, so the same estimates, whatever the batches, the merge order or the
        processes); with an exact share also each one's ``share_ranks`` (R, 0 where not chosen) and ``inclusion``,
        read from the same row. Draws without replacement carry none (as the core's ``sampled_ranks``): one
        positive per count of the histogram, in its cell order."""
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=True):
            self._raise_deferred()
            return self._popularity_ranks()

    def _popularity_ranks(self) -> SampledRanks:
        from reco_sampled_plugin._popularity import PopularityStats
        from reco_sampled_plugin._sampled import ranks_of_histogram
        from reco_sampled_plugin.ranking import SampledRanks

        if not self._pop_rows:  # without replacement: the unpooled histogram's positives
            rows = self.hist.detach().to("cpu", torch.float64).numpy()
            return ranks_of_histogram(histogram_from_rows(rows, int(self.n_items), self._design.n_samples,
                                                          None)[0], self._design)

        if self._share is not None:
            self._check_share_overflow()
        rows = self.pop.detach().to("cpu", torch.float64).numpy()
        rows = rows[rows[:, 0] > 0]  # the slots not counted (r~ = 0: an accelerator's fixed blocks) dropped
        t = torch.from_numpy(np.ascontiguousarray(rows[np.lexsort(rows.T[::-1])]))  # canonical order: every column
        counts = t[:, _POP_CLASS_AT:_POP_WEIGHT_AT].reshape(-1, len(PROFILE_FIELDS), POP_BINS).to(torch.float32)
        profile, beat_bins, miss_bins = counts.unbind(1)  # PROFILE_FIELDS' order
        stats = PopularityStats(t[:, 4], t[:, 2], t[:, 3], t[:, 5].to(torch.int64), profile, beat_bins, miss_bins,
                                t[:, _POP_WEIGHT_AT])
        at = _POP_WEIGHT_AT + 1  # an exact share's columns (R, pi), when the design has one
        share = (t[:, at].to(torch.int64), t[:, at + 1].clone()) if self._share is not None else (None, None)
        return SampledRanks(t[:, 0], t[:, 1], None, self._design, popularity_stats=stats, share_ranks=share[0],
                            inclusion=share[1])

    def update_factors_padded(self, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, pos: torch.Tensor,
                              exc: torch.Tensor | None, ids: TensorLike | None = None, keep: torch.Tensor | None = None,
                              pos_scores: torch.Tensor | None = None, check_finite: bool = False) -> None:
        """:meth:`update_factors` on validated inputs (``pos_scores``: the positives' dot-product scores
        when already computed, e.g. by :meth:`ExactRankingMetrics.update_factors_padded`; ``check_finite``: also
        refuse NaN or inf factors, in the batch's one validation read)."""
        counted = False
        if self._captures(u.device, keep) and capturable_index(u.device, pos, exc, rows=u.shape[0]) and (
                pos_scores is None or pos_scores.device == u.device):
            source = (u, v) + tuple(t for t in (bias, pos_scores) if t is not None)
            index = (pos,) + (() if exc is None else (exc,))
            if self._update_captured(source, index, ids, True, keep,
                                     (bias is not None, pos_scores is not None, check_finite), True):
                return
            counted = True
        self._update_factors(u, v, bias, pos, exc, ids, keep, pos_scores, check_finite,
                             [] if defers_checks(u.device) else None, counted)

    def _update_factors(self, u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, pos: torch.Tensor,
                        exc: torch.Tensor | None, ids: TensorLike | None, keep: torch.Tensor | None,
                        pos_scores: torch.Tensor | None, check_finite: bool, pending: list[Check] | None,
                        counted: bool = False) -> None:
        """:meth:`update_factors_padded`; ``pending`` as in :meth:`_update_padded`; ``counted``: the update was counted
        already (a capture that the host's checks refused)."""
        if not counted:
            _updated(self)
        b, n_items = u.shape[0], v.shape[0]
        self._check_n_items(n_items)
        checks = DeviceChecks(defer=pending is not None)
        checks.include(pending or [])  # the inputs' checks first (the order they are read and reported in)
        if check_finite:
            _check_factors_finite(u, v, bias, checks)
        keys = RowKeys.of(self.settings.seed, self._ids(ids, b, u.device), u.device)
        self._add_batch(FactorScores(u, v, bias, pos_scores), pos, exc, n_items, keys, keep, checks)
        if pending is not None:
            self._defer_checks(checks.pending())

    def update_from_scorer(self, scorer: Scorer, positives: TensorLike, n_items: int, exclude: TensorLike | None = None,
                           ids: TensorLike | None = None, users: TensorLike | None = None,
                           keep: torch.Tensor | None = None, max_pairs: int = DEFAULT_MAX_PAIRS) -> None:
        """Add a batch through a scorer, never a score matrix: the keyed negatives :meth:`update` would
        draw for these ``ids`` (fixed m, with or without replacement, adaptive stages), but only the positives
        and their drawn items are scored, by ``scorer(users, items) -> scores`` (users (B',) int64, items (B', L)
        int64 on the positives' device; (B', L) real scores back there, higher = better; pointwise), in calls of
        at most ``max_pairs`` pairs. Adaptive stages score only the positives still ranked first, their new items
        alone. The state is the one :meth:`update` on the materialised (B, n_items) matrix gives (tested).

        Args:
            scorer: the scorer (see :mod:`reco_sampled_plugin.scorer_ranks`).
            positives, exclude, ids, keep: as in :meth:`update`.
            n_items: n, the catalogue size (no score matrix to read it from).
            users: (B,) int64 user ids handed to the scorer (default: the instance ids, ``ids`` or the running
                row counter). Rows with ``keep`` False are not scored.
            max_pairs: at most this many (user, item) pairs per scorer call.

        ``check_finite`` (True or ``"positives"``) refuses NaN or inf among the scores the scorer returns (False: no
        check). A scorer that raises or returns the wrong type, shape, dtype or device is a ValueError naming it
        and the call's rows (``scorer_ranks.ScorerCalls``); the state (and the row counter) is then left as it was.
        What the calls cost accumulates in :meth:`scoring_cost`."""
        t0 = time.perf_counter()
        check_scorer(scorer)
        max_pairs = check_int(max_pairs, "max_pairs", minimum=1)
        n = check_size(n_items, "n_items", 1)
        device = positives.device if isinstance(positives, torch.Tensor) else self.hist.device
        given = _index_like(positives, "positives", "a (B, n) bool mask or (B, P) item indices", device)
        b = given.shape[0] if given.dim() else 1
        pos, exc = prepare_index(given, exclude, b, n, device)
        k = _keep_mask(keep, b, device)
        saved = (self._rows_seen, self._n_items_host)
        try:  # nothing reaches the state (or the row counter) unless every call succeeds
            self._check_n_items(n)
            keys = RowKeys.of(self.settings.seed, self._ids(ids, b, device), device)
            who = keys.ids if users is None else check_users(users, b, device)
            calls = ScorerCalls(scorer, max_pairs, self.settings.check_finite is not False, device)
            score = None if k is None else k.unsqueeze(1).expand_as(pos)
            # each draw reads its own pool check, before any call; adaptive stages score only the positives still
            # first, their new items alone
            source = ScorerScores(calls, who)
            self._check_hist_rows(pos, exc, n, None)  # a state too large is refused before any scorer call
            plan = self._share_plan(source, pos, keys, keep, None)
            ranked = self._rank_batch(source, pos, exc, n, keys, None, score, keep)
            shared = self._share_rows(source, ranked, plan, pos, exc, n)  # the chosen rows scored whole
            _updated(self)
            self._add_ranked(ranked, pos, exc, n, keep, shared)
        except BaseException:
            self._rows_seen, self._n_items_host = saved
            raise
        rows = (pos >= 0).any(1) if k is None else (pos >= 0).any(1) & k
        stages = 1 if self._adaptive is None else len(self._adaptive.stages)
        stages += int(ranked.completed is not None and ranked.completed.shape[0] > 0)  # the completion's rows scored
        spent = time.perf_counter() - t0
        cost = ScoringCost(calls.pairs, calls.calls, calls.seconds, max(spent - calls.seconds, 0.0),
                           full_ranking_pairs(n, exc, rows), stages)
        self._scoring = cost if self._scoring is None else self._scoring + cost

    def scoring_cost(self, sync: bool = False) -> ScoringCost:
        """What :meth:`update_from_scorer` cost since construction or the last ``reset`` (a
        :class:`~reco_sampled_plugin.scorer_ranks.ScoringCost`: pairs scored, scorer calls, seconds inside and
        outside the scorer, the pairs full ranking would have scored, adaptive stages run). Per process and per
        instance (``merge_state`` and ``forward`` do not add costs); ``sync=True`` sums it over the processes of
        an initialised ``torch.distributed`` group (every process must call it; seconds then are summed process
        time, stages the largest)."""
        cost = self._scoring or ScoringCost(0, 0, 0.0, 0.0, 0, 0)
        sync = check_bool(sync, "sync")
        import torch.distributed as dist

        if not (sync and dist.is_available() and dist.is_initialized()):
            return cost
        group = self.process_group
        t = torch.tensor([cost.pairs, cost.calls, cost.scorer_seconds, cost.loop_seconds, cost.full_pairs],
                         dtype=torch.float64, device=self.hist.device)
        st = torch.tensor([cost.stages], dtype=torch.int64, device=self.hist.device)
        dist.all_reduce(t, group=group)
        dist.all_reduce(st, op=dist.ReduceOp.MAX, group=group)
        v = t.tolist()
        return ScoringCost(int(v[0]), int(v[1]), v[2], v[3], int(v[4]), int(st.item()))

    def _check_n_items(self, n_items: int) -> None:
        """Every batch has the same catalogue. The host keeps the size it saw (no read of the device state per
        batch); only a state it did not fill itself (after ``reset``, merged or loaded) is read, once."""
        seen = self._n_items_host
        if seen is None:
            seen = int(self.n_items)
        if seen not in (0, n_items):
            raise ValueError(f"scores: {n_items} items, but earlier batches had {seen}")
        self._n_items_host = n_items

    def _ids(self, ids: TensorLike | None, b: int, device: torch.device) -> torch.Tensor:
        if ids is None:
            ids = torch.arange(self._rows_seen, self._rows_seen + b, device=device)
        else:
            ids = _index_like(ids, "ids", f"({b},) integer instance ids", device)
            if ids.shape != (b,) or ids.is_floating_point() or ids.dtype == torch.bool:
                raise ValueError(f"ids: expected ({b},) integer instance ids, got {tuple(ids.shape)} {ids.dtype}")
        self._rows_seen += b
        return ids

    def _check_hist_rows(self, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                         checks: DeviceChecks | None) -> int:
        """The histogram rows a batch needs (e = excluded items + other positives <= E + P - 1, and < n_items: known
        from the shapes alone). A state that would grow past ``MAX_ELEMENTS`` is a ValueError naming ``n_samples``,
        raised before anything is drawn, scored or ranked (the batch's pending ``checks``, when given, its inputs'
        among them, are read first, also where they would be deferred: an error is raised anyway, so that a bad
        input is reported as the CPU reports it)."""
        width = self.hist.shape[1]
        rows = min((0 if exc is None else exc.shape[1]) + pos.shape[1], n_items)
        if rows > self.hist.shape[0]:
            try:
                check_elements(rows * width, "n_samples", f"the histogram state ({rows} rows of excluded counts x "
                               f"{width} sampled ranks; rows grow with the exclusions and positives of a row)")
            except ValueError:
                if checks is not None and len(checks):
                    checks.defer = False  # read now even where deferred (the call raises anyway)
                    checks.read()
                raise
        return rows

    def _add_ranks(self, ranks: torch.Tensor, n_cand: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                   keep: torch.Tensor | None, sizes: torch.Tensor | None = None) -> None:
        """Add the valid slots' (e, r~) to the histogram by an accumulating scatter over every slot (weight 0
        where not valid): no boolean indexing, no data-dependent size, nothing read back. The rows needed are
        known from the shapes: e = excluded items + other positives <= E + P - 1 (and < n_items)."""
        rows = self._check_hist_rows(pos, exc, n_items, None)  # before the state changes: refused whole
        self.n_items = torch.full((), n_items, dtype=torch.int64, device=self.n_items.device)
        if pos.numel() == 0:
            return
        idx, w = self._hist_cells(ranks, n_cand, pos, keep, sizes, rows, n_items)
        self._grow_hist(rows)
        dev = self.hist.device
        self.hist.view(-1).index_put_((_to(idx, dev),), _to(w, dev), accumulate=True)

    def _hist_cells(self, ranks: torch.Tensor, n_cand: torch.Tensor, pos: torch.Tensor, keep: torch.Tensor | None,
                    sizes: torch.Tensor | None, rows: int, n_items: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(flat histogram cell e * width + column, weight: 1 where the slot is valid and kept, else 0) of every
        (B, P) slot, e = n_items - candidates, for a histogram of ``rows`` rows (cells in range; padded slots at cell
        0 with weight 0)."""
        valid = pos >= 0
        k = _keep_mask(keep, pos.shape[0], pos.device)
        if k is not None:
            valid = valid & k.unsqueeze(1)
        width = self.hist.shape[1]
        e = (n_items - n_cand).unsqueeze(1)
        col = ranks - 1
        if sizes is not None:  # stage s = log2(M / m) starts at its column offset
            m = self._design.n_samples
            stage = torch.log2(torch.where(valid, sizes, m).to(torch.float64) / m)
            col = col + self._stage_offsets(ranks.device)[stage.round().to(torch.int64)]
        # in range by construction; clamped for a batch whose deferred checks failed (duplicated or excluded
        # positives can count more removed items than the catalogue holds): its state is refused at compute
        e, col = e.clamp(0, max(rows - 1, 0)), col.clamp(0, width - 1)
        return torch.where(valid, e * width + col, 0).reshape(-1), valid.to(self.hist.dtype).reshape(-1)

    def _grow_hist(self, rows: int) -> None:
        """The histogram state with at least ``rows`` rows (zeros added) and contiguous."""
        if rows > self.hist.shape[0]:
            grow = torch.zeros(rows - self.hist.shape[0], self.hist.shape[1], dtype=self.hist.dtype,
                               device=self.hist.device)
            self.hist = torch.cat([self.hist, grow])
        elif not self.hist.is_contiguous():
            self.hist = self.hist.contiguous()

    def _stage_offsets(self, device: torch.device) -> torch.Tensor:
        """Column offset of each adaptive stage (:func:`adaptive_columns`) on ``device``, copied there once."""
        cached = self._offsets.get(device)
        if cached is None:
            assert self._adaptive is not None  # stage offsets: adaptive designs only
            offsets, _ = adaptive_columns(self._adaptive)
            cached = self._offsets[device] = torch.as_tensor(offsets, dtype=torch.int64).to(device)
        return cached

    # ------------------------------------------------------------------------------ sync
    def _merge_fields(self) -> dict[str, str]:
        s = self.settings
        return {"metrics": repr(s.metrics), "n_samples": repr(self._design), "ties": repr(s.ties),
                "estimators": repr(s.methods), "max_n_groups": repr(s.max_n_groups), "popularity": repr(self._pop_hash)}

    def _catalogue(self) -> int:
        """The catalogue size of this state (0: nothing counted yet), from the host's record when it has one."""
        return int(self.n_items) if self._n_items_host is None else self._n_items_host

    def _check_incoming(self, state: Mapping[str, Any]) -> None:
        if self._in_forward:  # forward adds this instance's own accumulated state: checked before the batch
            return
        hist, n_items = state["hist"], state["n_items"]
        if hist.dim() != 2 or hist.shape[1] != self.hist.shape[1]:
            raise ValueError(f"n_samples: the incoming histogram has shape {tuple(hist.shape)}, this one rows of "
                             f"{self.hist.shape[1]} counts ({self._design!r}): another n_samples or design")
        if n_items.numel() != 1:
            raise ValueError(f"n_items: expected one catalogue size in the incoming state, got {tuple(n_items.shape)}")
        if self._pop_rows and (state["pop"].dim() != 2 or state["pop"].shape[1] != len(self._pop_columns)):
            raise ValueError(f"n_samples: the incoming popularity state has shape {tuple(state['pop'].shape)}, this "
                             f"one rows of {len(self._pop_columns)} columns (with an exact share: R and pi last)")
        if self._share_table and (state["share"].dim() != 2 or state["share"].shape[1] != len(_SHARE_COLUMNS)):
            raise ValueError(f"n_samples: the incoming exact-share state has shape {tuple(state['share'].shape)}, "
                             f"this one rows of {len(_SHARE_COLUMNS)} columns {_SHARE_COLUMNS}")
        if self._at_cap and (state["completed"].dim() != 2 or state["completed"].shape[1] != len(_CAP_COLUMNS)):
            raise ValueError(f"n_samples: the incoming exact_at_cap state has shape {tuple(state['completed'].shape)}, "
                             f"this one rows of {len(_CAP_COLUMNS)} columns {_CAP_COLUMNS}")
        mine, theirs = self._catalogue(), int(n_items)
        if mine and theirs and mine != theirs:
            raise ValueError(f"n_items: the incoming state counts a catalogue of {theirs} items, this one {mine}; "
                             "states of different catalogues cannot be merged")

    def _sync_sizes(self) -> list[tuple[str, int]]:
        return [("n_items", self._catalogue())]

    def _sync_dist(self, dist_sync_fn: Callable | None = None, process_group: Any = None) -> None:
        """Check that every process is configured alike and counts one catalogue (:meth:`_check_sync`), pad
        every process's histogram to the same number of rows, then let torchmetrics sum."""
        import torch.distributed as dist

        self._check_sync(process_group)
        group = process_group or self.process_group
        rows = torch.tensor([self.hist.shape[0]], dtype=torch.int64, device=self.hist.device)
        dist.all_reduce(rows, op=dist.ReduceOp.MAX, group=group)
        self.hist = _pad_rows(self.hist, int(rows.item()))
        # torchmetrics stacks the gathered states: pad every process's rows alike (padded rows: r~ = 0 in ``pop``,
        # R = 0 in ``share`` and ``completed``; dropped after the gather, at compute)
        for name in ("pop",) * self._pop_rows + ("share",) * self._share_table + ("completed",) * self._at_cap:
            state = getattr(self, name)
            count = torch.tensor([state.shape[0]], dtype=torch.int64, device=state.device)
            dist.all_reduce(count, op=dist.ReduceOp.MAX, group=group)
            setattr(self, name, _pad_rows(state, int(count.item())))
        if dist_sync_fn is None:
            super()._sync_dist(process_group=process_group)
        else:
            super()._sync_dist(dist_sync_fn, process_group)
        if self._pop_rows:  # the processes' rows (read in a canonical order: _popularity_ranks)
            pop = self.pop.reshape(-1, len(self._pop_columns))
            self.pop = pop[pop[:, 0] > 0]
        if self._share_table:  # (processes, rows, columns) stacked: one table (padded rows dropped at compute)
            self.share = self.share.reshape(-1, len(_SHARE_COLUMNS))
        if self._at_cap:
            self.completed = self.completed.reshape(-1, len(_CAP_COLUMNS))

    def _reduce_states(self, incoming_state: dict[str, Any]) -> None:
        """``forward`` and ``merge_state`` add another state: both histograms padded to the same rows first."""
        self._validate_incoming(incoming_state)
        other = incoming_state["hist"]
        if not self._in_forward:  # n_items now also comes from the other state: read it at the next batch
            self._n_items_host = None  # (forward's own state has the batch's catalogue, checked before the batch)
        rows = max(self.hist.shape[0], other.shape[0])
        self.hist = _pad_rows(self.hist, rows)
        Metric._reduce_states(self, {**incoming_state, "hist": _pad_rows(other.to(self.hist.device), rows)})
        self._forget_computed()

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        scores = args[0] if args else kwargs.get("scores")
        if isinstance(scores, torch.Tensor) and scores.dim() == 2:  # the batch's catalogue against the state's
            self._check_n_items(scores.shape[1])
        return super().forward(*args, **kwargs)  # _in_forward: torchmetrics resets the state, not the row counter

    # ---------------------------------------------------------------------------- compute
    def _histogram(self, exact: bool = False) -> tuple[RankHistogram, bool]:
        """The histogram of the state with its design, pooled to ``max_n_groups``, and whether pooling changed it.
        A popularity design's histogram carries none (it cannot hold the draws' weights): it is read as the plain
        sampled metric's, law-free; the corrected estimates read :meth:`popularity_ranks`. ``exact``: an
        ``exact_at_cap`` design's completed positives in exact groups at their R (``completed_histogram_from_rows``),
        else at their r~."""
        counts = self.hist.detach().to("cpu", torch.float64).numpy()
        max_groups = self.settings.max_n_groups
        if exact and self._at_cap:
            done = self.completed.detach().to("cpu", torch.float64).numpy()
            hist, pooled = completed_histogram_from_rows(counts, int(self.n_items), self._design, done[done[:, 1] > 0],
                                                         max_groups)
        elif self._adaptive is not None:
            hist, pooled = adaptive_histogram_from_rows(counts, int(self.n_items), self._adaptive, max_groups)
        else:
            hist, pooled = histogram_from_rows(counts, int(self.n_items), self._design.n_samples, max_groups)
        hist = hist.with_design(None if self._pop_weights is not None else self._design)
        return (hist.with_share(self._share_state()) if self._share_table else hist), pooled

    def _check_share_overflow(self) -> None:
        """A RuntimeError where a batch's chosen rows exceeded the static capacity (some went unranked)."""
        over = int(self.share_overflow)
        if over:
            raise RuntimeError(f"exact share: in {over} batch(es) more rows held a chosen positive than the static "
                               "capacity ranks without a read back (share_capacity: 6 standard deviations + 8 above "
                               "the mean, exceeded with probability below 1e-9 per batch), so chosen positives went "
                               "unranked and the design-based estimate would be biased; evaluate again (another "
                               "ExactShare seed) or on the CPU")

    def _share_state(self) -> ShareRows:
        """The exact share's rows (``_share.ShareRows``: what ``diff`` reads beside the histogram), the rows not
        chosen or padded (R = 0) dropped, in one canonical order (sorted by every column), so the estimate is the
        same bit for bit whatever the batches, their order or the processes."""
        self._check_share_overflow()
        t = self.share.detach().to("cpu", torch.float64).numpy()
        t = t[t[:, 3] > 0]
        t = t[np.lexsort(t.T[::-1])]
        share = self._share
        assert share is not None
        return ShareRows(t[:, 0].astype(np.int64), t[:, 1].astype(np.int64), t[:, 2].copy(), t[:, 3].copy(),
                         t[:, 4].copy(), np.ones(len(t)), census=share.share >= 1.0)

    def histogram(self, exact: bool = True) -> RankHistogram:
        """The synced sampled-rank histogram (:class:`~reco_sampled_plugin.RankHistogram`), pooled as configured,
        carrying its design (None under a popularity design). ``exact`` (default): an ``exact_at_cap`` design's
        completed positives in exact groups at their exact ranks (as ``SampledRanks.histogram()``); False: at r~."""
        exact = check_bool(exact, "exact")
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=True):
            self._raise_deferred()
            return self._histogram(exact)[0]

    def _estimates(self, progress: bool | None | Callable[[Iterable], Iterable] = False) -> dict[str, Estimate]:
        self._raise_deferred()
        plain = self._histogram()
        # exact_at_cap: the estimators that read exact groups get them (completed positives at R), the others r~
        both = {False: plain, True: self._histogram(True) if self._at_cap else plain}
        settings = self.settings
        # the registry says which estimator takes which metric (hh: AUC only): the other pairs are not reported
        jobs: Iterable[tuple[str, registry.Method, str]] = [
            (m, e, lab) for m in settings.metric_names for e, lab in zip(settings.methods, settings.labels)
            if e.name in registry.names(metric=m)]
        out: dict[str, Estimate] = {}
        if callable(progress):
            jobs = progress(jobs)
        else:
            from .._progress import progress_bar

            jobs = progress_bar(jobs, desc="ranking metrics", enabled=progress, unit="estimate")
        popn = None
        for metric, method, label in jobs:
            key = f"{metric}/{label}"
            hist, pooled = both[type(method).entry.exact_groups]
            if hist.n_groups == 0 or hist.total <= 0:  # nothing counted (no update, or every row dropped by keep)
                out[key] = _empty_estimate(0.0, {"method": method.name, "metric": metric})
                continue
            family = type(method).entry.family
            try:
                if self._pop_weights is not None and family != "none":
                    popn = self._popularity_ranks() if popn is None else popn  # the draws' own statistics
                    out[key] = estimators.estimate(metric, popn, method)
                else:  # the histogram carries the design (law, adaptive stages)
                    out[key] = estimators.estimate(metric, hist, method)
                if family != "none":  # the plain sampled metric's interval is not widened
                    explain_once(logger, f"SampledRankingMetrics {metric}", out[key], metric=metric,
                                 n_items=int(self.n_items), design=self._design, users=int(round(hist.total)))
            except ValueError as exc:  # one failing estimator must not take the others (or training) down
                warnings.warn(f"{key}: estimator failed ({exc}); reported as NaN", RuntimeWarning, stacklevel=2)
                out[key] = Estimate(math.nan, math.nan, hist.total, {"error": str(exc), "flags": ("estimator_failed",)},
                                    ("estimator_failed",))
            if pooled:  # the candidate counts were pooled here, before estimate() saw them: it cannot flag it
                out[key] = _with_flag(out[key], "pooled_n")
        return out

    def estimates(self, progress: bool | None | Callable[[Iterable], Iterable] = None) -> dict[str, Estimate]:
        """``{"<metric>/<label>": Estimate}`` for every metric and estimator (synced across processes).

        ``progress``: a bar over the (metric, estimator) jobs on stderr (True, False; None: when stderr is a
        terminal), or a callable that wraps the list of jobs (e.g. ``tqdm.tqdm``). It never changes the estimates.
        """
        with self.sync_context(dist_sync_fn=self.dist_sync_fn, should_sync=self._to_sync, should_unsync=True):
            return self._estimates(progress)

    def compute(self) -> dict[str, torch.Tensor]:
        """``{"<metric key>/<label>": value}`` (``ndcg_at_10/auto``: the logged key, ``metric_key``; the Lightning
        callback logs the same after its stage), with ``_lo`` / ``_hi`` (the 95% interval, ``interval=True``) and
        ``_stderr`` (sampling noise only, ``stderr=True``) beside each (float64 tensors)."""
        return self._compute_or_none(lambda: estimate_values(self._estimates(), interval=self.interval,
                                                             stderr=self.stderr))

    def _load_from_state_dict(self, *args: Any, **kwargs: Any) -> None:
        super()._load_from_state_dict(*args, **kwargs)
        self._n_items_host = None  # a loaded state's catalogue: read it at the next batch

    def reset(self) -> None:
        super().reset()
        self._n_items_host = 0  # an empty state (forward restores the accumulated one after the batch: same n)
        if not self._in_forward:
            self._rows_seen = 0
            self._scoring = None
