"""RecBole adapter, configuration: the plugin's config keys, metric names and their validation.

Every key starts with ``rsp_`` (:data:`CONFIG_DEFAULTS`); :func:`validate_config` checks them together with
RecBole's own ``metrics``, ``eval_args`` and ``topk`` and returns the frozen settings every other part of the
adapter reads, raising a ValueError that names the offending key before any data is loaded.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from reco_sampled_plugin import registry
from reco_sampled_plugin._checks import check_int
from reco_sampled_plugin._options import check_bool, check_float, check_names
from reco_sampled_plugin.design import SHARE_CHOICES, ExactShare, SamplingDesign, as_design, design_spec, parse_design
from reco_sampled_plugin.ranking import DETERMINISTIC_TIES

#: Every plugin config key with its default (``None``: see docs/recbole.md).
CONFIG_DEFAULTS: dict[str, Any] = {
    "rsp_m": None,  # simulated sample size m in full mode (uniN: must equal N if given)
    "rsp_adaptive_max": None,  # adaptive sampling from rsp_m (uniN: N) up to this many samples (estimators that take it)
    "rsp_adaptive_top": 1,  # adaptive: a positive draws more while its sampled rank is at most this (1: while first)
    "rsp_exact_at_cap": False,  # full mode, adaptive: rank the positives still within the top at the cap exactly
    "rsp_replacement": True,  # simulated draws with replacement (binomial law) or without (hypergeometric)
    "rsp_seed": None,  # seed of the simulated draws (default: RecBole's `seed`)
    # the estimator each family of metrics runs, one per family (registry.recbole_choices): Corrected* and RankDist*
    # the default estimator, auto (one name serves both), Mapped* a mapping of Li et al. (bound)
    "rsp_estimators": (registry.DEFAULT_ESTIMATOR, "bound"),
    # {estimator: {option: value}} (the registry's options: {bv: {gamma: 0.2}, mes: {n_bootstrap: 16}})
    "rsp_estimator_options": {},
    "rsp_weighting": "user",  # user: each user counts once (weight 1/|T_u|, as RecBole averages); item
    "rsp_ties": "pessimistic",  # pessimistic, optimistic, average
    "rsp_n_grid": 0.01,  # relative grid the candidate counts n are rounded to (0: exact per-user n)
    "rsp_side_by_side": True,  # also report <name>_sampled (and <name>_exact in full mode)
    "rsp_stderr": False,  # also report <name>_stderr: the standard error, sampling noise only (opt-in)
    "rsp_interval": True,  # report <name>_lo and <name>_hi, the 95% interval (widened where the top is unresolved)
    "rsp_full_ranks": False,  # full mode: exact ranks of every positive even with > 64 positives per user on average
    "rsp_tensorboard": True,  # write the plugin's values to RecBole's TensorBoard writer
    "rsp_check_finite": True,  # NaN / +inf anywhere in the scores is an error; "positives" or false: held-out items only
    "rsp_exact_share": None,  # uniN / popN: a keyed share in (0, 1] of the positives also ranked exactly (full sort)
    "rsp_exact_share_choice": "uniform",  # uniform: each positive with that probability; active: the model's spread
    # the whole design in one key (a SamplingDesign, a planner result, or a spec string such as "100:3200"): sets
    # the design keys below, which are then not given (:func:`_planned_design`)
    "rsp_design": None,
}

#: the keys ``rsp_design`` sets (a design given in both places is refused)
DESIGN_KEYS = ("rsp_m", "rsp_adaptive_max", "rsp_adaptive_top", "rsp_exact_at_cap", "rsp_replacement",
               "rsp_exact_share", "rsp_exact_share_choice")

_TIES = DETERMINISTIC_TIES

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()


def log_once(message: str, level: int = logging.WARNING) -> None:
    """Log ``message`` the first time this process meets it (RecBole's logger is the root's: it shows there)."""
    if message not in _LOGGED:
        _LOGGED.add(message)
        logger.log(level, message)


# RecBole's list metrics -> the plugin's leave-one-out kind of the same name
_LIST_TWINS = {"recall": "Recall", "hit": "Hit", "ndcg": "NDCG", "mrr": "MRR", "precision": "Precision", "map": "AP"}


def class_name(name: str) -> str:
    """The class name of a lower-case plugin metric name (``correctedrecall`` -> ``CorrectedRecall``)."""
    prefix, kinds = FAMILIES[_family_of(name)]
    return next(prefix + k for k in kinds if (prefix + k).lower() == name.lower())


def note_definitions(config: Any, settings: "_Settings") -> None:
    """The note a run needs from its config, logged once (when the metrics are built, after RecBole set its logger
    up): a ``Corrected*`` metric with ``none`` in ``rsp_estimators`` reports the uncorrected sampled metric."""
    names = settings.metrics
    corrected = [class_name(n) for n in names if _family_of(n) == "corrected"]
    if corrected and settings.methods["corrected"].name == "none":
        log_once(f"reco_sampled_plugin: rsp_estimators lists none, so {', '.join(corrected)} report the plain sampled "
                 "metric, uncorrected (each <name>@k/none equals its <name>@k/sampled; not an estimate of the "
                 "full-catalogue metric; docs/recbole.md)")


def note_leave_one_out(config: Any, settings: "_Settings") -> None:
    """Logged once, at the first evaluation where some user holds out several items (where the two differ): the
    estimated metrics (and their ``/exact``) are leave-one-out metrics, RecBole's of the same name list metrics."""
    names = settings.metrics
    recbole = {m.lower() for m in config_metrics(config)}
    for n in names:
        family = _family_of(n)
        if family == "exact":
            continue
        plugin = class_name(n)
        kind = plugin[len(FAMILIES[family][0]):]
        for r in sorted(r for r in recbole if _LIST_TWINS.get(r) == kind):
            log_once(f"reco_sampled_plugin: {plugin}@k (and its /exact) is the leave-one-out metric: each held-out "
                     f"item ranked alone against the non-relevant items, then averaged per user; RecBole's {r}@k is "
                     "the list metric over all of a user's held-out items in one list. They differ where users hold "
                     f"out several items (Exact{'MAP' if r == 'map' else kind} recomputes RecBole's; docs/recbole.md)",
                     logging.INFO)

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

