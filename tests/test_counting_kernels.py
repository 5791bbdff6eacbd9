"""The counting kernels of the first evaluation (counting.py) give the numbers of the reference path.

* the eager counting kernels (int32 accumulators, cache-sized chunks on a CPU, an accelerator's whole rows)
  against brute-force counts in numpy, at chunk sizes from one row to the whole matrix, with ties, NaN and +-inf;
* identified intervals: LP solutions shared by metrics with the same objective on the same data (Hit@K and
  leave-one-out Recall@K) of one histogram equal a recomputation on an equal histogram built again (which keeps
  nothing), new data are solved afresh, what one histogram keeps stays bounded;
* RecBole's staging buffer sized for the evaluation's users returns what the doubling buffer returned;
* the update / reset lifecycle of the torchmetrics class behind the Lightning callback: after a reset and new
  data, ``compute()`` equals a fresh metric's (no stale cached fit, program or LP solution), and the first data
  again give the first values bit for bit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from reco_sampled_plugin import counting
from reco_sampled_plugin import identification as idf
from reco_sampled_plugin._rank_hist import RankHistogram, sampled_rank_histogram
from reco_sampled_plugin.adapters import _recbole_ranks as rr
from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

from _profiles import examples


# ------------------------------------------------------------------------------------------ counting
def _scores(rng: np.random.Generator, b: int, n: int) -> np.ndarray:
    """Float32 scores on 7 levels (many ties), a NaN row entry, +-inf entries."""
    s = rng.integers(0, 7, (b, n)).astype(np.float32) / 2
    s[0, 3] = np.nan
    s[1, :5] = -np.inf
    s[2, 7] = np.inf
    return s


@pytest.fixture
def eager_backend():
    old = counting.get_backend()
    counting.set_backend("eager")
    yield
    counting.set_backend(old)


CHUNKS = [1, 40, 1 << 10, 1 << 19]


@pytest.mark.parametrize("path, chunk",
                         [("numpy", c) for c in CHUNKS] + [("torch", c) for c in CHUNKS] + [("whole rows", None)]
                         + [("torch words", 1 << 10), ("whole rows words", None)])
def test_eager_counts_equal_brute_force_at_any_chunk_size(path, chunk, eager_backend, monkeypatch):
    """Every eager path: numpy's comparisons counted 8 bytes at a time and the CPU's torch loop at any chunk size (one
    row and one reference per block, part of a block, the whole matrix), and the torch loop of accelerators (whole
    rows, one reference per pass; the row-indexed count in blocks of B gathered rows: five blocks here); "words": the
    torch loop's masks counted by their bytes at any size (:func:`counting._count_columns`: 48 columns, then 5)."""
    if "words" in path:
        monkeypatch.setattr(counting, "_WORD_COUNT_MIN", 0)
        path = path.replace(" words", "")
    monkeypatch.setattr(counting, "_NUMPY_CHUNK_BYTES", chunk or counting._NUMPY_CHUNK_BYTES)
    monkeypatch.setattr(counting, "_EAGER_CPU_CHUNK_ELEMENTS", chunk or counting._EAGER_CPU_CHUNK_ELEMENTS)
    monkeypatch.setattr(counting, "_numpy_blocked", [path != "numpy"])
    monkeypatch.setattr(counting, "_cpu_chunks", [path != "whole rows"])
    rng = np.random.default_rng(25)
    b, n, p = 9, 53, 4
    s = _scores(rng, b, n)
    ref = s[np.arange(b)[:, None], rng.integers(0, n, (b, p))]
    ref[3, 1] = np.nan  # a NaN reference: nothing beats it
    scores, ref_t = torch.from_numpy(s), torch.from_numpy(ref)
    for inclusive in (False, True):
        truth = (s[:, None, :] >= ref[:, :, None]) if inclusive else (s[:, None, :] > ref[:, :, None])
        np.testing.assert_array_equal(counting.count_beating(scores, ref_t, inclusive).numpy(), truth.sum(-1))
        counts, finite = counting.count_beating_checked(scores, ref_t, inclusive)
        np.testing.assert_array_equal(counts.numpy(), truth.sum(-1))
        np.testing.assert_array_equal(finite.numpy(), np.isfinite(s).all(1))
    # one reference per positive against its own row (RecBole's full mode), rows repeated and out of order
    rows = rng.integers(0, b, 40)
    r_ref = s[rows, rng.integers(0, n, 40)]
    for inclusive in (False, True):
        got = counting.count_beating_rows(scores, torch.from_numpy(rows), torch.from_numpy(r_ref), inclusive)
        truth = (s[rows] >= r_ref[:, None]) if inclusive else (s[rows] > r_ref[:, None])
        assert got.dtype == torch.int64
        np.testing.assert_array_equal(got.numpy(), truth.sum(-1))
    # tied items with a smaller tie-break key
    seed = torch.from_numpy(rng.integers(0, 2**31, (b, 1)))
    keys = counting.item_keys(torch.arange(n).unsqueeze(0), seed).numpy()  # (b, n)
    cols = rng.integers(0, n, (b, p))
    ref_keys = np.take_along_axis(keys, cols, 1)
    tied_ref = np.take_along_axis(s, cols, 1)
    got = counting.count_tied_before(scores, torch.from_numpy(tied_ref), torch.from_numpy(ref_keys), seed)
    truth = ((s[:, None, :] == tied_ref[:, :, None]) & (keys[:, None, :] < ref_keys[:, :, None])).sum(-1)
    np.testing.assert_array_equal(got.numpy(), truth)


