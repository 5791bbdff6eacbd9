"""GPU-readiness of the factor path: host syncs, temporaries, tile choice and precision of
``exact_ranks_from_factors`` / ``factor_ranks_padded`` / ``positive_scores``, probed on the CPU (and on CUDA
when the machine has it, through the ``device`` fixture)."""

import pytest
import torch
from _budgets import count_syncs, peak_temporary

from reco_sampled_plugin import exact_ranks, exact_ranks_from_factors
from reco_sampled_plugin import factor_ranks
from reco_sampled_plugin.factor_ranks import factor_ranks_padded, positive_scores, tile_shape
from reco_sampled_plugin.ranking import prepare_index

# Syncs of one exact_ranks_from_factors call. The factor path itself reads the device once (the overflow bound:
# user-factor norm, item-factor norm unless cached, bias, stacked into one read) and never per tile; at most
# FACTOR_PATH_SYNCS is allowed. The rest is prepare_index's validation of the positives and exclusions
# (the core's budget: <= 4), so the whole call stays within TOTAL_SYNCS = 4 + 2. Measured when written: 1 + 1
# (the factor path's stacked read and prepare_index's fused validation read); before: 12-14 at 1,024 x 100,000
# (9 validation reads, 2 norm reads, one nonzero per tile), growing with n.
FACTOR_PATH_SYNCS = 2
TOTAL_SYNCS = 6


def _problem(b, n, d=8, n_pos=5, n_exc=20, seed=0, device="cpu", integer=False):
    g = torch.Generator().manual_seed(seed)
    if integer:  # small integers: every score exact (and many ties)
        u = torch.randint(-2, 3, (b, d), generator=g).float()
        v = torch.randint(-2, 3, (n, d), generator=g).float()
    else:
        u = torch.randn(b, d, generator=g)
        v = torch.randn(n, d, generator=g)
    items = torch.stack([torch.randperm(n, generator=g)[: n_pos + n_exc] for _ in range(b)])
    pos, exc = items[:, :n_pos].clone(), items[:, n_pos:].clone()
    pos[::3, 3:] = -1  # padded slots
    exc[::4, 10:] = -1
    return u.to(device), v.to(device), pos.to(device), exc.to(device)


@pytest.mark.parametrize("ties", ["pessimistic", "average"])
def test_sync_count_is_constant_in_batch_and_catalogue_size(device, backend, ties):
    """The same number of host syncs for one tile or ~80 (a per-tile nonzero used to add one per tile), and
    the factor path's own share within FACTOR_PATH_SYNCS."""
    counts = []
    for b, n in ((37, 1_000), (150, 8_000)):
        u, v, pos, exc = _problem(b, n, device=device)
        bias = torch.randn(n, generator=torch.Generator().manual_seed(1)).to(device)
        for tile in (None, 1 << 14):  # the default tile (1 tile at the small size) and up to ~80 small ones
            exact_ranks_from_factors(u, v, pos, exc, ties, item_bias=bias, tile_elements=tile)  # warm (compile)
            want = exact_ranks(u @ v.T + bias, pos, exc, ties)
            got, c = count_syncs(exact_ranks_from_factors, u, v, pos, exc, ties, item_bias=bias, tile_elements=tile)
            counts.append(c.count)
            assert c.count <= TOTAL_SYNCS, dict(c.calls)
            # the factor path alone (validated inputs): one read, whatever the number of tiles
            p, e = prepare_index(pos, exc, b, n, u.device)
            _, own = count_syncs(factor_ranks_padded, u, v, bias, p, e, ties, True, tile)
            assert own.count <= FACTOR_PATH_SYNCS, dict(own.calls)
            # random float scores: ranks equal up to rounding ties (none expected at this size)
            assert (got.double() - want.double()).abs().max() <= 1, (b, n, tile)
    assert len(set(counts)) == 1, counts


