"""Exact and sampled ranks of held-out relevant items, from a batch of scores (any device).

Conventions: ranks are 1-based (1 = best); a higher score ranks higher. Positives and exclusions
come as a (B, n) boolean mask or a (B, P) int64 index tensor padded with -1. Output ranks have the
padded layout (B, P) (for a mask input: positives in ascending item order) with 0 in padded slots.

Tie policies (for items with exactly equal scores):

* ``"pessimistic"`` (default): tied items rank above the positive, rank = #{candidates with s >= s_p};
* ``"optimistic"``: they rank below, rank = 1 + #{candidates with s > s_p};
* ``"average"``: the mean of the two (float ranks, halves possible); the per-user metrics
  (:func:`~reco_sampled_plugin.user_metrics.per_user_metrics`, ``evaluate_factors``) then report each
  metric's expectation over uniformly random orders of the tie groups (``tie_expectation``), not the metric
  at the mean rank (which would count three relevant items tied at the top as P@2 = 1.5);
* ``"random"``: a seeded uniformly random order of each tie group, consistent across the positives
  of a row (two tied positives never share a rank).
"""

from __future__ import annotations

import math
from typing import Any, Callable, Literal, NamedTuple, Sequence, overload

import torch

from ._checks import (MAX_ELEMENTS, MAX_SAMPLES, MAX_SIZE, check_elements, check_generator, check_int, check_not_meta,
                      check_required, check_same_device, check_size, check_weights, real_tensor)
from . import _graphs
from ._hash import keyed_uniform
from ._deferred import DEFERRABLE, defer_checks, defer_flags
from ._inputs import (Check, check_flags, score_tensor, as_padded_index, check_finite_rows, check_scores, finite_check,
                       finite_flags, pending_index, run_checks, sparse_masks)
from .exclusions import Exclusions, as_exclusions, check_prepared, csr_from_padded, pending_exclusions, skip_sorted
from .counting import count_beating, count_beating_checked, count_tied_before, item_keys, sort_rows
from ._popularity import PopularityStats, exclusion_totals, popularity_stats
from ._options import check_bool
from .design import SamplingDesign, planned_design
from ._sampled import SampledRanks
from ._types import TensorLike

__all__ = [
    "TIES",
    "exact_ranks",
    "sampled_ranks",
    "candidate_counts",
    "SampledRanks",
    # building blocks on validated, padded inputs (used by the adapters)
    "as_padded_index",
    "exact_ranks_padded",
    "complete_at_cap",
    "share_from_matrix",
    "forbidden_sorted",
    "allowed_position_to_item",
    "draw_negatives",
    "rank_among_drawn",
    "popularity_draw_stats",
    "prepare_sampling_index",
    "stage_positives",
    "exclusion_counts",
    "popularity_inverse_cdf",
]

TIES = ("pessimistic", "optimistic", "average", "random")  # the one list of tie policies; subsets below
#: the deterministic policies (one rank per positive without random numbers; the adapters')
DETERMINISTIC_TIES = TIES[:3]
#: the policies that put a positive at one end of its tie group (pessimistic: last, optimistic: first)
END_TIES = TIES[:2]
#: internal tie "policy" of the ranking kernels: (B, P, 2) int64 [lo, hi], the first and last position of each
#: positive's tie group (other positives competing), from which ties="average" metrics take their expectation
TIE_BOUNDS = "bounds"


def check_ties(ties: str) -> str:
    if not isinstance(ties, str) or ties not in TIES:
        raise ValueError(f"ties: unknown policy {ties!r}; use one of {TIES}")
    return ties


