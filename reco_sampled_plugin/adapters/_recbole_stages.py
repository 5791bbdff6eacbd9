"""RecBole adapter, adaptive stages in ``uniN`` mode: the plugin draws and scores what RecBole's sampler cannot.

RecBole's ``uniN`` evaluation draws N items once per held-out item and scores them with the model's ``predict``
(the first stage). With ``rsp_adaptive_max`` the positives still ranked first there draw the next stage's new
items (m doubling up to the cap, uniform with replacement, never one of the user's used items nor the padding
item 0: RecBole's own exclusions), scored by the same ``model.predict`` on an ``Interaction`` built as RecBole
builds its negatives (``_neg_sample_by_point_wise_sampling``): the positive's own row repeated, the item id
replaced, ``dataset.join`` for the drawn items' features. A context-aware model (DeepFM, DCN) so sees the user's
and the item's features, a sequential model (SASRec) the row's item sequence.

The draws, the scorer calls and the counts are the core's (:func:`reco_sampled_plugin.scorer_ranks.adaptive_stages`
with its :class:`~reco_sampled_plugin.scorer_ranks.ScorerCalls`): the same code and generator as
:func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer`, after RecBole's first stage. They run once
per evaluation, over every positive first in the first stage (one chunked ``predict`` per stage).
"""

from __future__ import annotations

import itertools
import time
from typing import Any, Callable

import numpy as np
import torch

from reco_sampled_plugin.adaptive import continues
from reco_sampled_plugin.ranking import SampledRanks
from reco_sampled_plugin.scorer_ranks import ScoringCost, ScorerCalls, adaptive_stages, complete_from_scorer

from reco_sampled_plugin.ranking import prepare_index

from ._recbole_ranks import _ITEM, _M, _N_IRR, _N_POS, _R_SAMPLED, _UID, _counts_per_row, _generator, _neg_layout, _on
from ._recbole_settings import _Settings

__all__ = ["keep_positive_rows", "later_scoring", "run_stages", "run_share", "stage_context"]


# the plugin's rsp_ties -> the core's tie policy with the same law (``average``: the positive placed uniformly
# among its tied items, an integer rank, as the first stage's ``_sampled_from_scores`` does)
_CORE_TIES = {"pessimistic": "pessimistic", "optimistic": "optimistic", "average": "random"}


def keep_positive_rows(collector: Any, interaction: Any, positive_u: torch.Tensor, positive_i: torch.Tensor) -> None:
    """Keep the rows of a ``uniN`` batch that hold its positives (in RecBole's positive order, the order of the
    per-positive table): the context the later stages' pairs are built from. Nothing else of the batch is kept."""
    if positive_u is None or positive_u.numel() == 0:
        return
    items = interaction[collector.config["ITEM_ID_FIELD"]]
    pos_u = _on(positive_u.to(torch.int64), items.device)
    counts = _counts_per_row(pos_u, int(pos_u.max()) + 1)
    rows = _neg_layout(items, pos_u, _on(positive_i.to(torch.int64), items.device), counts)[1]
    collector.__dict__.setdefault("_rsp_kept", []).append(interaction[rows])


