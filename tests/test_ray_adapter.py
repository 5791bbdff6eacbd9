"""The Ray Data adapter (reco_sampled_plugin.adapters.ray): a block's state is a pure function of its rows (keyed
draws), so any split into blocks, any actor count and a killed, retried actor give the one-process numbers bit for
bit; checked on a real local Ray cluster (no mocks). Skipped only where Ray is missing or too old (`make test`
installs a supported Ray)."""

import dataclasses
import os
import sys

import numpy as np
import pytest
import torch

try:
    from reco_sampled_plugin.adapters import ray as rr
except ImportError as err:  # only the adapter's own message (Ray missing or too old): anything else is a failure
    if "reco_sampled_plugin.adapters.ray needs Ray" not in str(err):
        raise
    pytest.skip(str(err), allow_module_level=True)

import pyarrow as pa
import ray

from _popularity_helpers import canonical_rows
from reco_sampled_plugin import SamplingDesign
from reco_sampled_plugin._design_based import KeyedInclusion, ShareTable
from reco_sampled_plugin.design import ExactShare

N_ITEMS, N_USERS = 150, 90


class Factory:
    """A dot-product scorer over fixed factors (float64), built per actor; with ``marker`` its first call kills the
    actor's process (``os._exit``) unless the marker file exists, which it creates first: the retry then runs."""

    def __init__(self, marker: str | None = None) -> None:
        g = torch.Generator().manual_seed(7)
        self.u = torch.randn(N_USERS, 6, generator=g, dtype=torch.float64)
        self.v = torch.randn(N_ITEMS, 6, generator=g, dtype=torch.float64)
        self.marker = marker

    def __call__(self, device):
        u, v, marker = self.u.to(device), self.v.to(device), self.marker

        def scorer(users, items):
            if marker is not None and not os.path.exists(marker):
                open(marker, "w").close()
                os._exit(1)  # the actor dies mid-run; Ray restarts it and retries the block
            return (u[users].unsqueeze(1) * v[items]).sum(-1)

        return scorer


def _rows(seed: int = 0):
    """(users, held-out lists, exclusion lists) of N_USERS rows: 1-3 held-out items, 0-12 excluded items, a few users
    without exclusions (null lists)."""
    rng = np.random.default_rng(seed)
    items, exclude = [], []
    for _ in range(N_USERS):
        drawn = rng.choice(N_ITEMS, size=int(rng.integers(1, 16)), replace=False)
        k = int(rng.integers(1, 4))
        items.append(drawn[:k].tolist())
        exclude.append(drawn[k:].tolist() or None)
    users = rng.permutation(N_USERS)  # ids not in row order
    return users, items, exclude


def _table(rows, lo: int = 0, hi: int = N_USERS) -> pa.Table:
    users, items, exclude = rows
    return pa.table({"user": users[lo:hi], "items": pa.array(items[lo:hi], pa.list_(pa.int64())),
                     "exclude": pa.array(exclude[lo:hi], pa.list_(pa.int64()))})


def _blocks_state(rows, design, cuts, order=None, share=None) -> "rr.EvaluationState":
    """The state of the rows ranked in the blocks between ``cuts``, merged in ``order``. An active share over
    several blocks: evaluate_dataset's two passes (pass 1 without the share, its merged state turned into the
    share's pi, ``EvaluationState.share_table``, pass 2 with that table); over one block (no cuts), the core's own
    choice on the whole sample (``draw_share``)."""
    active = design is not None and design.exact_share is not None and design.exact_share.choice == "active"
    if active and cuts and share is None:
        first = _blocks_state(rows, dataclasses.replace(design, exact_share=None), cuts, order)
        return _blocks_state(rows, design, cuts, order, first.share_table(design, N_ITEMS))
    scorer, cpu = Factory()(torch.device("cpu")), torch.device("cpu")
    bounds = list(zip([0, *cuts], [*cuts, N_USERS]))
    states = [rr.rank_block(scorer, *rr.batch_tensors(_table(rows, lo, hi), rr.Columns(), N_ITEMS, cpu), N_ITEMS,
                            design, seed=11, share=share) for lo, hi in bounds]
    total = rr.EvaluationState()
    for i in order or range(len(states)):
        total = total.merge(states[i])
    # evaluate_dataset's merge on the driver (histograms one by one, rows concatenated once): the same state
    at_once = rr.EvaluationState.merge_all(states[i] for i in order or range(len(states)))
    assert (at_once.census, at_once.cost, at_once.users) == (total.census, total.cost, total.users)
    assert (at_once.hist is None and total.hist is None) or at_once.hist.same_groups(total.hist) \
        and np.array_equal(at_once.hist.flat_counts, total.hist.flat_counts)
    assert at_once.rows.keys() == total.rows.keys()
    assert all(at_once.rows[k].tobytes() == total.rows[k].tobytes() for k in total.rows)
    return total