#: family -> (class name prefix, metric kinds); the estimators of each: ``registry.recbole_choices(family)``
FAMILIES: dict[str, tuple[str, tuple[str, ...]]] = {
    "corrected": ("Corrected", tuple(_ESTIMATED_KINDS)),
    "mapped": ("Mapped", tuple(_ESTIMATED_KINDS)),
    "rankdist": ("RankDist", tuple(_ESTIMATED_KINDS)),
    "exact": ("Exact", _EXACT_KINDS),
}

#: the families whose metrics are estimated from sampled ranks, and their class prefixes
_ESTIMATED_FAMILIES = ("corrected", "mapped", "rankdist")
_PREFIX = {f: FAMILIES[f][0] for f in _ESTIMATED_FAMILIES}

#: lower-case metric name -> family (as RecBole registers the classes)
METRIC_FAMILIES: dict[str, str] = {
    (prefix + kind).lower(): family for family, (prefix, kinds) in FAMILIES.items() for kind in kinds
}


# ------------------------------------------------------------------------------------ configuration
@dataclass(frozen=True)
class _Settings:
    """The validated plugin settings. ``design`` is the one sampling design the rsp_* keys describe (rsp_m or the
    uniN/popN mode's N, rsp_replacement, rsp_adaptive_max: :func:`_sampling_design`); ``m``, ``replacement`` and
    ``adaptive_max`` are its parts as the keys gave them (``m`` None in a sampled mode without rsp_m).
    ``estimators``: ``rsp_estimators`` as listed; ``methods``: the method object each estimated family runs
    (``corrected``, ``mapped``, ``rankdist``: :func:`_family_methods`), options and the adapter's defaults in;
    ``options``: ``rsp_estimator_options`` as given."""

    metrics: tuple[str, ...]  # lower-case plugin metric names in the config
    modes: dict  # phase -> RecBole eval mode string
    m: int | None
    replacement: bool
    seed: int
    estimators: tuple[str, ...]
    methods: dict[str, registry.Method]
    options: dict[str, dict[str, Any]]  # rsp_estimator_options as given (lists as tuples), by lower-case name
    weighting: str
    ties: str
    n_grid: float
    side_by_side: bool
    stderr: bool
    interval: bool
    full_ranks: bool
    tensorboard: bool
    topk: tuple[int, ...]
    decimal_place: int
    adaptive_max: int | None = None
    check_finite: bool | str = True  # True, False or "positives" (False and "positives": held-out items' scores only)
    design: SamplingDesign | None = None  # None: full mode without rsp_m, or sampled modes of different N
    exact_share: ExactShare | None = None  # rsp_exact_share (uniN / popN): in ``design`` too (uniN)
    planned: SamplingDesign | None = None  # rsp_design as given (popN: its weights, checked against the sampler's)

    @property
    def needs_exact(self) -> bool:
        return any(_family_of(name) == "exact" for name in self.metrics)


def _family_of(name: str) -> str:
    return METRIC_FAMILIES[name.lower()]


def _get(config: Any, key: str) -> Any:
    value = config[key]
    return CONFIG_DEFAULTS[key] if value is None else value


def _config_keys(config: Any) -> list[str]:
    final = getattr(config, "final_config_dict", None)
    keys = final.keys() if isinstance(final, dict) else (config.keys() if hasattr(config, "keys") else [])
    return [k for k in keys if isinstance(k, str) and k.startswith("rsp_")]


def _modes(config: Any) -> dict:
    eval_args = config["eval_args"] or {}
    if not hasattr(eval_args, "get"):
        raise ValueError(f"eval_args: expected a mapping such as {{'mode': 'full'}}, got {eval_args!r}")
    mode = eval_args.get("mode", "full")
    if isinstance(mode, str):
        return {"valid": mode, "test": mode}
    if not hasattr(mode, "get"):
        raise ValueError(f"eval_args.mode: expected a mode such as 'full' or 'uni100', or {{valid: ..., test: ...}}, "
                         f"got {mode!r}")
    return {"valid": mode.get("valid", "full"), "test": mode.get("test", "full")}


def _sample_num(mode: str) -> int | None:
    if mode[:3] in ("uni", "pop") and mode[3:].isdigit():
        return int(mode[3:])
    return None


def _sampled_size(mode: str) -> int:
    """N of a ``uniN`` / ``popN`` mode (:func:`validate_config` refuses every other mode but ``full`` first)."""
    n = _sample_num(mode)
    assert n is not None  # refused before (eval_args.mode: unsupported mode)
    return n


def _as_int(value: Any, key: str, minimum: int) -> int:
    """An integer key (the package's one integer check: not a bool, a float or a str)."""
    try:
        return check_int(value, key, minimum)
    except ValueError:
        raise ValueError(f"{key}: expected an integer >= {minimum}, got {value!r}") from None


