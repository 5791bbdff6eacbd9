"""The one normaliser of users x items matrices to scipy CSR (``factors``, ``splits``, ``baselines``): a copy
(never the caller's arrays) from a torch tensor (any layout), scipy sparse (any format) or a dense array, and
its canonical form (sorted indices, summed duplicates, no explicit zeros). Each caller keeps its own checks and
post-processing (value dtype, binarising)."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

__all__ = ["csr_copy", "canonicalise"]


def csr_copy(x: Any, name: str, torch_dtype: torch.dtype | None = None) -> sp.csr_matrix:
    """``x`` as a new scipy CSR matrix (not canonical yet: see :func:`canonicalise`).

    Torch tensors (a strided one must be 2-D) go through their coalesced COO form on the CPU, values cast to
    ``torch_dtype`` when given; scipy sparse matrices are copied (their dimensions are the caller's to check);
    anything else goes through ``np.asarray`` and must be 2-D.
    """
    complex_in = x.is_complex() if isinstance(x, torch.Tensor) else getattr(getattr(x, "dtype", None), "kind", "") == "c"
    if complex_in:  # astype(float) downstream would drop the imaginary part without a word
        raise ValueError(f"{name}: complex values are not interactions; give real values (e.g. x.real) explicitly")
    if isinstance(x, torch.Tensor):
        t = x.detach()
        if t.layout == torch.strided and t.dim() != 2:
            raise ValueError(f"{name}: expected a (users x items) matrix, got shape {tuple(t.shape)}")
        t = t.to_sparse_coo().coalesce().cpu()
        rows, cols = t.indices().numpy()
        vals = t.values() if torch_dtype is None else t.values().to(torch_dtype)
        return sp.csr_matrix((vals.numpy(), (rows, cols)), shape=(int(t.shape[0]), int(t.shape[1])))
    if sp.issparse(x):
        return sp.csr_matrix(x, copy=True)
    arr = np.asarray(x)
    if arr.dtype.kind == "c":
        raise ValueError(f"{name}: complex values are not interactions; give real values (e.g. x.real) explicitly")
    if arr.ndim != 2:
        raise ValueError(f"{name}: expected a (users x items) matrix, got shape {arr.shape}")
    return sp.csr_matrix(arr)


def canonicalise(m: sp.csr_matrix) -> sp.csr_matrix:
    """In place: duplicates summed (indices sorted), explicit zeros dropped; returns ``m``."""
    m.sum_duplicates()
    m.eliminate_zeros()
    return m
