"""Per-row excluded items (training items) prepared once: validated, sorted, ragged.

A user's exclusions come as a (B, n) boolean mask or a (B, E) int64 index tensor padded with -1, E the longest
list: one heavy user pads every row (5,000 users whose longest list holds 2,697 items and whose lists hold 0.82 M
in all: 13.5 M padded entries). :class:`Exclusions` holds them in CSR (ragged) form, every row's items sorted
ascending, built and checked once by :func:`prepare_exclusions`: memory O(B + T) for T excluded items in all
(the longest list no longer counts), and every operation the draws need costs O(T) or O(K log T) for K queries,
never O(B x longest list):

* ``contains``: whether items are excluded in their row (a positive also excluded, a pre-drawn negative);
* ``allowed_item``: the u-th (0-based) item of a row that is neither excluded nor a positive, the map that turns
  uniform positions into uniform irrelevant items (the draws of :func:`~reco_sampled_plugin.ranking.sampled_ranks`
  and of the scorer loop), equal to the padded map of :func:`~reco_sampled_plugin.ranking.allowed_position_to_item`
  on the sorted forbidden lists, item for item;
* ``select``: the rows of an adaptive stage, without re-validating or re-sorting.

Every entry point that takes ``exclude`` also takes an :class:`Exclusions` (of the same rows and catalogue), so a
caller evaluating the same users again (repeats, epochs, adaptive stages) prepares them once. Keys: a row's entries
are searched in one flat sorted key array, ``row * (n + 1) + item``, so one ``searchsorted`` serves every row.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from ._inputs import Check, mask_to_padded, nonzero_sized, pending_index, run_checks
from .counting import sort_rows

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = ["Exclusions", "PendingExclusions", "prepare_exclusions", "pending_exclusions", "as_exclusions",
           "check_prepared", "skip_sorted", "csr_from_padded"]


@dataclass(frozen=True, eq=False)
class Exclusions:
    """Excluded items of B rows over ``n_items`` items, CSR form (build with :func:`prepare_exclusions`).

    items: (T,) int64, row after row, ascending within a row, no duplicates, in 0..n_items - 1.
    row_of: (T,) int64, the row of each entry (non-decreasing).
    counts: (B,) int64, items per row.
    n_items: the catalogue size n.
    """

    items: torch.Tensor
    row_of: torch.Tensor
    counts: torch.Tensor
    n_items: int

    @property
    def rows(self) -> int:
        """B, the number of rows."""
        return int(self.counts.shape[0])

    @property
    def device(self) -> torch.device:
        return self.items.device

    @property
    def total(self) -> int:
        """T, the excluded items of all rows together."""
        return int(self.items.shape[0])

    @cached_property
    def starts(self) -> torch.Tensor:
        """(B,) int64, the flat offset of each row's first entry."""
        return torch.cumsum(self.counts, 0) - self.counts

    @cached_property
    def keys(self) -> torch.Tensor:
        """(T,) int64 sorted ``row * (n + 1) + item``: every row's items in one searchable array."""
        return self.row_of * (self.n_items + 1) + self.items

    @cached_property
    def gap_keys(self) -> torch.Tensor:
        """(T,) int64 sorted ``row * (n + 1) + g``, g = item - (its place in the row) = the allowed items below it."""
        place = torch.arange(self.total, device=self.device) - self.starts[self.row_of]
        return self.row_of * (self.n_items + 1) + (self.items - place)

    def _base(self, rows: int) -> torch.Tensor:
        return (torch.arange(rows, device=self.device) * (self.n_items + 1)).unsqueeze(1)

    def contains(self, values: torch.Tensor) -> torch.Tensor:
        """(B, K) bool: whether each of ``values`` (B, K) int64 (items in 0..n - 1; others: False) is excluded in
        its row. O(B K log T)."""
        if self.total == 0 or values.numel() == 0:
            return torch.zeros(values.shape, dtype=torch.bool, device=values.device)
        inside = (values >= 0) & (values < self.n_items)
        q = (self._base(values.shape[0]) + values.clamp(0, self.n_items - 1)).contiguous()
        at = torch.searchsorted(self.keys, q).clamp(max=self.total - 1)
        return (self.keys[at] == q) & inside

    def count_below(self, values: torch.Tensor, right: bool = False) -> torch.Tensor:
        """(B, K) int64: excluded items of each row below (``right``: at or below) each of ``values`` (B, K),
        values in 0..n - 1."""
        if self.total == 0:
            return torch.zeros(values.shape, dtype=torch.int64, device=values.device)
        q = (self._base(values.shape[0]) + values).contiguous()
        return torch.searchsorted(self.keys, q, right=right) - self.starts.unsqueeze(1)

    def allowed_item(self, positions: torch.Tensor, positives: torch.Tensor) -> torch.Tensor:
        """The item at each allowed position: ``positions`` (B, ...) int64 0-based among the row's items that are
        neither excluded nor among ``positives`` ((B, P) validated, -1 padding, disjoint from the exclusions),
        each < the row's allowed count. Two sorted skips: the positives' places among the non-excluded items (P
        per row, sorted), then the exclusions (:attr:`gap_keys`): O(B P log P + K log T) for K positions, no
        (B, P + E) forbidden list. Equal to :func:`~reco_sampled_plugin.ranking.allowed_position_to_item` on the
        sorted union, item for item."""
        b = positions.shape[0]
        n = self.n_items
        flat = positions.reshape(b, math.prod(positions.shape[1:]))  # not -1: b may be 0
        if positives.shape[1]:
            inside = self.count_below(positives.clamp(min=0))
            places = torch.where(positives >= 0, positives - inside, torch.full_like(positives, n))
            flat = skip_sorted(flat, sort_rows(places), n)
        if self.total:
            q = (self._base(b) + flat).contiguous()
            flat = flat + (torch.searchsorted(self.gap_keys, q, right=True) - self.starts.unsqueeze(1))
        return flat.reshape(positions.shape)

    def select(self, idx: torch.Tensor) -> "Exclusions":
        """The rows ``idx`` (K,) int64 (in that order), nothing re-validated or re-sorted: O(K + their items)."""
        idx = idx.to(device=self.device, dtype=torch.int64)
        counts = self.counts[idx]
        t = int(counts.sum()) if counts.numel() else 0  # one read back: the output size
        k = idx.shape[0]
        row_of = torch.repeat_interleave(torch.arange(k, device=self.device), counts, output_size=t)
        starts = torch.cumsum(counts, 0) - counts
        src = self.starts[idx][row_of] + (torch.arange(t, device=self.device) - starts[row_of])
        return Exclusions(self.items[src], row_of, counts, self.n_items)

    def padded(self) -> torch.Tensor:
        """(B, E) int64, each row's items ascending, padded with -1 (E the longest list): the padded form."""
        width = int(self.counts.max()) if self.rows else 0
        out = torch.full((self.rows, width + 1), -1, dtype=torch.int64, device=self.device)
        place = torch.arange(self.total, device=self.device) - self.starts[self.row_of]
        out.view(-1).scatter_(0, self.row_of * (width + 1) + place, self.items)
        return out[:, :width]

    def padded_block(self, first_row: int, rows: int, width: int, fill: int) -> torch.Tensor:
        """(rows, width) int64: the items of rows ``first_row``..``first_row + rows - 1``, ascending, padded with
        ``fill`` (``width``: at least the longest of those rows, known to the caller, so nothing is read back). One
        scatter over the T entries."""
        out = torch.full((rows * width + 1,), fill, dtype=torch.int64, device=self.device)  # last: a sink
        inside = (self.row_of >= first_row) & (self.row_of < first_row + rows)
        place = torch.arange(self.total, device=self.device) - self.starts[self.row_of]
        at = torch.where(inside, (self.row_of - first_row) * width + place, torch.full_like(place, rows * width))
        out.scatter_(0, at, torch.where(inside, self.items, torch.full_like(self.items, fill)))
        return out[: rows * width].view(rows, width)

    def row_sums(self, values: torch.Tensor) -> torch.Tensor:
        """(B,) per-row sums of ``values`` (T,) given per entry (e.g. weighted flags of the excluded items)."""
        out = torch.zeros(self.rows, dtype=values.dtype, device=self.device)
        return out.index_add_(0, self.row_of, values)


