"""Per-user metrics agree with the recometrics package (an independent C++ implementation)."""

import numpy as np
import pytest
import recometrics
import scipy.sparse as sp
import torch

from reco_sampled_plugin import mean_metrics, per_user_metrics

ALL = ["precision", "tp", "recall", "ap", "tap", "ndcg", "hit", "rr"]


def _data(n_users, n_items, density, seed, graded=True):
    rng = np.random.default_rng(seed)
    x = sp.random(n_users, n_items, density=density, format="csr", random_state=seed)
    x.data = np.abs(x.data) + 0.1 if graded else np.ones_like(x.data)
    x_train, x_test = recometrics.split_reco_train_test(x, split_type="all", items_test_fraction=0.4, seed=seed)
    a = rng.standard_normal((n_users, 6))
    b = rng.standard_normal((n_items, 6))
    return x_train.astype(np.float64), x_test.astype(np.float64), a, b


def _edge_rows(x_train, x_test, k):
    """Append users that hit every NaN rule: no test items, k or fewer candidates, nothing irrelevant left."""
    n_items = x_train.shape[1]
    tr = x_train.toarray()
    te = x_test.toarray()
    no_test = np.zeros((1, n_items)); no_test[0, :3] = 1
    few = np.ones((1, n_items)); few[0, :k] = 0  # k candidates left
    few_test = np.zeros((1, n_items)); few_test[0, 0] = 2.0
    full = np.zeros((1, n_items)); full[0, :5] = 1  # everything not in train is a positive
    full_test = np.ones((1, n_items)); full_test[0, :5] = 0
    tr = np.vstack([tr, no_test, few, full])
    te = np.vstack([te, np.zeros((1, n_items)), few_test, full_test])
    return sp.csr_matrix(tr), sp.csr_matrix(te)


# k = 1 runs without the edge rows: recometrics (without noise) compares the top-1 score with
# itself for users whose candidates are all relevant and reports NaN, an artefact we don't copy.
@pytest.mark.parametrize("k,edges", [(1, False), (2, True), (3, True), (10, True)])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_metric_matches_recometrics(k, edges, seed):
    x_train, x_test, a, b = _data(150, 40, 0.35, seed)
    if edges:
        x_train, x_test = _edge_rows(x_train, x_test, k)
        a = np.vstack([a, np.random.default_rng(seed + 7).standard_normal((3, a.shape[1]))])
    ref = recometrics.calc_reco_metrics(
        x_train, x_test, a, b, k=k, all_metrics=True, break_ties_with_noise=False, min_items_pool=1, nthreads=1
    )
    scores = torch.tensor(a @ b.T, dtype=torch.float64)
    positives = torch.tensor(x_test.toarray() != 0)
    exclude = torch.tensor(x_train.toarray() != 0)
    relevance = torch.tensor(x_test.toarray())
    names = [f"{m}@{k}" for m in ALL] + ["auc", "pr_auc"]
    got = per_user_metrics(scores, positives, names, exclude=exclude, relevance=relevance)
    assert list(got.columns) == list(ref.columns)
    for col in ref.columns:
        want, have = ref[col].to_numpy(), got[col].to_numpy()
        np.testing.assert_array_equal(np.isnan(have), np.isnan(want), err_msg=col)
        np.testing.assert_allclose(have, want, rtol=1e-9, atol=1e-12, equal_nan=True, err_msg=col)
    if edges:  # every NaN rule was exercised
        assert np.isnan(got[f"P@{k}"].to_numpy()[-3:]).all()
        assert np.isnan(got["ROC_AUC"].to_numpy()[[-3, -1]]).all()
        assert np.isfinite(got[f"NDCG@{k}"].to_numpy()[-1])


def test_binary_ndcg_float32_factors_match_to_1e6():
    x_train, x_test, a, b = _data(300, 80, 0.2, 5, graded=False)
    a32, b32 = a.astype(np.float32), b.astype(np.float32)
    ref = recometrics.calc_reco_metrics(
        x_train.astype(np.float32), x_test.astype(np.float32), a32, b32, k=5, all_metrics=True,
        break_ties_with_noise=False, min_items_pool=1, nthreads=1,
    )
    scores = torch.tensor(a32) @ torch.tensor(b32).T
    got = per_user_metrics(
        scores, torch.tensor(x_test.toarray() != 0),
        [f"{m}@5" for m in ALL] + ["auc", "pr_auc"], exclude=torch.tensor(x_train.toarray() != 0),
    )
    for col in ref.columns:
        np.testing.assert_allclose(got[col].to_numpy(), ref[col].to_numpy(), atol=1e-6, equal_nan=True, err_msg=col)


def test_cumulative_columns_and_means():
    x_train, x_test, a, b = _data(50, 30, 0.3, 3)
    scores = torch.tensor(a @ b.T)
    got = per_user_metrics(scores, torch.tensor(x_test.toarray() != 0), ["ndcg@3", "auc"],
                           exclude=torch.tensor(x_train.toarray() != 0), cumulative=True,
                           relevance=torch.tensor(x_test.toarray()))
    assert list(got.columns) == ["NDCG@1", "NDCG@2", "NDCG@3", "ROC_AUC"]
    for k in (1, 2, 3):  # roc_auc=True makes recometrics sort fully (see the k = 1 note above)
        ref = recometrics.calc_reco_metrics(x_train, x_test, a, b, k=k, ndcg=True, precision=False, roc_auc=True,
                                            average_precision=False, break_ties_with_noise=False,
                                            min_items_pool=1, nthreads=1)
        np.testing.assert_allclose(got[f"NDCG@{k}"], ref[f"NDCG@{k}"], rtol=1e-9, equal_nan=True)
    means = mean_metrics(got)
    col = got["NDCG@3"].to_numpy()
    assert means["NDCG@3"] == (pytest.approx(np.nanmean(col)), int((~np.isnan(col)).sum()), int(np.isnan(col).sum()))
