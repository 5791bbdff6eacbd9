"""GPU readiness of the torchmetrics classes and the Lightning callback, probed on any device.

* Host synchronisations per ``update`` (and per callback batch) on the accelerator's path (probed on the CPU with
  ``_READS_ON_CPU = False``): counted with ``tests/_budgets.count_syncs``, split into the core functions the
  adapters call (``prepare_index``, ``exact_ranks_padded``, ``factor_ranks_padded``, ``candidate_counts``...: their
  budget is the core's) and the adapters' own. None for score and factor batches of fixed m (exact, sampled with
  replacement, an exact share): every validity check stays on the device, in the ``failed_checks`` state, read at
  compute. What a batch cannot do without a read is a fixed number whatever the batch size B and the catalogue size
  n: one per adaptive stage (which rows go on: a data-dependent size); without replacement, the small pools' width
  and one duplicate check; ``exact_at_cap`` none more (the cap stage's rows ranked exactly).
* Temporaries: the largest tensor an ``update`` builds stays within the score block (or one factor tile / gather
  chunk) plus O(B (P + E + m)); never B x P m x d gathered factors or B x n x P comparisons.
* Device: states live on the metric's device, keyed draws on the inputs' device.
* An exact share adds nothing to score and factor batches (a static capacity of rows on an accelerator, probed
  here on the CPU with ``_READS_ON_CPU = False``); a scorer batch reads its chosen rows, beside the calls'
  own checks.
"""

from __future__ import annotations

import contextlib
import sys
from collections import Counter
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _budgets import SyncCounter, count_syncs, peak_temporary  # noqa: E402

from reco_sampled_plugin import _inputs, _keyed  # noqa: E402
from reco_sampled_plugin.adapters import _shared  # noqa: E402
from reco_sampled_plugin.adapters import torchmetrics as tm  # noqa: E402
from reco_sampled_plugin._keyed import RowKeys, keyed_negatives  # noqa: E402
from reco_sampled_plugin.adapters._shared import padded_inputs  # noqa: E402
from reco_sampled_plugin.factor_ranks import _GATHER_ELEMENTS as GATHER_ELEMENTS  # noqa: E402
from reco_sampled_plugin.adapters.torchmetrics import ExactRankingMetrics, SampledRankingMetrics  # noqa: E402
from reco_sampled_plugin.factor_ranks import TILE_ELEMENTS  # noqa: E402
from reco_sampled_plugin.design import ExactShare, SamplingDesign  # noqa: E402

@pytest.fixture(autouse=True)
def _accelerator_mask_scan(monkeypatch):
    """Masks scanned as on an accelerator, in torch (one ``nonzero``: a synchronisation there); a CPU scans them in
    numpy (``_inputs._sparse_masks_numpy``), which these probes would not see."""
    monkeypatch.setattr(_inputs, "_numpy_scan", [False])


