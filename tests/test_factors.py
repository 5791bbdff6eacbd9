"""evaluate_factors agrees with the recometrics package (its C++ calc_reco_metrics) on every metric and option."""

import math

import numpy as np
import pytest
import recometrics
import scipy.sparse as sp
import torch

import reco_sampled_plugin as rsp
from reco_sampled_plugin import SampledRanks, SamplingDesign, exact_ranks, metric_values
from reco_sampled_plugin.factors import FactorEvaluation, evaluate_factors

ALL_FLAGS = dict(all_metrics=True, nthreads=1)


def _assert_same(got, ref, cols=None, rtol=1e-9, atol=1e-12):
    cols = list(ref.columns) if cols is None else cols
    for col in cols:
        want, have = ref[col].to_numpy(np.float64), got[col].to_numpy(np.float64)
        np.testing.assert_array_equal(np.isnan(have), np.isnan(want), err_msg=col)
        np.testing.assert_allclose(have, want, rtol=rtol, atol=atol, equal_nan=True, err_msg=col)


def _split(n_users, n_items, density, seed, graded=True):
    x = sp.random(n_users, n_items, density=density, format="csr", random_state=seed)
    x.data = np.abs(x.data) + 0.1 if graded else np.ones_like(x.data)
    x_train, x_test = recometrics.split_reco_train_test(x, split_type="all", items_test_fraction=0.4, seed=seed + 1)
    return sp.csr_matrix(x_train, dtype=np.float64), sp.csr_matrix(x_test, dtype=np.float64)


def _with_edge_users(x_train, x_test, a, k, rng):
    """Append users that hit every NaN rule: no test item, exactly k candidates, fewer than k candidates,
    every candidate relevant, no training item (cold start), all scores tied, a NaN factor."""
    n = x_train.shape[1]
    tr, te = x_train.toarray(), x_test.toarray()
    rows_tr, rows_te = [], []

    def add(train_items, test_items, test_value=1.5):
        r_tr, r_te = np.zeros(n), np.zeros(n)
        r_tr[list(train_items)] = 1.0
        r_te[list(test_items)] = test_value
        rows_tr.append(r_tr)
        rows_te.append(r_te)

    add(range(3), [])  # no test item
    add(range(k, n), [0])  # exactly k candidates
    add(range(k - 1, n), [0] if k > 1 else [])  # fewer than k candidates (or no test at k = 1)
    add(range(5), range(5, n))  # every candidate relevant: only NDCG
    add([], [1, 2])  # cold start
    add([3], [1, 2])  # all scores tied (zero user factor below)
    add([3], [1, 2])  # NaN user factor
    extra = rng.standard_normal((len(rows_tr), a.shape[1]))
    extra[-2] = 0.0
    extra[-1, 0] = np.nan
    return (
        sp.csr_matrix(np.vstack([tr] + rows_tr)),
        sp.csr_matrix(np.vstack([te] + rows_te)),
        np.vstack([a, extra]),
    )


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(3)
    x_train, x_test = _split(160, 40, 0.3, 3)
    a = rng.standard_normal((160, 6))
    b = rng.standard_normal((40, 6))
    return x_train, x_test, a, b


def test_manual_example_matches_recometrics():
    """The manual's example: 10 users, 20 items, 3 factors, k = 4, split 'all', recometrics' defaults."""
    rng = np.random.default_rng(1)
    user_f = rng.standard_normal((10, 3))
    item_f = rng.standard_normal((20, 3))
    x = abs(sp.random(10, 20, density=0.5, format="csr", random_state=1))
    x_train, x_test = recometrics.split_reco_train_test(x, split_type="all")
    ref = recometrics.calc_reco_metrics(x_train, x_test, user_f, item_f, k=4, as_df=True, nthreads=1)
    got = evaluate_factors(x_train, x_test, user_f, item_f, k=4)
    assert list(got.columns) == list(ref.columns) == ["P@4", "AP@4", "NDCG@4"]
    _assert_same(got, ref)
    ref_all = recometrics.calc_reco_metrics(x_train, x_test, user_f, item_f, k=4, **ALL_FLAGS)
    got_all = evaluate_factors(x_train, x_test, user_f, item_f, k=4, metrics="all", break_ties_with_noise=True)
    assert list(got_all.columns) == list(ref_all.columns)
    _assert_same(got_all, ref_all)
    assert np.isfinite(got_all.to_numpy()).all()


