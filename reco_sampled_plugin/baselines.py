"""The recommenders of Krichene & Rendle (KDD 2020), section 9, plus popularity: fit on a CSR matrix, score all items.

Every recommender has ``fit(train)`` (scipy sparse users x items; any non-zero entry is an observed pair, the set H
of the paper) and ``score(users) -> torch.Tensor`` (B x n_items, float32, on ``device``; higher is better). Training
items are *not* masked in the scores: exclude them when ranking. Everything is vectorised (sparse products, batched
solves); there are no Python loops over users or items.

- :class:`Popularity`: score = number of training users of the item.
- :class:`ItemKNN`: item-based collaborative filtering, eqs. 27-30 (recommenders Y: q = 3; Z: q = 1, k' = 10).
- :class:`ImplicitALS`: matrix factorisation with the loss of section 9 (recommender X: d = 16, lambda = 10,
  alpha = 0.2), solved by alternating least squares in float64.
- :class:`EASE`: Steck's shallow autoencoder (WWW 2019), the closed form B = I - P diagMat(1 / diag(P)) with
  P = (X^T X + lambda I)^-1: a dense item-item model of a different shape from the kNNs and the factors.
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from ._checks import check_device, check_int, real_tensor
from ._options import (ArgumentTypeError, NotFittedError, check_bool, check_nonnegative_float, check_optional,
                       check_positive_float,
                       check_seed)
from ._sparse import canonicalise, csr_copy
from ._types import TensorLike

__all__ = ["Recommender", "Popularity", "ItemKNN", "ImplicitALS", "EASE", "train_all", "train_benchmark", "held_out_ranks"]


def _as_binary_csr(train: Any) -> sp.csr_matrix:
    """Users x items CSR with value 1 at every stored non-zero (duplicates collapsed)."""
    if isinstance(train, torch.Tensor):
        raise ArgumentTypeError("train: pass a scipy sparse matrix (users x items), not a torch tensor")
    if not sp.issparse(train):
        raise ArgumentTypeError(f"train: expected a scipy sparse matrix (users x items), got {type(train).__name__}")
    if train.ndim != 2:
        raise ValueError(f"train: expected a 2-D matrix, got shape {train.shape}")
    x = canonicalise(csr_copy(train, "train"))
    if x.data.dtype.kind not in "biuf" or not np.isfinite(x.data).all():  # NaN != 0 would become an interaction
        raise ValueError("train: stored values must be finite real numbers (NaN or inf is not an interaction)")
    x.data = np.ones_like(x.data, dtype=np.float64)
    x.sort_indices()
    return x


def _torch_csr(x: sp.csr_matrix, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """scipy CSR -> torch sparse CSR on ``device`` (indices are valid by construction)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta state")
        t = torch.sparse_csr_tensor(
            torch.from_numpy(x.indptr.astype(np.int64)),
            torch.from_numpy(x.indices.astype(np.int64)),
            torch.from_numpy(x.data.astype(np.float64)).to(dtype),
            size=x.shape,
            check_invariants=False,
        )
    return t.to(device)


def _row_chunks(x: sp.csr_matrix, rows_per_chunk: int, dtype: torch.dtype, device: torch.device) -> list[torch.Tensor]:
    """``x`` cut into torch CSR blocks of at most ``rows_per_chunk`` rows (bounds the memory of the ALS solve)."""
    return [
        _torch_csr(x[start : start + rows_per_chunk], dtype, device)
        for start in range(0, max(x.shape[0], 1), rows_per_chunk)
    ]


class Recommender:
    """Base class: ``fit(train)`` then ``score(users)``."""

    name = "recommender"

    def __init__(self, device: str | torch.device | None = None) -> None:
        self.device = check_device(device) or torch.device("cpu")
        self.n_users: int | None = None
        self.n_items: int | None = None

    def fit(self, train: Any) -> "Recommender":  # pragma: no cover - abstract
        raise NotImplementedError

    def _users(self, users: TensorLike) -> torch.Tensor:
        if self.n_users is None:
            raise NotFittedError(f"{type(self).__name__}: call fit(train) before score(users)")
        u = real_tensor(users, "users", "integer user indices").reshape(-1)
        if u.is_floating_point() or u.dtype == torch.bool:
            raise ValueError(f"users: expected integer user indices, got dtype {u.dtype}")
        u = u.to(torch.int64)
        if u.numel() and (int(u.min()) < 0 or int(u.max()) >= self.n_users):
            raise ValueError(f"users: indices must lie in 0..{self.n_users - 1}")
        return u

    def score(self, users: TensorLike) -> torch.Tensor:  # pragma: no cover - abstract
        """Scores (B x n_items, float32, on ``self.device``) of the 0-based user indices ``users`` (any int array)."""
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class Popularity(Recommender):
    """Non-personalised: every user gets the item's number of training users as score."""

    name = "Popularity"

    def fit(self, train: Any) -> "Popularity":
        x = _as_binary_csr(train)
        self.n_users, self.n_items = x.shape
        counts = np.asarray(x.sum(axis=0), dtype=np.float64).reshape(-1)
        self.counts = torch.from_numpy(counts).to(torch.float32).to(self.device)
        return self

    def score(self, users: TensorLike) -> torch.Tensor:
        u = self._users(users)
        return self.counts.unsqueeze(0).expand(u.numel(), -1).clone()


