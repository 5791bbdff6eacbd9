"""Bad input to the core gives a ValueError naming the argument (never NaN, a deep RuntimeError, a
hang or a wrong number); empty batches give empty results. Classes: empty batches, sizes (n_items / n_samples),
rank inputs, overflow. Validation lives in ``_checks.py`` (check_sizes, check_rank_values, check_weights)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import example, given, settings
from hypothesis import strategies as st
from _profiles import examples

import reco_sampled_plugin as rsp
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.corrections import correction_table, expected_corrected
from reco_sampled_plugin.metrics import metric_curve
from reco_sampled_plugin.rank_distribution import fit_rank_distribution
from reco_sampled_plugin.sampling_laws import expected_sampled, sampled_rank_pmf
from reco_sampled_plugin.user_metrics import user_metric_values
from reco_sampled_plugin._checks import MAX_SIZE, MAX_TOTAL_WEIGHT, check_rank_values, check_sizes, check_weights

L = torch.long


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# ------------------------------------------------------------------------------------------ empty batches
@pytest.mark.parametrize(
    "positives, kwargs",
    [
        (torch.zeros(0, 1, dtype=L), {}),
        (torch.zeros(0, 10, dtype=torch.bool), {}),
        (torch.zeros(0, 1, dtype=L), {"n_samples": rsp.SamplingDesign(3, replacement=False)}),
        (torch.zeros(0, 1, dtype=L), {"n_samples": rsp.SamplingDesign(3, popularity=torch.ones(10))}),
        (torch.zeros(0, 1, dtype=L), {"ties": "random"}),
        (torch.zeros(0, 1, dtype=L), {"ties": "average"}),
    ],
)
def test_sampled_ranks_of_zero_users_are_empty(positives, kwargs):
    out = rsp.sampled_ranks(torch.zeros(0, 10), positives, generator=_gen(), **{"n_samples": 3, **kwargs})
    p = positives.shape[1] if positives.dtype != torch.bool else 0
    assert out.ranks.shape == (0, p)
    assert out.n_candidates.shape == (0,) and out.n_candidates.dtype == torch.int64
    assert out.negatives.shape == (0, p, 3) and out.negatives.dtype == torch.int64


def test_sampled_ranks_of_zero_users_with_given_negatives():
    out = rsp.sampled_ranks(torch.zeros(0, 10), torch.zeros(0, 1, dtype=L), negatives=torch.zeros(0, 4, dtype=L))
    assert out.ranks.shape == (0, 1) and out.negatives.shape == (0, 1, 4)


def test_zero_user_batch_matches_the_end_of_a_loop():
    """A loop over user batches whose last batch is empty: the concatenation equals the one-shot result."""
    scores = torch.rand(5, 30, generator=_gen(1))
    pos = torch.tensor([[0, 1], [2, -1], [3, 4], [5, -1], [6, 7]])
    whole = rsp.sampled_ranks(scores, pos, 4, generator=_gen(2))
    g = _gen(2)
    parts = [rsp.sampled_ranks(scores[s:s + 5], pos[s:s + 5], 4, generator=g) for s in (0, 5)]
    assert parts[1].ranks.shape == (0, 2)
    assert torch.equal(torch.cat([p.ranks for p in parts]), whole.ranks)
    assert torch.equal(torch.cat([p.n_candidates for p in parts]), whole.n_candidates)


def test_adaptive_sampled_ranks_of_zero_users_are_empty():
    drawn = rsp.adaptive_sampled_ranks(torch.zeros(0, 10), torch.zeros(0, 1, dtype=L),
                                       rsp.SamplingDesign(2, adaptive_max=8), generator=_gen())
    ranks, sizes = drawn.ranks, drawn.n_samples
    assert ranks.shape == (0, 1) and sizes.shape == (0, 1) and sizes.dtype == torch.int64


def test_exact_ranks_of_zero_users_are_empty():
    r = rsp.exact_ranks(torch.zeros(0, 10), torch.zeros(0, 1, dtype=L), torch.zeros(0, 2, dtype=L))
    assert r.shape == (0, 1) and r.dtype == torch.int64


@pytest.mark.parametrize("positives", [torch.zeros(3, 1, dtype=L), torch.full((3, 1), -1), torch.zeros(3, dtype=L)])
def test_zero_items_is_a_value_error_naming_scores(positives):
    with pytest.raises(ValueError, match="scores: has 0 items"):
        rsp.exact_ranks(torch.zeros(3, 0), positives)
    with pytest.raises(ValueError, match="scores: has 0 items"):
        rsp.sampled_ranks(torch.zeros(3, 0), positives, 2)
    with pytest.raises(ValueError, match="scores: has 0 items"):
        rsp.per_user_metrics(torch.zeros(3, 0), positives, metrics=["auc"], as_frame=False)


def test_zero_items_with_an_empty_mask_gives_empty_ranks():
    r = rsp.exact_ranks(torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.bool))
    assert r.shape == (3, 0)
    s = rsp.sampled_ranks(torch.zeros(3, 0), torch.zeros(3, 0, dtype=torch.bool), 2)
    assert s.ranks.shape == (3, 0) and s.negatives.shape == (3, 0, 2)


def test_empty_rank_vectors_give_empty_values():
    empty = torch.zeros(0, dtype=L)
    for out in (
        rsp.metric_values("ndcg@10", empty, 20),
        expected_sampled("ndcg@10", empty, 20, 10),
        expected_corrected("ndcg@10", empty, 20, 10),
    ):
        assert out.shape == (0,) and out.dtype == torch.float64
    assert sampled_rank_pmf(empty, 20, 10).shape == (0, 11)
    assert rsp.draw_sampled_ranks(empty, 20, 10).shape == (1, 0)
    assert rsp.sampled_rank_histogram(empty, 20, 10).n_groups == 0
    assert user_metric_values("ndcg@10", torch.zeros(0, 2, dtype=L), torch.zeros(0, dtype=L)).shape == (0,)


def test_empty_batch_still_checks_the_settings():
    with pytest.raises(ValueError, match="method"):
        rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(torch.zeros(0, dtype=L), 20, 10), "nope")
    with pytest.raises(ValueError, match="n_items"):
        rsp.SampledRanks.from_arrays(torch.zeros(0, dtype=L), float("nan"), 10)


def test_estimate_of_nothing_names_sampled_ranks():
    with pytest.raises(ValueError, match="sampled_ranks"):
        rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(torch.zeros(0, dtype=L), 20, 10), "bv")


# ----------------------------------------------------------------------------------------------- sizes
@pytest.mark.parametrize(
    "n_items",
    [float("inf"), float("nan"), 2.5, True, torch.tensor([True, True]), torch.tensor([20 + 0j, 30 + 0j]),
     torch.tensor([float("inf"), 20.0]), 2**62, "ten"],
)
def test_metric_values_bad_n_items(n_items):
    with pytest.raises(ValueError, match="n_items"):
        rsp.metric_values("auc", torch.tensor([1, 1]), n_items)


def test_metric_values_auc_inf_n_is_an_error_not_nan():
    with pytest.raises(ValueError, match="n_items"):
        rsp.metric_values("auc", 1, float("inf"))


def test_metric_values_n_items_of_the_wrong_shape():
    with pytest.raises(ValueError, match="n_items: shape"):
        rsp.metric_values("hit@1", torch.tensor([1, 1, 1]), torch.tensor([2, 3]))


def test_metric_values_whole_float_n_and_per_instance_n_still_work():
    v = rsp.metric_values("auc", torch.tensor([1, 3, 5]), torch.tensor([5.0, 5.0, 9.0]))
    assert torch.allclose(v, torch.tensor([1.0, 0.5, 0.5], dtype=torch.float64))
    assert torch.allclose(rsp.metric_values("auc", torch.tensor([2]), 3.0), torch.tensor([0.5], dtype=torch.float64))


@pytest.mark.parametrize("n_items", [True, 0, 1.5, float("nan")])
def test_metric_curve_bad_n_items(n_items):
    with pytest.raises(ValueError, match="n_items"):
        metric_curve("auc", n_items)


@pytest.mark.parametrize(
    "fn",
    [
        lambda n: expected_sampled("hit@10", torch.tensor([1, 2]), n, 10),
        lambda n: sampled_rank_pmf(torch.tensor([1, 2]), n, 10),
        lambda n: expected_corrected("hit@10", torch.tensor([1, 2]), n, 10),
        lambda n: rsp.draw_sampled_ranks(torch.tensor([1, 2]), n, 10),
        lambda n: rsp.simulate_sampled_ranks(torch.tensor([1, 2]), n, 10),
        lambda n: rsp.sampled_rank_histogram(torch.tensor([1, 2]), n, 10),
        lambda n: rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(torch.tensor([1, 2]), n, 10)),
        lambda n: adaptive_sampled_ranks_from_exact(torch.tensor([1, 2]), n, rsp.SamplingDesign(2, adaptive_max=8)),
        lambda n: correction_table("hit@10", n, 10),
    ],
)
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 100.5, True, torch.tensor([100 + 0j, 100 + 0j]), 1e30])
def test_bad_n_items_everywhere(fn, bad):
    with pytest.raises(ValueError, match="n_items"):
        fn(bad)


def test_expected_sampled_nan_n_is_an_error_not_nan():
    with pytest.raises(ValueError, match="n_items"):
        expected_sampled("hit@10", torch.tensor([1, 2]), float("nan"), 10)


@pytest.mark.parametrize(
    "fn",
    [
        lambda n: expected_sampled("hit@10", torch.tensor([1, 2, 3]), n, 10),
        lambda n: rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 3]), n, 10), "bv"),
        lambda n: expected_corrected("hit@10", torch.tensor([1, 2, 3]), n, 10),
        lambda n: rsp.draw_sampled_ranks(torch.tensor([1, 2, 3]), n, 10),
        lambda n: rsp.sampled_rank_histogram(torch.tensor([1, 2, 3]), n, 10),
        lambda n: adaptive_sampled_ranks_from_exact(torch.tensor([1, 2, 3]), n, rsp.SamplingDesign(2, adaptive_max=8)),
    ],
)
def test_n_items_of_the_wrong_shape(fn):
    with pytest.raises(ValueError, match="n_items: shape"):
        fn(torch.tensor([100, 100]))


def test_n_must_broadcast_to_the_ranks():
    with pytest.raises(ValueError, match="n_items: shape"):
        rsp.SampledRanks.from_arrays(torch.tensor(1), torch.tensor([100, 200]), 10)
    v = rsp.estimate("hit@1", rsp.SampledRanks.from_arrays(torch.tensor([1, 1]), torch.tensor([100.0, 100.0]), 10),
                     "none")
    assert v.value == 1.0 and v.n_instances == 2


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), 2.5, True, 0])
def test_bad_n_samples_of_draws_and_histograms(bad):
    with pytest.raises(ValueError, match="n_samples"):
        rsp.draw_sampled_ranks(torch.tensor([1, 2]), 20, bad)
    with pytest.raises(ValueError, match="n_samples"):
        rsp.sampled_rank_histogram(torch.tensor([1, 2]), 100, bad)


@pytest.mark.parametrize("bad", [float("nan"), 10.5, torch.tensor([True])])
def test_user_metric_values_bad_n_candidates(bad):
    with pytest.raises(ValueError, match="n_candidates"):
        user_metric_values("auc", torch.tensor([[1, 2]]), bad)


def test_candidate_counts_bad_n_items():
    with pytest.raises(ValueError, match="n_items"):
        rsp.candidate_counts(float("nan"), torch.zeros(1, 1, dtype=L), None)
    assert torch.equal(rsp.candidate_counts(10, torch.tensor([[0, 1]]), torch.tensor([[5, -1]])), torch.tensor([9]))
    # an empty catalogue with positives names n_items (it spoke of a score matrix's columns); an empty mask is 0
    with pytest.raises(ValueError, match=r"^n_items: 0 items, so no positive can lie among them"):
        rsp.candidate_counts(0, torch.tensor([[0], [1]]), None)
    assert torch.equal(rsp.candidate_counts(0, torch.zeros(2, 0, dtype=torch.bool), None), torch.tensor([0, 0]))


@pytest.mark.parametrize("n", [np.array([100.5]), np.array([np.nan]), np.array([True])])
def test_rank_histogram_bad_n_items(n):
    with pytest.raises(ValueError, match="n_items"):
        rsp.RankHistogram(n, np.array([10]), (np.ones(11),))


@pytest.mark.parametrize("kwargs, named", [
    (dict(counts=None), "counts"), (dict(counts="abc"), "counts"), (dict(counts={"g": [1.0, 2.0]}), "counts"),
    (dict(counts=(["1", "2", "3"],)), "counts"), (dict(counts=(np.array([True, False, True]),)), "counts"),
    (dict(share="rows"), "share"), (dict(share=np.ones(3)), "share"),
], ids=["counts None", "counts str", "counts dict", "count strings", "count bools", "share str", "share array"])
def test_rank_histogram_counts_and_share_of_the_wrong_kind_are_named(kwargs, named):
    """Built by hand (a public constructor): counts must be one array of real numbers per group and share None or an
    exact share's rows; None was a TypeError, strings numpy's 'could not convert', a share an AttributeError later
    in the estimate."""
    args = dict(n_items=np.array([60]), n_samples=np.array([2]), counts=(np.array([1.0, 2.0, 3.0]),)) | kwargs
    with pytest.raises(ValueError, match=f"^{named}: "):
        rsp.RankHistogram(**args)
    assert rsp.RankHistogram(np.array([60]), np.array([2]), [[1, 2, 3]]).total == 6.0  # lists of ints still count


def test_histogram_groups_are_exact_at_the_size_bounds():
    """n up to 2^40 with m up to 2^24 (both MAX bounds): the (n, m) key n (max m + 1) + m left int64 and wrapped
    around, so the groups' n read 65536 where the ranks had 2^40 (a silent wrong histogram, and the planner's
    replicate fits refused its own draws naming sampled_ranks)."""
    n = torch.tensor([MAX_SIZE, MAX_SIZE, 5, MAX_SIZE])
    m = torch.tensor([1 << 24, 1 << 23, 3, 1 << 24])
    h = rsp.sampled_rank_histogram(torch.tensor([1, 2, 3, 4]), n, m)
    assert h.n_items.tolist() == [5, MAX_SIZE, MAX_SIZE] and h.n_samples.tolist() == [3, 1 << 23, 1 << 24]
    assert h.totals.tolist() == [1.0, 1.0, 2.0]


@settings(max_examples=examples(30), deadline=None)
@given(pairs=st.lists(st.tuples(st.integers(2, MAX_SIZE), st.integers(1, 1 << 24)), min_size=1, max_size=12),
       small=st.booleans())
def test_pair_groups_are_numpys_row_unique(pairs, small):
    """``_rank_hist.pair_groups`` (the one grouping by (n, m)): numpy's row-wise unique, whichever way it keys them."""
    from reco_sampled_plugin._rank_hist import pair_groups

    a = np.array(pairs, dtype=np.int64)
    if small:  # the packed key's range
        a = a % 1000 + 1
    n, m, gid = pair_groups(a[:, 0].copy(), a[:, 1].copy())
    rows, inv = np.unique(a, axis=0, return_inverse=True)
    assert n.tolist() == rows[:, 0].tolist() and m.tolist() == rows[:, 1].tolist()
    assert gid.tolist() == inv.reshape(-1).tolist()