# k = 1 asks for ROC AUC too: without noise recometrics otherwise reports NaN for everyone at k = 1
@pytest.mark.parametrize("k", [1, 2, 3, 10])
@pytest.mark.parametrize("biases", [False, True])
def test_every_metric_and_nan_rule_match_recometrics(data, k, biases):
    x_train, x_test, a, b = data
    rng = np.random.default_rng(k)
    x_train, x_test, a = _with_edge_users(x_train, x_test, a, k, rng)
    bias = rng.standard_normal(b.shape[0]) if biases else None
    for noise in (False, True):
        ref = recometrics.calc_reco_metrics(
            x_train, x_test, a, b, k=k, item_biases=bias, break_ties_with_noise=noise, min_items_pool=1, **ALL_FLAGS
        )
        with pytest.warns(RuntimeWarning, match=r"^evaluate_factors: 1 user\(s\) with test items have NaN or inf factors"):
            got = evaluate_factors(x_train, x_test, a, b, k=k, item_biases=bias, metrics="all",
                                   break_ties_with_noise=noise, min_items_pool=1)  # the NaN factor's user: said
        assert list(got.columns) == list(ref.columns)
        if k == 1 and not noise:  # recometrics compares the top-1 score with itself there (its NaN artefact)
            ref.iloc[-4] = got.iloc[-4]
        _assert_same(got, ref)
    tail = got.to_numpy()[-7:]
    assert np.isnan(tail[[0, 2, 6]]).all()  # no test / too few candidates / NaN factor
    assert np.isnan(tail[5]).all() != biases  # all scores tied (biases untie them)
    if k > 1:  # exactly k candidates: P, TP, R and Hit are NaN, the order-aware metrics are not
        assert np.isnan(got[f"P@{k}"].to_numpy()[-6]) and np.isfinite(got[f"AP@{k}"].to_numpy()[-6])
    assert np.isfinite(got[f"NDCG@{k}"].to_numpy()[-4]) and np.isnan(got["ROC_AUC"].to_numpy()[-4])  # all relevant
    assert np.isfinite(tail[4]).all()  # cold start counts by default


@pytest.mark.parametrize(
    "options",
    [
        dict(consider_cold_start=False),
        dict(min_items_pool=30),
        dict(min_items_pool=1, k=5),
    ],
)
def test_options_match_recometrics(data, options):
    x_train, x_test, a, b = data
    x_train, x_test, a = _with_edge_users(x_train, x_test, a, 3, np.random.default_rng(0))
    opts = {"k": 3, **options}
    ref = recometrics.calc_reco_metrics(x_train, x_test, a, b, break_ties_with_noise=False, **opts, **ALL_FLAGS)
    got = evaluate_factors(x_train, x_test, a, b, metrics="all", **opts)
    _assert_same(got, ref)
    if options.get("consider_cold_start") is False:
        assert np.isnan(got.to_numpy()[-3]).all()


def test_min_pos_test_follows_the_documentation(data):
    """recometrics 0.1.6 documents min_pos_test but clamps it to 1 internally; we apply it."""
    x_train, x_test, a, b = data
    ref = recometrics.calc_reco_metrics(x_train, x_test, a, b, k=3, min_pos_test=4, **ALL_FLAGS)
    got = evaluate_factors(x_train, x_test, a, b, k=3, metrics="all", min_pos_test=4)
    n_pos = np.diff(x_test.indptr)
    assert (n_pos < 4).any() and (n_pos >= 4).any()
    assert np.isnan(got.to_numpy()[n_pos < 4]).all()
    _assert_same(got[n_pos >= 4], ref[n_pos >= 4])


def test_no_train_matrix_and_non_personalised_model(data):
    x_train, x_test, a, b = data
    ref = recometrics.calc_reco_metrics(None, x_test, a, b, k=4, **ALL_FLAGS)
    _assert_same(evaluate_factors(None, x_test, a, b, k=4, metrics="all"), ref)
    bias = np.random.default_rng(9).standard_normal(b.shape[0])
    ref = recometrics.calc_reco_metrics(x_train, x_test, None, None, k=4, item_biases=bias, **ALL_FLAGS)
    got = evaluate_factors(x_train, x_test, None, None, k=4, item_biases=bias, metrics="all")
    _assert_same(got, ref)


