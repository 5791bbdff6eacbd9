"""RecBole adapter, rank collection: the per-positive table built from RecBole's evaluation batches.

RecBole 1.2.1 gives metrics no per-positive ranks, so the wrapped ``Collector`` hands every batch to
:func:`collect_batch`. Every held-out (user, item) pair becomes one row of a float64 table
(:data:`COLUMNS`) with its exact rank (full mode), its sampled rank (``uniN`` / ``popN`` modes: against its
own N draws; full mode with ``rsp_m``: simulated) and its user's candidate count. Batches are gathered
(CPU: copied into reused buffers as they arrive; other devices: full-sort batches held by reference,
sampled-mode batches ranked at once) and ranked together, on the scores' device, when the evaluation ends
(:func:`finish_collection`) or the buffer is full. Only the per-positive table comes back to the host, once
per evaluation; a flush of the common path (full mode, counted ranks, draws with replacement) waits on the
device once, for the check of the scores (NaN or +inf anywhere is an error unless ``rsp_check_finite`` is
off; -inf is RecBole's mark of an excluded item).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch

from reco_sampled_plugin._popularity import POP_BINS, PROFILE_FIELDS
from reco_sampled_plugin.adaptive import completion_targets, continues
from reco_sampled_plugin.design import SamplingDesign

from ._recbole_settings import _Settings, _settings

__all__ = ["PLUGIN_KEY", "COLUMNS", "CLASS_COLUMNS", "positive_table", "collect_batch", "finish_collection",
           "reset_collection"]

#: DataStruct key under which the wrapped collector stores the per-positive table.
PLUGIN_KEY = "rsp.ranks"

# columns of the per-positive table (float64, one row per held-out (user, item) pair)
_USER, _R_FULL, _R_IRR, _N_IRR, _R_SAMPLED, _M, _N_POS, _UID, _ITEM = range(9)
_POP, _HH_BEATING, _HH_S1, _HH_S2, _HH_UNREACHABLE = range(9, 14)  # popN: the Hansen-Hurwitz statistics
_AT_CAP = 14  # full mode, exact_at_cap: the exact rank of a positive completed at the cap
_N_COLS = 15
#: Column names of the per-positive table stored under :data:`PLUGIN_KEY` (see :func:`positive_table`).
COLUMNS = ("user", "rank_full", "rank_irrelevant", "n_candidates", "sampled_rank", "m", "n_positives", "uid", "item",
           "popularity", "hh_beating", "hh_s1", "hh_s2", "hh_unreachable", "exact_at_cap")
#: popN only: the table goes on with ``pl_fit``'s class counts (``_popularity.PopularityStats``), POP_BINS columns
#: each of the profile, beat_bins and miss_bins (other modes keep the first :data:`COLUMNS` alone).
CLASS_COLUMNS = tuple(f"{f}_{c}" for f in PROFILE_FIELDS for c in range(POP_BINS))
# rank columns: 0 = not available (sampled modes have no exact rank), -1 = beyond the computed top
_BEYOND = -1.0


def positive_table(dataobject: Any) -> dict[str, torch.Tensor]:
    """The per-positive table a RecBole ``DataStruct`` holds for the plugin, as named columns.

    ``rank_full`` / ``rank_irrelevant``: exact rank among all candidates / among the irrelevant ones
    (full mode; 0 = not available, -1 = beyond the computed top), ``n_candidates``: irrelevant items + 1,
    ``sampled_rank`` / ``m``: sampled rank and sample size (0 = none), ``n_positives``: |T_u|, ``user``:
    row of the user in the evaluation, ``uid`` / ``item``: RecBole's internal ids. ``popN`` mode
    (``popularity`` 1, else 0 and the next columns 0): each positive's Hansen-Hurwitz statistics of its N drawn
    negatives (``_popularity.PopularityStats``; docs/popularity.md): ``hh_beating`` the beating draws,
    ``hh_s1`` / ``hh_s2`` the sums of b / q~ and (b / q~)^2 over them, ``hh_unreachable`` the candidates of weight 0;
    ``exact_at_cap`` (full mode, an ``exact_at_cap`` design): the exact rank R (among the irrelevant candidates and
    itself; a whole number, ties as ``rsp_ties`` with ``average`` placing it uniformly among its ties) of a positive
    still within the top at the cap (``adaptive.completion_targets``), 0 elsewhere; then :data:`CLASS_COLUMNS`
    (popN only): the class counts ``pl_fit`` reads.
    """
    table = dataobject.get(PLUGIN_KEY)
    return {name: table[:, i] for i, name in enumerate(COLUMNS + CLASS_COLUMNS) if i < table.shape[1]}


# -------------------------------------------------------------------------------- rank collection
def _ranks_from_counts(ge: torch.Tensor, gt: torch.Tensor, ties: str) -> torch.Tensor:
    """Rank from #(s >= s_pos) (the positive included) and #(s > s_pos), as float64."""
    ge = ge.to(torch.float64)
    gt = gt.to(torch.float64)
    if ties == "pessimistic":
        return ge
    if ties == "optimistic":
        return gt + 1.0
    return (ge + gt + 1.0) / 2.0


def _sampled_from_scores(neg: torch.Tensor, pos: torch.Tensor, ties: str, generator: torch.Generator | None) -> torch.Tensor:
    """Sampled rank 1 + #(sampled items above the positive) per row of ``neg`` (Npos, m); ties per policy
    (``average``: tied items are ordered at random, whose expectation is the average rank)."""
    above = (neg > pos.unsqueeze(1)).sum(1)
    if ties == "optimistic":
        return (above + 1).to(torch.float64)
    tied = (neg == pos.unsqueeze(1)).sum(1)
    if ties == "pessimistic":
        return (above + tied + 1).to(torch.float64)
    u = torch.rand(tied.shape, generator=generator, dtype=torch.float64, device=tied.device)
    return (above + 1).to(torch.float64) + torch.floor(u * (tied + 1).to(torch.float64))