def test_correction_table_whole_float_n_is_that_n():
    assert torch.equal(correction_table("hit@10", 100.0, 10, "rank_estimate"),
                       correction_table("hit@10", 100, 10, "rank_estimate"))


# ------------------------------------------------------------------------------------------ rank inputs
@pytest.mark.parametrize("ranks", [torch.tensor([True, True]), [True, True], torch.tensor([1 + 0j, 2 + 0j])])
def test_estimate_refuses_bool_and_complex_ranks(ranks):
    with pytest.raises(ValueError, match="sampled_ranks"):
        rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(ranks, 100, 10))
    with pytest.raises(ValueError, match="sampled_ranks"):
        rsp.sampled_rank_histogram(ranks, 100, 10)
    with pytest.raises(ValueError, match="sampled_ranks"):
        fit_rank_distribution(rsp.SampledRanks.from_arrays(ranks, 100, 10), rsp.registry.Mle(n_bootstrap=0))


def test_nan_sampled_rank_is_an_error_not_padding():
    with pytest.raises(ValueError, match="sampled_ranks: contains NaN"):
        rsp.sampled_rank_histogram(torch.tensor([1.0, float("nan")]), 100, 10)
    # 0 is the padding: ignored
    h = rsp.sampled_rank_histogram(torch.tensor([1.0, 0.0, 3.0]), 100, 10)
    assert h.total == 2.0 and h.counts[0][0] == 1.0 and h.counts[0][2] == 1.0