def skip_sorted(positions: torch.Tensor, forb_sorted: torch.Tensor, pad: int) -> torch.Tensor:
    """(B, K) positions -> values, skipping each row's sorted values ``forb_sorted`` (B, Q) (entries >= ``pad``:
    padding): the u-th value not among them."""
    q = forb_sorted.shape[1]
    if q == 0:
        return positions
    g = forb_sorted - torch.arange(q, device=forb_sorted.device)
    g = torch.where(forb_sorted < pad, g, torch.full_like(g, torch.iinfo(torch.int64).max))
    return positions + torch.searchsorted(g.contiguous(), positions.contiguous(), right=True)


def csr_from_padded(x: torch.Tensor, valid: torch.Tensor, total: int, n_items: int, sort: bool) -> tuple[Exclusions, torch.Tensor | None]:
    """CSR from a (B, E) int64 tensor padded with -1 (``valid``: its entries >= 0, ``total`` of them; range not
    checked here); ``sort``: rows may be unsorted (one flat sort of the T entries, not of B x E). Returns the object
    and, when sorted here, the (T - 1,) flags of an entry equal to the previous one (a duplicate in its row)."""
    b, e = x.shape
    flat = nonzero_sized(valid.reshape(-1), total).squeeze(1)  # row-major; the size known: no read back
    rows = torch.div(flat, max(e, 1), rounding_mode="floor")
    items = x.reshape(-1)[flat]
    counts = torch.zeros(b, dtype=torch.int64, device=x.device).index_add_(0, rows, torch.ones_like(rows))
    dup = None
    if sort and total:
        keys = rows * (n_items + 1) + items
        if b * (n_items + 1) < 2**31:  # int32 keys sort faster (about 1.6x on a CPU)
            keys = sort_rows(keys.to(torch.int32)).to(torch.int64)
        else:
            keys = sort_rows(keys)  # rows keep their place: sorting moves within rows
        items = keys - rows * (n_items + 1)
        dup = keys[1:] == keys[:-1]
    return Exclusions(items, rows, counts, n_items), dup