def _on(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``x`` on ``device`` (no call at all when it is there already)."""
    return x if x.device == device else x.to(device)


def _counts_per_row(pos_u: torch.Tensor, b: int) -> torch.Tensor:
    """#positives of each of the b rows (a scatter: no output size to wait for, unlike ``bincount``)."""
    return torch.zeros(b, dtype=torch.int64, device=pos_u.device).index_add_(0, pos_u, torch.ones_like(pos_u))


def _other_positive_counts(pos_u: torch.Tensor, s_pos: torch.Tensor, counts: torch.Tensor,
                           tied_before: bool = False) -> tuple[torch.Tensor, ...]:
    """#(other positives of the same user scoring >= / > each positive), and with ``tied_before`` #(those
    with an equal score listed before it): in numpy for CPU tensors, on the device otherwise (same counts)."""
    if pos_u.device.type == "cpu":
        return _other_positive_counts_host(pos_u, s_pos, counts, tied_before)
    return _other_positive_counts_device(pos_u, s_pos, counts, tied_before)


def _descending_score_keys(s: np.ndarray) -> np.ndarray:
    """int64 keys in [0, 2^32) ordering the scores from highest to lowest, equal exactly for equal scores:
    the IEEE bits of float32 (float16 converts exactly) made monotonic; dense ranks otherwise."""
    if s.dtype in (np.float32, np.float16):
        bits = (s.astype(np.float32) + np.float32(0.0)).view(np.int32).astype(np.int64)  # + 0: -0.0 becomes +0.0
        bits = np.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # signed-integer order = float order
        return 0x7FFFFFFF - bits
    uniq, inverse = np.unique(s, return_inverse=True)
    return uniq.shape[0] - 1 - inverse.reshape(-1)


def _other_positive_counts_host(pos_u: torch.Tensor, s_pos: torch.Tensor, counts: torch.Tensor,
                                tied_before: bool = False) -> tuple[torch.Tensor, ...]:
    """#(other positives of the same user scoring >= / > each positive), and with ``tied_before`` #(those
    with an equal score listed before it), from one integer sort of the positives by (user, score
    descending): within a user, the positives above are those before its run of equal scores, and the
    stable sort keeps a run in the positives' order. In numpy: a stable sort (timsort) uses the runs of
    positives already in user order, and the dozen small steps cost a fraction of torch's per-call overhead
    (ml-100k's 9,675 positives: 0.18 ms, against 2.1 ms for :func:`_other_positive_counts_device`). CPU only."""
    n = pos_u.shape[0]
    if n == 0:
        zero = torch.zeros_like(pos_u)
        return (zero, zero, zero) if tied_before else (zero, zero)
    s = s_pos.to(torch.float32) if s_pos.dtype == torch.bfloat16 else s_pos  # exact; numpy has no bfloat16
    users = pos_u.cpu().numpy()
    key = (users << 32) + _descending_score_keys(s.cpu().numpy())
    order = np.argsort(key, kind="stable")
    key = key[order]
    new_run = np.ones(n, dtype=bool)
    new_run[1:] = key[1:] != key[:-1]  # a run: one user's positives with one score
    run_id = np.cumsum(new_run) - 1
    run_len = np.bincount(run_id)
    run_end = np.cumsum(run_len)[run_id]
    c = counts.cpu().numpy()
    user_start = (np.cumsum(c) - c)[users[order]]
    gt, ge = np.empty(n, np.int64), np.empty(n, np.int64)
    run_start = run_end - run_len[run_id]
    gt[order] = run_start - user_start
    ge[order] = run_end - user_start - 1  # minus the positive itself
    out = (torch.from_numpy(ge).to(pos_u.device), torch.from_numpy(gt).to(pos_u.device))
    if not tied_before:
        return out
    tb = np.empty(n, np.int64)
    tb[order] = np.arange(n) - run_start
    return out + (torch.from_numpy(tb).to(pos_u.device),)


def _other_positive_counts_device(pos_u: torch.Tensor, s_pos: torch.Tensor, counts: torch.Tensor,
                                  tied_before: bool = False) -> tuple[torch.Tensor, ...]:
    """#(other positives of the same user scoring >= / > each positive), and with ``tied_before`` #(those
    with an equal score listed before it), from two stable sorts of the positives (score descending, then
    user): within a user, the positives above are those before its run of equal scores, and the stable
    sorts keep a run in the positives' order. Runs are found with cumulative max / min of positions, so
    the whole computation stays on the positives' device without reading anything back (other devices)."""
    n = pos_u.shape[0]
    if n == 0:
        zero = torch.zeros_like(pos_u)
        return (zero, zero, zero) if tied_before else (zero, zero)
    dev = pos_u.device
    order = torch.sort(s_pos, descending=True, stable=True).indices  # -0.0 and +0.0 compare (and sort) equal
    order = order[torch.sort(pos_u[order], stable=True).indices]
    u, s = pos_u[order], s_pos[order]
    new_run = torch.ones(n, dtype=torch.bool, device=dev)  # a run: one user's positives with one score
    new_run[1:] = (u[1:] != u[:-1]) | (s[1:] != s[:-1])
    last = torch.ones(n, dtype=torch.bool, device=dev)
    last[:-1] = new_run[1:]
    idx = torch.arange(n, device=dev)
    run_start = torch.cummax(torch.where(new_run, idx, 0), 0).values
    run_end = torch.flip(torch.cummin(torch.flip(torch.where(last, idx + 1, n), (0,)), 0).values, (0,))
    user_start = (torch.cumsum(counts, 0) - counts)[u]
    gt, ge = torch.empty_like(pos_u), torch.empty_like(pos_u)
    gt[order] = run_start - user_start
    ge[order] = run_end - user_start - 1  # minus the positive itself
    if not tied_before:
        return ge, gt
    tb = torch.empty_like(pos_u)
    tb[order] = idx - run_start
    return ge, gt, tb


def _full_ranks(ge: torch.Tensor, gt: torch.Tensor, other_ge: torch.Tensor, other_gt: torch.Tensor,
                tied_before: torch.Tensor, ties: str) -> torch.Tensor:
    """Ranks among all candidates, the other positives included, from the counts over the row: relevant items
    tied with each other are placed in their listed order under the deterministic policies (as
    :func:`reco_sampled_plugin.exact_ranks`: an ordering, never two at one rank); ``average`` splits ties."""
    if ties == "average":
        return _ranks_from_counts(ge, gt, ties)
    return _ranks_from_counts(ge - (other_ge - other_gt) + tied_before, gt + tied_before, ties)


def _topk_full_mode(scores: torch.Tensor, pos_u: torch.Tensor, s_pos: torch.Tensor, counts: torch.Tensor,
                    settings: _Settings) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact ranks (full list, and among irrelevant items) up to the largest ``topk``, for users with many
    positives (see :data:`_COUNT_MAX_MEAN_POSITIVES`): one ``torch.topk`` of size max(topk) + max |T_u|;
    ranks beyond are marked -1 (every cut-off metric is 0 there)."""
    from reco_sampled_plugin.counting import count_beating_rows

    n_tot = scores.shape[1]
    kmax = int(counts.max()) if counts.numel() else 0
    ktop = min(n_tot, max(settings.topk) + kmax)
    vals = torch.topk(scores, ktop, dim=1).values  # (B, ktop), descending
    rows = vals[pos_u]
    ge = (rows >= s_pos.unsqueeze(1)).sum(1)
    gt = (rows > s_pos.unsqueeze(1)).sum(1)
    last = vals[pos_u, -1]
    known = (ge < ktop) | (ktop == n_tot)  # every item scoring >= s_pos lies in the top
    tie_edge = (~known) & (s_pos == last)  # ties across the edge of the top: count on the full row
    if bool(tie_edge.any()):
        idx = tie_edge.nonzero().squeeze(1)
        ge[idx] = count_beating_rows(scores, pos_u[idx], s_pos[idx], inclusive=True)
        gt[idx] = count_beating_rows(scores, pos_u[idx], s_pos[idx], inclusive=False)
        known[idx] = True
    other_ge, other_gt, tied_before = _other_positive_counts(pos_u, s_pos, counts, tied_before=True)
    r_full = _full_ranks(ge, gt, other_ge, other_gt, tied_before, settings.ties)
    r_irr = _ranks_from_counts(ge - other_ge, gt - other_gt, settings.ties)
    r_full = torch.where(known, r_full, torch.full_like(r_full, _BEYOND))
    r_irr = torch.where(known, r_irr, torch.full_like(r_irr, _BEYOND))
    return r_full, r_irr


# Full mode counts, for every positive, the items of its user's row scoring >= / > it (one compiled pass of
# |T_u| x n comparisons per user, no padding): exact ranks of every positive, and simulated sampled ranks
# drawn from them. With more held-out items per user than this on average, a top-k of each row is cheaper
# (exact ranks up to max(topk), simulated ranks from drawn items); ``rsp_full_ranks`` always counts.
_COUNT_MAX_MEAN_POSITIVES = 64


def _full_counts(scores: torch.Tensor, pos_u: torch.Tensor, s_pos: torch.Tensor,
                 ties: str) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
    """#(items scoring >= each positive) over its user's whole row (itself included), #(items scoring >
    it) (None for pessimistic ties: not needed), and each row's candidate count (items with a score above
    -inf: RecBole sets padding and history items to -inf; NaN scores never count), from one compiled
    count (the candidate counts ride along as one extra reference per row)."""
    from reco_sampled_plugin.counting import count_beating_rows

    b, npos = scores.shape[0], pos_u.shape[0]
    lowest = torch.full((b,), torch.finfo(scores.dtype).min, dtype=scores.dtype, device=scores.device)
    rows = torch.cat([pos_u, torch.arange(b, device=scores.device)])
    both = count_beating_rows(scores, rows, torch.cat([s_pos, lowest]), inclusive=True)
    gt = None if ties == "pessimistic" else count_beating_rows(scores, pos_u, s_pos, inclusive=False)
    return both[:npos], gt, both[npos:]


def _binomial_sampled(ge_irr: torch.Tensor, gt_irr: torch.Tensor, n_irr_items: torch.Tensor, m: int, ties: str,
                      generator: torch.Generator) -> torch.Tensor:
    """Sampled ranks of uniform sampling with replacement drawn from the exact counts: each of the m draws
    is an irrelevant item scoring >= the positive with probability ge_irr / N (N irrelevant candidates), so
    r~ = 1 + Binomial(m, ge_irr / N) (pessimistic), 1 + Binomial(m, gt_irr / N) (optimistic); ``average``
    splits the draws into above / tied / below and places the positive uniformly among the tied ones, as
    :func:`_sampled_from_scores` does with drawn items. Same law as drawing items, ~1e4 draws instead of 1e6."""
    from reco_sampled_plugin.simulate import draw_hits

    n_items = n_irr_items.to(torch.float64).clamp(min=1.0)
    trials = torch.full_like(n_items, float(m))
    if ties == "pessimistic":
        return 1.0 + draw_hits(trials, ge_irr, n_items, "binomial", generator)
    gt = gt_irr.to(torch.float64)
    above = draw_hits(trials, gt, n_items, "binomial", generator)
    if ties == "optimistic":
        return above + 1.0
    eq = (ge_irr.to(torch.float64) - gt).clamp(min=0.0)
    tied = draw_hits(trials - above, eq, n_items - gt, "binomial", generator)
    u = torch.rand(tied.shape, generator=generator, dtype=torch.float64, device=tied.device)
    return above + 1.0 + torch.floor(u * (tied + 1.0))


def _adaptive_from_counts(first: torch.Tensor, ge_irr: torch.Tensor, gt_irr: torch.Tensor, n_irr_items: torch.Tensor,
                          settings: _Settings, generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Adaptive sampling (``reco_sampled_plugin.adaptive``) drawn from the exact counts: positives still within the
    top (r~ <= the design's ``adaptive_top``) draw the stage's new items (m doubling) by :func:`_binomial_sampled`
    (their beats added), until past it or at the cap.
    Returns (sampled ranks among the final m, final m), float64 per positive; one check per stage."""
    adaptive = None if settings.design is None else settings.design.adaptive
    assert adaptive is not None  # called with rsp_adaptive_max (an adaptive design)
    stages = adaptive.stages.tolist()
    ranks = first.clone()
    sizes = torch.full_like(ranks, float(stages[0]))
    for s in range(1, len(stages)):
        need = (continues(ranks, adaptive) & (sizes == stages[s - 1])).nonzero().squeeze(1)
        if need.numel() == 0:
            break
        more = _binomial_sampled(ge_irr[need], gt_irr[need], n_irr_items[need], stages[s] - stages[s - 1],
                                 settings.ties, generator)
        ranks[need] = ranks[need] - 1.0 + more  # the beats of every stage add
        sizes[need] = float(stages[s])
    return ranks, sizes