@pytest.mark.parametrize(
    "fn, name",
    [
        (lambda r: rsp.metric_values("hit@1", r, 10), "ranks"),
        (lambda r: expected_sampled("hit@1", r, 10, 3), "ranks"),
        (lambda r: sampled_rank_pmf(r, 10, 3), "ranks"),
        (lambda r: expected_corrected("hit@1", r, 10, 3), "exact_ranks"),
        (lambda r: rsp.draw_sampled_ranks(r, 10, 3), "exact_ranks"),
        (lambda r: rsp.simulate_sampled_ranks(r, 10, 3), "exact_ranks"),
        (lambda r: adaptive_sampled_ranks_from_exact(r, 100, rsp.SamplingDesign(2, adaptive_max=8)), "exact_ranks"),
    ],
)
@pytest.mark.parametrize("ranks", [torch.tensor([True]), torch.tensor([1 + 0j]), torch.tensor([float("nan")])])
def test_bad_exact_rank_values(fn, name, ranks):
    with pytest.raises(ValueError, match=name):
        fn(ranks)


@pytest.mark.parametrize(
    "fn",
    [
        lambda r: rsp.draw_sampled_ranks(r, 10, 3),
        lambda r: rsp.simulate_sampled_ranks(r, 10, 3),
        lambda r: adaptive_sampled_ranks_from_exact(r, 100, rsp.SamplingDesign(2, adaptive_max=8)),
    ],
)
def test_draws_need_whole_exact_ranks(fn):
    """1.5 used to be truncated to rank 1 silently."""
    with pytest.raises(ValueError, match="exact_ranks: must be whole"):
        fn(torch.tensor([1.5]))


def test_fractional_ranks_still_accepted_where_documented():
    v = rsp.metric_values("auc", torch.tensor([1.5]), 3)
    assert torch.allclose(v, torch.tensor([0.75], dtype=torch.float64))


@pytest.mark.parametrize("ranks", [torch.tensor([[1, 1]]), torch.tensor([[1.0, 1.0]]), torch.tensor([[3, 2, 3, 0]])])
def test_user_metric_values_refuses_duplicate_ranks(ranks):
    """user_metric_values takes exact_ranks(count_other_positives=True): one rank per relevant item."""
    with pytest.raises(ValueError, match="ranks: 1 user"):
        user_metric_values("precision@1", ranks, 10)


def test_user_metric_values_precision_was_above_one():
    with pytest.raises(ValueError, match="ranks"):
        user_metric_values("precision@1", torch.tensor([[1, 1]]), 10)
    with pytest.raises(ValueError, match="ranks"):  # AUC 1.0625 before
        user_metric_values("auc", torch.tensor([[1, 1]]), 10)
    with pytest.raises(ValueError, match="ranks"):  # two items at the last rank: AUC below 0
        user_metric_values("auc", torch.tensor([[10.0, 10.0]]), 10)


def test_user_metric_values_valid_rank_sets():
    assert torch.allclose(user_metric_values("precision@2", torch.tensor([[1, 3, 0]]), 10),
                          torch.tensor([0.5], dtype=torch.float64))
    # three tied relevant items at positions 1..3 share the average rank 2 (ties="average"): allowed
    assert torch.allclose(user_metric_values("auc", torch.tensor([[2.0, 2.0, 2.0]]), 10),
                          torch.tensor([1.0], dtype=torch.float64))
    # padding 0 repeats freely; the rows are independent
    v = user_metric_values("hit@1", torch.tensor([[1, 0, 0], [2, 1, 0]]), torch.tensor([10, 10]))
    assert torch.equal(v, torch.tensor([1.0, 1.0], dtype=torch.float64))


def test_user_metric_values_agree_with_per_user_metrics():
    scores = torch.rand(6, 40, generator=_gen(3))
    pos = torch.tensor([[0, 1, 2], [3, -1, -1], [4, 5, -1], [6, 7, 8], [9, -1, -1], [10, 11, 12]])
    for ties in ("pessimistic", "average", "random"):
        ranks = rsp.exact_ranks(scores, pos, ties=ties, generator=_gen(4))
        direct = user_metric_values("ndcg@10", ranks, 40)
        frame = rsp.per_user_metrics(scores, pos, metrics=["ndcg@10"], ties=ties, generator=_gen(4), as_frame=False)
        assert torch.allclose(direct, frame["NDCG@10"], equal_nan=True)


@pytest.mark.parametrize("ranks", [torch.tensor([[float("nan"), 1.0]]), torch.tensor([[True]]), torch.tensor([[1 + 0j]])])
def test_user_metric_values_bad_rank_values(ranks):
    with pytest.raises(ValueError, match="ranks"):
        user_metric_values("hit@1", ranks, 10)


def test_check_rank_values_keeps_dtype_and_names_the_argument():
    assert check_rank_values(torch.tensor([1, 2]), "r").dtype == torch.int64
    assert check_rank_values([1.5], "r").dtype == torch.float64
    with pytest.raises(ValueError, match="my_ranks"):
        check_rank_values(np.array([True]), "my_ranks")


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average", "random"])
def test_unchecked_nan_positive_is_dropped_under_every_tie_policy(ties):
    """``check_finite=False``: a relevant item scored NaN gets rank 0 (padding's mark: out of the metrics) whatever
    the tie policy (optimistic ranked it first, pessimistic 0); the row's other ranks are those with that item's
    slot as padding."""
    g = torch.Generator().manual_seed(1)
    s = torch.randn(2, 6, generator=g)
    s[0, 1] = math.nan
    pos = torch.tensor([[1, 2], [0, 4]])
    got = rsp.exact_ranks(s, pos, check_finite=False, ties=ties, generator=torch.Generator().manual_seed(0))
    padded = rsp.exact_ranks(s.nan_to_num(-1e9), torch.tensor([[-1, 2], [0, 4]]), ties=ties,
                             generator=torch.Generator().manual_seed(0))
    assert got[0, 0] == 0 and torch.equal(got.double(), padded.double())