DESIGNS = {
    "uniform": SamplingDesign(12),
    "without_replacement": SamplingDesign(12, replacement=False),
    "popularity": SamplingDesign(12, popularity=torch.linspace(0.5, 3.0, N_ITEMS, dtype=torch.float64)),
    "popularity_without_replacement": SamplingDesign(12, replacement=False,
                                                     popularity=torch.linspace(0.5, 3.0, N_ITEMS, dtype=torch.float64)),
    "adaptive_exact_at_cap": SamplingDesign(8, adaptive_max=32, exact_at_cap=True),
    "adaptive_top3_exact_at_cap": SamplingDesign(8, adaptive_max=32, adaptive_top=3, exact_at_cap=True),
    "exact_share": SamplingDesign(12, exact_share=ExactShare(0.4, seed=3)),
    "popularity_share": SamplingDesign(12, popularity=torch.linspace(0.5, 3.0, N_ITEMS, dtype=torch.float64),
                                       exact_share=ExactShare(0.4, seed=3)),
    "popularity_active_share": SamplingDesign(12, popularity=torch.linspace(0.5, 3.0, N_ITEMS, dtype=torch.float64),
                                              exact_share=ExactShare(0.3, choice="active", metric="hit@5", seed=3)),
    "active_share": SamplingDesign(12, exact_share=ExactShare(0.3, choice="active", metric="hit@5", seed=3)),
    "adaptive_active_share": SamplingDesign(8, adaptive_max=32, exact_share=ExactShare(0.3, choice="active", seed=3)),
    "exact": None,  # exact ranks: every candidate scored
}
# (metric, method) pairs estimated per design: the design's own estimators
METHODS = {"uniform": (("ndcg@10", "auto"), ("hit@5", "bv")), "without_replacement": (("ndcg@10", "auto"),),
           "popularity": (("auc", "hh"), ("ndcg@10", "none")),
           "popularity_without_replacement": (("auc", "none"), ("ndcg@10", "none")),
           "adaptive_exact_at_cap": (("ndcg@10", "auto"), ("hit@5", "mle")),
           "adaptive_top3_exact_at_cap": (("ndcg@10", "auto"), ("hit@5", "mle")),
           "exact_share": (("ndcg@10", "auto"), ("ndcg@10", "diff")), "active_share": (("hit@5", "diff"),),
           "popularity_share": (("ndcg@10", "auto"), ("auc", "hh")),
           "popularity_active_share": (("hit@5", "diff"), ("ndcg@10", "auto")),
           "adaptive_active_share": (("ndcg@10", "auto"), ("hit@5", "diff")),
           "exact": (("ndcg@10", "auto"), ("hit@5", "mle"))}


def _estimates(evaluation, pairs):
    return {(m, k): (e.value, e.stderr) for m, k in pairs for e in [evaluation.estimate(m, k)]}


