"""Recommenders of Krichene & Rendle section 9: oracles on tiny data, optimality of ALS, quality on ml-100k."""

from __future__ import annotations


import numpy as np
import pytest
import scipy.sparse as sp
import torch

from reco_sampled_plugin.baselines import ImplicitALS, ItemKNN, Popularity


def _random_binary(n_users: int, n_items: int, density: float, seed: int) -> sp.csr_matrix:
    rng = np.random.default_rng(seed)
    x = (rng.random((n_users, n_items)) < density).astype(np.float32)
    x[:, -1] = 0  # an item nobody has seen
    x[0, :] = 0  # a user with no history
    x[1, 0] = x[1, 1] = 1
    return sp.csr_matrix(x)


def _brute_itemknn(x: np.ndarray, q: float, k_row: int | None, k_col: int | None) -> np.ndarray:
    """Eqs. 27-30 with explicit loops; diagonal excluded; ties to the smaller index; zeros are not neighbours."""
    n_items = x.shape[1]
    counts = x.sum(0).astype(np.float64)
    co = np.zeros((n_items, n_items))
    for i in range(n_items):
        for j in range(n_items):
            if i != j:
                co[i, j] = float(np.sum(x[:, i] * x[:, j]))
    ratio = np.zeros((n_items, n_items))
    for i in range(n_items):
        for j in range(n_items):
            if co[i, j] > 0:
                ratio[i, j] = co[i, j] / (np.sqrt(counts[i]) * np.sqrt(counts[j]))
    s = ratio**q
    row_nb = np.ones_like(s, dtype=bool)  # delta(j in N_k'(i))
    col_nb = np.ones_like(s, dtype=bool)  # delta(i in N_k(j))
    if k_row is not None:
        row_nb[:] = False
        for i in range(n_items):
            cand = sorted((j for j in range(n_items) if s[i, j] > 0), key=lambda j: (-s[i, j], j))
            row_nb[i, cand[:k_row]] = True
    if k_col is not None:
        col_nb[:] = False
        for j in range(n_items):
            cand = sorted((i for i in range(n_items) if s[i, j] > 0), key=lambda i: (-s[i, j], i))
            col_nb[cand[:k_col], j] = True
    s1 = s * row_nb * col_nb
    s2 = np.zeros_like(s1)
    for i in range(n_items):
        norm = np.sqrt(np.sum(s1[i] ** 2))
        if norm > 0:
            s2[i] = s1[i] / norm
    y = np.zeros((x.shape[0], n_items))
    for u in range(x.shape[0]):
        for i in range(n_items):
            den = s2[i].sum()
            if den > 0:
                y[u, i] = sum(s2[i, j] for j in range(n_items) if x[u, j] > 0) / den
    return y


def _dense_objective(x: np.ndarray, w: torch.Tensor, h: torch.Tensor, alpha: float, reg: float) -> torch.Tensor:
    """Section 9 loss, written directly over the dense matrix of all pairs."""
    y = w @ h.T
    obs = torch.from_numpy(x > 0)
    return ((y - 1) ** 2)[obs].sum() + alpha * (y**2).sum() + reg * ((w**2).sum() + (h**2).sum())


def _ranks(scores: torch.Tensor, train: sp.csr_matrix, users: np.ndarray, test: np.ndarray) -> torch.Tensor:
    """1-based exact ranks of the test items among items not in train, pessimistic ties (brute force)."""
    s = scores.double()
    pos = torch.from_numpy(test)
    s_pos = s.gather(1, pos[:, None])
    excluded = torch.from_numpy(train[users].toarray() > 0)
    excluded[torch.arange(len(users)), pos] = True
    beats = (s >= s_pos) & ~excluded
    return 1 + beats.sum(1)


# --------------------------------------------------------------------------- popularity


def test_popularity_scores_are_item_counts():
    x = _random_binary(12, 9, 0.4, seed=1)
    x_dup = x.tocoo()
    x_dup = sp.coo_matrix(  # repeated and weighted entries count once
        (np.r_[x_dup.data * 3, 1.0], (np.r_[x_dup.row, 1], np.r_[x_dup.col, 0])), shape=x.shape
    )
    model = Popularity().fit(x_dup)
    scores = model.score(np.array([0, 5, 11]))
    counts = np.asarray((x > 0).sum(0)).reshape(-1)
    assert scores.dtype == torch.float32 and scores.shape == (3, 9)
    for row in scores:
        assert row.tolist() == counts.astype(float).tolist()