def test_cumulative_matches_recometrics(data):
    x_train, x_test, a, b = data
    k = 6
    names = ["precision", "tp", "recall", "ap", "tap", "ndcg", "hit", "rr"]
    flags = dict(precision=True, trunc_precision=True, recall=True, average_precision=True,
                 trunc_average_precision=True, ndcg=True, hit=True, rr=True)
    ref = recometrics.calc_reco_metrics(x_train, x_test, a, b, k=k, cumulative=True, nthreads=1, **flags)
    got = evaluate_factors(x_train, x_test, a, b, k=k, metrics=names, cumulative=True)
    assert list(got.columns) == list(ref.columns)
    _assert_same(got, ref, [c for c in ref.columns if not c.startswith("NDCG")])
    # recometrics' cumulative NDCG@j repeats NDCG@|T| for j > |T|; its non-cumulative NDCG@j is right
    n_pos = np.diff(x_test.indptr)
    for j in range(1, k + 1):
        single = recometrics.calc_reco_metrics(x_train, x_test, a, b, k=j, min_items_pool=k, ndcg=True,
                                               precision=False, average_precision=False, roc_auc=True, nthreads=1)
        _assert_same(got, single, [f"NDCG@{j}"])
        short = n_pos < j
        _assert_same(got[~short], ref[~short], [f"NDCG@{j}"])
    with_auc = evaluate_factors(x_train, x_test, a, b, k=2, metrics="all", cumulative=True)
    assert list(with_auc.columns)[-2:] == ["ROC_AUC", "PR_AUC"] and "P@1" in with_auc.columns


def test_negative_test_values_follow_recometrics(data):
    x_train, x_test, a, b = data
    x_neg = x_test.copy()
    x_neg.data[::3] *= -1.0
    x_neg.data[x_neg.indptr[5]: x_neg.indptr[6]] = -1.0  # user 5: no positive value -> NDCG NaN
    ref = recometrics.calc_reco_metrics(x_train, x_neg, a, b, k=4, **ALL_FLAGS)
    got = evaluate_factors(x_train, x_neg, a, b, k=4, metrics="all")
    _assert_same(got, ref)
    assert np.isnan(got["NDCG@4"][5]) and np.isfinite(got["AP@4"][5])


def test_float32_matches_recometrics_single_precision():
    x_train, x_test = _split(300, 80, 0.2, 5, graded=False)
    rng = np.random.default_rng(5)
    a = rng.standard_normal((300, 8)).astype(np.float32)
    b = rng.standard_normal((80, 8)).astype(np.float32)
    ref = recometrics.calc_reco_metrics(x_train.astype(np.float32), x_test.astype(np.float32), a, b, k=5,
                                        break_ties_with_noise=False, **ALL_FLAGS)
    got = evaluate_factors(x_train, x_test, a, b, k=5, metrics="all", as_df=False)
    assert all(v.dtype == torch.float64 for v in got.values())
    for col in ref.columns:
        np.testing.assert_allclose(got[col].numpy(), ref[col].to_numpy(), atol=1e-6, equal_nan=True, err_msg=col)


def test_input_forms_and_batches_agree(data):
    x_train, x_test, a, b = data
    want = evaluate_factors(x_train, x_test, a, b, k=4, metrics="all")
    ta, tb = torch.tensor(a), torch.tensor(b)
    forms = [
        (x_train.tocoo(), x_test.tocoo(), a, b, {}),
        (sp.csr_array(x_train), sp.csc_matrix(x_test), ta, tb, {}),
        (torch.tensor(x_train.toarray()).to_sparse_coo(), torch.tensor(x_test.toarray()).to_sparse_csr(), ta, tb, {}),
        (x_train.toarray(), x_test.toarray(), a, b, {"batch_size": 7}),
        (x_train, x_test, a, b, {"batch_size": 1, "ties": "average"}),
        (x_train, x_test, a, b, {"ties": "optimistic"}),
        (x_train, x_test, a, b, {"ties": "random"}),
    ]
    for tr, te, fa, fb, kw in forms:
        _assert_same(evaluate_factors(tr, te, fa, fb, k=4, metrics="all", **kw), want)
    x_unsorted = x_test.copy()
    x_unsorted.indices = x_unsorted.indices.copy()
    before = x_unsorted.copy()
    evaluate_factors(x_train, x_unsorted, a, b)
    assert (x_unsorted != before).nnz == 0  # inputs untouched