# the adapters' own host synchronisations per update on an accelerator (beyond the core functions they call); every
# validity check of a batch (indices, finite scores or factors, sample pools, the factors' overflow bound) is kept on
# the device in the ``failed_checks`` state and read at compute (tests/test_torchmetrics_adapter.py: each one raises
# there, naming the check and the update)
OWN = {
    "exact": 0,  # the NaN/inf flags of the counting pass, unread; sums are masked sums, kept on the device
    "exact_positives": 0,  # check_finite="positives": the relevant items' flag, unread
    "sampled": 0,  # scores finite, sample pools large enough: flags, unread
    "sampled_noreplace": 2,  # the small pools' width (a data-dependent draw) + one duplicate check after the two
    # unchecked redraw rounds (a data-dependent loop: ending it early would change the draws)
    "sampled_adaptive": 3,  # one per adaptive stage after the first (m = 20, cap 160: 20, 40, 80, 160): which rows
    # go on is a data-dependent size
    "exact_factors": 0,  # the factors' NaN/inf flags and overflow bound, unread (tiles: bounded)
    "sampled_factors": 0,
    "sampled_factors_adaptive": 3,
    # exact_at_cap, as on an accelerator: the rows of the cap's stage (read with that stage) ranked exactly, the
    # factors' overflow bound for their tiles a flag: none more than without
    "sampled_adaptive_atcap": 3,
    "sampled_factors_adaptive_atcap": 3,
    # an exact share, as on an accelerator (a static capacity of rows: nothing read of which were chosen; a factor
    # batch's overflow bound for the share's tiles a flag): none more than without
    "sampled_share": 0,
    "sampled_factors_share": 0,
    # drawn by popularity with replacement (alone and with an exact share): the draws' statistics appended to the
    # ``pop`` state as a fixed block of B x P rows (the slots not counted dropped at compute), nothing compacted
    "sampled_popularity": 0,
    "sampled_popularity_share": 0,
    "sampled_factors_popularity": 0,
}
# the core's budget for what one update calls of it on an accelerator: none (the index checks of
# ``prepare_index(pending=...)`` and the counting pass's finite rows go to the state unread; factor tiles bounded by
# a flag)
CORE_BUDGET = 0
# the core functions (of reco_sampled_plugin) each adapter module calls: their syncs are the core's budget
_CORE = {
    _shared: ("prepare_index",),
    _keyed: ("forbidden_sorted", "allowed_position_to_item"),
    tm: ("prepare_index", "padded_candidate_counts", "exact_ranks_padded", "factor_ranks_padded", "check_factors",
         "_metric_from_float_ranks"),
}
SIZES = [(8, 500), (64, 3000)]  # two batch sizes and two catalogue sizes, together and crossed
SIZES = SIZES + [(8, 3000), (64, 500)]


