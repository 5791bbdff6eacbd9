"""Train/test splits of sparse implicit-feedback data: recometrics' ``split_reco_train_test`` and leave-last-out.

:func:`split_train_test` follows recometrics' semantics (its C++ ``split_data_*`` routines), vectorised:

* per split user with e stored items, t = round(e * items_test_fraction) items (halves away from zero) go to test,
  chosen uniformly at random; the rest stay in train (so a user never has an item in both);
* ``"all"``: every user is split; returns ``(X_train, X_test)`` with X's shape;
* ``"separated"``: test users are drawn at random among the eligible ones, up to
  n_take = min(round(n_users * users_test_fraction), max_test_users) (at least 1; ``users_test_fraction=None``
  takes ``max_test_users``); returns ``(X_train, X_test, X_rem, users_test)`` with the test users' rows in sorted
  user order and X_rem the other users' rows, in order;
* ``"joined"``: as separated but returns ``(X_train, X_test, users_test)`` with X_train = the test users' train rows
  stacked on X_rem.

A user is eligible for test (separated, joined) when e > 0, t >= ``min_pos_test``, the items left to rank
n_items - (e - t) >= ``min_items_pool``, e + 1 < n_items, and t < e unless ``consider_cold_start``.
Random streams differ from recometrics' (its mt19937 and std::shuffle): the rules are the same, the draws are not.
The return order is the one recometrics documents; its Python package 0.1.6 actually returns
``(X_rem, X_train, X_test, users_test)`` for ``"separated"``.
Everything is reproducible from ``seed`` (numpy's PCG64).

:func:`leave_last_out_split` holds out each user's latest interaction by timestamp (the split of the sampled-metric
papers), wrapping :func:`reco_sampled_plugin.datasets.leave_last_out`.
"""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Any

import numpy as np
import scipy.sparse as sp

from ._checks import check_int, check_real_array
from ._options import check_bool, check_fraction
from ._sparse import canonicalise, csr_copy

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = ["split_train_test", "leave_last_out_split", "SPLIT_TYPES"]

SPLIT_TYPES = ("separated", "all", "joined")


def _as_csr(X: Any, name: str = "X") -> tuple[sp.csr_matrix, bool]:
    """Canonical CSR copy (sorted, summed duplicates, no explicit zeros, float32/float64 values)."""
    was_array = isinstance(X, sp.sparray)
    m = csr_copy(X, name)
    if m.ndim != 2:
        raise ValueError(f"{name}: expected a 2-D matrix")
    if m.dtype not in (np.float32, np.float64):
        m = m.astype(np.float64)
    return canonicalise(m), was_array


def _round_half_away(x: np.ndarray) -> np.ndarray:
    return np.floor(np.asarray(x, dtype=np.float64) + 0.5).astype(np.int64)


def _check_fraction(value: float, name: str) -> float:
    """A fraction strictly inside (0, 1) (:func:`~reco_sampled_plugin._options.check_fraction`: no str, no bool)."""
    v = check_fraction(value, name)
    if not 0.0 < v < 1.0:
        raise ValueError(f"{name}: must lie strictly between 0 and 1, got {value!r}")
    return v