def test_names_dict_output_and_rename_k(data):
    x_train, x_test, a, b = data
    got = evaluate_factors(x_train, x_test, a, b, k=3, metrics=["ndcg", "hit@10", "auc", "pr_auc"], as_df=False)
    assert list(got) == ["NDCG@3", "Hit@10", "ROC_AUC", "PR_AUC"]
    assert all(isinstance(v, torch.Tensor) and v.shape == (x_test.shape[0],) for v in got.values())
    df = evaluate_factors(x_train, x_test, a, b, k=3, rename_k=False)
    ref = recometrics.calc_reco_metrics(x_train, x_test, a, b, k=3, rename_k=False, nthreads=1)
    assert list(df.columns) == list(ref.columns) == ["P@K", "AP@K", "NDCG@K"]


def test_ties_policies_on_tied_items():
    """Items with equal factors tie; pessimistic ranks them above the relevant item, optimistic below."""
    b = np.array([[1.0, 0.0], [1.0, 0.0], [0.5, 0.0], [0.0, 0.0]])
    a = np.array([[1.0, 0.0]])
    x_test = sp.csr_matrix(np.array([[1.0, 0, 0, 0]]))
    got = {t: evaluate_factors(None, x_test, a, b, k=1, metrics=["rr", "auc"], ties=t, as_df=False)
           for t in ("pessimistic", "optimistic", "average")}
    assert got["pessimistic"]["RR@1"].item() == 0.0 and got["optimistic"]["RR@1"].item() == 1.0
    assert got["pessimistic"]["ROC_AUC"].item() == pytest.approx(2 / 3)
    assert got["optimistic"]["ROC_AUC"].item() == 1.0
    assert got["average"]["ROC_AUC"].item() == pytest.approx(5 / 6)
    rr = [evaluate_factors(None, x_test, a, b, k=1, metrics=["rr"], break_ties_with_noise=True, seed=s,
                           as_df=False)["RR@1"].item() for s in range(1, 41)]
    assert set(rr) == {0.0, 1.0}  # noise breaks the tie both ways across seeds


def test_non_finite_items_and_overflow():
    rng = np.random.default_rng(0)
    a = rng.standard_normal((4, 3))
    b = rng.standard_normal((6, 3))
    b[5, 1] = np.inf
    x_test = sp.csr_matrix(np.array([[1.0, 0, 0, 0, 0, 0]] * 4))
    x_train = sp.csr_matrix(np.array([[0, 0, 0, 0, 0, 1.0], [0, 0, 0, 0, 0, 1.0], [0] * 6, [0] * 6]))
    got = evaluate_factors(x_train, x_test, a, b, k=2, metrics=["ndcg", "auc"])
    assert np.isfinite(got.to_numpy()[:2]).all() and np.isnan(got.to_numpy()[2:]).all()
    b2 = (np.abs(rng.standard_normal((6, 3))) + 1).astype(np.float32)
    a2 = a.astype(np.float32)
    a2[1] = 1e38  # finite factors whose scores overflow to +inf, for this user only
    a2[2] = -1e38  # ... and to -inf
    a2[3] = 1e37  # large but finite scores
    got = evaluate_factors(None, x_test, a2, b2, k=2, metrics=["ndcg"])
    assert np.isnan(got.to_numpy()[1:3]).all() and np.isfinite(got.to_numpy()[[0, 3]]).all()
    b2[4] = -1e38  # an item whose scores overflow is harmless when it is a training item of the user
    x_tr = sp.csr_matrix(np.array([[0, 0, 0, 0, 1.0, 0]] * 2 + [[0] * 6] * 2))
    a3 = np.full((4, 3), 2.0, dtype=np.float32)
    got = evaluate_factors(x_tr, x_test, a3, b2, k=2, metrics=["ndcg"])
    assert np.isfinite(got.to_numpy()[:2]).all() and np.isnan(got.to_numpy()[2:]).all()