@pytest.mark.parametrize("n", [1, 7, 8, 2039, 2041, 4100])
def test_numpy_counts_equal_the_torch_loop_across_lane_groups_and_threads(n, eager_backend, monkeypatch):
    """The numpy path's SWAR count (a row's bytes in groups of at most 255 words) at widths around a group's edge and
    over several groups, split between two threads (``_THREAD_MIN_WORK`` lowered), float32 and float64, with ties,
    NaN and +-inf; equal to the torch loop (the reference) and its finite flags to numpy's isfinite."""
    monkeypatch.setattr(counting, "_THREAD_MIN_WORK", 1)
    monkeypatch.setattr(counting, "_NUMPY_CHUNK_BYTES", 3 * 8 * (n + 8))  # a few rows per block: several blocks
    rng = np.random.default_rng(n)
    b, p = 11, 6
    for dtype in (np.float32, np.float64):
        s = _scores(rng, b, max(n, 8))[:, :n].astype(dtype)
        ref = s[np.arange(b)[:, None], rng.integers(0, n, (b, p))]
        scores, ref_t = torch.from_numpy(s), torch.from_numpy(ref)
        rows, r_ref = torch.from_numpy(rng.integers(0, b, 30)), torch.from_numpy(s[rng.integers(0, b, 30), 0])
        threads = torch.get_num_threads()
        torch.set_num_threads(2)  # two workers whatever the machine (restored below)
        try:
            for inclusive in (False, True):
                got, finite = counting.count_beating_checked(scores, ref_t, inclusive)
                got_rows = counting.count_beating_rows(scores, rows, r_ref, inclusive)
                monkeypatch.setattr(counting, "_numpy_blocked", [True])
                np.testing.assert_array_equal(got.numpy(), counting.count_beating(scores, ref_t, inclusive).numpy())
                np.testing.assert_array_equal(got_rows.numpy(),
                                              counting.count_beating_rows(scores, rows, r_ref, inclusive).numpy())
                monkeypatch.setattr(counting, "_numpy_blocked", [False])
                np.testing.assert_array_equal(finite.numpy(), np.isfinite(s).all(1))
        finally:
            torch.set_num_threads(threads)


@given(b=st.integers(3, 9), n=st.integers(1, 300), p=st.integers(1, 20), budget=st.integers(1, 1 << 13),
       wide=st.booleans(), inclusive=st.booleans(), sentinels=st.booleans(), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=examples(60), deadline=None)