def test_score_errors():
    with pytest.raises(RuntimeError, match="fit"):
        Popularity().score([0])
    model = Popularity().fit(_random_binary(4, 3, 0.5, seed=0))
    with pytest.raises(ValueError, match="users"):
        model.score([4])
    with pytest.raises(ValueError, match="users"):
        model.score(torch.tensor([0.0]))
    with pytest.raises(TypeError, match="train"):
        Popularity().fit(np.ones((3, 3)))
    with pytest.raises(ValueError, match="k_neighbors"):
        ItemKNN(q=1, k_neighbors=0)


# --------------------------------------------------------------------------- item kNN


@pytest.mark.parametrize(
    "q, k_row, k_col",
    [(3.0, None, None), (1.0, 3, None), (1.0, 1, None), (0.5, None, 2), (2.0, 4, 3), (1.0, 10, None)],
)
@pytest.mark.parametrize("dense_threshold", [0.0, 2.0])
def test_itemknn_matches_brute_force(q, k_row, k_col, dense_threshold):
    # Small integer data: many tied similarities, so the tie rule is exercised too.
    x = _random_binary(25, 11, 0.3, seed=int(q * 10) + (k_row or 0))
    model = ItemKNN(q=q, k_neighbors=k_row, k_column=k_col, dense_threshold=dense_threshold).fit(x)
    got = model.score(np.arange(25)).double().numpy()
    want = _brute_itemknn(x.toarray(), q, k_row, k_col)
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-7)
    assert np.all(got[:, -1] == 0)  # unseen item: no neighbours, score 0
    if k_row is not None:
        assert np.all(np.diff(model.similarity(x).indptr) <= k_row)


def test_itemknn_large_q_scores_without_underflow():
    """q = 800: a row's largest s_ij = ratio^q is representable but its square underflows, so ||s'_i|| of eq. 29 taken
    directly is 0 and the scores NaN. Oracle: eq. 30 is invariant to each row's scale (the norm cancels), so
    y(u, i) = sum_{j in H_u} t_ij / sum_j t_ij with t_ij = exp(q (log ratio_ij - max_j log ratio_ij)), in log space;
    an s_ij that underflows to 0 is no neighbour, as the docstring says."""
    x = _random_binary(25, 11, 0.3, seed=4)
    q = 800.0
    model = ItemKNN(q=q).fit(x)
    got = model.score(np.arange(25)).double().numpy()
    d = x.toarray().astype(np.float64)
    counts = d.sum(0)
    co = d.T @ d
    np.fill_diagonal(co, 0)
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.where(co > 0, co / (np.sqrt(counts)[:, None] * np.sqrt(counts)[None, :]), 0.0)
        log_t = np.where(ratio**q > 0, q * np.log(ratio), -np.inf)
    want = np.zeros_like(got)
    for i in range(d.shape[1]):
        if np.isfinite(log_t[i]).any():
            t = np.exp(log_t[i] - log_t[i].max())
            want[:, i] = (d @ t) / t.sum()
    top = ratio.max(1)
    assert np.isfinite(got).all() and np.any((top**q > 0) & (top ** (2 * q) == 0))  # rows whose norm underflowed
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_itemknn_names():
    assert ItemKNN(q=3).name == "ItemKNN(q=3)"
    assert ItemKNN(q=1, k_neighbors=10).name == "ItemKNN(q=1,k'=10)"


# --------------------------------------------------------------------------- implicit ALS


