"""Offline evaluation on Ray Data: keyed sampled ranks per block, additive state, estimates on the driver.

A Ray Dataset of evaluation rows (a user id, its held-out items, optionally its excluded items) goes through
``map_batches`` on a pool of actors, each holding a scorer built once by the caller's *factory* (on the actor's GPU
when it has one; the scorer protocol of docs/scorer.md). Each block is ranked by the scorer-driven loop on keyed draws
(``_keyed.keyed_ranks`` / ``keyed_adaptive_ranks`` with ``ScorerScores``, the loop of
``SampledRankingMetrics.update_from_scorer``): a positive's negatives are a hash of (seed, user, item, draw index),
never of its block, so a block's result does not depend on how the dataset is split, on which actor ranks it, or on
a retry. Each block becomes a :class:`EvaluationState` (a rank histogram, per-positive rows where the estimators need
them, the scoring cost), the driver adds the blocks' states as Ray Data streams them to it (``Dataset.iter_batches``:
no shuffle, no aggregation workers) and estimates from the merged state with the core's ``estimate``.

Designs: uniform or popularity (each with or without replacement), adaptive (``exact_at_cap`` too), a uniform or an
active exact share, with popularity draws with replacement too (``diff`` on ``pl_fit``'s predictions, as the core),
and exact ranks (``n_samples=None``: each row's whole candidate list scored) (:func:`check_design`; a share with
popularity draws without replacement is refused, as everywhere: only ``none`` estimates those).

An active share is phase 2 of a two-phase design: its inclusion probabilities pi come from the model fitted on every
positive's sampled ranks, so it takes two passes over the dataset. Pass 1 draws without the share; its merged state
is the whole sample's, from which the driver computes pi once (:meth:`EvaluationState.share_table`) and broadcasts
it to the actors: under a uniform-law or adaptive design pi is a function of a positive's (n, m, r~) and of the
histogram alone, so the driver builds the core's table of pi over the histogram's occupied cells
(``_design_based.ShareTable``, the histogram's size whatever the number of users); under a popularity design pi is
each positive's own (``pl_fit``'s prediction from its statistics), so the driver computes every positive's pi with the
core's ``share_inclusion`` on the merged sample and keys it by (user, item) (``_design_based.KeyedInclusion``: one
int64 key and one float64 pi per positive, 16 bytes each, smaller than the per-positive rows pass 1 already brought
to the driver). Pass 2 draws the same keyed ranks again, reads each positive's pi in the table, makes the core's keyed
choice (``_share.choose_share``) and completes the chosen rows; the cost counts both passes.

State size: the histogram holds at most (distinct candidate counts) x (m + 1) counts whatever the number of users
(an adaptive design: one row per stage; exact ranks and ``exact_at_cap``: n counts per distinct n of an exactly
ranked positive).
Popularity designs with replacement keep one row per positive (the Hansen-Hurwitz and ``pl_fit`` statistics are per
positive; an exact share adds its exact rank and pi to each row, and an active one broadcasts 16 bytes per positive
to every actor for pass 2), an exact share of another design one row per chosen positive: those grow with the users
(docs/guides/scale.md). Popularity
without replacement keeps the histogram alone (no per-draw statistics exist there, as in the core).

Versions: Ray Data >= 2.44 (:data:`MIN_RAY`). RecBole 1.2.1 pins ``ray<=2.6.3``, which does not import
beside setuptools >= 81 and is older than this adapter needs: install Ray after RecBole (docs/install.md).
"""

from __future__ import annotations

import logging
import pickle
import time
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Iterable, Mapping

import numpy as np
import torch

from reco_sampled_plugin._checks import ArgumentTypeError, check_int, check_size, check_without_replacement
from reco_sampled_plugin._design_based import KeyedInclusion, ShareTable, draw_share, share_inclusion
from reco_sampled_plugin._kept import KeepsDerived
from reco_sampled_plugin._keyed import RowKeys, ScorerScores, keyed_adaptive_ranks, keyed_ranks
from reco_sampled_plugin._options import check_bool, check_nonnegative_float, check_optional, check_seed
from reco_sampled_plugin._popularity import PopularityStats
from reco_sampled_plugin._progress import progress_enabled
from reco_sampled_plugin._rank_hist import RankHistogram
from reco_sampled_plugin._sampled import ranks_of_histogram
from reco_sampled_plugin._share import ShareRows, choose_share
from reco_sampled_plugin._estimate import Estimate
from reco_sampled_plugin.adaptive import completion_targets
from reco_sampled_plugin.design import SamplingDesign, as_design
from reco_sampled_plugin.ranking import SampledRanks, check_popularity, padded_candidate_counts, prepare_index
from reco_sampled_plugin.scorer_ranks import (DEFAULT_MAX_PAIRS, Scorer, ScorerCalls, ScoringCost,
                                              complete_from_scorer, full_ranking_pairs)

