"""Framework-free pieces shared by the torchmetrics and Lightning adapters.

* :class:`RankingBatch` / :class:`FactorBatch`: what a step (or a user scoring function) hands to the
  adapters: scores, or the factors they come from.
* Keyed negative sampling: the m irrelevant items of a positive are a pure function of
  (seed, instance id, positive item), drawn with a counter-based hash instead of a stateful
  generator. The same instance therefore gets the same sampled rank whichever process, batch or
  position evaluates it: one process and many processes give identical histograms.
* DistributedSampler padding: which rows of a process are the duplicates the sampler appends.
* Histogram rows -> :class:`~reco_sampled_plugin.RankHistogram` (optionally pooling n).

Nothing here imports torchmetrics or Lightning.
"""

from __future__ import annotations

import hashlib
import logging
import math
import re
from typing import TYPE_CHECKING, Any, Callable, Mapping, NamedTuple, TypeVar

import numpy as np
import torch

from reco_sampled_plugin import RankHistogram, registry
from reco_sampled_plugin._checks import MAX_ELEMENTS, check_dense, check_elements
from reco_sampled_plugin.rank_distribution import pool_groups
from reco_sampled_plugin.scorer_ranks import score_drawn
from reco_sampled_plugin.counting import mix32

if TYPE_CHECKING:
    from reco_sampled_plugin._popularity import PopularityStats
    from reco_sampled_plugin.design import AdaptiveDesign
    from reco_sampled_plugin._estimate import Estimate
    from reco_sampled_plugin.scorer_ranks import ScorerCalls
from reco_sampled_plugin.factor_ranks import positive_scores
from reco_sampled_plugin.ranking import (
    DETERMINISTIC_TIES,
    allowed_position_to_item,
    padded_candidate_counts,
    forbidden_sorted,
    prepare_index,
)

__all__ = [
    "RankingBatch",
    "FactorBatch",
    "ScorerBatch",
    "as_ranking_batch",
    "ADAPTER_TIES",
    "keyed_uniform",
    "keyed_negatives",
    "keyed_sampled_ranks",
    "keyed_popularity_ranks",
    "keyed_sampled_ranks_from_factors",
    "keyed_scorer_ranks",
    "DeviceChecks",
    "padded_inputs",
    "histogram_from_rows",
    "metric_key",
    "estimator_label",
    "estimator_methods",
]

# ties the adapters support: deterministic ones (``random`` would depend on the batch layout)
ADAPTER_TIES = DETERMINISTIC_TIES
_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


class RankingBatch(NamedTuple):
    """One batch of an evaluation, as the adapters consume it.

    scores: (B, n) scores of every item for B instances (users), on any device.
    positives: held-out relevant items: (B, n) bool mask, (B, P) int64 padded with -1, or (B,).
    exclude: items left out of the ranking (training items), same forms, or None.
    ids: optional (B,) int64 instance ids (user indices). They key the sampled negatives, so an
        instance gets the same negatives whatever batch or process evaluates it.
    """

    scores: torch.Tensor
    positives: torch.Tensor
    exclude: torch.Tensor | None = None
    ids: torch.Tensor | None = None


class FactorBatch(NamedTuple):
    """One batch of a factor model, handed over as factors instead of scores.

    The scores are ``user_factors @ item_factors.T + item_bias``; the adapters compute them in
    cache-sized tiles and count while they are hot (:mod:`reco_sampled_plugin.factor_ranks`), so the
    (B, n) matrix is never stored: evaluating costs about what computing the scores alone would.

    user_factors: (B, d) factors of the B instances. item_factors: (n, d) factors of every item (the
    same tensor each batch; its largest norm is cached). item_bias: optional (n,) per-item offset.
    positives, exclude, ids: as in :class:`RankingBatch`.
    """

    user_factors: torch.Tensor
    item_factors: torch.Tensor
    positives: torch.Tensor
    exclude: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    item_bias: torch.Tensor | None = None


class ScorerBatch(NamedTuple):
    """One batch evaluated through a scorer (issue 27): no scores at all, the scorer scores the positives and the
    keyed negatives drawn for them (:func:`keyed_scorer_ranks`), never a full row.

    positives: as in :class:`RankingBatch`. n_items: the catalogue size n (items 0..n - 1).
    exclude, ids: as in :class:`RankingBatch`. users: optional (B,) int64 user ids handed to the scorer
    (default: the instance ids).
    """

    positives: torch.Tensor
    n_items: int
    exclude: torch.Tensor | None = None
    ids: torch.Tensor | None = None
    users: torch.Tensor | None = None


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