def _completed_at_cap(ranks: torch.Tensor, sizes: torch.Tensor, ge_irr: torch.Tensor, gt_irr: torch.Tensor,
                      design: SamplingDesign, ties: str, generator: torch.Generator) -> torch.Tensor:
    """``exact_at_cap`` in full mode: the exact rank R of each positive still within the top at the cap (r~ <= t
    among the cap's draws, t the design's ``adaptive_top``: ``adaptive.completion_targets``), 0 elsewhere (float64),
    from the exact counts (the scores at hand; nothing drawn): 1 + #(irrelevant candidates scoring >= it)
    (pessimistic), > it (optimistic), or placed uniformly among its ties (``average``, a whole rank as the draws'
    ``_sampled_from_scores`` places it; the core's ``random``). ``gt_irr``: the count > it (pessimistic: unused)."""
    done = completion_targets(ranks, sizes, design)
    ge = ge_irr.to(torch.float64)
    if ties == "pessimistic":
        r = ge + 1.0
    elif ties == "optimistic":
        r = gt_irr.to(torch.float64) + 1.0
    else:
        gt = gt_irr.to(torch.float64)
        u = torch.rand(gt.shape, generator=generator, dtype=torch.float64, device=gt.device)
        r = gt + 1.0 + torch.floor(u * (ge - gt + 1.0))
    return torch.where(done, r, torch.zeros_like(r))