def test_unchecked_nan_positive_in_per_user_metrics_under_average_ties():
    """``per_user_metrics(ties="average", check_finite=False)`` ranks by tie bounds ((B, P, 2)): the NaN positive's
    slot is dropped, the other rows are the checked call's (a broadcast error at 3 rows, or row 1's NDCG set to 0)."""
    nan = math.nan
    s = torch.tensor([[nan, .5, .4, .3, .2], [.9, .8, .7, .6, .5], [.9, .8, .7, .6, .5]])
    pos = torch.tensor([[0, 3], [1, 4], [1, 4]])
    got = rsp.per_user_metrics(s, pos, ("hit@1", "ndcg@3"), ties="average", check_finite=False, as_frame=False)
    want = rsp.per_user_metrics(s[1:], pos[1:], ("hit@1", "ndcg@3"), ties="average", as_frame=False)
    alone = rsp.per_user_metrics(s[:1].nan_to_num(-9.0), torch.tensor([[-1, 3]]), ("hit@1", "ndcg@3"), ties="average",
                                 as_frame=False)
    for name in ("Hit@1", "NDCG@3"):
        assert torch.equal(got[name][1:], want[name]) and torch.equal(got[name][:1], alone[name])


def test_an_integer_mask_is_named_as_one():
    """A 0/1 integer matrix of the scores' shape (a mask in the wrong dtype) reads as item indices: its duplicates'
    error says to pass it as bool; index lists with duplicates get the plain error."""
    s = torch.randn(3, 4)
    with pytest.raises(ValueError, match=r"^positives: 3 row\(s\) list the same item twice \(an integer 0/1 .*positives\.bool\(\)\)$"):
        rsp.exact_ranks(s, torch.tensor([[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 1]]))
    with pytest.raises(ValueError, match=r"^positives: 1 row\(s\) list the same item twice$"):
        rsp.exact_ranks(s, torch.tensor([[2, 2], [0, 1], [3, -1]]))
    ranks = rsp.exact_ranks(s, torch.tensor([[1, 0, 0, 1], [0, 1, 0, 0], [0, 0, 1, 1]]).bool())
    assert ranks.shape == (3, 2) and int((ranks > 0).sum()) == 5  # as a mask: five relevant items


def test_from_arrays_refuses_an_m_the_design_contradicts():
    """``SampledRanks.from_arrays(r, n, 4, SamplingDesign(8))`` kept both (the histogram read m = 4, the design 8);
    the same m, or either alone, is taken."""
    with pytest.raises(ValueError, match=r"^n_samples: m = 4 contradicts the design's m = 8"):
        rsp.SampledRanks.from_arrays(torch.tensor([1, 2]), 100, 4, rsp.SamplingDesign(8))
    for m, design in ((8, rsp.SamplingDesign(8)), (None, rsp.SamplingDesign(8)), (8, None)):
        got = rsp.SampledRanks.from_arrays(torch.tensor([1, 2]), 100, m, design)
        assert got.design.n_samples == 8 and got.sizes() == 8


def test_from_arrays_refuses_exact_ranks_the_design_cannot_complete():
    """Exact ranks beside sampled ones are what an ``exact_at_cap`` design completes: positives at its largest stage
    (400 of m = 100, cap 500) still within its top; under another design, below the cap or outside the top they were
    taken (as exact groups, or read by the adaptive likelihood as completed), moving the estimate silently."""
    ranks, n = torch.tensor([2, 3, 101, 1, 2]), 1000
    sizes = torch.tensor([100, 100, 100, 400, 400])
    at_cap = rsp.SamplingDesign(100, adaptive_max=500, exact_at_cap=True)
    for design, m in ((rsp.SamplingDesign(100), 100), (rsp.SamplingDesign(100, adaptive_max=500), sizes),
                      (rsp.SamplingDesign(100, replacement=False), 100)):
        with pytest.raises(ValueError, match=r"^exact_ranks: only an adaptive design with exact_at_cap"):
            rsp.SampledRanks.from_arrays(ranks, n, m, design, exact_ranks=torch.tensor([0, 0, 0, 5, 0]))
    with pytest.raises(ValueError, match=r"^exact_ranks: 1 exact rank\(s\) of positives whose draws stopped below the "
                                         r"cap \(n_samples != 400"):
        rsp.SampledRanks.from_arrays(ranks, n, sizes, at_cap, exact_ranks=torch.tensor([5, 0, 0, 0, 0]))
    with pytest.raises(ValueError, match=r"^exact_ranks: 1 exact rank\(s\) of positives outside the top at the cap "
                                         r"\(sampled rank > 1\)"):
        rsp.SampledRanks.from_arrays(ranks, n, sizes, at_cap, exact_ranks=torch.tensor([0, 0, 0, 5, 7]))
    top2 = rsp.SamplingDesign(100, adaptive_max=500, adaptive_top=2, exact_at_cap=True)
    for design, exact in ((at_cap, [0, 0, 0, 5, 0]), (top2, [0, 0, 0, 5, 7])):  # what the design completes
        got = rsp.SampledRanks.from_arrays(ranks, n, sizes, design, exact_ranks=torch.tensor(exact))
        assert float(got.histogram().exact_part().totals.sum()) == sum(e > 0 for e in exact)


# ---------------------------------------------------------------------------------------------- overflow
@pytest.mark.parametrize("weights", [torch.tensor([1e300, 1e300], dtype=torch.float64), [1e300, 1e300]])
@pytest.mark.parametrize("method", ["mes", "bv", "linear"])
def test_estimate_weights_whose_total_overflows(weights, method):
    with pytest.raises(ValueError, match="weights"):
        rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(torch.tensor([1, 2]), 100, 10), method, weights=weights)


@pytest.mark.parametrize("method", ["auto", "mes", "bv", "gmod", "mle", "none"])
def test_estimate_weights_whose_total_is_subnormal(method):
    """Weights whose total is below float64's smallest normal number (1e-320 each) are refused naming ``weights``
    (mes divided its lambda by the total: an overflow, then an error naming ``lam``, an option never given); the
    same weights scaled up to 1e-300 (a normal total: the instances they count, so a prior's or penalty's weight
    grows against them) give a finite estimate and interval in the metric's range."""
    ranks = rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 5, 1, 11, 7]), 100, 10)
    with pytest.raises(ValueError, match=r"^weights: the total 5.9+\d*e-320 is below float64's smallest normal number"):
        rsp.estimate("ndcg@10", ranks, method, weights=torch.full((6,), 1e-320, dtype=torch.float64))
    small = rsp.estimate("ndcg@10", ranks, method, weights=torch.full((6,), 1e-300, dtype=torch.float64))
    lo, hi = small.interval()
    assert 0.0 <= lo <= small.value <= hi <= 1.0, (small.value, lo, hi)


def test_scale_free_weights_of_a_subnormal_total_are_taken():
    """Only an estimate's ``weights`` count instances: relevance grades and popularity weights are scale-free, so a
    subnormal total (1e-310 each) gives what grades 1, 2 and weights at scale 1 give."""
    s = torch.tensor([[3.0, 2.0, 1.0, 0.5]])
    got = [rsp.per_user_metrics(s, torch.tensor([[1, 0]]), ("ndcg@3",), relevance=torch.tensor([[1.0, 2.0]], dtype=torch.float64) * scale,
                                as_frame=False)["NDCG@3"] for scale in (1e-310, 1.0)]
    assert torch.equal(got[0], got[1])
    draws = []
    for scale in (1e-310, 1.0):
        w = torch.tensor([0.0, 1.0, 3.0, 0.0, 4.0], dtype=torch.float64) * scale
        r = rsp.sampled_ranks(torch.zeros(400, 5), torch.zeros(400, 1, dtype=torch.int64),
                              rsp.SamplingDesign(1, popularity=w), generator=torch.Generator().manual_seed(0))
        draws.append(r.negatives)
    assert torch.equal(draws[0], draws[1])