def _data(b, n, device, p=2, e=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    scores = torch.randn(b, n, generator=g)
    order = torch.argsort(torch.rand(b, n, generator=g), 1)
    pos = order[:, :p].clone()
    pos[1::2, 1] = -1  # every other user has one relevant item
    exc = order[:, p : p + e].clone()
    exc[::3, -1] = -1
    return scores.to(device), pos.to(device), exc.to(device), torch.arange(b, device=device)


@contextlib.contextmanager
def _core_attributed(monkeypatch, extra=()):
    """Count the syncs made inside the core functions the adapters call: yields a dict whose ``"core"`` grows
    while a ``count_syncs`` counter (the innermost torch function mode) is active."""
    box = {"core": 0, "counter": None}

    def wrap(f):
        def inner(*a, **kw):
            c = box["counter"]
            before = c.count if c is not None else 0
            out = f(*a, **kw)
            if c is not None:
                box["core"] += c.count - before
            return out
        return inner

    seen = {}
    for module, names in list(_CORE.items()) + list(extra):
        for name in names:
            f = getattr(module, name)
            if f not in seen:
                seen[f] = wrap(f)
            monkeypatch.setattr(module, name, seen[f])
    yield box


def _counted(box, fn, *args, **kwargs):
    """(total, core, own) syncs of one call, and the counter's calls (a SyncCounter, as ``count_syncs`` uses)."""
    box["core"] = 0
    with SyncCounter() as counter:
        box["counter"] = counter
        try:
            fn(*args, **kwargs)
        finally:
            box["counter"] = None
    return counter.count, box["core"], counter.count - box["core"], counter.calls


def _case(name, n=None):
    kw = dict(metrics=("ndcg@10", "hit@5", "auc"), estimators=("none",))
    if name.startswith("exact"):
        return ExactRankingMetrics(kw["metrics"], check_finite="positives" if name == "exact_positives" else True)
    weights = torch.linspace(0.5, 2.0, n, dtype=torch.float64) if "popularity" in name else None  # n: the catalogue
    design = SamplingDesign(20, replacement="noreplace" not in name, adaptive_max=160 if "adaptive" in name else None,
                            exact_share=ExactShare(0.3) if "share" in name else None, exact_at_cap="atcap" in name,
                            popularity=weights)
    return SampledRankingMetrics(**kw, n_samples=design)


def _update(metric, name, scores, pos, exc, ids, factors):
    if "factors" in name:
        u, v = factors
        if name.startswith("exact"):
            return metric.update_factors(u, v, pos, exc)
        return metric.update_factors(u, v, pos, exc, ids=ids)
    if name.startswith("exact"):
        return metric.update(scores, pos, exc)
    return metric.update(scores, pos, exc, ids=ids)


@pytest.mark.parametrize("name", list(OWN))
def test_update_syncs_are_constant_in_batch_and_catalogue_size(name, device, monkeypatch):
    """Total, core and own synchronisations of an update (the second: the first may read a fresh state) are the
    same for B in (8, 64) and n in (500, 3000); the adapter's own count is OWN[name], the total at most
    CORE_BUDGET + OWN[name]."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)  # an exact share's (and exact_at_cap's) accelerator path
    got = []
    with _core_attributed(monkeypatch) as box:
        for b, n in SIZES:
            scores, pos, exc, ids = _data(b, n, device)
            g = torch.Generator().manual_seed(b + n)
            factors = (torch.randn(b, 16, generator=g).to(device), torch.randn(n, 16, generator=g).to(device))
            metric = _case(name, n).to(device)
            _update(metric, name, scores, pos, exc, ids, factors)
            total, core, own, calls = _counted(box, _update, metric, name, scores, pos, exc, ids, factors)
            got.append((total, core, own))
            assert own <= OWN[name], (name, b, n, own, dict(calls))
    assert len(set(got)) == 1, got
    assert got[0][2] == OWN[name], got
    assert got[0][1] <= CORE_BUDGET and got[0][0] <= CORE_BUDGET + OWN[name], got


def test_callback_batch_syncs_are_constant(device, monkeypatch):
    """The Lightning callback's per-batch work (``on_validation_batch_end``: padding, ids, exact and sampled
    updates), with scores and with factors, on an accelerator: no synchronisation at all, for two B and two n (the
    index checks and the metrics' own checks kept on the device, read at the epoch's end)."""
    import lightning  # noqa: F401  (a test dependency in pyproject: never skipped)
    from reco_sampled_plugin.adapters import lightning as lt
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    monkeypatch.setattr(tm, "_READS_ON_CPU", False)  # the accelerator's path
    trainer = SimpleNamespace(sanity_checking=False, val_dataloaders=None, test_dataloaders=None)
    module = SimpleNamespace(device=device)
    extra = [(lt, ("check_factors", "prepare_index"))]
    for protocol, exact in (("scores", True), ("scores", False), ("factors", True), ("factors", False)):
        got = []
        with _core_attributed(monkeypatch, extra) as box:
            for b, n in SIZES:
                scores, pos, exc, ids = _data(b, n, device)
                if protocol == "scores":
                    out = {"scores": scores, "positives": pos, "exclude": exc, "ids": ids}
                else:
                    g = torch.Generator().manual_seed(b)
                    out = {"user_factors": torch.randn(b, 16, generator=g).to(device),
                           "item_factors": torch.randn(n, 16, generator=g).to(device),
                           "positives": pos, "exclude": exc, "ids": ids}
                cb = RankingMetricsCallback(RankingSettings(("ndcg@10", "hit@5"), n_samples=20, estimators=("none",),
                                                            exact=exact), progress=False)
                cb.on_validation_batch_end(trainer, module, out, None, 0)
                total, core, own, calls = _counted(box, cb.on_validation_batch_end, trainer, module, out, None, 1)
                got.append((total, core, own))
        assert len(set(got)) == 1, (protocol, exact, got)
        assert got[0][2] == 0, (protocol, exact, got, dict(calls))
        assert got[0][0] <= CORE_BUDGET, (protocol, exact, got, dict(calls))


@pytest.mark.parametrize("protocol", ["scores", "factors"])
@pytest.mark.parametrize("exact", [True, False])
def test_callback_refuses_an_invalid_batch_at_the_epoch_end(protocol, exact, device, monkeypatch):
    """On an accelerator the callback's batch reads nothing: a batch with an out-of-range positive (batch 2) is
    counted on safe inputs and refused when the epoch's metrics are computed, naming the check and the update; on the
    CPU it is refused at the batch."""
    from reco_sampled_plugin.adapters.lightning import RankingMetricsCallback, RankingSettings

    trainer = SimpleNamespace(sanity_checking=False, val_dataloaders=None, test_dataloaders=None, current_epoch=0,
                              is_global_zero=True)
    module = SimpleNamespace(device=device)
    b, n = 8, 500

    def out(seed, broken):
        scores, pos, exc, ids = _data(b, n, device, seed=seed)
        if broken:
            pos[3, 0] = n
        if protocol == "scores":
            return {"scores": scores, "positives": pos, "exclude": exc, "ids": ids}
        g = torch.Generator().manual_seed(seed)
        return {"user_factors": torch.randn(b, 16, generator=g).to(device),
                "item_factors": torch.randn(n, 16, generator=g).to(device), "positives": pos, "exclude": exc, "ids": ids}

    settings = RankingSettings(("ndcg@10",), n_samples=20, estimators=("none",), exact=exact)
    for reads in (False, True):
        monkeypatch.setattr(tm, "_READS_ON_CPU", reads)
        cb = RankingMetricsCallback(settings, progress=False)
        cb.on_validation_batch_end(trainer, module, out(0, False), None, 0)
        if reads and device.type == "cpu":
            with pytest.raises(ValueError, match=r"^positives: item indices must lie in 0\.\.499"):
                cb.on_validation_batch_end(trainer, module, out(1, True), None, 1)
            continue
        cb.on_validation_batch_end(trainer, module, out(1, True), None, 1)
        with pytest.raises(ValueError, match=r"^positives: item indices must lie in 0\.\.499 .*\[check "
                                             r"'positives_range', first failed at update 2:"):
            cb.on_validation_epoch_end(trainer, module)


@pytest.mark.parametrize("positives", ["mask", "index"])
def test_mask_batches_read_once_per_update(device, positives, monkeypatch):
    """A batch whose exclusions (and positives) are boolean masks reads once per update on an accelerator: the masks'
    widths (a data-dependent shape) with the batch's checks, one ``tolist``; no ``nonzero`` (the scan's
    ``nonzero_static`` is sized by a count read with the widths), the same for two B and two n."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)  # the accelerator's path
    got = []
    for b, n in SIZES:
        scores, pos, exc, ids = _data(b, n, device)
        em = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, exc.clamp(min=0), exc >= 0)
        pm = torch.zeros_like(scores, dtype=torch.bool).scatter_(1, pos.clamp(min=0), pos >= 0)
        p = pm if positives == "mask" else pos
        exact = ExactRankingMetrics(("ndcg@10",)).to(device)
        sampled = SampledRankingMetrics(("ndcg@10",), n_samples=20, estimators=("none",)).to(device)
        for update in (lambda: exact.update(scores, p, em), lambda: sampled.update(scores, p, em, ids=ids)):
            update()
            got.append(dict(count_syncs(update)[1].calls))
    assert all(c == {"tolist": 1} for c in got), got