def test_als_objective_decreases_and_reaches_a_stationary_point():
    x = _random_binary(30, 14, 0.3, seed=3)
    alpha, reg = 0.2, 0.5
    model = ImplicitALS(factors=4, reg=reg, alpha=alpha, iterations=300, seed=7, track_objective=True).fit(x)
    hist = np.array(model.objective_history)
    assert len(hist) == 301
    assert np.all(np.diff(hist) <= 1e-12 * hist[:-1])  # block coordinate descent never goes up
    assert hist[-1] < 0.5 * hist[0]
    # The model is not the trivial zero solution (whose loss is nnz).
    assert hist[-1] < 0.9 * x.nnz
    assert float(model.user_factors.norm()) > 0.1 and float(model.item_factors.norm()) > 0.1

    w = model.user_factors.clone().requires_grad_(True)
    h = model.item_factors.clone().requires_grad_(True)
    loss = _dense_objective(x.toarray(), w, h, alpha, reg)
    assert float(loss.detach()) == pytest.approx(model.objective(), rel=1e-12)
    assert float(loss.detach()) == pytest.approx(hist[-1], rel=1e-12)
    gw, gh = torch.autograd.grad(loss, (w, h))
    scale = float(loss.detach())
    # Items were solved last: their normal equations hold to rounding; users to convergence.
    assert float(gh.abs().max()) < 1e-10 * scale
    assert float(gw.abs().max()) < 1e-9 * scale


def test_als_single_steps_solve_the_normal_equations():
    x = _random_binary(15, 10, 0.35, seed=5)
    for iterations in (1, 2):
        model = ImplicitALS(factors=3, reg=1.0, alpha=0.3, iterations=iterations, seed=1).fit(x)
        w = model.user_factors.clone().requires_grad_(True)
        h = model.item_factors.clone().requires_grad_(True)
        gw, gh = torch.autograd.grad(_dense_objective(x.toarray(), w, h, 0.3, 1.0), (w, h))
        assert float(gh.abs().max()) < 1e-11
        assert float(gw.abs().max()) > 1e-6  # far from convergence after so few sweeps: the test can tell


def test_als_is_deterministic_given_the_seed():
    x = _random_binary(20, 12, 0.3, seed=2)
    a = ImplicitALS(factors=4, reg=1.0, iterations=5, seed=11).fit(x)
    b = ImplicitALS(factors=4, reg=1.0, iterations=5, seed=11).fit(x)
    c = ImplicitALS(factors=4, reg=1.0, iterations=5, seed=12).fit(x)
    assert torch.equal(a.user_factors, b.user_factors) and torch.equal(a.score([1, 3]), b.score([1, 3]))
    assert not torch.equal(a.user_factors, c.user_factors)
    scores = a.score(np.array([2, 4]))
    assert scores.dtype == torch.float32 and scores.shape == (2, 12)
    torch.testing.assert_close(scores.double(), a.user_factors[[2, 4]] @ a.item_factors.T, rtol=1e-5, atol=1e-6)