from ._shared import check_share_design, check_ties

#: the oldest Ray this adapter supports
MIN_RAY = (2, 44)
_FIX = ('pip install -U "ray[data]>=2.44" (RecBole 1.2.1 pins ray<=2.6.3: install Ray after RecBole, '
        "docs/install.md)")


def _import_ray() -> Any:
    """``ray`` if it imports at a supported version; an ImportError saying how to fix it otherwise."""
    try:
        import ray
        import ray.data  # noqa: F401  (Ray Data: the engine)
    except Exception as err:  # ray 2.6.3 beside setuptools >= 81: ModuleNotFoundError: pkg_resources
        raise ImportError(f"reco_sampled_plugin.adapters.ray needs Ray Data >= {'.'.join(map(str, MIN_RAY))}, "
                          f"and ray does not import here ({type(err).__name__}: {err}); {_FIX}") from err
    version = tuple(int(p) for p in ray.__version__.split(".")[:2] if p.isdigit())
    if version < MIN_RAY:
        raise ImportError(f"reco_sampled_plugin.adapters.ray needs Ray >= {'.'.join(map(str, MIN_RAY))}, found "
                          f"{ray.__version__}; {_FIX}")
    return ray


ray = _import_ray()

__all__ = ["MIN_RAY", "Columns", "EvaluationState", "Evaluation", "Engine", "check_design", "rank_block",
           "batch_tensors", "evaluate_dataset"]

logger = logging.getLogger(__name__)

#: a scorer factory: ``factory(device) -> scorer``, called once per actor (module-level or picklable)
ScorerFactory = Callable[[torch.device], Scorer]

#: what pass 2 of an active exact share reads each positive's pi in (:meth:`EvaluationState.share_table`)
InclusionTable = ShareTable | KeyedInclusion

_EMPTY = "dataset: no held-out item was ranked (an empty dataset, or rows without items)"


@dataclass(frozen=True)
class Columns:
    """The dataset's column names: ``user`` int64 user ids (they key the draws and are handed to the scorer),
    ``items`` the held-out items (a list of int64 per row, or one int64), ``exclude`` the items never drawn nor
    ranked (a list per row; None: no such column)."""

    user: str = "user"
    items: str = "items"
    exclude: str | None = "exclude"

    def __post_init__(self) -> None:
        named = {"user": self.user, "items": self.items, "exclude": self.exclude}
        for name, value in named.items():
            if not (isinstance(value, str) and value) and not (name == "exclude" and value is None):
                raise ArgumentTypeError(f"{name}: expected a column name (a non-empty string"
                                        f"{'; None: no such column' if name == 'exclude' else ''}), got {value!r}")
        if len({v for v in named.values() if v is not None}) < sum(v is not None for v in named.values()):
            raise ValueError(f"columns: user, items and exclude name different columns, got {named}")