def _pick_test_items(indptr: np.ndarray, n_test: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Boolean mask over the stored entries: True for the n_test[u] entries of row u drawn uniformly."""
    counts = np.diff(indptr)
    row = np.repeat(np.arange(len(counts)), counts)
    order = np.lexsort((rng.random(row.size), row))  # random order within each row
    pos_in_row = np.empty(row.size, dtype=np.int64)
    pos_in_row[order] = np.arange(row.size) - indptr[row[order]]
    return pos_in_row < n_test[row]


def _split_rows(m: sp.csr_matrix, fraction: float, rng: np.random.Generator) -> tuple[sp.csr_matrix, sp.csr_matrix]:
    counts = np.diff(m.indptr)
    n_test = _round_half_away(counts * fraction)
    is_test = _pick_test_items(m.indptr, n_test, rng)
    coo = m.tocoo()
    tr = sp.csr_matrix((coo.data[~is_test], (coo.row[~is_test], coo.col[~is_test])), shape=m.shape, dtype=m.dtype)
    te = sp.csr_matrix((coo.data[is_test], (coo.row[is_test], coo.col[is_test])), shape=m.shape, dtype=m.dtype)
    for x in (tr, te):
        x.sort_indices()
    return tr, te


def _out(x: sp.csr_matrix, as_array: bool) -> Any:
    return sp.csr_array(x) if as_array else x


def split_train_test(
    X: Any,
    split_type: str = "separated",
    users_test_fraction: float | None = 0.1,
    max_test_users: int | None = 10000,
    items_test_fraction: float = 0.3,
    min_items_pool: int = 2,
    min_pos_test: int = 1,
    consider_cold_start: bool = False,
    seed: int = 1,
) -> tuple[Any, ...]:
    """Split interactions into train and test like recometrics' ``split_reco_train_test`` (module doc).

    Args:
        X: (users x items) interactions: scipy sparse (any format), torch sparse, or dense. Values are kept.
        split_type: ``"separated"``, ``"all"`` or ``"joined"``.
        users_test_fraction: fraction of users to draw as test users (not for ``"all"``); None: ``max_test_users``.
        max_test_users: at most this many test users (None or 0: no limit).
        items_test_fraction: fraction of each test user's items held out, in (0, 1).
        min_items_pool, min_pos_test, consider_cold_start: eligibility of test users (module doc).
        seed: seed of the random draws (same seed, same split).

    Returns:
        ``(X_train, X_test)`` for ``"all"``; ``(X_train, X_test, X_rem, users_test)`` for ``"separated"``;
        ``(X_train, X_test, users_test)`` for ``"joined"``. CSR matrices (``csr_array`` for a ``sparray`` input),
        ``users_test`` an int64 array of row indices of X in ascending order.

    Raises:
        ValueError: naming the argument, for bad options, an empty X, or no eligible test user.
    """
    if not isinstance(split_type, str) or split_type not in SPLIT_TYPES:
        raise ValueError(f"split_type: expected one of {SPLIT_TYPES}, got {split_type!r}")
    consider_cold_start = check_bool(consider_cold_start, "consider_cold_start")
    if max_test_users is not None:
        max_test_users = check_int(max_test_users, "max_test_users", 0)
    if users_test_fraction is not None:
        users_test_fraction = _check_fraction(users_test_fraction, "users_test_fraction")
    items_test_fraction = _check_fraction(items_test_fraction, "items_test_fraction")
    min_items_pool = check_int(min_items_pool, "min_items_pool", 0)
    min_pos_test = check_int(min_pos_test, "min_pos_test", 0)
    seed = check_int(seed, "seed", 0)
    m, as_array = _as_csr(X)
    n_users, n_items = m.shape
    if n_users == 0 or n_items == 0 or m.nnz == 0:
        raise ValueError(f"X: no interactions to split (shape {m.shape}, {m.nnz} stored values)")
    if min_pos_test >= n_items:
        raise ValueError(f"min_pos_test: must be smaller than the number of items ({n_items}), got {min_pos_test}")
    if min_items_pool >= n_items:
        raise ValueError(f"min_items_pool: must be smaller than the number of items ({n_items}), got {min_items_pool}")
    rng = np.random.default_rng(seed)
    if split_type == "all":
        tr, te = _split_rows(m, items_test_fraction, rng)
        return _out(tr, as_array), _out(te, as_array)

    if n_users < 2:
        raise ValueError(f"X: needs at least 2 users (rows) for split_type={split_type!r}")
    if max_test_users is None or max_test_users == 0:
        max_test_users = n_users
    max_test_users = check_int(max_test_users, "max_test_users", 1)
    if users_test_fraction is not None:
        frac = _check_fraction(users_test_fraction, "users_test_fraction")
        target = n_users * frac
        if target < 1:
            warnings.warn("users_test_fraction: implies fewer than 1 test user; taking 1", stacklevel=2)
            target = 1
        n_take = min(int(round(target)), max_test_users)
    else:
        n_take = min(max_test_users, n_users)

    counts = np.diff(m.indptr)
    n_test = _round_half_away(counts * items_test_fraction)
    eligible = (
        (counts > 0)
        & (n_test >= min_pos_test)
        & (n_items - (counts - n_test) >= min_items_pool)
        & (counts + 1 < n_items)
    )
    if not consider_cold_start:
        eligible &= n_test < counts
    order = rng.permutation(n_users)
    chosen = order[eligible[order]][:n_take]
    if chosen.size == 0:
        raise ValueError("X: no user satisfies the criteria for test inclusion (min_pos_test, min_items_pool, "
                         "consider_cold_start)")
    users_test = np.sort(chosen).astype(np.int64)
    rest = np.setdiff1d(np.arange(n_users), users_test, assume_unique=True)
    tr, te = _split_rows(m[users_test], items_test_fraction, rng)
    rem = m[rest]
    rem.sort_indices()
    if split_type == "separated":
        return _out(tr, as_array), _out(te, as_array), _out(rem, as_array), users_test
    joined = sp.vstack([tr, rem], format="csr", dtype=m.dtype)
    return _out(joined, as_array), _out(te, as_array), users_test


_TIMES = "real numbers (e.g. seconds since the epoch)"
def _entries(mat: sp.csr_matrix, rows: np.ndarray, cols: np.ndarray) -> np.ndarray:
    """The values mat[rows[i], cols[i]] as a 1-D array (empty, of mat's dtype, when no entry is asked: scipy's
    fancy indexing returns a 1 x 0 matrix there, which numpy then cannot read)."""
    if len(rows) == 0:
        return np.zeros(0, dtype=mat.dtype)
    return np.asarray(mat[rows, cols]).reshape(-1)


def leave_last_out_split(X: Any, timestamps: Any) -> tuple[Any, Any]:
    """Hold out each user's latest interaction (by timestamp) as test; train on the rest.

    Args:
        X: (users x items) interactions (scipy sparse, torch sparse or dense); values are kept in both parts.
        timestamps: when each interaction happened: a sparse matrix with X's sparsity pattern, a dense
            (users x items) array read at X's stored entries, or a 1-D array aligned with X's stored entries
            in canonical CSR order (row by row, columns ascending).

    Returns:
        ``(X_train, X_test)``, CSR matrices of X's shape; X_test has one item per user with at least two items
        (ties in time go to the larger column index), none for the others. Wraps
        :func:`reco_sampled_plugin.datasets.leave_last_out`.
    """
    from .datasets import Interactions, leave_last_out

    m, as_array = _as_csr(X)
    coo = m.tocoo()  # canonical CSR -> COO keeps row-major, column-sorted order
    if sp.issparse(timestamps):
        if timestamps.dtype.kind not in "iuf":
            raise ValueError(f"timestamps: expected real numbers, got dtype {timestamps.dtype}")
        ts_m = sp.csr_matrix(timestamps)
        if ts_m.shape != m.shape:
            raise ValueError(f"timestamps: shape {ts_m.shape} differs from X's {m.shape}")
        stored = ts_m.copy()
        stored.data = np.ones_like(stored.data)  # explicit zeros are times: the pattern, not the values
        missing = np.flatnonzero(_entries(stored, coo.row, coo.col) == 0)
        if missing.size:  # read as time 0 before: the earliest, never the held-out one
            raise ValueError(f"timestamps: {missing.size:,} of X's stored entries have no entry in the sparse "
                             f"timestamps (first: user {int(coo.row[missing[0]])}, item {int(coo.col[missing[0]])}); "
                             "give X's sparsity pattern (an explicit 0 is a time) or a dense array")
        ts = check_real_array(_entries(ts_m, coo.row, coo.col), "timestamps", _TIMES)
    else:
        arr = check_real_array(timestamps, "timestamps", _TIMES)
        if arr.ndim == 2:
            if arr.shape != m.shape:
                raise ValueError(f"timestamps: shape {arr.shape} differs from X's {m.shape}")
            ts = arr[coo.row, coo.col]
        elif arr.ndim == 1 and arr.size == m.nnz:
            ts = arr
        else:
            raise ValueError(f"timestamps: expected X's shape or one value per stored entry ({m.nnz}), "
                             f"got shape {arr.shape}")
    if not np.isfinite(ts).all():
        raise ValueError("timestamps: must be finite")
    inter = Interactions(
        user=coo.row.astype(np.int64),
        item=coo.col.astype(np.int64),
        rating=coo.data.astype(np.float64),
        timestamp=ts,
        user_ids=np.arange(m.shape[0]).astype(str),
        item_ids=np.arange(m.shape[1]).astype(str),
    )
    split = leave_last_out(inter)
    pattern = split.train.tocsr()
    train = m.multiply(pattern != 0).tocsr().astype(m.dtype)
    users = np.asarray(split.test_users, dtype=np.int64)
    items = np.asarray(split.test_items, dtype=np.int64)[users]
    test = sp.csr_matrix((_entries(m, users, items), (users, items)), shape=m.shape, dtype=m.dtype)
    for x in (train, test):
        x.sort_indices()
    return _out(train, as_array), _out(test, as_array)
