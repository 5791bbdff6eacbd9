"""RecBole adapter: exact, sampled and corrected ranking metrics as RecBole metrics.

Import this module once (or call :func:`run_recbole`) and name the plugin's metrics in a RecBole config::

    metrics: [Recall, NDCG, CorrectedRecall, CorrectedNDCG, MappedHit]
    rsp_m: 100            # full mode: simulate 100 uniformly sampled items per relevant item

Importing applies the compatibility layer (:mod:`._recbole_compat`, switch off with
``RECO_SAMPLED_RECBOLE_COMPAT=0``) and :func:`register` s the metrics in RecBole's registries in place.
RecBole 1.2.1 gives metrics no per-positive ranks, so the plugin wraps its ``Collector``: every held-out
(user, item) pair becomes one evaluation instance with

* full mode: its exact rank among the user's candidates (training items, and validation items at test
  time, excluded as RecBole does), and, with ``rsp_m``, a sampled rank against ``rsp_m`` items drawn
  (seeded) from the user's irrelevant items;
* ``uniN`` / ``popN`` modes: its sampled rank against its own N draws, rebuilt from the interaction layout
  (row ``o_u + k_u + j k_u + i`` of a user's block holds negative j of its positive i), not RecBole's pooled
  ranking against all of the user's negatives;

and the user's candidate count n (irrelevant items + 1). Estimates come from
:func:`reco_sampled_plugin.estimators.estimate`. See ``docs/recbole.md`` for every name and key.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reco_sampled_plugin.estimators import estimate
from reco_sampled_plugin.mapping import MAPPING_METHODS
from reco_sampled_plugin.metric_names import parse_metric
from reco_sampled_plugin.metrics import _metric_from_float_ranks
from reco_sampled_plugin.rank_distribution import RANK_DISTRIBUTION_METHODS
from reco_sampled_plugin._rank_hist import _bincount_histogram, sampled_rank_histogram

from . import _recbole_compat

__all__ = [
    "register",
    "registered",
    "run_recbole",
    "validate_config",
    "metric_classes",
    "positive_table",
    "COLUMNS",
    "PLUGIN_KEY",
    "CONFIG_DEFAULTS",
    "FAMILIES",
]

logger = logging.getLogger("reco_sampled_plugin.adapters.recbole")

#: DataStruct key under which the wrapped collector stores the per-positive table.
PLUGIN_KEY = "rsp.ranks"

# columns of the per-positive table (float64, one row per held-out (user, item) pair)
_USER, _R_FULL, _R_IRR, _N_IRR, _R_SAMPLED, _M, _N_POS, _UID, _ITEM = range(9)
_N_COLS = 9
#: Column names of the per-positive table stored under :data:`PLUGIN_KEY` (see :func:`positive_table`).
COLUMNS = ("user", "rank_full", "rank_irrelevant", "n_candidates", "sampled_rank", "m", "n_positives", "uid", "item")
# rank columns: 0 = not available (sampled modes have no exact rank), -1 = beyond the computed top
_BEYOND = -1.0

#: Every plugin config key with its default (``None``: see docs/recbole.md).
CONFIG_DEFAULTS: dict[str, Any] = {
    "rsp_m": None,  # simulated sample size m in full mode (uniN: must equal N if given)
    "rsp_replacement": True,  # simulated draws with replacement (binomial law) or without (hypergeometric)
    "rsp_seed": None,  # seed of the simulated draws (default: RecBole's `seed`)
    "rsp_correction": "bv",  # Corrected*: none, rank_estimate, ls, cls, bv
    "rsp_gamma": 0.1,  # bv: bias-variance weight in [0, 1]
    "rsp_prior": "uniform",  # ls/cls/bv prior: uniform, mle (bv only), or [beta, a]
    "rsp_mapping": "bound",  # Mapped*: linear, bound, beta, beta_fit
    "rsp_mapping_a": None,  # Mapped* with beta: the Beta shape a (default 1); beta_fit: the start value
    "rsp_rank_dist": "mes",  # RankDist*: mes (default: more accurate, docs/estimators.md) or mle
    "rsp_bootstrap": 8,  # RankDist*: bootstrap replicates for the standard error (>= 2)
    "rsp_weighting": "user",  # user: each user counts once (weight 1/|T_u|, as RecBole averages); item
    "rsp_ties": "pessimistic",  # pessimistic, optimistic, average
    "rsp_n_grid": 0.01,  # relative grid the candidate counts n are rounded to (0: exact per-user n)
    "rsp_side_by_side": True,  # also report <name>_sampled (and <name>_exact in full mode)
    "rsp_stderr": False,  # also report <name>_stderr
    "rsp_full_ranks": False,  # full mode: exact ranks of every positive even with > 64 positives per user on average
    "rsp_tensorboard": True,  # write the plugin's values to RecBole's TensorBoard writer
}

_TIES = ("pessimistic", "optimistic", "average")
_CORRECTIONS = ("none", "rank_estimate", "ls", "cls", "bv")

# metric class suffix -> core metric kind (single relevant item form)
_ESTIMATED_KINDS = {
    "Recall": "recall",
    "Hit": "hit",
    "NDCG": "ndcg",
    "AP": "ap",
    "MRR": "rr",
    "Precision": "precision",
    "AUC": "auc",
}
# RecBole's list conventions, computed from the plugin's exact ranks
_EXACT_KINDS = ("Recall", "Hit", "NDCG", "MRR", "Precision", "MAP")

#: family -> (class name prefix, metric kinds)
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "corrected": ("Corrected", tuple(_ESTIMATED_KINDS)),
    "mapped": ("Mapped", tuple(_ESTIMATED_KINDS)),
    "rankdist": ("RankDist", tuple(_ESTIMATED_KINDS)),
    "exact": ("Exact", _EXACT_KINDS),
}


# ------------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class _Settings:
    metrics: tuple[str, ...]  # lower-case plugin metric names in the config
    modes: dict  # phase -> RecBole eval mode string
    m: int | None
    replacement: bool
    seed: int
    correction: str
    gamma: float
    prior: Any
    mapping: str
    mapping_a: float | None
    rank_dist: str
    bootstrap: int
    weighting: str
    ties: str
    n_grid: float
    side_by_side: bool
    stderr: bool
    full_ranks: bool
    tensorboard: bool
    topk: tuple[int, ...]
    decimal_place: int

    @property
    def needs_exact(self) -> bool:
        return any(_family_of(name) == "exact" for name in self.metrics)


def _family_of(name: str) -> str:
    return _METRIC_CLASSES[name.lower()].family


def _get(config, key: str):
    value = config[key]
    return CONFIG_DEFAULTS[key] if value is None else value


def _config_keys(config) -> list[str]:
    final = getattr(config, "final_config_dict", None)
    keys = final.keys() if isinstance(final, dict) else (config.keys() if hasattr(config, "keys") else [])
    return [k for k in keys if isinstance(k, str) and k.startswith("rsp_")]


def _modes(config) -> dict:
    eval_args = config["eval_args"] or {}
    mode = eval_args.get("mode", "full")
    if isinstance(mode, str):
        return {"valid": mode, "test": mode}
    return {"valid": mode.get("valid", "full"), "test": mode.get("test", "full")}


def _sample_num(mode: str) -> int | None:
    if mode[:3] in ("uni", "pop") and mode[3:].isdigit():
        return int(mode[3:])
    return None


def _as_int(value, key: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or int(value) < minimum:
        raise ValueError(f"{key}: expected an integer >= {minimum}, got {value!r}")
    return int(value)


def _as_bool(value, key: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"{key}: expected true or false, got {value!r}")
    return bool(value)


def _parse_prior(value, correction: str):
    if isinstance(value, str) and value.lower() in ("uniform", "none"):
        return None
    if isinstance(value, str) and value.lower() == "mle":
        if correction != "bv":
            raise ValueError(f"rsp_prior: 'mle' (prior estimated from the sampled ranks) needs rsp_correction: bv, got {correction!r}")
        return "mle"
    if isinstance(value, (list, tuple)) and len(value) == 2 and str(value[0]).lower() == "beta":
        try:
            a = float(value[1])
        except (TypeError, ValueError):
            a = float("nan")
        if not (a > 0 and math.isfinite(a)):
            raise ValueError(f"rsp_prior: the Beta prior needs a positive shape a, got {value[1]!r}")
        return ("beta", a)
    raise ValueError(f"rsp_prior: expected 'uniform', 'mle' or [beta, a], got {value!r}")


def plugin_metrics_in(config) -> tuple[str, ...]:
    """Lower-case names of the plugin metrics listed in a RecBole config's ``metrics``."""
    metrics = config["metrics"] or []
    if isinstance(metrics, str):
        metrics = [metrics]
    return tuple(m.lower() for m in metrics if isinstance(m, str) and m.lower() in _METRIC_CLASSES)