@dataclass(frozen=True)
class EvaluationState:
    """What a block (or several, added) leaves: additive, so blocks, actors and retries combine by :meth:`merge`.

    hist: the rank histogram (None before any positive, and for popularity designs with replacement); rows:
    per-positive columns where the estimators need them (popularity with replacement: ranks, n and the
    ``PopularityStats`` fields, with an exact share each positive's ``share_ranks`` (R, 0 where not chosen) and
    ``inclusion`` too; an exact share otherwise: the chosen positives' ``ShareRows`` fields), with ``user`` and
    ``item`` to put them in one order whatever the blocks; census: every positive had inclusion 1 (an exact
    share); cost: the scoring cost summed over blocks (seconds are summed actor time); users: rows evaluated."""

    hist: RankHistogram | None = None
    rows: Mapping[str, np.ndarray] = field(default_factory=dict)
    census: bool = True
    cost: ScoringCost = ScoringCost(0, 0, 0.0, 0.0, 0, 0)
    users: int = 0

    def merge(self, other: "EvaluationState") -> "EvaluationState":
        """The state of both (histogram counts added: exact in float64, so any order gives the same bits)."""
        return EvaluationState.merge_all((self, other))

    @staticmethod
    def merge_all(states: Iterable["EvaluationState"]) -> "EvaluationState":
        """The state of all (what :meth:`merge` one by one gives): histograms added one state at a time (each
        bounded), each row column concatenated once at the end, so the copying is linear in the rows, not rows x
        states."""
        total, parts = EvaluationState(), []
        for state in states:
            h = total.hist
            total = EvaluationState(state.hist if h is None else h if state.hist is None else h.merge(state.hist), {},
                                    total.census and state.census, total.cost + state.cost, total.users + state.users)
            if state.rows:
                parts.append(state.rows)
        rows = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]} if parts else {}
        return replace(total, rows=rows)

    def sample(self, design: SamplingDesign | None) -> SampledRanks | RankHistogram:
        """What ``estimate(metric, sample, method)`` takes: the histogram under ``design`` (with its exact share's
        rows), or the popularity design's :class:`~reco_sampled_plugin.ranking.SampledRanks` (with replacement:
        per-positive rows in (user, item) order; without: the histogram's positives, ``ranks_of_histogram``)."""
        order = self._order()
        r = {k: v[order] for k, v in self.rows.items()}
        if design is not None and design.popularity is not None and design.replacement:
            t = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in r.items()}
            stats = PopularityStats(t["beating"], t["inv_q"], t["inv_q2"], t["unreachable"], t["profile"],
                                    t["beat_bins"], t["miss_bins"], t["positive_weight"])
            return SampledRanks(t["ranks"], t["n"], None, design, popularity_stats=stats,
                                share_ranks=t.get("share_ranks"), inclusion=t.get("inclusion"))
        if self.hist is None:
            raise ValueError(_EMPTY)
        if design is not None and design.popularity is not None:
            return ranks_of_histogram(self.hist, design)
        hist = self.hist.with_design(design)
        if design is None or design.exact_share is None:
            return hist
        cols = {k: r[k] if r else np.zeros(0, dtype=np.int64 if k in ("n", "m") else np.float64)
                for k in ("n", "m", "sampled", "exact", "inclusion", "weight")}
        return hist.with_share(ShareRows(**cols, census=self.census))

    def _order(self) -> np.ndarray | None:
        """The rows' (user, item) order (None without rows): the one order of :meth:`sample` whatever the blocks."""
        return np.lexsort((self.rows["item"], self.rows["user"])) if self.rows else None

    def share_table(self, design: SamplingDesign, n_items: int) -> InclusionTable:
        """What pass 2 of ``design``'s active exact share reads pi in, from this state, pass 1's merged state (the
        whole sample drawn under ``design`` without its share; items in 0..``n_items`` - 1): the histogram's
        ``ShareTable``, or under a popularity design with replacement every positive's pi (the core's
        ``share_inclusion`` on the merged sample) keyed by (user, item): a ``KeyedInclusion`` of one entry per
        positive."""
        share = design.exact_share
        assert share is not None and share.choice == "active", "share_table: a design with an active exact share"
        if design.popularity is None:
            if self.hist is None:
                raise ValueError(_EMPTY)
            return ShareTable.of(self.hist, share, design)
        if not self.rows:
            raise ValueError(_EMPTY)
        sample = self.sample(design)
        assert isinstance(sample, SampledRanks)
        order = self._order()
        return KeyedInclusion.of(self.rows["user"][order], self.rows["item"][order], share_inclusion(sample, share),
                                 n_items)

    def nbytes(self) -> int:
        """The pickled size of this state in bytes: what a block sends and the driver holds."""
        return len(pickle.dumps(self, protocol=pickle.HIGHEST_PROTOCOL))


# ------------------------------------------------------------------------------------------ one block
def check_design(n_samples: Any) -> SamplingDesign | None:
    """The design a Ray evaluation draws (keyed draws): uniform or popularity, each with or without replacement,
    adaptive (``exact_at_cap`` too), a uniform or active exact share (active: two passes,
    :meth:`EvaluationState.share_table`), with popularity draws with replacement too (each positive's row holds its
    exact rank and pi beside its pl_fit statistics); refused (``_shared.check_share_design``): a share with
    popularity draws without replacement; None: exact ranks (every candidate scored)."""
    design = as_design(n_samples)
    if design is None:
        return None
    check_share_design(design, "n_samples", "the Ray adapter",
                       "draw with sampled_ranks_from_scorer and estimate(metric, sampled) on one process",
                       active=True)
    return design