def _row_seeds(batch: int, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """(B, 1) int64 seeds on ``device`` (drawn there, or on the generator's device and moved once)."""
    if generator is None:
        return torch.randint(0, 2**31 - 1, (batch, 1), device=device, dtype=torch.int64)
    seeds = torch.randint(0, 2**31 - 1, (batch, 1), generator=generator, device=generator.device, dtype=torch.int64)
    return seeds if seeds.device == torch.device(device) else seeds.to(device)


def _rand(shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device,
          dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """Uniform numbers in [0, 1) on ``device``: drawn there by its default generator, or by ``generator`` on its own
    device and moved once."""
    if generator is None:
        return torch.rand(shape, device=device, dtype=dtype)
    u = torch.rand(shape, generator=generator, device=generator.device, dtype=dtype)
    return u if u.device == torch.device(device) else u.to(device)


def _gather_padded(scores: torch.Tensor, idx: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    valid = idx >= 0
    return scores.gather(1, idx.clamp(min=0)), valid


def _removed_counts(
    removed_scores: torch.Tensor,
    removed_valid: torch.Tensor,
    pos_scores: torch.Tensor,
    inclusive: bool,
    self_removed: bool,
    n_items: int,
) -> torch.Tensor:
    """(B, P) how many removed items (excluded, or other positives) beat each positive (>= if ``inclusive``), never
    the positive itself (``self_removed``: the positives are among the removed items, each once). A (B, P, R)
    comparison where P x R <= ``n_items`` (within the score block); else the row's removed scores are sorted once
    and each positive looked up (searchsorted): O(B (P + R)) memory."""
    p, r = pos_scores.shape[1], removed_scores.shape[1]
    if p * r <= n_items:  # a (B, P, R) comparison within the score block: fewer, cheaper calls than sorting
        beat = removed_scores.unsqueeze(1) >= pos_scores.unsqueeze(2) if inclusive else \
            removed_scores.unsqueeze(1) > pos_scores.unsqueeze(2)
        counts = (beat & removed_valid.unsqueeze(1)).sum(2)
        return counts - 1 if self_removed and inclusive else counts
    low = torch.full_like(removed_scores, -math.inf)
    srt = sort_rows(torch.where(removed_valid, removed_scores, low))  # padding first
    at = torch.searchsorted(srt, pos_scores.contiguous(), right=not inclusive)
    counts = torch.minimum(r - at, removed_valid.sum(1, keepdim=True))  # the padding is a prefix: never counted
    if self_removed and inclusive:
        counts = counts - 1  # its own score (only read at valid positives)
    return counts


def _removed_tied_before(rem_scores: torch.Tensor, rem_valid: torch.Tensor, rem_idx: torch.Tensor, pos_scores: torch.Tensor,
                         pos_keys: torch.Tensor, row_seed: torch.Tensor) -> torch.Tensor:
    """(B, P) removed items tied with each positive whose :func:`item_keys` key is smaller (never the positive
    itself: same key). Scores become order-preserving integer codes per row (their place among the row's removed
    and positive scores); (code, key) pairs pack into one int64, sorted once and searched: O(B (P + R)) memory."""
    both = torch.sort(torch.cat([rem_scores, pos_scores], 1), dim=1).values
    code_rem = torch.searchsorted(both, rem_scores.contiguous())  # equal scores, equal codes; < 2^31
    code_pos = torch.searchsorted(both, pos_scores.contiguous())
    keys = item_keys(rem_idx.clamp(min=0), row_seed)  # 32-bit
    packed = torch.where(rem_valid, code_rem * (1 << 32) + keys, torch.full_like(keys, torch.iinfo(torch.int64).max))
    packed = torch.sort(packed, dim=1).values
    below_key = torch.searchsorted(packed, code_pos * (1 << 32) + pos_keys)  # (code, key) < the positive's
    below_score = torch.searchsorted(packed, code_pos * (1 << 32))  # code < the positive's
    return below_key - below_score


def prepare_inputs(scores: Any, positives: Any, exclude: Any, check_finite: bool,
                   pending: list[Check] | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Scores as a tensor and the positives / exclusions as padded indices (:func:`prepare_index`, ``pending`` as
    there); ``check_finite``: the scores' NaN/inf check read back with the index checks."""
    scores = score_tensor(scores)
    b, n = scores.shape
    first = [finite_check(scores)] if check_finite else []  # read back with the index checks: one synchronisation
    pos, exc = _prepare_index(positives, exclude, b, n, scores.device, first, pending)
    return scores, pos, exc


def prepare_index(positives: Any, exclude: Any, b: int, n: int, device: torch.device, *,
                  pending: list[Check] | None = None, bucket: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Positives and exclusions of B rows over n items as padded (B, P) / (B, E) int64 indices (-1 padding),
    validated: in range, no positive also excluded (a ValueError naming the argument). Every check is read back
    in one host synchronisation (two when one argument is a mask and the other an index tensor).

    ``pending`` (a list): the value checks of index tensors (range, duplicates, a positive also excluded) are
    appended to it unread instead (no host synchronisation; out-of-range indices returned as -1 padding, so
    the batch can be computed on safely, and no duplicate or clash check fails on them), for a caller that reads them later (the torchmetrics adapters on an accelerator). A
    mask still reads its width (a data-dependent shape), and the checks read with it, at once. ``bucket``: where
    calls on ``device`` are replayed from CUDA graphs, a mask's indices padded to a power-of-two width
    (:func:`_width_bucket`: an evaluation loop's batches then repeat their shapes; the Lightning callback's)."""
    return _prepare_index(positives, exclude, b, n, device, [], pending, bucket)


_CLASH_MESSAGE = "exclude: a row excludes one of its own positives; a relevant item cannot also be excluded"


def _clash_error(rows: torch.Tensor) -> None:
    raise ValueError(
        f"exclude: {int(rows.sum())} row(s) exclude one of their own positives "
        f"(first: row {int(rows.nonzero()[0, 0])}); a relevant item cannot also be excluded"
    )


def _clash_check(pos: torch.Tensor, exc: torch.Tensor) -> Check:
    """Each positive looked up in its row's sorted exclusions: O(B (P + E)) memory, not a (B, P, E) comparison."""
    srt = sort_rows(exc)
    at = torch.searchsorted(srt, pos.contiguous()).clamp(max=srt.shape[1] - 1)
    clash = (srt.gather(1, at) == pos) & (pos >= 0)
    return Check(clash.any(), lambda: _clash_error(clash.any(1)), "exclude_clash", _CLASH_MESSAGE)


def _mask_clash_check(mask: torch.Tensor, idx: torch.Tensor) -> Check:
    """A (B, n) mask looked up at the other argument's (B, K) indices (padding, and entries out of range, whose own
    check fails first, looked up as nothing): read with the mask's widths, before any index is listed."""
    n = mask.shape[1]
    clash = mask.gather(1, idx.clamp(0, n - 1)) & (idx >= 0) & (idx < n)
    return Check(clash.any(), lambda: _clash_error(clash.any(1)), "exclude_clash", _CLASH_MESSAGE)


def _prepare_index(positives: Any, exclude: Any, b: int, n: int, device: torch.device, first: list[Check],
                   pending: list[Check] | None = None, bucket: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(exclude, Exclusions):  # prepared: the exact paths take its padded form
        exclude = check_prepared(exclude, n, b, device).padded()
    if n == 0:  # an empty catalogue: nothing to rank (an empty (B, 0) mask still gives (B, 0) ranks)
        given = positives if isinstance(positives, torch.Tensor) else torch.as_tensor(positives)
        if given.dtype != torch.bool and given.numel():
            raise ValueError("scores: has 0 items (columns), so there is nothing to rank the positives among; "
                             "give scores for the whole catalogue")
    safe = pending is not None
    pos, pos_mask, checks = pending_index(positives, n, b, "positives", device, safe=safe)
    checks = list(first) + checks
    exc: Any = None  # padded indices or a mask, then padded indices
    exc_mask: bool | None = None
    if exclude is not None:
        exc, exc_mask, exc_checks = pending_index(exclude, n, b, "exclude", device, safe=safe)
        checks += exc_checks
    masks = [t for t, is_mask in ((pos, pos_mask), (exc, exc_mask)) if is_mask and b and n]
    widths: list[torch.Tensor] = []
    if masks:  # one pass over the masks' words for both, their widths read with the checks
        sparse = sparse_masks(masks)
        widths = sparse.reads()
        if sparse.overlap is not None:
            pm, em = pos, exc
            checks.append(Check(sparse.overlap, lambda: _clash_error((pm & em).any(1))))
        if exclude is not None and bool(pos_mask) != bool(exc_mask):  # a mask and an index tensor: looked up now
            mask, idx = (exc, pos) if exc_mask else (pos, exc)
            if idx.numel():
                checks.append(_mask_clash_check(mask, idx))
    elif exc is not None and not pos_mask and not exc_mask and pos.numel() and exc.numel():
        checks.append(_clash_check(pos, exc))
    if pending is not None and not masks:  # nothing to read now: the checks go to the caller, unread
        pending.extend(checks)
        values: list[int] = []
    else:
        values = run_checks(checks, widths)  # every check (and the masks' widths) in one synchronisation
    if masks:
        padded = sparse.padded(values, _width_bucket if bucket and _graphs.enabled(device) else int)
    if pos_mask:
        pos = padded.pop(0) if b and n else torch.full((b, 0), -1, dtype=torch.int64, device=device)
    if exc_mask:
        exc = padded.pop(0) if b and n else torch.full((b, 0), -1, dtype=torch.int64, device=device)
    if n == 0:  # an empty catalogue: index tensors can only hold padding (checked): nothing to rank, no slot
        pos = pos[:, :0]
        exc = None if exc is None else exc[:, :0]
    return pos, exc


def _width_bucket(width: int) -> int:
    """The padded width of a mask's indices where calls are replayed from CUDA graphs: the next power of two (0 and 1
    as they are). A batch's width is its row with the most entries, so masks give a new shape, hence a new graph,
    almost every batch; in powers of two an evaluation's batches share a few (padding slots cost a few comparisons,
    never a result: they are -1)."""
    return 1 << (width - 1).bit_length() if width > 1 else width


def _exclusions_clash(pos: torch.Tensor, exc: Exclusions) -> Check:
    """Each positive looked up in its row's prepared exclusions: O(B P log T)."""
    clash = exc.contains(pos)  # False at padding
    return Check(clash.any(), lambda: _clash_error(clash.any(1)), "exclude_clash", _CLASH_MESSAGE)


def prepare_sampling_index(positives: Any, exclude: Any, b: int, n: int, device: torch.device, first: Sequence[Check] = ()) \
        -> tuple[torch.Tensor, Exclusions | None, list[Check]]:
    """:func:`prepare_index` for the draws: positives as padded (B, P) int64 indices, exclusions as a validated
    :class:`~reco_sampled_plugin.exclusions.Exclusions` (CSR, rows sorted once; None for none), and the checks
    left for the caller to read with its next ones (``later``: the exclusions' duplicates, positives also
    excluded; :func:`draw_negatives` takes them). ``exclude`` may be prepared already (checked against B, n and
    the device, then used as it is). Index exclusions are sorted once, as T flat entries (not B x longest list).
    The checks keep :func:`prepare_index`'s order (``first``, the positives', the exclusions' range, their
    duplicates, positives also excluded); one read back here (the flat size T is read with the first checks), as
    :func:`prepare_index` has."""
    exc: Any  # padded indices, a mask, or pending / prepared exclusions
    if exclude is None or n == 0 or b == 0:
        pos, exc = _prepare_index(positives, exclude, b, n, device, list(first))
        return pos, as_exclusions(exc, n, b), []
    pos, pos_mask, checks = pending_index(positives, n, b, "positives", device)
    exc, exc_checks = pending_exclusions(exclude, n, b, device)
    checks = list(first) + checks + exc_checks
    later: list[Check] = []
    if isinstance(exc, torch.Tensor):  # a mask: one pass over the masks' words (with the positives' if a mask)
        masks = ([pos] if pos_mask else []) + [exc]
        sparse = sparse_masks(masks)
        if sparse.overlap is not None:
            pm, em = pos, exc
            checks.append(Check(sparse.overlap, lambda: _clash_error((pm & em).any(1))))
        values = run_checks(checks, sparse.reads() + [sparse.totals[-1]])
        padded = sparse.padded(values[:-1])
        pos = padded[0] if pos_mask else pos
        ex = csr_from_padded(padded[-1], padded[-1] >= 0, values[-1], n, sort=False)[0]  # mask rows come sorted
        if not pos_mask and pos.numel() and ex.total:
            later.append(_exclusions_clash(pos, ex))
        return pos, ex, later
    prepared = isinstance(exc, Exclusions)  # prepared: its own checks were done
    widths = []
    if pos_mask:
        sparse = sparse_masks([pos])
        widths = sparse.reads()
    values = run_checks(checks, widths + ([] if prepared else [exc.total]))
    if pos_mask:
        pos = sparse.padded(values[:len(widths)])[0]
    ex, later = (exc, []) if prepared else exc.finish(values[-1])
    if pos.numel() and ex.total:
        later.append(_exclusions_clash(pos, ex))
    return pos, ex, later


def stage_positives(pos: torch.Tensor, idx: torch.Tensor, from_mask: bool) -> torch.Tensor:
    """The padded positives of the rows ``idx`` for an adaptive stage, as the stage's own preparation of the
    caller's form would give them: an index form keeps its width; a mask's (left-packed) rows are trimmed to
    their longest (so the stage draws the same shapes, hence the same random numbers)."""
    sub = pos[idx]
    if from_mask and sub.shape[1]:
        width = int((sub >= 0).sum(1).max()) if sub.shape[0] else 0
        sub = sub[:, :width]
    return sub


def exclusion_counts(exc: torch.Tensor | Exclusions | None, b: int, device: torch.device) -> torch.Tensor:
    """(B,) int64 excluded items per row of padded (B, E) exclusions, :class:`Exclusions`, or None (zeros)."""
    if exc is None:
        return torch.zeros(b, dtype=torch.int64, device=device)
    if isinstance(exc, Exclusions):
        return exc.counts
    return (exc >= 0).sum(1)


def candidate_counts(n_items: int, positives: torch.Tensor, exclude: torch.Tensor | None, count_other_positives: bool = True) -> torch.Tensor:
    """Candidates per row: n_items minus excluded items (minus the other positives when they do not compete).

    ``positives`` and ``exclude`` take every form :func:`exact_ranks` takes: (B, n_items) bool masks, (B, P) int64
    indices padded with -1, or (B,); they are validated against ``n_items`` (a mask of another width, an index
    outside 0..n_items - 1 or a positive also excluded is a ValueError naming the argument, never a negative
    count).
    """
    if type(n_items) is not int or not 0 <= n_items <= MAX_SIZE:  # a valid Python int needs no tensor check
        n_items = check_size(n_items, "n_items", 0)
    count_other_positives = check_bool(count_other_positives, "count_other_positives")
    given = positives if isinstance(positives, torch.Tensor) else real_tensor(positives, "positives", booleans=True)
    rows = given.shape[0] if given.dim() else 1
    if n_items == 0 and given.dtype != torch.bool and given.numel():  # this call's n_items, not a score matrix's
        raise ValueError("n_items: 0 items, so no positive can lie among them; give the catalogue's size (at least 1)")
    pos, exc = prepare_index(positives, exclude, rows, n_items, given.device)
    return padded_candidate_counts(n_items, pos, exc, count_other_positives)


def padded_candidate_counts(n_items: int, positives: torch.Tensor, exclude: torch.Tensor | Exclusions | None,
                      count_other_positives: bool = True) -> torch.Tensor:
    """:func:`candidate_counts` on validated padded (B, P) / (B, E) index tensors (-1 padding); ``exclude`` may be
    an :class:`~reco_sampled_plugin.exclusions.Exclusions`."""
    n = n_items - exclusion_counts(exclude, positives.shape[0], positives.device)
    if not count_other_positives:  # a row without a positive: its irrelevant items only
        n = n - ((positives >= 0).sum(1) - 1).clamp(min=0)
    return n


def exact_ranks(
    scores: torch.Tensor,
    positives: torch.Tensor,
    exclude: TensorLike | Exclusions | None = None,
    ties: str = "pessimistic",
    *,
    count_other_positives: bool = True,
    generator: torch.Generator | None = None,
    check_finite: bool = True,
) -> torch.Tensor:
    """1-based rank of every positive among the non-excluded items of its row.

    Args:
        scores: (B, n) scores of every item for B users (any floating dtype and device).
        positives: held-out relevant items: (B, n) bool mask, (B, P) int64 padded with -1, or (B,).
        exclude: items to leave out of the ranking (training items), same forms; None for none.
        ties: ``"pessimistic"`` (default), ``"optimistic"``, ``"average"`` or ``"random"``; relevant items tied
            with each other are placed in slot order by the first two (their ranks form an ordering).
        count_other_positives: True (default) ranks each positive among all candidates, the other
            positives included (the ranking every full-list metric uses); False ranks it among the
            irrelevant candidates only, the rank that sampled metrics estimate.
        generator: seeds ``ties="random"``.
        check_finite: raise on NaN or inf scores (checked in the counting pass over ``scores``). ``False`` is the
            caller's promise: a relevant item scored NaN then gets rank 0, padding's mark (it drops out of the
            metrics), under every tie policy; a NaN elsewhere beats nothing.

    Returns:
        (B, P) ranks in the positives' padded layout, 0 in padded slots; int64, or float64 for
        ``ties="average"``.

    On CUDA, with index tensors, a call whose shapes were seen before is replayed from a CUDA graph (one launch; the
    same results; docs/gpu.md, "Calls replayed from CUDA graphs").
    """
    check_ties(ties)
    count_other_positives = check_bool(count_other_positives, "count_other_positives")
    check_finite = check_bool(check_finite, "check_finite")
    check_generator(generator)
    inputs = capture_inputs(scores, positives, exclude) if generator is None and ties != "random" else None
    if inputs is not None:
        # an accelerator: the call replayed from a CUDA graph where its shapes repeat (:mod:`._graphs`); its checks
        # read back once, an invalid input ranked again below for its error
        notes: list[tuple[str, str]] = []

        def queued(*tensors: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
            ranks, _, _, checks = queued_exact_ranks(tensors[0], tensors[1], tensors[2] if len(tensors) > 2 else None,
                                                     ties, count_other_positives, None, check_finite)
            notes[:] = [(c.name, c.message) for c in checks]
            return ranks, check_flags(checks)

        ranks, flags = _graphs.run("exact_ranks", (ties, count_other_positives, check_finite), queued, inputs, notes)
        if defer_flags(flags, notes) or not any(flags.tolist()):  # in a deferred_checks block: read at its end
            return ranks
    ranks, _, _, checks = queued_exact_ranks(scores, positives, exclude, ties, count_other_positives, generator,
                                             check_finite)
    defer_checks(checks)
    return ranks


def capture_inputs(scores: Any, *index: Any) -> tuple[torch.Tensor, ...] | None:
    """The tensors of a call that can be replayed from a CUDA graph (:mod:`._graphs`), else None: floating (B, n)
    scores on a device that captures, (B, P) index tensors (or (B,): one item per row, as its (B, 1) view; not
    masks: their widths are read back) on the same device; a None index left out."""
    if not (isinstance(scores, torch.Tensor) and scores.dim() == 2 and scores.is_floating_point()):
        return None
    index = tuple(index_rows(t, scores.shape[0]) for t in index)
    if not capturable_index(scores.device, *index, rows=scores.shape[0]):
        return None
    return (scores,) + tuple(t for t in index if t is not None)


def index_rows(t: Any, b: int) -> Any:
    """A (b,) integer tensor (one item per row) as its (b, 1) view, as every path reads it (the same ranks, shapes
    and checks); anything else as it is."""
    if isinstance(t, torch.Tensor) and t.dim() == 1 and t.shape[0] == b and t.dtype in (torch.int64, torch.int32):
        return t.unsqueeze(1)
    return t


def capturable_index(device: torch.device, *index: Any, rows: int | None = None, capture: bool = True) -> bool:
    """Whether calls on ``device`` are captured (:mod:`._graphs`; not asked with ``capture=False``) and each of
    ``index`` is None or a (B, P) integer tensor there (not a mask: its width is read back), of ``rows`` rows where
    given (else the eager path refuses the call before it changes anything)."""
    return (not capture or _graphs.enabled(device)) and all(
        t is None or (isinstance(t, torch.Tensor) and t.device == device and t.dim() == 2
                      and t.dtype in (torch.int64, torch.int32) and (rows is None or t.shape[0] == rows))
        for t in index)


def queued_exact_ranks(scores: Any, positives: Any, exclude: Any, ties: str, count_other_positives: bool,
                       generator: torch.Generator | None, check_finite: bool) \
        -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None, list[Check]]:
    """:func:`exact_ranks`' work queued, its checks not read: (ranks, padded positives, padded exclusions, checks).
    The index checks are deferred (out-of-range entries ranked as padding meanwhile) to be read back with the counting
    pass's NaN/inf rows: one synchronisation after the work is queued, not one before it and one after (a mask still
    reads its width first)."""
    pending: list[Check] = []
    scores, pos, exc = prepare_inputs(scores, positives, exclude, False, pending)
    ranks, finite = exact_ranks_padded_finite(scores, pos, exc, ties, count_other_positives, generator, check_finite,
                                              False)
    if not check_finite and pos.numel():  # a relevant item scored NaN: padding's 0 (optimistic ranked it first)
        nan = torch.isnan(scores.gather(1, pos.clamp(min=0)))
        ranks = ranks.masked_fill(nan.unsqueeze(-1) if ranks.dim() == 3 else nan, 0)  # (B, P, 2): tie bounds
    if finite is not None:
        rows = finite
        pending.append(Check(~rows.all(), lambda: check_finite_rows(rows), "scores_finite", DEFERRABLE["scores_finite"]))
    return ranks, pos, exc, pending


def tied_positives(pos_scores: torch.Tensor, valid: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, P) counts of the other valid positives of the row with an equal score that come before / after
    each positive in slot order. Deterministic tie policies place tied relevant items in slot order, so
    their ranks form an ordering (two tied relevant items at ranks 1 and 2, never both 1 or both 2, which
    would give P@1 = 2 or an AUC above 1)."""
    tied = (pos_scores.unsqueeze(2) == pos_scores.unsqueeze(1)) & valid.unsqueeze(1) & valid.unsqueeze(2)
    return tied.tril(-1).sum(2), tied.triu(1).sum(2)  # tied[b, k, j] with j < k (before k), with j > k (after)


def exact_ranks_padded(scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, ties: str, count_other_positives: bool = True,
                       generator: torch.Generator | None = None, *, check_finite: bool = False) -> torch.Tensor:
    """:func:`exact_ranks` on validated inputs: (B, n) scores, padded (B, P) positives and (B, E)
    exclusions (-1 padding, see :func:`as_padded_index`), no input checks except, with ``check_finite``,
    the NaN/inf check of the scores (done by the counting pass itself); (B, P) 1-based ranks."""
    return exact_ranks_padded_finite(scores, pos, exc, ties, count_other_positives, generator, check_finite, True)[0]


def exact_ranks_padded_finite(scores: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, ties: str, count_other_positives: bool,
                              generator: torch.Generator | None, check_finite: bool,
                              raise_now: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(ranks, finite rows): with ``check_finite``, the (B,) bool rows free of NaN/inf from the counting pass, raised
    on at once (``raise_now``) or returned unread (None without ``check_finite``), for a caller that reads them
    back with its results (one synchronisation fewer)."""
    finite = None
    if check_finite and pos.shape[1] == 0:
        if raise_now:
            check_scores(scores, True)
        else:
            finite = finite_flags(scores, dim=1)
        check_finite = False

    def count(ref: torch.Tensor, inclusive: bool) -> torch.Tensor:  # the first count also checks the scores
        nonlocal check_finite, finite
        if not check_finite:
            return count_beating(scores, ref, inclusive=inclusive)
        counts, finite = count_beating_checked(scores, ref, inclusive=inclusive)
        if raise_now:
            check_finite_rows(finite)
        check_finite = False
        return counts

    pos_scores, pos_valid = _gather_padded(scores, pos)
    removed = [exc] if exc is not None else []
    if not count_other_positives:
        removed.append(pos)
    if removed:
        rem_idx = torch.cat(removed, dim=1)
        rem_scores, rem_valid = _gather_padded(scores, rem_idx)
    # counts over the whole row, then subtract what removed items contributed
    if ties in ("pessimistic", "average", TIE_BOUNDS):
        ge = count(pos_scores, True)  # includes the positive itself
        if removed:
            ge = ge - _removed_counts(rem_scores, rem_valid, pos_scores, True, not count_other_positives, scores.shape[1])
    if ties in ("optimistic", "average", "random", TIE_BOUNDS):
        gt = count(pos_scores, False)
        if removed:
            gt = gt - _removed_counts(rem_scores, rem_valid, pos_scores, False, not count_other_positives, scores.shape[1])
    if count_other_positives and ties in END_TIES and pos.shape[1] > 1:
        before, after = tied_positives(pos_scores, pos_valid)  # tied relevant items in slot order
        if ties == "pessimistic":
            ge = ge - after
        else:
            gt = gt + before
    if ties == "pessimistic":
        ranks = ge
    elif ties == "optimistic":
        ranks = gt + 1
    elif ties == "average":
        ranks = (ge + gt + 1).to(torch.float64) / 2
    elif ties == TIE_BOUNDS:  # first and last position of the tie group (relevant items not put in slot order)
        return torch.where(pos_valid.unsqueeze(-1), torch.stack([gt + 1, ge], -1), 0), finite
    else:
        seeds = _row_seeds(scores.shape[0], generator, scores.device)
        pos_keys = item_keys(pos.clamp(min=0), seeds)
        tb = count_tied_before(scores, pos_scores, pos_keys, seeds)
        if removed:
            tb = tb - _removed_tied_before(rem_scores, rem_valid, rem_idx, pos_scores, pos_keys, seeds)
        ranks = gt + 1 + tb
    return torch.where(pos_valid, ranks, torch.zeros_like(ranks)), finite


# ----------------------------------------------------------------------------------------- completion
#: elements of one block of full score rows built to rank completed positives exactly (rows x n)
COMPLETION_BLOCK = 1 << 22


def _fork(generator: torch.Generator | None) -> torch.Generator | None:
    """A copy of ``generator`` (same state): the completion's random tie order draws nothing from the caller's."""
    if generator is None:
        return None
    fork = torch.Generator(device=generator.device)
    fork.set_state(generator.get_state())
    return fork


def complete_at_cap(need: torch.Tensor, pos: torch.Tensor, exc: torch.Tensor | None, n_items: int, ties: str,
                    generator: torch.Generator | None, row_scores: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """Exact ranks of the ``need`` (B, P) positives among their rows' irrelevant candidates (catalogue minus the
    row's positives minus its exclusions) and themselves, 0 elsewhere: (B, P) int64 (float64 for ``ties="average"``).

    The rows holding such a positive are ranked in blocks of ``COMPLETION_BLOCK // n`` rows:
    ``row_scores(rows)`` ((k,) int64 row indices) returns their (k, n) scores (the score matrix's rows, or the
    scorer loop's rows built from the scored candidates: only the candidates' and the positives' entries are
    read), then :func:`exact_ranks_padded` with ``count_other_positives=False``.
    ``ties="random"`` orders ties by a copy of ``generator`` (one seed per row and block, as the matrix path and
    the scorer path both draw them), so the caller's generator is not advanced. ``pos`` / ``exc``: padded (B, P) /
    (B, E) indices (-1 padding).
    """
    dtype = torch.float64 if ties == "average" else torch.int64
    out = torch.zeros(need.shape, dtype=dtype, device=need.device)
    rows = need.any(1).nonzero().squeeze(1)
    if rows.numel() == 0:
        return out
    gen = _fork(generator)
    block = max(1, COMPLETION_BLOCK // max(n_items, 1))
    for start in range(0, rows.numel(), block):  # blocks of rows bound the (k, n) buffer
        idx = rows[start:start + block]
        scores = row_scores(idx)
        r = exact_ranks_padded(scores, pos[idx], None if exc is None else exc[idx], ties, False, gen)
        out[idx] = torch.where(need[idx], r.to(dtype), out[idx])
    return out


# ------------------------------------------------------------------------------------------------ draws


def share_from_matrix(sampled: SampledRanks, scores: torch.Tensor, pos: torch.Tensor, exc: Any, ties: str,
                      generator: torch.Generator | None, row_keys: torch.Tensor | None = None) -> SampledRanks:
    """``sampled`` with its design's exact share (``_design_based.draw_share``; itself where there is none) on a
    score matrix (B, n): the chosen positives ranked exactly among their rows' candidates (:func:`complete_at_cap`:
    catalogue minus the row's positives minus its exclusions; the generator is not advanced), rows keyed by
    ``row_keys`` (default: row numbers)."""
    from ._design_based import draw_share  # the share's pi may need a fit of the sampled ranks (phase 2)

    if sampled.design is None or sampled.design.exact_share is None:
        return sampled
    exc_p = exc.padded() if isinstance(exc, Exclusions) else exc
    keys = torch.arange(scores.shape[0], device=scores.device) if row_keys is None else row_keys
    n = scores.shape[1]
    return draw_share(sampled, keys, pos,
                      lambda chosen: complete_at_cap(chosen, pos, exc_p, n, ties, generator, lambda idx: scores[idx]))


def forbidden_sorted(pos: torch.Tensor, exc: torch.Tensor | None, n_items: int) -> torch.Tensor:
    """Per row, the positives and excluded items (padded (B, P) / (B, E) indices, -1 padding) sorted
    ascending, padding replaced by ``n_items`` (sorts last): the items a sampler must skip."""
    forb = pos if exc is None else torch.cat([pos, exc], dim=1)
    forb = torch.where(forb >= 0, forb, torch.full_like(forb, n_items))  # padding sorts last
    return sort_rows(forb)


def _uniform_positions(n_allowed: torch.Tensor, shape: tuple[int, ...], generator: torch.Generator | None,
                       device: torch.device) -> torch.Tensor:
    """Uniform integers in [0, n_allowed[b]) of the given (B, ...) shape, on ``device`` (see :func:`_rand`)."""
    u = _rand(shape, generator, device)
    view = n_allowed.view((-1,) + (1,) * (len(shape) - 1)).to(torch.float64)
    return torch.minimum((u * view).floor().to(torch.int64), view.to(torch.int64) - 1)


def allowed_position_to_item(positions: torch.Tensor, forb_sorted: torch.Tensor, n_items: int) -> torch.Tensor:
    """Map the u-th allowed position (0-based, (B, K)) to its item index, skipping the row's sorted
    forbidden items (:func:`forbidden_sorted`): uniform positions become uniform irrelevant items."""
    b = positions.shape[0]
    q = forb_sorted.shape[1]
    if q == 0:
        return positions
    # g_i = forb_i - i = allowed items below forbidden item i (non-decreasing); padding -> huge
    g = forb_sorted - torch.arange(q, device=forb_sorted.device)
    g = torch.where(forb_sorted < n_items, g, torch.full_like(g, torch.iinfo(torch.int64).max))
    flat = positions.reshape(b, math.prod(positions.shape[1:]))  # not -1: b may be 0
    shift = torch.searchsorted(g.contiguous(), flat.contiguous(), right=True)
    return (flat + shift).reshape(positions.shape)


def draws_for_rows_with_positives(pos: torch.Tensor, exc: torch.Tensor | None, m: int,
                                  draw: Callable[[torch.Tensor, torch.Tensor | None, torch.Tensor | None], torch.Tensor]) -> torch.Tensor:
    """(B, P, m) negatives from ``draw(pos, exc, rows)`` for the rows that have a positive only (``rows``: their
    bool mask, None when every row has one, so such a batch draws as it always did). Rows without a positive
    draw nothing (item 0 fills their slots; callers mask padded slots), so their pools need not hold m items."""
    active = (pos >= 0).any(1)
    if bool(active.all()):
        return draw(pos, exc, None)
    out = torch.zeros((pos.shape[0], pos.shape[1], m), dtype=torch.int64, device=pos.device)
    if bool(active.any()):
        out[active] = draw(pos[active], None if exc is None else exc[active], active)
    return out


# redraw rounds of sampling without replacement run before the one check for duplicates left (each round
# redraws only the duplicates, from the items not yet drawn: after two rounds some are left in rare batches)
_REDRAW_ROUNDS = 2
# the least share of the total weight a row's drawable items may hold under popularity sampling (float64 cumulative
# sums place an item of 2^-40 of the total with 12 bits to spare), and the redraw rounds a draw without replacement
# may take before it gives up (an item it needs lies below the cumulative sum's resolution: it never comes)
POPULARITY_RESOLUTION = 2.0 ** -40
_MAX_REDRAWS = 200


def _later_duplicates(x: torch.Tensor, fresh: torch.Tensor | None = None) -> torch.Tensor:
    """(..., m) bool: the entries of ``x`` equal to another entry that takes precedence: entries not ``fresh``
    (kept from earlier rounds) first, then position order. Kept entries stay, so repeated redraws of the marked
    ones take the first m distinct values of an i.i.d. stream: draws without replacement (successive sampling)."""
    order1 = None
    if fresh is not None:
        order1 = torch.sort(fresh.to(torch.uint8), dim=-1, stable=True).indices  # kept first, in position order
        x = x.gather(-1, order1)
    srt, order = torch.sort(x, dim=-1, stable=True)
    dup_sorted = torch.zeros_like(srt, dtype=torch.bool)
    dup_sorted[..., 1:] = srt[..., 1:] == srt[..., :-1]
    if order1 is not None:
        order = order1.gather(-1, order)
    return torch.zeros_like(dup_sorted).scatter(-1, order, dup_sorted)


def draw_negatives(pos: torch.Tensor, exc: Exclusions | torch.Tensor | None, n_items: int, m: int, replacement: bool,
                   popularity: torch.Tensor | None, generator: torch.Generator | None, device: torch.device,
                   checks: Sequence[Check] = ()) -> torch.Tensor:
    """(B, P, m) irrelevant items for each positive (rows without a positive: item 0, the caller masks them).

    ``pos``: validated padded (B, P) positives; ``exc``: their rows' exclusions, an
    :class:`~reco_sampled_plugin.exclusions.Exclusions` (prepared once: :func:`prepare_sampling_index`), validated
    padded (B, E) indices (sorted here, as T flat entries) or None. No (B, P + E) forbidden list is built: the
    positions drawn are mapped past the row's positives and exclusions by two sorted searches
    (:meth:`~reco_sampled_plugin.exclusions.Exclusions.allowed_item`), the same items as
    :func:`allowed_position_to_item` on :func:`forbidden_sorted`. Memory O(B P m + T), T the excluded items.

    Every pool check (and whether all rows have a positive, whether some pool is small), after the caller's
    pending ``checks`` (:func:`prepare_sampling_index`'s ``later``), reaches the host in one
    synchronisation; rows without a positive are then left out of the draw (more synchronisations, only then)."""
    b, p = pos.shape
    if p == 0:  # no positive anywhere: nothing to draw, nothing else to check
        run_checks(list(checks))
        if popularity is None and replacement and seeded_draws(device):
            draw_seed(generator, device)  # one seed per seeded call whatever P: the generator ends where it would
        return torch.zeros((b, p, m), dtype=torch.int64, device=device)
    exc = as_exclusions(exc, n_items, b)
    valid = pos >= 0
    active = valid.any(1)
    n_allowed = n_items - exclusion_counts(exc, b, device) - valid.sum(1)
    checks = list(checks)
    values = [active.all()]
    small: Any = None  # (B,) bool rows with a small pool (read only when any_small)
    if popularity is None:
        if not replacement:
            too_few = active & (n_allowed < m)

            def few() -> None:
                raise ValueError(
                    f"n_samples: m = {m} draws without replacement, but {int(too_few.sum())} row(s) have fewer "
                    f"irrelevant candidates (smallest: {int(n_allowed[active].min())})")

            checks.append(Check(too_few.any(), few))
            small = active & (n_allowed <= 4 * m)
            values.append(small.any())

        def empty() -> None:
            raise ValueError("positives: some row has no irrelevant candidate left to sample from")

        checks.append(Check((active & (n_allowed < 1)).any(), empty))
    else:
        need = 1 if replacement else m
        weighted = popularity > 0
        forbidden_weighted = (weighted[pos.clamp(min=0)] & valid).sum(1)
        if exc is not None:
            forbidden_weighted = forbidden_weighted + exc.row_sums(weighted[exc.items].to(torch.int64))
        short = active & (weighted.sum() - forbidden_weighted < need)

        def few_weighted() -> None:
            raise ValueError(f"popularity: {int(short.sum())} row(s) have fewer than {need} irrelevant items with positive weight")

        checks.append(Check(short.any(), few_weighted))
        # a row whose allowed items hold less than 2^-40 of the weight: the draws' float64 cumulative sum cannot
        # place them (with 1e-17 left, the draws returned the row's positive)
        forbidden_w = (popularity[pos.clamp(min=0)] * valid).sum(1)
        if exc is not None:
            forbidden_w = forbidden_w + exc.row_sums(popularity[exc.items])
        total_w = popularity.sum()
        faint = active & ~short & (total_w - forbidden_w < total_w * POPULARITY_RESOLUTION)

        def unresolved() -> None:
            raise ValueError(f"popularity: in {int(faint.sum())} row(s) the items that may be drawn hold less than "
                             "2^-40 of the weight (the row's positives and exclusions hold the rest), below what "
                             "draws from float64 cumulative weights resolve; flatten the weights (a smaller exponent, "
                             "counts + 1)")

        checks.append(Check(faint.any(), unresolved))
        # the longest exclusion list, read in the same synchronisation: the width of the draw's hole tables
        values.append(exc.counts.max() if exc is not None and b else torch.zeros((), dtype=torch.int64, device=device))
    host = run_checks(checks, values) if b else run_checks(checks) + [1, 0]
    if popularity is None and replacement and seeded_draws(device):
        return seeded_negatives(pos, exc, n_items, m, draw_seed(generator, device))
    any_small = small is not None and bool(host[1])
    width = int(host[1]) if popularity is not None else 0

    def draw(ps: torch.Tensor, ex: Exclusions | None, n_allow: torch.Tensor, sm: torch.Tensor | None) -> torch.Tensor:
        if popularity is not None:
            return _draw_popularity(ps, ex, width, n_items, p, m, replacement, popularity, generator, device)
        return _draw_uniform(ps, ex, n_allow, sm, n_items, p, m, replacement, generator, device)

    if host[0]:
        return draw(pos, exc, n_allowed, small if any_small else None)
    out = torch.zeros((b, p, m), dtype=torch.int64, device=device)
    rows = active.nonzero().squeeze(1)  # rows without a positive draw nothing: a batch of the others
    if rows.numel():
        out[rows] = draw(pos[rows], None if exc is None else exc.select(rows), n_allowed[rows],
                         small[rows] if any_small else None)
    return out


def allowed_items(positions: torch.Tensor, pos: torch.Tensor, exc: Exclusions | None, n_items: int) -> torch.Tensor:
    """The items at allowed ``positions`` (B, ...) (0-based among each row's items neither positive nor excluded):
    :meth:`Exclusions.allowed_item`, or the skip of the sorted positives alone."""
    if exc is not None:
        return exc.allowed_item(positions, pos)
    b = positions.shape[0]
    flat = positions.reshape(b, math.prod(positions.shape[1:]))
    forb = sort_rows(torch.where(pos >= 0, pos, torch.full_like(pos, n_items)))
    return skip_sorted(flat, forb, n_items).reshape(positions.shape)


def _draw_uniform(pos: torch.Tensor, exc: Exclusions | None, n_allowed: torch.Tensor, small: torch.Tensor | None, n_items: int,
                  p: int, m: int, replacement: bool, generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    b = pos.shape[0]
    positions = _uniform_positions(n_allowed, (b, p, m), generator, device)
    if not replacement:
        positions = _make_distinct(positions, n_allowed, generator, device, small, n_items)
    return allowed_items(positions, pos, exc, n_items)


def _make_distinct(positions: torch.Tensor, n_allowed: torch.Tensor, generator: torch.Generator | None, device: torch.device,
                   small: torch.Tensor | None = None, n_items: int | None = None) -> torch.Tensor:
    """Make the m draws of each (row, positive) distinct: uniform draws without replacement.

    Rows of ``small`` (pool n_allowed <= 4m) take the m smallest of random keys over the pool (memory
    B x P x 4m); in the others each round redraws the duplicates uniformly among the positions not drawn yet
    (:func:`allowed_position_to_item`), so only duplicates among the redrawn ones remain: rare. A fixed number
    of rounds, then one check (a further round per check in the rare batch that still has some).
    """
    b, p, m = positions.shape
    if small is not None:
        width = 4 * m if n_items is None else max(min(4 * m, n_items), m)
        keys = _rand((b, p, width), generator, device, torch.float32)
        beyond = torch.arange(width, device=device).view(1, 1, -1) >= n_allowed.view(-1, 1, 1)
        keys = keys.masked_fill(beyond, 2.0)
        picked = torch.topk(keys, m, dim=2, largest=False).indices
        positions = torch.where(small.view(-1, 1, 1), picked, positions)
    sentinel = torch.iinfo(torch.int64).max // 2  # above every position: marks the slots being redrawn

    def redraw(positions: torch.Tensor, dup: torch.Tensor) -> torch.Tensor:
        kept = torch.sort(torch.where(dup, torch.full_like(positions, sentinel), positions), dim=2).values
        left = (n_allowed.view(-1, 1) - m + dup.sum(2)).to(torch.float64).unsqueeze(2)  # positions not drawn yet
        u = _rand((b, p, m), generator, device)
        fresh = torch.minimum((u * left).floor(), left - 1).clamp(min=0).to(torch.int64)
        fresh = allowed_position_to_item(fresh.view(b * p, m), kept.view(b * p, m), sentinel).view(b, p, m)
        return torch.where(dup, fresh, positions)

    dup = _later_duplicates(positions)
    for _ in range(_REDRAW_ROUNDS):  # no synchronisation: a round without duplicates changes nothing
        positions = redraw(positions, dup)
        dup = _later_duplicates(positions)
    while bool(dup.any()):  # one check; rarely true
        positions = redraw(positions, dup)
        dup = _later_duplicates(positions)
    return positions


# elements of the (rows x forbidden items) blocks built for popularity draws
_POPULARITY_BLOCK = 1 << 24


def check_popularity(popularity: Any, n_items: int, device: torch.device) -> torch.Tensor:
    """(n,) float64 popularity weights on ``device``: finite, >= 0, a finite total (:func:`check_weights`)."""
    w = check_weights(popularity, "popularity", device=device)
    if w.shape != (n_items,):
        raise ValueError(f"popularity: expected one weight per item, shape ({n_items},), got {tuple(w.shape)}")
    return w


class _HoledCdf(NamedTuple):
    """The cumulative weights of r rows' allowed items without a (rows x n) block: the catalogue's one cumulative
    sum G (G_j = w_0 + ... + w_j) with each row's sorted forbidden items f_1 < f_2 < ... cut out as holes.

    The allowed weight below forbidden item f_i is s_i = G(f_i) - F_i, F_i = w(f_1) + ... + w(f_i) (non-decreasing
    in i). A threshold t in [0, W) of the row's allowed weight W = G(n - 1) - F_last lies past the k forbidden items
    with s_i <= t, so at t + F_k on the catalogue's scale: one search of the row's F holes, one of G. Memory
    O(n + r F); the same items as a cumulative sum over each row with its forbidden weights set to 0."""
    g: torch.Tensor  # (n,) float64 G
    w: torch.Tensor  # (n,) float64 weights
    forb: torch.Tensor  # (r, F) int64 sorted forbidden items, padded with n
    fcum: torch.Tensor  # (r, F + 1) float64 [0, F_1, ..., F_F] (padding adds 0)
    starts: torch.Tensor  # (r, F) float64 s_i (padding: inf)
    total: torch.Tensor  # (r, 1) float64 W

    @staticmethod
    def build(g: torch.Tensor, w: torch.Tensor, forb: torch.Tensor) -> "_HoledCdf":
        """From the catalogue's ``g`` = cumsum(``w``) and the rows' sorted forbidden items ``forb`` (r, F), padded
        with n (:func:`forbidden_sorted`)."""
        n = g.shape[0]
        real = forb < n
        at = forb.clamp(max=n - 1)
        zero = torch.zeros((), dtype=torch.float64, device=g.device)
        fcum = torch.cat([torch.zeros_like(g[:1]).expand(forb.shape[0], 1),
                          torch.cumsum(torch.where(real, w[at], zero), 1)], 1)
        starts = torch.where(real, g[at] - fcum[:, 1:], torch.full_like(fcum[:, 1:], math.inf))
        return _HoledCdf(g, w, forb, fcum, starts, g[-1:].view(1, 1) - fcum[:, -1:])

    def item(self, t: torch.Tensor) -> torch.Tensor:
        """(r, K) thresholds in [0, total) -> the allowed items whose cumulative weight interval holds them."""
        n = self.g.shape[0]
        t = torch.minimum(t, torch.nextafter(self.total, torch.zeros_like(self.total))).contiguous()
        k = torch.searchsorted(self.starts.contiguous(), t, right=True)  # holes below the threshold
        tg = t + self.fcum.gather(1, k)
        # rounding never carries the threshold into a hole: between hole k (exclusive) and hole k + 1
        f_pad = torch.cat([torch.full_like(self.forb[:, :1], -1), self.forb], 1)
        below, above = f_pad.gather(1, k), f_pad.gather(1, (k + 1).clamp(max=f_pad.shape[1] - 1))
        above = torch.where(k + 1 < f_pad.shape[1], above, torch.full_like(above, n))
        g0 = torch.cat([torch.zeros_like(self.g[:1]), self.g])  # g0[j] = G(j - 1), the weight below item j
        lo, hi = g0[below + 1], g0[above]
        tg = torch.maximum(torch.minimum(tg, torch.nextafter(hi, torch.zeros_like(hi))), lo)
        return torch.searchsorted(self.g, tg, right=True).clamp(max=n - 1)

    def allowed_cdf(self, items: torch.Tensor) -> torch.Tensor:
        """(r, K) the allowed weight at or below each of ``items`` (r, K) (allowed items): G(j) - F(holes below j)."""
        k = torch.searchsorted(self.forb.contiguous(), items.contiguous(), right=True)
        return self.g[items] - self.fcum.gather(1, k)

    def redraw(self, draws: torch.Tensor, dup: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
        """Draws proportional to the weights among the allowed items of each (row, positive) not kept (kept: not
        ``dup``): the u-quantile of the weights left. The kept items split the allowed weight into intervals;
        G_i = (allowed weight at kept item k_i) - (weight of the first i kept items) says which interval holds the
        quantile, then :meth:`item`."""
        r, p, m = draws.shape
        n = self.g.shape[0]
        ks = torch.sort(torch.where(dup, torch.full_like(draws, n), draws), dim=-1).values  # kept, padding last
        valid = ks < n
        kc = ks.clamp(max=n - 1).view(r, p * m)
        zero = torch.zeros((), dtype=torch.float64, device=ks.device)
        wk = torch.where(valid, self.w[kc].view(r, p, m), zero)
        cum = torch.cumsum(wk, -1)
        t = u * (self.total.view(r, 1, 1) - cum[..., -1:])
        g = torch.where(valid, self.allowed_cdf(kc).view(r, p, m) - cum, torch.full_like(cum, math.inf))
        below = torch.searchsorted(g, t, right=True)  # kept items wholly below the quantile
        shift = torch.cat([torch.zeros_like(cum[..., :1]), cum], -1).gather(-1, below)
        return self.item((t + shift).view(r, p * m)).view(r, p, m)


def _block_rows(width: int) -> int:
    """Rows per popularity block: (rows x ``width``) forbidden items within :data:`_POPULARITY_BLOCK`."""
    return max(1, _POPULARITY_BLOCK // max(width, 1))


def popularity_inverse_cdf(w: torch.Tensor, forb: torch.Tensor, n_items: int, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Items drawn with probability proportional to ``w`` among each row's allowed items, from given uniform numbers:
    draw (b, p, k) is the item whose cumulative weight interval holds u[b, p, k] W_b (W_b the row's allowed weight;
    ``forb``: the row's sorted forbidden items, :func:`forbidden_sorted`), by :class:`_HoledCdf`: memory O(n + B F).
    For keyed draws (``adapters._shared``): the same lookup as :func:`sampled_ranks`' popularity draws with
    replacement, fed other uniform numbers.

    Returns:
        (B, P, m) int64 items and (B,) float64 allowed weights W_b (0: nothing to draw in the row).
    """
    b, p, m = u.shape
    items = torch.zeros((b, p, m), dtype=torch.int64, device=u.device)
    totals = torch.zeros(b, dtype=torch.float64, device=u.device)
    g = torch.cumsum(w, 0)
    step = _block_rows(forb.shape[1] + p * m)
    for lo in range(0, b, step):
        hc = _HoledCdf.build(g, w, forb[lo:lo + step])
        r = hc.forb.shape[0]
        items[lo:lo + step] = hc.item(u[lo:lo + step].reshape(r, p * m) * hc.total).view(r, p, m)
        totals[lo:lo + step] = hc.total[:, 0]
    return items, totals


def _draw_popularity(pos: torch.Tensor, exc: Exclusions | None, width: int, n_items: int, p: int, m: int,
                     replacement: bool, w: torch.Tensor, generator: torch.Generator | None,
                     device: torch.device) -> torch.Tensor:
    """Draw m items per positive with probability proportional to ``w`` among the allowed items (not among the
    row's positives ``pos`` nor its exclusions ``exc``, ``width`` at least the longest row of them): inverse-cdf
    lookups of uniform numbers on the scores' device (:class:`_HoledCdf`: the catalogue's one cumulative sum with
    each row's forbidden items as holes), in blocks of rows so the (rows x forbidden items) tables stay bounded.
    Without replacement the duplicates are redrawn among the items not drawn yet (:meth:`_HoledCdf.redraw`), a
    fixed number of rounds, then one check for all blocks."""
    b = pos.shape[0]
    out = torch.empty((b, p, m), dtype=torch.int64, device=device)
    dups: Any = None if replacement else torch.zeros((b, p, m), dtype=torch.bool, device=device)
    g = torch.cumsum(w, 0)
    block = _block_rows(p + width + p * m)
    blocks = [slice(start, min(start + block, b)) for start in range(0, b, block)]
    rounds = 1 if replacement else 1 + _REDRAW_ROUNDS
    u_all = _rand((rounds, b, p, m), generator, device)  # every block's and round's numbers in one draw (one move)

    def holes(sl: slice) -> _HoledCdf:
        ps = pos[sl]
        forb = ps if exc is None or not width else torch.cat(
            [ps, exc.padded_block(sl.start, ps.shape[0], width, -1)], 1)
        return _HoledCdf.build(g, w, forbidden_sorted(forb, None, n_items))

    for sl in blocks:  # row blocks bound memory; each block is vectorised
        hc = holes(sl)
        r = hc.forb.shape[0]
        u = u_all[:, sl]
        draws = hc.item(u[0].reshape(r, p * m) * hc.total).view(r, p, m)
        if not replacement:
            dup = _later_duplicates(draws)
            for k in range(1, rounds):
                draws = torch.where(dup, hc.redraw(draws, dup, u[k]), draws)
                dup = _later_duplicates(draws, dup)
            dups[sl] = dup
        out[sl] = draws
    extra = 0
    while dups is not None and bool(dups.any()):  # one check; rarely true (a round per block per check)
        extra += 1
        if extra > _MAX_REDRAWS:
            raise ValueError(f"popularity: {m} distinct items per positive could not be drawn in {_MAX_REDRAWS} "
                             "rounds: the items some row still needs hold too little of the weight for float64 "
                             "cumulative weights to reach; flatten the weights (a smaller exponent, counts + 1) or "
                             "draw with replacement")
        u_all = _rand((b, p, m), generator, device)
        for sl in blocks:
            hc = holes(sl)
            draws, dup = out[sl], dups[sl]
            draws = torch.where(dup, hc.redraw(draws, dup, u_all[sl]), draws)
            out[sl], dups[sl] = draws, _later_duplicates(draws, dup)
    return out


@overload
def rank_among_drawn(pos_scores: torch.Tensor, neg_scores: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
                     ties: str, generator: torch.Generator | None, *, beating: Literal[False] = False) -> torch.Tensor: ...
@overload
def rank_among_drawn(pos_scores: torch.Tensor, neg_scores: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
                     ties: str, generator: torch.Generator | None, *,
                     beating: Literal[True]) -> tuple[torch.Tensor, torch.Tensor]: ...
def rank_among_drawn(pos_scores: torch.Tensor, neg_scores: torch.Tensor, pos: torch.Tensor, neg: torch.Tensor,
                     ties: str, generator: torch.Generator | None, *,
                     beating: bool = False) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """(B, P) sampled ranks r~ = 1 + #{drawn items beating the positive} (ties per ``ties``; 0 in padded slots)
    from the positives' scores (B, P), the drawn items' scores (B, P, m), and their item indices (padded (B, P)
    positives with -1, (B, P, m) drawn items): the one count of :func:`sampled_ranks` and of the scorer loop
    (``scorer_ranks``). ``ties="random"`` draws one seed per row from ``generator`` here. With ``beating``: (ranks,
    (B, P, m) each draw's share of the count: bool, float64 with 1/2 for ties under ``"average"``), for the
    popularity statistics (``_popularity.popularity_stats``)."""
    above = neg_scores > pos_scores.unsqueeze(2)
    if ties == "optimistic":
        beat = above
    else:
        tied = neg_scores == pos_scores.unsqueeze(2)
        if ties == "pessimistic":
            beat = above | tied
        elif ties == "average":
            beat = above.to(torch.float64) + tied.to(torch.float64) / 2
        else:
            seeds = _row_seeds(pos.shape[0], generator, pos.device)
            pos_keys = item_keys(pos.clamp(min=0), seeds)
            neg_keys = item_keys(neg, seeds.unsqueeze(2))
            beat = above | (tied & (neg_keys < pos_keys.unsqueeze(2)))
    ranks = beat.sum(2) + 1  # bool sums are int64; halves are exact in float64
    ranks = torch.where(pos >= 0, ranks, torch.zeros_like(ranks))
    return (ranks, beat) if beating else ranks


def _given_negatives(negatives: Any, n_samples: int | None, scores: torch.Tensor, pos: torch.Tensor,
                     exc: Exclusions | None, later: list[Check], replacement: bool = True) -> tuple[torch.Tensor, int]:
    """(B, P, m) int64 pre-drawn negatives of :func:`sampled_ranks` and m, checked (shape, dtype, device, range,
    none a positive or an excluded item of its row, distinct per positive where the design draws without
    ``replacement``) together with the pending index checks ``later``: one read."""
    b, n = scores.shape
    p = pos.shape[1]
    neg = real_tensor(negatives, "negatives", "integer item indices")
    check_same_device(scores=scores, negatives=neg)
    check_not_meta(neg, "negatives")
    if neg.is_floating_point() or neg.dtype == torch.bool:
        raise ValueError(f"negatives: expected integer item indices, got dtype {neg.dtype}")
    neg = neg.to(torch.int64)
    if neg.dim() == 2:
        if neg.shape[0] != b:
            raise ValueError(f"negatives: expected shape ({b}, m) or ({b}, {p}, m), got {tuple(neg.shape)}")
        neg = neg.unsqueeze(1).expand(b, p, neg.shape[1])
    if neg.dim() != 3 or neg.shape[:2] != (b, p):
        raise ValueError(f"negatives: expected shape ({b}, m) or ({b}, {p}, m), got {tuple(neg.shape)}")
    if n_samples is not None and check_int(n_samples, "n_samples", 1) != neg.shape[2]:
        raise ValueError(f"n_samples: {n_samples} disagrees with the {neg.shape[2]} negatives given per positive")
    m = neg.shape[2]
    if m < 1:
        raise ValueError("negatives: need at least one negative per positive")
    flat = neg.reshape(b, p * m)

    def out_of_range() -> None:
        raise ValueError(f"negatives: item indices must lie in 0..{n - 1}")

    checks = later + [Check(((flat < 0) | (flat >= n)).any(), out_of_range)]
    if (p or exc is not None) and flat.numel():  # each negative looked up in its row's positives, exclusions
        forb = forbidden_sorted(pos, None, n)
        at = torch.searchsorted(forb, flat.contiguous()).clamp(max=max(forb.shape[1] - 1, 0))
        hit = forb.gather(1, at) == flat if forb.shape[1] else torch.zeros_like(flat, dtype=torch.bool)
        if exc is not None:
            hit = hit | exc.contains(flat)  # padding (n) never equals an index in range

        def drawn_forbidden() -> None:
            rows = hit.any(1)
            raise ValueError(
                f"negatives: {int(rows.sum())} row(s) draw a positive or excluded item as a negative "
                f"(first: row {int(rows.nonzero()[0, 0])})"
            )

        checks.append(Check(hit.any(), drawn_forbidden))
    if not replacement and m > 1 and flat.numel():
        twice = _later_duplicates(neg)

        def repeated() -> None:
            raise ValueError(f"negatives: {int(twice.any(2).sum())} positive(s) list an item twice among their m = "
                             f"{m} negatives, but the design draws without replacement (hypergeometric law); give "
                             "distinct items, or a design with replacement")

        checks.append(Check(twice.any(), repeated))
    run_checks(checks)
    return neg, m


def sampled_ranks(
    scores: torch.Tensor,
    positives: torch.Tensor,
    n_samples: int | SamplingDesign | None = None,
    exclude: TensorLike | Exclusions | None = None,
    generator: torch.Generator | None = None,
    *,
    negatives: torch.Tensor | None = None,
    ties: str = "pessimistic",
    check_finite: bool = True,
) -> SampledRanks:
    """Rank each positive against its own m sampled irrelevant items.

    For every positive, m items are drawn from the row's irrelevant candidates (never a positive
    of the row, never an excluded item) as the design says: uniformly with replacement (the binomial law),
    uniformly without replacement (hypergeometric), or proportionally to popularity weights.
    The sampled rank is r~ = 1 + #{drawn items scoring higher} (ties per ``ties``), in 1..m+1.

    Args:
        scores: (B, n) scores.
        positives: (B, n) bool mask, (B, P) int64 padded with -1, or (B,).
        n_samples: a fixed-m :class:`~reco_sampled_plugin.design.SamplingDesign` (with or without replacement,
            popularity weights), or an int m: uniform with replacement; inferred from ``negatives`` when they are
            given (adaptive designs draw in stages: :func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks`).
        exclude: items never drawn and never ranked (training items), same forms as positives, or an
            :class:`~reco_sampled_plugin.exclusions.Exclusions` prepared once for these rows
            (:func:`~reco_sampled_plugin.exclusions.prepare_exclusions`).
        generator: a ``torch.Generator`` for reproducible draws (and random tie-breaking).
        negatives: pre-drawn irrelevant items instead of drawing: (B, m) shared by the row's
            positives (NCF-style files with 99 negatives per user) or (B, P, m).
        ties: tie policy as in :func:`exact_ranks`.

    Returns:
        :class:`SampledRanks` (ranks, n_candidates, negatives, and the draw's design).

    On an accelerator, uniform draws with replacement are keyed by one seed drawn from ``generator`` (the same law;
    :func:`seeded_negatives`), and a call with index inputs whose shapes were seen before is replayed from a CUDA
    graph (docs/gpu.md, "Calls replayed from CUDA graphs"); the CPU draws from the generator's stream.
    """
    check_ties(ties)
    check_finite = check_bool(check_finite, "check_finite")
    design, replacement, popularity = None, True, None  # an int m is checked below
    n_samples = planned_design(n_samples)  # a planner result: its design
    if isinstance(n_samples, SamplingDesign):
        design = n_samples
        if design.adaptive_max is not None:
            raise ValueError("n_samples: an adaptive design draws in stages; call adaptive_sampled_ranks(scores, "
                             "positives, design)")
        n_samples, replacement, popularity = design.n_samples, design.replacement, design.popularity
    check_generator(generator)
    scores = score_tensor(scores)
    b, n = scores.shape
    if negatives is None and popularity is None and replacement and ties != "random" \
            and (design is None or design.exact_share is None):
        seeded = _seeded_sampled_ranks(scores, positives, exclude, n_samples, design, ties, check_finite, generator)
        if seeded is not None:
            return seeded
    first = [finite_check(scores)] if check_finite else []  # read back with the index checks: one synchronisation
    pos, exc, later = prepare_sampling_index(positives, exclude, b, n, scores.device, first)
    p = pos.shape[1]
    device = scores.device
    if negatives is not None:
        neg, m = _given_negatives(negatives, n_samples, scores, pos, exc, later, replacement)
    else:
        if n_samples is None:
            check_required(n_samples, "n_samples", "an int m or a SamplingDesign (it may be None only where negatives "
                           "are given)")
        m = check_int(n_samples, "n_samples", minimum=1, maximum=MAX_SAMPLES)
        check_elements(b * p * m, "n_samples", "the draw of B x P x m negatives (returned in SampledRanks.negatives)")
        if popularity is not None:  # checked once per call, also when no row has a positive
            popularity = check_popularity(popularity, n, device)
        neg = draw_negatives(pos, exc, n, m, replacement, popularity, generator, device, later)
    pos_scores, pos_valid = _gather_padded(scores, pos)
    neg_scores = scores.gather(1, neg.reshape(b, p * m)).reshape(b, p, m)
    ranks, beat = rank_among_drawn(pos_scores, neg_scores, pos, neg, ties, generator, beating=True)
    if design is None:  # built from validated parts, without a second validation (no extra host sync)
        design = SamplingDesign.trusted(m)
    stats = popularity_draw_stats(design, beat, neg, pos, exc, n, given=negatives is not None)
    neg = torch.where(pos_valid.unsqueeze(2), neg, torch.full_like(neg, -1))
    n_cand = padded_candidate_counts(n, pos, exc, count_other_positives=False)
    out = SampledRanks(ranks, n_cand, neg, design, popularity_stats=stats)
    if design.exact_share is None:
        return out
    return share_from_matrix(out, scores, pos, exc, ties, generator)  # the exact share, ranked from the matrix


def seeded_draws(device: torch.device) -> bool:
    """Whether uniform draws with replacement on ``device`` are keyed by a seed (:func:`draw_seed`,
    :func:`seeded_negatives`) rather than drawn from the generator's stream: on an accelerator (and on a CPU where
    the tests' stand-in graph captures), where a call's draws are then a pure function of its inputs and one seed
    tensor, so a CUDA graph can replay them (:func:`_seeded_sampled_ranks`); with capture on or off, the same draws."""
    return torch.device(device).type != "cpu" or _graphs._fake[0]


def draw_seed(generator: torch.Generator | None, device: torch.device) -> torch.Tensor:
    """The 0-dim int64 seed (0..2^62 - 1) of a seeded draw on ``device``, from ``generator`` (the device's default
    one when None): drawn on the device, or on the generator's own device and filled in as a kernel argument (no
    copy from host memory, which would wait for the device). Rows are keyed by seed + their place in the batch
    (:func:`seeded_negatives`): two calls share a row's keys only where their seeds lie within a batch of each
    other (about B / 2^62 per pair of calls)."""
    if generator is None or generator.device == torch.device(device):
        return torch.randint(0, _SEEDS, (), device=device, generator=generator)
    return torch.full((), int(torch.randint(0, _SEEDS, (), generator=generator, device=generator.device)),
                      dtype=torch.int64, device=device)


_SEEDS = 1 << 62  # seeds of seeded draws: seed + row stays below 2^63 for any batch (MAX_SIZE rows at most)


def seeded_negatives(pos: torch.Tensor, exc: torch.Tensor | Exclusions | None, n_items: int, m: int,
                     seed: torch.Tensor, first_row: int = 0) -> torch.Tensor:
    """(B, P, m) items drawn uniformly with replacement among each row's irrelevant candidates (neither a positive
    nor excluded), keyed: draw k of the positive in slot p of row b is ``keyed_uniform(0, 0, seed + b, pos[b, p],
    k)`` scaled to the row's pool (the law of :func:`_draw_uniform`), mapped to items as
    :func:`allowed_items` maps them (:func:`allowed_position_to_item` on padded exclusions: the same items, nothing
    read back). Rows without a positive: item 0. ``first_row``: the batch position of ``pos``' first row. In row
    blocks of at most ``MAX_ELEMENTS // 8`` draws (the hash's temporaries); nothing here waits for the device (but
    :meth:`Exclusions.select` of prepared exclusions, in blocks)."""
    b, p = pos.shape
    step = max(1, (MAX_ELEMENTS // 8) // max(p * m, 1))
    if b > step:
        parts = []
        for lo in range(0, b, step):
            rows = slice(lo, lo + step)
            sub = exc[rows] if isinstance(exc, torch.Tensor) else None if exc is None else \
                exc.select(torch.arange(lo, min(lo + step, b), device=pos.device))
            parts.append(seeded_negatives(pos[rows], sub, n_items, m, seed, first_row + lo))
        return torch.cat(parts)
    device, valid = pos.device, pos >= 0
    pool = (n_items - exclusion_counts(exc, b, device) - valid.sum(1)).clamp(min=1).view(b, 1, 1)
    ids = seed.to(torch.int64) + torch.arange(first_row, first_row + b, device=device)
    u = keyed_uniform(0, 0, ids.view(b, 1, 1), pos.view(b, p, 1), torch.arange(m, device=device).view(1, 1, m))
    positions = torch.minimum((u * pool.to(torch.float64)).floor().to(torch.int64), pool - 1)
    if isinstance(exc, torch.Tensor):
        neg = allowed_position_to_item(positions, forbidden_sorted(pos, exc, n_items), n_items)
    else:
        neg = allowed_items(positions, pos, exc, n_items)
    return torch.where(valid.any(1).view(b, 1, 1), neg.clamp(max=max(n_items - 1, 0)), torch.zeros_like(neg))


def _seeded_sampled_ranks(scores: torch.Tensor, positives: Any, exclude: Any, n_samples: Any,
                          design: SamplingDesign | None, ties: str, check_finite: bool,
                          generator: torch.Generator | None) -> SampledRanks | None:
    """:func:`sampled_ranks` of a seeded draw (:func:`seeded_draws`: uniform, with replacement, on an accelerator)
    from (B, P) or (B,) index positives and exclusions (or none), ties not random: queued in one function of the
    inputs and the seed (:func:`draw_seed`), replayed from a CUDA graph where its shapes repeat (:mod:`._graphs`),
    its checks read back once after the work is queued (kept by a ``deferred_checks`` block instead). The same
    draws as the general path's (:func:`draw_negatives`). None where this does not apply, or where a check failed
    (the general path then raises its error)."""
    device, b = scores.device, scores.shape[0]
    index = tuple(index_rows(t, b) for t in (positives, exclude))
    if not seeded_draws(device) or index[0] is None or n_samples is None or not scores.numel() \
            or not capturable_index(device, *index, rows=b, capture=False):
        return None
    try:  # a bad m: the general path raises, after the inputs' own checks (the same error whichever path)
        m = check_int(n_samples, "n_samples", minimum=1, maximum=MAX_SAMPLES)
        check_elements(b * index[0].shape[1] * m, "n_samples", "the draw of B x P x m negatives")
    except (ValueError, TypeError):
        return None
    notes: list[tuple[str, str]] = []

    def queued(*tensors: torch.Tensor) -> tuple[torch.Tensor, ...]:
        pending: list[Check] = []
        s, pos, exc = prepare_inputs(tensors[0], tensors[1], tensors[2] if len(tensors) > 3 else None, False, pending)
        if check_finite:
            pending.append(Check(~finite_flags(s), lambda: None, "scores_finite", DEFERRABLE["scores_finite"]))
        n, valid = s.shape[1], pos >= 0
        n_cand = padded_candidate_counts(n, pos, exc, count_other_positives=False)
        pending.append(Check(((n_cand < 2) & valid.any(1)).any(), lambda: None, "sample_pool",  # the pool: n_cand - 1
                             DEFERRABLE["sample_pool"]))
        neg = seeded_negatives(pos, exc, n, m, tensors[-1])
        pos_scores = s.gather(1, pos.clamp(min=0))
        ranks = rank_among_drawn(pos_scores, s.gather(1, neg.reshape(b, -1)).reshape(neg.shape), pos, neg, ties, None)
        notes[:] = [(c.name, c.message) for c in pending]
        return ranks, n_cand, torch.where(valid.unsqueeze(2), neg, torch.full_like(neg, -1)), check_flags(pending)

    inputs = (scores,) + tuple(t for t in index if t is not None) + (draw_seed(generator, device),)
    ranks, n_cand, neg, flags = _graphs.run("sampled_ranks", (m, ties, check_finite), queued, inputs, notes)
    if not (defer_flags(flags, notes) or not any(flags.tolist())):
        return None
    return SampledRanks(ranks, n_cand, neg, design or SamplingDesign.trusted(m))


def popularity_draw_stats(design: SamplingDesign, beat: torch.Tensor, neg: torch.Tensor, pos: torch.Tensor,
                          exc: torch.Tensor | Exclusions | None, n_items: int, given: bool = False) -> PopularityStats | None:
    """The :class:`~reco_sampled_plugin._popularity.PopularityStats` of a fixed-m draw under ``design`` (None unless
    it draws by popularity with replacement): the one call of every path that draws popularity negatives (score
    matrix, factors, scorer loop). ``beat`` from :func:`rank_among_drawn` (``beating=True``); ``given``: the
    negatives were given (checked for weight 0), not drawn."""
    if design.popularity is None or not design.replacement:
        return None
    w = design.popularity  # validated by the design (values) and by the draw (its length) where it drew
    if w.shape != (n_items,):
        w = check_popularity(w, n_items, neg.device)
    elif w.device != neg.device or w.dtype != torch.float64:  # (already there: no conversion, no copy)
        w = w.to(neg.device, torch.float64)
    if isinstance(exc, Exclusions):  # CSR exclusions: positives sorted per row, the exclusions summed per row
        totals = exclusion_totals(forbidden_sorted(pos, None, n_items), exc, w)  # weight, zeros, class counts
        return popularity_stats(beat, neg, pos >= 0, w, totals, given, positives=pos)
    return popularity_stats(beat, neg, pos >= 0, w, forbidden_sorted(pos, exc, n_items), given, positives=pos)