def _hypergeometric_sampled(ge_irr: torch.Tensor, gt_irr: torch.Tensor, n_irr_items: torch.Tensor, m: int, ties: str,
                            generator: torch.Generator) -> torch.Tensor:
    """Sampled ranks of uniform sampling without replacement drawn from the exact counts: of m distinct
    irrelevant items drawn from N, the number scoring >= the positive is Hypergeometric(N, ge_irr, m), so
    r~ = 1 + that (pessimistic; ``gt_irr`` for optimistic); ``average`` draws the tied items among the
    remaining draws (a multivariate hypergeometric, one margin at a time) and places the positive uniformly
    among them, as :func:`_sampled_from_scores` does with drawn items. Exact (numpy's sampler, seeded from
    ``generator``); ~1e4 draws instead of a random ranking of every candidate per positive.

    Raises:
        ValueError: some user has fewer than m irrelevant candidates.
    """
    dev = ge_irr.device
    if ge_irr.shape[0] == 0:
        return torch.zeros(0, dtype=torch.float64, device=dev)
    host = torch.stack([n_irr_items.to(torch.int64), ge_irr.to(torch.int64), gt_irr.to(torch.int64)]).cpu().numpy()
    n_items = host[0]
    if n_items.size and int(n_items.min()) < m:
        raise ValueError(f"rsp_m: {m} draws without replacement exceed some user's {int(n_items.min())} irrelevant items")
    from reco_sampled_plugin.simulate import draw_hits

    rng = np.random.default_rng(int(torch.randint(0, 2**62, (1,), generator=generator, device=generator.device)))
    gt = np.clip(host[2], 0, n_items)
    if ties == "pessimistic":
        ge = np.clip(host[1], 0, n_items)
        out = 1.0 + draw_hits(m, ge, n_items, "hypergeometric", rng).astype(np.float64)
    else:
        above = draw_hits(m, gt, n_items, "hypergeometric", rng)
        if ties == "optimistic":
            out = above.astype(np.float64) + 1.0
        else:
            eq = np.clip(host[1] - gt, 0, n_items - gt)
            rest = n_items - gt  # the items not above, from which the other m - above draws come
            tied = draw_hits(m - above, eq, rest, "hypergeometric", rng)
            u = rng.random(tied.shape[0])
            out = above + 1.0 + np.floor(u * (tied + 1.0))
    return _on(torch.from_numpy(out), dev)