def _topk_mask(s: sp.csr_matrix, k: int) -> np.ndarray:
    """Boolean mask over ``s.data``: the k largest entries of each row (ties: smaller column index first)."""
    rows = np.repeat(np.arange(s.shape[0]), np.diff(s.indptr))
    order = np.lexsort((s.indices, -s.data, rows))  # by row, value descending, column ascending
    rank_in_row = np.empty(len(order), dtype=np.int64)
    rank_in_row[order] = np.arange(len(order)) - s.indptr[rows[order]]
    return rank_in_row < k


class ItemKNN(Recommender):
    """Item-based CF exactly as Krichene & Rendle section 9 (eqs. 27-30).

    s_ij = (|U_i and U_j| / (sqrt|U_i| sqrt|U_j|))^q, with U_i the training users of item i (eq. 27); computed as
    ``(co / (sqrt(n_i) * sqrt(n_j))) ** q`` in float64. The diagonal s_ii is set to 0 (an item is not its own
    neighbour; the paper does not say). Sparsification (eq. 28): ``s'_ij = s_ij [i in N_k(j)] [j in N_k'(i)]``,
    where N_k'(i) holds the k' largest s_ij of row i (``k_neighbors``) and N_k(j) the k largest of column j (``k_column``);
    None means infinity; ties go to the smaller item index; zero similarities are never neighbours. Row
    normalisation (eq. 29): s''_i = s'_i / ||s'_i||_2 (taken as max|s'_i| ||s'_i / max|s'_i||| where the squares
    would underflow, e.g. q = 800). Prediction (eq. 30):
    y(u, i) = sum_{j in H_u} s''_ij / sum_j s''_ij, and 0 when item i has no neighbour (0/0). The normalisation
    of eq. 29 cancels in eq. 30; it is kept to follow the paper literally.

    Recommender Y of the paper: ``ItemKNN(q=3)``; recommender Z: ``ItemKNN(q=1, k_neighbors=10)``.
    """

    def __init__(
        self,
        q: float = 3.0,
        k_neighbors: int | None = None,
        k_column: int | None = None,
        device: str | torch.device | None = None,
        dense_threshold: float = 0.05,
    ) -> None:
        super().__init__(device)
        self.q = check_positive_float(q, "q")  # q = nan or inf: every similarity powered to nothing meaningful
        self.k_neighbors = check_optional(k_neighbors, check_int, "k_neighbors", 1)
        self.k_column = check_optional(k_column, check_int, "k_column", 1)
        self.dense_threshold = check_nonnegative_float(dense_threshold, "dense_threshold")
        qs = f"{self.q:g}"
        parts = [f"q={qs}"] + ([f"k={self.k_column}"] if self.k_column else []) + (
            [f"k'={self.k_neighbors}"] if self.k_neighbors else []
        )
        self.name = f"ItemKNN({','.join(parts)})"

    def similarity(self, train: Any) -> sp.csr_matrix:
        """s'' of eq. 29 as a float64 CSR matrix (items x items, row i = scored item, column j = history item)."""
        x = _as_binary_csr(train)
        counts = np.asarray(x.sum(axis=0)).reshape(-1)
        # co-occurrence counts, float64: whole numbers, so exact in any order of summation; a CSR product (x.T as CSR
        # first: a CSC product would be converted to CSR afterwards, a pass over every co-occurrence)
        co = sp.csr_matrix(x.T) @ x
        # the diagonal (and any zero) dropped: what setdiag(0) and eliminate_zeros() leave, in one pass
        rows = np.repeat(np.arange(co.shape[0]), np.diff(co.indptr))
        off = (rows != co.indices) & (co.data != 0)
        indptr = np.concatenate([[0], np.cumsum(np.bincount(rows[off], minlength=co.shape[0]))]).astype(co.indptr.dtype)
        co = sp.csr_matrix((co.data[off], co.indices[off], indptr), shape=co.shape)
        co.sort_indices()
        rows = rows[off]
        s = co.copy()
        root = np.sqrt(counts)  # sqrt(n_i) per item, gathered (the same bits as the square root of each gathered count)
        s.data = (co.data / (root[rows] * root[co.indices])) ** self.q
        # Both neighbourhoods of eq. 28 are taken on s itself, then combined.
        keep = np.ones(s.nnz, dtype=bool)
        if self.k_neighbors is not None:
            keep &= _topk_mask(s, self.k_neighbors)
        if self.k_column is not None:
            # Transpose with the data positions as values to map the column mask back onto s.data.
            pos = sp.csr_matrix((np.arange(1, s.nnz + 1, dtype=np.float64), s.indices, s.indptr), shape=s.shape)
            t, tpos = sp.csr_matrix(s.T), sp.csr_matrix(pos.T)
            t.sort_indices()
            tpos.sort_indices()
            col_keep = np.zeros(s.nnz, dtype=bool)
            col_keep[tpos.data.astype(np.int64) - 1] = _topk_mask(t, self.k_column)
            keep &= col_keep
        s.data[~keep] = 0.0
        s.eliminate_zeros()
        s.sort_indices()
        norms = np.sqrt(np.asarray(s.multiply(s).sum(axis=1)).reshape(-1))
        rows = np.repeat(np.arange(s.shape[0]), np.diff(s.indptr))
        small = np.flatnonzero(norms[rows] < 2.0 ** -484)  # entries of rows whose squares' sum nears underflow (q large)
        if small.size:  # those rows' norms as max |s| ||s / max|s|||: no square underflows; other rows keep their bits
            top = np.zeros(s.shape[0])
            np.maximum.at(top, rows[small], s.data[small])
            scaled = np.bincount(rows[small], weights=(s.data[small] / top[rows[small]]) ** 2, minlength=s.shape[0])
            hit = top > 0
            norms[hit] = top[hit] * np.sqrt(scaled[hit])
        s.data = s.data / norms[rows]
        return s

    def fit(self, train: Any) -> "ItemKNN":
        x = _as_binary_csr(train)
        self.n_users, self.n_items = x.shape
        s = self.similarity(x)
        denom = np.asarray(s.sum(axis=1)).reshape(-1)
        inv = np.divide(1.0, denom, out=np.zeros_like(denom), where=denom > 0)
        # score(u, .) = x_u @ W with W[j, i] = s''_ij / sum_j' s''_ij'.
        self._x = x
        rows = np.repeat(np.arange(s.shape[0]), np.diff(s.indptr))
        scaled = s.data * inv[rows]  # s''_ij / sum_j' s''_ij', one product each (the bits of s.multiply(inv[:, None]))
        nnz = int(np.count_nonzero(scaled))  # W's stored entries (a product that underflows to 0 is not stored)
        if nnz >= self.dense_threshold * s.shape[0] * s.shape[1]:
            # W dense in float32, scattered from the products (each rounded to float32 once, as W.toarray() then
            # .to(float32)), without the float64 dense copy of the catalogue's square
            dense = np.zeros((s.shape[1], s.shape[0]), dtype=np.float32)
            dense[s.indices, rows] = scaled.astype(np.float32)
            self._w_dense: torch.Tensor | None = torch.from_numpy(dense).to(self.device)
            self._wt_sparse = None
        else:
            w = sp.csr_matrix(s.multiply(inv[:, None]).T)
            self._w_dense = None
            self._wt_sparse = _torch_csr(sp.csr_matrix(w.T), torch.float32, self.device)
        return self

    def score(self, users: TensorLike) -> torch.Tensor:
        u = self._users(users)
        xb = self._x[u.cpu().numpy()]
        if self._w_dense is not None:
            return torch.sparse.mm(_torch_csr(xb, torch.float32, self.device), self._w_dense)
        dense = torch.from_numpy(xb.toarray().T.astype(np.float32)).to(self.device)
        return torch.sparse.mm(self._wt_sparse, dense).T.contiguous()


