"""Smoke test of benchmarks/bench_scorer.py at a tiny size: its bookkeeping, not its speed.

The full run's exact values are those of ``exact_ranks`` on the score matrix materialised in one scorer call; the
pairs and calls the benchmark reports are those a counting wrapper around the scorer saw; the relative errors are
the textbook arithmetic; the MLP composes the dot product it is built from; the replicated world keeps the
originals' held-out items and training items.
"""

from __future__ import annotations

import math
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
import torch

from reco_sampled_plugin import metric_values
from reco_sampled_plugin.datasets import LeaveLastOutSplit
from reco_sampled_plugin.design import SamplingDesign
from reco_sampled_plugin.ranking import exact_ranks, sampled_ranks

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "benchmarks"))
try:
    import bench_scorer as bench
finally:
    sys.path.remove(str(ROOT / "benchmarks"))


def tiny_world(n_users=30, n_items=400, dim=8, seed=0) -> "bench.World":
    g = torch.Generator().manual_seed(seed)
    width = 12
    counts = torch.randint(0, width + 1, (n_users,), generator=g)
    exclude = torch.full((n_users, width), -1, dtype=torch.int64)
    positives = torch.empty(n_users, dtype=torch.int64)
    for u in range(n_users):  # test setup: distinct items per row, the first is the positive
        items = torch.randperm(n_items, generator=g)[: int(counts[u]) + 1]
        positives[u] = items[0]
        exclude[u, : int(counts[u])] = items[1:]
    return bench.World(user_emb=torch.randn(n_users, dim, generator=g), item_emb=torch.randn(n_items, dim, generator=g),
                       positives=positives, exclude=exclude, n_candidates=n_items - counts.to(torch.int64),
                       users=torch.arange(n_users))


class Counting:
    """Counts the pairs and calls a scorer receives; ``delay``: seconds slept in each call (at least that long: a
    known lower bound on the time the cost's timer must attribute to the scorer)."""

    def __init__(self, scorer, delay: float = 0.0):
        self.scorer, self.pairs, self.calls, self.delay = scorer, 0, 0, delay

    def __call__(self, users, items):
        self.pairs += items.numel()
        self.calls += 1
        if self.delay:
            time.sleep(self.delay)
        return self.scorer(users, items)


@pytest.fixture(scope="module")
def world():
    return tiny_world()


@pytest.fixture(scope="module")
def scorer(world):
    return bench.DotMLP(world.user_emb, world.item_emb, hidden=16, perturbation=0.1, seed=0)


def test_full_ranking_equals_exact_ranks_of_the_materialised_matrix(world, scorer):
    counter = Counting(scorer, delay=0.002)
    full = bench.full_ranking(counter, world, max_pairs=1000, block_users=7)
    scores = scorer(world.users, torch.arange(world.n_items).expand(world.n_users, -1))
    ref = exact_ranks(scores, world.positives, world.exclude, count_other_positives=False).reshape(-1)
    assert torch.equal(full["ranks"], ref)
    for mt in bench.METRICS:
        assert full["exact"][mt] == pytest.approx(float(metric_values(mt, ref, world.n_candidates).mean()), abs=1e-15)
    cost = full["cost"]
    assert cost.pairs == counter.pairs == world.n_users * world.n_items
    # blocks of 7 users x 400 items, calls of <= 1000 pairs: 2 rows of 400 per call
    assert cost.calls == counter.calls == sum(math.ceil(min(7, world.n_users - lo) / 2) for lo in range(0, 30, 7))
    assert cost.full_pairs == int(world.n_candidates.sum())
    assert cost.scorer_seconds > 0 and cost.loop_seconds > 0  # the loop's own work takes time too
    # every call slept 2 ms inside the scorer: the scorer's timer holds at least that, the loop's time none of it
    assert cost.scorer_seconds >= counter.calls * counter.delay
    assert cost.loop_seconds <= full["wall"] - counter.calls * counter.delay + 1e-9


@pytest.mark.parametrize("design", [20, SamplingDesign(10, adaptive_max=80)], ids=["fixed", "adaptive"])
def test_sampled_run_counts_the_pairs_the_scorer_saw(world, scorer, design):
    counter = Counting(scorer)
    run = bench.sampled_run(counter, world, design, seed=3, max_pairs=256)
    cost = run["cost"]
    assert (cost.pairs, cost.calls) == (counter.pairs, counter.calls)
    if isinstance(design, int):
        assert cost.pairs == world.n_users * (1 + design)
        scores = scorer(world.users, torch.arange(world.n_items).expand(world.n_users, -1))
        ref = sampled_ranks(scores, world.positives, design, exclude=world.exclude,
                            generator=torch.Generator().manual_seed(3))
        assert torch.equal(run["sampled"].ranks, ref.ranks)
    else:
        assert cost.stages >= 1 and cost.pairs >= world.n_users * 11
    assert set(run["estimates"]) == {(m, mt) for m in (bench.registry.DEFAULT_ESTIMATOR, "none") for mt in bench.METRICS}
    row = bench.summarise("d", [run, run], {"ndcg@10": 0.1, "hit@10": 0.2})
    assert row["pairs"] == cost.pairs and row["errors"]["none/hit@10"]["rel_sd"] == 0.0
    assert "| d |" in bench.markdown({"wall": 1.0, "cost": cost, "exact": {"ndcg@10": 0.1, "hit@10": 0.2}}, [row])