def _simulate(scores: torch.Tensor, pos_u: torch.Tensor, pos_i: torch.Tensor, s_pos: torch.Tensor, settings: _Settings,
              generator: torch.Generator) -> torch.Tensor:
    """Draw m irrelevant items per positive among the user's candidates (finite scores, not a positive of
    the user) and return the sampled ranks."""
    b, n_tot = scores.shape
    assert settings.m is not None  # sampled ranks: rsp_m is set
    m = int(settings.m)
    npos = pos_u.shape[0]
    if settings.replacement:
        # excluded items score -inf (RecBole; any non-finite score counts as excluded); the user's positives are set to -inf on a copy, so one gather
        # of the drawn items' scores also tells which draws to reject and redraw (a few %, shrinking subset)
        work = scores.clone()
        work[pos_u, pos_i] = -math.inf
        neg = torch.randint(0, n_tot, (npos, m), generator=generator, device=scores.device)
        s_neg = work[pos_u.unsqueeze(1), neg]
        flat_s = s_neg.view(-1)
        row = pos_u.repeat_interleave(m)
        todo = (~torch.isfinite(flat_s)).nonzero().squeeze(1)
        for _ in range(10_000):  # rejection sampling over the rejected draws only
            if todo.numel() == 0:
                break
            redraw = torch.randint(0, n_tot, (todo.numel(),), generator=generator, device=scores.device)
            new = work[row[todo], redraw]
            flat_s[todo] = new
            todo = todo[~torch.isfinite(new)]
        else:  # pragma: no cover - a user with no irrelevant candidate
            raise ValueError("rsp_m: some user has no irrelevant candidate item to sample")
        return _sampled_from_scores(s_neg, s_pos, settings.ties, generator)
    allowed = torch.isfinite(scores)  # without replacement: the m smallest of random keys over allowed items
    allowed[pos_u, pos_i] = False
    n_allowed = allowed.sum(1)
    if bool((n_allowed[pos_u] < m).any()):
        raise ValueError(f"rsp_m: {m} draws without replacement exceed some user's {int(n_allowed.min())} irrelevant items")
    neg = torch.empty((npos, m), dtype=torch.int64, device=scores.device)
    chunk = max(1, (1 << 22) // max(n_tot, 1))
    for start in range(0, npos, chunk):
        sl = slice(start, start + chunk)
        keys = torch.rand((pos_u[sl].shape[0], n_tot), generator=generator, device=scores.device)
        keys = keys.masked_fill(~allowed[pos_u[sl]], 2.0)
        neg[sl] = torch.topk(keys, m, dim=1, largest=False).indices
    s_neg = scores[pos_u.unsqueeze(1), neg]
    return _sampled_from_scores(s_neg, s_pos, settings.ties, generator)


def _neg_layout(items: torch.Tensor, pos_u: torch.Tensor, pos_i: torch.Tensor,
                counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, int, torch.Tensor]:
    """Rows of each positive's own N negatives in NegSampleEvalDataLoader batches (``items``: the item
    column of one batch, or of consecutive batches concatenated: each holds whole user blocks).

    A user with k positives occupies k (1 + N) consecutive rows: its k positives, then negative j of
    positive i at offset k + j k + i (``Sampler.sample_by_key_ids`` tiles the user's positives). Returns the
    negatives' items, the positives' rows, N, and a 0-dim bool tensor: True where the positives are not
    where the layout puts them (read by the caller together with the check of the scores: one wait).
    """
    total = pos_u.shape[0]  # = counts.sum()
    rows = items.shape[0]
    if total == 0 or rows % total:
        raise RuntimeError(f"reco_sampled_plugin: unexpected sampled-evaluation layout ({rows} rows for {total} positives)")
    n_draws = rows // total - 1
    if n_draws < 1:
        raise RuntimeError("reco_sampled_plugin: the sampled evaluation batch holds no negative items")
    block_start = torch.cumsum(counts * (1 + n_draws), 0) - counts * (1 + n_draws)
    pos_start = torch.cumsum(counts, 0) - counts
    local = torch.arange(total, device=pos_u.device) - pos_start[pos_u]
    k = counts[pos_u]
    pos_rows = block_start[pos_u] + local
    misplaced = (items[pos_rows] != pos_i).any()
    j = torch.arange(n_draws, device=pos_u.device)
    neg_rows = (block_start[pos_u] + k + local).unsqueeze(1) + j.unsqueeze(0) * k.unsqueeze(1)
    return items[neg_rows], pos_rows, n_draws, misplaced


def _check_flags(scores: torch.Tensor, s_pos: torch.Tensor, settings: _Settings) -> torch.Tensor:
    """0-dim bool tensor, True when the scores fail the check (read by :func:`_raise_if_bad`, one wait):
    with ``rsp_check_finite`` (the default) a NaN or +inf anywhere in the scores (their maximum propagates
    NaN: one vectorised pass, no per-row temporaries; -inf is RecBole's excluded item), without it a NaN
    score of a held-out item (its rank is undefined either way)."""
    if getattr(settings, "check_finite", True) in (False, "positives") or scores.numel() == 0:
        return torch.isnan(s_pos).any()
    hi = scores.max()
    return torch.isnan(hi) | torch.isposinf(hi)


def _raise_if_bad(flags: torch.Tensor, scores: torch.Tensor, s_pos: torch.Tensor, settings: _Settings, uids: torch.Tensor | None) -> None:
    """Read the flags (the flush's one wait on the device: [scores fail :func:`_check_flags`] or, sampled
    modes, [that, positives misplaced]) and raise what they found."""
    bad = flags.tolist()
    if len(bad) > 1 and bad[1]:
        raise RuntimeError("reco_sampled_plugin: positives are not where RecBole's sampled layout puts them")
    if not bad[0]:
        return
    if getattr(settings, "check_finite", True) in (False, "positives"):
        raise ValueError(f"reco_sampled_plugin: the model scored {int(torch.isnan(s_pos).sum())} held-out item(s) NaN; "
                         "their ranks are undefined")
    nan_rows, inf_rows = torch.isnan(scores).any(1), torch.isposinf(scores).any(1)
    first = int((nan_rows | inf_rows).nonzero()[0, 0])
    who = f"RecBole user id {int(uids[first])}" if uids is not None else f"row {first}"
    raise ValueError(
        f"reco_sampled_plugin: the scores hold NaN in {int(nan_rows.sum())} and +inf in {int(inf_rows.sum())} of "
        f"{scores.shape[0]} users' rows (first: {who}); RecBole marks excluded items with -inf, and a NaN or +inf "
        "score has no rank. Check the model's full_sort_predict (predict in uniN / popN mode), or set "
        "rsp_check_finite: false to check only the held-out items' scores (a NaN elsewhere then counts as not "
        "competing)"
    )


# full-sort batches are gathered and processed together once they hold this many scores (and at the end
# of the evaluation): RecBole's default eval_batch_size gives 2 users per batch on ml-100k, and a few dozen
# small torch calls per batch would cost more than RecBole's own evaluation. 2^24 float32 = 64 MiB.
_BUFFER_ELEMENTS = 1 << 24
# a full-sort batch of at least this many scores is ranked at once, from RecBole's own tensor: its per-call
# costs are amortised already, and gathering it would only copy it (CPU staging: measured 0.25 s of a 20,000 x
# 50,000 evaluation at 256 users per batch) or concatenate it (other devices)
_DIRECT_ELEMENTS = 1 << 22


class _Staging:
    """CPU evaluation batches copied, as they arrive, into numpy buffers that are reused across evaluations.

    Copying each batch while it is hot (a few slice assignments) lets RecBole free and reuse the batch's
    memory at once; holding 472 score tensors until the end of an ml-100k evaluation instead spreads them
    over fresh memory and costs more (measured in BENCHMARKS.md), and the copies need no check that the
    model did not write into an earlier batch's scores. Rows of ``scores`` are users in arrival order;
    ``pu`` holds each positive's row within its batch until :meth:`take` adds the rows of the batches before
    it. Full-sort batches keep each row's user id; sampled-mode batches (``uniN`` / ``popN``, opened with an
    item field) keep the item and user id of every interaction row instead, RecBole's layout of each
    user's positives and negatives (:func:`_neg_layout`).
    """

    __slots__ = ("scores", "pu", "pi", "uid", "items", "marks", "used", "npos", "nrows", "nitems",
                 "n_cols", "dtype", "uid_field", "item_field", "sampled", "has_uid")

    def __init__(self) -> None:
        self.scores = np.empty(0, np.float32)
        self.pu = np.empty(0, np.int64)
        self.pi = np.empty(0, np.int64)
        self.uid = np.empty(0, np.int64)  # full sort: per row of scores; sampled: per interaction row
        self.items = np.empty(0, np.int64)  # sampled: per interaction row
        self.marks: list[int] = []  # first row, end of the positives, of each batch in turn
        self.used = self.npos = self.nrows = self.nitems = self.n_cols = 0
        self.dtype: torch.dtype | None = None
        self.uid_field: str | None = None
        self.item_field: str | None = None
        self.sampled = False
        self.has_uid = True

    def open(self, scores: torch.Tensor, a: np.ndarray, uid_field: str, item_field: str | None = None,
             expected_rows: int = 0) -> None:
        """Start gathering batches shaped and typed like ``scores`` (rows, items) (``a``: its numpy view);
        ``item_field`` given: sampled-mode batches. ``expected_rows``: the evaluation's users when known (full
        sort): the score buffer is sized for them at once (at most one flush's worth, ``_BUFFER_ELEMENTS``)
        instead of doubling from the first batch's size (a dozen copies and fresh pages in a first evaluation)."""
        self.used = self.npos = self.nrows = self.nitems = 0
        self.marks = []
        self.n_cols, self.dtype, self.has_uid = a.shape[1], scores.dtype, True
        self.uid_field, self.item_field, self.sampled = uid_field, item_field, item_field is not None
        if self.scores.dtype != a.dtype:
            self.scores = np.empty(0, a.dtype)
        want = min(int(expected_rows) * a.shape[1], _BUFFER_ELEMENTS + a.size)
        if item_field is None and want > self.scores.shape[0]:  # empty: nothing to keep
            self.scores = np.empty(want, a.dtype)

    def add(self, scores: torch.Tensor, interaction: Any, positive_u: torch.Tensor, positive_i: torch.Tensor) -> bool:
        """Copy one batch; False (nothing copied) when it does not fit the open kind, shape, dtype or device."""
        if scores.dtype is not self.dtype:
            return False
        try:
            a = scores.numpy()  # CPU tensors only (RecBole evaluates under no_grad)
            u = positive_u.numpy()
            i = positive_i.numpy()
            if self.item_field is None:
                rows_uid = interaction.interaction.get(self.uid_field) if self.has_uid else None
                rows_uid = None if rows_uid is None else rows_uid.numpy()
                rows_item = None
            else:  # sampled: every row's item and user (both needed)
                rows_item = interaction.interaction[self.item_field].numpy()
                rows_uid = interaction.interaction[self.uid_field].numpy()
        except (TypeError, RuntimeError, AttributeError, KeyError):  # another device, autograd, no positives or ids
            return False
        if a.ndim != 2 or a.shape[1] != self.n_cols:
            return False
        b = a.shape[0]
        p, q, r, t = self.used, self.npos, self.nrows, self.nitems
        e, f = p + a.size, q + u.shape[0]
        t_end = t if rows_item is None else t + rows_item.shape[0]
        id_end = (r + b) if rows_item is None else t_end
        if e > self.scores.shape[0] or f > self.pu.shape[0] or id_end > self.uid.shape[0] or t_end > self.items.shape[0]:
            self._grow(e, f, id_end, t_end)
        self.scores[p:e] = a.reshape(-1)
        self.pu[q:f] = u
        self.pi[q:f] = i
        self.marks += (r, f)
        if rows_item is not None:
            assert rows_uid is not None  # sampled batches carry the user column with the item column
            self.items[t:t_end] = rows_item
            self.uid[t:t_end] = rows_uid
        elif rows_uid is None:
            self.has_uid = False
        else:
            self.uid[r : r + b] = rows_uid
        self.used, self.npos, self.nrows, self.nitems = e, f, r + b, t_end
        return True

    def _grow(self, scores: int, positives: int, ids: int, items: int) -> None:
        def grown(old: np.ndarray, used: int, need: int) -> np.ndarray:
            if need <= old.shape[0]:
                return old
            new = np.empty(max(need, 2 * old.shape[0]), old.dtype)
            new[:used] = old[:used]
            return new

        self.scores = grown(self.scores, self.used, scores)
        self.pu = grown(self.pu, self.npos, positives)
        self.pi = grown(self.pi, self.npos, positives)
        self.uid = grown(self.uid, self.nitems if self.sampled else self.nrows, ids)
        self.items = grown(self.items, self.nitems, items)

    def take(self) -> tuple:
        """The gathered batches as tensors: scores (rows, items), the positives' global rows and items, and
        (full sort) the rows' user ids or None, or (sampled) the interaction rows' items and user ids. Views
        of the buffers: read before the next :meth:`open`."""
        marks = np.array(self.marks, dtype=np.int64).reshape(-1, 2)  # flat ints: one fast conversion
        sizes = np.diff(marks[:, 1], prepend=0)
        pu = self.pu[: self.npos] + np.repeat(marks[:, 0], sizes)  # rows of the batches before
        scores = torch.from_numpy(self.scores[: self.used]).view(self.nrows, self.n_cols)
        out = (scores, torch.from_numpy(pu), torch.from_numpy(self.pi[: self.npos]))
        if self.sampled:
            return out + (torch.from_numpy(self.items[: self.nitems]), torch.from_numpy(self.uid[: self.nitems]))
        return out + (torch.from_numpy(self.uid[: self.nrows]) if self.has_uid else None,)


def _collect(collector: Any, scores: torch.Tensor, interaction: Any, positive_u: torch.Tensor, positive_i: torch.Tensor) -> None:
    """Per-positive ranks of one evaluation batch, the first of its kind: on the CPU it opens a
    :class:`_Staging` that copies this and the next batches (processed together by :func:`_flush`, see
    ``_BUFFER_ELEMENTS``); on other devices full-sort batches are held by reference (RecBole scores each
    batch into a new tensor) and sampled-mode batches (their own negatives) are processed at once, on the
    scores' device."""
    settings = collector.__dict__.get("_rsp_settings_now") or _settings(collector.config)
    collector._rsp_settings_now = settings  # validated once per evaluation (reset by get_data_struct)
    if settings is None or positive_u is None:
        return
    sampled = len(interaction) != scores.shape[0]  # sampled modes: k_u (1 + N) rows per user
    # the first batch of an evaluation (or after a flush, or of another kind) opens the staging (CPU) or
    # the buffer (full mode, other devices); the wrapped eval_batch_collect adds the next ones directly
    _flush(collector)
    a = None
    if _STAGE_ON_CPU and scores.device.type == "cpu" and not scores.requires_grad and scores.dim() == 2:
        try:
            a = scores.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): held by reference
            a = None
    if a is not None:
        stage = collector.__dict__.get("_rsp_stage") or _Staging()
        collector._rsp_stage = stage
        config = collector.config
        eval_data = collector.__dict__.get("_rsp_eval_data")
        rows = getattr(eval_data, "sample_size", 0) if not getattr(eval_data, "is_sequential", True) else 0
        stage.open(scores, a, config["USER_ID_FIELD"], config["ITEM_ID_FIELD"] if sampled else None,
                   rows if isinstance(rows, int) else 0)
        if stage.add(scores, interaction, positive_u, positive_i):
            collector._rsp_staging = stage
            if stage.used >= _BUFFER_ELEMENTS:
                _flush(collector)
            return
    if sampled:
        _collect_sampled(collector, scores, interaction, positive_u, positive_i)
        return
    collector._rsp_buffer = [(scores, scores._version, positive_u, positive_i, interaction)]
    collector._rsp_buffered = scores.numel()
    if collector._rsp_buffered >= _BUFFER_ELEMENTS:
        _flush(collector)