def test_numpy_blocks_of_any_budget_count_as_brute_force(b, n, p, budget, wide, inclusive, sentinels, seed):
    """The numpy path at any block budget: whole rows or item segments (the last one shorter, its lanes past it zero),
    balanced groups of references, two threads splitting the rows, float32 / float64 with ties, NaN and +-inf: counts
    and finite flags equal brute force (and the row-indexed count, its references grouped by row: none, one, many per
    row, NaN among them), the finite flags from the two sentinel references or from each block's min and max, and the
    blocks keep :func:`counting._blocks`' bounds."""
    rng = np.random.default_rng(seed)
    s = _scores(rng, b, max(n, 8))[:, :n].astype(np.float64 if wide else np.float32)
    ref = s[np.arange(b)[:, None], rng.integers(0, n, (b, p))]
    old = (counting._NUMPY_CHUNK_BYTES, counting._THREAD_MIN_WORK, counting._SENTINEL_ROWS, torch.get_num_threads())
    counting._NUMPY_CHUNK_BYTES, counting._THREAD_MIN_WORK = budget, 1
    counting._SENTINEL_ROWS = b + 1 if sentinels else 1  # blocks have 1..b rows: always / never the sentinels
    torch.set_num_threads(2)
    rows = rng.integers(0, b, int(rng.integers(0, 3 * b)))  # one reference per entry, rows repeated, in any order
    r_ref = s[rows, rng.integers(0, n, rows.size)]
    try:
        blocks = counting._blocks(b, n, p, s.itemsize)
        got, finite = counting._numpy_padded(torch.from_numpy(s), torch.from_numpy(ref), inclusive, True)
        got_rows = counting._numpy_rows(inclusive, torch.from_numpy(s), torch.from_numpy(rows), torch.from_numpy(r_ref))
    finally:
        counting._NUMPY_CHUNK_BYTES, counting._THREAD_MIN_WORK, counting._SENTINEL_ROWS = old[:3]
        torch.set_num_threads(old[3])
    truth = (s[:, None, :] >= ref[:, :, None]) if inclusive else (s[:, None, :] > ref[:, :, None])
    np.testing.assert_array_equal(got.numpy(), truth.sum(-1))
    np.testing.assert_array_equal(finite.numpy(), np.isfinite(s).all(1))
    truth_rows = (s[rows] >= r_ref[:, None]) if inclusive else (s[rows] > r_ref[:, None])
    np.testing.assert_array_equal(got_rows.numpy(), truth_rows.sum(-1))
    rows, segment, group, size = blocks
    most = min(p, counting._NUMPY_GROUP, b)  # references per numpy call at most: balanced groups of up to that
    assert 1 <= group <= most and group == -(-p // -(-p // group))
    whole = budget * 3 // 2  # a whole row's block may take 1.5 x the budget
    if segment < n or n * (s.itemsize + most) <= whole:  # a split row, or a row that fits them all: the fewest calls
        assert group == -(-p // -(-p // most))
    assert 1 <= rows <= b and (segment == n or (segment % 8 == 0 and segment < n))
    assert (segment == n) == (n * (s.itemsize + group) <= whole) or n <= 8  # split where a row cannot fit, only
    width = math.prod(counting._lanes(segment)) * 8
    assert size == rows * group * width
    if rows > 1:  # more than one row only where they fit the budget and the bytes stay below the b x n scores
        assert rows * segment * (s.itemsize + group) <= budget and size <= b * n


def test_l2_size_read_from_sysfs(tmp_path):
    """``_l2_bytes`` finds the level-2 entry among sysfs cache indexes ("2048K" -> 2 MiB; "1M"), and says None where
    there is no such directory or no level 2."""
    for index, level, size in (("index0", "1", "48K"), ("index2", "2", "2048K"), ("index3", "3", "480M")):
        (tmp_path / index).mkdir()
        (tmp_path / index / "level").write_text(level + "\n")
        (tmp_path / index / "size").write_text(size + "\n")
    assert counting._l2_bytes(str(tmp_path)) == 2 << 20
    (tmp_path / "index2" / "size").write_text("1M\n")
    assert counting._l2_bytes(str(tmp_path)) == 1 << 20
    (tmp_path / "index2" / "level").write_text("4\n")
    assert counting._l2_bytes(str(tmp_path)) is None
    assert counting._l2_bytes(str(tmp_path / "missing")) is None
    assert (1 << 18) <= counting._NUMPY_CHUNK_BYTES <= (1 << 21)


@pytest.mark.parametrize("n", [2048, 4085, 4093, 2**14 + 3])
def test_byte_counts_of_masks_equal_their_sums_and_no_lane_carries(n, monkeypatch):
    """``_count_columns``: a full mask counts n (at n = 4,085 two groups of exactly 255 words: every byte lane sums
    to 255, the most it can hold), random masks count their sums with the leftover columns, and a non-contiguous
    mask (a transposed one) is counted too."""
    monkeypatch.setattr(counting, "_WORD_COUNT_MIN", 0)  # by bytes at any size
    g = torch.Generator().manual_seed(n)
    full = torch.ones(3, n, dtype=torch.bool)
    assert counting._count_columns(lambda lo, hi: full[:, lo:hi].clone(), 3, n).tolist() == [n] * 3
    mask = torch.rand(5, n, generator=g) < torch.rand(5, 1, generator=g)
    got = counting._count_columns(lambda lo, hi: mask[:, lo:hi].clone(), 5, n)
    assert got.dtype == torch.int32 and got.tolist() == mask.sum(1).tolist()
    strided = mask.T.contiguous().T  # the same values in column-major order
    assert counting._count_columns(lambda lo, hi: strided[:, lo:hi], 5, n).tolist() == mask.sum(1).tolist()
    one_row = mask[:1].T.contiguous().T  # (1, n) with row stride 1: "contiguous", yet no whole words per row
    assert counting._count_columns(lambda lo, hi: one_row[:, lo:hi], 1, n).tolist() == mask[:1].sum(1).tolist()


def test_empty_rows_or_catalogue_count_nothing(eager_backend):
    """No items (n = 0) or no rows: zero counts of the right shape, finite flags for every row (numpy's path needs a
    row of at least one item; the torch loop takes n = 0)."""
    assert torch.equal(counting.count_beating(torch.zeros(3, 0), torch.zeros(3, 2)), torch.zeros(3, 2, dtype=torch.int64))
    counts, finite = counting.count_beating_checked(torch.zeros(0, 5), torch.zeros(0, 2))
    assert counts.shape == (0, 2) and finite.shape == (0,)
    got = counting.count_beating_rows(torch.zeros(2, 0), torch.zeros(1, dtype=torch.int64), torch.zeros(1))
    assert torch.equal(got, torch.zeros(1, dtype=torch.int64))


def test_row_indices_outside_the_batch_are_a_value_error(eager_backend):
    """``count_beating_rows`` with a row past the batch or below 0: a ValueError naming ``rows`` on the numpy path
    (its gathers would clip: row 7 of 3 counted against the last row); the torch loop's indexing raises too."""
    scores = torch.tensor([[5.0, 5, 5], [0, 0, 0], [1, 2, 3]])
    for rows in ([7], [-1], [0, 3]):
        with pytest.raises(ValueError, match=r"^rows: row indices must lie in 0\.\.2"):
            counting.count_beating_rows(scores, torch.tensor(rows), torch.full((len(rows),), 0.5))
    assert counting.count_beating_rows(scores, torch.tensor([2, 0]), torch.tensor([1.5, 0.5])).tolist() == [2, 3]


def test_views_with_the_negative_bit_take_the_numpy_paths():
    """A real view with torch's negative bit (``z.conj().imag``: numpy cannot view it) counts, sorts, ranks and
    bounds factor scores as its resolved copy does (a RuntimeError in ``numpy()`` before)."""
    g = torch.Generator().manual_seed(0)
    z = torch.randn(6, 40, dtype=torch.cfloat, generator=g).conj()
    neg = z.imag
    plain = neg.resolve_neg()
    assert neg.is_neg() and counting.numpy_path(neg)
    ref = plain[:, :3].clone()
    assert torch.equal(counting.count_beating(neg, ref), counting.count_beating(plain, ref))
    assert torch.equal(counting.sort_rows(neg), counting.sort_rows(plain))
    rows = torch.tensor([0, 5, 5])
    assert torch.equal(counting.count_beating_rows(neg, rows, ref[rows, 0]), counting.count_beating_rows(plain, rows, ref[rows, 0]))
    u = torch.randn(4, 6, dtype=torch.cfloat, generator=g).conj().imag
    v = torch.randn(40, 6, dtype=torch.cfloat, generator=g).conj().imag
    pos = torch.tensor([[0], [1], [2], [3]])
    import reco_sampled_plugin as rsp
    assert torch.equal(rsp.exact_ranks_from_factors(u, v, pos), rsp.exact_ranks(u.resolve_neg() @ v.resolve_neg().T, pos))
    assert torch.equal(rsp.exact_ranks(neg, torch.arange(6).unsqueeze(1)), rsp.exact_ranks(plain, torch.arange(6).unsqueeze(1)))


def test_sort_rows_equals_torch_sort():
    """numpy's sort on the CPU (int32/int64/float32/float64) and torch's for other dtypes: torch.sort's values, NaN
    last, any shape (1-D, empty rows)."""
    rng = np.random.default_rng(3)
    cases = [torch.from_numpy(rng.integers(-5, 5, (7, 40))), torch.from_numpy(rng.normal(size=(3, 9)).astype(np.float32)),
             torch.from_numpy(rng.integers(0, 9, 50).astype(np.int32)),
             torch.tensor([[2.0, float("nan"), -1.0, float("inf"), -float("inf")]], dtype=torch.float64),
             torch.zeros((4, 0), dtype=torch.int64), torch.tensor([[3, 1, 2]], dtype=torch.int16)]
    for x in cases:
        got, want = counting.sort_rows(x), torch.sort(x, dim=-1).values
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got.isnan(), want.isnan()) if x.is_floating_point() else True
        assert torch.equal(torch.nan_to_num(got), torch.nan_to_num(want))


def test_count_accumulator_is_int32_only_where_a_row_cannot_overflow_it():
    small = torch.empty((3, 1000), dtype=torch.bool, device="meta")
    huge = torch.empty((1, 2**31), dtype=torch.bool, device="meta")
    assert counting._count_true(small).dtype == torch.int32
    assert counting._count_true(huge).dtype == torch.int64


@pytest.mark.parametrize("build", [lambda: counting._multi_kernel(3, True), lambda: counting._multi_kernel(5, False),
                                   lambda: counting._tied_kernel(2)])
def test_generated_kernels_have_a_source_file_and_their_own_code(build):
    """Each generated kernel has its own code object and a source file that ``inspect`` finds: torch.compile before
    2.13 wraps a function without one in a shared frame, so every kernel shared one compile cache and the ninth ran
    eagerly past the recompile limit (an H200, torch 2.11); torch's own trace rules must not skip the file."""
    import inspect
    import linecache

    from torch._dynamo import trace_rules

    a, b = build(), build()
    assert a.__code__ is not b.__code__
    filename = inspect.getsourcefile(a)
    assert filename is not None and filename.startswith("<reco_sampled_plugin.counting ")
    assert "def kernel" in "".join(linecache.getlines(filename))
    assert not trace_rules.check(a)


def test_auto_backend_compiles_only_large_inputs_once_enough_was_counted(monkeypatch):
    """``auto``: eager until the process has counted ``_COMPILE_AFTER_WORK`` comparisons (``_COMPILE_AFTER_WORK_FAST``
    where the eager path is numpy's, ``_COMPILE_AFTER_WORK_ACCELERATOR`` on an accelerator), then compiled for inputs of at least ``_COMPILE_MIN_WORK`` comparisons and for
    any tile of a tiled loop; never where the int32 accumulators could overflow (n >= 2^31 - 1); ``eager`` and
    ``compiled`` force their path; the counter adds every call's work."""
    monkeypatch.setattr(counting, "_work_done", [0])
    monkeypatch.setattr(counting, "_backend", "auto")
    big, small, after = counting._COMPILE_MIN_WORK, counting._COMPILE_MIN_WORK - 1, counting._COMPILE_AFTER_WORK
    assert not counting._use_compiled(big, 1_000)  # a first evaluation never compiles
    assert not counting._use_compiled(after - 2 * big, 1_000, tile=True)  # not yet: one input short of the bound
    assert counting._work_done[0] == after - big
    assert counting._use_compiled(big, 1_000)  # the bound reached by this call's own work
    assert not counting._use_compiled(small, 1_000)  # small inputs stay eager
    assert counting._use_compiled(1, 1_000, tile=True)  # a tile of a tiled loop is compiled at any size
    assert not counting._use_compiled(big, 2**31 - 1)  # int32 counts could overflow
    assert not counting._use_compiled(big, 1_000, fast_eager=True)  # numpy's eager path: the later bound
    assert not counting._use_compiled(big, 1_000, accelerator=True)  # an accelerator's: the latest bound
    counting._work_done[0] = counting._COMPILE_AFTER_WORK_FAST
    assert counting._use_compiled(big, 1_000, fast_eager=True)
    assert not counting._use_compiled(big, 1_000, accelerator=True)
    counting._work_done[0] = counting._COMPILE_AFTER_WORK_ACCELERATOR - big
    assert counting._use_compiled(big, 1_000, accelerator=True)
    monkeypatch.setattr(counting, "_backend", "eager")
    assert not counting._use_compiled(big, 1_000, tile=True)
    monkeypatch.setattr(counting, "_backend", "compiled")
    counting._work_done[0] = 0
    assert counting._use_compiled(1, 1_000)


# ------------------------------------------------------------------------------------- identification
def _top_unresolved_ranks(seed: int, users: int = 600) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sampled ranks (m = 100) of positives whose exact ranks follow a power law over n in 1,200..1,700 (per-user
    n): the resolution b ~ 15 exceeds K = 10, so Recall@10's interval is identified by the LP."""
    g = torch.Generator().manual_seed(seed)
    n = torch.randint(1200, 1700, (users,), generator=g)
    r = (torch.rand(users, generator=g, dtype=torch.float64) ** 3 * (n - 1)).floor() + 1
    hits = torch.binomial(torch.full((users,), 100.0, dtype=torch.float64), ((r - 1) / (n - 1)).clamp(0, 1), generator=g)
    return hits + 1, n.to(torch.float64), torch.full((users,), 100.0)


def _top_unresolved_histogram(seed: int, users: int = 600) -> RankHistogram:
    return sampled_rank_histogram(*_top_unresolved_ranks(seed, users))


@pytest.fixture
def counted_solves(monkeypatch):
    """Every LP solve counted."""
    calls = []
    real = idf._solve

    def counting_solve(c, prog, sense):
        calls.append(sense)
        return real(c, prog, sense)

    monkeypatch.setattr(idf, "_solve", counting_solve)
    return calls


def test_equal_objectives_share_lp_solutions_and_equal_a_fresh_recomputation(counted_solves):
    hist = _top_unresolved_histogram(1)
    rec = idf.identified_interval("recall@10", hist)
    assert len(counted_solves) == 2  # min and max
    hit = idf.identified_interval("hit@10", hist)
    assert len(counted_solves) == 2  # the same per-rank objective on the same histogram: no new LP
    # the reference path: an equal histogram built again keeps nothing (what is solved is kept on the histogram)
    hit_ref = idf.identified_interval("hit@10", _top_unresolved_histogram(1))
    assert len(counted_solves) == 4
    assert (hit.lo, hit.hi, hit.lp_lo, hit.lp_hi, hit.flags) == (hit_ref.lo, hit_ref.hi, hit_ref.lp_lo, hit_ref.lp_hi, hit_ref.flags)
    assert (rec.lp_lo, rec.lp_hi) == (hit.lp_lo, hit.lp_hi)
    ndcg = idf.identified_interval("ndcg@10", hist)  # another objective: its own LPs
    assert len(counted_solves) == 6 and ndcg.lp_hi != hit.lp_hi


def test_new_data_are_solved_afresh_and_the_memo_stays_bounded(counted_solves):
    hist = _top_unresolved_histogram(1)
    first = idf.identified_interval("recall@10", hist)
    other = idf.identified_interval("recall@10", _top_unresolved_histogram(2))
    assert len(counted_solves) == 4 and (other.lo, other.hi) != (first.lo, first.hi)
    again = idf.identified_interval("recall@10", hist)
    assert len(counted_solves) == 4 and (again.lo, again.hi) == (first.lo, first.hi)  # kept on the histogram
    # more programs and solutions of one histogram (a program and two LPs per level) than it keeps
    small = _top_unresolved_histogram(3, users=150)
    levels = [0.5 + 0.02 * i for i in range(idf.KEPT_MAX // 3 + 2)]
    oldest = idf.identified_interval("recall@10", small, level=levels[0])
    for level in levels[1:]:
        idf.identified_interval("recall@10", small, level=level)
    assert len(small.without_empty_groups()._kept["identification"]) <= idf.KEPT_MAX
    solves = len(counted_solves)
    evicted = idf.identified_interval("recall@10", small, level=levels[0])
    assert len(counted_solves) == solves + 2  # evicted long ago: solved again, to the same numbers
    assert (evicted.lo, evicted.hi, evicted.lp_lo, evicted.lp_hi) == (oldest.lo, oldest.hi, oldest.lp_lo, oldest.lp_hi)


# ------------------------------------------------------------------------------------- RecBole staging
class _Inter:
    def __init__(self, uid: np.ndarray) -> None:
        self.interaction = {"user_id": torch.from_numpy(uid)}


def _batches(rng: np.random.Generator, n_cols: int, sizes: list[int]) -> list[tuple]:
    out, first = [], 0
    for b in sizes:
        scores = torch.from_numpy(rng.standard_normal((b, n_cols)).astype(np.float32))
        pu = torch.from_numpy(rng.integers(0, b, 3 * b))
        pi = torch.from_numpy(rng.integers(0, n_cols, 3 * b))
        out.append((scores, _Inter(np.arange(first, first + b)), pu, pi))
        first += b
    return out


def _staged(batches: list[tuple], expected_rows: int, stage: rr._Staging | None = None) -> tuple[rr._Staging, tuple]:
    stage = rr._Staging() if stage is None else stage
    scores = batches[0][0]
    stage.open(scores, scores.numpy(), "user_id", None, expected_rows)
    for sc, inter, pu, pi in batches:
        assert stage.add(sc, inter, pu, pi)
    return stage, tuple(None if t is None else t.clone() for t in stage.take())


@pytest.mark.parametrize("expected", [0, 5, 37, 10_000])
def test_staging_sized_for_the_users_returns_what_the_doubling_buffer_returned(expected):
    rng = np.random.default_rng(3)
    batches = _batches(rng, 29, [2, 2, 5, 2, 7, 2, 2, 2, 3, 2, 2, 2, 4])  # 37 users
    _, reference = _staged(batches, 0)
    stage, got = _staged(batches, expected)
    for a, b in zip(got, reference):
        assert torch.equal(a, b)
    if expected >= 37:  # sized once for the users (at most one flush's worth plus a batch): never regrown
        assert stage.scores.shape[0] == min(expected * 29, rr._BUFFER_ELEMENTS + 2 * 29)
    else:  # too few users announced: grown by doubling, as before
        assert 37 * 29 <= stage.scores.shape[0] <= 2 * 37 * 29
    # the next evaluation with another catalogue (data changed) reuses the buffers and returns its own data
    more = _batches(rng, 41, [3, 6, 1])
    _, ref_more = _staged(more, 0)
    _, got_more = _staged(more, expected, stage)
    for a, b in zip(got_more, ref_more):
        assert torch.equal(a, b)


# ------------------------------------------------------------------------------- update / reset lifecycle
def _batch(seed: int, users: int = 400, items: int = 1500):
    """Scores of a weak recommender (the relevant item a bit above the others) and per-user exclusions (a
    different number per user: hundreds of distinct candidate counts n)."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(users, items, generator=g)
    pos = torch.randint(0, items, (users,), generator=g)
    scores[torch.arange(users), pos] += 2.0
    exclude = torch.rand(users, items, generator=g) < torch.linspace(0.0, 0.3, users)[:, None]
    exclude[torch.arange(users), pos] = False
    return scores, pos.unsqueeze(1), exclude


def _values(metric: SampledRankingMetrics) -> dict[str, float]:
    return {k: float(v) for k, v in metric.compute().items()}


def test_reset_and_new_data_recompute_and_old_data_give_the_old_values():
    metric = SampledRankingMetrics(("hit@10", "ndcg@10"), n_samples=100, max_n_groups=16)
    metric.update(*_batch(1))
    first = _values(metric)
    metric.reset()
    metric.update(*_batch(2))
    second = _values(metric)
    fresh = SampledRankingMetrics(("hit@10", "ndcg@10"), n_samples=100, max_n_groups=16)
    fresh.update(*_batch(2))  # the reference recomputation: its own histogram, sharing nothing with the run above
    assert _values(fresh) == second
    assert second != first
    assert any(k.endswith("_lo") for k in second)  # the intervals are among the compared values
    metric.reset()
    metric.update(*_batch(1))
    assert _values(metric) == first


# ------------------------------------------------------------------------- positives excluded (mask exclusions)
@pytest.mark.parametrize("seed", range(6))
def test_mask_exclusions_clash_check_without_a_sort_refuses_exactly_the_clashing_rows(seed):
    from reco_sampled_plugin.ranking import prepare_index

    rng = np.random.default_rng(seed)
    b, n = 12, 40
    mask = rng.random((b, n)) < 0.3
    pos = np.stack([rng.permutation(n)[:3] for _ in range(b)])  # distinct positives per row
    pos[rng.random((b, 3)) < 0.3] = -1  # padding
    clash = np.array([any(p >= 0 and mask[i, p] for p in pos[i]) for i in range(b)])
    if seed % 2:  # no clash: every positive taken out of its row's exclusions
        mask[np.arange(b)[:, None], np.where(pos >= 0, pos, 0)] &= pos < 0
        clash[:] = False
    if clash.any():
        with pytest.raises(ValueError, match=f"exclude: {int(clash.sum())} row"):
            prepare_index(torch.from_numpy(pos), torch.from_numpy(mask), b, n, torch.device("cpu"))
    else:
        got_pos, got_exc = prepare_index(torch.from_numpy(pos), torch.from_numpy(mask), b, n, torch.device("cpu"))
        for i in range(b):
            assert sorted(int(e) for e in got_exc[i] if e >= 0) == list(np.flatnonzero(mask[i]))


# ------------------------------------------------------------------------- gmod's basis without scipy.interpolate
@pytest.mark.parametrize("df", [4, 5, 8, 10, 14, 20])
@pytest.mark.parametrize("hi", [1e-9, 0.5, 7.4, 11.0])
def test_bspline_design_equals_scipy(df, hi):
    """``_bspline_design`` (Cox-de Boor in numpy) equals scipy's ``BSpline.design_matrix`` on gmod's clamped knots,
    at both ends, on the inner knots and inside; also on unequally spaced knots. Rows sum to one."""
    from scipy import interpolate

    from reco_sampled_plugin._gspline import bspline_design as _bspline_design

    rng = np.random.default_rng(df)
    equal = np.linspace(0.0, hi, df - 2)
    unequal = np.r_[0.0, np.sort(rng.uniform(0.0, hi, df - 4)), hi]
    for inner in (equal, unequal):
        t = np.r_[[0.0] * 3, inner, [hi] * 3]
        x = np.r_[0.0, hi, inner, rng.uniform(0.0, hi, 200)]
        got = _bspline_design(x, t, 3)
        want = interpolate.BSpline.design_matrix(x, t, 3).toarray()
        assert got.shape == (len(x), df)
        np.testing.assert_allclose(got, want, rtol=0, atol=1e-12)
        np.testing.assert_allclose(got.sum(1), 1.0, rtol=0, atol=1e-12)

