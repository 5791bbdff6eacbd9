"""GPU readiness of the RecBole adapter and its check of the scores (NaN / inf).

The per-batch hook (``collect_batch``) and the end of an evaluation (``finish_collection``) are called directly
with synthetic batches shaped as RecBole passes them: scores (users x items) on the model's device, RecBole's
``positive_u`` / ``positive_i`` and the ``Interaction`` on the host. Host synchronisations are counted with
``tests/_budgets.count_syncs`` (on the CPU the same calls are counted: they would wait on a GPU). The path of
other devices (batches held by reference, ranked on their device) runs on the CPU too, with the CPU staging
switched off (``_STAGE_ON_CPU = False``).
"""

from __future__ import annotations

import math
import os
import types

import numpy as np
import pytest
import torch

from reco_sampled_plugin.adapters import recbole as rb  # noqa: F401  (registers the plugin)
from reco_sampled_plugin.adapters import _recbole_ranks as rr

import recbole  # noqa: E402
from recbole.config import Config  # noqa: E402
from recbole.data.interaction import Interaction  # noqa: E402
from recbole.evaluator.collector import Collector  # noqa: E402

from _budgets import count_syncs  # noqa: E402

DATA_PATH = os.path.join(os.path.dirname(recbole.__file__), "dataset_example")
FULL = {"metrics": ["Recall", "CorrectedRecall", "ExactRecall", "ExactNDCG"], "rsp_m": 100, "valid_metric": "Recall@10"}
UNI = {"metrics": ["Recall", "CorrectedRecall"], "eval_args": {"mode": "uni5"}, "valid_metric": "Recall@10"}

# per-batch budget of host waits: a batch that only joins the buffer waits on nothing; the batch that
# flushes waits once (the check of the scores); the end of the evaluation adds the table's one copy
FLUSH_SYNCS = 1


@pytest.fixture
def device_code(monkeypatch):
    """On the CPU the adapter counts each user's other positives in numpy (faster there; its host copies are
    free on the CPU): sync counts on the CPU take the torch code that other devices run instead."""
    monkeypatch.setattr(rr, "_other_positive_counts_host", rr._other_positive_counts_device)


def _collector(extra: dict) -> Collector:
    config = Config(model="BPR", dataset="ml-100k", config_dict={
        "data_path": DATA_PATH, "device": "cpu", "use_gpu": False, "topk": [10], "seed": 2020, **extra})
    collector = Collector(config)
    rr.reset_collection(collector)
    return collector


def _full_batch(b: int, n: int, device, seed: int = 0, dtype=torch.float32):
    """A full-sort batch as RecBole hands it over: scores on the device (padding item 0 and a few history
    items at -inf), positives and user ids on the host."""
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g).round(decimals=1).to(dtype)  # rounded: ties
    scores[:, 0] = -math.inf
    scores[torch.randint(0, b, (3 * b,), generator=g), torch.randint(1, n, (3 * b,), generator=g)] = -math.inf
    k = torch.randint(1, 6, (b,), generator=g)
    pos_u = torch.repeat_interleave(torch.arange(b), k)
    pos_i = torch.cat([torch.randperm(n - 1, generator=g)[:kk] + 1 for kk in k.tolist()])
    scores[pos_u, pos_i] = scores[pos_u, pos_i].clamp(min=-3.0)  # held-out items are never excluded
    inter = Interaction({"user_id": torch.randint(1, 10_000, (b,), generator=g)})
    return scores.to(device), inter, pos_u, pos_i