def _choice(config: Any, key: str, choices: tuple[str, ...], what: str) -> str:
    """The lower-cased value of a key that names one of ``choices``."""
    value = str(_get(config, key)).lower()
    if value not in choices:
        raise ValueError(f"{key}: unknown {what} {value!r}; use one of {choices}")
    return value


def _kind(name: str) -> str:
    """The core metric kind of an estimated plugin metric name (``correctedauc`` -> ``auc``)."""
    prefix, kinds = FAMILIES[_family_of(name)]
    return _ESTIMATED_KINDS[next(k for k in kinds if (prefix + k).lower() == name.lower())]


def popularity_design(n_draws: int) -> SamplingDesign:
    """The design of RecBole's ``popN`` for the registry's checks at config time (``Estimator.supports`` reads whether
    a design draws by popularity; the weights come with the data: ``_recbole_popularity.sampler_weights``)."""
    import torch

    return SamplingDesign.trusted(n_draws, popularity=torch.ones(1, dtype=torch.float64))


def _as_bool(value: Any, key: str) -> bool:
    """A boolean key (the package's one bool check: ``"false"``, 0 and 1 are refused)."""
    try:
        return check_bool(value, key)
    except ValueError:
        raise ValueError(f"{key}: expected true or false, got {value!r}") from None


def _as_float(value: Any, key: str, what: str) -> float:
    """A number key (the package's one float check: ``true`` and ``"0.5"`` are refused, not read as 1.0 or 0.5)."""
    try:
        return check_float(value, key)
    except ValueError:
        raise ValueError(f"{key}: expected {what}, got {value!r}") from None


#: the adapter's defaults beside the registry's: ``beta``'s shape a = 1 (eq. 18); the RankDist* fits' bootstrap
#: replicates (the interval and standard error; 0 where neither is reported: one fit, the same value) and seed
#: (``rsp_seed``, else RecBole's ``seed``) are set in :func:`_family_methods`
_ADAPTER_DEFAULTS: dict[str, dict[str, Any]] = {"beta": {"a": 1.0}}
_RANKDIST_BOOTSTRAP = 8


def _estimator_names(config: Any) -> tuple[str, ...]:
    """``rsp_estimators``: registered names (one string alone is one), lower-cased, each listed once."""
    names = tuple(str(n).lower() for n in check_names(_get(config, "rsp_estimators"), "rsp_estimators",
                                                       "estimator names such as 'auto' or 'bv'"))
    known = registry.names()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"rsp_estimators: unknown estimator {unknown[0]!r}; use some of {known}")
    twice = [n for i, n in enumerate(names) if n in names[:i]]
    if twice:
        raise ValueError(f"rsp_estimators: {twice[0]!r} is listed twice")
    return names


def _option_value(value: Any) -> Any:
    """A YAML value as the registry's options take it: a list is a tuple (``[beta, 2]`` is the prior
    ``("beta", 2)``; a list of numbers a vector prior), recursively."""
    return tuple(_option_value(v) for v in value) if isinstance(value, (list, tuple)) else value


def _estimator_options(config: Any, names: tuple[str, ...]) -> dict[str, dict[str, Any]]:
    """``rsp_estimator_options``: {estimator listed in rsp_estimators: {option: value}} (validated by the method
    objects, :func:`_family_methods`)."""
    raw = _get(config, "rsp_estimator_options")
    if not hasattr(raw, "items") or not all(isinstance(k, str) for k in raw):
        raise ValueError(f"rsp_estimator_options: expected a mapping {{estimator: {{option: value}}}} such as "
                         f"{{bv: {{gamma: 0.2}}}}, got {raw!r}")
    out: dict[str, dict[str, Any]] = {}
    for key, opts in raw.items():
        name = key.lower()
        if name not in names:
            raise ValueError(f"rsp_estimator_options: given for {key!r}, which rsp_estimators does not list "
                             f"({list(names)})")
        if not hasattr(opts, "items") or not all(isinstance(k, str) for k in opts):
            raise ValueError(f"rsp_estimator_options: {key}: expected a mapping {{option: value}}, got {opts!r}")
        out[name] = {k: _option_value(v) for k, v in opts.items()}
    return out