def _exact_state(calls: ScorerCalls, users: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None,
                 n_items: int, ties: str) -> EvaluationState:
    """Exact ranks (``n_samples=None``): each positive scored, then each row's whole candidate list
    (``scorer_ranks.complete_from_scorer``); counted in exact groups (n, m = n - 1) of the histogram."""
    from reco_sampled_plugin._rank_hist import sampled_rank_histogram

    valid = pos >= 0
    rows, cols = valid.nonzero(as_tuple=True)
    pos_scores = torch.zeros(pos.shape, dtype=torch.float64, device=pos.device)
    pos_scores[rows, cols] = calls.score(users[rows], pos[rows, cols].unsqueeze(1))[:, 0]
    exact = complete_from_scorer(calls, valid, pos, exc, users, pos_scores, n_items, ties, None)
    n = padded_candidate_counts(n_items, pos, exc, count_other_positives=False).view(-1, 1).expand(pos.shape)
    hist = sampled_rank_histogram(exact, n, n - 1, exact_ranks=exact) if bool(valid.any()) else None
    return EvaluationState(hist)


@torch.no_grad()
def rank_block(scorer: Scorer, users: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
               design: SamplingDesign | None, *, seed: int, ties: str = "pessimistic",
               max_pairs: int = DEFAULT_MAX_PAIRS, check_finite: bool = True,
               share: InclusionTable | None = None) -> EvaluationState:
    """One block's state: keyed sampled ranks of the (B, P) held-out items ``pos`` (-1 padding; (B, E) ``exc``
    likewise, validated by ``ranking.prepare_index``) of the (B,) ``users`` (ids: they key the draws and go to the
    scorer), scored by ``scorer``, under ``design`` (:func:`check_design`), turned into an :class:`EvaluationState`.
    A pure function of its rows: the same rows give the same state in any block, on any actor, at any retry.
    An active exact share reads pi in ``share``, the whole dataset's table (pass 2,
    :meth:`EvaluationState.share_table`: by cell, or by (user, item) under a popularity design); without it, pi is
    fitted on this block alone (the core's ``draw_share``: the one-process result when the block holds every row)."""
    t0 = time.perf_counter()
    device = pos.device
    keys = RowKeys.of(seed, users, device)
    calls = ScorerCalls(scorer, max_pairs, check_finite, device)
    if design is None:
        return _finish(_exact_state(calls, keys.ids, pos, exc, n_items, ties), calls, pos, exc, n_items, t0, 1)
    source = ScorerScores(calls, keys.ids)
    first = keyed_ranks(source, pos, exc, n_items, design, keys, ties)
    ranks, sizes, exact, stages = first.ranks, None, None, 1
    if design.adaptive is not None:
        stages = len(design.adaptive.stages)
        ranks, sizes, _ = keyed_adaptive_ranks(source, pos, exc, n_items, first, design.adaptive, keys, ties)
        if design.exact_at_cap:
            need = completion_targets(ranks, sizes, design)
            exact = complete_from_scorer(calls, need, pos, exc, keys.ids, first.pos_scores, n_items, ties, None)
            stages += int(bool(need.any()))
    n_cand = padded_candidate_counts(n_items, pos, exc, count_other_positives=False)
    sampled = SampledRanks(ranks, n_cand, None, design, sizes, None, first.stats, exact_ranks=exact)
    if design.exact_share is not None:
        def complete(chosen: torch.Tensor) -> torch.Tensor:
            return complete_from_scorer(calls, chosen, pos, exc, keys.ids, first.pos_scores, n_items, ties, None)

        if share is None:
            sampled = draw_share(sampled, keys.ids, pos, complete)
        else:
            pi = share.inclusion(sampled) if isinstance(share, ShareTable) else share.inclusion(sampled, keys.ids, pos)
            sampled = choose_share(sampled, keys.ids, pos, complete, pi)
    return _finish(_state(sampled, keys.ids, pos), calls, pos, exc, n_items, t0, stages)


def _finish(state: EvaluationState, calls: ScorerCalls, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
            t0: float, stages: int) -> EvaluationState:
    """``state`` with the block's scoring cost (since ``t0``) and its users."""
    spent = time.perf_counter() - t0
    cost = ScoringCost(calls.pairs, calls.calls, calls.seconds, max(spent - calls.seconds, 0.0),
                       full_ranking_pairs(n_items, exc, (pos >= 0).any(1)), stages)
    return replace(state, cost=cost, users=int(pos.shape[0]))