class ImplicitALS(Recommender):
    """Matrix factorisation of section 9 (recommender X), solved by implicit alternating least squares.

    Model y(u, i) = <w_u, h_i> with d factors. Loss (float64)::

        L(W, H) = sum_{(u,i) in H} (y(u,i) - 1)^2 + alpha * sum_{u, i} y(u,i)^2 + reg * (||W||_F^2 + ||H||_F^2)

    (the all-pairs term includes the observed pairs). With H fixed each user solves
    (sum_{i in H_u} h_i h_i^T + alpha H^T H + reg I) w_u = sum_{i in H_u} h_i, and symmetrically for items: the
    Gramian H^T H is shared, the per-user sums of outer products are one sparse product with the items' flattened
    outer products, so one sweep costs O((|U| + |I|) d^3 + nnz d^2). Each half-step minimises L exactly in its
    block, so L never increases. Factors start as N(0, init_std^2) from ``seed``; users are solved first.
    """

    def __init__(
        self,
        factors: int = 16,
        reg: float = 10.0,
        alpha: float = 0.2,
        iterations: int = 20,
        seed: int = 0,
        init_std: float = 0.1,
        device: str | torch.device | None = None,
        track_objective: bool = False,
    ) -> None:
        super().__init__(device)
        self.factors, self.iterations = check_int(factors, "factors", 1), check_int(iterations, "iterations", 0)
        # finite: reg = inf or init_std = nan would give NaN factors, hence NaN scores
        self.reg, self.alpha = check_positive_float(reg, "reg"), check_nonnegative_float(alpha, "alpha")
        self.seed, self.init_std = check_seed(seed, "seed"), check_nonnegative_float(init_std, "init_std")
        self.track_objective = check_bool(track_objective, "track_objective")
        self.chunk_elements = 1 << 24  # float64 entries of the per-row Gramians held at once (128 MiB)
        self.name = "iALS"
        self.objective_history: list[float] = []

    def _solve(self, chunks: list[torch.Tensor], fixed: torch.Tensor) -> torch.Tensor:
        """New factors for the rows of the binary sparse blocks ``chunks`` given the column factors ``fixed``."""
        d = fixed.shape[1]
        base = self.alpha * (fixed.T @ fixed) + self.reg * torch.eye(d, dtype=fixed.dtype, device=fixed.device)
        outer = (fixed.unsqueeze(2) * fixed.unsqueeze(1)).reshape(fixed.shape[0], d * d)
        out = []
        for x in chunks:
            rhs = torch.sparse.mm(x, fixed)  # sum_{j in row} fixed_j
            gram = torch.sparse.mm(x, outer).reshape(-1, d, d) + base
            chol = torch.linalg.cholesky(gram)
            out.append(torch.cholesky_solve(rhs.unsqueeze(2), chol).squeeze(2))
        return torch.cat(out)

    def fit(self, train: Any) -> "ImplicitALS":
        x = _as_binary_csr(train)
        self.n_users, self.n_items = x.shape
        dev, dt = self.device, torch.float64
        gen = torch.Generator().manual_seed(self.seed)
        w = torch.randn(self.n_users, self.factors, generator=gen, dtype=dt) * self.init_std
        h = torch.randn(self.n_items, self.factors, generator=gen, dtype=dt) * self.init_std
        w, h = w.to(dev), h.to(dev)
        rows_per_chunk = max(1, self.chunk_elements // (self.factors * self.factors))
        xu = _row_chunks(x, rows_per_chunk, dt, dev)
        xi = _row_chunks(sp.csr_matrix(x.T), rows_per_chunk, dt, dev)
        self._x = x
        self.objective_history = []
        if self.track_objective:
            self.objective_history.append(self._objective(x, w, h))
        for _ in range(self.iterations):
            w = self._solve(xu, h)
            h = self._solve(xi, w)
            if self.track_objective:
                self.objective_history.append(self._objective(x, w, h))
        self.user_factors, self.item_factors = w, h
        self._w32, self._h32 = w.to(torch.float32), h.to(torch.float32)
        return self

    def _objective(self, x: sp.csr_matrix, w: torch.Tensor, h: torch.Tensor) -> float:
        rows = torch.from_numpy(np.repeat(np.arange(x.shape[0]), np.diff(x.indptr))).to(w.device)
        cols = torch.from_numpy(x.indices.astype(np.int64)).to(w.device)
        y_obs = (w[rows] * h[cols]).sum(1)
        all_pairs = ((w.T @ w) * (h.T @ h)).sum()
        value = ((y_obs - 1) ** 2).sum() + self.alpha * all_pairs + self.reg * ((w**2).sum() + (h**2).sum())
        return float(value)

    def objective(self, train: Any = None) -> float:
        """The loss L of the fitted factors on ``train`` (default: the training matrix)."""
        if self.n_users is None:
            raise NotFittedError("ImplicitALS: call fit(train) first")
        x = self._x if train is None else _as_binary_csr(train)
        return self._objective(x, self.user_factors, self.item_factors)

    def score(self, users: TensorLike) -> torch.Tensor:
        u = self._users(users).to(self.device)
        return self._w32[u] @ self._h32.T


class EASE(Recommender):
    """EASE (Steck, WWW 2019, eq. 8): item weights B = I - P diagMat(1 / diag(P)), P = (G + reg I)^-1, G = X^T X.

    The diagonal of B is zero by construction (an item does not predict itself); scores are x_u B. G and its
    inverse are dense n_items x n_items float64 (Cholesky on ``device``): 0.8 GB and a few seconds at 10,000 items.
    """

    def __init__(self, reg: float = 500.0, device: str | torch.device | None = None) -> None:
        super().__init__(device)
        self.reg = check_positive_float(reg, "reg")
        self.name = f"EASE({self.reg:g})"

    def fit(self, train: Any) -> "EASE":
        x = _as_binary_csr(train)
        self.n_users, self.n_items = x.shape
        gram = torch.from_numpy((x.T @ x).toarray().astype(np.float64)).to(self.device)
        gram.diagonal().add_(self.reg)
        p = torch.cholesky_inverse(torch.linalg.cholesky(gram))
        b = -p / p.diagonal().unsqueeze(0)  # B_ij = -P_ij / P_jj for i != j
        b.fill_diagonal_(0.0)
        self._x = x
        self.weights = b.to(torch.float32)
        return self

    def score(self, users: TensorLike) -> torch.Tensor:
        u = self._users(users)
        xb = self._x[u.cpu().numpy()]
        return torch.sparse.mm(_torch_csr(xb, torch.float32, self.device), self.weights)


def train_benchmark(train: Any, seed: int = 0, device: str | torch.device | None = None) -> dict[str, Recommender]:
    """The accuracy benchmark's five recommenders of different shape: :func:`train_all`'s four (iALS, two
    item-kNNs, popularity) and :class:`EASE` (reg = 500)."""
    models = train_all(train, seed=seed, device=device)
    models["EASE"] = EASE(500.0, device=device).fit(train)
    return models


def train_all(
    train: Any, seed: int = 0, device: str | torch.device | None = None, als_iterations: int = 20
) -> dict[str, Recommender]:
    """Fit the paper's three recommenders and popularity; keys are stable display names.

    ``"iALS"`` (X: d = 16, lambda = 10, alpha = 0.2), ``"ItemKNN(q=3)"`` (Y), ``"ItemKNN(q=1,k'=10)"`` (Z),
    ``"Popularity"``. Deterministic given ``seed`` (only iALS is random).
    """
    als_iterations, seed = check_int(als_iterations, "als_iterations", 0), check_seed(seed, "seed")
    models: list[Recommender] = [
        ImplicitALS(factors=16, reg=10.0, alpha=0.2, iterations=als_iterations, seed=seed, device=device),
        ItemKNN(q=3, device=device),
        ItemKNN(q=1, k_neighbors=10, device=device),
        Popularity(device=device),
    ]
    return {m.name: m.fit(train) for m in models}


def held_out_ranks(models: dict[str, Recommender], split: Any, batch_users: int = 256) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """Exact rank of each test user's held-out item among the items outside its training row, per model.

    ``split``: a :class:`~reco_sampled_plugin.datasets.LeaveLastOutSplit`. Returns ({name: int64 ranks},
    n per user), both over ``split.test_users`` in order; the ranks are single-item ranks (other positives do not
    count: there are none), n = items minus the user's training items. Users are scored ``batch_users`` at a time
    (bounded memory: batch x items scores)."""
    from .ranking import exact_ranks

    batch_users = check_int(batch_users, "batch_users", 1)
    if not isinstance(models, dict) or not all(isinstance(m, Recommender) for m in models.values()):
        raise ValueError(f"models: expected a dict of name -> fitted Recommender (train_all), got {type(models).__name__}")
    if not all(hasattr(split, a) for a in ("test_users", "test_items", "train", "n_items")):
        raise ValueError(f"split: expected a LeaveLastOutSplit (datasets.leave_last_out), got {type(split).__name__}")
    users = split.test_users
    test = torch.from_numpy(split.test_items[users])
    train = split.train[users]
    n_u = (split.n_items - np.diff(train.indptr)).astype(np.int64)
    out = {}
    for name, model in models.items():
        parts = []
        for lo in range(0, len(users), batch_users):
            sl = slice(lo, lo + batch_users)
            exclude = torch.from_numpy(train[sl].toarray() > 0)
            parts.append(exact_ranks(model.score(users[sl]), test[sl], exclude, count_other_positives=False).reshape(-1))
        out[name] = torch.cat(parts).numpy()
    return out, n_u