def _family_methods(names: tuple[str, ...], options: dict[str, dict[str, Any]], families: set,
                    seed: int, bootstrap: bool) -> dict[str, registry.Method]:
    """The method object of each estimated family (``corrected``, ``mapped``, ``rankdist``): the one estimator of
    ``names`` among ``registry.recbole_choices(family)`` (``auto``, a choice of ``Corrected*`` and ``RankDist*``,
    runs ``Corrected*`` only where no other of its estimators is listed), built from its options (``rsp_estimator_options``) over the
    adapter's defaults (:data:`_ADAPTER_DEFAULTS`; RankDist*: ``n_bootstrap`` 8, or 0 without ``bootstrap``, and
    ``seed``). A ValueError naming ``rsp_estimators`` for an estimator of no family, two of one family, or a listed
    family (``families``) without one; naming ``rsp_estimator_options`` for an option its method refuses."""
    for n in names:
        if not any(n in registry.recbole_choices(f) for f in _ESTIMATED_FAMILIES):
            raise ValueError(f"rsp_estimators: {n!r} runs in no RecBole metric family; "
                             + "; ".join(f"{_PREFIX[f]}* run one of {registry.recbole_choices(f)}"
                                         for f in _ESTIMATED_FAMILIES))
    methods: dict[str, registry.Method] = {}
    for family in _ESTIMATED_FAMILIES:
        mine = [n for n in names if n in registry.recbole_choices(family)]
        if family == "corrected" and len(mine) > 1 and registry.DEFAULT_ESTIMATOR in mine:
            mine.remove(registry.DEFAULT_ESTIMATOR)  # Corrected*'s fallback: a listed table (or hh) runs there
        if len(mine) > 1:
            raise ValueError(f"rsp_estimators: {' and '.join(repr(n) for n in mine)} are both estimators of the "
                             f"{_PREFIX[family]}* metrics, which run one; list one of them")
        if not mine:
            if family in families:
                raise ValueError(f"rsp_estimators: the {_PREFIX[family]}* metrics need one of "
                                 f"{registry.recbole_choices(family)} listed, got {list(names)}")
            continue
        name = mine[0]
        opts = {**_ADAPTER_DEFAULTS.get(name, {}), **options.get(name, {})}
        if registry.get(name).family in ("auto", "rank_distribution"):  # RankDist*, or auto behind Corrected*
            opts = {"n_bootstrap": _RANKDIST_BOOTSTRAP, "seed": seed, **opts}
            if opts["n_bootstrap"] == 1:
                raise ValueError(f"rsp_estimator_options: {name}: n_bootstrap: expected 0 (no bootstrap) or at "
                                 "least 2 replicates for the interval and standard error, got 1")
            if not bootstrap:  # the refits only feed the standard error and the interval: one fit, the same value
                opts["n_bootstrap"] = 0
        cls = registry.method_class(name)
        opts = {k: v for k, v in opts.items() if k in cls.entry.option_names + registry.COMMON_OPTIONS
                or k in options.get(name, {})}  # auto's defaults for an estimator that takes no bootstrap
        try:
            methods[family] = cls(**opts)
        except ValueError as exc:
            raise ValueError(f"rsp_estimator_options: {name}: {exc}") from None
    return methods


def config_metrics(config: Any) -> tuple[str, ...]:
    """RecBole's ``metrics`` as a tuple of names: one string is one metric (not its letters); an int, a float or a
    list holding anything but names is a ValueError naming ``metrics`` (:func:`~reco_sampled_plugin._options.check_names`)."""
    metrics = config["metrics"]
    if metrics is None or (isinstance(metrics, (list, tuple)) and not metrics):
        return ()
    return check_names(metrics, "metrics", "RecBole metric names such as 'Recall' or 'CorrectedNDCG'")


def plugin_metrics_in(config: Any) -> tuple[str, ...]:
    """Lower-case names of the plugin metrics listed in a RecBole config's ``metrics``."""
    return tuple(m.lower() for m in config_metrics(config) if m.lower() in METRIC_FAMILIES)


def validate_config(config: Any) -> _Settings | None:
    """Check the plugin keys of a RecBole ``Config`` (or any mapping with ``[]``); None without plugin metrics.

    Raises:
        ValueError: naming the offending key: unknown ``rsp_*`` key, an unknown estimator or an option its method
            refuses (``rsp_estimators``, ``rsp_estimator_options``), a plugin metric in ``labeled`` mode, ``rsp_m`` missing (full mode) or different from N (uniN), ...
    """
    names = plugin_metrics_in(config)
    unknown = sorted(set(_config_keys(config)) - set(CONFIG_DEFAULTS))
    if unknown:
        raise ValueError(f"{unknown[0]}: unknown reco_sampled_plugin key; known keys: {sorted(CONFIG_DEFAULTS)}")
    if not names:
        return None
    modes = _modes(config)
    _check_modes(modes, names, {_family_of(n) for n in names})
    planned = _planned_design(config, modes)
    if planned is None:
        return _validated(config, names, modes)
    try:  # the design's parts read as the keys they replace, checked as those keys are
        settings = _validated(_Planned(config, planned), names, modes)
    except ValueError as exc:
        key, _, why = str(exc).partition(": ")
        if key not in DESIGN_KEYS:
            raise
        raise ValueError(f"rsp_design: {_design_label(planned)} (its {key}): {why}") from None
    return dataclasses.replace(settings, planned=planned)


