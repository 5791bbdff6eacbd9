"""The keyed uniform numbers of every keyed draw: a counter-based hash of (seed, *parts) to float64 in [0, 1).

A primitive below the draws (``_keyed``'s negatives, the exact share's choice in ``_share``): it imports only the
32-bit mixer of ``counting``.
"""

from __future__ import annotations

import math
from typing import TypeVar

import torch

from .counting import mix32

__all__ = ["keyed_uniform"]

_M32 = 0xFFFFFFFF
_GOLDEN = 0x9E3779B9


# ------------------------------------------------------------------------------------------ the hash
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