@pytest.mark.parametrize("name", list(DESIGNS))
def test_blocks_and_merge_order_do_not_change_the_numbers(name):
    """Every design: one block, three uneven blocks merged in another order, and eleven blocks give the same sample
    and the same estimates bit for bit; the pairs scored add up (a completion pads only within its block); the
    users are counted once. An exact share: the same share rows (chosen positives, exact ranks, inclusion
    probabilities) bit for bit; an active one drawn in two passes equals the core's choice on the whole sample (under
    a popularity design: pi of each positive's pl_fit prediction, broadcast keyed by (user, item))."""
    design, rows = DESIGNS[name], _rows()
    one = _blocks_state(rows, design, [])
    evaluation = rr.Evaluation(one, design)
    a = evaluation.sample()
    expected = _estimates(evaluation, METHODS[name])
    assert all(np.isfinite(v) for v, _ in expected.values())
    for cuts, order in (([7, 50], [2, 0, 1]), (list(range(8, N_USERS, 8)), None)):
        split = _blocks_state(rows, design, cuts, order)
        assert split.users == one.users == N_USERS
        evaluation = rr.Evaluation(split, design)
        b = evaluation.sample()
        assert _estimates(evaluation, METHODS[name]) == expected
        if design is None or design.popularity is None:
            assert a.same_groups(b) and np.array_equal(a.flat_counts, b.flat_counts)
        elif not design.replacement:  # the histogram's positives, no statistics (as the core's draws)
            assert torch.equal(a.ranks, b.ranks) and torch.equal(a.n_candidates, b.n_candidates)
            assert a.popularity_stats is None and a.design is design and len(a.ranks) == (split.hist.total)
        else:
            assert torch.equal(a.ranks, b.ranks) and torch.equal(a.popularity_stats.inv_q, b.popularity_stats.inv_q)
        if design is not None and design.exact_share is not None and design.popularity is not None:  # per positive
            assert torch.equal(a.share_ranks, b.share_ranks) and torch.equal(a.inclusion, b.inclusion)
            assert 0 < int((a.share_ranks > 0).sum()) < len(a.ranks)
            pi = a.inclusion.numpy()
        elif design is not None and design.exact_share is not None:
            assert a.share.equals(b.share) and len(a.share.n) > 0
            pi = a.share.inclusion
        if design is not None and design.exact_share is not None and design.exact_share.choice == "active":
            assert len(np.unique(pi)) > 3  # probabilities that vary with the sampled data
        if design is not None and not design.exact_at_cap and design.exact_share is None:  # no completion padding
            assert split.cost.pairs == one.cost.pairs and split.cost.full_pairs == one.cost.full_pairs
    if design is None:  # against brute force on the score matrix: R = 1 + candidates scoring above the positive
        assert expected[("ndcg@10", "auto")][0] == pytest.approx(_brute_ndcg(rows), rel=1e-9)
        # each positive, then its row's irrelevant candidates (rows padded to a block's longest list: counted)
        assert one.cost.pairs >= one.cost.full_pairs


def _brute_ndcg(rows) -> float:
    f = Factory()
    scores = (f.u @ f.v.T).numpy()
    users, items, exclude = rows
    gains = []
    for b, u in enumerate(users):
        allowed = np.setdiff1d(np.arange(N_ITEMS), np.concatenate([items[b], exclude[b] or []]))
        for i in items[b]:
            r = 1 + int((scores[u, allowed] >= scores[u, i]).sum())
            gains.append(1 / np.log2(r + 1) if r <= 10 else 0.0)
    return float(np.mean(gains))


def test_an_evaluation_keeps_its_sample_so_its_metrics_fit_once(monkeypatch):
    """``Evaluation.sample()`` is built once (the same object on every call, left out of pickles and copies), so
    the estimates of several metrics share the fit the core keeps on it: one ``pl_fit`` for two metrics under a
    popularity design, with the numbers of a fresh evaluation of the same state."""
    import copy
    import pickle

    from reco_sampled_plugin import _popularity_fit

    design = DESIGNS["popularity"]
    state = _blocks_state(_rows(), design, [])
    fits = []
    real = _popularity_fit._fit
    monkeypatch.setattr(_popularity_fit, "_fit", lambda *a: fits.append(1) or real(*a))
    evaluation = rr.Evaluation(state, design)
    assert evaluation.sample() is evaluation.sample()
    got = _estimates(evaluation, (("ndcg@10", "pl_fit"), ("hit@10", "pl_fit")))
    assert len(fits) == 1
    fresh = rr.Evaluation(state, design)
    assert fresh.estimate("hit@10", "pl_fit").value == got["hit@10", "pl_fit"][0] and len(fits) == 2
    for other in (pickle.loads(pickle.dumps(evaluation)), copy.copy(evaluation)):
        assert "_kept" not in vars(other) and other.sample() is not evaluation.sample()


def _canonical(hist):
    """The histogram's non-empty groups in merge's order (exact flag, n, m)."""
    return hist.select(np.zeros(hist.n_groups, dtype=bool)).merge(hist).without_empty_groups()