@pytest.mark.parametrize("weights", [[-1.0, 1.0], [float("nan"), 1.0], [float("inf"), 1.0], torch.tensor([True, False]),
                                     [1.0, 1.0, 1.0]])
def test_bad_weights(weights):
    with pytest.raises(ValueError, match="weights"):
        rsp.sampled_rank_histogram(torch.tensor([1, 2]), 100, 10, weights=weights)


def test_large_valid_weights_give_the_right_numbers():
    """Equal weights do not move the value; the standard error shrinks with the total (no overflow to 0)."""
    ranks = torch.tensor([1, 2, 3, 1, 5])
    plain = rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(ranks, 100, 10), "bv")
    heavy = rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(ranks, 100, 10), "bv", weights=[1e6] * 5)
    assert heavy.value == pytest.approx(plain.value, rel=1e-12)
    assert 0.0 < heavy.stderr < plain.stderr and math.isfinite(heavy.stderr)
    # sd over sqrt(total - 1): the unweighted stderr scaled by sqrt((5 - 1) / (5e6 - 1))
    assert heavy.stderr == pytest.approx(plain.stderr * math.sqrt(4.0 / (5e6 - 1.0)), rel=1e-9)


def test_rank_histogram_counts_whose_total_overflows():
    with pytest.raises(ValueError, match="counts"):
        rsp.RankHistogram(np.array([100]), np.array([10]), (np.full(11, 1e300),))


def test_popularity_weights_are_float64_and_scale_free():
    """A list of 1e300 used to become float32 inf; only the ratios matter."""
    scores = torch.rand(4, 50, generator=_gen(0))
    pos = torch.tensor([0, 1, 2, 3])
    big = rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(5, popularity=[1e300] * 25 + [3e300] * 25), generator=_gen(1))
    small = rsp.sampled_ranks(scores, pos, rsp.SamplingDesign(5, popularity=[1.0] * 25 + [3.0] * 25), generator=_gen(1))
    assert torch.equal(big.negatives, small.negatives) and torch.equal(big.ranks, small.ranks)
    assert bool(((big.ranks >= 1) & (big.ranks <= 6)).all())


@pytest.mark.parametrize("popularity", [torch.full((10,), 1e308, dtype=torch.float64), torch.ones(10, dtype=torch.bool),
                                        torch.tensor([float("nan")] + [1.0] * 9), torch.tensor([-1.0] + [1.0] * 9),
                                        torch.ones(9)])
@pytest.mark.parametrize("replacement", [True, False])
def test_bad_popularity(popularity, replacement):
    with pytest.raises(ValueError, match="popularity"):
        rsp.sampled_ranks(torch.rand(2, 10), torch.tensor([0, 1]), rsp.SamplingDesign(3, replacement=replacement, popularity=popularity))


def test_bad_popularity_is_refused_even_without_positives():
    with pytest.raises(ValueError, match="popularity"):
        rsp.sampled_ranks(torch.rand(2, 10), torch.full((2, 1), -1), rsp.SamplingDesign(3, popularity=torch.full((10,), float("nan"))))


def test_correction_table_n_beyond_exact_arithmetic():
    """n = 2^62 overflowed int64 in rank_estimate and put AUC above 1."""
    with pytest.raises(ValueError, match="n_items"):
        correction_table("auc", 2**62, 10, "rank_estimate")
    with pytest.raises(ValueError, match="n_items"):
        correction_table("auc", MAX_SIZE + 1, 10, "bv")
    for method in ("rank_estimate", "none", "bv"):  # the largest n still gives tables inside AUC's range
        table = correction_table("auc", MAX_SIZE, 10, method)
        assert bool(torch.isfinite(table).all())
        assert float(table.min()) >= -1e-9 and float(table.max()) <= 1.0 + 1e-9
    table = correction_table("auc", MAX_SIZE, 10, "rank_estimate")
    assert float(table[0]) == 1.0 and float(table[-1]) == 0.0


def test_correction_table_m_limit_is_enforced_before_allocating():
    with pytest.raises(ValueError, match="n_samples"):
        correction_table("hit@10", 200000, 100000, "bv")
    with pytest.raises(ValueError, match="n_samples"):
        correction_table("hit@10", 200000, 10001, "ls")
    with pytest.raises(ValueError, match="n_samples"):
        correction_table("hit@10", 200000, 10001, "cls")
    # lookup tables (no system to solve) keep working beyond 1e4, e.g. adaptive caps with ``none``
    table = correction_table("hit@10", 200000, 20000, "none")
    assert table.shape == (20001,) and float(table[:10].sum()) == 10.0 and float(table[10:].sum()) == 0.0


@pytest.mark.parametrize(
    "fn",
    [
        lambda n: rsp.metric_values("auc", torch.tensor([2]), n),
        lambda n: expected_sampled("auc", torch.tensor([2]), n, 10),
        lambda n: rsp.estimate("auc", rsp.SampledRanks.from_arrays(torch.tensor([2]), n, 10), "bv"),
        lambda n: rsp.sampled_rank_histogram(torch.tensor([2]), n, 10),
    ],
)
def test_n_above_the_exact_range_everywhere(fn):
    with pytest.raises(ValueError, match="n_items"):
        fn(2**62)
    with pytest.raises(ValueError, match="n_items"):
        fn(torch.tensor([2**62]))


def test_metric_values_at_the_largest_n_are_inside_the_range():
    v = rsp.metric_values("auc", torch.tensor([1, 2**39, MAX_SIZE]), MAX_SIZE)
    assert v[0] == 1.0 and v[2] == 0.0 and abs(float(v[1]) - 0.5) < 1e-9


# -------------------------------------------------------------------------------------------- helpers
def test_check_sizes_forms():
    assert check_sizes(10, "n") == 10 and isinstance(check_sizes(10, "n"), int)
    assert check_sizes(np.int64(10), "n") == 10
    assert check_sizes(10.0, "n") == 10
    t = check_sizes(torch.tensor([3.0, 4.0]), "n", 2)
    assert t.dtype == torch.int64 and t.tolist() == [3, 4]
    assert check_sizes(torch.tensor([7]), "n", one=True) == 7
    with pytest.raises(ValueError, match="n: expected one number"):
        check_sizes(torch.tensor([7, 8]), "n", one=True)
    with pytest.raises(ValueError, match="n: must be >= 2, got 1"):
        check_sizes(torch.tensor([1, 3]), "n", 2)
    with pytest.raises(ValueError, match="n: shape"):
        check_sizes(torch.tensor([2, 3]), "n", like=torch.zeros(3))
    with pytest.raises(ValueError, match="n: shape"):
        check_sizes(torch.tensor([2, 3]), "n", like=torch.zeros(()), exact=True)


def test_check_weights():
    w = check_weights([1e300, 2e300], "w")
    assert w.dtype == torch.float64 and float(w[1]) == 2e300
    with pytest.raises(ValueError, match="w: the total overflows"):
        check_weights([1e308] * 3, "w")
    with pytest.raises(ValueError, match="w: the total"):
        check_weights([MAX_TOTAL_WEIGHT, 2.0], "w", max_total=MAX_TOTAL_WEIGHT)
    assert check_weights(torch.zeros(0), "w").shape == (0,)