def _collect_direct(collector: Any, scores: torch.Tensor, interaction: Any, positive_u: torch.Tensor,
                    positive_i: torch.Tensor) -> None:
    """A large full-sort batch ranked at once on its device, after whatever was gathered before it (users
    stay in arrival order)."""
    settings = collector.__dict__.get("_rsp_settings_now") or _settings(collector.config)
    collector._rsp_settings_now = settings
    if settings is None or positive_u is None:
        return
    _flush(collector)
    _process_full(collector, *_unbuffer(collector, [(scores, scores._version, positive_u, positive_i, interaction)]))


# CPU full-sort batches are copied into a _Staging (False: held by reference like other devices; tests)
_STAGE_ON_CPU = True


def _generator(collector: Any, settings: _Settings, device: torch.device) -> torch.Generator:
    """The evaluation's seeded generator, on the scores' device (a CUDA run draws from another stream than a
    CPU run: same law, other values)."""
    gen = getattr(collector, "_rsp_generator", None)
    if gen is None or gen.device != device:
        gen = collector._rsp_generator = torch.Generator(device=device).manual_seed(settings.seed)
    return gen


def _new_table(collector: Any, pos_u: torch.Tensor, pos_i: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    table = torch.zeros((pos_u.shape[0], _N_COLS), dtype=torch.float64, device=pos_u.device)
    table[:, _USER] = (pos_u + getattr(collector, "_rsp_user_offset", 0)).to(torch.float64)
    table[:, _N_POS] = counts[pos_u].to(torch.float64)
    table[:, _ITEM] = pos_i.to(torch.float64)
    return table


def _store(collector: Any, table: torch.Tensor, n_users: int) -> None:
    collector._rsp_user_offset = getattr(collector, "_rsp_user_offset", 0) + n_users
    collector.__dict__.setdefault("_rsp_tables", []).append(table)  # concatenated once, in get_data_struct


def _unbuffer(collector: Any, buf: list) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Stack the buffered full-sort batches (users in arrival order): the scores, the positives' rows and
    items, and the users' ids (None when the batches carry none), all on the scores' device. RecBole's
    positives and ids live on the host: they are stacked there and copied over once."""
    scs, versions, pus, pis, inters = zip(*buf)  # one transpose of the buffer, then whole-list calls
    if [sc._version for sc in scs] != list(versions):
        raise RuntimeError(
            "reco_sampled_plugin: the scores of an earlier evaluation batch were modified in place after RecBole "
            "collected them (a model that reuses its score buffer across batches?); the plugin reads them when "
            "the evaluation ends. Return a new tensor from full_sort_predict."
        )
    uid_field = collector.config["USER_ID_FIELD"]
    uids = [inter.interaction.get(uid_field) for inter in inters]
    if len(buf) == 1:
        scores, pos_u, pos_i = scs[0], pus[0], pis[0]
    else:
        rows = [sc.shape[0] for sc in scs]
        lens = [pu.shape[0] for pu in pus]
        home = pus[0].device
        starts = torch.tensor([0, *rows[:-1]], device=home).cumsum(0)
        offsets = torch.repeat_interleave(starts, torch.tensor(lens, device=home), output_size=sum(lens))
        scores = torch.cat(scs)
        pos_u = torch.cat(pus).to(torch.int64) + offsets
        pos_i = torch.cat(pis)
    dev = scores.device
    uid = None if any(u is None for u in uids) else _on(uids[0] if len(uids) == 1 else torch.cat(uids), dev)
    return scores.detach(), _on(pos_u.to(torch.int64), dev), _on(pos_i.to(torch.int64), dev), uid


def _flush(collector: Any) -> None:
    """Rank the gathered batches together: staged copies (full-sort or sampled mode) or buffered
    full-sort references."""
    stage = collector.__dict__.pop("_rsp_staging", None)
    buf = collector.__dict__.pop("_rsp_buffer", None)
    collector._rsp_buffered = 0
    if stage is not None and stage.nrows:
        data = stage.take()
        stage.nrows = 0
        (_process_sampled if stage.sampled else _process_full)(collector, *data)
    elif buf:
        data = _unbuffer(collector, buf)
        del buf
        _process_full(collector, *data)


def _process_full(collector: Any, scores: torch.Tensor, pos_u: torch.Tensor, pos_i: torch.Tensor, uids: torch.Tensor | None) -> None:
    """Per-positive table of full-sort users (scores, global rows of the positives, their items, ids; all
    on one device, where the table is built)."""
    settings = collector._rsp_settings_now
    b = scores.shape[0]
    counts = _counts_per_row(pos_u, b)
    s_pos = scores[pos_u, pos_i]
    _raise_if_bad(_check_flags(scores, s_pos, settings).reshape(1), scores, s_pos, settings, uids)
    table = _new_table(collector, pos_u, pos_i, counts)
    if uids is not None:
        table[:, _UID] = uids[pos_u].to(torch.float64)
    # adaptive sampling is drawn from the exact counts, so it always counts
    counted = settings.full_ranks or settings.adaptive_max is not None or pos_u.shape[0] <= _COUNT_MAX_MEAN_POSITIVES * b
    if counted:  # exact ranks of every positive (and sampled ranks drawn from them)
        ge, gt_or_none, n_full = _full_counts(scores, pos_u, s_pos, settings.ties)
        other_ge, other_gt, tied_before = _other_positive_counts(pos_u, s_pos, counts, tied_before=True)
        gt = ge if gt_or_none is None else gt_or_none
        table[:, _R_FULL] = _full_ranks(ge, gt, other_ge, other_gt, tied_before, settings.ties)
        table[:, _R_IRR] = _ranks_from_counts(ge - other_ge, gt - other_gt, settings.ties)
    else:
        n_full = _full_counts(scores, pos_u[:0], s_pos[:0], "pessimistic")[2]  # candidate counts only
        if settings.needs_exact or settings.side_by_side:
            table[:, _R_FULL], table[:, _R_IRR] = _topk_full_mode(scores, pos_u, s_pos, counts, settings)
    n_irr = (n_full - counts + 1)[pos_u]  # irrelevant candidates + the positive itself
    table[:, _N_IRR] = n_irr.to(torch.float64)
    if settings.m is not None:
        gen = _generator(collector, settings, scores.device)
        if counted:  # drawn from the exact counts: the law of drawing m items, ~1e4 draws
            draw = _binomial_sampled if settings.replacement else _hypergeometric_sampled
            ge_irr, gt_irr = ge - 1 - other_ge, gt - other_gt
            table[:, _R_SAMPLED] = draw(ge_irr, gt_irr, n_irr - 1, int(settings.m), settings.ties, gen)
            table[:, _M] = float(settings.m)
            if settings.adaptive_max is not None:
                table[:, _R_SAMPLED], table[:, _M] = _adaptive_from_counts(
                    table[:, _R_SAMPLED], ge_irr, gt_irr, n_irr - 1, settings, gen)
            if settings.design is not None and settings.design.exact_at_cap:
                table[:, _AT_CAP] = _completed_at_cap(table[:, _R_SAMPLED], table[:, _M], ge_irr, gt_irr,
                                                      settings.design, settings.ties, gen)
        else:
            table[:, _R_SAMPLED] = _simulate(scores, pos_u, pos_i, s_pos, settings, gen)
            table[:, _M] = float(settings.m)
    _store(collector, table, b)


def _collect_sampled(collector: Any, scores: torch.Tensor, interaction: Any, pos_u: torch.Tensor, pos_i: torch.Tensor) -> None:
    """One uniN / popN batch processed at once, on the scores' device (batches the staging cannot copy:
    other devices); RecBole's positives and the batch's item and user columns are copied there."""
    config, dev = collector.config, scores.device
    _process_sampled(collector, scores.detach(), _on(pos_u.detach().to(torch.int64), dev),
                     _on(pos_i.detach().to(torch.int64), dev), _on(interaction[config["ITEM_ID_FIELD"]], dev),
                     _on(interaction[config["USER_ID_FIELD"]], dev))


def _process_sampled(collector: Any, scores: torch.Tensor, pos_u: torch.Tensor, pos_i: torch.Tensor, items: torch.Tensor,
                     row_uids: torch.Tensor) -> None:
    """uniN / popN users: each positive's sampled rank against its own N negatives (``items`` / ``row_uids``:
    the item and user id of every row of the batches, in RecBole's layout)."""
    settings = collector._rsp_settings_now
    b = scores.shape[0]
    counts = _counts_per_row(pos_u, b)
    s_pos = scores[pos_u, pos_i]
    neg_items, pos_rows, n_draws, misplaced = _neg_layout(items, pos_u, pos_i, counts)
    uids = row_uids[pos_rows]
    flags = torch.stack([_check_flags(scores, s_pos, settings), misplaced])
    _raise_if_bad(flags, scores, s_pos, settings, None)
    table = _new_table(collector, pos_u, pos_i, counts)
    s_neg = scores[pos_u.unsqueeze(1), neg_items]
    gen = _generator(collector, settings, scores.device)
    table[:, _R_SAMPLED] = _sampled_from_scores(s_neg, s_pos, settings.ties, gen)
    table[:, _M] = float(n_draws)
    if settings.adaptive_max is not None or settings.exact_share is not None:  # the later stages and the share
        # rank against the positives' first-stage scores
        collector.__dict__.setdefault("_rsp_pos_scores", []).append(s_pos)
    table[:, _UID] = uids.to(torch.float64)
    table[:, _N_IRR] = (scores.shape[1] - _used_counts(collector, uids)).to(torch.float64)  # item_num (padding included) minus used
    sampler = getattr(getattr(collector, "_rsp_eval_data", None), "_sampler", None)
    if getattr(sampler, "distribution", None) == "popularity":  # popN: each positive's 1/q~ of its beating draws
        from ._recbole_popularity import check_planned_weights, popularity_columns, sampler_weights

        if settings.planned is not None:  # rsp_design's weights: the sampler's (once per sampler)
            check_planned_weights(settings.planned, sampler, sampler_weights(sampler, scores.shape[1]))
        stats, w = popularity_columns(sampler, scores.shape[1], uids, pos_i, neg_items, s_neg, s_pos, settings.ties)
        table[:, _POP] = 1.0
        for col, t in ((_HH_BEATING, stats.beating), (_HH_S1, stats.inv_q), (_HH_S2, stats.inv_q2),
                       (_HH_UNREACHABLE, stats.unreachable)):
            table[:, col] = t.to(torch.float64)
        table = torch.cat([table] + [getattr(stats, f).to(torch.float64) for f in PROFILE_FIELDS], 1)
        collector._rsp_popularity = w  # the weights travel with the table (finish_collection)
    _store(collector, table, b)