@pytest.mark.parametrize("name", ["uniform", "adaptive", "exact_at_cap", "top3_exact_at_cap",
                                  "popularity_without_replacement", "popularity_share"])
def test_state_equals_the_torchmetrics_scorer_loop(name):
    """The merged histogram equals SampledRankingMetrics.update_from_scorer's (one process, its own batching) on the
    same keys: the counts bit for bit, the estimates too (popularity without replacement: the sampled metric, the
    one estimate there, as in the core); so do the pairs scored (without a share). A popularity design with a uniform
    share: every positive's row (sampled rank, pl_fit statistics, exact rank, pi) bit for bit."""
    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics
    from reco_sampled_plugin.ranking import prepare_index

    design = {"uniform": SamplingDesign(12), "adaptive": SamplingDesign(8, adaptive_max=64),
              "exact_at_cap": SamplingDesign(8, adaptive_max=64, exact_at_cap=True),
              "top3_exact_at_cap": SamplingDesign(8, adaptive_max=64, adaptive_top=3, exact_at_cap=True)}.get(name) \
        or DESIGNS[name]
    rows = _rows(1)
    state = _blocks_state(rows, design, [30, 31, 77])
    method = "none" if design.popularity is not None and design.exact_share is None else "auto"
    metric = SampledRankingMetrics(("ndcg@10",), n_samples=design, estimators=(method,), seed=11,
                                   max_n_groups=None)
    users, pos, exc = rr.batch_tensors(_table(rows), rr.Columns(), N_ITEMS, torch.device("cpu"))
    for lo in range(0, N_USERS, 25):
        sl = slice(lo, lo + 25)
        metric.update_from_scorer(Factory()(torch.device("cpu")), pos[sl], N_ITEMS, exclude=exc[sl], ids=users[sl])
    sample = rr.Evaluation(state, design).sample()
    if design.exact_share is not None:  # per-positive rows: the two adapters' orders differ, the rows do not (the
        # estimates are the core's of these rows: test_design_based_entry_points.py)
        assert np.array_equal(canonical_rows(sample), canonical_rows(metric.popularity_ranks()))
        assert _canonical(metric.histogram()).total == len(sample.ranks)
        return
    ref = _canonical(metric.histogram())
    got = _canonical(sample.histogram() if design.popularity is not None else sample)
    assert ref.same_groups(got) and np.array_equal(ref.flat_counts, got.flat_counts)
    # the blocks' merge orders the groups by exactness first: the fit's sums in another order, equal to rounding
    assert rr.Evaluation(state, design).estimate("ndcg@10", method).value == pytest.approx(
        metric.estimates()[f"ndcg@10/{metric.settings.labels[0]}"].value, rel=1e-12, abs=0)
    if not design.exact_at_cap:  # (a share returned above)
        assert metric.scoring_cost().pairs == state.cost.pairs
    else:  # a completion pads its rows to its batch's longest candidate list: batches differ here, by at most that
        completed = int(metric.completed.shape[0])  # at least the rows completed
        spread = int(ref.n_items.max() - ref.n_items.min())
        assert completed > 0 and abs(metric.scoring_cost().pairs - state.cost.pairs) <= completed * spread