def test_huge_sample_sizes_are_refused_before_allocating():
    """n_samples beyond MAX_SAMPLES (2^24): a ValueError naming it, not an allocation failure (sampled_ranks draws
    B x P x m items; a histogram holds m + 1 counts per group; an adaptive cap bounds both)."""
    import reco_sampled_plugin as rsp
    from reco_sampled_plugin._checks import MAX_SAMPLES

    with pytest.raises(ValueError, match="n_samples"):
        rsp.sampled_ranks(torch.randn(2, 50), torch.tensor([[1], [2]]), MAX_SAMPLES + 1)
    with pytest.raises(ValueError, match="n_samples"):
        rsp.estimate("hit@10", rsp.SampledRanks.from_arrays(torch.tensor([1, 2]), 100, 10**10))
    with pytest.raises(ValueError, match="adaptive_max"):
        rsp.AdaptiveDesign(100, 10**12)
    wide = rsp.SampledRanks.from_arrays(torch.tensor([1, 2, 15]), 10**6, 20_000)
    assert rsp.estimate("hit@10", wide, "none").value == pytest.approx(2 / 3)


# --- one rule per kind of argument: sizes accept whole numbers of any type, options only integers ----------------


def test_whole_float_sizes_are_accepted_for_n_and_m_alike():
    r = torch.tensor([1, 2, 5])
    for m in (10, 10.0, np.float64(10.0), np.int32(10), torch.tensor(10)):
        assert expected_sampled("ndcg@10", torch.tensor([3, 40]), 100.0, m).shape == (2,)
        assert math.isfinite(rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(r, 100.0, m), "bv").value)
        assert correction_table("ndcg@10", 100, m, "bv").shape == (11,)
        assert rsp.design.AdaptiveDesign(m, 40.0).cap == 40
    for bad in (10.5, math.inf, math.nan, "10", True):
        for call in (lambda v: expected_sampled("ndcg@10", torch.tensor([3]), 100, v),
                     lambda v: correction_table("ndcg@10", 100, v, "bv"),
                     lambda v: rsp.design.AdaptiveDesign(v, 40)):
            with pytest.raises(ValueError, match="^n_samples: "):
                call(bad)


def test_integer_options_refuse_floats_bools_and_arrays():
    from reco_sampled_plugin._checks import check_int
    from reco_sampled_plugin._options import check_count

    assert check_int(np.int64(3), "k", 1) == 3 and check_int(torch.tensor(3), "k") == 3
    for bad in (3.0, True, np.float32(3), torch.tensor([3]), torch.tensor(3.0), "3", None, 2 + 0j):
        with pytest.raises(ValueError, match="^k: expected an integer"):
            check_int(bad, "k", 1)
        with pytest.raises(ValueError, match="^k: expected an integer"):
            check_count(bad, "k", 1)
    with pytest.raises(ValueError, match="^k: must be >= 1, got 0"):
        check_int(0, "k", 1)
    with pytest.raises(ValueError, match="^k: must be <= 5, got 6"):
        check_int(6, "k", 1, 5)


@pytest.mark.parametrize(
    "call, name",
    [
        (lambda meta: rsp.metric_values("ndcg@10", meta([1, 2]), 50), "ranks"),
        (lambda meta: rsp.metric_values("ndcg@10", torch.tensor([1, 2]), meta(50)), "n_items"),
        (lambda meta: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(meta([1, 2, 3]), 50, 10)), "sampled_ranks"),
        (lambda meta: expected_sampled("ndcg@10", meta([1, 2, 3]), 50, 10), "ranks"),
        (lambda meta: rsp.estimate("ndcg@10", rsp.SampledRanks.from_arrays(meta([1, 2, 3]), 50, 10), "bv"),
         "sampled_ranks"),
        (lambda meta: rsp.sampled_rank_histogram(meta([1, 2, 3]), 50, 10), "sampled_ranks"),
        (lambda meta: rsp.exact_ranks(meta([[0.1, 0.2]]).float(), torch.tensor([0])), "scores"),
        (lambda meta: rsp.exact_ranks(torch.rand(1, 5), meta([0])), "positives"),
        (lambda meta: rsp.exact_ranks_from_factors(meta([[0.1, 0.2]]).float(), torch.rand(5, 2), torch.tensor([0])),
         "factors"),
    ],
)
def test_meta_tensors_are_refused_with_the_argument_named(call, name):
    def meta(values):
        return torch.tensor(values).to("meta")

    with pytest.raises(ValueError, match=name):
        call(meta)


def test_huge_m_in_the_sampling_laws_is_refused_before_allocating():
    # found by the long fuzzing profile: n_samples = 2^31 allocated a (m + 1)-long table per rank (OOM-killed at 24 GB)
    for m in (2**31, 2**24 + 1):
        with pytest.raises(ValueError, match="^n_samples: must be <= 16777216"):
            expected_sampled("ndcg@10", torch.tensor([3, 40]), 2**35, m)
        with pytest.raises(ValueError, match="^n_samples: "):
            sampled_rank_pmf(torch.tensor([3]), 2**35, m)
    # a table the caller asked for whole is bounded too (2^27 values), the chunked expectation is not
    with pytest.raises(ValueError, match=r"^n_samples: the table P\(r~ \| r\) of 12 rank\(s\)"):
        sampled_rank_pmf(torch.arange(1, 13).reshape(3, 4), 2**30, 2**24)
    assert sampled_rank_pmf(torch.tensor([1, 5]), 10**6, 1000).shape == (2, 1001)


def test_sizes_beyond_int64_are_refused_not_wrapped():
    # found by the long fuzzing profile: m = 2.0**63 became -2^63 in int64 and reached the quadrature
    for m in (2.0**63, 9.223372036854776e18, 1e30):
        with pytest.raises(ValueError, match="^n_samples: must be <= "):
            correction_table("hit@10", 10, m, "bv")


def test_sampled_ranks_impossible_under_the_law_are_named():
    # found by the long fuzzing profile: n = 2 leaves one irrelevant item, so r~ is 1 or m + 1; an observed r~ = 2
    # has probability 0 under every rank distribution and the EM divided by it
    for method in ("mle", "mes"):
        with pytest.raises(ValueError, match=r"^sampled_ranks: r~ = 2 cannot occur with n_items = 2"):
            rsp.estimate("ndcg", rsp.SampledRanks.from_arrays(torch.tensor([2]), 2, 2), method)
    assert math.isfinite(rsp.estimate("ndcg", rsp.SampledRanks.from_arrays(torch.tensor([3, 1, 3]), 2, 2), "mle").value)


# ------------------------------------------------------------------ a design of None where a design is required
from reco_sampled_plugin import planner  # noqa: E402
from reco_sampled_plugin._checks import ArgumentTypeError, check_int  # noqa: E402
from reco_sampled_plugin.design import SamplingDesign  # noqa: E402


def _scorer(users, items):
    return torch.zeros(items.shape, dtype=torch.float32)