def _validated(config: Any, names: tuple[str, ...], modes: dict) -> _Settings:
    """:func:`validate_config`'s checks past the metric names and the modes (``config``: the config, or the config
    read through ``rsp_design``, :class:`_Planned`)."""
    families = {_family_of(n) for n in names}
    estimators = families - {"exact"}
    seed_raw = config["rsp_seed"]
    seed = _as_int(seed_raw, "rsp_seed", 0) if seed_raw is not None else int(config["seed"] or 0)
    stderr = _as_bool(_get(config, "rsp_stderr"), "rsp_stderr")
    interval = _as_bool(_get(config, "rsp_interval"), "rsp_interval")
    listed = _estimator_names(config)
    options = _estimator_options(config, listed)
    methods = _family_methods(listed, options, estimators, seed, stderr or interval)
    chosen = {f: methods[f].name for f in estimators}  # the estimator each listed family runs
    weighting = _choice(config, "rsp_weighting", ("user", "item"), "weighting")
    ties = _choice(config, "rsp_ties", _TIES, "tie policy")
    n_grid_raw = _get(config, "rsp_n_grid")
    n_grid = _as_float(n_grid_raw, "rsp_n_grid", "a relative step in [0, 0.1]")
    if not (0.0 <= n_grid <= 0.1):
        raise ValueError(f"rsp_n_grid: expected a relative step in [0, 0.1], got {n_grid_raw!r}")
    replacement = _as_bool(_get(config, "rsp_replacement"), "rsp_replacement")
    m_raw = config["rsp_m"]
    m = None if m_raw is None else _as_int(m_raw, "rsp_m", 1)
    if estimators:
        _check_sample_sizes(config, modes, names, chosen, m, replacement)
    adaptive_max = _adaptive_max(config, modes, m, replacement)
    top = _adaptive_top(config, adaptive_max)
    design = _sampling_design(modes, m, replacement, adaptive_max, _exact_at_cap(config, modes, adaptive_max), top)
    share = _exact_share(config, modes, seed)
    if share is not None and design is not None:
        design = SamplingDesign(design.n_samples, replacement=replacement, adaptive_max=adaptive_max,
                                adaptive_top=top, exact_share=share)
    if design is not None and estimators:
        _check_supported(design, names, chosen)
    topk = _topk(config)
    _check_valid_metric(config, names, chosen)
    full_ranks = _as_bool(_get(config, "rsp_full_ranks"), "rsp_full_ranks") or any(n.endswith("auc") for n in names)
    decimal = config["metric_decimal_place"]
    return _Settings(
        metrics=names,
        modes=modes,
        m=m,
        replacement=replacement,
        seed=seed,
        estimators=listed,
        methods=methods,
        options=options,
        weighting=weighting,
        ties=ties,
        n_grid=n_grid,
        side_by_side=_as_bool(_get(config, "rsp_side_by_side"), "rsp_side_by_side"),
        stderr=stderr,
        interval=interval,
        full_ranks=full_ranks,
        tensorboard=_as_bool(_get(config, "rsp_tensorboard"), "rsp_tensorboard"),
        topk=topk,
        decimal_place=4 if decimal is None else check_int(decimal, "metric_decimal_place", 0),
        adaptive_max=adaptive_max,
        check_finite=_check_finite(_get(config, "rsp_check_finite")),
        design=design,
        exact_share=share,
    )


def _exact_share(config: Any, modes: dict, seed: int) -> ExactShare | None:
    """``rsp_exact_share`` / ``rsp_exact_share_choice``: the keyed share of the positives the plugin also ranks
    exactly in ``uniN`` / ``popN`` modes (the chosen users' whole candidate lists scored through the model's
    ``predict``: ``_recbole_stages.run_share``), keyed by ``rsp_seed`` (else RecBole's ``seed``); None without one.
    Full mode ranks every positive exactly already: refused there."""
    raw = _get(config, "rsp_exact_share")
    choice = _get(config, "rsp_exact_share_choice")
    if raw is None:
        if choice != CONFIG_DEFAULTS["rsp_exact_share_choice"]:
            raise ValueError("rsp_exact_share_choice: set rsp_exact_share too (the share, e.g. 0.1)")
        return None
    full = [phase for phase, mode in modes.items() if mode == "full"]
    if full:
        raise ValueError(f"rsp_exact_share: the {full[0]} mode is 'full', which ranks every positive exactly already; "
                         "an exact share is for the sampled modes (uniN, popN)")
    if isinstance(raw, ExactShare):  # rsp_design's share: its choice, metric and floor; keyed by the run's seed
        if raw.seed not in (0, seed):
            raise ValueError(f"rsp_exact_share: the share is keyed by seed {raw.seed}, the run by {seed} (rsp_seed, "
                             f"else seed): set rsp_seed: {raw.seed}, or leave the share's seed 0 (the run's)")
        return dataclasses.replace(raw, seed=seed)
    if isinstance(raw, (bool, np.bool_)) or not isinstance(raw, (int, float, np.integer, np.floating)):
        raise ValueError(f"rsp_exact_share: expected a number in (0, 1], got {raw!r}")
    if not isinstance(choice, str) or choice.lower() not in SHARE_CHOICES:
        raise ValueError(f"rsp_exact_share_choice: expected one of {SHARE_CHOICES}, got {choice!r}")
    try:
        return ExactShare(float(raw), choice=choice.lower(), seed=seed)
    except ValueError as exc:
        raise ValueError(f"rsp_exact_share: {str(exc).partition(': ')[2]}") from None


def estimate_key(metric: str, estimator: str) -> str:
    """The result key of an estimated plugin metric: ``<metric>@<k>/<estimator>`` (``correctedndcg@10/auto``), its
    interval ``<key>_lo`` / ``<key>_hi`` right after it, then ``<metric>@<k>/sampled`` (and ``/exact``)."""
    return f"{metric}/{estimator}"


class _Planned:
    """A config read through ``rsp_design``: its design's parts under the keys they replace (:data:`DESIGN_KEYS`:
    ``rsp_m`` m, ``rsp_adaptive_max`` the cap, ``rsp_exact_at_cap``, ``rsp_replacement``, ``rsp_exact_share`` the
    ExactShare itself),
    every other key the config's."""

    def __init__(self, config: Any, design: SamplingDesign) -> None:
        self._config = config
        self._values = {"rsp_m": design.n_samples, "rsp_adaptive_max": design.adaptive_max,
                        "rsp_adaptive_top": design.adaptive_top, "rsp_exact_at_cap": design.exact_at_cap,
                        "rsp_replacement": design.replacement, "rsp_exact_share": design.exact_share,
                        "rsp_exact_share_choice": None}

    def __getitem__(self, key: str) -> Any:
        return self._values[key] if key in self._values else self._config[key]


