"""Normalise the ways users pass positives and exclusions: boolean masks or padded index tensors."""

from __future__ import annotations

import torch

from ._checks import check_same_device

__all__ = ["as_padded_index", "check_finite_rows", "check_scores", "finite_rows", "mask_to_padded"]


def mask_to_padded(mask: torch.Tensor) -> torch.Tensor:
    """(B, n) boolean mask -> (B, P) int64 item indices in ascending order, padded with -1."""
    b = mask.shape[0]
    counts = mask.sum(1)
    width = int(counts.max()) if b else 0
    out = torch.full((b, width), -1, dtype=torch.int64, device=mask.device)
    if width == 0:
        return out
    rows, cols = mask.nonzero(as_tuple=True)
    starts = torch.cumsum(counts, 0) - counts
    slot = torch.arange(rows.numel(), device=mask.device) - starts[rows]
    out[rows, slot] = cols
    return out


def as_padded_index(x, n_items: int, batch: int, name: str, device: torch.device) -> torch.Tensor:
    """Positives or exclusions as a (B, P) int64 index tensor padded with -1.

    Accepts a (B, n) boolean mask, a (B, P) integer tensor padded with -1, or a (B,) integer tensor
    (one item per row). Raises a ValueError naming ``name`` on wrong shape, dtype, range or duplicates.
    """
    if not isinstance(x, torch.Tensor):
        x = torch.as_tensor(x)
    check_same_device(scores=torch.empty(0, device=device), **{name: x})
    if x.dtype == torch.bool:
        if x.shape != (batch, n_items):
            raise ValueError(f"{name}: a boolean mask must have the scores' shape {(batch, n_items)}, got {tuple(x.shape)}")
        return mask_to_padded(x)
    if x.is_floating_point() or x.is_complex():
        raise ValueError(f"{name}: expected a boolean mask or an integer index tensor, got dtype {x.dtype}")
    if x.dim() == 1:
        x = x.unsqueeze(1)
    if x.dim() != 2 or x.shape[0] != batch:
        raise ValueError(f"{name}: expected shape ({batch}, P) (padded with -1) or ({batch},), got {tuple(x.shape)}")
    x = x.to(torch.int64)
    if x.numel():
        if bool((x < -1).any()) or bool((x >= n_items).any()):
            raise ValueError(f"{name}: item indices must lie in 0..{n_items - 1} (or -1 for padding)")
        if x.shape[1] > 1:
            srt = torch.sort(x, dim=1).values
            dup = (srt[:, 1:] == srt[:, :-1]) & (srt[:, 1:] >= 0)
            if bool(dup.any()):
                raise ValueError(f"{name}: {int(dup.any(1).sum())} row(s) list the same item twice")
    return x


def check_scores(scores, check_finite: bool = True) -> torch.Tensor:
    """Validate a (B, n) floating score matrix."""
    if not isinstance(scores, torch.Tensor):
        scores = torch.as_tensor(scores)
    if scores.dim() != 2:
        raise ValueError(f"scores: expected a (users x items) matrix, got shape {tuple(scores.shape)}")
    if not scores.is_floating_point():
        raise ValueError(f"scores: expected a floating dtype, got {scores.dtype}")
    if check_finite:
        check_finite_rows(finite_rows(scores))
    return scores


def finite_rows(scores: torch.Tensor) -> torch.Tensor:
    """(B,) bool: rows of a (B, n) score matrix without NaN or inf. Min and max of the whole matrix are
    finite iff every score is (both propagate NaN): one vectorised pass (aminmax: 8.7 ms for 1e8 float32,
    vs 13 ms for row sums and 345 ms for isfinite().all()); only when it fails are rows checked one by one."""
    if scores.numel():
        lo, hi = torch.aminmax(scores)
        if not bool(torch.isfinite(lo) & torch.isfinite(hi)):
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