def test_item_norm_cache_and_fresh_item_tensors_cost_the_same_syncs():
    """An item tower returning a new tensor every batch (norm not cached) reads the device no more often:
    the item norm joins the same stacked read."""
    u, v, pos, exc = _problem(16, 500)
    p, e = prepare_index(pos, exc, 16, 500, u.device)
    factor_ranks_padded(u, v, None, p, e)  # v's norm now cached
    _, cached = count_syncs(factor_ranks_padded, u, v, None, p, e)
    _, fresh = count_syncs(factor_ranks_padded, u, v.clone(), None, p, e)
    assert cached.count == fresh.count == 1, (dict(cached.calls), dict(fresh.calls))


@pytest.mark.parametrize("ties", ["pessimistic", "average"])
def test_peak_temporary_is_one_tile_plus_the_indices(device, ties):
    """Never a B x n temporary: the largest tensor any op produces stays within one tile (P tiles for the
    eager count's boolean block), a slice of the item factors, and O(B (P + E)) index work. (The eager
    counting backend: a compiled kernel's insides are not visible to the probe, its temporaries are smaller.)"""
    from reco_sampled_plugin import counting

    b, n, d, n_pos, n_exc = 32, 20_000, 8, 5, 50
    u, v, pos, exc = _problem(b, n, d, n_pos, n_exc, device=device)
    tile = 1 << 12
    before = counting.get_backend()
    counting.set_backend("eager")
    try:
        exact_ranks_from_factors(u, v, pos, exc, ties, tile_elements=tile)
        _, rec = peak_temporary(exact_ranks_from_factors, u, v, pos, exc, ties, tile_elements=tile)
    finally:
        counting.set_backend(before)
    _, cols = tile_shape(b, n, device, tile)
    bound = max(n_pos * tile, cols * d) + 4 * b * (n_pos + n_exc) + 1
    assert rec.peak <= bound, (rec.peak, rec.op, bound)
    assert rec.peak * 10 < b * n


def test_peak_temporary_at_the_default_tile():
    """A 2,048-user batch of 20,000 items (41M scores) at the default tile: the peak is one tile."""
    b, n = 2_048, 20_000
    u, v, pos, exc = _problem(b, n, d=4)
    exact_ranks_from_factors(u[:64], v, pos[:64], exc[:64])
    _, rec = peak_temporary(exact_ranks_from_factors, u, v, pos, exc)
    assert rec.peak <= factor_ranks.TILE_ELEMENTS + 1 < b * n // 4, (rec.peak, rec.op)


def test_positive_scores_gather_in_bounded_chunks(monkeypatch):
    """Scores of many items per user (P positives x m sampled items, as the adapters' sampled ranks from
    factors ask): the gathered item factors come in chunks, never a B x K x d tensor; values unchanged."""
    g = torch.Generator().manual_seed(3)
    b, n, d, k = 32, 1_000, 16, 2_000
    u, v = torch.randn(b, d, generator=g), torch.randn(n, d, generator=g)
    bias = torch.randn(n, generator=g)
    items = torch.randint(-1, n, (b, k), generator=g)
    want = (u.unsqueeze(1) * v[items.clamp(min=0)]).sum(-1) + bias[items.clamp(min=0)]
    monkeypatch.setattr(factor_ranks, "_GATHER_ELEMENTS", 1 << 14)
    got, rec = peak_temporary(positive_scores, u, v, bias, items)
    torch.testing.assert_close(got, want)
    assert rec.peak <= max(1 << 14, b * k), (rec.peak, rec.op)  # the (B, K) output is the largest
    assert rec.peak < b * k * d // 4