def _design_label(design: SamplingDesign) -> str:
    """A design named in a message: its spec where it has one (``'100:3200'``), else its description."""
    try:
        return repr(design_spec(design))
    except ValueError:
        return design.describe()


def _planned_design(config: Any, modes: dict) -> SamplingDesign | None:
    """``rsp_design``: a :class:`SamplingDesign`, a planner result (``plan(...)``: its recommended design, or a
    ``DesignForecast``), an int m, or a spec string (``design.parse_design``: ``"100:3200"``); None without one.
    Refused: a design given here and in a key it sets (:data:`DESIGN_KEYS`), a popularity design outside ``popN`` and a
    uniform one in ``popN`` (``exact_at_cap`` outside full mode: refused as ``rsp_exact_at_cap`` is)."""
    raw = config["rsp_design"]
    if raw is None:
        return None
    if isinstance(raw, (bool, np.bool_, float, np.floating)):
        raise ValueError(f"rsp_design: expected a design spec such as '100:3200' (quoted in YAML), a SamplingDesign or "
                         f"a planner result, got {raw!r} (RecBole reads an unquoted 100+0.05 as a sum: write "
                         "'100+0.05:uniform')")
    try:
        design = parse_design(raw, name="rsp_design") if isinstance(raw, str) else as_design(raw, name="rsp_design")
    except ValueError as exc:
        message = str(exc)
        raise ValueError(message if message.startswith("rsp_design: ") else f"rsp_design: {message}") from None
    given = [k for k in DESIGN_KEYS if config[k] is not None]
    if given:
        raise ValueError(f"rsp_design: given together with {given[0]} ({config[given[0]]!r}); rsp_design sets "
                         f"{', '.join(DESIGN_KEYS)} itself: drop {given[0]} or rsp_design")
    label = _design_label(design)
    for phase, mode in modes.items():
        if design.popularity is not None and not mode.startswith("pop"):
            raise ValueError(f"rsp_design: {label} draws by popularity, which RecBole runs in its popN mode only (its "
                             f"sampler's weights); the {phase} mode is {mode!r}: set eval_args.mode: "
                             f"pop{design.n_samples}")
        if not design.replacement and mode != "full":
            raise ValueError(f"rsp_design: {label} draws without replacement, but RecBole's {mode!r} mode ({phase}) "
                             f"draws with replacement: give the design with replacement ('{design.n_samples}'), or "
                             "evaluate in full mode (rsp_design simulates the draws there)")
        if design.popularity is None and mode.startswith("pop"):
            raise ValueError(f"rsp_design: {label} draws uniformly, but RecBole's {mode!r} mode ({phase}) draws by "
                             f"popularity: set eval_args.mode: uni{design.n_samples} (or full), or give a popularity "
                             "design")
    return design


def _check_valid_metric(config: Any, names: tuple[str, ...], chosen: dict[str, str]) -> None:
    """``valid_metric`` naming an estimated plugin metric names its estimator, as the result keys do
    (:func:`estimate_key`): a ValueError naming ``valid_metric`` with the key to use, before training."""
    try:
        raw = config["valid_metric"]
    except KeyError:
        return
    if not isinstance(raw, str) or "/" in raw:
        return
    metric = raw.lower().split("@")[0]
    if metric in names and _family_of(metric) in chosen:
        key = estimate_key(raw, chosen[_family_of(metric)])
        raise ValueError(f"valid_metric: {raw!r} is reported as {key.lower()!r} (each estimated metric's key names "
                         f"its estimator); set valid_metric: {key}")


def _check_modes(modes: dict, names: tuple[str, ...], families: set) -> None:
    """Every phase's mode ranks (``full``, ``uniN`` or ``popN``), and exact metrics run in full mode only."""
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


def _check_sample_sizes(config: Any, modes: dict, names: tuple[str, ...], chosen: dict[str, str], m: int | None,
                        replacement: bool) -> None:
    """The estimated metrics' sample size in every phase: RecBole's N of a ``uniN`` / ``popN`` mode (>= 1, drawn
    with replacement, equal to ``rsp_m`` when given; popN: the listed estimators take popularity draws), or
    ``rsp_m`` in full mode (required there: the plugin simulates the draws)."""
    for phase, mode in modes.items():
        n_draws = _sample_num(mode)
        if n_draws is not None:
            if n_draws < 1:  # no sampled item: no sampling design (and nothing to estimate from)
                raise ValueError(f"eval_args.mode: the {phase} mode {mode!r} samples no items; the plugin's estimated "
                                 "metrics need N >= 1 sampled items per positive")
            if m is not None and m != n_draws:
                raise ValueError(f"rsp_m: {m} disagrees with the {phase} mode {mode!r}, which samples {n_draws} items")
            if not replacement:
                raise ValueError(f"rsp_replacement: RecBole's {mode!r} mode draws with replacement; set rsp_replacement: true")
            if mode.startswith("pop"):  # the registry says which estimators take popularity draws, for which metric
                from ._recbole_popularity import recbole_alpha

                recbole_alpha(config)  # a NaN alpha would make RecBole's alias table (and the weights) meaningless
                _check_popularity(mode, popularity_design(n_draws), names, chosen)
        if mode == "full" and m is None:
            est = [n for n in names if _family_of(n) != "exact"][0]
            raise ValueError(
                f"rsp_m: {est!r} estimates a full-catalogue metric from sampled ranks; in full mode set rsp_m "
                "(e.g. 100) so the plugin simulates sampling, or evaluate in 'uniN' mode"
            )