def _sampled_batch(b: int, n_items: int, n_draws: int, device, seed: int = 0):
    """A uniN batch in RecBole's layout: a user with k positives has k (1 + N) interaction rows (its k items,
    then negative j of positive i at row k + jk + i); scores (users x items) at -inf except the scored items."""
    g = torch.Generator().manual_seed(seed)
    k = torch.randint(1, 4, (b,), generator=g)
    items, users, pos_u, pos_i = [], [], [], []
    for u, kk in enumerate(k.tolist()):
        pos = torch.randperm(n_items - 1, generator=g)[:kk] + 1
        neg = torch.randint(1, n_items, (n_draws * kk,), generator=g)
        items.append(torch.cat([pos, neg]))
        users.append(torch.full((kk * (1 + n_draws),), 100 + u))
        pos_u.append(torch.full((kk,), u))
        pos_i.append(pos)
    items, users, pos_u, pos_i = torch.cat(items), torch.cat(users), torch.cat(pos_u), torch.cat(pos_i)
    row_user = torch.repeat_interleave(torch.arange(b), k * (1 + n_draws))
    scores = torch.full((b, n_items), -math.inf)
    scores[row_user, items] = torch.randn(items.shape[0], generator=g)
    inter = Interaction({"user_id": users, "item_id": items})
    return scores.to(device), inter, pos_u, pos_i


def _with_sampler(collector, n_users: int = 200, used: int = 7):
    """What Trainer.evaluate hands the collector in sampled modes: the dataloader's sampler (its used_ids)."""
    sampler = types.SimpleNamespace(used_ids=np.array([set(range(used)) for _ in range(n_users)], dtype=object))
    rr.reset_collection(collector, types.SimpleNamespace(_sampler=sampler))


@pytest.mark.parametrize("b, n", [(1, 500), (8, 3000), (64, 20000)])
def test_full_sort_batch_syncs_bounded(workdir, device, monkeypatch, device_code, b, n):
    """Batches held by reference (the path of every device but the CPU): joining the buffer waits on nothing,
    the flush waits once (the check of the scores, the only read-back), the end of the evaluation copies the
    per-positive table to the host once: independent of the batch size and the catalogue."""
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", False)
    collector = _collector(FULL)
    batches = [_full_batch(b, n, device, seed) for seed in range(3)]
    counted = [count_syncs(rr.collect_batch, collector, *batch)[1] for batch in batches]
    assert [c.count for c in counted] == [0, 0, 0], [dict(c.calls) for c in counted]
    table, at_end = count_syncs(rr.finish_collection, collector)
    expected = {"tolist": FLUSH_SYNCS} | ({"cpu": 1} if device.type != "cpu" else {})  # + the table's copy
    assert dict(at_end.calls) == expected
    assert table.device.type == "cpu" and table.shape[0] == sum(batch[2].shape[0] for batch in batches)
    # a buffer full after every batch: each batch flushes, and each flush waits once
    monkeypatch.setattr(rr, "_BUFFER_ELEMENTS", 1)
    for batch in batches:
        assert count_syncs(rr.collect_batch, collector, *batch)[1].count == FLUSH_SYNCS
    assert count_syncs(rr.finish_collection, collector)[1].count == (1 if device.type != "cpu" else 0)


def test_large_batches_ranked_at_once(workdir, device, monkeypatch, device_code):
    """A full-sort batch of at least ``_DIRECT_ELEMENTS`` scores is ranked at once from RecBole's tensor (no
    copy, no concatenation): one wait per batch, after what was gathered before it (users in arrival order),
    the same exact ranks and counts as gathering every batch."""
    batches = [_full_batch(b, 400, device, seed) for seed, b in enumerate((3, 8, 2, 9))]
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", False)
    gathered = _evaluate(_collector(FULL), batches)
    monkeypatch.setattr(rr, "_DIRECT_ELEMENTS", 5 * 400)  # the batches of 8 and 9 users are large
    for staged in (True, False):
        monkeypatch.setattr(rr, "_STAGE_ON_CPU", staged)
        collector = _collector(FULL)
        counted = [count_syncs(rr.collect_batch, collector, *batch)[1] for batch in batches]
        if not staged or device.type != "cpu":
            assert [c.count for c in counted] == [0, FLUSH_SYNCS + FLUSH_SYNCS, 0, FLUSH_SYNCS + FLUSH_SYNCS]
        table = rr.finish_collection(collector)
        for col in (rr._USER, rr._R_FULL, rr._R_IRR, rr._N_IRR, rr._N_POS, rr._UID, rr._ITEM, rr._M):
            np.testing.assert_array_equal(table[:, col].numpy(), gathered[:, col].numpy(), err_msg=rr.COLUMNS[col])


