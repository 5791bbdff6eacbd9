"""split_train_test follows recometrics' split rules; leave_last_out_split holds out the latest interaction."""

import numpy as np
import pytest
import recometrics
import scipy.sparse as sp
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

from reco_sampled_plugin.splits import leave_last_out_split, split_train_test


def _random_x(n_users, n_items, density, seed):
    x = sp.random(n_users, n_items, density=density, format="csr", random_state=seed)
    x.data = np.round(np.abs(x.data) * 10) + 1.0
    return x


def _round(x):
    return np.floor(np.asarray(x) * 1.0 + 0.5).astype(int)


def _check_parts(x, users, x_train, x_test, fraction):
    """Train and test partition the users' rows of x (values kept), test sizes are round(e * fraction)."""
    sub = x[users]
    assert x_train.shape == x_test.shape == sub.shape
    overlap = (x_train != 0).multiply(x_test != 0)
    assert overlap.nnz == 0
    assert abs(x_train + x_test - sub).max() == 0
    np.testing.assert_array_equal(np.diff(x_test.indptr), _round(np.diff(sub.indptr) * fraction))


split_args = st.fixed_dictionaries(
    {
        "n_users": st.integers(2, 40),
        "n_items": st.integers(3, 30),
        "density": st.floats(0.05, 0.9),
        "data_seed": st.integers(0, 10_000),
        "items_test_fraction": st.floats(0.05, 0.95),
        "users_test_fraction": st.one_of(st.none(), st.floats(0.01, 0.99)),
        "max_test_users": st.integers(1, 50),
        "min_items_pool": st.integers(0, 5),
        "min_pos_test": st.integers(0, 3),
        "consider_cold_start": st.booleans(),
        "seed": st.integers(0, 2**31),
    }
)


@settings(max_examples=examples(60), deadline=None)
@given(split_args)
def test_split_invariants(args):
    x = _random_x(args.pop("n_users"), args.pop("n_items"), args.pop("density"), args.pop("data_seed"))
    n_users, n_items = x.shape
    if x.nnz == 0 or args["min_items_pool"] >= n_items or args["min_pos_test"] >= n_items:
        with pytest.raises(ValueError):
            split_train_test(x, "separated", **args)
        return
    f = args["items_test_fraction"]
    # all: every user split
    x_train, x_test = split_train_test(x, "all", items_test_fraction=f, seed=args["seed"])
    _check_parts(x, np.arange(n_users), x_train, x_test, f)
    # separated: eligible users only, as many as asked when there are enough
    e = np.diff(x.indptr)
    t = _round(e * f)
    eligible = (e > 0) & (t >= args["min_pos_test"]) & (n_items - (e - t) >= args["min_items_pool"]) & (e + 1 < n_items)
    if not args["consider_cold_start"]:
        eligible &= t < e
    if args["users_test_fraction"] is None:
        n_take = args["max_test_users"]
    else:
        n_take = min(max(int(round(max(n_users * args["users_test_fraction"], 1))), 1), args["max_test_users"])
    if not eligible.any():
        with pytest.raises(ValueError, match="criteria"):
            split_train_test(x, "separated", **args)
        return
    with pytest.warns(UserWarning) if args["users_test_fraction"] is not None and n_users * args[
        "users_test_fraction"
    ] < 1 else _nullcontext():
        x_train, x_test, x_rem, users = split_train_test(x, "separated", **args)
    assert np.all(np.diff(users) > 0) and eligible[users].all()
    assert len(users) == min(n_take, int(eligible.sum()))
    _check_parts(x, users, x_train, x_test, f)
    rest = np.setdiff1d(np.arange(n_users), users)
    assert abs(x_rem - x[rest]).max() == 0 if len(rest) else x_rem.shape[0] == 0
    if not args["consider_cold_start"]:
        assert (np.diff(x_train.indptr) > 0).all()
    assert (np.diff(x_test.indptr) >= args["min_pos_test"]).all()
    assert (n_items - np.diff(x_train.indptr) >= args["min_items_pool"]).all()
    # joined: same users and test, train rows of the test users first, then the rest
    with pytest.warns(UserWarning) if args["users_test_fraction"] is not None and n_users * args[
        "users_test_fraction"
    ] < 1 else _nullcontext():
        j_train, j_test, j_users = split_train_test(x, "joined", **args)
    np.testing.assert_array_equal(j_users, users)
    assert abs(j_test - x_test).max() == 0 if x_test.nnz else j_test.nnz == 0
    assert abs(j_train - sp.vstack([x_train, x_rem])).max() == 0


class _nullcontext:
    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


@settings(max_examples=examples(25), deadline=None)
@given(st.integers(0, 10_000), st.integers(0, 2**31), st.sampled_from(["all", "separated", "joined"]))
def test_reproducible_from_the_seed(data_seed, seed, split_type):
    x = _random_x(30, 25, 0.4, data_seed)
    first = split_train_test(x, split_type, users_test_fraction=0.5, seed=seed)
    again = split_train_test(x, split_type, users_test_fraction=0.5, seed=seed)
    for a, b in zip(first, again):
        if sp.issparse(a):
            assert (a != b).nnz == 0 and a.shape == b.shape
        else:
            np.testing.assert_array_equal(a, b)