def _used_counts(collector: Any, uids: torch.Tensor) -> torch.Tensor:
    """How many items the evaluation's sampler excludes for each user id (``used_ids``: RecBole's per-user
    sets of items never drawn as negatives); the per-user sizes are computed once per sampler phase (and
    copied once to each device that asks)."""
    sampler = getattr(getattr(collector, "_rsp_eval_data", None), "_sampler", None)
    from recbole.sampler import RepeatableSampler

    if isinstance(sampler, RepeatableSampler):  # sequential models: each row excludes only its own target
        return torch.ones_like(uids)  # (its used_ids hold the last batch's targets by row, not by user)
    used = getattr(sampler, "used_ids", None)
    if used is None:
        raise RuntimeError(
            "reco_sampled_plugin: sampled evaluation needs the evaluation dataloader's sampler (RecBole's "
            "Trainer.evaluate passes it); evaluate through a RecBole Trainer"
        )
    cached = sampler.__dict__.get("_rsp_used_sizes")
    if cached is None or cached[0] is not used:
        per_user = torch.as_tensor(np.fromiter((len(u) for u in used), dtype=np.int64, count=len(used)))
        cached = sampler.__dict__["_rsp_used_sizes"] = (used, {per_user.device: per_user})
    sizes = cached[1].get(uids.device)
    if sizes is None:
        sizes = cached[1][uids.device] = next(iter(cached[1].values())).to(uids.device)
    return sizes[uids]