@pytest.mark.parametrize("b, n", [(1, 500), (32, 5000)])
def test_sampled_batch_syncs_bounded(workdir, device, monkeypatch, b, n):
    """uniN batches on another device are ranked at once, on it: one wait per batch (the check of the scores
    and of RecBole's layout, read together), and the table's one copy at the end."""
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", False)
    collector = _collector(UNI)
    _with_sampler(collector)
    for seed in range(2):
        batch = _sampled_batch(b, n, 5, device, seed)
        assert count_syncs(rr.collect_batch, collector, *batch)[1].count == FLUSH_SYNCS
    table, at_end = count_syncs(rr.finish_collection, collector)
    assert at_end.count == (1 if device.type != "cpu" else 0)
    assert bool((table[:, rr._M] == 5).all()) and bool((table[:, rr._N_IRR] == n - 7).all())


def test_staged_cpu_batches_cost_a_constant(workdir, monkeypatch, device_code):
    """The CPU staging copies each batch through numpy views (counted as if they waited; on the CPU they do
    not): a constant number per batch, whatever its size."""
    for b, n in ((1, 500), (64, 20000)):
        collector = _collector(FULL)
        counts = [count_syncs(rr.collect_batch, collector, *_full_batch(b, n, "cpu", seed))[1].count for seed in range(3)]
        assert max(counts) <= 5, counts
        assert count_syncs(rr.finish_collection, collector)[1].count == FLUSH_SYNCS


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_device_path_equals_the_cpu_staging(workdir, device, monkeypatch, dtype):
    """The table ranked on the scores' device (batches held by reference) equals the CPU staging's, column by
    column (exact ranks and counts exactly; sampled ranks too on the CPU, where both draw from one stream)."""
    batches = [_full_batch(b, 400, "cpu", seed, dtype) for seed, b in enumerate((3, 1, 5))]
    tables = []
    for staged, dev in ((True, torch.device("cpu")), (False, device)):
        monkeypatch.setattr(rr, "_STAGE_ON_CPU", staged)
        collector = _collector({**FULL, "rsp_ties": "average", "rsp_full_ranks": True})
        for scores, inter, pu, pi in batches:
            rr.collect_batch(collector, scores.to(dev), inter, pu, pi)
        tables.append(rr.finish_collection(collector))
    same = [rr._USER, rr._R_FULL, rr._R_IRR, rr._N_IRR, rr._M, rr._N_POS, rr._UID, rr._ITEM]
    if device.type == "cpu":
        same.append(rr._R_SAMPLED)
    for col in same:
        np.testing.assert_array_equal(tables[0][:, col].numpy(), tables[1][:, col].numpy(), err_msg=rr.COLUMNS[col])


# ------------------------------------------------------------------------------------------------------ NaN / inf
class _Settings:
    """The evaluation's settings with ``check_finite`` overridden (until ``rsp_check_finite`` is a config key)."""

    def __init__(self, settings, check_finite):
        self._settings, self.check_finite = settings, check_finite

    def __getattr__(self, name):
        return getattr(self._settings, name)


def _evaluate(collector, batches, check_finite=None):
    if check_finite is not None:
        collector._rsp_settings_now = _Settings(rr._settings(collector.config), check_finite)
    for batch in batches:
        rr.collect_batch(collector, *batch)
    return rr.finish_collection(collector)