def test_bad_input_names_the_argument(data):
    x_train, x_test, a, b = data
    with pytest.raises(ValueError, match="user_factors"):
        evaluate_factors(x_train, x_test, a[:-1], b)
    with pytest.raises(ValueError, match="item_factors"):
        evaluate_factors(x_train, x_test, a, b[:-1])
    with pytest.raises(ValueError, match="item_factors"):
        evaluate_factors(x_train, x_test, a, b[:, :-1])
    with pytest.raises(ValueError, match="X_train"):
        evaluate_factors(x_train[:-1], x_test, a, b)
    with pytest.raises(ValueError, match="item_biases"):
        evaluate_factors(x_train, x_test, a, b, item_biases=np.zeros(3))
    with pytest.raises(ValueError, match="item_biases"):
        evaluate_factors(x_train, x_test, None, None)
    overlap = x_train.copy().tolil()
    u, i = x_test.nonzero()
    overlap[u[0], i[0]] = 1.0
    with pytest.raises(ValueError, match="X_test.*overlap|X_test.*also in X_train"):
        evaluate_factors(overlap.tocsr(), x_test, a, b)
    nan_test = x_test.copy()
    nan_test.data[0] = np.nan
    with pytest.raises(ValueError, match="X_test"):
        evaluate_factors(x_train, nan_test, a, b)
    with pytest.raises(ValueError, match="k"):
        evaluate_factors(x_train, x_test, a, b, k=x_test.shape[1] + 1)
    with pytest.raises(ValueError, match="metric"):
        evaluate_factors(x_train, x_test, a, b, metrics=["nope"])
    with pytest.raises(ValueError, match="ties"):
        evaluate_factors(x_train, x_test, a, b, ties="sometimes")
    with pytest.raises(ValueError, match="^method: "):
        evaluate_factors(x_train, x_test, a, b, method="bv")


def _uniform_rows(n_users, n_items, n_train, n_test, seed):
    """Every user with n_train training and n_test test items (so every user has the same candidates)."""
    rng = np.random.default_rng(seed)
    picks = np.stack([rng.choice(n_items, n_train + n_test, replace=False) for _ in range(n_users)])
    rows = np.repeat(np.arange(n_users), n_train)
    x_train = sp.csr_matrix((np.ones(rows.size), (rows, picks[:, :n_train].ravel())), shape=(n_users, n_items))
    rows = np.repeat(np.arange(n_users), n_test)
    vals = rng.uniform(0.5, 2.0, rows.size)
    x_test = sp.csr_matrix((vals, (rows, picks[:, n_train:].ravel())), shape=(n_users, n_items))
    return x_train, x_test, rng.standard_normal((n_users, 4)), rng.standard_normal((n_items, 4))


def test_sampled_side_every_irrelevant_item_gives_the_exact_rank():
    """Without replacement and m = all irrelevant candidates, the sampled rank is the exact single-item rank."""
    x_train, x_test, a, b = _uniform_rows(40, 30, 5, 3, 0)
    res = evaluate_factors(x_train, x_test, a, b, k=5, metrics=["ndcg", "recall", "auc"], n_samples=SamplingDesign(22, replacement=False), batch_size=16)
    assert isinstance(res, FactorEvaluation)
    s = res.sampled
    assert s.sampled_ranks.shape == (40 * 3,) and bool((s.n_candidates == 23).all())
    assert torch.equal(s.sampled_ranks, s.exact_ranks)
    # the exact single-item ranks agree with exact_ranks(count_other_positives=False) on dense scores
    scores = torch.tensor(a @ b.T)
    pos = torch.tensor(x_test.toarray() != 0)
    want = exact_ranks(scores, pos, torch.tensor(x_train.toarray() != 0), count_other_positives=False)
    assert torch.equal(s.exact_ranks.reshape(40, 3), want)
    assert torch.equal(s.users, torch.arange(40).repeat_interleave(3))
    for name in ("NDCG@5", "R@5", "ROC_AUC"):
        row = res.summary.loc[name]
        assert row["exact"] == pytest.approx(row["sampled"], abs=1e-12)
    exact_auc = metric_values("auc", want.double(), 23).mean().item()
    assert res.summary.loc["ROC_AUC", "exact"] == pytest.approx(exact_auc, rel=1e-12)
    _assert_same(res.metrics, evaluate_factors(x_train, x_test, a, b, k=5, metrics=["ndcg", "recall", "auc"]))