def _state(sampled: SampledRanks, users: torch.Tensor, pos: torch.Tensor) -> EvaluationState:
    """The additive state of one block's :class:`SampledRanks` (see :class:`EvaluationState`)."""
    design = sampled.design
    assert design is not None
    valid = sampled.ranks > 0
    user_of = users.view(-1, 1).expand_as(pos)
    if design.popularity is not None and design.replacement:
        stats = sampled.popularity_stats
        assert stats is not None
        s = stats.select(valid)
        cols = {"user": user_of[valid], "item": pos[valid], "ranks": sampled.ranks[valid],
                "n": sampled.candidates()[valid], "beating": s.beating, "inv_q": s.inv_q, "inv_q2": s.inv_q2,
                "unreachable": s.unreachable, "profile": s.profile, "beat_bins": s.beat_bins,
                "miss_bins": s.miss_bins, "positive_weight": s.positive_weight,
                "share_ranks": None if sampled.share_ranks is None else sampled.share_ranks[valid],
                "inclusion": None if sampled.inclusion is None else sampled.inclusion[valid]}
        return EvaluationState(rows={k: v.cpu().numpy() for k, v in cols.items() if v is not None})
    plain = replace(sampled, share_ranks=None, inclusion=None)
    hist = plain.histogram().with_design(None) if bool(valid.any()) else None
    if sampled.share_ranks is None:
        return EvaluationState(hist)
    share = ShareRows.of(sampled)
    chosen = sampled.share_ranks > 0
    rows = {"user": user_of[chosen].cpu().numpy(), "item": pos[chosen].cpu().numpy(),
            **{k: getattr(share, k) for k in ("n", "m", "sampled", "exact", "inclusion", "weight")}}
    return EvaluationState(hist, rows, share.census)


# ------------------------------------------------------------------------------------------ batches
def _padded(col: Any, b: int) -> np.ndarray:
    """A pyarrow column of lists (or of scalars) as (B, L) int64 padded with -1 (CSR to padded, vectorised)."""
    import pyarrow as pa

    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        return np.asarray(arr.fill_null(-1).to_numpy(zero_copy_only=False), dtype=np.int64).reshape(b, 1)
    offsets = np.asarray(arr.offsets.to_numpy(), dtype=np.int64)
    lengths = np.diff(offsets)
    if arr.null_count:  # a null list is an empty one
        lengths = np.where(np.asarray(arr.is_null().to_numpy(zero_copy_only=False)), 0, lengths)
    values = np.asarray(arr.flatten().to_numpy(zero_copy_only=False), dtype=np.int64)
    out = np.full((b, int(lengths.max()) if b else 0), -1, dtype=np.int64)
    row = np.repeat(np.arange(b), lengths)
    out[row, np.arange(row.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)] = values
    return out