def test_different_seeds_give_different_splits():
    x = _random_x(50, 40, 0.5, 0)
    a = split_train_test(x, "all", seed=1)[1]
    b = split_train_test(x, "all", seed=2)[1]
    assert (a != b).nnz > 0


@pytest.mark.parametrize("cold", [False, True])
@pytest.mark.parametrize("fraction", [0.3, 0.5, 0.75])
def test_eligible_users_and_sizes_match_recometrics(cold, fraction):
    """Taking every eligible user, the test users and the per-user test sizes equal recometrics'.

    recometrics 0.1.6's Python function returns (X_rem, X_train, X_test, users_test) for 'separated', unlike its
    docstring (X_train, X_test, X_rem, users_test); we return the documented order."""
    x = _random_x(120, 30, 0.12, 7)
    x[5] = 0  # a user without interactions
    x.eliminate_zeros()
    opts = dict(users_test_fraction=None, max_test_users=120, items_test_fraction=fraction, min_items_pool=25,
                min_pos_test=2, consider_cold_start=cold, seed=3)
    ref_rem, ref_train, ref_test, ref_users = recometrics.split_reco_train_test(x, split_type="separated", **opts)
    x_train, x_test, x_rem, users = split_train_test(x, "separated", **opts)
    np.testing.assert_array_equal(users, ref_users)
    np.testing.assert_array_equal(np.diff(x_test.indptr), np.diff(ref_test.indptr))
    np.testing.assert_array_equal(np.diff(x_train.indptr), np.diff(ref_train.indptr))
    assert abs(x_rem - ref_rem).max() == 0
    ref_all = recometrics.split_reco_train_test(x, split_type="all", items_test_fraction=fraction, seed=3)
    got_all = split_train_test(x, "all", items_test_fraction=fraction, seed=3)
    for a, b in zip(got_all, ref_all):
        np.testing.assert_array_equal(np.diff(a.indptr), np.diff(b.indptr))


def test_input_forms_and_output_types():
    x = _random_x(20, 15, 0.4, 1)
    tr, te = split_train_test(x, "all", seed=4)
    assert isinstance(tr, sp.csr_matrix) and tr.dtype == np.float64
    tr2, te2 = split_train_test(sp.csr_array(x.astype(np.float32)), "all", seed=4)
    assert isinstance(tr2, sp.csr_array) and tr2.dtype == np.float32
    tr3, te3 = split_train_test(torch.tensor(x.toarray()).to_sparse_coo(), "all", seed=4)
    tr4, te4 = split_train_test(x.toarray(), "all", seed=4)
    for a in (tr3, tr4):
        assert (a != tr).nnz == 0
    before = x.copy()
    split_train_test(x, "separated", seed=4)
    assert (x != before).nnz == 0


def test_bad_arguments_name_themselves():
    x = _random_x(20, 15, 0.4, 1)
    with pytest.raises(ValueError, match="split_type"):
        split_train_test(x, "random")
    with pytest.raises(ValueError, match="items_test_fraction"):
        split_train_test(x, "all", items_test_fraction=1.0)
    with pytest.raises(ValueError, match="users_test_fraction"):
        split_train_test(x, "separated", users_test_fraction=0.0)
    with pytest.raises(ValueError, match="min_items_pool"):
        split_train_test(x, "separated", min_items_pool=15)
    with pytest.raises(ValueError, match="min_pos_test"):
        split_train_test(x, "separated", min_pos_test=-1)
    with pytest.raises(ValueError, match="X"):
        split_train_test(sp.csr_matrix((5, 5)), "all")
    with pytest.raises(ValueError, match="criteria"):
        split_train_test(x, "separated", min_pos_test=14)


def test_leave_last_out_split_holds_out_the_latest_item():
    rng = np.random.default_rng(0)
    x = _random_x(60, 30, 0.2, 2)
    x[7] = 0
    x[8] = 0
    x[8, 3] = 5.0  # a single interaction: stays in train
    x.eliminate_zeros()
    ts = x.copy()
    ts.data = rng.permutation(ts.nnz).astype(float)
    tr, te = leave_last_out_split(x, ts)
    assert abs(tr + te - x).max() == 0 and (tr != 0).multiply(te != 0).nnz == 0
    counts = np.diff(x.indptr)
    np.testing.assert_array_equal(np.diff(te.indptr), (counts >= 2).astype(int))
    for u in np.flatnonzero(counts >= 2):
        row = ts[u]
        assert te[u].indices[0] == row.indices[np.argmax(row.data)]
    # the same from dense timestamps and from values aligned with the stored entries
    for form in (ts.toarray(), ts.data):
        tr2, te2 = leave_last_out_split(x, form)
        assert (te2 != te).nnz == 0 and (tr2 != tr).nnz == 0
    with pytest.raises(ValueError, match="timestamps"):
        leave_last_out_split(x, np.zeros(3))
    assert 0.0 in ts.data  # an explicit 0 stored in the sparse timestamps is a time (taken above)
    holed = ts.tolil()
    holed[0, x[0].indices[0]] = 0  # the entry removed: X's pattern no longer (read as time 0 before)
    holed = holed.tocsr()
    holed.eliminate_zeros()
    with pytest.raises(ValueError, match=r"^timestamps: \d+ of X's stored entries have no entry in the sparse timestamps"):
        leave_last_out_split(x, holed)
