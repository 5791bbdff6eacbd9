"""Ranks and per-user metrics straight from factors (score tiles, never stored) against the materialized scores."""

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from _profiles import examples
from reco_sampled_plugin import counting, exact_ranks, exact_ranks_from_factors, per_user_metrics


def _problem(seed: int, b=37, n=1_000, d=6, integer=True, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    if integer:  # small integers: every score exact in float32, many exact ties
        u = torch.randint(-2, 3, (b, d), generator=g).to(dtype)
        v = torch.randint(-2, 3, (n, d), generator=g).to(dtype)
    else:
        u = torch.randn(b, d, generator=g, dtype=dtype)
        v = torch.randn(n, d, generator=g, dtype=dtype)
    perm = torch.stack([torch.randperm(n, generator=g) for _ in range(b)])
    pos = perm[:, :6].clone()
    pos[::3, 4:] = -1  # padded slots
    exc = perm[:, 6:26].clone()
    exc[::4, 10:] = -1
    return u, v, pos, exc


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
@pytest.mark.parametrize("other", [True, False])
@pytest.mark.parametrize("backend", ["eager", "compiled"])
def test_equal_to_exact_ranks_on_materialized_scores_with_ties(ties, other, backend):
    """Exactly representable scores (many ties): identical to exact_ranks(U @ V.T) for every tie policy,
    with exclusions, padding, other positives competing or not, and tiles that cut rows and columns."""
    u, v, pos, exc = _problem(1)
    want = exact_ranks(u @ v.T, pos, exc, ties, count_other_positives=other)
    try:
        counting.set_backend(backend)
        for tile in (1 << 22, 3 * 128, 1_000 * 7):
            got = exact_ranks_from_factors(u, v, pos, exc, ties, count_other_positives=other, tile_elements=tile)
            assert got.dtype == want.dtype
            assert torch.equal(got, want), (ties, other, tile)
    finally:
        counting.set_backend("auto")
    assert bool((want[pos >= 0] > 1).any()) and bool((want[pos < 0] == 0).all())


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
@pytest.mark.parametrize("threads", [2, 3])
def test_tiles_counted_in_threads_equal_the_materialized_scores(ties, threads, monkeypatch):
    """On a CPU with several torch threads, large calls split their tiles between threads (``counting.tile_workers``,
    each tile's matmul and count on one core, each range its own sums): ranks identical to exact_ranks(U @ V.T) with a bias, exclusions,
    padding and rows that leave a short last block, factors that require grad and inference tensors; torch's thread
    count is 1 inside the workers and restored after, also when two calls overlap or one raises."""
    import threading

    u, v, pos, exc = _problem(4, b=37, n=1_000)
    bias = torch.randint(-2, 3, (1_000,)).float()
    want = exact_ranks(u @ v.T + bias, pos, exc, ties)
    monkeypatch.setattr(counting, "_THREAD_MIN_WORK", 0)  # these small calls split as large ones do
    monkeypatch.setattr(counting, "_backend", "eager")
    seen, saved = [], torch.get_num_threads()
    tile = counting.count_beating_tile

    def counted(*args, **kwargs):
        seen.append((threading.current_thread().name, torch.get_num_threads()))
        return tile(*args, **kwargs)

    import reco_sampled_plugin.factor_ranks as fr

    monkeypatch.setattr(fr, "count_beating_tile", counted)
    torch.set_num_threads(threads)
    try:
        assert fr.tile_workers(8, 10**9) == threads
        got = exact_ranks_from_factors(u, v, pos, exc, ties, item_bias=bias, tile_elements=5 * 128)  # 5-row blocks
        assert torch.equal(got, want)
        # every tile counted on the pool's threads (which of them takes a range is the pool's choice), with one
        # torch thread each; the caller's count restored
        assert {name.startswith("reco-count") for name, _ in seen} == {True} and {k for _, k in seen} == {1}
        assert torch.get_num_threads() == threads
        results = [None, None]

        def call(i: int) -> None:
            results[i] = exact_ranks_from_factors(u, v, pos, exc, ties, item_bias=bias, tile_elements=5 * 128)

        callers = [threading.Thread(target=call, args=(i,)) for i in range(2)]
        for c in callers:
            c.start()
        for c in callers:
            c.join()
        assert all(torch.equal(r, want) for r in results) and torch.get_num_threads() == threads
        # the caller's grad and inference modes hold in the workers (thread-local in torch): factors that require
        # grad (a model's parameters), and inference tensors written into inside inference mode (Lightning's)
        ug, vg = u.clone().requires_grad_(), v.clone().requires_grad_()
        assert torch.equal(exact_ranks_from_factors(ug, vg, pos, exc, ties, item_bias=bias, tile_elements=640), want)
        with torch.inference_mode():
            ui, vi = ug * 1, vg * 1
            assert torch.equal(exact_ranks_from_factors(ui, vi, pos, exc, ties, item_bias=bias, tile_elements=640),
                               want)
        monkeypatch.setattr(fr, "count_beating_tile", lambda *a, **k: 1 / 0)
        with pytest.raises(ZeroDivisionError):
            exact_ranks_from_factors(u, v, pos, exc, ties, item_bias=bias, tile_elements=5 * 128)
        assert torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(saved)


def test_tile_threads_only_where_no_tile_can_compile(monkeypatch):
    """One loop (torch threading each tile's matmul) below ``_THREAD_MIN_WORK``, with one torch thread, one tile,
    the torch loop, half-precision factors, torch's native thread pool, the compiled backend, or an ``auto`` process that this call could take past the compile
    bound (a compilation must not start in a worker); else torch's threads."""
    monkeypatch.setattr(counting, "_backend", "auto")
    monkeypatch.setattr(counting, "_work_done", [0])
    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        big = counting._THREAD_MIN_WORK
        assert counting.tile_workers(200, big) == 2
        assert counting.tile_workers(200, big - 1) == 1
        assert counting.tile_workers(1, big) == 1
        assert counting.tile_workers(200, counting._COMPILE_AFTER_WORK_FAST) == 1
        monkeypatch.setattr(counting, "_numpy_blocked", [True])
        assert counting.tile_workers(200, big) == 1
        monkeypatch.setattr(counting, "_numpy_blocked", [False])
        monkeypatch.setattr(counting, "_backend", "compiled")
        assert counting.tile_workers(200, big) == 1
        monkeypatch.setattr(counting, "_backend", "eager")
        assert counting.tile_workers(200, counting._COMPILE_AFTER_WORK_FAST) == 2
        # half precision takes the torch loop, compiled from 2^32 comparisons on (not numpy's 2^36): never split
        monkeypatch.setattr(counting, "_backend", "auto")
        assert counting.tile_workers(200, big, torch.float64) == 2
        assert counting.tile_workers(200, big, torch.bfloat16) == counting.tile_workers(200, big, torch.float16) == 1
        # torch's native backend (one process-wide pool, fixed once parallel work has started): never split
        monkeypatch.setattr(counting, "torch_threads_per_thread", lambda: False)
        assert counting.tile_workers(200, big) == 1
        monkeypatch.setattr(counting, "torch_threads_per_thread", lambda: True)
        torch.set_num_threads(1)
        assert counting.tile_workers(200, big) == 1
    finally:
        torch.set_num_threads(saved)


def test_one_torch_thread_is_per_thread_and_nested_splits_run_inline():
    """``one_torch_thread`` sets and restores the calling thread's own torch threads (thread-local in torch), so two
    threads whose blocks overlap (A enters, B enters, A leaves, B leaves) each get their count back (and with torch's
    native pool, process-wide, it changes nothing); a range of
    ``row_ranges`` that splits again runs that split inline on its worker (waiting on the pool it runs in could
    take every pool thread), on one torch thread, and every range runs once."""
    import threading

    from reco_sampled_plugin import _pool
    from reco_sampled_plugin._blas import one_torch_thread

    saved = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        a_in, b_in, a_out = threading.Event(), threading.Event(), threading.Event()
        after = {}

        def a() -> None:
            torch.set_num_threads(2)
            with one_torch_thread():
                a_in.set()
                b_in.wait(10)
            a_out.set()
            after["A"] = torch.get_num_threads()

        def b() -> None:
            torch.set_num_threads(2)
            a_in.wait(10)
            with one_torch_thread():
                b_in.set()
                a_out.wait(10)
                after["B inside"] = torch.get_num_threads()
            after["B"] = torch.get_num_threads()

        threads = [threading.Thread(target=a), threading.Thread(target=b)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        assert after == {"A": 2, "B inside": 1, "B": 2}
        from reco_sampled_plugin import _blas

        saved_backend = _blas._TORCH_OPENMP[0]
        _blas._TORCH_OPENMP[0] = False  # torch's native pool: its size is not the thread's to change
        try:
            with one_torch_thread():
                assert torch.get_num_threads() == 2
        finally:
            _blas._TORCH_OPENMP[0] = saved_backend

        ran, names = [], set()

        def outer(first: int, last: int) -> None:
            def inner(lo: int, hi: int) -> None:
                ran.append((first + lo, first + hi))
                names.add((threading.current_thread().name, torch.get_num_threads()))

            _pool.row_ranges(inner, last - first, 1, 2)

        done = threading.Thread(target=_pool.row_ranges, args=(outer, 8, 1, 2))
        done.start()
        done.join(30)
        assert not done.is_alive()  # no wait on the pool from inside it
        assert sorted(ran) == [(0, 4), (4, 8)] and {k for _, k in names} == {1}
        assert all(name.startswith("reco-count") for name, _ in names) and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(saved)


def test_equal_on_random_float64_factors_and_large_tiles():
    u, v, pos, exc = _problem(2, b=300, n=20_000, d=16, integer=False, dtype=torch.float64)
    want = exact_ranks(u @ v.T, pos, exc)
    assert torch.equal(exact_ranks_from_factors(u, v, pos, exc), want)
    assert torch.equal(exact_ranks_from_factors(u, v, pos[:, 0]), exact_ranks(u @ v.T, pos[:, 0]))


def test_per_user_metrics_of_factors_equal_the_score_path():
    u, v, pos, exc = _problem(3)
    a = per_user_metrics(u @ v.T, pos, exclude=exc, as_frame=False)
    b = per_user_metrics((u, v), pos, exclude=exc, as_frame=False)
    assert list(a) == list(b) and len(a) == 10
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)
    frame = per_user_metrics((u, v), pos, ["ndcg@5", "auc"], exclude=exc)
    assert list(frame.columns) == ["NDCG@5", "ROC_AUC"] and len(frame) == u.shape[0]


def test_bad_inputs_name_the_argument():
    u, v, pos, exc = _problem(4)
    with pytest.raises(ValueError, match="user_factors: contains NaN"):
        exact_ranks_from_factors(u.clone().index_fill_(0, torch.tensor([2]), math.nan), v, pos)
    with pytest.raises(ValueError, match="item_factors: 5 factors"):
        exact_ranks_from_factors(u, v[:, :5], pos)
    with pytest.raises(ValueError, match="item_factors: dtype"):
        exact_ranks_from_factors(u, v.double(), pos)
    with pytest.raises(ValueError, match="ties: 'random'"):
        exact_ranks_from_factors(u, v, pos, ties="random")
    with pytest.raises(ValueError, match="exclude: .* exclude one of their own positives"):
        exact_ranks_from_factors(u, v, pos, torch.cat([exc, pos[:, :1]], 1))
    with pytest.raises(ValueError, match="k = 2000"):
        per_user_metrics((u, v), pos, ["ndcg@2000"])
    # factors whose scores could overflow: ranked on the materialized scores, whose check names the rows
    big = u.clone()
    big[5] = 3e38
    with pytest.raises(ValueError, match="NaN or inf in"):
        exact_ranks_from_factors(big, v, pos)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
def test_item_bias_equals_ranking_the_biased_scores(ties):
    """An MF model's item bias (score = <u, v_i> + b_i): identical to exact_ranks(U @ V.T + b), ties included
    (small integers and halves: every score exact), across tiles; per-user metrics likewise."""
    u, v, pos, exc = _problem(5)
    g = torch.Generator().manual_seed(5)
    bias = torch.randint(-4, 5, (v.shape[0],), generator=g).to(v.dtype) / 2
    want = exact_ranks(u @ v.T + bias, pos, exc, ties)
    for tile in (1 << 22, 5 * 256):
        assert torch.equal(exact_ranks_from_factors(u, v, pos, exc, ties, item_bias=bias, tile_elements=tile), want)
    assert not torch.equal(exact_ranks_from_factors(u, v, pos, exc, ties), want)  # the bias matters here
    a = per_user_metrics((u, v, bias), pos, ["ndcg@10", "auc"], exclude=exc, as_frame=False)
    b = per_user_metrics(u @ v.T + bias, pos, ["ndcg@10", "auc"], exclude=exc, as_frame=False)
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)


