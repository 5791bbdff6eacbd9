"""Real-data layer: file reading, binarisation and the leave-last-out split (Krichene & Rendle section 6)."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from collections import defaultdict

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

from reco_sampled_plugin import datasets
from reco_sampled_plugin.datasets import (
    Interactions,
    binarize,
    leave_last_out,
    load_interactions,
    load_ml100k,
    ml100k_path,
)


def _write(tmp_path, name: str, text: str) -> str:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


def _interactions(users, items, times=None, ratings=None) -> Interactions:
    users, items = np.asarray(users, dtype=np.int64), np.asarray(items, dtype=np.int64)
    n_users = int(users.max()) + 1 if len(users) else 0
    n_items = int(items.max()) + 1 if len(items) else 0
    return Interactions(
        user=users,
        item=items,
        rating=None if ratings is None else np.asarray(ratings, dtype=np.float64),
        timestamp=None if times is None else np.asarray(times, dtype=np.float64),
        user_ids=np.arange(n_users).astype(str),
        item_ids=np.arange(n_items).astype(str),
    )


def _oracle_split(users, items, times):
    """Brute-force leave-last-out: per user, latest event by (time, line); needs >= 2 distinct items."""
    events = defaultdict(list)
    for pos, (u, i, t) in enumerate(zip(users, items, times)):
        events[u].append((t, pos, i))
    test, train = {}, {}
    for u, evs in events.items():
        distinct = {i for _, _, i in evs}
        if len(distinct) >= 2:
            last = max(evs)[2]
            test[u] = last
            train[u] = distinct - {last}
        else:
            train[u] = distinct
    return test, train


# --------------------------------------------------------------------------- MovieLens 100k (real data)


@pytest.fixture(scope="module")
def ml100k():
    return load_ml100k()


def test_ml100k_path_is_the_recbole_atomic_file():
    path = ml100k_path()
    assert path.endswith(os.path.join("recbole", "dataset_example", "ml-100k", "ml-100k.inter"))
    with open(path, encoding="utf-8") as fh:
        assert fh.readline().split() == ["user_id:token", "item_id:token", "rating:float", "timestamp:float"]


def test_ml100k_path_does_not_import_recbole():
    code = (
        "import sys; from reco_sampled_plugin.datasets import ml100k_path; p = ml100k_path(); "
        "assert 'recbole' not in sys.modules, 'recbole was imported'; print(p)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().endswith("ml-100k.inter")


def test_ml100k_path_without_recbole_says_what_to_install(monkeypatch):
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="recbole"):
        ml100k_path()


def test_ml100k_counts_and_columns(ml100k):
    inter = ml100k.interactions
    assert (inter.n_users, inter.n_items, len(inter)) == (943, 1682, 100_000)
    assert inter.user.dtype == np.int64 and inter.item.dtype == np.int64
    assert inter.timestamp.dtype == np.float64
    raw = load_interactions(ml100k_path())
    assert set(np.unique(raw.rating)) == {1.0, 2.0, 3.0, 4.0, 5.0}
    # First line of the file: 196 242 3 881250949; index 0 maps back to those raw ids.
    assert (raw.user_ids[raw.user[0]], raw.item_ids[raw.item[0]]) == ("196", "242")
    assert raw.rating[0] == 3.0 and raw.timestamp[0] == 881250949.0
    assert sorted(raw.user_ids.astype(int)) == list(range(1, 944))
    assert sorted(raw.item_ids.astype(int)) == list(range(1, 1683))


def test_ml100k_split_invariants(ml100k):
    inter, train, test = ml100k.interactions, ml100k.train, ml100k.test_items
    assert train.shape == (943, 1682) and train.format == "csr" and set(np.unique(train.data)) == {1.0}
    # Every user has >= 20 ratings, so every user gets a test item; no repeated pairs in ml-100k.
    assert ml100k.n_test == 943 and ml100k.n_single == 0 and ml100k.n_dropped_duplicates == 0
    assert ml100k.n_train + ml100k.n_test == 100_000
    # Each test item is its user's latest event (ties: the later line), never in the user's train row.
    for u in range(943):
        rows = np.flatnonzero(inter.user == u)
        latest = rows[np.lexsort((rows, inter.timestamp[rows]))[-1]]
        assert test[u] == inter.item[latest]
        assert train[u, test[u]] == 0
    # train + test = all events, as sets of (user, item) pairs.
    all_pairs = set(zip(inter.user.tolist(), inter.item.tolist()))
    coo = train.tocoo()
    train_pairs = set(zip(coo.row.tolist(), coo.col.tolist()))
    test_pairs = {(u, int(test[u])) for u in range(943)}
    assert train_pairs.isdisjoint(test_pairs)
    assert train_pairs | test_pairs == all_pairs


def test_ml100k_has_timestamp_ties_and_they_follow_line_order(ml100k):
    # The tie rule matters on this data: some users have several events at their latest timestamp.
    inter = ml100k.interactions
    order = np.lexsort((inter.timestamp, inter.user))
    last = np.r_[inter.user[order][1:] != inter.user[order][:-1], True]
    latest_time = np.full(943, -np.inf)
    latest_time[inter.user[order][last]] = inter.timestamp[order][last]
    n_tied = np.bincount(inter.user[inter.timestamp == latest_time[inter.user]], minlength=943)
    assert (n_tied > 1).sum() > 10


def test_binarize_threshold_on_ml100k():
    inter = load_interactions(ml100k_path())
    kept = binarize(inter, threshold=4)
    assert len(kept) == int((inter.rating >= 4).sum()) and 0 < len(kept) < len(inter)
    assert (kept.rating == 1.0).all()
    assert (kept.n_users, kept.n_items) == (943, 1682)  # index space unchanged
    assert len(binarize(inter)) == 100_000
    split = load_ml100k(threshold=4)
    assert split.n_train + split.n_test + split.n_dropped_duplicates == len(kept)


# --------------------------------------------------------------------------- file formats


def test_recbole_header_columns_chosen_by_name(tmp_path):
    text = "timestamp:float\titem_id:token\tuser_id:token\trating:float\n10\ta\tu1\t5\n11\tb\tu2\t3\n"
    inter = load_interactions(_write(tmp_path, "x.inter", text))
    assert list(inter.user_ids[inter.user]) == ["u1", "u2"]
    assert list(inter.item_ids[inter.item]) == ["a", "b"]
    assert inter.rating.tolist() == [5.0, 3.0] and inter.timestamp.tolist() == [10.0, 11.0]


@pytest.mark.parametrize(
    "name, text",
    [
        ("h.csv", "userId,movieId,rating,timestamp\n7,x,4.5,100\n8,y,1,50\n7,y,2,300\n"),
        ("n.csv", "7,x,4.5,100\n8,y,1,50\n7,y,2,300\n"),
        ("n.tsv", "7\tx\t4.5\t100\n8\ty\t1\t50\n\n7\ty\t2\t300\n"),
        ("ratings.dat", "7::x::4.5::100\n8::y::1::50\n7::y::2::300\n"),
        ("w.txt", "7 x 4.5 100\n8  y 1 50\n7 y\t2 300\n"),
    ],
)
def test_plain_files_with_and_without_header(tmp_path, name, text):
    inter = load_interactions(_write(tmp_path, name, text))
    assert list(inter.user_ids) == ["7", "8"] and list(inter.item_ids) == ["x", "y"]
    assert inter.user.tolist() == [0, 1, 0] and inter.item.tolist() == [0, 1, 1]
    assert inter.rating.tolist() == [4.5, 1.0, 2.0] and inter.timestamp.tolist() == [100.0, 50.0, 300.0]


def test_two_column_file_uses_line_order_as_time(tmp_path):
    inter = load_interactions(_write(tmp_path, "p.csv", "user,item\n1,a\n1,b\n2,a\n1,c\n1,a\n"))
    assert inter.rating is None and inter.timestamp is None
    split = leave_last_out(inter)
    # user 1's last line is (1, a): a is held out and its earlier event is dropped from train.
    assert split.test_items.tolist() == [0, -1]
    assert split.train[0].indices.tolist() == [1, 2]
    assert split.n_dropped_duplicates == 1 and split.n_single == 1
    assert split.train[1].indices.tolist() == [0]  # single-event user keeps it in train
    with pytest.raises(ValueError, match="threshold"):
        binarize(inter, threshold=3)


@pytest.mark.parametrize(
    "text, line, what",
    [
        ("user_id:token\titem_id:token\trating:float\n1\t2\t3\n1\t3\n", 3, "expected 3 fields, got 2"),
        ("1,2,3,100\n1,3,4,101\n2,5,x,7\n", 3, "rating 'x' is not a number"),
        ("u,i,rating,timestamp\n1,2,3,100\n\n1,3,4,nan\n", 4, "timestamp 'nan' is not finite"),
        ("1\t2\n\t3\n", 2, "empty user or item id"),
        ("1,2,3,4\n1,2,3,4,5\n", 2, "expected 4 fields, got 5"),
    ],
)
def test_malformed_lines_name_the_line(tmp_path, text, line, what):
    path = _write(tmp_path, "bad.csv", text)
    with pytest.raises(ValueError, match=rf"bad\.csv:{line}: ") as err:
        load_interactions(path)
    assert what in str(err.value)


@pytest.mark.parametrize("text", ["", "\n\n", "user_id:token\titem_id:token\n"])
def test_files_without_interactions(tmp_path, text):
    with pytest.raises(ValueError, match="no interactions"):
        load_interactions(_write(tmp_path, "empty.inter", text))


def test_missing_file():
    with pytest.raises(FileNotFoundError):
        load_interactions("/nonexistent/ratings.csv")


# --------------------------------------------------------------------------- split rules and properties


def test_timestamp_ties_hold_out_the_later_line():
    inter = _interactions([0, 0, 0, 1, 1], [0, 1, 2, 2, 1], times=[5, 9, 9, 3, 3])
    split = leave_last_out(inter)
    assert split.test_items.tolist() == [2, 1]
    assert split.train[0].indices.tolist() == [0, 1] and split.train[1].indices.tolist() == [2]


def test_user_without_events_has_no_test_item():
    inter = Interactions(
        user=np.array([0, 0], dtype=np.int64),
        item=np.array([0, 1], dtype=np.int64),
        rating=None,
        timestamp=np.array([2.0, 1.0]),
        user_ids=np.array(["a", "b"]),
        item_ids=np.array(["x", "y", "z"]),
    )
    split = leave_last_out(inter)
    assert split.test_items.tolist() == [0, -1] and split.train.shape == (2, 3)
    assert split.test_users.tolist() == [0] and split.n_test == 1 and split.n_single == 0


events = st.lists(
    st.tuples(st.integers(0, 5), st.integers(0, 7), st.integers(0, 4)), min_size=1, max_size=40
)


@settings(max_examples=examples(150), deadline=None)
@given(events, st.booleans())
def test_split_matches_brute_force(evs, with_time):
    users, items, times = (list(c) for c in zip(*evs))
    line_times = times if with_time else list(range(len(users)))
    inter = _interactions(users, items, times=times if with_time else None)
    split = leave_last_out(inter)
    test, train = _oracle_split(users, items, line_times)
    n_users = max(users) + 1
    assert split.test_items.dtype == np.int64 and split.test_items.shape == (n_users,)
    for u in range(n_users):
        assert split.test_items[u] == test.get(u, -1)
        assert set(split.train[u].indices.tolist()) == train.get(u, set())
        if split.test_items[u] >= 0:
            assert split.train[u, split.test_items[u]] == 0
    # Distinct pairs are conserved: train + test = all, disjoint.
    n_pairs = len(set(zip(users, items)))
    assert split.n_train + split.n_test == n_pairs
    assert split.n_dropped_duplicates == sum(
        sum(1 for uu, ii in zip(users, items) if uu == u and ii == t) - 1 for u, t in test.items()
    )
    assert split.n_single == sum(1 for u in set(users) if len({i for uu, i in zip(users, items) if uu == u}) == 1)


tokens = st.text(alphabet="abcXYZ019_-.", min_size=1, max_size=4)


@settings(max_examples=examples(60), deadline=None)
@given(st.lists(st.tuples(tokens, tokens, st.integers(1, 5), st.integers(0, 10**9)), min_size=1, max_size=30))
def test_raw_ids_round_trip_through_a_file(rows):
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "r.tsv")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write("user_id:token\titem_id:token\trating:float\ttimestamp:float\n")
            fh.writelines(f"{u}\t{i}\t{r}\t{t}\n" for u, i, r, t in rows)
        inter = load_interactions(path)
    assert list(inter.user_ids[inter.user]) == [r[0] for r in rows]
    assert list(inter.item_ids[inter.item]) == [r[1] for r in rows]
    # Indices are contiguous, in order of first appearance.
    assert list(inter.user_ids) == list(dict.fromkeys(r[0] for r in rows))
    assert list(inter.item_ids) == list(dict.fromkeys(r[1] for r in rows))
    assert inter.timestamp.tolist() == [float(r[3]) for r in rows]


def test_ml_latest_small_vendored_with_its_licence_and_split():
    """The vendored MovieLens latest-small: read through gzip, the GroupLens README (licence) beside it, the
    file's own counts (100,836 ratings of 610 users on 9,724 rated movies, plus one last line of a user with a
    single event), and a leave-last-out split whose test items are each user's latest event (brute force)."""
    import gzip
    import os

    from reco_sampled_plugin.datasets import load_ml_latest_small, ml_latest_small_path

    path = ml_latest_small_path()
    readme = os.path.join(os.path.dirname(path), "README.txt")
    assert "Usage License" in open(readme, encoding="utf-8").read()
    with gzip.open(path, "rt", encoding="utf-8") as fh:
        lines = fh.read().splitlines()
    assert lines[0] == "userId,movieId,rating,timestamp" and len(lines) == 1 + 100_837
    split = load_ml_latest_small()
    inter = split.interactions
    assert (inter.n_users, inter.n_items, len(inter)) == (611, 9725, 100_837)
    assert split.n_test == 610 and split.n_single == 1  # the appended user with one event keeps it in train
    assert split.n_train + split.n_test == 100_837 - split.n_dropped_duplicates
    users = split.test_users
    for u in users[:: 37]:
        rows = np.flatnonzero(inter.user == u)
        latest = rows[np.lexsort((rows, inter.timestamp[rows]))[-1]]
        assert split.test_items[u] == inter.item[latest] and split.train[u, split.test_items[u]] == 0
    n_u = split.n_items - np.diff(split.train[users].indptr)
    assert (n_u.min(), n_u.max()) == (7028, 9706)  # every user rated >= 20 movies; about 96 exact ranks per sampled rank at m = 100