@pytest.mark.parametrize("staged", [True, False], ids=["staged", "referenced"])
def test_nan_or_posinf_anywhere_raises_and_neginf_excludes(workdir, device, monkeypatch, staged):
    """A NaN score of an item that is not held out used to count as not competing (like RecBole's -inf of an
    excluded item), silently raising every rank: with the check on (the default) NaN or +inf anywhere in the
    scores is a ValueError that names the scores; -inf stays RecBole's mark of an excluded item."""
    monkeypatch.setattr(rr, "_STAGE_ON_CPU", staged)
    batches = [_full_batch(4, 300, device, seed) for seed in range(2)]
    clean = _evaluate(_collector(FULL), batches)
    held = torch.zeros(4, 300, dtype=torch.bool)
    held[batches[1][2], batches[1][3]] = True
    free = int((~held[2]).nonzero()[1, 0])  # an item of user 2 that is not held out
    for bad, what in ((math.nan, r"NaN in 1 and \+inf in 0 of 8 users' rows"), (math.inf, r"NaN in 0 and \+inf in 1 of 8 users' rows")):
        scores = batches[1][0].clone()
        scores[2, free] = bad
        uid = int(batches[1][1]["user_id"][2])
        broken = [batches[0], (scores, *batches[1][1:])]
        with pytest.raises(ValueError, match=rf"scores hold {what} \(first: RecBole user id {uid}\)"):
            _evaluate(_collector(FULL), broken)
    # -inf on an item that is not held out: excluded (one candidate fewer), never an error
    scores = batches[1][0].clone()
    scores[2, free] = -math.inf
    table = _evaluate(_collector(FULL), [batches[0], (scores, *batches[1][1:])])
    rows = table[:, rr._USER] == 6  # user 2 of the second batch
    was_candidate = bool(torch.isfinite(batches[1][0][2, free]))
    np.testing.assert_array_equal(table[rows, rr._N_IRR].numpy(), clean[rows, rr._N_IRR].numpy() - was_candidate)


def test_check_finite_off_keeps_the_old_convention(workdir, device):
    """``check_finite`` off: only held-out items' scores are checked (their NaN still raises: no rank); a NaN
    elsewhere counts as not competing, like -inf."""
    batches = [_full_batch(4, 300, device, 0)]
    scores, inter, pu, pi = batches[0]
    held = torch.zeros(4, 300, dtype=torch.bool)
    held[pu, pi] = True
    free = int((~held[1] & torch.isfinite(scores[1].cpu())).nonzero()[1, 0])
    nan_free, minus_inf = scores.clone(), scores.clone()
    nan_free[1, free], minus_inf[1, free] = math.nan, -math.inf
    a = _evaluate(_collector(FULL), [(nan_free, inter, pu, pi)], check_finite=False)
    b = _evaluate(_collector(FULL), [(minus_inf, inter, pu, pi)], check_finite=False)
    for col in (rr._R_FULL, rr._R_IRR, rr._N_IRR):
        np.testing.assert_array_equal(a[:, col].numpy(), b[:, col].numpy())
    nan_held = scores.clone()
    nan_held[pu[0], pi[0]] = math.nan
    with pytest.raises(ValueError, match=r"scored 1 held-out item\(s\) NaN"):
        _evaluate(_collector(FULL), [(nan_held, inter, pu, pi)], check_finite=False)


def test_sampled_mode_checks_the_scores(workdir, device, monkeypatch):
    """uniN / popN: the same check (NaN or +inf among the scored items is an error)."""
    for staged in (True, False):
        monkeypatch.setattr(rr, "_STAGE_ON_CPU", staged)
        collector = _collector(UNI)
        _with_sampler(collector)
        scores, inter, pu, pi = _sampled_batch(3, 200, 5, device)
        scores = scores.clone()
        negative = int(inter["item_id"][int((pu == 0).sum())])  # user 0's first negative
        scores[0, negative] = math.nan if staged else math.inf
        with pytest.raises(ValueError, match="scores hold NaN" if staged else r"\+inf in 1"):
            _evaluate(collector, [(scores, inter, pu, pi)])


def test_rsp_check_finite_config_key(workdir):
    assert rr._settings(_collector(FULL).config).check_finite is True
    assert rr._settings(_collector({**FULL, "rsp_check_finite": False}).config).check_finite is False
    assert rr._settings(_collector({**FULL, "rsp_check_finite": "positives"}).config).check_finite == "positives"
    with pytest.raises(ValueError, match="^rsp_check_finite: expected true, false or 'positives'"):
        _collector({**FULL, "rsp_check_finite": "sometimes"})
