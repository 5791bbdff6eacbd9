"""Input validation shared by the core: every error is a ValueError (or TypeError) naming the argument."""

from __future__ import annotations

import torch

__all__ = [
    "as_tensor",
    "check_same_device",
    "check_int",
    "check_ranks_in_range",
]


def as_tensor(x, name: str, dtype: torch.dtype | None = None, device: torch.device | None = None) -> torch.Tensor:
    """Convert ``x`` (tensor, array, list or scalar) to a tensor, keeping tensors on their device."""
    if isinstance(x, torch.Tensor):
        t = x
    else:
        try:
            t = torch.as_tensor(x)
        except Exception as exc:  # pragma: no cover - message only
            raise TypeError(f"{name}: cannot convert {type(x).__name__} to a tensor ({exc})") from None
    if device is not None and t.device != device:
        t = t.to(device)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise a ValueError when the given tensors live on different devices."""
    devices = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"tensors are on different devices: {listing}; move them to one device")


def check_int(value, name: str, minimum: int | None = None) -> int:
    """Return ``value`` as an int, raising a ValueError naming ``name`` if it is not an integer >= minimum."""
    if isinstance(value, bool) or not isinstance(value, (int,)) and not (
        isinstance(value, torch.Tensor) and value.numel() == 1 and not value.is_floating_point()
    ):
        try:
            import numpy as np

            if isinstance(value, np.integer):
                value = int(value)
            else:
                raise TypeError
        except TypeError:
            raise ValueError(f"{name}: expected an integer, got {value!r}") from None
    value = int(value)
    if minimum is not None and value < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {value}")
    return value


def check_ranks_in_range(ranks: torch.Tensor, upper: torch.Tensor | int, name: str = "ranks") -> None:
    """Raise unless every rank lies in 1..upper (upper broadcast against ranks)."""
    if ranks.numel() == 0:
        return
    if ranks.is_floating_point() and not torch.isfinite(ranks).all():
        raise ValueError(f"{name}: contains NaN or inf")
    low = ranks < 1
    high = ranks > upper
    bad = low | high
    if bool(bad.any()):
        n_bad = int(bad.sum())
        example = ranks[bad].flatten()[0].item()
        raise ValueError(
            f"{name}: {n_bad} value(s) outside 1..n (1-based ranks, n = number of candidates), e.g. {example}"
        )