def test_item_bias_errors_and_inference_tensors():
    u, v, pos, _ = _problem(6)
    with pytest.raises(ValueError, match=r"item_bias: expected \(1000,\)"):
        exact_ranks_from_factors(u, v, pos, item_bias=torch.zeros(999))
    with pytest.raises(ValueError, match="item_bias: expected"):
        exact_ranks_from_factors(u, v, pos, item_bias=torch.zeros(1000, dtype=torch.float64))
    with pytest.raises(ValueError, match="item_bias: contains NaN"):
        exact_ranks_from_factors(u, v, pos, item_bias=torch.zeros(1000).index_fill_(0, torch.tensor([7]), math.nan))
    # Lightning evaluates under inference mode: inference tensors have no version counter (norm not cached)
    want = exact_ranks(u @ v.T, pos)
    with torch.inference_mode():
        ui, vi = u.clone(), v.clone()
        assert vi.is_inference()
        assert torch.equal(exact_ranks_from_factors(ui, vi, pos), want)
        vi[pos[0, 0]] = 100.0  # changed in place: a cached norm would be stale and miss the overflow bound
        assert torch.equal(exact_ranks_from_factors(ui, vi, pos), exact_ranks(ui @ vi.T, pos))
    # factors that require grad are ranked without autograd (ranks are not differentiable)
    assert torch.equal(exact_ranks_from_factors(u.requires_grad_(), v, pos), want)