def _from_padded(x: torch.Tensor, n_items: int, sort: bool) -> tuple[Exclusions, torch.Tensor | None]:
    valid = x >= 0
    return csr_from_padded(x, valid, int(torch.count_nonzero(valid)), n_items, sort)


class PendingExclusions(NamedTuple):
    """Index exclusions between their first checks and their CSR form: ``total`` (0-d, T) is read back with the
    first checks (:func:`~reco_sampled_plugin._inputs.run_checks`), then :meth:`finish` builds the CSR without a
    read back of its own and returns the duplicate check, to be read with the next checks."""

    x: torch.Tensor
    valid: torch.Tensor
    total: torch.Tensor
    n_items: int

    def finish(self, total: int) -> tuple[Exclusions, list[Check]]:
        ex, dup = csr_from_padded(self.x, self.valid, total, self.n_items, sort=True)
        checks: list[Check] = []
        if dup is not None and dup.numel():
            def bad_dup() -> None:
                rows = torch.unique(ex.row_of[1:][dup])
                raise ValueError(f"exclude: {rows.numel()} row(s) list the same item twice")

            checks.append(Check(dup.any(), bad_dup))
        return ex, checks


def pending_exclusions(exclude: Any, n_items: int, batch: int, device: torch.device) \
        -> tuple[Exclusions | PendingExclusions | torch.Tensor, list[Check]]:
    """``exclude`` checked in two steps, for callers that read every check of a call back together: a prepared
    :class:`Exclusions` (checked against B, n and the device) comes back as it is, a (B, n) bool mask as it is
    (the caller converts masks, :func:`~reco_sampled_plugin._inputs.sparse_masks`), an index form (tensor, list,
    array, (B,)) as :class:`PendingExclusions` with its range check deferred (then its duplicates:
    :meth:`PendingExclusions.finish`). Shape and type errors are raised now, named ``exclude``."""
    if isinstance(exclude, Exclusions):
        return check_prepared(exclude, n_items, batch, device), []
    x, is_mask, checks = pending_index(exclude, n_items, batch, "exclude", device, duplicates=False)
    if is_mask:
        return x, checks
    valid = x >= 0
    return PendingExclusions(x, valid, torch.count_nonzero(valid), n_items), checks