def test_batches_designs_and_versions_are_checked():
    """Rows: a list column with null lists, or one scalar held-out item per row, become padded indices; a held-out
    item also excluded is refused. Designs: an active exact share is taken, with popularity draws too; a share with
    popularity draws without replacement is refused naming ``n_samples``; an active share's table (by cell, or by
    (user, item) under a popularity design) refuses a positive it does not hold (pass 2 on other rows than pass 1).
    Versions: a Ray older than MIN_RAY is an ImportError that says what to install."""
    cpu = torch.device("cpu")
    t = pa.table({"user": [4, 9, 2], "items": pa.array([[3, 1], [5], [7, 8, 0]], pa.list_(pa.int64())),
                  "exclude": pa.array([None, [2, 6], []], pa.list_(pa.int64()))}).slice(1)  # sliced: offsets != 0
    users, pos, exc = rr.batch_tensors(t, rr.Columns(), 10, cpu)
    assert users.tolist() == [9, 2] and pos.tolist() == [[5, -1, -1], [7, 8, 0]] and exc.tolist() == [[2, 6], [-1, -1]]
    scalar = pa.table({"uid": [1, 2], "item": [4, 0]})
    users, pos, exc = rr.batch_tensors(scalar, rr.Columns("uid", "item", None), 10, cpu)
    assert pos.tolist() == [[4], [0]] and exc is None
    with pytest.raises(ValueError, match="exclude|positive"):
        rr.batch_tensors(pa.table({"user": [1], "items": [[3]], "exclude": [[3]]}), rr.Columns(), 10, cpu)
    active = SamplingDesign(5, exact_share=ExactShare(0.3, choice="active"))
    assert rr.check_design(active) is active
    for name in ("popularity_share", "popularity_active_share"):
        assert rr.check_design(DESIGNS[name]) is DESIGNS[name]
    for share in (ExactShare(0.3), ExactShare(0.3, choice="active")):
        with pytest.raises(ValueError, match="^exact_share: not with popularity draws without replacement"):
            dataclasses.replace(active, popularity=torch.ones(10), replacement=False, exact_share=share)
    design = DESIGNS["active_share"]
    first = _blocks_state(_rows(), dataclasses.replace(design, exact_share=None), [45])
    table = ShareTable.of(first.hist, design.exact_share, design)
    other = rr.batch_tensors(_table(_rows(5)), rr.Columns(), N_ITEMS, cpu)
    with pytest.raises(ValueError, match="inclusion: a positive's sampled data is not in the share's table"):
        rr.rank_block(Factory()(cpu), *other, N_ITEMS, design, seed=11, share=table)
    users, pos, _ = other  # a table of other positives than these (one of them: no fit needed)
    keyed = KeyedInclusion.of(np.array([int(users[0]) + N_USERS]), np.array([int(pos[0, 0])]), np.array([0.5]),
                              N_ITEMS)
    with pytest.raises(ValueError, match="^inclusion: a positive is not in the share's table"):
        rr.rank_block(Factory()(cpu), *other, N_ITEMS, DESIGNS["popularity_active_share"], seed=11, share=keyed)
    with pytest.raises(ValueError, match="^dataset: no held-out item was ranked"):
        rr.EvaluationState().share_table(DESIGNS["popularity_active_share"], N_ITEMS)
    saved = ray.__version__
    try:
        ray.__version__ = "2.6.3"
        with pytest.raises(ImportError, match=r'found 2\.6\.3; pip install -U "ray\[data\]>=2\.44"'):
            rr._import_ray()
    finally:
        ray.__version__ = saved


_NOT_A_DATASET = [1, 2]
BAD_RUNS = {  # evaluate_dataset's keywords -> the argument its refusal names
    "dataset": (dict(dataset=_NOT_A_DATASET), "dataset"),
    "dataset None": (dict(dataset=None), "dataset"),
    "factory": (dict(scorer_factory=3), "scorer_factory"),
    "columns": (dict(columns="user"), "columns"),
    "engine": (dict(engine=None), "engine"),
    "weights per item": (dict(n_samples=SamplingDesign(5, popularity=torch.ones(N_ITEMS - 3))), "popularity"),
    "m without replacement": (dict(n_samples=SamplingDesign(N_ITEMS, replacement=False)), "n_samples"),
    "popularity m without replacement": (dict(n_samples=SamplingDesign(N_ITEMS, replacement=False,
                                                                       popularity=torch.ones(N_ITEMS))), "n_samples"),
}


@pytest.mark.parametrize("case", list(BAD_RUNS))
def test_evaluate_dataset_refuses_bad_arguments_before_ray_runs(case):
    """Checked on the driver before any Ray call (no cluster starts), each a ValueError naming the argument, where
    the actors (or Ray Data's first call) failed deep inside with an AttributeError."""
    kwargs, named = BAD_RUNS[case]
    started = ray.is_initialized()
    args = dict(dataset=_NOT_A_DATASET, scorer_factory=Factory(), n_items=N_ITEMS, n_samples=5) | kwargs
    with pytest.raises(ValueError, match=f"^{named}: "):
        rr.evaluate_dataset(**args)
    assert ray.is_initialized() == started