def _topk(config: Any) -> tuple[int, ...]:
    """RecBole's ``topk``: an integer or a list of integers >= 1 (default 10)."""
    topk_raw = config["topk"] or [10]
    if isinstance(topk_raw, (str, bytes)) or not isinstance(topk_raw, (list, tuple, int, np.integer)):
        raise ValueError(f"topk: expected an integer or a list of integers, got {topk_raw!r}")
    return tuple(check_int(k, "topk", 1) for k in ([topk_raw] if isinstance(topk_raw, (int, np.integer)) else topk_raw))


def _check_finite(value: Any) -> bool | str:
    """``rsp_check_finite``: true (default), false, or "positives" (the same as false here: RecBole's -inf marks
    excluded items, so only the held-out items' scores are then checked)."""
    if isinstance(value, str) and value.lower() == "positives":
        return "positives"
    if not isinstance(value, (bool, np.bool_)):
        raise ValueError(f"rsp_check_finite: expected true, false or 'positives', got {value!r}")
    return bool(value)


def _adaptive_max(config: Any, modes: dict, m: int | None, replacement: bool) -> int | None:
    """``rsp_adaptive_max``: adaptive sampling from the first stage's m up to this cap, with replacement (the
    estimators that take it: :func:`_check_supported`). Full mode simulates every stage from the exact counts
    (needs ``rsp_m``); ``uniN`` mode takes RecBole's N draws as the first stage and the plugin draws and scores the
    later stages itself through the model's ``predict`` (``_recbole_stages``). ``popN`` is refused: its first stage
    is drawn by popularity, the adaptive stages (and their estimators) are uniform."""
    raw = config["rsp_adaptive_max"]
    if raw is None:
        return None
    cap = _as_int(raw, "rsp_adaptive_max", 1)
    sizes: set[int] = set()
    for phase, mode in modes.items():
        if mode.startswith("pop"):
            raise ValueError(
                f"rsp_adaptive_max: RecBole's {mode!r} mode ({phase}) draws its first {_sample_num(mode)} items by "
                "popularity, but adaptive sampling (its later stages and its estimators) draws uniformly; use "
                f"'uni{_sample_num(mode)}' or full mode with rsp_m"
            )
        if mode != "full":
            sizes.add(_sampled_size(mode))
    if m is None and len(sizes) > 1:
        raise ValueError(f"rsp_adaptive_max: the phases draw different first stages ({sorted(sizes)} items: "
                         f"{modes}); adaptive sampling needs one first-stage size: use the same uniN in every phase")
    if m is None and not sizes:
        raise ValueError("rsp_adaptive_max: needs rsp_m, the first stage's sample size")
    first = m if m is not None else sizes.pop()
    if cap < first:
        raise ValueError(f"rsp_adaptive_max: must be at least the first stage's m ({first}), got {cap}")
    if not replacement:
        raise ValueError("rsp_adaptive_max: adaptive sampling draws with replacement; set rsp_replacement: true")
    return cap


def _adaptive_top(config: Any, adaptive_max: int | None) -> int:
    """``rsp_adaptive_top``: a positive of adaptive sampling draws more while its sampled rank is at most this (1:
    while first); only with ``rsp_adaptive_max`` (its range, 1..m, is the design's check)."""
    raw = _get(config, "rsp_adaptive_top")
    top = 1 if raw is None else _as_int(raw, "rsp_adaptive_top", 1)
    if top != 1 and adaptive_max is None:
        raise ValueError(f"rsp_adaptive_top: the continuation rule of adaptive sampling; set rsp_adaptive_max (the "
                         f"cap) too, got rsp_adaptive_top: {raw!r}")
    return top


def _exact_at_cap(config: Any, modes: dict, adaptive_max: int | None) -> bool:
    """``rsp_exact_at_cap``: the positives still first at the cap of adaptive sampling (``rsp_adaptive_max``) are then
    ranked exactly, from the scores full mode holds (``_recbole_ranks._completed_at_cap``); refused in ``uniN`` and
    ``popN`` modes, whose scores cover the drawn items only."""
    if not _as_bool(_get(config, "rsp_exact_at_cap"), "rsp_exact_at_cap"):
        return False
    if adaptive_max is None:
        raise ValueError("rsp_exact_at_cap: completes the positives still first at the cap of adaptive sampling; set "
                         "rsp_adaptive_max (the cap) and rsp_m")
    sampled = [(phase, mode) for phase, mode in modes.items() if mode != "full"]
    if sampled:
        raise ValueError(f"rsp_exact_at_cap: RecBole's {sampled[0][1]!r} mode ({sampled[0][0]}) scores the drawn items "
                         "only; the exact ranks at the cap come from full mode's scores: evaluate in full mode with "
                         "rsp_m and rsp_adaptive_max")
    return True


def _sampling_design(modes: dict, m: int | None, replacement: bool, adaptive_max: int | None,
                     exact_at_cap: bool = False, adaptive_top: int = 1) -> SamplingDesign | None:
    """The one sampling design of the validated keys: full mode simulates rsp_m draws (``rsp_replacement``,
    ``rsp_adaptive_max``, ``rsp_exact_at_cap``); RecBole's uniN / popN draw N items with replacement (rsp_m, when given, equals N). popN's
    popularity weights come with the data (RecBole's sampler: ``_recbole_popularity``), so its design is kept as the
    uniform N here; popN itself is checked against the registry with :func:`popularity_design` (``_check_popularity``)
    and estimated from the draws' statistics (``_recbole_metrics``). None when the sampled modes of the phases draw different N
    without rsp_m (each phase then has its own N)."""
    sizes: set[int] = {m} if m is not None else {_sampled_size(mode) for mode in modes.values() if mode != "full"}
    if len(sizes) != 1:
        return None
    try:
        return SamplingDesign(sizes.pop(), replacement=replacement, adaptive_max=adaptive_max,
                              adaptive_top=adaptive_top, exact_at_cap=exact_at_cap)
    except ValueError as exc:
        if str(exc).startswith("adaptive_top"):
            raise ValueError(f"rsp_{exc}") from None
        raise