def test_item_norm_cache_never_serves_a_new_tensor():
    """The cached item-factor norm belongs to one tensor object: an item tower returning a new tensor every
    batch (which can land on a freed tensor's id and address, version 0) is checked every time."""
    from reco_sampled_plugin import factor_ranks

    g = torch.Generator().manual_seed(0)
    base = torch.randn(200, 8, generator=g)
    bad = torch.zeros(200, 8)
    bad[:4] = math.nan
    u, pos = -torch.ones(4, 8), torch.arange(4).unsqueeze(1)
    for step in range(60):  # alternate clean and NaN towers; addresses get reused within a few steps
        v = base + (bad if step % 2 else 0.0)
        if step % 2:
            with pytest.raises(ValueError, match="contains NaN"):
                exact_ranks_from_factors(u, v, pos)
        else:
            exact_ranks_from_factors(u, v, pos)
            assert factor_ranks._item_norm is not None and factor_ranks._item_norm[0]() is v  # cached for v itself
        del v


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_row_norm_max_on_a_cpu_equals_float64_norms(dtype):
    """The overflow bound's largest row norm (numpy's float64 sums of squares on a CPU) equals torch's float64
    ``vector_norm`` to rounding: random factors, a transposed (strided) view, entries whose float32 squares would
    overflow (1e20) or whose float64 norm leaves float32's range (3e38 x 8), NaN and inf rows (NaN, inf)."""
    from reco_sampled_plugin.factor_ranks import _row_norm_max

    g = torch.Generator().manual_seed(4)
    cases = [torch.randn(300, 64, generator=g, dtype=dtype), torch.randn(9, 40, generator=g, dtype=dtype).T,
             torch.full((3, 64), 1e20, dtype=dtype), torch.full((2, 64), 3e38, dtype=dtype),
             torch.tensor([[1.0, math.nan], [5.0, 0.0]], dtype=dtype), torch.tensor([[math.inf, 0.0], [1.0, 2.0]], dtype=dtype),
             torch.zeros(4, 0, dtype=dtype)]
    for x in cases:
        want = torch.linalg.vector_norm(x.double(), dim=1).amax()
        got = _row_norm_max(x)
        assert got.dtype == torch.float64 and got.shape == ()
        assert torch.allclose(got, want, rtol=1e-12, atol=0.0, equal_nan=True), (x.shape, got, want)
    assert float(_row_norm_max(torch.full((3, 64), 1e20))) == pytest.approx(8e20, rel=1e-7)  # not inf
    assert _row_norm_max(torch.tensor([[1e300, 1.0]], dtype=torch.float64)) == math.inf  # squares past float64: inf