def test_sampled_side_with_corrections():
    x_train, x_test, a, b = _uniform_rows(300, 200, 10, 4, 1)
    res = evaluate_factors(x_train, x_test, a, b, k=10, metrics=["recall", "ndcg", "auc"], n_samples=20,
                           method="none", seed=3)
    s = res.sampled
    assert bool((s.sampled_ranks >= 1).all()) and bool((s.sampled_ranks <= 21).all())
    top = s.exact_ranks == 1
    assert bool(top.any()) and bool((s.sampled_ranks[top] == 1).all())  # nothing can beat a top item
    for name, est in res.estimates.items():
        assert est.value == pytest.approx(res.summary.loc[name, "sampled"], rel=1e-12)
    bv = evaluate_factors(x_train, x_test, a, b, k=10, metrics=["recall", "auc"], n_samples=20,
                          method="bv", seed=3, as_df=False)
    # sampled AUC is unbiased; the corrected recall lands near the exact one (random factors: recall ~ 10/190)
    auc = bv.summary["ROC_AUC"]
    assert abs(auc["corrected"] - auc["exact"]) < 4 * auc["stderr"] + 0.01
    rec = bv.summary["R@10"]
    assert abs(rec["corrected"] - rec["exact"]) < abs(rec["sampled"] - rec["exact"])
    assert math.isfinite(rec["stderr"]) and rec["stderr"] > 0


def test_sampled_evaluation_estimates_with_auto_by_default():
    """``n_samples`` without ``method``: the estimates of every entry point's default estimator (``auto``), equal to
    ``method="auto"`` on the same draws; none under ``ties="average"`` (fractional sampled ranks)."""
    from reco_sampled_plugin.registry import DEFAULT_ESTIMATOR

    x_train, x_test, a, b = _uniform_rows(200, 300, 10, 2, 7)
    kw = dict(k=10, metrics=["recall", "ndcg"], n_samples=20, seed=3, as_df=False)
    plain = evaluate_factors(x_train, x_test, a, b, **kw)
    auto = evaluate_factors(x_train, x_test, a, b, method=DEFAULT_ESTIMATOR, **kw)
    assert DEFAULT_ESTIMATOR == "auto" and sorted(plain.estimates) == sorted(auto.estimates) == ["NDCG@10", "R@10"]
    for name, est in plain.estimates.items():
        assert (est.value, est.stderr, est.flags) == (auto.estimates[name].value, auto.estimates[name].stderr, auto.estimates[name].flags)
        assert plain.summary[name]["corrected"] == est.value
    assert evaluate_factors(x_train, x_test, a, b, ties="average", **kw).estimates == {}
    # no evaluated user (min_pos_test above every user's test items): NaN rows, no estimate; a method asked for: named
    empty = evaluate_factors(x_train, x_test, a, b, min_pos_test=100, **kw)
    assert empty.estimates == {} and all(math.isnan(v) for v in empty.metrics["R@10"].tolist())
    with pytest.raises(ValueError, match=r"^method: no test item could be sampled"):
        evaluate_factors(x_train, x_test, a, b, min_pos_test=100, method="auto", **kw)


