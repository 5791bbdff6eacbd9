"""Normalise the ways users pass positives and exclusions: boolean masks or padded index tensors.

Validation is fused for accelerators: each check is computed as a 0-d tensor (a :class:`Check`) and all of a
call's checks reach the host in one ``tolist()`` (:func:`run_checks`), one synchronisation instead of one per
condition; the error of the first failing check (in the order given) is raised.
"""

from __future__ import annotations

import functools
from typing import Any, Callable, NamedTuple, Sequence

import numpy as np
import torch

from ._checks import check_not_meta, check_same_device, real_tensor
from ._pool import row_ranges

__all__ = ["as_padded_index", "check_finite_rows", "check_scores", "factor_finite_checks", "finite_flags", "finite_rows", "mask_to_padded",
           "Check", "check_flags", "run_checks", "pending_index", "finite_check", "sparse_masks", "SparseMasks",
           "nonzero_sized"]


class Check(NamedTuple):
    """A deferred validity condition: ``bad`` a 0-d tensor (True or non-zero = invalid), ``fail`` raises its error
    (it may read more values back; it only runs on invalid input). ``name``: the check's kind (e.g.
    ``"positives_range"``), ``message``: its error text without reading anything back; both for a caller that keeps
    the flag on the device past the call and reads it later (the torchmetrics adapters on an accelerator: the flag
    goes to the metric's state, refused at compute); empty where no caller defers the check."""

    bad: torch.Tensor
    fail: Callable[[], None]
    name: str = ""
    message: str = ""