@given(b=st.integers(0, 6), n=st.integers(1, 7), d=st.integers(0, 5), wide=st.booleans(), seed=st.integers(0, 2**31 - 1))
@settings(max_examples=examples(40), deadline=None)
def test_factor_norms_on_numpy_equal_the_torch_path(b, n, d, wide, seed):
    """The CPU's numpy norms (``overflow_rows``, the bound's ``_row_norm_max``) equal the accelerators' torch path
    (float64 copies, ``vector_norm``) on factors with NaN, +-inf, huge (squares past float32's range) and tiny
    entries: the same flags, the same largest norm to rounding."""
    from reco_sampled_plugin.factor_ranks import _row_norm_max, overflow_rows

    rng = np.random.default_rng(seed)
    special = np.array([np.nan, np.inf, -np.inf, 1e20, 3e38, 1e-30, 0.0, 1.0, -2.0])

    def factors(rows: int) -> torch.Tensor:
        x = rng.standard_normal((rows, d)) * 10.0 ** rng.integers(-3, 38, (rows, 1))
        x = np.where(rng.random((rows, d)) < 0.2, rng.choice(special, (rows, d)), x)
        with np.errstate(over="ignore"):  # beyond float32: inf
            return torch.from_numpy(x.astype(np.float64 if wide else np.float32))

    u, v = factors(b), factors(n)
    got = (overflow_rows(u, v), [_row_norm_max(x) for x in (u, v)])
    counting._numpy_blocked[0] = True
    try:
        want = (overflow_rows(u, v), [_row_norm_max(x) for x in (u, v)])
    finally:
        counting._numpy_blocked[0] = False
    assert got[0].dtype == torch.bool and torch.equal(got[0], want[0])
    for g_, w_ in zip(got[1], want[1]):
        assert torch.allclose(g_, w_, rtol=1e-12, atol=0.0, equal_nan=True), (g_, w_)