def test_tile_shape_per_device_and_size():
    """CPU: cache-sized tiles (at most TILE_ELEMENTS scores, at most _TILE_ITEMS items wide), balanced blocks;
    an accelerator: one tile for a whole batch when it fits ACCELERATOR_TILE_ELEMENTS."""
    for b in (256, 512, 1_024, 4_096, 1_000):
        rows, cols = tile_shape(b, 100_000, "cpu")
        assert rows * cols <= factor_ranks.TILE_ELEMENTS and cols <= factor_ranks._TILE_ITEMS
        for size, step in ((100_000, cols), (b, rows)):  # balanced: the last block short by less than one per block
            blocks = -(-size // step)
            assert size - (blocks - 1) * step > step - blocks, (b, rows, cols)
    assert tile_shape(256, 100_000, "cpu") == (256, 4_000)
    assert tile_shape(1_024, 65_536, "cuda") == (1_024, 65_536)  # 2^26 scores: the whole batch
    rows, cols = tile_shape(4_096, 100_000, "cuda")
    assert (rows, cols) == (586, 100_000)  # 671 rows fit 2^26 scores: 7 balanced blocks of 586
    assert tile_shape(10, 7, "cpu", 3) == (1, 3)  # tiny explicit tiles still cover everything
    assert tile_shape(1, 1, "cpu") == (1, 1)


@pytest.mark.parametrize("ties", ["pessimistic", "optimistic", "average"])
def test_autocast_does_not_change_the_ranks(ties):
    """Under torch.autocast the tile matmul and the positives' dot products would be cast to bfloat16 by
    different rules (ranks then differed in 228 of 320 slots here); the factor path turns autocast off, so
    the ranks are those of float32 scores, bias and sampled-item scores included."""
    u, v, pos, exc = _problem(64, 3_000, d=32, seed=5)
    bias = torch.randn(3_000, generator=torch.Generator().manual_seed(6))
    want = exact_ranks_from_factors(u, v, pos, exc, ties, item_bias=bias, tile_elements=1 << 15)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = exact_ranks_from_factors(u, v, pos, exc, ties, item_bias=bias, tile_elements=1 << 15)
        s = positive_scores(u, v, bias, pos)
    assert torch.equal(got, want)
    assert s.dtype == torch.float32 and torch.equal(s, positive_scores(u, v, bias, pos))
    # and against the materialized float32 scores (exact integer scores: no rounding question at all)
    ui, vi, pos_i, exc_i = _problem(64, 3_000, d=32, seed=7, integer=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got_i = exact_ranks_from_factors(ui, vi, pos_i, exc_i, ties)
    assert torch.equal(got_i, exact_ranks(ui @ vi.T, pos_i, exc_i, ties))


def test_masked_items_outside_a_tile_never_leak_into_it():
    """Exclusions and positives at every tile edge (first and last column of each block, the narrower last
    block), with tiles that cut rows and columns: identical to exact_ranks on exact scores."""
    b, n = 12, 9_001  # n > _TILE_ITEMS: tiles of several rows and columns, the last column block narrower
    u, v, _, _ = _problem(b, n, d=4, integer=True, seed=9)
    for tile in (7 * 100, 1 << 14, 1 << 20):
        rows, cols = tile_shape(b, n, "cpu", tile)
        edges = sorted({c for c0 in range(0, n, cols) for c in (c0, min(n, c0 + cols) - 1)})
        inner = sorted(set(range(n)) - set(edges))
        L = len(edges)
        pos = torch.tensor([[edges[i % L], inner[i], edges[(i + 1) % L], inner[i + b]] for i in range(b)])
        exc = torch.full((b, L), -1)
        for i in range(b):  # every other edge item excluded (all of them in even rows)
            rest = [e for e in edges if e not in pos[i].tolist()][:: 1 + i % 2]
            exc[i, : len(rest)] = torch.tensor(rest)
        want = exact_ranks(u @ v.T, pos, exc)
        assert torch.equal(exact_ranks_from_factors(u, v, pos, exc, tile_elements=tile), want), tile


def test_check_finite_factors_reads_once_and_names_the_argument(device):
    from reco_sampled_plugin.factor_ranks import check_finite_factors

    u, v, _, _ = _problem(8, 50, device=device)
    bias = torch.zeros(50, device=device)
    _, c = count_syncs(check_finite_factors, u, v, bias)
    assert c.count == 1, dict(c.calls)
    for name, bad in (("user_factors", u.clone()), ("item_factors", v.clone()), ("item_bias", bias.clone())):
        bad.view(-1)[3] = float("nan")
        args = {"user_factors": (bad, v, bias), "item_factors": (u, bad, bias), "item_bias": (u, v, bad)}[name]
        with pytest.raises(ValueError, match=f"{name}: contains NaN or inf"):
            check_finite_factors(*args)