def run_checks(checks: list[Check], values: Sequence[torch.Tensor] = ()) -> list[int]:
    """Read every check's flag and the 0-d integer ``values`` back in one host synchronisation; raise the first
    failing check's error, else return the values as Python ints."""
    if not checks and not values:
        return []
    def scalar(t: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
        return (t if t.dim() == 0 else t.reshape(())).to(dtype)  # no operator for a 0-d tensor of that dtype

    parts = [torch.stack([scalar(t, torch.int64) for t in values])] if values else []
    if checks:
        parts.append(check_flags(checks))
    host = (parts[0] if len(parts) == 1 else torch.cat(parts)).tolist()  # the one synchronisation
    for c, bad in zip(checks, host[len(values):]):
        if bad:
            c.fail()
    return host[: len(values)]


def check_flags(checks: Sequence[Check]) -> torch.Tensor:
    """The checks' flags as one (len(checks),) int64 tensor, not read back (1 = failed): stacked as they are (bool:
    no copy each), then cast once."""
    return torch.stack([(c.bad if c.bad.dim() == 0 else c.bad.reshape(())).to(torch.bool) for c in checks]).to(torch.int64)


_STATIC_NONZERO: dict[str, bool] = {}  # device type -> whether torch.nonzero_static runs there (learnt at first use)


def nonzero_sized(x: torch.Tensor, size: int) -> torch.Tensor:
    """(size, x.dim()) int64 indices of the non-zero entries of ``x``, row-major, their number ``size`` known (read
    with other values): ``torch.nonzero_static``, which reads nothing back (on CUDA from torch 2.6); where a device
    has no such kernel (CUDA builds of torch 2.2-2.5: NotImplementedError) a ``nonzero``, one read, the same
    indices."""
    kind = x.device.type
    if _STATIC_NONZERO.get(kind, True):
        try:
            return torch.nonzero_static(x, size=size)
        except NotImplementedError:
            _STATIC_NONZERO[kind] = False
    return x.nonzero()


def _words(mask: torch.Tensor) -> torch.Tensor:
    """A (B, n) bool mask as (B, ceil(n / 8)) int64 words of 8 items each (zero padding), in item order."""
    b, n = mask.shape
    m = mask.contiguous()
    # int64 words need 8-byte aligned storage and rows n apart: a one-row view (contiguous whatever its row stride) or
    # an offset view is copied into fresh row-major storage (``clone()`` alone keeps a one-row view's stride)
    if m.storage_offset() % 8 or (b and m.stride(0) != n):
        m = mask.clone(memory_format=torch.contiguous_format)
    if n % 8:
        m = torch.nn.functional.pad(m.view(torch.uint8), (0, 8 - n % 8))
    return m.view(torch.uint8).view(torch.int64) if b else m.new_zeros((0, (n + 7) // 8), dtype=torch.int64)


class SparseMasks(NamedTuple):
    """The set entries of one or more (B, n) boolean masks of one shape, from one pass (:func:`sparse_masks`).

    widths: per mask, a 0-d int64 tensor, the most True entries in a row (not read back yet).
    overlap: a 0-d bool tensor, True when two masks share an entry (two or more masks), else None.
    finish: ``finish(widths, size)`` with the widths (and ``size``) as Python ints -> the (B, width) int64 padded
        index tensors; called through :meth:`padded`.
    totals: per mask, a 0-d int64 tensor, its True entries in all (not read back yet).
    size: the accelerators' scan: a 0-d int64 tensor, the 64-bit words non-zero in any mask (not read back yet), the
        size of its ``nonzero_static`` (no synchronisation of its own); None for the CPU's numpy scan.
    """

    widths: list
    overlap: torch.Tensor | None
    finish: Callable[[list[int], int | None], list[torch.Tensor]]
    totals: list = []
    size: torch.Tensor | None = None

    def reads(self) -> list[torch.Tensor]:
        """The 0-d tensors :meth:`padded` needs as ints, to be read with a call's checks (:func:`run_checks`)."""
        return list(self.widths) + ([] if self.size is None else [self.size])

    def padded(self, values: Sequence[int], width: Callable[[int], int] = int) -> list[torch.Tensor]:
        """The padded index tensors from the values of :meth:`reads` (``width`` maps each read width to the
        padded one: at least the width read)."""
        k = len(self.widths)
        return self.finish([width(w) for w in values[:k]], values[k] if self.size is not None else None)


def sparse_masks(masks: list[torch.Tensor]) -> SparseMasks:
    """Set entries of (B, n) bool masks as padded indices, the masks scanned as 64-bit words (8 items each).

    Before any read: each mask's row counts (a sum over its bytes), the words non-zero in any mask counted, the
    overlap of two masks as one AND over their words; the caller reads the widths and that count with its checks
    (one synchronisation for the call), then :meth:`SparseMasks.padded` lists the non-zero words with
    ``nonzero_static`` of that size (no synchronisation of its own) and reads only those: O(B P) work beyond the
    passes over the words, no per-row loop, no (B, n) temporary."""
    b, n = masks[0].shape
    device = masks[0].device
    if device.type == "cpu" and _numpy_scan[0]:
        return _sparse_masks_numpy(masks)
    words = [_words(m) for m in masks]
    union = words[0]  # one mask: its words as they are; several: non-zero flags, 8x smaller than an OR of words
    if len(words) > 1:
        union = words[0] != 0
        for w in words[1:]:
            union |= w != 0
    counts = [m.sum(1) for m in masks]  # (B,) int64 entries per row
    widths = [c.max() if b else torch.zeros((), dtype=torch.int64, device=device) for c in counts]
    overlap = None
    if len(masks) > 1:
        both = words[0]
        for w in words[1:]:
            both = both & w
        overlap = (both != 0).any()

    def finish(ws: list[int], size: int | None) -> list[torch.Tensor]:
        assert size is not None
        rows, cols = nonzero_sized(union, size).unbind(1)  # row-major: rows, then words ascending
        k = rows.numel()
        hits = [w[rows, cols].view(torch.uint8).view(k, 8) != 0 for w in words]  # their bytes, in item order
        items = (cols.unsqueeze(1) * 8 + torch.arange(8, device=device)).reshape(-1)
        row8 = rows.unsqueeze(1).expand(k, 8).reshape(-1)
        out = []
        for h, c, width in zip(hits, counts, ws):
            hit = h.reshape(-1)
            starts = torch.cumsum(c, 0) - c  # entries of the rows before
            slot = torch.cumsum(hit, 0) - 1 - starts[row8]
            slot = torch.where(hit, slot, torch.full_like(slot, width))  # non-entries: a spare column
            padded = torch.full((b, width + 1), -1, dtype=torch.int64, device=device)
            padded.view(-1).scatter_(0, row8 * (width + 1) + slot, items)
            out.append(padded[:, :width])
        return out

    size = torch.count_nonzero(union)
    return SparseMasks(widths, overlap, finish, [c.sum() for c in counts], size)


_numpy_scan = [True]  # tests clear it to run the accelerators' scan and finite check (torch) on a CPU


def _set_words(flat: np.ndarray) -> np.ndarray:
    """Ascending positions of the non-zero entries of a 1-D uint64 array: a flag byte per word, then numpy's
    ``flatnonzero`` over the flags (over the words themselves it was 2.5x slower; a second level over the flags read 8
    at a time builds a candidate list 8 times the flagged groups: with it, and the set bytes found by a 2-D
    ``nonzero``, a 1,024-row mask took 20.1 against 15.7 ms at 55 of 100,000 items set per row, 14.3 against 7.9 ms
    at 150 of 20,000)."""
    return np.flatnonzero(flat != 0)


# a mask's share of set entries from which its bytes are listed directly (``flatnonzero``: ~0.3 ns per byte, ~22 ns
# per entry) rather than its set 64-bit words first (~0.16 ns per byte, ~50 ns per set word): the 2-core machine,
# best of 10, 1,024 rows: 55 of 100,000 set per row 15.7 ms by words against 35.9 ms by bytes, 1,000 of 100,000
# 67 against 49 ms, 150 of 20,000 7.9 against 5.7 ms, 100 of 2,000 2.7 against 2.0 ms
_DENSE_SHARE = 0.005
_DENSE_PROBE_ROWS = 16  # rows whose entries estimate the share (a guess that only decides the speed)


# mask bytes from which a scan splits its rows between torch's intra-op threads (numpy releases the GIL): a
# 1,024 x 100,000 mask (~12 ms on one thread, the 2-core machine) in two halves
_MASK_THREAD_MIN = 1 << 24


def _set_entries(m: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(rows, items) of a (B, n) bool mask's set entries, row-major (:func:`_row_entries`); a large mask's rows in
    ranges on the package's pool of threads (:func:`._pool.row_ranges`), one per torch intra-op thread, concatenated
    in order."""
    b, n = m.shape
    workers = min(torch.get_num_threads(), b) if b * n >= _MASK_THREAD_MIN else 1
    if workers < 2:
        return _row_entries(m)
    parts: dict[int, tuple[np.ndarray, np.ndarray]] = {}

    def scan(first: int, last: int) -> None:
        rows, items = _row_entries(m[first:last])
        parts[first] = (rows + first, items)

    row_ranges(scan, b, 1, workers)
    ordered = [parts[k] for k in sorted(parts)]
    return np.concatenate([r for r, _ in ordered]), np.concatenate([i for _, i in ordered])


def _row_entries(m: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(rows, items) of a (B, n) bool mask's set entries, row-major: its set 64-bit words, then their set bytes; or, for
    a mask whose first rows are denser than ``_DENSE_SHARE``, its bytes directly."""
    b, n = m.shape
    probe = min(b, _DENSE_PROBE_ROWS)
    a = m.numpy() if b and n and m.is_contiguous() else None
    if a is not None and np.count_nonzero(a[:probe]) > _DENSE_SHARE * probe * n:
        at = np.flatnonzero(a)
        rows = at // n
        return rows, at - rows * n
    if a is not None and n % 8 == 0 and a.flags.c_contiguous and a.ctypes.data % 8 == 0:
        words = a.view(np.uint64)  # read in place: no torch operator, no copy
    else:
        words = _words(m).numpy().view(np.uint64)
    w = words.shape[1]
    flat = words.reshape(-1)
    at = _set_words(flat)
    hit = np.flatnonzero(flat[at].view(np.uint8))  # the set bytes of the set words, in item order
    word = at[hit >> 3]
    rows = word // w
    return rows, (word - rows * w) * 8 + (hit & 7)


def _sparse_masks_numpy(masks: list[torch.Tensor]) -> SparseMasks:
    """:func:`sparse_masks` on a CPU, in numpy: each mask's set entries (:func:`_set_entries`), the rows' counts and
    padded indices; an overlap as the first mask's entries looked up in the others (O(B P)). Read nothing back
    (nothing is on a device); the 1,024 x 100,000 pair of masks of ``bench_input_forms`` in ~20 ms against ~45 ms for
    the accelerators' scan run on a CPU."""
    b, n = masks[0].shape
    entries = []
    for m in masks:
        rows, items = _set_entries(m)
        entries.append((rows, items, np.bincount(rows, minlength=b)))
    widths = [torch.tensor(int(c.max()) if b else 0) for _, _, c in entries]
    overlap = None
    if len(masks) > 1:
        rows, items, _ = entries[0]
        overlap = torch.tensor(any(bool(m.numpy()[rows, items].any()) for m in masks[1:]))

    def finish(ws: list[int], size: int | None) -> list[torch.Tensor]:
        out = []
        for (rows, items, counts), width in zip(entries, ws):
            padded = np.full((b, width), -1, dtype=np.int64)
            starts = np.cumsum(counts) - counts
            padded[rows, np.arange(rows.size) - starts[rows]] = items
            out.append(torch.from_numpy(padded))
        return out

    return SparseMasks(widths, overlap, finish, [torch.tensor(int(c.sum())) for _, _, c in entries])


def mask_to_padded(mask: torch.Tensor, width: int | None = None) -> torch.Tensor:
    """(B, n) boolean mask -> (B, P) int64 item indices in ascending order, padded with -1.

    ``width`` (P): the most True entries of a row, when known (else read back). :func:`sparse_masks`: the mask
    is scanned as 64-bit words, temporaries O(B n / 8 + B P).
    """
    b, n = mask.shape
    if b == 0 or n == 0:
        return torch.full((b, 0), -1, dtype=torch.int64, device=mask.device)
    sm = sparse_masks([mask])
    values = run_checks([], sm.reads() if width is None else sm.reads()[1:])  # one read: the width, the scan's size
    return sm.padded(values if width is None else [width, *values])[0]


def pending_index(
    x: Any, n_items: int, batch: int, name: str, device: torch.device, duplicates: bool = True, safe: bool = False,
) -> tuple[torch.Tensor, bool | None, list[Check]]:
    """Shape and dtype checks of positives or exclusions (raised now), the value checks deferred.

    Returns:
        (tensor, is_mask, checks): a (B, n) bool mask (``is_mask`` True: no value to check, see
        :func:`sparse_masks`) or a (B, P) int64 index tensor padded with -1 (``is_mask`` None); ``checks`` the
        deferred :class:`Check` list (range, duplicates unless ``duplicates`` is False: the caller checks them on
        its own sorted copy) for :func:`run_checks`. ``safe``: out-of-range entries of an index tensor are
        returned as -1 (padding), so that a caller which reads the checks later (after computing on the batch) never
        indexes out of range, and no duplicate or clash is made up from them (a clamp to the last item would); in-range
        inputs are returned as they are.
    """
    x = real_tensor(x, name, "a boolean mask or integer item indices", booleans=True)
    check_same_device(scores=torch.empty(0, device=device), **{name: x})
    if x.dtype == torch.bool:
        if x.shape != (batch, n_items):
            raise ValueError(f"{name}: a boolean mask must have the scores' shape {(batch, n_items)}, got {tuple(x.shape)}")
        return x, True, []
    if x.is_floating_point() or x.is_complex():
        raise ValueError(f"{name}: expected a boolean mask or an integer index tensor, got dtype {x.dtype}")
    if x.dim() == 1:
        x = x.unsqueeze(1)
    if x.dim() != 2 or x.shape[0] != batch:
        raise ValueError(f"{name}: expected shape ({batch}, P) (padded with -1) or ({batch},), got {tuple(x.shape)}")
    x = x.to(torch.int64)
    checks: list[Check] = []
    if x.numel():
        range_message = f"{name}: item indices must lie in 0..{n_items - 1} (or -1 for padding)"

        def bad_range() -> None:
            raise ValueError(range_message)

        if safe:  # read later: the batch is computed on first, so no index may point outside the catalogue
            inside = x.clamp(-1, n_items - 1) == x
            bad = ~inside.all()
            x = torch.where(inside, x, -1)  # out-of-range entries as padding: no made-up duplicate or clash
        else:
            lo, hi = torch.aminmax(x)  # one pass, no (B, P) temporary
            bad = (lo < -1) | (hi >= n_items)
        checks.append(Check(bad, bad_range, f"{name}_range", range_message))
        if duplicates and x.shape[1] > 1:
            srt = torch.sort(x, dim=1).values
            dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)

            looks_like_mask = tuple(x.shape) == (batch, n_items)

            def bad_dup() -> None:
                hint = ""
                if looks_like_mask and bool(((x == 0) | (x == 1)).all()):
                    hint = (f" (an integer 0/1 matrix of the scores' shape reads as item indices: pass a mask as "
                            f"bool, {name}.bool())")
                raise ValueError(f"{name}: {int(dup.any(1).sum())} row(s) list the same item twice{hint}")

            checks.append(Check(dup.any(), bad_dup, f"{name}_duplicates", f"{name}: a row lists the same item twice"))
    return x, None, checks


def as_padded_index(x: Any, n_items: int, batch: int, name: str, device: torch.device) -> torch.Tensor:
    """Positives or exclusions as a (B, P) int64 index tensor padded with -1.

    Accepts a (B, n) boolean mask, a (B, P) integer tensor padded with -1, or a (B,) integer tensor
    (one item per row). Raises a ValueError naming ``name`` on wrong shape, dtype, range or duplicates.
    One host synchronisation (the checks, or a mask's width).
    """
    t, is_mask, checks = pending_index(x, n_items, batch, name, device)
    if is_mask is None:
        run_checks(checks)
        return t
    return mask_to_padded(t)


def check_scores(scores: Any, check_finite: bool = True) -> torch.Tensor:
    """Validate a (B, n) floating score matrix."""
    scores = score_tensor(scores)
    if check_finite:
        run_checks([finite_check(scores)])
    return scores


def score_tensor(scores: Any) -> torch.Tensor:
    """The one conversion of a ``scores`` argument: a (users x items) floating tensor (tensors as they are, numpy
    arrays and lists converted; sparse matrices, strings, bools, complex numbers and ``meta`` tensors give a
    ValueError naming ``scores``)."""
    scores = real_tensor(scores, "scores", "a floating (users x items) matrix")
    if scores.dim() != 2:
        raise ValueError(f"scores: expected a (users x items) matrix, got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"scores: expected a floating dtype, got {scores.dtype}")
    return check_not_meta(scores, "scores")


def finite_flags(scores: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """The one NaN/inf test of scores: True where no value is NaN or inf, for the whole tensor (``dim`` None: 0-d)
    or along ``dim`` (``dim=1`` of a (B, n) matrix: (B,) rows). Min and max are finite iff every value is (both
    propagate NaN): one vectorised pass (aminmax: 8.7 ms for 1e8 float32, vs 13 ms for row sums and 345 ms for
    isfinite().all()), no temporary, nothing read back. Empty: True. A CPU's float32 / float64 matrix takes
    :func:`_finite_blas` (a read at the memory's speed)."""
    if dim is None:
        if not scores.numel():
            return torch.ones((), dtype=torch.bool, device=scores.device)
        if _host_matrix(scores):
            return _finite_blas(scores, rows=False)
        lo, hi = torch.aminmax(scores)
    else:
        if scores.shape[dim] == 0:
            d = dim % scores.dim()
            return torch.ones(scores.shape[:d] + scores.shape[d + 1:], dtype=torch.bool, device=scores.device)
        if _host_matrix(scores) and dim % 2 == 1:
            return _finite_blas(scores, rows=True)
        lo, hi = torch.aminmax(scores, dim=dim)
    return lo * 0 + hi * 0 == 0  # 0 where both are finite, NaN otherwise: 4 kernels (two isfinite and an and: 9)


def _host_matrix(scores: torch.Tensor) -> bool:
    """A float32 / float64 (B, n) matrix on a CPU of at least ``_BLAS_CHECK_MIN`` entries, where reads cost nothing
    (tests clear ``_numpy_scan`` to run the accelerators' paths on a CPU)."""
    return (scores.dim() == 2 and scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64)
            and scores.numel() >= _BLAS_CHECK_MIN[0] and _numpy_scan[0])


# entries from which a CPU matrix's NaN/inf check is a matrix-vector product (below: aminmax, ~0.4 ms at 2^20
# float32, no read back); a list: the tests lower it
_BLAS_CHECK_MIN = [1 << 20]


def _finite_blas(scores: torch.Tensor, rows: bool) -> torch.Tensor:
    """:func:`finite_flags` of a CPU (B, n) matrix, per row (``rows``) or in all, from its product with the vector
    w = 2^-k (:func:`_weights`). A NaN or inf entry makes its row's sum NaN or inf (IEEE: x w keeps it, inf - inf is
    NaN); finite entries cannot overflow it (|x| < 2^E gives |sum| < n 2^(E-k) < 2^(E-1)). One BLAS pass at the
    memory's speed, threaded as torch's matmuls (1,024 x 100,000 float32: 25 against aminmax's 50 ms on one thread,
    13 against 26 on two); the same 5 operators. A failing flag is checked again entry by entry (read back: free on
    a CPU), so the flags are exact whatever the product's precision: a float32 product computed in bfloat16
    (``torch.set_float32_matmul_precision("medium")``, oneDNN) rounds the largest finite values to inf; the bound
    only keeps finite matrices off that second pass."""
    with torch.no_grad():
        ok = torch.mv(scores, _weights(scores.shape[1], scores.dtype)) * 0 == 0
        every = ok.all()
        if not bool(every):
            if not rows:
                return torch.isfinite(scores).all()
            bad = (~ok).nonzero().squeeze(1)
            ok[bad] = torch.isfinite(scores[bad]).all(1)
    return ok if rows else every


@functools.lru_cache(maxsize=2)
def _weights(n: int, dtype: torch.dtype) -> torch.Tensor:
    """The (n,) vector 2^-k, k = bit_length(n) + 1, of :func:`_finite_blas` (two kept: float32 and float64 of one
    catalogue, at most 2 n values)."""
    with torch.inference_mode(False):
        return torch.full((n,), 2.0 ** -(n.bit_length() + 1), dtype=dtype)


def factor_finite_checks(u: torch.Tensor, v: torch.Tensor, bias: torch.Tensor | None = None) -> list[tuple[torch.Tensor, str]]:
    """NaN or inf factors or bias (then scores would be): (0-d bool flag, True when bad; its error message) per
    given non-empty tensor, nothing read back (:func:`finite_flags`)."""
    return [(~finite_flags(x), f"{name}: contains NaN or inf; ranks would be meaningless")
            for x, name in ((u, "user_factors"), (v, "item_factors"), (bias, "item_bias")) if x is not None and x.numel()]


def finite_check(scores: torch.Tensor) -> Check:
    """The NaN/inf check of a (B, n) score matrix as a deferred :class:`Check` (:func:`finite_flags` of the whole
    matrix); rows are only examined, for the message, when it fails."""
    if not scores.numel():
        return Check(torch.zeros((), dtype=torch.bool, device=scores.device), lambda: None)
    return Check(~finite_flags(scores), lambda: check_finite_rows(torch.isfinite(scores).all(1)))


def finite_rows(scores: torch.Tensor) -> torch.Tensor:
    """(B,) bool: rows of a (B, n) score matrix without NaN or inf. :func:`finite_flags` of the whole matrix
    (one read back); only when it fails are rows checked one by one."""
    if scores.numel():
        if not bool(finite_flags(scores)):
            return torch.isfinite(scores).all(1)
    return torch.ones(scores.shape[0], dtype=torch.bool, device=scores.device)


def check_finite_rows(finite_rows: torch.Tensor) -> None:
    """Raise the scores' NaN/inf ValueError (how many rows, the first one) unless every row is finite."""
    bad_rows = ~finite_rows
    if bool(bad_rows.any()):
        raise ValueError(
            f"scores: NaN or inf in {int(bad_rows.sum())} of {bad_rows.shape[0]} rows "
            f"(first bad row {int(bad_rows.nonzero()[0, 0])}); ranks would be meaningless"
        )