_NEEDS_A_DESIGN = [
    ("n_samples", lambda: rsp.sampled_ranks(torch.rand(3, 50), torch.tensor([[1], [2], [3]]), None)),
    ("n_samples", lambda: rsp.adaptive_sampled_ranks(torch.rand(3, 50), torch.tensor([[1], [2], [3]]), None)),
    ("n_samples", lambda: adaptive_sampled_ranks_from_exact(torch.tensor([1, 5]), 100, None)),
    ("n_samples", lambda: correction_table("ndcg@10", 100, None)),
    ("n_samples", lambda: expected_corrected("ndcg@10", torch.tensor([1, 5]), 100, None)),
    ("design", lambda: rsp.scorer_ranks.sampled_ranks_from_scorer(_scorer, torch.tensor([[1]]), 50, None)),
    ("n_samples", lambda: rsp.SampledRanks.from_arrays(torch.tensor([1, 2]), 100, None)),
    ("n_samples", lambda: rsp.sampled_rank_histogram(torch.tensor([1, 2]), 100, None)),
    ("n_samples", lambda: rsp.consistency_report({"a": torch.tensor([1, 5])}, 100, None, repeats=0)),
    ("n_samples", lambda: rsp.reproduce.run_reproduce(rsp.reproduce.ReproduceConfig(n_samples=None), progress=False)),
]


@pytest.mark.parametrize("named, call", _NEEDS_A_DESIGN)
def test_a_design_of_none_where_one_is_required_is_a_type_error_naming_it(named, call):
    """None where a design is required: a TypeError (ArgumentTypeError, also the package's ValueError) naming the
    argument, not an AttributeError from deep inside."""
    with pytest.raises(ArgumentTypeError, match=f"^{named}: (required|expected)"):
        call()


# ------------------------------------------------------------------ integers as strings, floats or huge ints
@pytest.mark.parametrize("value, error", [("10", TypeError), (10.0, TypeError), (1e3, TypeError), (2.5, TypeError),
                                          (True, TypeError), (np.float32(3), TypeError), (None, TypeError),
                                          (torch.tensor([3]), TypeError), (2**63, ValueError), (2**70, ValueError),
                                          (-(2**70), ValueError)])
def test_one_integer_checker_for_every_integer_argument(value, error):
    """``check_int``: a wrong type is an ArgumentTypeError (TypeError and ValueError), an integer out of range (past
    int64 included) a ValueError; both name the argument, at every entry point that takes an integer."""
    with pytest.raises(error, match="^k: "):
        check_int(value, "k", 0)
    calls = [("n_users", lambda: rsp.plan(1000, value, "auc", 0.1)),
             ("n_samples", lambda: planner.pilot_design(1000, "auc", n_samples=value)),
             ("max_iter", lambda: rsp.registry.Mle(max_iter=value)),
             ("seed", lambda: rsp.registry.Mes(seed=value)),
             ("max_pairs", lambda: rsp.scorer_ranks.sampled_ranks_from_scorer(_scorer, torch.tensor([[1]]), 50, 10,
                                                                               max_pairs=value))]
    for named, call in calls:
        if value is None and named in ("n_samples", "max_iter", "seed"):
            continue  # None is their default
        with pytest.raises(error, match=f"^{named}: "):
            call()


# ------------------------------------------------------------------------------ the planner names what was passed
def test_plan_without_designs_names_n_items_not_designs():
    with pytest.raises(ValueError, match=r"^n_items: no default design below full ranking for n_items = 5 with "
                                         r"method 'bv'"):
        rsp.plan(5, 10, "auc", 0.1, method="bv")
    with pytest.raises(ValueError, match=r"^designs: no candidate design"):  # designs given: named
        rsp.plan(5, 10, "auc", 0.1, method="bv", designs=[])
    with pytest.raises(ValueError, match=r"^n_items: no default design below full ranking for n_items = 2 with "
                                         r"method 'auto'"):  # two candidates: an IndexError of the adaptive grid
        rsp.plan(2, 50, "auc", 0.1)


def test_plan_of_a_popularity_pilot_without_designs_names_the_method():
    n, users = 150, 250
    w = torch.floor(600.0 / torch.arange(1, n + 1, dtype=torch.float64)) + 1.0
    g = torch.Generator().manual_seed(0)
    scores = torch.rand(users, n, generator=g, dtype=torch.float64)
    pilot = rsp.sampled_ranks(scores, torch.randint(0, n, (users, 1), generator=g), SamplingDesign(20, popularity=w),
                              generator=g)
    with pytest.raises(ValueError, match=r"^method: 'mes' does not correct popularity designs; use one of .*the "
                                         r"default designs of a popularity pilot"):
        rsp.plan(n, 250, "auc", 0.05, pilot=pilot, method="mes", repeats=2)


# ----------------------------------------------------------------------------------- a report over empty ranks
def test_consistency_report_over_empty_ranks_is_a_clear_error():
    """Every table cell would be a mean over no instance (NaN): refused naming exact_ranks."""
    for repeats in (0, 2):
        with pytest.raises(ValueError, match=r"^exact_ranks: no instances"):
            rsp.consistency_report({"a": torch.empty(0), "b": torch.empty(0)}, 100, 10, repeats=repeats)


@pytest.mark.parametrize("case,positives,exclude,name,error", [
    ("range", [[0, 40], [1, -1]], [[2, 3], [4, -1]], "positives_range", r"^positives: item indices must lie in 0\.\.39"),
    ("below -1", [[0, 1], [1, -1]], [[2, -3], [4, -1]], "exclude_range", r"^exclude: item indices must lie in 0\.\.39"),
    ("duplicates", [[5, 5], [1, -1]], [[2, 3], [4, -1]], "positives_duplicates", r"^positives: 1 row\(s\) list the same"),
    ("clash", [[0, 1], [1, -1]], [[2, 3], [1, -1]], "exclude_clash", r"^exclude: 1 row\(s\) exclude one of their own"),
])
def test_prepare_index_hands_its_checks_over_unread(case, positives, exclude, name, error):
    """``prepare_index(pending=...)`` (the torchmetrics adapters on an accelerator): no read, the value checks appended
    with their names and read-free messages, indices clamped into the catalogue (safe to compute on); read later, the
    failing check raises the error ``prepare_index`` raises at once; valid inputs come back as they are."""
    from _budgets import count_syncs
    from reco_sampled_plugin._inputs import run_checks
    from reco_sampled_plugin.ranking import prepare_index

    pos, exc = torch.tensor(positives), torch.tensor(exclude)
    with pytest.raises(ValueError, match=error):
        prepare_index(pos, exc, 2, 40, pos.device)
    pending: list = []
    (p, e), counter = count_syncs(prepare_index, pos, exc, 2, 40, pos.device, pending=pending)
    assert counter.count == 0, dict(counter.calls)
    assert ((p >= -1) & (p < 40)).all() and ((e >= -1) & (e < 40)).all()
    failed = [c.name for c in pending if bool(c.bad)]
    assert failed[0] == name and all(c.name and c.message.startswith(c.name.split("_")[0]) for c in pending)
    with pytest.raises(ValueError, match=error):
        run_checks(pending)
    good: list = []
    p, e = prepare_index(torch.tensor([[0, 39]]), torch.tensor([[2, -1]]), 1, 40, pos.device, pending=good)
    assert p.tolist() == [[0, 39]] and e.tolist() == [[2, -1]] and not any(bool(c.bad) for c in good)


# ------------------------------------------------------------------------------------ the scores' NaN/inf check
_SPECIAL = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf, "max": None, "-max": None, "tiny": 1e-300}


@settings(max_examples=examples(60), deadline=None)
@given(b=st.one_of(st.integers(1, 6), st.integers(64, 70)), n=st.integers(1, 300),
       dtype=st.sampled_from([torch.float32, torch.float64]),
       planted=st.lists(st.tuples(st.integers(0, 69), st.integers(0, 299), st.sampled_from(sorted(_SPECIAL))), max_size=6),
       big_row=st.sampled_from([0, 1, -1]), layout=st.sampled_from(["contiguous", "transposed", "sliced"]),
       medium=st.booleans(), seed=st.integers(0, 99))