def padded_inputs(scores: torch.Tensor, positives: Any, exclude: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positives and exclusions as (B, P) / (B, E) int64 tensors padded with -1, validated once (in range,
    no duplicates, no positive also excluded)."""
    check_dense(scores, "scores")
    b, n = scores.shape
    return prepare_index(positives, exclude, b, n, scores.device)


# ------------------------------------------------------------------------------ keyed draws
_IntOrTensor = TypeVar("_IntOrTensor", int, torch.Tensor)


def _absorb(h: _IntOrTensor, part: _IntOrTensor) -> _IntOrTensor:
    """Fold a 64-bit integer into a 32-bit hash state (low and high words)."""
    h = mix32(h ^ (part & _M32))
    return mix32(h ^ ((part >> 32) & _M32) ^ _GOLDEN)


def keyed_uniform(seed: int, *parts: int | torch.Tensor) -> torch.Tensor:
    """Uniform float64 numbers in [0, 1) that are a pure function of (seed, *parts).

    ``parts`` are int64 tensors broadcast together; two independent 32-bit hash chains give the
    53 bits of each number. The chains grow with the parts, so put small (per-row) parts first; the
    last part must lie in 0..2**32 - 1 (a draw counter), it is folded in with a single mix. Leading
    parts may be Python ints (a round counter): they are folded in Python, with the same result as
    the same values in tensors.
    """
    h1 = mix32(((seed * 2 + 1) & _M32) ^ _GOLDEN)
    h2 = mix32((((seed >> 32) * 2 + 0x51ED27) & _M32) ^ 0x85EBCA6B)
    rest = list(parts)
    while rest and not isinstance(rest[0], torch.Tensor):  # the same arithmetic on Python ints
        p = int(rest.pop(0))
        h1, h2 = _absorb(h1, p), _absorb(h2, p ^ 0x27D4EB2F)
    if not rest:
        raise ValueError("keyed_uniform: the last part must be a tensor (the draw counter)")
    first = rest[0]
    assert isinstance(first, torch.Tensor)  # the loop above stopped at a tensor
    device = first.device
    tensors = [p if isinstance(p, torch.Tensor) else torch.full((), int(p), dtype=torch.int64, device=device) for p in rest]
    # both chains in one (2, ...) tensor: half the elementwise calls on these small tensors (dispatch-bound);
    # parts are left-padded to one rank so the chain axis stays in front under broadcasting
    rank = max(p.dim() for p in tensors)
    tensors = [p.reshape((1,) * (rank - p.dim()) + tuple(p.shape)) for p in tensors]
    if device.type == "cpu" and rank:  # in cache-sized blocks of the leading axis: the same numbers, faster
        shape = [max(sizes) for sizes in zip(*(p.shape for p in tensors))]
        step = max(1, _HASH_BLOCK // max(1, math.prod(shape[1:])))
        if shape[0] > step:
            return torch.cat([_hash_chains(h1, h2, [q if q.shape[0] == 1 else q[i:i + step] for q in tensors], device)
                              for i in range(0, shape[0], step)])
    return _hash_chains(h1, h2, tensors, device)


# numbers hashed at a time on the CPU: the dozen int64 temporaries of a block stay in cache (4096 x 100 draws: 18 ms
# at once, 3.9 ms in blocks of 2^16 on the shared 2-core machine, 1 thread; small batches are one block as before)
_HASH_BLOCK = 1 << 16


def _hash_chains(h1: int, h2: int, parts: list[torch.Tensor], device: torch.device) -> torch.Tensor:
    """:func:`keyed_uniform` of int64 tensor parts of one rank (the chains' states ``h1``, ``h2`` after the leading
    Python-int parts)."""
    rank = parts[0].dim()
    chain = (2,) + (1,) * rank
    first, xor, mul = _chain_constants(device)
    # (h1, h2) built on the device from Python scalars (a kernel argument, not a host-to-device copy)
    h = (first * h1 + (1 - first) * h2).view(chain)
    *head, last = parts
    xor = xor.view(chain)
    for p in head:
        h = _absorb(h, p.unsqueeze(0) ^ xor)
    # the last part (the largest tensor: draw indices, slots) is a small non-negative counter: one mix
    h = mix32(h ^ (last.unsqueeze(0) * mul.view(chain)))
    top = h[0] >> 5  # 27 bits
    low = h[1] >> 6  # 26 bits
    return (top * (1 << 26) + low).to(torch.float64) * (2.0**-53)


# per-chain constants: the second chain absorbs part ^ 0x27D4EB2F and mixes in last * 0x2C1B3C6D
_CHAIN_FIRST = torch.tensor([1, 0], dtype=torch.int64)
_CHAIN_XOR = torch.tensor([0, 0x27D4EB2F], dtype=torch.int64)
_CHAIN_MUL = torch.tensor([1, 0x2C1B3C6D], dtype=torch.int64)
_DEVICE_CONSTANTS: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}


def _chain_constants(device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The chain constants on ``device``, copied there once (a host-to-device copy per call would wait for the
    device: pageable memory)."""
    out = _DEVICE_CONSTANTS.get(device)
    if out is None:
        out = _DEVICE_CONSTANTS[device] = (_CHAIN_FIRST.to(device), _CHAIN_XOR.to(device), _CHAIN_MUL.to(device))
    return out


class DeviceChecks:
    """Validation flags kept on the device and read back together: one host synchronisation for every check of
    a batch (and any small values the host needs anyway), instead of one per check.

    ``add(flag, message)``: a 0-dim bool tensor, True when the check failed. ``read(*values)``: reads every flag
    and the given 0-dim integer tensors at once, raises ValueError with the first failed check's message, and
    returns the values as Python ints. Until ``read``, nothing waits for the device.
    """

    def __init__(self) -> None:
        self._flags: list[torch.Tensor] = []
        self._messages: list[str | Callable[[], str]] = []

    def add(self, flag: torch.Tensor, message: str | Callable[[], str]) -> None:
        self._flags.append(flag.reshape(()))
        self._messages.append(message)

    def __len__(self) -> int:
        return len(self._flags)

    def read(self, *values: torch.Tensor) -> list[int]:
        parts = [f.to(torch.int64) for f in self._flags] + [v.reshape(()).to(torch.int64) for v in values]
        if not parts:
            return []
        device = parts[0].device
        got = torch.stack([x if x.device == device else x.to(device) for x in parts]).tolist()  # the one sync
        flags, out = got[: len(self._flags)], got[len(self._flags):]
        self._flags, messages, self._messages = [], self._messages, []
        for bad, message in zip(flags, messages):
            if bad:
                raise ValueError(message() if callable(message) else message)
        return out


def keyed_negatives(
    pos: torch.Tensor,
    exc: torch.Tensor | None,
    n_items: int,
    n_samples: int,
    ids: torch.Tensor,
    seed: int = 0,
    replacement: bool = True,
    checks: DeviceChecks | None = None,
) -> torch.Tensor:
    """(B, P, m) irrelevant items per positive, uniform over the row's allowed items, keyed by
    (seed, ids[b], pos[b, p], draw index); never a positive or an excluded item of the row.

    With ``replacement=False`` the m items of a positive are distinct (small pools take the m
    smallest keyed keys over the whole pool, larger ones redraw duplicates with fresh keys).

    Rows without a positive draw nothing (item 0 fills their slots; callers mask padded slots), so their pools
    need not hold m items; the keys do not depend on a row's position, so the other rows draw what they draw
    in a batch of their own. The check that every row with a positive has enough items to draw from is added
    to ``checks`` (read later, with the caller's other checks: no host synchronisation here), or read at once
    when ``checks`` is None. With replacement nothing here waits for the device; without, one read (small pools,
    fused with the checks) and one per duplicate-redraw round after the first two.
    """
    own = checks is None
    checks = DeviceChecks() if checks is None else checks  # own: read here
    ids = ids if ids.device == pos.device and ids.dtype == torch.int64 else ids.to(device=pos.device, dtype=torch.int64)
    neg = _keyed_negatives(pos, exc, n_items, n_samples, ids, seed, replacement, checks)
    if own and len(checks):
        checks.read()
    return neg


def _keyed_negatives(pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, n_samples: int, ids: torch.Tensor, seed: int,
                     replacement: bool, checks: DeviceChecks | None) -> torch.Tensor:
    b, p = pos.shape
    m = n_samples
    device = pos.device
    forb = forbidden_sorted(pos, exc, n_items)
    n_allowed = n_items - (forb < n_items).sum(1)
    active = (pos >= 0).any(1)
    if checks is not None:
        need = "one irrelevant candidate" if replacement else f"m = {m} irrelevant candidates (no replacement)"
        checks.add((active & (n_allowed < (1 if replacement else m))).any(),
                   f"n_samples: some row has fewer than {need} left to sample from")
    row = ids.view(b, 1, 1)
    item = pos.view(b, p, 1)
    draw = torch.arange(m, device=device, dtype=torch.int64).view(1, 1, m)
    pool = n_allowed.clamp(min=1)  # rows without a positive (or failing the check) draw in range all the same
    view = pool.view(b, 1, 1).to(torch.float64)
    top = pool.view(b, 1, 1) - 1

    def positions(round_: int) -> torch.Tensor:
        u = keyed_uniform(seed, round_, row, item, draw)
        return torch.minimum((u * view).floor().to(torch.int64), top)

    pos_idx = positions(0)
    if not replacement:
        small = active & (n_allowed <= 4 * m)
        # one read: the checks and whether (and how wide) small pools are, before drawing from them
        any_small, width = (checks or DeviceChecks()).read(small.any(), torch.where(small, n_allowed, 0).max()
                                                            if b else torch.zeros((), dtype=torch.int64))
        if any_small:  # every row computed (keys are per row: the same as a batch of the small rows alone)
            width = max(width, m)
            slots = torch.arange(width, device=device, dtype=torch.int64).view(1, 1, -1)
            keys = keyed_uniform(seed, -1, row, item, slots)
            keys = keys.masked_fill(slots >= n_allowed.view(-1, 1, 1), 2.0)
            pos_idx = torch.where(small.view(b, 1, 1), torch.topk(keys, m, dim=2, largest=False).indices, pos_idx)
        # duplicates are rare where the pool is large: few rounds. The first two run unchecked (a round without a
        # duplicate changes nothing, so this is the same draw), then one read per round until none is left
        live = active.view(b, 1, 1) & (n_allowed >= m).view(b, 1, 1)  # rows that can have m distinct items
        for round_ in range(1, 10_000):
            srt, order = torch.sort(pos_idx, dim=2)
            dup_sorted = torch.zeros_like(srt, dtype=torch.bool)
            dup_sorted[..., 1:] = (srt[..., 1:] == srt[..., :-1]) & live
            if round_ > 2 and not bool(dup_sorted.any()):
                break
            dup = torch.zeros_like(dup_sorted).scatter(2, order, dup_sorted)
            pos_idx = torch.where(dup, positions(round_), pos_idx)
    neg = allowed_position_to_item(pos_idx, forb, n_items)
    # rows without a positive: item 0, as a batch of their own would hold (and always a valid index)
    return torch.where(active.view(b, 1, 1), neg.clamp(max=max(n_items - 1, 0)), torch.zeros_like(neg))


def keyed_sampled_ranks(
    scores: torch.Tensor,
    pos: torch.Tensor,
    exc: torch.Tensor | None,
    n_samples: int,
    ids: torch.Tensor,
    seed: int = 0,
    replacement: bool = True,
    ties: str = "pessimistic",
    checks: DeviceChecks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Sampled ranks r~ (B, P; 0 in padded slots) and candidate counts n (B,) with keyed negatives.

    Same definition as :func:`reco_sampled_plugin.sampled_ranks` (r~ = 1 + #{drawn items scoring
    higher}, ties per ``ties``; n = catalogue - excluded - other positives), on already validated
    padded inputs. ``checks``: see :func:`keyed_negatives` (None: checked here).
    """
    ranks = keyed_ranks_only(scores, pos, exc, n_samples, ids, seed, replacement, ties, checks)
    return ranks, padded_candidate_counts(scores.shape[1], pos, exc, count_other_positives=False)


def keyed_popularity_ranks(scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_samples: int,
                           ids: torch.Tensor, seed: int, weights: torch.Tensor, ties: str,
                           checks: DeviceChecks) -> tuple[torch.Tensor, torch.Tensor, PopularityStats]:
    """Sampled ranks r~ (B, P), candidate counts n (B,) and the Hansen-Hurwitz statistics
    (:class:`~reco_sampled_plugin._popularity.PopularityStats`, (B, P)) of keyed popularity draws with replacement:
    draw k of positive (b, p) is the item whose cumulative weight interval (the weights w over the row's drawable
    items, positives and excluded items at 0: q~ = w / W_u, the law of ``sampled_ranks(..., popularity=w)``) holds
    u W_u, u = keyed_uniform(seed, 0, ids[b], pos[b, p], k): a pure function of the keys, as the uniform keyed draws.
    Rows in blocks so the (rows x n) cumulative weights stay bounded. The check that every row with a positive has
    a drawable item of weight > 0 is added to ``checks``."""
    from reco_sampled_plugin._popularity import popularity_stats
    from reco_sampled_plugin.ranking import popularity_inverse_cdf

    b, n_items = scores.shape
    p, m = pos.shape[1], n_samples
    device = scores.device
    w = weights.to(device=device, dtype=torch.float64)
    forb = forbidden_sorted(pos, exc, n_items)
    u = keyed_uniform(seed, 0, ids.view(b, 1, 1), pos.view(b, p, 1), torch.arange(m, device=device).view(1, 1, m))
    neg, totals = popularity_inverse_cdf(w, forb, n_items, u)
    active = (pos >= 0).any(1)
    checks.add((active & (totals <= 0)).any(), "popularity: some row has no irrelevant item of positive weight "
                                               "left to sample from")
    pos_scores = scores.gather(1, pos.clamp(min=0))
    neg_scores = scores.gather(1, neg.reshape(b, p * m)).reshape(b, p, m)
    ranks = _ranks_among_drawn(pos_scores, neg_scores, pos >= 0, ties)
    s = pos_scores.unsqueeze(2)
    beat = (neg_scores > s) | ((neg_scores == s) if ties == "pessimistic" else torch.zeros_like(neg_scores, dtype=torch.bool))
    stats = popularity_stats(beat, neg, pos >= 0, w, forb, positives=pos)
    return ranks, padded_candidate_counts(n_items, pos, exc, count_other_positives=False), stats


def _rows_per_chunk(p: int, m: int) -> int:
    """Rows drawn at once so that a chunk's B x P x m negatives (and their scores) stay within MAX_ELEMENTS / 8
    values: the keys are per row, so chunks draw what the whole batch would, in bounded memory (a batch of 256
    users at m = 2^20 asked for 2 GiB of indices at once). One row's P x m above MAX_ELEMENTS is refused."""
    check_elements(p * m, "n_samples", "one user's P x m drawn negatives")
    return max(1, (MAX_ELEMENTS // 8) // max(p * m, 1))


def _chunk(x: torch.Tensor | None, lo: int, hi: int) -> torch.Tensor | None:
    return None if x is None else x[lo:hi]


def keyed_ranks_only(scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_samples: int, ids: torch.Tensor,
                     seed: int = 0, replacement: bool = True, ties: str = "pessimistic",
                     checks: DeviceChecks | None = None) -> torch.Tensor:
    """The ranks of :func:`keyed_sampled_ranks` alone (adaptive stages need no candidate counts)."""
    b, n_items = scores.shape
    p = pos.shape[1]
    step = _rows_per_chunk(p, n_samples)
    if b > step:  # rows in chunks: the same keyed draws, bounded memory
        return torch.cat([keyed_ranks_only(scores[lo:lo + step], pos[lo:lo + step], _chunk(exc, lo, lo + step),
                                           n_samples, ids[lo:lo + step], seed, replacement, ties, checks)
                          for lo in range(0, b, step)])
    neg = keyed_negatives(pos, exc, n_items, n_samples, ids, seed, replacement, checks)
    pos_scores = scores.gather(1, pos.clamp(min=0))
    neg_scores = scores.gather(1, neg.reshape(b, p * n_samples)).reshape(b, p, n_samples)
    return _ranks_among_drawn(pos_scores, neg_scores, pos >= 0, ties)


@torch.no_grad()
def keyed_sampled_ranks_from_factors(
    u: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    pos: torch.Tensor,
    exc: torch.Tensor | None,
    n_samples: int,
    ids: torch.Tensor,
    seed: int = 0,
    replacement: bool = True,
    ties: str = "pessimistic",
    pos_scores: torch.Tensor | None = None,
    checks: DeviceChecks | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`keyed_sampled_ranks` of the scores ``u @ v.T + bias`` without forming them: the same keyed
    negatives, scored by one dot product each (as the positives, whose scores may be passed in), their factors
    gathered in chunks (``factor_ranks.positive_scores``)."""
    ranks = keyed_factor_ranks_only(u, v, bias, pos, exc, n_samples, ids, seed, replacement, ties, pos_scores, checks)
    return ranks, padded_candidate_counts(v.shape[0], pos, exc, count_other_positives=False)


@torch.no_grad()
def keyed_factor_ranks_only(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, pos: torch.Tensor, exc: torch.Tensor | None,
                            n_samples: int, ids: torch.Tensor, seed: int = 0, replacement: bool = True,
                            ties: str = "pessimistic", pos_scores: torch.Tensor | None = None,
                            checks: DeviceChecks | None = None) -> torch.Tensor:
    """The ranks of :func:`keyed_sampled_ranks_from_factors` alone."""
    b, n_items = u.shape[0], v.shape[0]
    p = pos.shape[1]
    step = _rows_per_chunk(p, n_samples)
    if b > step:  # rows in chunks: the same keyed draws, bounded memory
        return torch.cat([keyed_factor_ranks_only(u[lo:lo + step], v, bias, pos[lo:lo + step],
                                                  _chunk(exc, lo, lo + step), n_samples, ids[lo:lo + step], seed, replacement, ties,
                                                  _chunk(pos_scores, lo, lo + step), checks)
                          for lo in range(0, b, step)])
    neg = keyed_negatives(pos, exc, n_items, n_samples, ids, seed, replacement, checks)
    if pos_scores is None:
        pos_scores = positive_scores(u, v, bias, pos)
    neg_scores = positive_scores(u, v, bias, neg.reshape(b, p * n_samples)).reshape(b, p, n_samples)
    return _ranks_among_drawn(pos_scores, neg_scores, pos >= 0, ties)


@torch.no_grad()
def keyed_scorer_ranks(calls: ScorerCalls, users: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int,
                       n_samples: int, ids: torch.Tensor, seed: int = 0, replacement: bool = True,
                       ties: str = "pessimistic", score: torch.Tensor | None = None,
                       pos_scores: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ranks of :func:`keyed_ranks_only` with scores from a scorer instead of a score matrix (issue 27): the
    same keyed negatives (:func:`keyed_negatives`, in the same row chunks), but only the slots that count are
    scored, through ``calls`` (a ``scorer_ranks.ScorerCalls``: chunked to its ``max_pairs``, each answer checked,
    timed and counted): each positive with its drawn items in one list ``[positive, drawn...]``, or, when
    ``pos_scores`` (B, P) are given (an adaptive stage), its drawn items alone.

    users: (B,) ids handed to the scorer. score: (B, P) bool, the slots to score (default every positive; the
    others get rank 0, as padded slots). Returns the ranks (B, P) int64 and the positives' float64 scores (B, P).
    Nothing but the scorer's calls and the pool check (read here, before any call) waits for the device."""
    b, p = pos.shape
    mask = pos >= 0 if score is None else score & (pos >= 0)
    device = pos.device
    if b == 0:
        return torch.zeros((0, p), dtype=torch.int64, device=device), torch.zeros((0, p), dtype=torch.float64,
                                                                                   device=device)
    step = _rows_per_chunk(p, n_samples)
    ranks, scores = [], []
    for lo in range(0, b, step):  # the keys are per row: chunks draw what the whole batch would
        hi = min(b, lo + step)
        sub_pos, sub_mask = pos[lo:hi], mask[lo:hi]
        neg = keyed_negatives(sub_pos, _chunk(exc, lo, hi), n_items, n_samples, ids[lo:hi], seed, replacement)
        pos_s, neg_s = score_drawn(calls, users[lo:hi], sub_pos, neg, sub_mask, _chunk(pos_scores, lo, hi))
        ranks.append(_ranks_among_drawn(pos_s, neg_s, sub_mask, ties))
        scores.append(pos_s)
    return (ranks[0], scores[0]) if len(ranks) == 1 else (torch.cat(ranks), torch.cat(scores))


def _ranks_among_drawn(pos_scores: torch.Tensor, neg_scores: torch.Tensor, valid: torch.Tensor, ties: str) -> torch.Tensor:
    """1 + drawn items scoring above each positive (ties per ``ties``); 0 where ``valid`` is False."""
    above = (neg_scores > pos_scores.unsqueeze(2)).sum(2)
    if ties == "optimistic":
        ranks = above + 1
    else:
        tied = (neg_scores == pos_scores.unsqueeze(2)).sum(2)
        ranks = above + tied + 1 if ties == "pessimistic" else (above + 1).to(torch.float64) + tied / 2
    return torch.where(valid, ranks, torch.zeros_like(ranks))


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


def keyed_adaptive_ranks(
    draw: Callable[[torch.Tensor, int, int, torch.Tensor], torch.Tensor], first: torch.Tensor, design: AdaptiveDesign,
    seed: int,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive sampling with keyed draws (``reco_sampled_plugin.adaptive``): ``first`` (B, P) are the ranks among
    the first m; ``draw(rows, m_new, stage_seed, need)`` ranks the positives of ``rows`` against m_new fresh keyed
    items (``need``: (len(rows), P) bool, the slots that go on; only their ranks are used, so a scorer scores
    only them).
    Stage s >= 1 keys its draws by :func:`stage_seed` (seed, s), so a positive's draws do not depend on batching.
    Returns (ranks, final sizes), (B, P) int64 (0 in padded slots).

    One host synchronisation per stage (the rows that go on: a data-dependent size), log2(cap / m) of them
    whatever the data: a stage nobody reaches draws for no row (empty tensors) rather than ending the loop, so a
    batch costs the same number of synchronisations whatever its ranks."""
    ranks = first.clone()
    sizes = torch.where(ranks > 0, torch.full_like(ranks, design.n_samples), torch.zeros_like(ranks))
    stages = design.stages.tolist()
    for s in range(1, len(stages)):
        need = (ranks == 1) & (sizes == stages[s - 1])
        rows = need.any(1).nonzero().squeeze(1)
        sub = need[rows]
        more = draw(rows, stages[s] - stages[s - 1], stage_seed(seed, s), sub)
        ranks[rows] = torch.where(sub, more, ranks[rows])
        sizes[rows] = torch.where(sub, torch.full_like(more, stages[s]), sizes[rows])
    return ranks, sizes


def stage_seed(seed: int, stage: int) -> int:
    """The key of adaptive stage ``stage``'s draws (stage 0: ``seed`` itself)."""
    return int(seed) if stage == 0 else (int(seed) * 1_000_003 + 7919 * int(stage)) % (2**31 - 1)


def adaptive_columns(design: AdaptiveDesign) -> tuple[np.ndarray, int]:
    """Column offset of each stage in an adaptive histogram row (stage s holds r~ = 1..new_s + 1, new_s the
    stage's fresh draws) and the row width sum_s (new_s + 1)."""
    news = np.diff(np.concatenate([[0], design.stages]))
    offsets = np.concatenate([[0], np.cumsum(news + 1)])
    return offsets[:-1], int(offsets[-1])


def adaptive_histogram_from_rows(counts: np.ndarray, n_items: int, design: AdaptiveDesign,
                                 max_groups: int | None) -> tuple[RankHistogram, bool]:
    """RankHistogram (groups (n, M_s)) from adaptive rows: ``counts[e]`` holds, stage after stage, the counts of
    r~ = 1..new_s + 1 of instances with n = n_items - e that stopped at stage s (:func:`adaptive_columns`); and
    whether it was pooled (as :func:`histogram_from_rows`)."""
    offsets, _ = adaptive_columns(design)
    news = np.diff(np.concatenate([[0], design.stages]))
    ns: list[int] = []
    ms: list[int] = []
    rows_out: list[np.ndarray] = []
    for s, size in enumerate(design.stages.tolist()):  # a few stages
        block = counts[:, offsets[s] : offsets[s] + news[s] + 1]
        rows = np.flatnonzero(block.sum(1) > 0)[::-1]  # ascending n
        full = np.zeros((len(rows), size + 1))
        full[:, : news[s] + 1] = block[rows]
        ns.extend((n_items - rows).tolist())
        ms.extend([size] * len(rows))
        rows_out.extend(full)
    hist = RankHistogram(np.asarray(ns, dtype=np.int64), np.asarray(ms, dtype=np.int64), tuple(rows_out))
    if max_groups is not None and hist.n_groups > max_groups * len(design.stages):
        return pool_groups(hist, max_groups * len(design.stages))[0], True
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