def test_als_chunked_solve_equals_one_block():
    x = _random_binary(40, 13, 0.3, seed=9)
    a = ImplicitALS(factors=4, reg=1.0, iterations=4, seed=0).fit(x)
    b = ImplicitALS(factors=4, reg=1.0, iterations=4, seed=0)
    b.chunk_elements = 7 * 16  # 7 rows per block
    b.fit(x)
    torch.testing.assert_close(a.user_factors, b.user_factors, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(a.item_factors, b.item_factors, rtol=1e-12, atol=1e-12)


# --------------------------------------------------------------------------- MovieLens 100k


@pytest.fixture(scope="module")
def trained(ml100k_split, ml100k_models):
    """The session's ml-100k split and ``train_all`` recommenders (tests/conftest.py); training time is a benchmark's
    business (benchmarks/), not a test's."""
    return ml100k_split, ml100k_models


def test_train_all_names(trained):
    split, models = trained
    assert list(models) == ["iALS", "ItemKNN(q=3)", "ItemKNN(q=1,k'=10)", "Popularity"]
    for model in models.values():
        s = model.score(np.array([0, 942]))
        assert s.shape == (2, 1682) and s.dtype == torch.float32 and torch.isfinite(s).all()


def test_recommenders_beat_random_on_ml100k(trained):
    split, models = trained
    users = split.test_users
    test = split.test_items[users]
    n_candidates = split.n_items - np.diff(split.train.indptr)[users]
    random_hr10 = float(np.mean(10.0 / n_candidates))  # expected HR@10 of a random ranking
    assert random_hr10 < 0.01
    hr10, bottom_half = {}, {}
    for name, model in models.items():
        ranks = _ranks(model.score(users), split.train, users, test)
        assert int(ranks.min()) >= 1 and bool((ranks <= torch.from_numpy(n_candidates)).all())
        hr10[name] = float((ranks <= 10).double().mean())
        bottom_half[name] = int((ranks > torch.from_numpy(n_candidates) // 2).sum())
    for name, value in hr10.items():
        assert value > 8 * random_hr10, (name, value, random_hr10)
    # The personalised recommenders beat popularity at the top.
    assert hr10["iALS"] > hr10["Popularity"] and hr10["ItemKNN(q=1,k'=10)"] > hr10["Popularity"]
    # Figure 5's shape: the sparse kNN (Z) leaves many relevant items at the bottom (score-0 ties), iALS few.
    assert bottom_half["ItemKNN(q=1,k'=10)"] > 2 * bottom_half["iALS"]


def test_als_objective_decreases_on_ml100k(ml100k_split):
    split = ml100k_split
    model = ImplicitALS(iterations=8, seed=0, track_objective=True).fit(split.train)
    hist = np.array(model.objective_history)
    assert np.all(np.diff(hist) <= 1e-12 * hist[:-1]) and hist[-1] < 0.9 * split.n_train


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_scores_on_cuda_match_cpu():
    x = _random_binary(30, 14, 0.3, seed=4)
    users = np.array([0, 3, 7, 29])
    for make in (
        lambda d: Popularity(device=d),
        lambda d: ItemKNN(q=3, device=d),
        lambda d: ItemKNN(q=1, k_neighbors=3, dense_threshold=2.0, device=d),
        lambda d: ImplicitALS(factors=4, reg=1.0, iterations=5, seed=0, device=d),
    ):
        cpu, gpu = make("cpu").fit(x).score(users), make("cuda").fit(x).score(users)
        assert gpu.device.type == "cuda"
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-5, atol=1e-6)


def test_ease_matches_per_item_ridge_regressions():
    """EASE's closed form B = I - P diagMat(1/diag P) equals, column by column, the ridge regression of item j on
    the other items (the zero-diagonal constraint solved directly): an independent oracle."""
    from reco_sampled_plugin.baselines import EASE

    rng = np.random.default_rng(0)
    x = sp.csr_matrix((rng.random((40, 12)) < 0.3).astype(np.float64))
    reg = 3.0
    model = EASE(reg).fit(x)
    b = model.weights.double().numpy()
    dense = x.toarray()
    for j in range(12):
        others = [i for i in range(12) if i != j]
        a = dense[:, others]
        col = np.linalg.solve(a.T @ a + reg * np.eye(11), a.T @ dense[:, j])
        np.testing.assert_allclose(b[others, j], col, rtol=1e-4, atol=1e-6)
        assert b[j, j] == 0.0
    np.testing.assert_allclose(model.score(np.arange(40)).double().numpy(), dense @ b, rtol=1e-5, atol=1e-6)
    assert model.name == "EASE(3)"
    with pytest.raises(ValueError, match="reg"):
        EASE(0.0)


def test_held_out_ranks_match_brute_force(tmp_path):
    """held_out_ranks (batched, training items excluded) against a per-user loop in numpy, pessimistic ties."""
    from reco_sampled_plugin import datasets
    from reco_sampled_plugin.baselines import held_out_ranks

    rng = np.random.default_rng(1)
    lines = ["user,item,rating,timestamp"] + [f"u{u},i{rng.integers(0, 30)},1,{t}" for t, u in
                                              enumerate(rng.integers(0, 25, size=300))]
    path = tmp_path / "x.csv"
    path.write_text("\n".join(lines) + "\n")
    split = datasets.leave_last_out(datasets.binarize(datasets.load_interactions(path)))
    models = {"pop": Popularity().fit(split.train), "knn": ItemKNN(q=1).fit(split.train)}
    ranks, n_u = held_out_ranks(models, split, batch_users=7)
    train = split.train.toarray() > 0
    for name, model in models.items():
        for k, u in enumerate(split.test_users):
            s = model.score([u])[0].double().numpy()
            t = split.test_items[u]
            cand = ~train[u]
            cand[t] = False
            assert ranks[name][k] == 1 + int(np.sum(s[cand] >= s[t]))
            assert n_u[k] == split.n_items - train[u].sum()