# ----------------------------------------------------------------------------- collector hooks
def collect_batch(collector: Any, scores_tensor: torch.Tensor, interaction: Any, positive_u: torch.Tensor,
                  positive_i: torch.Tensor) -> None:
    """After RecBole's own ``eval_batch_collect``: stage or buffer a full-sort batch (the common case, kept
    to a few attribute reads and copies), rank a large one at once, else start collecting (first batch) or
    rank a sampled batch."""
    if scores_tensor.numel() >= _DIRECT_ELEMENTS and len(interaction) == scores_tensor.shape[0]:
        if collector.register.need(PLUGIN_KEY):
            _collect_direct(collector, scores_tensor, interaction, positive_u, positive_i)
        return
    stage = collector.__dict__.get("_rsp_staging")
    if stage is not None and (len(interaction) != scores_tensor.shape[0]) == stage.sampled:  # staging: copy only
        if stage.add(scores_tensor, interaction, positive_u, positive_i):
            if stage.used >= _BUFFER_ELEMENTS:
                _flush(collector)
            return
    buf = collector.__dict__.get("_rsp_buffer")
    if buf is not None and len(interaction) == scores_tensor.shape[0]:  # full mode, buffering: append only
        buf.append((scores_tensor, scores_tensor._version, positive_u, positive_i, interaction))
        collector._rsp_buffered += scores_tensor.numel()
        if collector._rsp_buffered >= _BUFFER_ELEMENTS:
            _flush(collector)
    elif collector.register.need(PLUGIN_KEY):
        _collect(collector, scores_tensor, interaction, positive_u, positive_i)


def finish_collection(collector: Any) -> torch.Tensor | None:
    """When the evaluation ends: rank what is gathered and return the per-positive table (None if no
    positive was collected) on the host (its one copy from the device), for the caller to put under
    :data:`PLUGIN_KEY` of the ``DataStruct`` RecBole returns (after RecBole's deep copy of its own data: the
    table is built fresh for every evaluation)."""
    if collector.__dict__.get("_rsp_buffer") or collector.__dict__.get("_rsp_staging"):
        _flush(collector)
    tables = collector.__dict__.pop("_rsp_tables", None)
    if not tables:
        return None
    table = tables[0] if len(tables) == 1 else torch.cat(tables)
    table = table if table.device.type == "cpu" else table.cpu()
    weights = collector.__dict__.pop("_rsp_popularity", None)
    if weights is not None:  # popN: the sampler's weights, for the design the estimators read (_recbole_metrics)
        table.__dict__["_rsp_popularity"] = weights
    return table


def reset_collection(collector: Any, eval_data: Any = None) -> None:
    """Forget everything of a previous (possibly interrupted) evaluation; ``eval_data``: the dataloader of
    the next one (its sampler tells sampled modes each user's used items). The staging buffers stay."""
    if eval_data is not None:
        collector._rsp_eval_data = eval_data
        collector.rsp_cost = None  # the last evaluation's ScoringCost (uniN adaptive stages)
    collector._rsp_user_offset = 0
    collector._rsp_generator = None
    collector._rsp_settings_now = None
    collector.__dict__.pop("_rsp_tables", None)
    collector.__dict__.pop("_rsp_buffer", None)
    collector.__dict__.pop("_rsp_staging", None)
    collector.__dict__.pop("_rsp_kept", None)  # uniN adaptive stages: the positives' rows and scores
    collector.__dict__.pop("_rsp_pos_scores", None)
    collector.__dict__.pop("_rsp_popularity", None)
    collector._rsp_buffered = 0