@pytest.mark.parametrize("numpy_path", [True, False])
def test_finite_float64_factors_whose_norms_overflow_rank_materialised(numpy_path):
    """float64 factors past ~1e154 (their squares pass float64's range: an inf norm) whose scores are finite are
    ranked, from the materialised scores, not refused as holding NaN or inf (an inf entry still is), on both
    paths of the norms."""
    u = torch.tensor([[1e200, 0.0], [1.0, 1.0]], dtype=torch.float64)
    v = torch.tensor([[1e-200, 0.0], [1.0, 2.0], [3.0, 1.0]], dtype=torch.float64)
    pos = torch.tensor([[0], [2]])
    counting._numpy_blocked[0] = not numpy_path
    try:
        assert exact_ranks_from_factors(u, v, pos).tolist() == exact_ranks(u @ v.T, pos).tolist() == [[3], [1]]
        u[1, 0] = math.inf
        with pytest.raises(ValueError, match="^user_factors: contains NaN or inf"):
            exact_ranks_from_factors(u, v, pos)
    finally:
        counting._numpy_blocked[0] = False


def test_overflow_rows_and_other_positive_counts():
    """overflow_rows flags exactly the users whose Cauchy-Schwarz bound reaches score_limit (a quarter of the
    dtype's largest value; NaN entries count as 0, inf ones overflow); other_positive_counts counts the row's other
    valid positives scoring >= / > each positive, brute force."""
    from reco_sampled_plugin.factor_ranks import other_positive_counts, overflow_rows, score_limit

    assert score_limit(torch.float32) == torch.finfo(torch.float32).max / 4
    v = torch.tensor([[3.0, 4.0], [1.0, 0.0]])  # largest item norm 5
    u = torch.tensor([[1.0, 0.0], [0.0, 1e38], [0.0, 1.5e37], [math.nan, 1.0], [math.inf, 0.0]])
    limit = score_limit(torch.float32)
    want = [5.0 >= limit, 5e38 >= limit, 7.5e37 >= limit, False, True]
    assert overflow_rows(u, v).tolist() == want == [False, True, False, False, True]
    g = torch.Generator().manual_seed(2)
    s = torch.randint(-2, 3, (30, 5), generator=g).double()
    valid = torch.rand(30, 5, generator=g) < 0.7
    ge, gt = other_positive_counts(s, valid)
    for r in range(30):
        for i in range(5):
            others = [j for j in range(5) if j != i and valid[r, j] and valid[r, i]]
            assert ge[r, i] == sum(s[r, j] >= s[r, i] for j in others)
            assert gt[r, i] == sum(s[r, j] > s[r, i] for j in others)