@example(b=64, n=300, dtype=torch.float32, planted=[], big_row=1, layout="contiguous", medium=True, seed=1)
def test_finite_flags_on_a_cpu_are_isfinite(b, n, dtype, planted, big_row, layout, medium, seed):
    """The CPU's check (a matrix-vector product with 2^-k) against ``isfinite`` entry by entry, with both halves of the
    paths (the accelerators' aminmax run with the host paths cleared): NaN, +-inf, the largest finite values (whole
    rows of them must not overflow the sum), tiny ones; transposed and sliced views; and float32 products computed in
    bfloat16 (``set_float32_matmul_precision("medium")``: oneDNN takes 64 rows or more), where the largest finite
    values round to inf."""
    from reco_sampled_plugin import _inputs

    big = torch.finfo(dtype).max
    s = torch.randn(b, n, generator=_gen(seed), dtype=dtype) * 1e3
    if big_row:
        s[0] = big * big_row  # a whole row of the largest finite values
    for r, c, kind in planted:
        value = {"max": big, "-max": -big}.get(kind, _SPECIAL[kind])
        s[r % b, c % n] = value
    if layout == "transposed":
        s = s.T.contiguous().T
    elif layout == "sliced":
        s = torch.cat([s, s], dim=1)[:, :n]
    want_rows = torch.isfinite(s).all(1)
    saved = torch.get_float32_matmul_precision(), _inputs._BLAS_CHECK_MIN[0]
    try:
        torch.set_float32_matmul_precision("medium" if medium else "highest")
        _inputs._BLAS_CHECK_MIN[0] = 1  # the product at any size
        for host in (True, False):
            _inputs._numpy_scan[0] = host
            assert torch.equal(_inputs.finite_flags(s, dim=1), want_rows), host
            assert bool(_inputs.finite_flags(s)) == bool(want_rows.all()), host
            assert torch.equal(_inputs.finite_rows(s), want_rows), host
    finally:
        _inputs._numpy_scan[0], _inputs._BLAS_CHECK_MIN[0] = True, saved[1]
        torch.set_float32_matmul_precision(saved[0])


def test_finite_flags_of_scores_that_require_grad():
    """Scores with ``requires_grad`` (a model's output in training mode), large enough for the CPU's product path:
    plain flags, and a NaN is still refused."""
    from reco_sampled_plugin._inputs import finite_flags

    s = torch.randn(3, 1 << 19, requires_grad=True)
    rows = finite_flags(s, dim=1)
    assert rows.tolist() == [True] * 3 and not rows.requires_grad and rows.grad_fn is None
    with pytest.raises(ValueError, match="NaN or inf"):
        rsp.sampled_ranks(torch.cat([s, torch.full((3, 1), math.nan)], 1), torch.zeros(3, 1, dtype=L), 5, generator=_gen())


def test_per_row_counts_of_column_ranks_are_refused_not_squared():
    """(B, 1) sampled ranks with (B,) candidate counts: broadcasting made B x B instances of the histogram (40,000
    from 200 positives); refused with the per-row shape named, and (B, 1) counts give B instances."""
    r = torch.randint(1, 102, (200, 1), generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"^n_items: shape \(200,\) does not broadcast to .*per row is shape \(200, 1\)"):
        rsp.sampled_rank_histogram(r, torch.full((200,), 1000), 100)
    with pytest.raises(ValueError, match=r"^n_samples: shape \(200,\) does not broadcast to"):
        rsp.sampled_rank_histogram(r, 1000, torch.full((200,), 100))
    assert rsp.sampled_rank_histogram(r, torch.full((200, 1), 1000), 100).total == 200
    assert rsp.sampled_rank_histogram(r[:, 0], torch.full((200,), 1000), 100).total == 200


def test_an_empty_catalogue_with_padding_only_exclusions_ranks_nothing():
    """(B, 0) scores, no positive and exclusions of padding only: (B, 0) ranks, as with (B, 0) exclusions (a
    RuntimeError of an out-of-bounds gather before: the padding was looked up among no items)."""
    s, none = torch.zeros(1, 0), torch.zeros(1, 0, dtype=torch.long)
    for exclude in (torch.tensor([[-1]]), torch.tensor([[-1, -1]]), none):
        assert rsp.exact_ranks(s, none, exclude).shape == (1, 0)


def test_given_negatives_repeating_an_item_under_a_design_without_replacement_are_refused():
    """Pre-drawn negatives that list an item twice for one positive contradict a design without replacement (its
    hypergeometric law would be applied to draws that are not): a ValueError; the same negatives under a design
    with replacement, and distinct ones without, are ranked."""
    from reco_sampled_plugin.design import SamplingDesign

    s = torch.randn(2, 6, generator=torch.Generator().manual_seed(0))
    pos = torch.tensor([[1], [2]])
    twice = torch.tensor([[0, 0, 3], [0, 1, 3]])
    with pytest.raises(ValueError, match=r"^negatives: 1 positive\(s\) list an item twice .* without replacement"):
        rsp.sampled_ranks(s, pos, SamplingDesign(3, replacement=False), negatives=twice)
    assert rsp.sampled_ranks(s, pos, SamplingDesign(3), negatives=twice).ranks.shape == (2, 1)
    distinct = torch.tensor([[0, 2, 3], [0, 1, 3]])
    assert rsp.sampled_ranks(s, pos, SamplingDesign(3, replacement=False), negatives=distinct).ranks.shape == (2, 1)


@pytest.mark.parametrize("bad, what", [
    (np.full((2, 1, 3), 5) + 0.9j, "complex numbers"),  # was taken as 5: the imaginary part dropped
    ({}, "dict"), ("abc", "str"), (10**30, "int"), ([[1, 2], [3]], "list"),
    (torch.ones(2, 1, 3, dtype=torch.bool), "booleans"), (np.array([["a", "b", "c"]] * 2), "ndarray of dtype <U1"),
])
def test_given_negatives_are_converted_as_every_array_argument(bad, what):
    """``negatives`` goes through the package's one array conversion: complex numbers, objects, strings, ints beyond
    int64 and ragged lists are refused naming ``negatives`` (complex ones were truncated to their real part, the rest
    raised torch's own errors)."""
    s = torch.randn(2, 10, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=rf"^negatives: expected integer item indices, got {what}"):
        rsp.sampled_ranks(s, torch.tensor([[0], [1]]), 3, negatives=bad)


def test_simulated_draws_refuse_an_m_beyond_the_documented_cap():
    """``simulate_sampled_ranks`` / ``draw_sampled_ranks`` take m up to MAX_SAMPLES = 2^24, as every sampled path
    (m = 10^12 gave sampled ranks near 10^10 that no estimate takes)."""
    from reco_sampled_plugin._checks import MAX_SAMPLES
    from reco_sampled_plugin.simulate import draw_sampled_ranks

    exact = torch.tensor([1, 50, 100])
    for bad in (MAX_SAMPLES + 1, 10**12, torch.tensor([5, 5, 10**12])):
        with pytest.raises(ValueError, match=r"^n_samples: must be <= 16777216"):
            rsp.simulate_sampled_ranks(exact, 100, bad)
        with pytest.raises(ValueError, match=r"^n_samples: must be <= 16777216"):
            draw_sampled_ranks(exact, 100, bad, repeats=2, seed=0)
    top = rsp.simulate_sampled_ranks(exact, 100, MAX_SAMPLES, generator=torch.Generator().manual_seed(0))
    assert int(top[0]) == 1 and int(top[2]) == MAX_SAMPLES + 1  # rank 1 and rank n at the cap