def _used_csr(sampler: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """RecBole's per-user used items (``sampler.used_ids``, a numpy array of sets) as CSR (indptr, items), built
    once per sampler phase; None for the ``RepeatableSampler`` of sequential models (each row excludes only its
    own target)."""
    from recbole.sampler import RepeatableSampler

    if isinstance(sampler, RepeatableSampler):
        return None
    used = getattr(sampler, "used_ids", None)
    if used is None:
        raise RuntimeError("reco_sampled_plugin: rsp_adaptive_max in uniN mode needs the evaluation dataloader's "
                           "sampler (RecBole's Trainer.evaluate passes it); evaluate through a RecBole Trainer")
    cached = sampler.__dict__.get("_rsp_used_csr")
    if cached is None or cached[0] is not used:
        sizes = np.fromiter((len(u) for u in used), dtype=np.int64, count=len(used))
        items = np.fromiter(itertools.chain.from_iterable(used), dtype=np.int64, count=int(sizes.sum()))
        cached = sampler.__dict__["_rsp_used_csr"] = (used, (np.concatenate([[0], np.cumsum(sizes)]), items))
    return cached[1]


def _exclusions(csr: tuple[np.ndarray, np.ndarray] | None, uids: torch.Tensor, pos_i: torch.Tensor) -> torch.Tensor:
    """(K, E) exclusions of K positives, -1 padded: the padding item 0 and the user's used items but the positive
    itself (the core's draws never return a positive nor an excluded item)."""
    k = uids.shape[0]
    zero = torch.zeros((k, 1), dtype=torch.int64)
    if csr is None:
        return zero
    indptr, items = csr
    u = uids.cpu().numpy()
    start, size = indptr[u], indptr[u + 1] - indptr[u]
    width = int(size.max()) if k else 0
    col = np.arange(width)
    take = col[None, :] < size[:, None]
    out = np.full((k, width), -1, dtype=np.int64)
    out[take] = items[(start[:, None] + col[None, :])[take]]
    out[out == pos_i.cpu().numpy()[:, None]] = -1
    return torch.cat([zero, torch.from_numpy(out)], 1)


def _predict_scorer(model: Any, dataset: Any, device: torch.device, rows: Any,
                    item_field: str) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """``scorer(users, items)`` over ``model.predict``: user k is the positive of row k of ``rows`` (an
    ``Interaction``); its pairs copy that row, take the drawn item ids and the items' features
    (``dataset.join``), as RecBole builds its own negatives."""
    from recbole.data.interaction import Interaction

    def scorer(users: torch.Tensor, items: torch.Tensor) -> torch.Tensor:
        b, length = items.shape
        inter = rows[users.cpu()].repeat_interleave(length)
        inter.update(Interaction({item_field: items.reshape(-1).cpu()}))
        inter = dataset.join(inter)
        with torch.no_grad():
            got = model.predict(inter.to(device))
        return got.reshape(b, length).to(items.device)

    scorer.__qualname__ = f"{type(model).__name__}.predict"
    return scorer


def stage_context(collector: Any, table: torch.Tensor, key: str) -> tuple[Any, torch.Tensor, Any, Any] | None:
    """(the positives' kept rows, their first-stage scores, the model, the dataloader) of a ``uniN`` / ``popN``
    evaluation, taken off the collector once for the plugin's later scoring (``key``: the config key that asks for
    it, named in errors); None when nothing was kept (no sampled batch)."""
    kept = collector.__dict__.pop("_rsp_kept", None)
    scores = collector.__dict__.pop("_rsp_pos_scores", None)
    if not kept or not scores or table.shape[0] == 0:
        return None
    pos_scores = _on(scores[0] if len(scores) == 1 else torch.cat([_on(s, scores[0].device) for s in scores]),
                     table.device)
    from recbole.data.interaction import cat_interactions

    model = getattr(collector, "_rsp_model", None)
    eval_data = getattr(collector, "_rsp_eval_data", None)
    if model is None or eval_data is None:
        raise RuntimeError(f"reco_sampled_plugin: {key} in a sampled mode scores with the model's predict; "
                           "evaluate through a RecBole Trainer (its evaluate hands the model over)")
    rows = kept[0] if len(kept) == 1 else cat_interactions(kept)
    if len(rows) != table.shape[0] or pos_scores.shape[0] != table.shape[0]:
        raise RuntimeError(f"reco_sampled_plugin: {len(rows)} kept rows and {pos_scores.shape[0]} scores for "
                           f"{table.shape[0]} positives")
    return rows, pos_scores, model, eval_data


def run_stages(collector: Any, table: torch.Tensor, settings: _Settings, context: tuple) -> ScoringCost:
    """Run the adaptive stages on the per-positive table of a ``uniN`` evaluation, in place (``sampled_rank`` and
    ``m`` of the positives that drew more) and return what the evaluation scored (RecBole's first stage and the
    plugin's stages); ``context``: :func:`stage_context`'s."""
    rows, pos_scores, model, eval_data = context
    t0 = time.perf_counter()
    dev = table.device
    design = settings.design
    assert design is not None  # rsp_adaptive_max: one first-stage size, so one design (validate_config)
    m0 = design.n_samples
    first_stage = int(table.shape[0] * (1 + m0))
    ranks0 = table[:, _R_SAMPLED].to(torch.int64)
    todo = (continues(ranks0, design) & (table[:, _M] == m0)).nonzero().squeeze(1)
    config = collector.config
    item_num = int(eval_data._dataset.item_num)
    uids = table[todo, _UID].to(torch.int64)
    pos_i = table[todo, _ITEM].to(torch.int64)
    exclude = _on(_exclusions(_used_csr(eval_data._sampler), uids, pos_i), dev)
    scorer = _predict_scorer(model, eval_data._dataset, collector._rsp_device, rows[todo.cpu()],
                             config["ITEM_ID_FIELD"])
    calls = ScorerCalls(scorer, int(config["eval_batch_size"]), settings.check_finite is True, dev)
    stages = 1
    if todo.numel():
        positives = pos_i.unsqueeze(1)
        pos, exc = prepare_index(positives, exclude, todo.numel(), item_num, dev)
        ranks, sizes, stages = adaptive_stages(
            calls, pos, exc, torch.arange(todo.numel(), device=dev), pos_scores[todo].unsqueeze(1).to(torch.float64),
            ranks0[todo].unsqueeze(1), design, item_num, _CORE_TIES[settings.ties],
            _generator(collector, settings, dev), from_mask=False)
        table[todo, _R_SAMPLED] = ranks[:, 0].to(torch.float64)
        table[todo, _M] = sizes[:, 0].to(torch.float64)
    full = _full_pairs(table)
    seconds = time.perf_counter() - t0
    return ScoringCost(first_stage + calls.pairs, calls.calls, calls.seconds, max(seconds - calls.seconds, 0.0),
                       full, stages)


def _full_pairs(table: torch.Tensor) -> int:
    """The pairs full ranking scores: each evaluated row's candidates (its irrelevant items and its positives), once
    per row."""
    return int(((table[:, _N_IRR] - 1 + table[:, _N_POS]) / table[:, _N_POS]).sum().round())


def later_scoring(collector: Any, table: torch.Tensor, settings: _Settings) -> tuple[ScoringCost, str] | None:
    """What the plugin scores after RecBole's sampled batches, in place on the per-positive table: ``uniN`` with
    ``rsp_adaptive_max`` the later stages (:func:`run_stages`), then with ``rsp_exact_share`` the share
    (:func:`run_share`; its exact ranks and inclusion probabilities kept on the table as ``_rsp_share``, which
    ``_recbole_metrics`` reads). Returns (what the evaluation scored, RecBole's first stage included; its name in
    words), None where nothing was kept (no sampled batch)."""
    from ._recbole_metrics import share_sample

    key = "rsp_adaptive_max" if settings.adaptive_max is not None else "rsp_exact_share"
    context = stage_context(collector, table, key)
    if context is None:
        return None
    if settings.adaptive_max is not None:
        cost, what = run_stages(collector, table, settings, context), "adaptive uniN sampling"
    else:  # RecBole's sampled batches alone: 1 + N pairs per positive
        cost, what = ScoringCost(int((1 + table[:, _M]).sum()), 0, 0.0, 0.0, _full_pairs(table), 1), "sampling"
    if settings.exact_share is not None:
        exact, inclusion, share_cost = run_share(collector, table, settings, context, share_sample(table, settings))
        table.__dict__["_rsp_share"] = (exact.to(torch.float64).cpu(), inclusion.cpu())
        chosen = int((exact > 0).sum())
        cost = cost + share_cost
        cost = ScoringCost(cost.pairs, cost.calls, cost.scorer_seconds, cost.loop_seconds, cost.full_pairs,
                           cost.stages + int(chosen > 0))
        what += f" with an exact share ({settings.exact_share.describe()}: {chosen} positives ranked exactly)"
    return cost, what


def run_share(collector: Any, table: torch.Tensor, settings: _Settings, context: tuple,
              sampled: SampledRanks) -> tuple[torch.Tensor, torch.Tensor, ScoringCost]:
    """The exact share (``rsp_exact_share``) of a ``uniN`` / ``popN`` evaluation: pi of each positive
    (``_design_based.share_inclusion`` of ``sampled``, the table's sampled ranks under the evaluation's design: an
    active share fits the model on them first), the keyed choice (``_share.choose_share``: user id and item id
    under ``rsp_seed``, the same positives whichever batch or model), and each chosen positive ranked exactly
    among its user's candidates (the catalogue but the padding item 0 and the user's used items, RecBole's
    exclusions: the table's ``n_candidates``) by scoring them all through the model's ``predict``
    (``scorer_ranks.complete_from_scorer``). Returns (exact ranks, 0 where not chosen; pi; what the share scored:
    ``ScoringCost``, its ``full_pairs`` 0: the evaluation's are counted once, by the caller)."""
    from reco_sampled_plugin._design_based import share_inclusion
    from reco_sampled_plugin._share import choose_share

    rows, pos_scores, model, eval_data = context
    t0 = time.perf_counter()
    dev = table.device
    uids, items = table[:, _UID].to(torch.int64), table[:, _ITEM].to(torch.int64)
    item_num = int(eval_data._dataset.item_num)
    csr = _used_csr(eval_data._sampler)
    scorer = _predict_scorer(model, eval_data._dataset, collector._rsp_device, rows,
                             collector.config["ITEM_ID_FIELD"])
    calls = ScorerCalls(scorer, int(collector.config["eval_batch_size"]), settings.check_finite is True, dev)
    gen = _generator(collector, settings, dev)

    def rank_chosen(chosen: torch.Tensor) -> torch.Tensor:
        """Exact ranks of the chosen positives (K, 1), 0 elsewhere: only their rows' exclusions are built."""
        out = torch.zeros(chosen.shape, dtype=torch.int64, device=dev)
        idx = chosen[:, 0].nonzero().squeeze(1)
        if idx.numel():
            exclude = _on(_exclusions(csr, uids[idx], items[idx]), dev)
            pos, exc = prepare_index(items[idx].unsqueeze(1), exclude, idx.numel(), item_num, dev)
            out[idx] = complete_from_scorer(calls, pos >= 0, pos, exc, idx, pos_scores[idx].reshape(-1, 1).to(
                torch.float64), item_num, _CORE_TIES[settings.ties], gen).to(torch.int64)
        return out

    assert sampled.design is not None and sampled.design.exact_share is not None  # rsp_exact_share
    pi = share_inclusion(sampled, sampled.design.exact_share)  # one positive per row of the choice:
    per_row = SampledRanks(sampled.ranks.reshape(-1, 1), sampled.candidates().reshape(-1, 1), None, sampled.design)
    got = choose_share(per_row, uids, items.unsqueeze(1), rank_chosen, pi)
    assert got.share_ranks is not None and got.inclusion is not None  # the design has a share
    seconds = time.perf_counter() - t0
    cost = ScoringCost(calls.pairs, calls.calls, calls.seconds, max(seconds - calls.seconds, 0.0), 0, 1)
    return got.share_ranks.reshape(-1), got.inclusion.reshape(-1), cost