def _check_popularity(mode: str, design: SamplingDesign, names: tuple, chosen: dict[str, str]) -> None:
    """popN: every listed estimated metric's estimator (``chosen``: family -> name) supports popularity draws and
    estimates that metric kind (``Estimator.supports`` and ``registry.names(metric=...)``: a new estimator registered
    with ``popularity=True`` is accepted with no edit here); otherwise a ValueError naming ``eval_args.mode`` and what
    is available."""
    for name in names:
        family = _family_of(name)
        if family not in chosen:
            continue
        method, kind = chosen[family], _kind(name)
        entry = registry.get(method)
        if entry.supports(design) and entry.takes_metric(kind):
            continue
        ok = [n for n in registry.recbole_choices(family) if n in registry.names(design=design, metric=kind)]
        corrected = [n for n in ok if registry.get(n).family != "none"]
        if corrected:
            hint = f"list {' or '.join(corrected)} in rsp_estimators instead"
        else:
            hint = f"no {_PREFIX[family]}* estimator corrects {kind} under popularity sampling yet"
            hint += "; none (in rsp_estimators) reports the plain sampled metric" if "none" in ok else ""
        raise ValueError(
            f"eval_args.mode: {mode!r} draws items by popularity, and {name!r} (rsp_estimators: {method}) does not "
            f"estimate {kind} there (the registry's estimators of {kind} under popularity sampling: "
            f"{registry.names(design=design, metric=kind)}); {hint}; or evaluate in 'uni{design.n_samples}' mode"
        )


def _check_supported(design: SamplingDesign, names: tuple, chosen: dict[str, str]) -> None:
    """Every listed estimated metric's estimator (``chosen``: family -> name) supports the design
    (``registry.get(method).supports(design)``) and estimates its metric kind (``Estimator.takes_metric``: ``hh`` is
    AUC only)."""
    for name in names:
        family = _family_of(name)
        if family not in chosen:
            continue
        method = chosen[family]
        entry = registry.get(method)
        if not entry.takes_metric(_kind(name)):
            ok = [n for n in registry.recbole_choices(family) if registry.get(n).supports(design)
                  and registry.get(n).takes_metric(_kind(name))]
            raise ValueError(f"rsp_estimators: {method!r} estimates {', '.join(entry.metrics or ())} only, not "
                             f"{_kind(name)} ({name!r}); the {_PREFIX[family]}* metrics take one of {tuple(ok)}")
        if entry.supports(design):
            continue
        if design.adaptive is not None:
            same = [n for n in registry.recbole_choices(family) if registry.get(n).supports(design)
                    and registry.get(n).takes_metric(_kind(name))]
            rankdist = [n for n in registry.recbole_choices("rankdist") if registry.get(n).supports(design)]
            instead = (f"the {_PREFIX[family]}* metrics take {' or '.join(same)} (rsp_estimators), as do " if same
                       else "use ") + f"the RankDist* metrics ({' or '.join(rankdist)})"
            raise ValueError(f"rsp_adaptive_max: {name!r} (rsp_estimators: {method}) assumes one fixed m per positive; "
                             f"with adaptive sampling {instead}")
        raise ValueError(f"rsp_estimators: {method!r} does not support the sampling design ({design.describe()}) of "
                         f"{name!r}; the {_PREFIX[family]}* metrics take one of "
                         f"{tuple(n for n in registry.recbole_choices(family) if registry.get(n).supports(design))}")


def _fingerprint(value: Any) -> Any:
    """A config value in comparable form: tensors and arrays by dtype, shape and a digest of their content (their
    repr elides the middle: two weight vectors of one length can print alike), dataclasses (designs, planner
    results) field by field, containers element-wise, anything else by its repr."""
    if isinstance(value, torch.Tensor):
        value = value.detach().cpu().numpy()
    if isinstance(value, np.ndarray):
        data = np.ascontiguousarray(value).tobytes()
        return ("array", str(value.dtype), value.shape, hashlib.blake2b(data, digest_size=16).hexdigest())
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, tuple((f.name, _fingerprint(getattr(value, f.name)))
                                            for f in dataclasses.fields(value)))
    if isinstance(value, dict):
        return ("dict", tuple((repr(k), _fingerprint(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_fingerprint(v) for v in value))
    return repr(value)


def _settings_key(config: Any) -> str:
    keys = ["metrics", "eval_args", "topk", "seed", "metric_decimal_place", *sorted(_config_keys(config))]
    return repr([(k, _fingerprint(config[k])) for k in keys])


def _settings(config: Any) -> _Settings | None:
    """Validated settings, cached on the config object while the relevant keys stay unchanged."""
    key = _settings_key(config)
    cached = config.__dict__.get("_rsp_settings") if hasattr(config, "__dict__") else None
    if cached is not None and cached[0] == key:
        return cached[1]
    settings = validate_config(config)
    if hasattr(config, "__dict__"):
        config.__dict__["_rsp_settings"] = (key, settings)
    return settings