def test_adaptive_sampling_equals_the_core_on_the_same_draws():
    """evaluate_factors(adaptive_max=) draws exactly what adaptive_sampled_ranks draws from the same scores and
    generator, and its estimates are estimate(adaptive=) of those draws, with the cost next to them."""
    from reco_sampled_plugin import estimate
    from reco_sampled_plugin.adaptive import adaptive_sampled_ranks

    x_train, x_test, a, b = _uniform_rows(200, 3000, 10, 2, 4)
    res = evaluate_factors(x_train, x_test, a, b, k=10, metrics=["ndcg", "hit"], n_samples=SamplingDesign(10, adaptive_max=160),
                           method="mes", seed=5)
    s = res.sampled
    assert s.adaptive_max == 160 and s.n_samples == 10
    assert set(s.sample_sizes.unique().tolist()) <= {10, 20, 40, 80, 160}
    assert not bool(((s.sampled_ranks == 1) & (s.sample_sizes < 160)).any())
    # the core on the same scores (training items at -inf, as the buffer holds them) and the same generator
    scores = torch.tensor(a @ b.T, dtype=torch.float64)
    scores[torch.tensor(x_train.toarray() != 0)] = -math.inf
    pos = torch.tensor(np.stack([np.sort(x_test[u].indices) for u in range(200)]))
    exc = torch.tensor(np.stack([np.sort(x_train[u].indices) for u in range(200)]))
    drawn = adaptive_sampled_ranks(scores, pos, SamplingDesign(10, adaptive_max=160), exclude=exc,
                                   generator=torch.Generator().manual_seed(5), check_finite=False)
    ranks, sizes = drawn.ranks, drawn.n_samples
    order = torch.argsort(s.users * 3000 + s.items)
    assert torch.equal(s.sampled_ranks[order], ranks.reshape(-1))
    assert torch.equal(s.sample_sizes[order], sizes.reshape(-1))
    for name in ("NDCG@10", "Hit@10"):
        core = estimate(
            name.lower(),
            SampledRanks.from_arrays(s.sampled_ranks, s.n_candidates, s.sample_sizes,
                                     SamplingDesign(10, adaptive_max=160)),
            "mes",
        )  # the correction asked for above
        assert res.estimates[name].value == core.value and res.estimates[name].stderr == core.stderr
        row = res.summary.loc[name]
        assert row["mean_samples"] == pytest.approx(float(s.sample_sizes.double().mean()))
        assert row["max_samples"] == int(s.sample_sizes.max())
        assert row["share_at_cap"] == pytest.approx(float((s.sample_sizes == 160).double().mean()))
        assert row["lo"] <= row["corrected"] <= row["hi"]
    for design_kw, kwargs, msg in (
        ({"adaptive_max": 5}, {}, "adaptive_max"),
        ({"adaptive_max": 160, "replacement": False}, {}, "with replacement"),
        ({"adaptive_max": 160}, {"method": "bv"}, "fixed m"),
    ):
        with pytest.raises(ValueError, match=msg):
            evaluate_factors(x_train, x_test, a, b, k=10, n_samples=SamplingDesign(10, **design_kw), **kwargs)


def test_sampled_ranks_under_average_ties_are_expectations_the_estimators_refuse():
    """Four irrelevant items tie with the test item, one scores below: under ``ties="average"`` each tied draw counts
    one half, r~ = 1 + (tied draws)/2 (the expected sampled rank over the orders of the ties, 2.5 where all m = 3
    draws tie); evaluate_factors reports such ranks and their uncorrected metric, and an estimator, which reads whole
    ranks, is refused naming ``ties='random'`` (in evaluate_factors and in the core alike); ``ties="random"`` gives
    whole ranks that it estimates from."""
    b = np.array([[1.0, 0.0]] * 5 + [[0.0, 0.0]])
    a = np.tile([[1.0, 0.0]], (20, 1))
    x_test = sp.csr_matrix(np.tile([[1.0, 0, 0, 0, 0, 0]], (20, 1)))
    res = evaluate_factors(None, x_test, a, b, k=1, metrics=["rr"], ties="average", n_samples=3, as_df=False)
    r = res.sampled.sampled_ranks
    assert set(r.tolist()) <= {1.0, 1.5, 2.0, 2.5} and bool((r != r.round()).any())
    assert res.sampled.exact_ranks.tolist() == [3.0] * 20  # 1 + 4/2
    assert res.summary["RR@1"]["sampled"] == pytest.approx(float((r == 1.0).double().mean()))
    refusal = r"^sample: fractional sampled ranks \(ties='average'.*ties='random'"
    with pytest.raises(ValueError, match=refusal):
        evaluate_factors(None, x_test, a, b, k=1, metrics=["rr"], ties="average", n_samples=3, method="none")
    scores = torch.tensor([[1.0] * 5 + [0.0]] * 20)
    pos = torch.zeros(20, dtype=torch.int64)
    drawn = rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(3), ties="average",
                              generator=torch.Generator().manual_seed(0))
    assert bool((drawn.ranks != drawn.ranks.round()).any())
    with pytest.raises(ValueError, match=refusal):
        rsp.estimate("mrr", drawn, "none")
    whole = rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(3), ties="random",
                              generator=torch.Generator().manual_seed(0))
    assert bool((whole.ranks == whole.ranks.round()).all())
    assert math.isfinite(rsp.estimate("mrr", whole, "none").value)