def test_per_user_metrics_reads_nested_tuples_of_numbers_as_score_rows():
    """Only a tuple of tensors or arrays is factors: score rows given as nested tuples rank like the same list."""
    from reco_sampled_plugin import per_user_metrics

    rows = ((0.1, 0.9, 0.3), (0.5, 0.2, 0.7), (0.3, 0.1, 0.2), (0.0, 0.4, 0.8))
    pos = torch.tensor([[1], [0], [0], [2]])
    got = per_user_metrics(rows, pos, metrics=("hit@1", "ndcg@2"), as_frame=False)
    want = per_user_metrics(torch.tensor(rows), pos, metrics=("hit@1", "ndcg@2"), as_frame=False)
    assert torch.equal(got["Hit@1"], torch.tensor([1.0, 0.0, 1.0, 1.0], dtype=torch.float64))
    for key in want:
        assert torch.equal(got[key], want[key])


def test_per_user_metrics_reads_factors_given_as_lists_of_lists():
    """A tuple of nested lists (user_factors.tolist(), item_factors.tolist()) is factors, not score rows."""
    from reco_sampled_plugin import per_user_metrics

    g = torch.Generator().manual_seed(3)
    u, v = torch.randn(4, 3, generator=g, dtype=torch.float64), torch.randn(7, 3, generator=g, dtype=torch.float64)
    pos = torch.tensor([[0], [1], [2], [3]])
    got = per_user_metrics((u.tolist(), v.tolist()), pos, metrics=("ndcg@5",), as_frame=False)
    want = per_user_metrics(u @ v.T, pos, metrics=("ndcg@5",), as_frame=False)
    torch.testing.assert_close(got["NDCG@5"], want["NDCG@5"])