def validate_config(config) -> _Settings | None:
    """Check the plugin keys of a RecBole ``Config`` (or any mapping with ``[]``); None without plugin metrics.

    Raises:
        ValueError naming the offending key: unknown ``rsp_*`` key, unknown method, gamma outside [0, 1],
        a plugin metric in ``labeled`` mode, ``rsp_m`` missing (full mode) or different from N (uniN), ...
    """
    names = plugin_metrics_in(config)
    unknown = sorted(set(_config_keys(config)) - set(CONFIG_DEFAULTS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown reco_sampled_plugin key; known keys: {sorted(CONFIG_DEFAULTS)}")
    if not names:
        return None
    families = {_family_of(n) for n in names}
    estimators = families - {"exact"}
    modes = _modes(config)
    for phase, mode in modes.items():
        if not isinstance(mode, str):
            raise ValueError(f"eval_args.mode: expected a string for {phase}, got {mode!r}")
        if mode == "labeled":
            raise ValueError(
                f"eval_args.mode: plugin metric {names[0]!r} needs a ranking evaluation (full, uniN or popN), "
                f"but the {phase} mode is 'labeled' (no ranks)"
            )
        if mode != "full" and _sample_num(mode) is None:
            raise ValueError(f"eval_args.mode: unsupported mode {mode!r} for the plugin metrics")
        if mode != "full" and "exact" in families:
            raise ValueError(
                f"eval_args.mode: {[n for n in names if _family_of(n) == 'exact'][0]!r} needs exact ranks "
                f"(full mode), but the {phase} mode is {mode!r}"
            )
    correction = str(_get(config, "rsp_correction")).lower()
    if correction not in _CORRECTIONS:
        raise ValueError(f"rsp_correction: unknown correction method {correction!r}; use one of {_CORRECTIONS}")
    gamma_raw = _get(config, "rsp_gamma")
    try:
        gamma = float(gamma_raw)
    except (TypeError, ValueError):
        raise ValueError(f"rsp_gamma: expected a number in [0, 1], got {gamma_raw!r}") from None
    if not (0.0 <= gamma <= 1.0):
        raise ValueError(f"rsp_gamma: must lie in [0, 1], got {gamma_raw!r}")
    prior = _parse_prior(_get(config, "rsp_prior"), correction)
    mapping = str(_get(config, "rsp_mapping")).lower()
    if mapping not in MAPPING_METHODS:
        raise ValueError(f"rsp_mapping: unknown mapping method {mapping!r}; use one of {MAPPING_METHODS}")
    mapping_a = config["rsp_mapping_a"]
    if mapping_a is not None:
        try:
            mapping_a = float(mapping_a)
        except (TypeError, ValueError):
            mapping_a = float("nan")
        if not (mapping_a > 0 and math.isfinite(mapping_a)):
            raise ValueError(f"rsp_mapping_a: expected a positive number, got {config['rsp_mapping_a']!r}")
    if mapping == "beta" and mapping_a is None:
        mapping_a = 1.0
    rank_dist = str(_get(config, "rsp_rank_dist")).lower()
    if rank_dist not in RANK_DISTRIBUTION_METHODS:
        raise ValueError(f"rsp_rank_dist: unknown rank-distribution method {rank_dist!r}; use one of {RANK_DISTRIBUTION_METHODS}")
    bootstrap = _as_int(_get(config, "rsp_bootstrap"), "rsp_bootstrap", 2)
    weighting = str(_get(config, "rsp_weighting")).lower()
    if weighting not in ("user", "item"):
        raise ValueError(f"rsp_weighting: expected 'user' or 'item', got {weighting!r}")
    ties = str(_get(config, "rsp_ties")).lower()
    if ties not in _TIES:
        raise ValueError(f"rsp_ties: expected one of {_TIES}, got {ties!r}")
    n_grid_raw = _get(config, "rsp_n_grid")
    try:
        n_grid = float(n_grid_raw)
    except (TypeError, ValueError):
        n_grid = float("nan")
    if not (0.0 <= n_grid <= 0.1):
        raise ValueError(f"rsp_n_grid: expected a relative step in [0, 0.1], got {n_grid_raw!r}")
    replacement = _as_bool(_get(config, "rsp_replacement"), "rsp_replacement")
    m_raw = config["rsp_m"]
    m = None if m_raw is None else _as_int(m_raw, "rsp_m", 1)
    for phase, mode in modes.items():
        n_draws = _sample_num(mode)
        if n_draws is not None and estimators:
            if m is not None and m != n_draws:
                raise ValueError(f"rsp_m: {m} disagrees with the {phase} mode {mode!r}, which samples {n_draws} items")
            if not replacement:
                raise ValueError(f"rsp_replacement: RecBole's {mode!r} mode draws with replacement; set rsp_replacement: true")
            if mode.startswith("pop"):
                bad = [n for n in names if _family_of(n) in ("mapped", "rankdist")]
                if bad or ("corrected" in families and correction != "none"):
                    raise ValueError(
                        f"eval_args.mode: {mode!r} draws items by popularity, but the estimators assume uniform draws "
                        f"({(bad or [n for n in names if _family_of(n) == 'corrected'])[0]!r}); use 'uni{n_draws}', or "
                        "rsp_correction: none to report the plain sampled metric"
                    )
        if mode == "full" and estimators and m is None:
            est = [n for n in names if _family_of(n) != "exact"][0]
            raise ValueError(
                f"rsp_m: {est!r} estimates a full-catalogue metric from sampled ranks; in full mode set rsp_m "
                "(e.g. 100) so the plugin simulates sampling, or evaluate in 'uniN' mode"
            )
    seed_raw = config["rsp_seed"]
    seed = _as_int(seed_raw, "rsp_seed", 0) if seed_raw is not None else int(config["seed"] or 0)
    topk = config["topk"] or [10]
    topk = (topk,) if isinstance(topk, int) else tuple(int(k) for k in topk)
    full_ranks = _as_bool(_get(config, "rsp_full_ranks"), "rsp_full_ranks") or any(n.endswith("auc") for n in names)
    decimal = config["metric_decimal_place"]
    return _Settings(
        metrics=names,
        modes=modes,
        m=m,
        replacement=replacement,
        seed=seed,
        correction=correction,
        gamma=gamma,
        prior=prior,
        mapping=mapping,
        mapping_a=mapping_a,
        rank_dist=rank_dist,
        bootstrap=bootstrap,
        weighting=weighting,
        ties=ties,
        n_grid=n_grid,
        side_by_side=_as_bool(_get(config, "rsp_side_by_side"), "rsp_side_by_side"),
        stderr=_as_bool(_get(config, "rsp_stderr"), "rsp_stderr"),
        full_ranks=full_ranks,
        tensorboard=_as_bool(_get(config, "rsp_tensorboard"), "rsp_tensorboard"),
        topk=topk,
        decimal_place=4 if decimal is None else int(decimal),
    )


def _settings_key(config) -> str:
    keys = ["metrics", "eval_args", "topk", "seed", "metric_decimal_place", *sorted(_config_keys(config))]
    return repr([(k, config[k]) for k in keys])


def _settings(config) -> _Settings | None:
    """Validated settings, cached on the config object while the relevant keys stay unchanged."""
    key = _settings_key(config)
    cached = config.__dict__.get("_rsp_settings") if hasattr(config, "__dict__") else None
    if cached is not None and cached[0] == key:
        return cached[1]
    settings = validate_config(config)
    if hasattr(config, "__dict__"):
        config.__dict__["_rsp_settings"] = (key, settings)
    return settings


# -------------------------------------------------------------------------------- rank collection
def _ranks_from_counts(ge: torch.Tensor, gt: torch.Tensor, ties: str) -> torch.Tensor:
    """Rank from #(s >= s_pos) (the positive included) and #(s > s_pos), as float64."""
    ge = ge.to(torch.float64)
    gt = gt.to(torch.float64)
    if ties == "pessimistic":
        return ge
    if ties == "optimistic":
        return gt + 1.0
    return (ge + gt + 1.0) / 2.0


def _sampled_from_scores(neg: torch.Tensor, pos: torch.Tensor, ties: str, generator: torch.Generator | None) -> torch.Tensor:
    """Sampled rank 1 + #(sampled items above the positive) per row of ``neg`` (Npos, m); ties per policy
    (``average``: tied items are ordered at random, whose expectation is the average rank)."""
    above = (neg > pos.unsqueeze(1)).sum(1)
    if ties == "optimistic":
        return (above + 1).to(torch.float64)
    tied = (neg == pos.unsqueeze(1)).sum(1)
    if ties == "pessimistic":
        return (above + tied + 1).to(torch.float64)
    u = torch.rand(tied.shape, generator=generator, dtype=torch.float64)
    return (above + 1).to(torch.float64) + torch.floor(u * (tied + 1).to(torch.float64))


def _descending_score_keys(s: torch.Tensor) -> torch.Tensor:
    """int64 keys in [0, 2^32) ordering the scores from highest to lowest, equal exactly for equal scores:
    the IEEE bits of float32 (float16 / bfloat16 convert exactly) made monotonic; dense ranks otherwise."""
    if s.dtype in (torch.float32, torch.float16, torch.bfloat16):
        bits = (s.to(torch.float32) + 0.0).view(torch.int32).to(torch.int64)  # + 0.0: -0.0 becomes +0.0
        bits = torch.where(bits < 0, bits ^ 0x7FFFFFFF, bits)  # signed-integer order = float order
        return 0x7FFFFFFF - bits
    uniq, inverse = torch.unique(s, sorted=True, return_inverse=True)
    return uniq.shape[0] - 1 - inverse


def _other_positive_counts(pos_u: torch.Tensor, s_pos: torch.Tensor, counts: torch.Tensor):
    """#(other positives of the same user scoring >= / > each positive), from one integer sort of the
    positives by (user, score descending): within a user, the positives above are those before its run
    of equal scores."""
    n = pos_u.shape[0]
    if n == 0:
        return torch.zeros_like(pos_u), torch.zeros_like(pos_u)
    key, order = torch.sort((pos_u << 32) + _descending_score_keys(s_pos))
    new_run = torch.ones(n, dtype=torch.bool)
    new_run[1:] = key[1:] != key[:-1]  # a run: one user's positives with one score
    run_id = torch.cumsum(new_run, 0) - 1
    run_len = torch.bincount(run_id)
    run_end = torch.cumsum(run_len, 0)[run_id]
    user_start = (torch.cumsum(counts, 0) - counts)[pos_u[order]]
    gt, ge = torch.empty_like(pos_u), torch.empty_like(pos_u)
    gt[order] = run_end - run_len[run_id] - user_start
    ge[order] = run_end - user_start - 1  # minus the positive itself
    return ge, gt


def _topk_full_mode(scores, pos_u, s_pos, counts, settings: _Settings):
    """Exact ranks (full list, and among irrelevant items) up to the largest ``topk``, for users with many
    positives (see :data:`_COUNT_MAX_MEAN_POSITIVES`): one ``torch.topk`` of size max(topk) + max |T_u|;
    ranks beyond are marked -1 (every cut-off metric is 0 there)."""
    from reco_sampled_plugin.counting import count_beating_rows

    n_tot = scores.shape[1]
    kmax = int(counts.max()) if counts.numel() else 0
    ktop = min(n_tot, max(settings.topk) + kmax)
    vals = torch.topk(scores, ktop, dim=1).values  # (B, ktop), descending
    rows = vals[pos_u]
    ge = (rows >= s_pos.unsqueeze(1)).sum(1)
    gt = (rows > s_pos.unsqueeze(1)).sum(1)
    last = vals[pos_u, -1]
    known = (ge < ktop) | (ktop == n_tot)  # every item scoring >= s_pos lies in the top
    tie_edge = (~known) & (s_pos == last)  # ties across the edge of the top: count on the full row
    if bool(tie_edge.any()):
        idx = tie_edge.nonzero().squeeze(1)
        ge[idx] = count_beating_rows(scores, pos_u[idx], s_pos[idx], inclusive=True)
        gt[idx] = count_beating_rows(scores, pos_u[idx], s_pos[idx], inclusive=False)
        known[idx] = True
    other_ge, other_gt = _other_positive_counts(pos_u, s_pos, counts)
    r_full = _ranks_from_counts(ge, gt, settings.ties)
    r_irr = _ranks_from_counts(ge - other_ge, gt - other_gt, settings.ties)
    r_full = torch.where(known, r_full, torch.full_like(r_full, _BEYOND))
    r_irr = torch.where(known, r_irr, torch.full_like(r_irr, _BEYOND))
    return r_full, r_irr


# Full mode counts, for every positive, the items of its user's row scoring >= / > it (one compiled pass of
# |T_u| x n comparisons per user, no padding): exact ranks of every positive, and simulated sampled ranks
# drawn from them. With more held-out items per user than this on average, a top-k of each row is cheaper
# (exact ranks up to max(topk), simulated ranks from drawn items); ``rsp_full_ranks`` always counts.
_COUNT_MAX_MEAN_POSITIVES = 64


def _full_counts(scores, pos_u, s_pos, ties: str):
    """#(items scoring >= each positive) over its user's whole row (itself included), #(items scoring >
    it) (None for pessimistic ties: not needed), and each row's candidate count (items with a score above
    -inf: RecBole sets padding and history items to -inf; NaN scores never count), from one compiled
    count (the candidate counts ride along as one extra reference per row)."""
    from reco_sampled_plugin.counting import count_beating_rows

    b, npos = scores.shape[0], pos_u.shape[0]
    lowest = torch.full((b,), torch.finfo(scores.dtype).min, dtype=scores.dtype)
    both = count_beating_rows(scores, torch.cat([pos_u, torch.arange(b)]), torch.cat([s_pos, lowest]), inclusive=True)
    gt = None if ties == "pessimistic" else count_beating_rows(scores, pos_u, s_pos, inclusive=False)
    return both[:npos], gt, both[npos:]


def _binomial_sampled(ge_irr, gt_irr, n_irr_items, m: int, ties: str, generator: torch.Generator) -> torch.Tensor:
    """Sampled ranks of uniform sampling with replacement drawn from the exact counts: each of the m draws
    is an irrelevant item scoring >= the positive with probability ge_irr / N (N irrelevant candidates), so
    r~ = 1 + Binomial(m, ge_irr / N) (pessimistic), 1 + Binomial(m, gt_irr / N) (optimistic); ``average``
    splits the draws into above / tied / below and places the positive uniformly among the tied ones, as
    :func:`_sampled_from_scores` does with drawn items. Same law as drawing items, ~1e4 draws instead of 1e6."""
    n_items = n_irr_items.to(torch.float64).clamp(min=1.0)
    trials = torch.full_like(n_items, float(m))
    if ties == "pessimistic":
        return 1.0 + torch.binomial(trials, (ge_irr.to(torch.float64) / n_items).clamp(0.0, 1.0), generator=generator)
    gt = gt_irr.to(torch.float64)
    above = torch.binomial(trials, (gt / n_items).clamp(0.0, 1.0), generator=generator)
    if ties == "optimistic":
        return above + 1.0
    eq = (ge_irr.to(torch.float64) - gt).clamp(min=0.0)
    rest = (n_items - gt).clamp(min=1.0)
    tied = torch.binomial(trials - above, (eq / rest).clamp(0.0, 1.0), generator=generator)
    u = torch.rand(tied.shape, generator=generator, dtype=torch.float64)
    return above + 1.0 + torch.floor(u * (tied + 1.0))


def _simulate(scores, pos_u, pos_i, s_pos, settings: _Settings, generator: torch.Generator):
    """Draw m irrelevant items per positive among the user's candidates (finite scores, not a positive of
    the user) and return the sampled ranks."""
    b, n_tot = scores.shape
    m = int(settings.m)
    npos = pos_u.shape[0]
    if settings.replacement:
        # excluded items score -inf (RecBole; any non-finite score counts as excluded); the user's positives are set to -inf on a copy, so one gather
        # of the drawn items' scores also tells which draws to reject and redraw (a few %, shrinking subset)
        work = scores.clone()
        work[pos_u, pos_i] = -math.inf
        neg = torch.randint(0, n_tot, (npos, m), generator=generator)
        s_neg = work[pos_u.unsqueeze(1), neg]
        flat_s = s_neg.view(-1)
        row = pos_u.repeat_interleave(m)
        todo = (~torch.isfinite(flat_s)).nonzero().squeeze(1)
        for _ in range(10_000):  # rejection sampling over the rejected draws only
            if todo.numel() == 0:
                break
            redraw = torch.randint(0, n_tot, (todo.numel(),), generator=generator)
            new = work[row[todo], redraw]
            flat_s[todo] = new
            todo = todo[~torch.isfinite(new)]
        else:  # pragma: no cover - a user with no irrelevant candidate
            raise ValueError("rsp_m: some user has no irrelevant candidate item to sample")
        return _sampled_from_scores(s_neg, s_pos, settings.ties, generator)
    allowed = torch.isfinite(scores)  # without replacement: the m smallest of random keys over allowed items
    allowed[pos_u, pos_i] = False
    n_allowed = allowed.sum(1)
    if bool((n_allowed[pos_u] < m).any()):
        raise ValueError(f"rsp_m: {m} draws without replacement exceed some user's {int(n_allowed.min())} irrelevant items")
    neg = torch.empty((npos, m), dtype=torch.int64)
    chunk = max(1, (1 << 22) // max(n_tot, 1))
    for start in range(0, npos, chunk):
        sl = slice(start, start + chunk)
        keys = torch.rand((pos_u[sl].shape[0], n_tot), generator=generator)
        keys = keys.masked_fill(~allowed[pos_u[sl]], 2.0)
        neg[sl] = torch.topk(keys, m, dim=1, largest=False).indices
    s_neg = scores[pos_u.unsqueeze(1), neg]
    return _sampled_from_scores(s_neg, s_pos, settings.ties, generator)


def _neg_layout(interaction, iid_field: str, pos_u, pos_i, counts):
    """Rows of each positive's own N negatives in a NegSampleEvalDataLoader batch.

    A user with k positives occupies k (1 + N) consecutive rows: its k positives, then negative j of
    positive i at offset k + j k + i (``Sampler.sample_by_key_ids`` tiles the user's positives).
    """
    items = interaction[iid_field].cpu()
    total = int(counts.sum())
    rows = items.shape[0]
    if total == 0 or rows % total:
        raise RuntimeError(f"reco_sampled_plugin: unexpected sampled-evaluation layout ({rows} rows for {total} positives)")
    n_draws = rows // total - 1
    if n_draws < 1:
        raise RuntimeError("reco_sampled_plugin: the sampled evaluation batch holds no negative items")
    block_start = torch.cumsum(counts * (1 + n_draws), 0) - counts * (1 + n_draws)
    pos_start = torch.cumsum(counts, 0) - counts
    local = torch.arange(pos_u.shape[0]) - pos_start[pos_u]
    k = counts[pos_u]
    pos_rows = block_start[pos_u] + local
    if not bool((items[pos_rows] == pos_i).all()):
        raise RuntimeError("reco_sampled_plugin: positives are not where RecBole's sampled layout puts them")
    j = torch.arange(n_draws)
    neg_rows = (block_start[pos_u] + k + local).unsqueeze(1) + j.unsqueeze(0) * k.unsqueeze(1)
    return items[neg_rows], pos_rows, n_draws


def _grid_n(n: torch.Tensor, step: float, floor: torch.Tensor) -> torch.Tensor:
    """Round candidate counts to a geometric grid (relative step ``step``) so tables are shared."""
    if step <= 0:
        return n
    lg = math.log1p(step)
    out = torch.round(torch.exp(torch.round(torch.log(n) / lg) * lg))
    return torch.maximum(out, floor)


# full-sort batches are gathered and processed together once they hold this many scores (and at the end
# of the evaluation): RecBole's default eval_batch_size gives 2 users per batch on ml-100k, and a few dozen
# small torch calls per batch would cost more than RecBole's own evaluation. 2^24 float32 = 64 MiB.
_BUFFER_ELEMENTS = 1 << 24


class _Staging:
    """CPU full-sort batches copied, as they arrive, into numpy buffers that are reused across evaluations.

    Copying each batch while it is hot (a few slice assignments) lets RecBole free and reuse the batch's
    memory at once; holding 472 score tensors until the end of an ml-100k evaluation instead spreads them
    over fresh memory and costs more (measured in BENCHMARKS.md), and the copies need no check that the
    model did not write into an earlier batch's scores. Rows are users in arrival order; ``pu`` holds each
    positive's row within its batch until :meth:`take` adds the rows of the batches before it.
    """

    __slots__ = ("scores", "pu", "pi", "uid", "marks", "used", "npos", "nrows", "n_cols", "dtype", "uid_field", "has_uid")

    def __init__(self) -> None:
        self.scores = np.empty(0, np.float32)
        self.pu = np.empty(0, np.int64)
        self.pi = np.empty(0, np.int64)
        self.uid = np.empty(0, np.int64)
        self.marks: list[tuple[int, int]] = []  # (first row, end of the positives) of each batch
        self.used = self.npos = self.nrows = self.n_cols = 0
        self.dtype = None
        self.uid_field = None
        self.has_uid = True

    def open(self, scores: torch.Tensor, a: np.ndarray, uid_field: str) -> None:
        """Start gathering batches shaped and typed like ``scores`` (rows, items) (``a``: its numpy view)."""
        self.used = self.npos = self.nrows = 0
        self.marks = []
        self.n_cols, self.dtype, self.uid_field, self.has_uid = a.shape[1], scores.dtype, uid_field, True
        if self.scores.dtype != a.dtype:
            self.scores = np.empty(0, a.dtype)

    def add(self, scores: torch.Tensor, interaction, positive_u: torch.Tensor, positive_i: torch.Tensor) -> bool:
        """Copy one batch; False (nothing copied) when it does not fit the open shape, dtype or device."""
        if scores.dtype is not self.dtype:
            return False
        try:
            a = scores.numpy()  # CPU tensors only (RecBole evaluates under no_grad)
            u = positive_u.numpy()
            i = positive_i.numpy()
        except (TypeError, RuntimeError, AttributeError):  # another device, autograd, no positives
            return False
        if a.ndim != 2 or a.shape[1] != self.n_cols:
            return False
        b = a.shape[0]
        p, q, r = self.used, self.npos, self.nrows
        e, f = p + a.size, q + u.shape[0]
        if e > self.scores.shape[0] or f > self.pu.shape[0] or r + b > self.uid.shape[0]:
            self._grow(e, f, r + b)
        self.scores[p:e] = a.reshape(-1)
        self.pu[q:f] = u
        self.pi[q:f] = i
        self.marks.append((r, f))
        if self.has_uid:
            uid = interaction.interaction.get(self.uid_field)
            if uid is None:
                self.has_uid = False
            else:
                self.uid[r : r + b] = uid.numpy()
        self.used, self.npos, self.nrows = e, f, r + b
        return True

    def _grow(self, scores: int, positives: int, rows: int) -> None:
        def grown(old: np.ndarray, used: int, need: int) -> np.ndarray:
            if need <= old.shape[0]:
                return old
            new = np.empty(max(need, 2 * old.shape[0]), old.dtype)
            new[:used] = old[:used]
            return new

        self.scores = grown(self.scores, self.used, scores)
        self.pu = grown(self.pu, self.npos, positives)
        self.pi = grown(self.pi, self.npos, positives)
        self.uid = grown(self.uid, self.nrows, rows)

    def take(self):
        """The gathered batches as tensors: scores (rows, items) and uids (views of the buffers: read before
        the next :meth:`open`), the positives' global rows and items."""
        marks = np.array(self.marks, dtype=np.int64).reshape(-1, 2)
        ends = marks[:, 1]
        sizes = np.diff(ends, prepend=0)
        pu = self.pu[: self.npos] + np.repeat(marks[:, 0], sizes)  # rows of the batches before
        scores = torch.from_numpy(self.scores[: self.used]).view(self.nrows, self.n_cols)
        uid = torch.from_numpy(self.uid[: self.nrows]) if self.has_uid else None
        return scores, torch.from_numpy(pu), torch.from_numpy(self.pi[: self.npos]), uid


def _collect(collector, scores: torch.Tensor, interaction, positive_u, positive_i) -> None:
    """Per-positive ranks of one evaluation batch: full-sort batches are gathered (CPU: copied into a
    :class:`_Staging`; other devices: held by reference, RecBole scores each batch into a new tensor; see
    ``_BUFFER_ELEMENTS``) and processed by :func:`_flush`; sampled-mode batches (their own negatives) are
    processed at once."""
    settings = collector.__dict__.get("_rsp_settings_now") or _settings(collector.config)
    collector._rsp_settings_now = settings  # validated once per evaluation (reset by get_data_struct)
    if settings is None or positive_u is None:
        return
    if len(interaction) != scores.shape[0]:  # sampled modes: k_u (1 + N) rows per user
        _flush(collector)
        _collect_sampled(collector, settings, scores.detach().to("cpu"), interaction,
                         positive_u.detach().to("cpu", torch.int64), positive_i.detach().to("cpu", torch.int64))
        return
    # the first full-sort batch of an evaluation (or after a flush) opens the staging or the buffer; the
    # wrapped eval_batch_collect adds the next ones directly
    _flush(collector)
    a = None
    if _STAGE_ON_CPU and scores.device.type == "cpu" and not scores.requires_grad and scores.dim() == 2:
        try:
            a = scores.numpy()
        except TypeError:  # a dtype numpy lacks (bfloat16): held by reference
            a = None
    if a is not None:
        stage = collector.__dict__.get("_rsp_stage") or _Staging()
        collector._rsp_stage = stage
        stage.open(scores, a, collector.config["USER_ID_FIELD"])
        if stage.add(scores, interaction, positive_u, positive_i):
            collector._rsp_staging = stage
            if stage.used >= _BUFFER_ELEMENTS:
                _flush(collector)
            return
    collector._rsp_buffer = [(scores, scores._version, positive_u, positive_i, interaction)]
    collector._rsp_buffered = scores.numel()
    if collector._rsp_buffered >= _BUFFER_ELEMENTS:
        _flush(collector)


# CPU full-sort batches are copied into a _Staging (False: held by reference like other devices; tests)
_STAGE_ON_CPU = True


def _generator(collector, settings: _Settings) -> torch.Generator:
    if getattr(collector, "_rsp_generator", None) is None:
        collector._rsp_generator = torch.Generator().manual_seed(settings.seed)
    return collector._rsp_generator


def _new_table(collector, pos_u: torch.Tensor, pos_i: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    table = torch.zeros((pos_u.shape[0], _N_COLS), dtype=torch.float64)
    table[:, _USER] = (pos_u + getattr(collector, "_rsp_user_offset", 0)).to(torch.float64)
    table[:, _N_POS] = counts[pos_u].to(torch.float64)
    table[:, _ITEM] = pos_i.to(torch.float64)
    return table


def _store(collector, table: torch.Tensor, n_users: int) -> None:
    collector._rsp_user_offset = getattr(collector, "_rsp_user_offset", 0) + n_users
    collector.__dict__.setdefault("_rsp_tables", []).append(table)  # concatenated once, in get_data_struct


def _unbuffer(collector, buf: list):
    """Stack the buffered full-sort batches (users in arrival order): CPU scores, the positives' rows and
    items, and the users' ids (None when the batches carry none)."""
    scs, versions, pus, pis, inters = zip(*buf)  # one transpose of the buffer, then whole-list calls
    if [sc._version for sc in scs] != list(versions):
        raise RuntimeError(
            "reco_sampled_plugin: the scores of an earlier evaluation batch were modified in place after RecBole "
            "collected them (a model that reuses its score buffer across batches?); the plugin reads them when "
            "the evaluation ends. Return a new tensor from full_sort_predict."
        )
    uid_field = collector.config["USER_ID_FIELD"]
    uids = [inter.interaction.get(uid_field) for inter in inters]
    if len(buf) == 1:
        scores, pos_u, pos_i = scs[0], pus[0], pis[0]
    else:
        rows = torch.tensor([sc.shape[0] for sc in scs])
        lens = torch.tensor([pu.shape[0] for pu in pus])
        scores = torch.cat(scs)
        pos_u = torch.cat(pus).to("cpu", torch.int64) + torch.repeat_interleave(torch.cumsum(rows, 0) - rows, lens)
        pos_i = torch.cat(pis)
    uid = None if any(u is None for u in uids) else (uids[0] if len(uids) == 1 else torch.cat(uids)).cpu()
    return scores.detach().to("cpu"), pos_u.to("cpu", torch.int64), pos_i.to("cpu", torch.int64), uid


def _flush(collector) -> None:
    """Process the gathered full-sort batches (staged copies or buffered references) as one batch."""
    stage = collector.__dict__.pop("_rsp_staging", None)
    buf = collector.__dict__.pop("_rsp_buffer", None)
    collector._rsp_buffered = 0
    if stage is not None and stage.nrows:
        _process_full(collector, *stage.take())
        stage.nrows = 0
    elif buf:
        data = _unbuffer(collector, buf)
        del buf
        _process_full(collector, *data)


def _process_full(collector, scores: torch.Tensor, pos_u: torch.Tensor, pos_i: torch.Tensor, uids) -> None:
    """Per-positive table of full-sort users (CPU scores, global rows of the positives, their items, ids)."""
    settings = collector._rsp_settings_now
    b = scores.shape[0]
    counts = torch.bincount(pos_u, minlength=b)
    s_pos = scores[pos_u, pos_i]
    if bool(torch.isnan(s_pos).any()):
        raise ValueError(f"reco_sampled_plugin: the model scored {int(torch.isnan(s_pos).sum())} held-out item(s) NaN; "
                         "their ranks are undefined")
    table = _new_table(collector, pos_u, pos_i, counts)
    if uids is not None:
        table[:, _UID] = uids[pos_u].to(torch.float64)
    counted = settings.full_ranks or pos_u.shape[0] <= _COUNT_MAX_MEAN_POSITIVES * b
    if counted:  # exact ranks of every positive (and sampled ranks drawn from them)
        ge, gt, n_full = _full_counts(scores, pos_u, s_pos, settings.ties)
        other_ge, other_gt = _other_positive_counts(pos_u, s_pos, counts)
        gt = ge if gt is None else gt
        table[:, _R_FULL] = _ranks_from_counts(ge, gt, settings.ties)
        table[:, _R_IRR] = _ranks_from_counts(ge - other_ge, gt - other_gt, settings.ties)
    else:
        n_full = _full_counts(scores, pos_u[:0], s_pos[:0], "pessimistic")[2]  # candidate counts only
        if settings.needs_exact or settings.side_by_side:
            table[:, _R_FULL], table[:, _R_IRR] = _topk_full_mode(scores, pos_u, s_pos, counts, settings)
    n_irr = (n_full - counts + 1)[pos_u]  # irrelevant candidates + the positive itself
    table[:, _N_IRR] = n_irr.to(torch.float64)
    if settings.m is not None:
        if counted and settings.replacement:
            table[:, _R_SAMPLED] = _binomial_sampled(ge - 1 - other_ge, gt - other_gt, n_irr - 1, int(settings.m),
                                                     settings.ties, _generator(collector, settings))
        else:
            table[:, _R_SAMPLED] = _simulate(scores, pos_u, pos_i, s_pos, settings, _generator(collector, settings))
        table[:, _M] = float(settings.m)
    _store(collector, table, b)


def _collect_sampled(collector, settings: _Settings, scores, interaction, pos_u, pos_i) -> None:
    """uniN / popN batches: each positive's sampled rank against its own N negatives."""
    b = scores.shape[0]
    counts = torch.bincount(pos_u, minlength=b)
    s_pos = scores[pos_u, pos_i]
    table = _new_table(collector, pos_u, pos_i, counts)
    neg_items, pos_rows, n_draws = _neg_layout(interaction, collector.config["ITEM_ID_FIELD"], pos_u, pos_i, counts)
    s_neg = scores[pos_u.unsqueeze(1), neg_items]
    table[:, _R_SAMPLED] = _sampled_from_scores(s_neg, s_pos, settings.ties, _generator(collector, settings))
    table[:, _M] = float(n_draws)
    sampler = getattr(getattr(collector, "_rsp_eval_data", None), "_sampler", None)
    used = getattr(sampler, "used_ids", None)
    if used is None:
        raise RuntimeError(
            "reco_sampled_plugin: sampled evaluation needs the evaluation dataloader's sampler (RecBole's "
            "Trainer.evaluate passes it); evaluate through a RecBole Trainer"
        )
    uids = interaction[collector.config["USER_ID_FIELD"]].cpu()[pos_rows].numpy()
    table[:, _UID] = torch.as_tensor(uids, dtype=torch.float64)
    n_used = torch.as_tensor(np.fromiter((len(used[u]) for u in uids), dtype=np.int64, count=len(uids)))
    table[:, _N_IRR] = (scores.shape[1] - n_used).to(torch.float64)  # item_num (padding included) minus used
    _store(collector, table, b)


# ---------------------------------------------------------------------------------------- metrics
def _recbole():
    from recbole.evaluator.base_metric import AbstractMetric
    from recbole.utils import EvaluatorType

    return AbstractMetric, EvaluatorType


class _Metric:
    """Shared implementation of the plugin's RecBole metrics (mixed into RecBole's AbstractMetric)."""

    family: str = ""
    kind: str = ""  # core kind ("recall", ...) or RecBole list metric ("Recall", ...) for the exact family
    metric_need = [PLUGIN_KEY]
    smaller = False

    def __init__(self, config) -> None:
        super().__init__(config)  # type: ignore[call-arg]
        self.config = config
        self.settings = _settings(config)
        if self.settings is None:  # constructed outside a config that names it
            raise ValueError("metrics: the plugin metric is not listed in the config's metrics")
        self.name = type(self).__name__.lower()

    # keys and values -------------------------------------------------------------------------
    def _cutoffs(self) -> list[int | None]:
        return [None] if self.kind == "auc" else list(self.settings.topk)

    def _key(self, k: int | None) -> str:
        return self.name if k is None else f"{self.name}@{k}"

    def _round(self, value: float) -> float:
        return round(float(value), self.settings.decimal_place)

    def calculate_metric(self, dataobject) -> dict:
        table = dataobject.get(PLUGIN_KEY)
        if table.shape[0] == 0:
            raise ValueError(f"{self.name}: no held-out items were evaluated")
        users, weights = _users_and_weights(table, self.settings.weighting)
        out: dict[str, float] = {}
        for k in self._cutoffs():
            out.update(self._values(table, users, weights, k))
        return out

    def _values(self, table, users, weights, k) -> dict:  # pragma: no cover - overridden
        raise NotImplementedError


def _table_cache(table: torch.Tensor) -> dict:
    """Per-evaluation values shared by the plugin's metrics, cached on the table RecBole hands to each."""
    return table.__dict__.setdefault("_rsp_cache", {})


def _users_and_weights(table: torch.Tensor, weighting: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Each positive's user row and weight (``user``: 1/|T_u|, each user counts once; ``item``: 1)."""
    cache = _table_cache(table)
    key = ("weights", weighting)
    if key not in cache:
        users = table[:, _USER].to(torch.int64)
        weights = 1.0 / table[:, _N_POS] if weighting == "user" else torch.ones(table.shape[0], dtype=torch.float64)
        cache[key] = (users, weights)
    return cache[key]


def _exact_ranks(table: torch.Tensor) -> tuple[torch.Tensor, bool] | None:
    """The exact ranks among irrelevant items and whether all are known (none beyond the computed top), or
    None when the table has none (sampled modes)."""
    cache = _table_cache(table)
    if "exact" not in cache:
        r_irr = table[:, _R_IRR]
        cache["exact"] = (r_irr, bool((r_irr > 0).all())) if bool((r_irr != 0).all()) else None
    return cache["exact"]


def _weighted_mean(values: torch.Tensor, weights: torch.Tensor) -> float:
    return float(values @ weights) / float(weights.sum())


def _capped_metric(spec, ranks: torch.Tensor, n: torch.Tensor, all_known: bool | None = None) -> torch.Tensor:
    """M(r) of the table's ranks (valid by construction: no re-validation), where ranks beyond the computed
    top (-1) score 0 (cut-off metrics only reach here). ``all_known``: whether every rank is > 0, if known."""
    if all_known is None:
        all_known = bool((ranks > 0).all())
    if all_known:
        return _metric_from_float_ranks(spec, ranks, n)
    known = ranks > 0
    out = torch.zeros_like(ranks)
    if bool(known.any()):
        out[known] = _metric_from_float_ranks(spec, ranks[known], n[known])
    return out


class _EstimatedMetric(_Metric):
    """A full-catalogue metric estimated from sampled ranks (corrections, mappings, rank distributions)."""

    def _method_kwargs(self) -> dict:
        s = self.settings
        if self.family == "corrected":
            if s.prior == "mle":
                return {"method": "bv_mle", "gamma": s.gamma}
            return {"method": s.correction, "gamma": s.gamma, "prior": s.prior}
        if self.family == "mapped":
            return {"method": s.mapping, "a": s.mapping_a}
        return {"method": s.rank_dist, "n_bootstrap": s.bootstrap, "seed": s.seed}

    def _values(self, table, users, weights, k) -> dict:
        s = self.settings
        spec = parse_metric(self.kind if k is None else f"{self.kind}@{k}")
        key = self._key(k)
        r, m1, w, hist = _sampled_inputs(table, weights, s, spec.k or 2)
        law = "binomial" if s.replacement else "hypergeometric"
        result = estimate(spec, hist, sampling=law, **self._method_kwargs())
        out = {key: self._round(result.value)}
        if s.stderr:
            out[f"{key}_stderr"] = self._round(result.stderr)
        if s.side_by_side:
            out[f"{key}_sampled"] = self._round(_weighted_mean(_metric_from_float_ranks(spec, r, m1), w))
            exact = _exact_ranks(table)
            if exact is not None:
                r_irr, all_known = exact
                if spec.k is None and not all_known:  # pragma: no cover - full ranks are forced for AUC
                    raise RuntimeError("reco_sampled_plugin: exact ranks beyond the top for a metric without cut-off")
                values = _capped_metric(spec, r_irr, table[:, _N_IRR], all_known)
                out[f"{key}_exact"] = self._round(_weighted_mean(values, weights))
        return out


def _sampled_inputs(table: torch.Tensor, weights: torch.Tensor, s: _Settings, k_floor: int):
    """Sampled ranks, m + 1, weights and their rank histogram (candidate counts on the ``rsp_n_grid`` grid,
    at least max(m + 1, K)) of the positives that have a sampled rank; computed once per evaluation table
    and shared by every estimated metric (cached on the table, which RecBole hands to each metric)."""
    cache = _table_cache(table)
    key = (s.weighting, s.n_grid, s.replacement, k_floor)
    if key not in cache:
        sampled = table[:, _R_SAMPLED]
        have = sampled > 0
        if bool(have.all()):  # full mode with rsp_m, or a sampled mode: every positive
            r, n, m, w = sampled, table[:, _N_IRR], table[:, _M], weights
        else:
            r, n, m, w = sampled[have], table[have, _N_IRR], table[have, _M], weights[have]
        m1 = m + 1
        n_est = _grid_n(n, s.n_grid, torch.clamp(m1, min=float(k_floor)))
        if not s.replacement:
            n_est = torch.maximum(n_est, m1)
        if r.shape[0]:  # whole numbers in range by construction: no re-validation
            hist = _bincount_histogram(r.to(torch.int64), n_est.to(torch.int64), m.to(torch.int64), w)
        else:
            hist = sampled_rank_histogram(r, n_est, m, weights=w)  # the empty histogram
        cache[key] = (r, m1, w, hist)
    return cache[key]


class _ExactMetric(_Metric):
    """RecBole's list metric (same definition and averaging over users) from the plugin's exact ranks."""

    def _values(self, table, users, weights, k) -> dict:
        r = table[:, _R_FULL]
        n_users = int(users.max()) + 1
        hit = ((r > 0) & (r <= k)).to(torch.float64)
        n_pos = torch.zeros(n_users, dtype=torch.float64).scatter_reduce_(0, users, table[:, _N_POS], "amax", include_self=False)
        present = torch.zeros(n_users, dtype=torch.bool)
        present[users] = True
        hits_u = torch.zeros(n_users, dtype=torch.float64).index_add_(0, users, hit)
        kind = self.kind
        if kind == "Recall":
            per_user = hits_u / n_pos.clamp(min=1)
        elif kind == "Hit":
            per_user = (hits_u > 0).to(torch.float64)
        elif kind == "Precision":
            per_user = hits_u / k
        elif kind == "NDCG":
            dcg = torch.where(hit > 0, 1.0 / torch.log2(r.clamp(min=1) + 1.0), torch.zeros_like(r))
            dcg_u = torch.zeros(n_users, dtype=torch.float64).index_add_(0, users, dcg)
            ideal_len = torch.clamp(n_pos, max=k).to(torch.int64)
            ideal = torch.cumsum(1.0 / torch.log2(torch.arange(2, k + 2, dtype=torch.float64)), 0)
            per_user = dcg_u / ideal[(ideal_len - 1).clamp(min=0)]
        elif kind == "MRR":
            rr = torch.where(hit > 0, 1.0 / r.clamp(min=1), torch.zeros_like(r))
            per_user = torch.zeros(n_users, dtype=torch.float64).scatter_reduce_(0, users, rr, "amax", include_self=True)
        elif kind == "MAP":
            # AP@k = sum over hits of (hits up to and including it) / rank, divided by min(|T_u|, k)
            order = torch.argsort(users * (k + 2) + torch.where(hit > 0, r, torch.full_like(r, k + 1)))
            u_sorted, h_sorted, r_sorted = users[order], hit[order], r[order]
            cum = torch.cumsum(h_sorted, 0)
            start = torch.zeros(n_users, dtype=torch.float64).scatter_reduce_(0, u_sorted, cum - h_sorted, "amin", include_self=False)
            within = cum - start[u_sorted]
            terms = torch.where(h_sorted > 0, within / r_sorted.clamp(min=1), torch.zeros_like(r_sorted))
            ap_u = torch.zeros(n_users, dtype=torch.float64).index_add_(0, u_sorted, terms)
            per_user = ap_u / torch.clamp(n_pos, max=k).clamp(min=1)
        else:  # pragma: no cover - the class table lists the kinds
            raise ValueError(f"unknown exact metric {kind!r}")
        return {self._key(k): self._round(float(per_user[present].mean()))}


def _build_classes() -> dict[str, type]:
    AbstractMetric, EvaluatorType = _recbole()
    classes: dict[str, type] = {}
    for family, (prefix, kinds) in FAMILIES.items():
        base = _ExactMetric if family == "exact" else _EstimatedMetric
        for kind in kinds:
            name = prefix + kind
            core_kind = kind if family == "exact" else _ESTIMATED_KINDS[kind]
            doc = (
                f"RecBole's {kind}@k recomputed from the plugin's exact ranks (full mode)."
                if family == "exact"
                else f"{kind} estimated from sampled ranks by the {family} estimators (see docs/recbole.md)."
            )
            cls = type(
                name,
                (base, AbstractMetric),
                {
                    "family": family,
                    "kind": core_kind,
                    "metric_type": EvaluatorType.RANKING,
                    "metric_need": [PLUGIN_KEY],
                    "smaller": False,
                    "__doc__": doc,
                    "__module__": __name__,
                },
            )
            classes[name.lower()] = cls
    return classes


_METRIC_CLASSES: dict[str, type] = _build_classes()


def positive_table(dataobject) -> dict[str, torch.Tensor]:
    """The per-positive table a RecBole ``DataStruct`` holds for the plugin, as named columns.

    ``rank_full`` / ``rank_irrelevant``: exact rank among all candidates / among the irrelevant ones
    (full mode; 0 = not available, -1 = beyond the computed top), ``n_candidates``: irrelevant items + 1,
    ``sampled_rank`` / ``m``: sampled rank and sample size (0 = none), ``n_positives``: |T_u|, ``user``:
    row of the user in the evaluation, ``uid`` / ``item``: RecBole's internal ids.
    """
    table = dataobject.get(PLUGIN_KEY)
    return {name: table[:, i] for i, name in enumerate(COLUMNS)}


def metric_classes() -> dict[str, type]:
    """The plugin's RecBole metric classes by lower-case name (as RecBole registers them)."""
    return dict(_METRIC_CLASSES)


# ---------------------------------------------------------------------------------- registration
_registered = False


def _wrap_config() -> None:
    from recbole.config import configurator

    cls = configurator.Config
    if getattr(cls.__init__, "_reco_sampled", False):
        return
    original = cls.__init__

    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        _settings(self)  # validate the plugin keys before any data is loaded or model trained

    __init__._reco_sampled = True  # type: ignore[attr-defined]
    __init__.__wrapped__ = original  # type: ignore[attr-defined]
    __init__.__doc__ = original.__doc__
    cls.__init__ = __init__


def _wrap_collector() -> None:
    from recbole.evaluator.collector import Collector

    if getattr(Collector.eval_batch_collect, "_reco_sampled", False):
        return
    collect, get_struct = Collector.eval_batch_collect, Collector.get_data_struct

    def eval_batch_collect(self, scores_tensor, interaction, positive_u, positive_i):
        collect(self, scores_tensor, interaction, positive_u, positive_i)
        stage = self.__dict__.get("_rsp_staging")
        if stage is not None and len(interaction) == scores_tensor.shape[0]:  # full mode, staging: copy only
            if stage.add(scores_tensor, interaction, positive_u, positive_i):
                if stage.used >= _BUFFER_ELEMENTS:
                    _flush(self)
                return
        buf = self.__dict__.get("_rsp_buffer")
        if buf is not None and len(interaction) == scores_tensor.shape[0]:  # full mode, buffering: append only
            buf.append((scores_tensor, scores_tensor._version, positive_u, positive_i, interaction))
            self._rsp_buffered += scores_tensor.numel()
            if self._rsp_buffered >= _BUFFER_ELEMENTS:
                _flush(self)
        elif self.register.need(PLUGIN_KEY):
            _collect(self, scores_tensor, interaction, positive_u, positive_i)

    def get_data_struct(self):
        if self.__dict__.get("_rsp_buffer") or self.__dict__.get("_rsp_staging"):
            _flush(self)
        tables = self.__dict__.pop("_rsp_tables", None)
        if tables:
            self.data_struct.set(PLUGIN_KEY, torch.cat(tables))
        struct = get_struct(self)
        if PLUGIN_KEY in self.data_struct:
            del self.data_struct[PLUGIN_KEY]
        self._rsp_user_offset = 0
        self._rsp_generator = None
        self._rsp_settings_now = None
        return struct

    for new, old in ((eval_batch_collect, collect), (get_data_struct, get_struct)):
        new._reco_sampled = True  # type: ignore[attr-defined]
        new.__wrapped__ = old  # type: ignore[attr-defined]
        new.__doc__ = old.__doc__
    Collector.eval_batch_collect = eval_batch_collect
    Collector.get_data_struct = get_data_struct


def _plugin_keys(result: dict, settings: _Settings) -> list[str]:
    prefixes = tuple(settings.metrics)
    return [k for k in result if isinstance(k, str) and k.split("@")[0] in prefixes]


def _wrap_trainer() -> None:
    from recbole.trainer.trainer import Trainer

    if getattr(Trainer.evaluate, "_reco_sampled", False):
        return
    original = Trainer.evaluate

    def evaluate(self, eval_data, *args, **kwargs):
        collector = getattr(self, "eval_collector", None)
        if collector is not None:
            collector._rsp_eval_data = eval_data
            collector._rsp_user_offset = 0
            collector._rsp_generator = None
            collector._rsp_settings_now = None
            collector.__dict__.pop("_rsp_tables", None)
            collector.__dict__.pop("_rsp_buffer", None)
            collector.__dict__.pop("_rsp_staging", None)
            collector._rsp_buffered = 0
        result = original(self, eval_data, *args, **kwargs)
        settings = _settings(self.config) if result else None
        writer = getattr(self, "tensorboard", None)
        if settings is not None and settings.tensorboard and writer is not None:
            phase = getattr(getattr(eval_data, "_sampler", None), "phase", None) or "eval"
            steps = self.__dict__.setdefault("_rsp_tb_steps", {})
            step = steps.get(phase, 0)
            for key in _plugin_keys(result, settings):
                writer.add_scalar(f"reco_sampled/{phase}/{key}", float(result[key]), step)
            writer.flush()
            steps[phase] = step + 1
        return result

    evaluate._reco_sampled = True  # type: ignore[attr-defined]
    evaluate.__wrapped__ = original  # type: ignore[attr-defined]
    evaluate.__doc__ = original.__doc__
    Trainer.evaluate = evaluate


def register(compat: bool | None = None) -> dict[str, type]:
    """Register the plugin's metrics in RecBole's registries, in place (idempotent; call before ``Config``).

    Adds every class of :func:`metric_classes` to ``metrics_dict``, ``metric_information``,
    ``metric_types`` (and ``smaller_metrics`` for none: all are bigger-is-better), wraps
    ``Collector.eval_batch_collect`` / ``get_data_struct`` (per-positive ranks, only when a plugin
    metric is configured), ``Trainer.evaluate`` (TensorBoard) and ``Config.__init__`` (validation).

    Args:
        compat: True applies the compatibility layer, False leaves it off, None follows the environment.
    """
    global _registered
    _recbole_compat.apply(enabled=compat)
    from recbole.evaluator import register as reg

    for name, cls in _METRIC_CLASSES.items():
        reg.metrics_dict[name] = cls
        reg.metric_information[name] = cls.metric_need
        reg.metric_types[name] = cls.metric_type
        if cls.smaller and name not in reg.smaller_metrics:
            reg.smaller_metrics.append(name)
    _wrap_config()
    _wrap_collector()
    _wrap_trainer()
    if not _registered:
        logger.debug("reco_sampled_plugin: registered %d RecBole metrics", len(_METRIC_CLASSES))
    _registered = True
    return metric_classes()


def registered() -> bool:
    """True once :func:`register` has run."""
    return _registered


def run_recbole(
    model: str | None = None,
    dataset: str | None = None,
    config_file_list: list[str] | None = None,
    config_dict: dict | None = None,
    saved: bool = True,
    compat: bool | None = None,
) -> dict:
    """Register the plugin, then run ``recbole.quick_start.run_recbole`` (same arguments and result).

    Args:
        compat: True/False force the compatibility layer on/off; None follows ``RECO_SAMPLED_RECBOLE_COMPAT``.
    """
    register(compat=compat)
    from recbole.quick_start import run_recbole as _run

    return _run(model=model, dataset=dataset, config_file_list=config_file_list, config_dict=config_dict, saved=saved)


register()
