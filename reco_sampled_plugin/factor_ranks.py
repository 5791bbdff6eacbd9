"""Exact ranks straight from factor matrices: the scores are computed tile by tile and never stored.

For a factor model the scores of B users are ``U @ V.T`` (B x n), plus an optional per-item bias. Ranking them the
usual way writes the whole B x n matrix to memory and reads it back to count, for each held-out item, the items
that score higher. Here each (B_t x C) tile of scores is computed into one reused buffer, counted against the
positives' scores while it is hot, and overwritten by the next tile: the count costs no extra trip to memory and
the full matrix never exists. Tiles are cache-sized on the CPU and large on an accelerator (:func:`tile_shape`).

GPU-readiness: a call reads the device once (the overflow bound below, one stacked read) besides the
validation of the positives and exclusions; the tile loop never synchronises (excluded items and positives are
written as -inf by an ``index_fill_`` whose out-of-tile entries land on a spare element past the tile), so the
count is the same for any B and n. Temporaries: one tile, the (B, P + E) indices, and gathered factors in chunks
of at most ``_GATHER_ELEMENTS`` elements (never B x n, never B x K x d).

Scores are compared as float values of the tile matmul; a positive's own score comes from one dot product
per positive (:func:`positive_scores`). Positives and excluded items are set to -inf in each tile (they do not
count as other items); positives are then compared with each other on their dot-product scores, so a positive
never counts itself and every comparison between two positives uses the same two numbers. Ranks equal
:func:`~reco_sampled_plugin.ranking.exact_ranks` on ``U @ V.T`` except where another item's score lies
within float rounding of a positive's (the two computations may round the same product differently;
identical with exactly representable scores, tested).

Precision: tiles and dot products are computed in the factors' dtype with autocast disabled (under
``torch.autocast`` the tiles and the dot products would otherwise be cast to bfloat16/float16 by different rules;
ranks under autocast equal those without, tested). TF32 (``torch.backends.cuda.matmul.allow_tf32``, or
``torch.set_float32_matmul_precision("high")``) is process-global state and is left as the caller set it: with
TF32 allowed the tile matmul rounds its float32 inputs to TF32 (~1e-3 relative) and the positives' batched dot
products may or may not (cuBLAS picks the kernel), so another item's score within that rounding of a positive's
may be counted on the wrong side. Turn TF32 off for float32-exact ranks.
"""

from __future__ import annotations

import contextlib
import math
import weakref
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import torch

from . import _graphs
from ._checks import check_dense, check_int, real_tensor
from ._inputs import Check, check_flags, factor_finite_checks, finite_flags
from ._options import check_bool
from ._pool import row_ranges
from .counting import count_beating_tile, host_array, numpy_path, tile_workers
from .ranking import (TIE_BOUNDS, capturable_index, check_ties, exact_ranks, exact_ranks_padded, index_rows,
                      prepare_index, tied_positives)

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = [
    "exact_ranks_from_factors",
    "check_factors",
    "check_finite_factors",
    "factor_ranks_padded",
    "other_positive_counts",
    "overflow_rows",
    "positive_scores",
    "score_limit",
    "tile_shape",
]

#: scores per tile (B_t x C) on the CPU: 2^21 float32 = 8 MiB, reused for every tile (cache-sized: the count
#: reads the tile while the matmul's output is still in cache). Measured (4,096 users x 100,000 items,
#: d = 64, 5 positives, 50 exclusions; one thread, CPU time, best of 5 interleaved, on a shared and noisy
#: machine), as a share of the score matmul alone into a full buffer, at batches of 256 / 1,024 / 4,096 users:
#: C <= 4,096 items with 2^21 scores 0.85 / 0.86 / 0.88; 2^22 0.86 / 0.80 / 0.83; 2^20 0.83 / 0.85 / 0.87;
#: 2^19 0.77 / 0.77 / 0.79. C <= 8,192 with 2^22 (the former default) took 0.64-0.79 s per 4,096 users against
#: 0.62-0.70 s for C <= 4,096 in an earlier run. Narrower tiles cost more calls, larger ones fall out of cache.
TILE_ELEMENTS = 1 << 21
# items per tile (C) at most on the CPU; users per tile B_t = TILE_ELEMENTS // C (balanced, see tile_shape)
_TILE_ITEMS = 1 << 12
#: scores per tile on an accelerator (CUDA...): 2^26 float32 = 256 MiB; the whole batch when it fits (a 1,024-user
#: batch of 65,536 items is one tile): few, large kernels, no per-tile launch overhead to amortise.
ACCELERATOR_TILE_ELEMENTS = 1 << 26
# gathered item-factor elements per chunk of :func:`positive_scores` (B x K_chunk x d; as the adapters' item_scores)
_GATHER_ELEMENTS = 1 << 20