def test_scorer_batch_share_reads_its_chosen_rows_only(device):
    """A scorer batch with an exact share: beside the scorer calls' own checks (one per call, as every call's), the
    share adds the read of its chosen rows (which, and the longest candidate list to score: the rows are scored
    whole, each once) and the filter of the state's rows, the same for two B and two n; on an accelerator the
    scorer loop synchronises at every call anyway (timing), so these reads add no wait."""
    got = []
    for b, n in SIZES:
        scores, pos, exc, ids = _data(b, n, device)
        counts, calls = [], []
        for share in (None, ExactShare(0.3)):
            metric = SampledRankingMetrics(("ndcg@10",), n_samples=SamplingDesign(20, exact_share=share),
                                           estimators=("none",)).to(device)
            for _ in range(2):  # the second: the first may read a fresh state
                with SyncCounter() as counter:
                    metric.update_from_scorer(lambda u, items: scores[u].gather(1, items), pos, n, exc, ids=ids)
            counts.append(counter.calls)
            calls.append(metric.scoring_cost().calls // 2)
        extra = counts[1] - counts[0]
        assert calls[1] > calls[0] and extra["__bool__"] == calls[1] - calls[0], (b, n, extra, calls)  # per call
        got.append(extra - Counter({"__bool__": calls[1] - calls[0]}))
    assert got[0] == got[1] == got[2] == got[3] == {"nonzero": 1, "__int__": 1, "x[bool mask]": 1}, got


def test_states_and_draws_live_on_the_metric_device(device):
    scores, pos, exc, ids = _data(16, 400, device)
    ex = ExactRankingMetrics(("ndcg@10",)).to(device)
    sm = SampledRankingMetrics(("ndcg@10",), n_samples=20, estimators=("none",)).to(device)
    ad = SampledRankingMetrics(("ndcg@10",), n_samples=SamplingDesign(20, adaptive_max=80), estimators=("none",)).to(device)
    ex.update(scores, pos, exc)
    sm.update(scores, pos, exc, ids=ids)
    ad.update(scores, pos, exc, ids=ids)
    for t in (ex.sums, ex.count, sm.hist, sm.n_items, ad.hist, ad.n_items):
        assert t.device.type == device.type
    p, e = padded_inputs(scores, pos, exc)
    assert keyed_negatives(p, e, 400, SamplingDesign(20), RowKeys.of(0, ids, device)).device.type == device.type
    # the histogram counts every relevant item once, on the device, whatever the device
    assert float(sm.hist.sum()) == float(ad.hist.sum()) == int((pos >= 0).sum())
    assert float(ex.count) == int((pos >= 0).sum())


@pytest.mark.parametrize("name", ["exact", "sampled", "sampled_noreplace", "sampled_adaptive"])
def test_update_temporaries_stay_within_the_score_block(name, monkeypatch):
    """From scores: nothing larger than the (B, n) score block itself plus O(B P (P + E + m)) (keyed hashes,
    drawn scores, removed-item comparisons): no B x n x P comparison. The exact metrics' counting pass is the
    core's (``counting.count_beating``, whose temporaries are the core's budget): stubbed here, so what is
    measured is the adapter's own work around it."""
    b, n, p, e, m = 64, 3000, 2, 5, 20
    scores, pos, exc, ids = _data(b, n, "cpu", p, e)
    metric = _case(name)
    if name == "exact":
        monkeypatch.setattr(tm, "exact_ranks_padded", lambda s, pos, *a, **k: torch.ones_like(pos))
    _update(metric, name, scores, pos, exc, ids, None)
    _, rec = peak_temporary(_update, metric, name, scores, pos, exc, ids, None)
    bound = max(b * n, 8 * b * p * (p + e + m))
    assert rec.peak <= bound, (rec.peak, rec.op)
    assert rec.peak < b * n * p


@pytest.mark.parametrize("name", ["exact_factors", "sampled_factors", "sampled_factors_adaptive"])
def test_factor_update_temporaries_stay_within_a_tile(name):
    """From factors: the largest temporary is one score tile or one gather chunk of drawn items' factors (or
    O(B P m) draws), never the B x P m x d gathered factors nor the B x n scores."""
    b, n, d, p, e = 512, 20_000, 64, 2, 5
    scores, pos, exc, ids = _data(b, 10, "cpu", p, e)
    g = torch.Generator().manual_seed(0)
    u, v = torch.randn(b, d, generator=g), torch.randn(n, d, generator=g)
    order = torch.argsort(torch.rand(b, n, generator=g), 1)
    pos, exc = order[:, :p].clone(), order[:, p:p + e].clone()
    pos[1::2, 1] = -1
    metric = _case(name)
    kw = dict(metrics=("ndcg@10",), estimators=("none",))
    if name.startswith("sampled"):
        cap = 400 if "adaptive" in name else None
        metric = SampledRankingMetrics(**kw, n_samples=SamplingDesign(100, adaptive_max=cap))
    _update(metric, name, None, pos, exc, ids, (u, v))
    _, rec = peak_temporary(_update, metric, name, None, pos, exc, ids, (u, v))
    m = 100
    assert b * p * m * d > TILE_ELEMENTS  # the unchunked gather would exceed the bound
    bound = max(TILE_ELEMENTS, GATHER_ELEMENTS + b * d, 8 * b * p * (p + e + m))
    assert rec.peak <= bound, (rec.peak, rec.op)


def test_factor_overflow_flag_reads_the_item_factors_once_per_tensor_version(monkeypatch):
    """The accelerator's factor path (the overflow bound a flag, ``factor_ranks.overflow_flag``) computes the item
    factors' largest norm once per tensor and version, from the factors as they are (no float64 copy of them per
    batch), as the read-at-once path does; an in-place change of the item factors is seen (the flag then fails)."""
    monkeypatch.setattr(tm, "_READS_ON_CPU", False)
    b, n, d = 8, 500, 16
    _, pos, exc, _ = _data(b, n, "cpu")
    g = torch.Generator().manual_seed(1)
    v = torch.randn(n, d, generator=g)
    seen = []
    norm = torch.linalg.vector_norm

    def recording(x, *args, **kwargs):
        if x.dim() == 2 and x.shape[0] == n:
            seen.append(x.dtype)
        return norm(x, *args, **kwargs)

    monkeypatch.setattr(torch.linalg, "vector_norm", recording)
    metric = ExactRankingMetrics(("ndcg@10",))
    for seed in range(3):  # one item-factor tensor, three user batches
        metric.update_factors(torch.randn(b, d, generator=torch.Generator().manual_seed(seed)), v, pos, exc)
    assert seen == [torch.float32], seen
    assert not bool(metric.failed_checks.any())
    with torch.no_grad():
        v.mul_(3e37)  # in place: a new version, whose scores could overflow float32
    metric.update_factors(torch.randn(b, d, generator=g), v, pos, exc)
    assert seen == [torch.float32] * 2, seen
    with pytest.raises(ValueError, match=r"\[check 'factors_overflow', first failed at update 4"):
        metric.compute()


def test_deferred_flags_cross_to_the_metric_device_in_one_copy(monkeypatch):
    """A metric kept on another device than its inputs (e.g. on the CPU, inputs on CUDA): a batch's deferred flags
    are combined on the inputs' device and moved to the state's in one copy, not one per flag. The inputs' device
    is stood in for by ``meta`` (no second device needed): every move between devices is recorded."""
    from reco_sampled_plugin._inputs import Check

    moves = []
    to = tm._to

    def recording(x, device):
        if x.device != torch.device(device):
            moves.append((x.device.type, torch.device(device).type))
            if x.device.type == "meta":  # a meta tensor has no values to copy: a False flag stands in
                return torch.zeros(x.shape, dtype=x.dtype, device=device)
        return to(x, device)

    monkeypatch.setattr(tm, "_to", recording)
    metric = ExactRankingMetrics(("ndcg@10",))
    flag = torch.zeros((), dtype=torch.bool, device="meta")
    names = ["positives_range", "positives_duplicates", "exclude_range", "scores_finite", "scores_finite"]
    metric._defer_checks([Check(flag, lambda: None, name, "") for name in names])
    assert moves == [("meta", "cpu")], moves
    assert metric.failed_checks.device.type == "cpu" and not bool(metric.failed_checks.any())