def test_rel_errors_arithmetic():
    got = bench.rel_errors([1.1, 0.9, 1.3], 1.0)
    assert got["rel_bias"] == pytest.approx(0.1)
    assert got["rel_sd"] == pytest.approx(np.std([1.1, 0.9, 1.3], ddof=1))
    assert got["rel_rmse"] == pytest.approx(math.sqrt((0.01 + 0.01 + 0.09) / 3))
    assert bench.rel_errors([0.3, 0.3], 0.2) == pytest.approx({"rel_bias": 0.5, "rel_sd": 0.0, "rel_rmse": 0.5})


def test_mlp_composes_the_dot_product(world):
    users = world.users.repeat_interleave(5)
    items = torch.randint(0, world.n_items, (users.numel(), 9), generator=torch.Generator().manual_seed(1))
    dot = bench.dot_scores(world, users, items)
    exact = bench.DotMLP(world.user_emb, world.item_emb, hidden=16, perturbation=0.0)
    torch.testing.assert_close(exact(users, items), dot, rtol=1e-5, atol=1e-5)
    noisy = bench.DotMLP(world.user_emb, world.item_emb, hidden=16, perturbation=0.1)
    share = float((noisy(users, items) - dot).std() / dot.std())
    assert 0.03 < share < 0.3  # calibrated to 0.1 on other random pairs


def test_make_world_replicates_users_and_items():
    rng = np.random.default_rng(0)
    n_u, n_i = 12, 40
    train = sp.csr_matrix((rng.random((n_u, n_i)) < 0.2).astype(np.float32))
    test_items = np.array([int(np.flatnonzero(train[u].toarray()[0] == 0)[0]) for u in range(n_u)], dtype=np.int64)
    test_items[3] = -1  # a user without a held-out item is left out
    split = LeaveLastOutSplit(train, test_items, 0, 0)
    w = bench.make_world(25, 100, dim=4, split=split, als_iterations=2)
    orig = split.test_users[np.arange(25) % (n_u - 1)]
    assert w.item_emb.shape == (100, 4) and w.user_emb.shape == (25, 4)
    assert torch.equal(w.positives, torch.from_numpy(test_items[orig]))
    counts = np.diff(train.indptr)[orig]
    assert torch.equal(w.n_candidates, torch.from_numpy(100 - counts.astype(np.int64)))
    for r in (0, 11, 24):
        assert sorted(w.exclude[r][w.exclude[r] >= 0].tolist()) == sorted(train[orig[r]].indices.tolist())
    assert not torch.equal(w.user_emb[: n_u - 1], w.user_emb[n_u - 1: 2 * (n_u - 1)])  # replicas carry noise
    assert bool(torch.isfinite(w.item_emb).all()) and float(w.item_emb[:n_i].abs().sum()) > 0
    with pytest.raises(ValueError, match="n_items"):
        bench.make_world(25, 30, split=split)


def test_blocked_loop_scores_the_same_pairs(world, scorer):
    counter = Counting(scorer, delay=0.002)
    got = bench.blocked_loop(counter, world, 20, seed=0, blocks=4, max_pairs=256)
    assert got["pairs"] == counter.pairs == world.n_users * 21
    # the loop draws and counts (its own time > 0); the 2 ms each call slept are the scorer's, not the loop's
    assert got["scorer_seconds"] > 0 and got["loop_seconds"] > 0
    assert got["scorer_seconds"] >= counter.calls * counter.delay
    assert got["loop_seconds"] <= got["wall"] - counter.calls * counter.delay + 1e-9


def test_prepared_loop_scores_what_one_call_scores(world, scorer):
    from reco_sampled_plugin.exclusions import prepare_exclusions

    design = SamplingDesign(5, adaptive_max=40)
    ex = prepare_exclusions(world.exclude, world.n_items)
    one = bench.sampled_run(scorer, world, design, seed=0, methods=())["cost"]
    got = bench.prepared_loop(scorer, world, design, ex, seed=0)
    assert (got.pairs, got.calls, got.full_pairs, got.stages) == (one.pairs, one.calls, one.full_pairs, one.stages)