@pytest.mark.parametrize("kwargs, named", [
    (dict(workers=0), "workers"), (dict(workers="2"), "workers"), (dict(num_cpus=-1.0), "num_cpus"),
    (dict(num_gpus=float("nan")), "num_gpus"), (dict(batch_size=0), "batch_size"), (dict(batch_size=2.5), "batch_size"),
    (dict(progress="yes"), "progress"),
], ids=lambda v: str(v) if isinstance(v, str) else "-".join(f"{k}={v[k]}" for k in v))
def test_engine_fields_are_checked_at_construction(kwargs, named):
    with pytest.raises(ValueError, match=f"^{named}: "):
        rr.Engine(**kwargs)
    assert rr.Engine() == rr.Engine(1, 1.0, 0.0, 4096, None)


@pytest.mark.parametrize("kwargs, named", [
    (dict(user=None), "user"), (dict(items=3), "items"), (dict(exclude=""), "exclude"), (dict(user="items"), "columns"),
], ids=["user None", "items int", "exclude empty", "same column"])
def test_columns_are_named_column_names(kwargs, named):
    with pytest.raises(ValueError, match=f"^{named}: "):
        rr.Columns(**kwargs)
    assert rr.Columns(exclude=None).exclude is None


@pytest.fixture(scope="module")
def cluster():
    """One small local Ray cluster for the module (2 CPUs; pytest-xdist workers each start their own). Its idle
    worker processes are kept for the module (Ray's default ends those above its soft limit after a second), so that
    Ray Data's tasks (reads, repartitions) run in workers started once. Actors are not helped: Ray starts each actor,
    a restarted one too, in a new process (never in a worker that has run tasks), so every run's pool imports torch
    anew."""
    import ray.cloudpickle

    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # the actors unpickle this module's Factory
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False,
             _system_config={"idle_worker_killing_time_threshold_ms": 600_000})
    yield
    ray.shutdown()


def test_ray_at_scale_example(cluster, capsys, monkeypatch):
    """examples/ray_at_scale.py on the module's cluster (it starts its own only where none runs): 2 actors over 8
    blocks give one process's estimates bit for bit, and the cost is reported."""
    import runpy
    from pathlib import Path

    monkeypatch.setattr(sys, "argv", ["ray_at_scale.py"])
    runpy.run_path(str(Path(__file__).parents[1] / "examples" / "ray_at_scale.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert out.count("same as one process: True") == 2
    assert "users 2000, pairs scored" in out and "% of full ranking" in out


def test_ray_run_with_a_killed_actor_equals_one_process(cluster, tmp_path):
    """On a real local cluster, 2 actors over 4 blocks in batches of 7 rows, an active exact share (two passes: a
    histogram, the share's table broadcast, per-positive rows to merge), and the scorer kills its actor on its first
    call (``os._exit``, in pass 1): Ray restarts the actor and retries the block, and the result equals the
    one-process run (the core's choice on the whole sample): estimates and counts bit for bit, the share's rows,
    every user counted once (no block lost or counted twice), the calls of every batch of both passes summed."""
    rows, marker = _rows(2), tmp_path / "killed"
    ds = ray.data.from_arrow([_table(rows, lo, min(lo + 25, N_USERS)) for lo in range(0, N_USERS, 25)])
    design = DESIGNS["active_share"]
    got = rr.evaluate_dataset(ds, Factory(str(marker)), N_ITEMS, design, seed=11,
                              engine=rr.Engine(workers=2, num_cpus=0.5, batch_size=7, progress=False))
    assert marker.exists()  # an actor was killed once
    ref = rr.Evaluation(_blocks_state(rows, design, []), design)
    assert got.state.users == N_USERS and got.cost.calls >= 2 * -(-N_USERS // 7)
    # pass 1's draws counted too (pass 2 alone, in batches of 7, pads its completions less than one block does);
    # full ranking's pairs once
    assert got.cost.pairs > ref.cost.pairs and got.cost.full_pairs == ref.cost.full_pairs
    assert _estimates(got, METHODS["active_share"]) == _estimates(ref, METHODS["active_share"])
    a, b = got.sample(), ref.sample()
    assert np.array_equal(a.flat_counts, b.flat_counts) and a.share.equals(b.share) and len(a.share.n) > 0