def tile_shape(b: int, n: int, device: torch.device | str = "cpu", tile_elements: int | None = None) -> tuple[int, int]:
    """(rows B_t, columns C) of the score tiles for B users x n items on ``device``.

    ``tile_elements`` scores per tile (default :data:`TILE_ELEMENTS` on the CPU, :data:`ACCELERATOR_TILE_ELEMENTS`
    elsewhere). On the CPU a tile spans at most ``_TILE_ITEMS`` items (rows of a cache-sized tile stay long enough
    for the count's vector loop); elsewhere whole rows when they fit. Rows and columns are then balanced (near-equal
    blocks, no small remainder tile) without exceeding ``tile_elements``.
    """
    cpu = torch.device(device).type == "cpu"
    if tile_elements is None:
        tile_elements = TILE_ELEMENTS if cpu else ACCELERATOR_TILE_ELEMENTS
    elements = max(1, int(tile_elements))
    b, n = max(1, int(b)), max(1, int(n))
    cols = min(n, elements, _TILE_ITEMS if cpu else n)
    cols = -(-n // -(-n // cols))  # balanced: as few blocks, of near-equal widths (no thin last block)
    rows = min(b, max(1, elements // cols))
    rows = -(-b // -(-b // rows))
    return rows, cols


def _exact_precision(device: torch.device) -> contextlib.AbstractContextManager[Any]:
    """Autocast off on ``device``: tiles and dot products in the factors' own dtype, rounded alike."""
    available = getattr(torch.amp, "is_autocast_available", None)  # torch >= 2.4; cpu and cuda before
    if available(device.type) if available is not None else device.type in ("cpu", "cuda"):
        return torch.autocast(device.type, enabled=False)
    return contextlib.nullcontext()


def _factor(x: Any, name: str) -> torch.Tensor:
    x = real_tensor(x, name, "a 2-D floating matrix")  # arrays, lists; refuses ragged, bool, complex, meta
    if x.dim() != 2 or not x.is_floating_point():
        raise ValueError(f"{name}: expected a 2-D floating tensor, got shape {tuple(x.shape)} and dtype {x.dtype}")
    return x


# the item factors are usually the same tensor for every user batch: their largest norm is cached, held
# with a weak reference to that very tensor (a new tensor can reuse a freed one's id and address) and
# keyed by its storage, version counter and shape (an in-place update recomputes it)
_item_norm: tuple[weakref.ref, tuple | None, float] | None = None


def _row_norm_max(x: torch.Tensor) -> torch.Tensor:
    """Largest row norm of a 2-D ``x`` as a float64 0-d tensor on its device: NaN or inf when ``x`` holds one
    (float64 norms: no overflow from finite float32 values). On a CPU numpy's ``einsum`` sums each row's squares in
    float64 from the factors as they are (cast in small buffers): ``vector_norm(dtype=float64)`` first wrote a
    float64 copy, whose fresh pages were most of its time (100,000 x 64 float32 item factors, one thread: 21.8 ->
    4.8 ms; what every first evaluation from factors, and each new version of the item factors, paid)."""
    if x.shape[0] == 0:
        return torch.zeros((), dtype=torch.float64, device=x.device)
    if numpy_path(x):
        return torch.tensor(math.sqrt(_squares(x).max()), dtype=torch.float64)
    return torch.linalg.vector_norm(x.detach(), dim=1, dtype=torch.float64).amax()


def _squares(x: torch.Tensor, nan_entries_zero: bool = False) -> np.ndarray:
    """(rows,) float64 sums of squares of a 2-D float32 / float64 CPU ``x``'s rows (numpy's ``einsum``, cast in
    small buffers, no float64 copy of ``x``): NaN where a row holds NaN (``nan_entries_zero``: those entries count
    as 0), inf where it holds an infinity or its squares pass float64's range."""
    a = host_array(x)
    with np.errstate(over="ignore", invalid="ignore"):  # inf and NaN are the answer here (the callers name them)
        sq = np.einsum("ij,ij->i", a, a, dtype=np.float64)
        bad = np.flatnonzero(np.isnan(sq)) if nan_entries_zero else ()
        if len(bad):  # rows holding NaN: their other entries still count
            rows = np.nan_to_num(a[bad].astype(np.float64), nan=0.0, posinf=np.inf, neginf=-np.inf)
            sq[bad] = np.einsum("ij,ij->i", rows, rows)
    return sq


def _overflow_bound(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None) -> float:
    """Cauchy-Schwarz bound on every |score|, ``max |u_b| max |v_j| + max |bias_j|`` (float64), read from the
    device in one stacked transfer (the only host synchronisation of the factor path; the item factors' norm
    is cached per tensor). Raises ValueError naming the first of the factors or bias holding NaN or inf; inf where
    finite float64 factors' squares pass float64's range (entries past ~1e154: their scores are then ranked
    materialised, as for any bound past :func:`score_limit`)."""
    global _item_norm
    cache = not v.is_inference()  # inference tensors have no version counter: never cached
    key = (v.data_ptr(), v._version, tuple(v.shape), v.dtype, v.device) if cache else None
    cached = cache and _item_norm is not None and _item_norm[0]() is v and _item_norm[1] == key
    parts = {"user_factors": _row_norm_max(u)}
    if not cached:
        parts["item_factors"] = _row_norm_max(v)
    if bias is not None:
        parts["item_bias"] = bias.detach().abs().amax().to(torch.float64)
    values = dict(zip(parts, torch.stack(list(parts.values())).tolist()))  # the one read-back
    tensors = {"user_factors": u, "item_factors": v, "item_bias": bias if bias is not None else u}
    for name, value in values.items():  # an inf norm of finite float64 entries past 1e154: the bound is inf
        if math.isnan(value) or (math.isinf(value) and not bool(finite_flags(tensors[name]))):
            raise ValueError(f"{name}: contains NaN or inf")
    if cached:
        assert _item_norm is not None  # cached: the entry exists
        v_norm = _item_norm[2]
    else:
        v_norm = values["item_factors"]
        if cache:
            _item_norm = (weakref.ref(v), key, v_norm)
    return values["user_factors"] * v_norm + values.get("item_bias", 0.0)


def score_limit(dtype: torch.dtype) -> float:
    """Scores whose Cauchy-Schwarz bound ``|u| |v| (+ |bias|)`` stays below this cannot overflow in ``dtype``: a
    quarter of its largest value (the one margin of :func:`factor_ranks_padded` and :func:`overflow_rows`)."""
    return torch.finfo(dtype).max / 4


def overflow_rows(u: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """(B,) bool on the device, nothing read back: the users whose scores ``u @ v.T`` might overflow, by the
    Cauchy-Schwarz bound ``|u_b| max_j |v_j| >= score_limit`` in float64 (NaN entries count as 0, inf ones
    overflow). Per user, for a caller that checks those users' scores exactly rather than refusing the call
    (``evaluate_factors``: their rows get NaN)."""
    if numpy_path(u) and numpy_path(v):  # on a CPU: no float64 copies of the factors (50 -> ~5 ms for 1,024 users'
        # and 100,000 items' d = 64 float32 factors, one thread)
        norm_v = math.sqrt(_squares(v, True).max(initial=0.0))
        with np.errstate(invalid="ignore"):  # 0 x inf: NaN, not flagged (as in float64 on a device)
            return torch.from_numpy(np.sqrt(_squares(u, True)) * norm_v >= score_limit(u.dtype))
    norm_u = torch.linalg.vector_norm(torch.nan_to_num(u.double()), dim=1)
    norm_v = torch.linalg.vector_norm(torch.nan_to_num(v.double()), dim=1).max()
    return norm_u * norm_v >= score_limit(u.dtype)


# the deferred path's item norm (:func:`overflow_flag`): a 0-d float64 tensor on the item factors' device, never
# read back, cached as ``_item_norm`` is (a weak reference to the tensor; its storage, version, shape, dtype, device)
_item_norm_flag: tuple[weakref.ref, tuple, torch.Tensor] | None = None


def _row_norm_max_nan0(x: torch.Tensor) -> torch.Tensor:
    """:func:`_row_norm_max` with NaN row norms counted as 0 (inf ones stay inf), nothing read back: float64 row
    norms of ``x`` as it is (``vector_norm``'s dtype, as :func:`_row_norm_max`: no converted copy made here)."""
    if x.shape[0] == 0:
        return torch.zeros((), dtype=torch.float64, device=x.device)
    norms = torch.linalg.vector_norm(x.detach(), dim=1, dtype=torch.float64)
    return norms.nan_to_num(nan=0.0, posinf=math.inf).amax()


def _item_norm_on_device(v: torch.Tensor) -> torch.Tensor:
    """The largest row norm of the item factors for :func:`overflow_flag`, computed once per tensor version (the
    item factors are usually one tensor for every user batch), kept on the device."""
    global _item_norm_flag
    if v.is_inference():  # no version counter: never cached
        return _row_norm_max_nan0(v)
    key = (v.data_ptr(), v._version, tuple(v.shape), v.dtype, v.device)
    entry = _item_norm_flag
    if entry is not None and entry[0]() is v and entry[1] == key:
        return entry[2]
    norm = _row_norm_max_nan0(v)
    _item_norm_flag = (weakref.ref(v), key, norm)
    return norm


def overflow_flag(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, cached: bool = True) -> torch.Tensor:
    """0-d bool on the device, nothing read back: the bound of :func:`factor_ranks_padded`, ``max |u_b| max |v_j| +
    max |bias_j| >= score_limit`` (float64; a row norm that is NaN counts as 0, inf ones overflow: the caller's
    finite checks refuse NaN), for a caller that ranks in tiles (``bounded=True``) and reads the flag later with its
    other checks. The item factors' norm is computed as the read-at-once path's (:func:`_row_norm_max`) and cached per
    tensor version, on the device (``cached=False``: computed afresh, as a captured CUDA graph must: it would read a
    cached tensor's memory after the cache had let it go)."""
    big = _row_norm_max_nan0(u) * (_item_norm_on_device(v) if cached else _row_norm_max_nan0(v))
    if bias is not None and bias.numel():
        big = big + torch.nan_to_num(bias.detach().double()).abs().amax()
    return big >= score_limit(u.dtype)


def exact_ranks_from_factors(
    user_factors: torch.Tensor,
    item_factors: torch.Tensor,
    positives: torch.Tensor,
    exclude: torch.Tensor | None = None,
    ties: str = "pessimistic",
    *,
    item_bias: torch.Tensor | None = None,
    count_other_positives: bool = True,
    tile_elements: int | None = None,
) -> torch.Tensor:
    """1-based rank of every positive among the non-excluded items, scores = ``user_factors @ item_factors.T
    (+ item_bias)``.

    Args:
        user_factors: (B, d) user factors (any floating dtype and device).
        item_factors: (n, d) item factors, same dtype and device.
        positives: held-out relevant items: (B, n) bool mask, (B, P) int64 padded with -1, or (B,).
        exclude: items to leave out of the ranking (training items), same forms; None for none.
        ties: ``"pessimistic"`` (default), ``"optimistic"`` or ``"average"`` (``"random"``: use
            :func:`~reco_sampled_plugin.ranking.exact_ranks` on the score matrix).
        item_bias: optional (n,) score offset per item (an MF model's item bias), same dtype and device.
        count_other_positives: as in :func:`~reco_sampled_plugin.ranking.exact_ranks`.
        tile_elements: scores per tile (memory: one tile of the factors' dtype); default per device,
            :func:`tile_shape`.

    Returns:
        (B, P) ranks in the positives' padded layout, 0 in padded slots; int64, or float64 for ``average``.

    Raises:
        ValueError: shapes, dtypes or devices that do not match, NaN or inf factors or biases,
            ``ties="random"``, invalid positives / exclusions (as :func:`~reco_sampled_plugin.ranking.exact_ranks`).

    On CUDA, with index tensors, a call whose shapes were seen before is replayed from a CUDA graph (one launch; the
    same results; docs/gpu.md, "Calls replayed from CUDA graphs").
    """
    count_other_positives = check_bool(count_other_positives, "count_other_positives")
    if tile_elements is None and isinstance(ties, str) and ties in ("pessimistic", "optimistic", "average"):
        u, v, bias = check_factors(user_factors, item_factors, item_bias)
        inputs = capture_factor_inputs(u, v, bias, positives, exclude)
        if inputs is not None:  # CUDA: replayed from a CUDA graph where the shapes repeat (:mod:`._graphs`)
            def queued(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
                ranks, _, _, checks = queued_factor_ranks(*factor_tensors(tensors, bias is not None, exclude is not None),
                                                          ties, count_other_positives)
                return ranks, check_flags(checks)

            options = (ties, count_other_positives, bias is not None, exclude is not None)
            ranks, flags = _graphs.run("exact_ranks_from_factors", options, queued, inputs)
            if not any(flags.tolist()):
                return ranks
    return ranks_and_index_from_factors(user_factors, item_factors, positives, exclude, ties, count_other_positives,
                               tile_elements, item_bias)[0]


def capture_factor_inputs(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, positives: Any,
                          exclude: Any) -> tuple[torch.Tensor, ...] | None:
    """The tensors of a factor call that can be replayed from a CUDA graph (:mod:`._graphs`), else None: validated
    factors (and bias) on a device that captures, (B, P) / (B, E) index tensors there (not masks); None ones left out
    (:func:`factor_tensors` puts them back); a (B,) index tensor as its (B, 1) view (``ranking.index_rows``)."""
    positives, exclude = index_rows(positives, u.shape[0]), index_rows(exclude, u.shape[0])
    if not capturable_index(u.device, positives, exclude, rows=u.shape[0]):
        return None
    return tuple(t for t in (u, v, bias, positives, exclude) if t is not None)


def factor_tensors(tensors: Sequence[torch.Tensor], has_bias: bool, has_exclude: bool) \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor | None]:
    """(u, v, bias, positives, exclude) from :func:`capture_factor_inputs`' tuple (None where left out)."""
    it = iter(tensors)
    u, v = next(it), next(it)
    bias = next(it) if has_bias else None
    pos = next(it)
    return u, v, bias, pos, next(it) if has_exclude else None


def queued_factor_ranks(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, positives: Any, exclude: Any,
                        ties: str, count_other_positives: bool) \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[Check]]:
    """Exact ranks from validated factors with nothing read back: (ranks, padded positives, padded exclusions,
    checks). The index checks deferred, the factors' NaN/inf flags and the overflow bound as checks (the bound's item
    norm computed afresh, never from the cache), the tiles ranked as if no score could overflow: a caller reads the
    checks once and, where any is set, calls the read-at-once path (:func:`ranks_and_index_from_factors`), which
    raises or ranks the materialized scores."""
    pending: list[Check] = []
    pos, exc = prepare_index(positives, exclude, u.shape[0], v.shape[0], u.device, pending=pending)
    pending += [Check(flag, lambda: None) for flag, _ in factor_finite_checks(u, v, bias)]
    pending.append(Check(overflow_flag(u, v, bias, cached=False), lambda: None))
    ranks, _ = factor_ranks_padded(u, v, bias, pos, exc, ties, count_other_positives, bounded=True)
    return ranks, pos, exc, pending


def check_factors(user_factors: Any, item_factors: Any,
                  item_bias: Any = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Validated (B, d) user factors, (n, d) item factors and optional (n,) item bias (same dtype and device)."""
    u = _factor(user_factors, "user_factors")
    v = _factor(item_factors, "item_factors")
    if u.shape[1] != v.shape[1]:
        raise ValueError(f"item_factors: {v.shape[1]} factors but user_factors has {u.shape[1]} (they must match)")
    if u.dtype != v.dtype or u.device != v.device:
        raise ValueError(f"item_factors: dtype/device {v.dtype}/{v.device} differ from user_factors' {u.dtype}/{u.device}")
    if v.shape[0] == 0:
        raise ValueError("item_factors: no items")
    if item_bias is not None:
        if not isinstance(item_bias, torch.Tensor):
            item_bias = real_tensor(item_bias, "item_bias", "one real bias per item").to(dtype=v.dtype, device=v.device)
        check_dense(item_bias, "item_bias")
        if item_bias.shape != (v.shape[0],) or item_bias.dtype != v.dtype or item_bias.device != v.device:
            raise ValueError(
                f"item_bias: expected ({v.shape[0]},) {v.dtype} on {v.device} like item_factors, got "
                f"{tuple(item_bias.shape)} {item_bias.dtype} on {item_bias.device}"
            )
    return u, v, item_bias


def check_finite_factors(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> None:
    """Raise when a factor or bias is NaN or inf (then scores would be). :func:`factor_ranks_padded` checks
    this itself (through the norms of its overflow bound); sampled ranks alone need this. One host read."""
    checks = factor_finite_checks(u, v, bias)
    if checks:
        for bad, (_, message) in zip(torch.stack([flag for flag, _ in checks]).tolist(), checks):
            if bad:
                raise ValueError(message)


def ranks_and_index_from_factors(user_factors: TensorLike, item_factors: TensorLike, positives: TensorLike, exclude: TensorLike | None,
                                 ties: str, count_other_positives: bool = True, tile_elements: int | None = None,
                                 item_bias: TensorLike | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """:func:`exact_ranks_from_factors`, also returning the validated padded positives and exclusions."""
    if not (isinstance(ties, str) and ties == TIE_BOUNDS):  # a str before any comparison (an array compares
        check_ties(ties)                                      # element by element)
    if ties == "random":
        raise ValueError("ties: 'random' is not supported from factors; use exact_ranks(user_factors @ item_factors.T, ...)")
    count_other_positives = check_bool(count_other_positives, "count_other_positives")
    if tile_elements is not None:
        tile_elements = check_int(tile_elements, "tile_elements", 1)
    u, v, bias = check_factors(user_factors, item_factors, item_bias)
    pos, exc = prepare_index(positives, exclude, u.shape[0], v.shape[0], u.device)
    ranks, _ = factor_ranks_padded(u, v, bias, pos, exc, ties, count_other_positives, tile_elements)
    return ranks, pos, exc


def positive_scores(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, items: torch.Tensor) -> torch.Tensor:
    """Scores of the (B, K) items ``items`` (-1 padding allowed: scored as item 0) for the B users, by one
    dot product each (plus the item bias): the numbers every comparison with those items uses.

    Computed with autocast off (in the factors' dtype, as the tiles of :func:`factor_ranks_padded`) and in
    chunks of items, so the gathered item factors never exceed about ``_GATHER_ELEMENTS`` (B x K_chunk x d)
    elements whatever K (e.g. P positives x m sampled items).
    """
    b, k = items.shape
    step = max(1, _GATHER_ELEMENTS // max(b * u.shape[1], 1))
    parts = []
    with _exact_precision(u.device):
        for c0 in range(0, max(k, 1), step):
            idx = items[:, c0 : c0 + step].clamp(min=0)
            rows = v.index_select(0, idx.reshape(-1)).view(b, idx.shape[1], v.shape[1])  # (B, K_chunk, d)
            s = torch.bmm(rows, u.unsqueeze(2)).squeeze(2)
            parts.append(s if bias is None else s + bias.index_select(0, idx.reshape(-1)).view(idx.shape))
    return parts[0] if len(parts) == 1 else torch.cat(parts, 1)


@torch.no_grad()
def factor_ranks_padded(
    u: torch.Tensor,
    v: torch.Tensor,
    bias: torch.Tensor | None,
    pos: torch.Tensor,
    exc: torch.Tensor | None,
    ties: str = "pessimistic",
    count_other_positives: bool = True,
    tile_elements: int | None = None,
    *,
    bounded: bool = False,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Exact ranks from validated factors (:func:`check_factors`) and padded indices
    (:func:`~reco_sampled_plugin.ranking.prepare_index`); ``ties`` pessimistic, optimistic or average.

    One host synchronisation (the overflow bound), none per tile; tiles per :func:`tile_shape`; autocast off.
    ``bounded``: the caller has ruled out overflow itself (``|u_b| max |v_j| < score_limit`` and ``|bias| <
    score_limit``, e.g. :func:`overflow_rows` read with its other checks): no host synchronisation at all.
    Returns the (B, P) ranks and the positives' (B, P) dot-product scores (+inf in padded slots), or None
    in their place when the factors could overflow and the materialized scores were ranked instead.
    """
    if u.shape[0] == 0 or pos.shape[1] == 0:
        dtype = torch.float64 if ties == "average" else torch.int64
        shape = (*pos.shape, 2) if ties == TIE_BOUNDS else pos.shape
        return torch.zeros(shape, dtype=dtype, device=u.device), torch.zeros(pos.shape, dtype=u.dtype, device=u.device)
    with _exact_precision(u.device):
        # no score can overflow when |u| |v| + |bias| stays below the dtype's largest value (Cauchy-Schwarz);
        # otherwise rank the materialized scores, whose NaN/inf check then names the rows
        if not bounded and not _overflow_bound(u, v, bias) < score_limit(u.dtype):
            scores = u @ v.T if bias is None else torch.addmm(bias, u, v.T)
            if ties == TIE_BOUNDS:
                return exact_ranks_padded(scores, pos, exc, ties, count_other_positives, check_finite=True), None
            return exact_ranks(scores, pos, exc, ties, count_other_positives=count_other_positives), None
        return _tiled_ranks(u, v, bias, pos, exc, ties, count_other_positives, tile_elements)


def _tiled_ranks(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None, pos: torch.Tensor, exc: torch.Tensor | None, ties: str,
                 count_other_positives: bool, tile_elements: int | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`factor_ranks_padded` once the scores cannot overflow: the tile loop (no host sync in it)."""
    b, n = u.shape[0], v.shape[0]
    dev = u.device
    valid = pos >= 0
    s_pos = positive_scores(u, v, bias, pos).masked_fill(~valid, math.inf)  # padded slots: nothing beats +inf
    masked = pos if exc is None else torch.cat([pos, exc], 1)  # -inf in every tile: never counted as items
    need_ge = ties in ("pessimistic", "average", TIE_BOUNDS)
    need_gt = ties in ("optimistic", "average", TIE_BOUNDS)
    ge = torch.zeros(pos.shape, dtype=torch.int64, device=dev)
    gt = torch.zeros(pos.shape, dtype=torch.int64, device=dev)
    rows, cols = tile_shape(b, n, dev, tile_elements)
    # one flat buffer per range of tiles: each tile is a contiguous (r x w) view of its start. A masked item j of
    # tile row i lies in column block j // cols at flat offset i * w + j % cols; those of other blocks (and padding)
    # are sent to the spare element past the largest tile: a fixed-size -inf write per tile, no host sync
    spare = rows * cols
    block = torch.where(masked >= 0, masked // cols, -1)
    line = torch.arange(rows, device=dev).unsqueeze(1)
    last = (n - 1) // cols
    n_tiles = -(-b // rows) * (last + 1)

    def tiles(first: int, stop: int, ge: torch.Tensor, gt: torch.Tensor) -> None:  # tiles first..stop - 1, row-major
        flat = torch.empty(spare + 1, dtype=u.dtype, device=dev)
        for t in range(first, stop):
            r0, j = divmod(t, last + 1)
            r0 *= rows
            r1 = min(b, r0 + rows)
            c0 = j * cols
            c1 = min(n, c0 + cols)
            w = c1 - c0
            if t == first or j == 0:  # a new row block
                u_t, ref, blk_t = u[r0:r1], s_pos[r0:r1], block[r0:r1]
                col = masked[r0:r1] % cols
                offset = line[: r1 - r0] * cols + col
            tile = flat[: (r1 - r0) * w].view(r1 - r0, w)
            if bias is None:
                torch.matmul(u_t, v[c0:c1].T, out=tile)
            else:
                torch.addmm(bias[c0:c1], u_t, v[c0:c1].T, out=tile)
            if j == last and w != cols:  # a narrower last block: its rows are w apart
                offset = line[: r1 - r0] * w + col
            flat.index_fill_(0, torch.where(blk_t == j, offset, spare).view(-1), -math.inf)
            if need_ge:
                ge[r0:r1] += count_beating_tile(tile, ref, inclusive=True)
            if need_gt:
                gt[r0:r1] += count_beating_tile(tile, ref, inclusive=False)

    workers = tile_workers(n_tiles, b * n * pos.shape[1] * (need_ge + need_gt), u.dtype) if dev.type == "cpu" else 1
    if workers > 1:  # ranges of tiles split between threads, each tile's matmul and count on one core, own sums
        sums: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

        def part(first: int, stop: int) -> None:
            sums[first] = (torch.zeros_like(ge), torch.zeros_like(gt))
            tiles(first, stop, *sums[first])

        row_ranges(part, n_tiles, 1, workers)
        for first in sorted(sums):
            ge += sums[first][0]
            gt += sums[first][1]
    else:
        tiles(0, n_tiles, ge, gt)
    if count_other_positives:  # the other positives, compared on the same dot-product scores
        ge_other, gt_other = other_positive_counts(s_pos, valid)
        ge += ge_other
        gt += gt_other
        if ties not in ("average", TIE_BOUNDS):  # tied relevant items in slot order, as exact_ranks
            before, after = tied_positives(s_pos, valid)
            ge -= after
            gt += before
    if ties == "pessimistic":
        ranks = ge + 1
    elif ties == "optimistic":
        ranks = gt + 1
    elif ties == TIE_BOUNDS:  # [lo, hi]: the positive's tie group (ties="average" metrics take expectations over it)
        return torch.where(valid.unsqueeze(-1), torch.stack([gt + 1, ge + 1], -1), 0), s_pos
    else:
        ranks = (ge + gt + 2).to(torch.float64) / 2
    return torch.where(valid, ranks, torch.zeros_like(ranks)), s_pos


def other_positive_counts(pos_scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) int64 counts of the row's other valid positives scoring >= / > each positive (0 in padded slots'
    comparisons): what a positive's rank among all candidates adds to its rank among the irrelevant ones."""
    p = pos_scores.shape[1]
    other = valid.unsqueeze(1) & valid.unsqueeze(2) & ~torch.eye(p, dtype=torch.bool, device=pos_scores.device)
    ge = ((pos_scores.unsqueeze(1) >= pos_scores.unsqueeze(2)) & other).sum(2)
    gt = ((pos_scores.unsqueeze(1) > pos_scores.unsqueeze(2)) & other).sum(2)
    return ge, gt