def check_prepared(ex: Exclusions, n_items: int, batch: int, device: torch.device) -> Exclusions:
    """A prepared :class:`Exclusions` for ``batch`` rows over ``n_items`` items on ``device``, else a ValueError
    naming ``exclude``."""
    if ex.n_items != n_items or ex.rows != batch:
        raise ValueError(f"exclude: prepared for {ex.rows} rows over {ex.n_items} items, but the call has {batch} "
                         f"rows over {n_items} items")
    if ex.device != torch.device(device):
        raise ValueError(f"exclude: prepared on {ex.device}, but the call's tensors are on {torch.device(device)}")
    return ex


def as_exclusions(exc: torch.Tensor | Exclusions | None, n_items: int, batch: int, sort: bool = True) -> Exclusions | None:
    """Validated padded (B, E) exclusions (or None, or an :class:`Exclusions`) as :class:`Exclusions`, trusted:
    rows sorted here (one flat sort of the T entries) unless ``sort`` is False (rows sorted already)."""
    if exc is None or isinstance(exc, Exclusions):
        return exc
    if exc.shape[0] != batch:
        raise ValueError(f"exclude: expected {batch} rows, got {exc.shape[0]}")
    return _from_padded(exc, n_items, sort=sort)[0]


def prepare_exclusions(exclude: TensorLike, n_items: int) -> Exclusions:
    """Validate and prepare exclusions once, for every later call on the same rows.

    Args:
        exclude: (B, n_items) bool mask, (B, E) int64 item indices padded with -1, or (B,): the items each row
            never draws nor ranks (training items); tensors keep their device.
        n_items: n, the catalogue size (items 0..n - 1).

    Returns:
        :class:`Exclusions` (CSR, rows sorted, memory O(B + T) for T items in all), accepted as ``exclude`` by
        :func:`~reco_sampled_plugin.ranking.sampled_ranks`, :func:`~reco_sampled_plugin.adaptive.adaptive_sampled_ranks`,
        :func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer` and every other entry point that takes
        ``exclude`` for the same B rows and n items.

    Raises:
        ValueError naming ``exclude`` (wrong type or shape, items outside 0..n - 1, an item listed twice in a row)
        or ``n_items``.
    """
    from ._checks import check_size, real_tensor

    n = check_size(n_items, "n_items", 1)
    if isinstance(exclude, Exclusions):
        return check_prepared(exclude, n, exclude.rows, exclude.device)
    t = real_tensor(exclude, "exclude", "a boolean mask or integer item indices", booleans=True)
    batch = t.shape[0] if t.dim() else 1
    pending, checks = pending_exclusions(t, n, batch, t.device)
    if isinstance(pending, torch.Tensor):  # a mask: its rows are sorted already
        return _from_padded(mask_to_padded(pending), n, sort=False)[0]
    assert isinstance(pending, PendingExclusions)  # a tensor in: index exclusions between their checks
    total = run_checks(checks, [pending.total])[0]
    ex, later = pending.finish(total)
    run_checks(later)
    return ex