def batch_tensors(batch: Any, columns: Columns, n_items: int,
                  device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(users (B,), validated padded positives (B, P), exclusions (B, E) or None) of a pyarrow batch."""
    b = batch.num_rows
    users = torch.as_tensor(np.array(batch.column(columns.user).to_numpy(), dtype=np.int64), device=device)
    given = torch.as_tensor(_padded(batch.column(columns.items), b), device=device)
    exc = None
    if columns.exclude is not None and columns.exclude in batch.column_names:
        exc = torch.as_tensor(_padded(batch.column(columns.exclude), b), device=device)
    pos, exc = prepare_index(given, exc, b, n_items, device)
    return users, pos, exc


@dataclass(frozen=True)
class _Job:
    """What every actor needs besides its scorer."""

    n_items: int
    design: SamplingDesign | None
    seed: int
    ties: str
    max_pairs: int
    check_finite: bool
    columns: Columns
    share: InclusionTable | None = None


class _RankActor:
    """A Ray Data actor: builds the scorer once (on ``cuda`` when Ray gave the actor a GPU), then ranks blocks."""

    def __init__(self, factory: ScorerFactory, job: _Job) -> None:
        self.device = torch.device("cuda") if torch.cuda.is_available() and ray.get_gpu_ids() else torch.device("cpu")
        self.job = job
        self.scorer = factory(self.device)

    def __call__(self, batch: Any) -> Any:
        import pyarrow as pa

        j = self.job
        users, pos, exc = batch_tensors(batch, j.columns, j.n_items, self.device)
        state = rank_block(self.scorer, users, pos, exc, j.n_items, j.design, seed=j.seed, ties=j.ties,
                           max_pairs=j.max_pairs, check_finite=j.check_finite, share=j.share)
        return pa.table({"state": pa.array([pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)],
                                           type=pa.large_binary())})


def _dump(state: EvaluationState) -> bytes:
    return pickle.dumps(state, protocol=pickle.HIGHEST_PROTOCOL)


@dataclass(frozen=True)
class Evaluation(KeepsDerived):
    """The merged state of a dataset and its design: ``estimate(metric, method)`` runs the core's estimation on
    :meth:`sample`, built once and kept, so the fits the core keeps on a sample serve every metric and method."""

    state: EvaluationState
    design: SamplingDesign | None

    @property
    def cost(self) -> ScoringCost:
        return self.state.cost

    def sample(self) -> SampledRanks | RankHistogram:
        """What ``estimate`` takes (:meth:`EvaluationState.sample` under the design); the same object on every call,
        kept as long as this evaluation: read it, never change its tensors in place (later estimates would read them)."""
        return self._derived("sample", lambda: self.state.sample(self.design))

    def estimate(self, metric: str, method: Any = "auto") -> Estimate:
        """``reco_sampled_plugin.estimate(metric, self.sample(), method)``."""
        from reco_sampled_plugin.estimators import estimate

        return estimate(metric, self.sample(), method)


@dataclass(frozen=True)
class Engine:
    """How Ray runs the ranking: ``workers`` actors, each with ``num_cpus`` CPUs and ``num_gpus`` GPUs (0: the CPU;
    a GPU actor builds its scorer on ``cuda``), ``batch_size`` rows per ranked batch (None: a whole block),
    ``progress`` Ray Data's progress bars on the driver (None: on for a terminal). Leave a CPU to Ray's own tasks
    (reads, repartitions) when ``workers x num_cpus`` fills the cluster. A dead actor is restarted
    and its blocks retried by Ray Data (its actors' defaults, ``max_restarts=-1``, ``max_task_retries=-1``): a
    retried block gives the same state (keyed draws), so nothing is lost or counted twice."""

    workers: int = 1
    num_cpus: float = 1.0
    num_gpus: float = 0.0
    batch_size: int | None = 4096
    progress: bool | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "workers", check_int(self.workers, "workers", minimum=1))
        object.__setattr__(self, "num_cpus", check_nonnegative_float(self.num_cpus, "num_cpus"))
        object.__setattr__(self, "num_gpus", check_nonnegative_float(self.num_gpus, "num_gpus"))
        object.__setattr__(self, "batch_size", check_optional(self.batch_size, check_int, "batch_size", 1))
        object.__setattr__(self, "progress", check_optional(self.progress, check_bool, "progress"))


def evaluate_dataset(dataset: Any, scorer_factory: ScorerFactory, n_items: int, n_samples: int | SamplingDesign | None, *,
                     seed: int = 0, columns: Columns = Columns(), ties: str = "pessimistic",
                     max_pairs: int = DEFAULT_MAX_PAIRS, check_finite: bool = True,
                     engine: Engine = Engine()) -> Evaluation:
    """Keyed sampled ranks of every row of a Ray Dataset, added into one state on the driver.

    Args:
        dataset: a ``ray.data.Dataset`` with the :class:`Columns` (user ids, held-out items, optional exclusions).
        scorer_factory: ``factory(device) -> scorer``, called once per actor (docs/scorer.md's protocol).
        n_items: n, the catalogue size. n_samples: m or a :class:`~reco_sampled_plugin.design.SamplingDesign`
            (:func:`check_design`; an active exact share: two passes over ``dataset``, module docstring), or None:
            exact ranks (each row's whole candidate list scored). seed: the key of the draws (the same seed gives
            the same ranks whatever the blocks or actors). ties: a deterministic tie policy. max_pairs, check_finite: as in
            ``sampled_ranks_from_scorer``. engine: the actors (:class:`Engine`).

    Returns:
        :class:`Evaluation`: ``.estimate(metric, method)``, ``.cost`` summed over actors, ``.state``.
    """
    design = check_design(n_samples)
    job = _Job(check_size(n_items, "n_items", 1), design, check_seed(seed, "seed"), check_ties(ties),
               check_int(max_pairs, "max_pairs", minimum=1), check_bool(check_finite, "check_finite"), columns)
    _check_before_ray(dataset, scorer_factory, job, engine)
    ctx = ray.data.DataContext.get_current()
    bars, ctx.enable_progress_bars = ctx.enable_progress_bars, progress_enabled(engine.progress)
    t0 = time.perf_counter()
    try:
        state, merged = _passes(dataset, scorer_factory, job, engine)
    finally:
        ctx.enable_progress_bars = bars
    logger.info("evaluate_dataset: %d users, %d pairs scored in %d calls (%.2f%% of full ranking), %.1f s, driver "
                "state %d bytes", state.users, state.cost.pairs, state.cost.calls, 100 * state.cost.share_of_full,
                time.perf_counter() - t0, merged)
    return Evaluation(state, design)


def _check_before_ray(dataset: Any, scorer_factory: Any, job: _Job, engine: Any) -> None:
    """What :func:`evaluate_dataset` can check on the driver before Ray runs anything (a ValueError naming the
    argument, where the actors would fail deep inside): the design against the catalogue (popularity weights one per
    item, draws without replacement below n), the factory, the columns and engine objects, and the dataset."""
    design = job.design
    if design is not None and design.popularity is not None:
        check_popularity(design.popularity, job.n_items, design.popularity.device)
    if design is not None and not design.replacement:  # uniform or popularity: m distinct items of n - 1
        check_without_replacement(job.n_items, design.n_samples, "hypergeometric")
    if not callable(scorer_factory):
        raise ArgumentTypeError(f"scorer_factory: expected a callable factory(device) -> scorer, got "
                                f"{type(scorer_factory).__name__}")
    for name, value, kind in (("columns", job.columns, Columns), ("engine", engine, Engine)):
        if not isinstance(value, kind):
            raise ArgumentTypeError(f"{name}: expected a {kind.__name__}(...), got {type(value).__name__}")
    if not isinstance(dataset, ray.data.Dataset):
        raise ArgumentTypeError(f"dataset: expected a ray.data.Dataset (ray.data.from_items(...), "
                                f"ray.data.read_parquet(...)), got {type(dataset).__name__}")


def _passes(dataset: Any, scorer_factory: ScorerFactory, job: _Job, engine: Engine) -> tuple[EvaluationState, int]:
    """(the merged state, its pickled bytes): one pass; an active exact share two (module docstring), pass 1 drawn
    without the share, its merged state turned into the share's pi (:meth:`EvaluationState.share_table`), pass 2
    with that table; the state is pass 2's with the cost of both (the pairs, calls and seconds of both; full
    ranking's pairs once)."""
    share = None if job.design is None else job.design.exact_share
    if share is None or share.choice != "active":
        merged = _run(dataset, scorer_factory, job, engine)
        return pickle.loads(merged), len(merged)
    assert job.design is not None
    first: EvaluationState = pickle.loads(_run(dataset, scorer_factory, replace(
        job, design=replace(job.design, exact_share=None)), engine))
    table = first.share_table(job.design, job.n_items)
    merged = _run(dataset, scorer_factory, replace(job, share=table), engine)
    second: EvaluationState = pickle.loads(merged)
    return replace(second, cost=replace(first.cost + second.cost, full_pairs=second.cost.full_pairs)), len(merged)


def _run(dataset: Any, scorer_factory: ScorerFactory, job: _Job, engine: Engine) -> bytes:
    """The pickled merged state: ranked by the actor pool, the blocks' states added on the driver as Ray Data streams
    them (:meth:`EvaluationState.merge_all`: the same state in any order). The driver holds the merged histogram,
    the per-positive rows gathered so far (what the estimate needs anyway) and the batch of states in hand."""
    ranked = dataset.map_batches(_RankActor, fn_constructor_args=(scorer_factory, job), batch_format="pyarrow",
                                 batch_size=engine.batch_size,
                                 compute=ray.data.ActorPoolStrategy(size=check_int(engine.workers, "workers", minimum=1)),
                                 num_cpus=engine.num_cpus, num_gpus=engine.num_gpus or None)
    blobs = (blob.as_py() for batch in ranked.iter_batches(batch_format="pyarrow", batch_size=None)
             for blob in batch.column("state"))  # one pickled state per ranked batch
    return _dump(EvaluationState.merge_all(pickle.loads(blob) for blob in blobs))
