"""The ``reco-sampled`` command line: ``demo``, ``reproduce``, ``table``, ``estimate``, ``plan``, ``recbole``.

Every list of estimators here is the registry's (``registry.py``), read when the parser is built: ``--method``'s
help lists each registered method with its one-line summary, so a method registered at run time is offered
without an edit here. ``estimate`` and ``reproduce`` turn ``--n-samples`` / ``--adaptive-max`` / ``--sampling``
into one :class:`~reco_sampled_plugin.design.SamplingDesign`.

Building the parser imports neither torch nor scipy (each command imports what it needs), so ``--help`` is instant.
Every flag is the name of the Python parameter it fills, ``-`` for ``_`` (``--n-users`` is ``plan(n_users=...)``;
tests/test_cli_surface.py checks it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import TYPE_CHECKING, Any, Iterable

from . import __version__, registry

if TYPE_CHECKING:  # the CLI imports numpy and torch only in the commands that compute
    from .design import SamplingDesign
    from ._estimate import Estimate
    from .priors import BetaPrior
    from .ranking import SampledRanks

__all__ = ["main", "build_parser", "add_plan_parser", "run_plan", "estimate_table"]

_METHODS_HEADER = "estimators (--method):"


class _HelpFormatter(argparse.HelpFormatter):
    """argparse's formatter, except that the estimator list of an epilog keeps one method per line."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        if text.startswith(_METHODS_HEADER):
            return "\n".join(indent + line for line in text.splitlines())
        return super()._fill_text(text, width, indent)


def _methods_epilog(names: Iterable[str]) -> str:
    """The registry's entries ``names`` as an epilog: one line each, the name, its one-line summary, and whether it
    takes adaptive designs."""
    names = tuple(names)
    width = max((len(n) for n in names), default=0)
    lines = [_METHODS_HEADER]
    for name in names:
        entry = registry.get(name)
        lines.append(f"  {name:<{width}}  {entry.summary}" + (" [adaptive]" if entry.adaptive else ""))
    return "\n".join(lines)


def _sampling_design(n_samples: int, sampling: str, adaptive_max: int | None = None,
                     adaptive_top: int | None = None) -> SamplingDesign:
    """The :class:`~reco_sampled_plugin.design.SamplingDesign` of ``--n-samples``, ``--sampling`` (``binomial``:
    with replacement, ``hypergeometric``: without), ``--adaptive-max`` and ``--adaptive-top``: the commands' one
    construction of it (a bad part named by its flag)."""
    from .design import SamplingDesign

    try:
        return SamplingDesign(n_samples, replacement=sampling == "binomial", adaptive_max=adaptive_max,
                              adaptive_top=1 if adaptive_top is None else adaptive_top)
    except ValueError as exc:
        name, _, rest = str(exc).partition(": ")
        raise ValueError(f"--{name.replace('_', '-')}: {rest}") from None


def _add_progress(parser: argparse.ArgumentParser) -> None:
    """``--progress`` / ``--no-progress``: a bar on stderr (default: when stderr is a terminal)."""
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="progress bar on stderr (default: when stderr is a terminal); results are the same")


_LAWS = "binomial: uniform with replacement (default); hypergeometric: uniform without"


def _add_sampling(parser: argparse.ArgumentParser, popularity: str | None = None) -> None:
    """``--sampling``, the draws' law, with one help text for every command; ``popularity``: the command also reads
    popularity-sampled ranks (that choice's help), and the default is then None: the file's columns tell."""
    if popularity is None:
        parser.add_argument("--sampling", choices=["binomial", "hypergeometric"], default="binomial",
                            help=f"the draws' law ({_LAWS})")
    else:
        parser.add_argument("--sampling", choices=["binomial", "hypergeometric", "popularity"], default=None,
                            help=f"the draws' law ({_LAWS}; popularity: {popularity})")


def _check_int_arguments(args: argparse.Namespace) -> None:
    """Every integer option within int64 (``--n-items 10**30`` is a ValueError naming the option, not an
    OverflowError deep inside)."""
    for name, value in vars(args).items():
        if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
            raise ValueError(f"--{name.replace('_', '-')}: {value} is out of range (a 64-bit integer, below 2**63)")


def _cmd_demo(args: argparse.Namespace) -> int:
    from .toy import format_table, toy_table

    print(format_table(toy_table(args.n_samples, args.sampling), args.n_samples))
    print(
        "\nOn the exact metrics C is best for AP, NDCG and Recall@10; on the sampled metrics it is not: "
        "sampling reverses the ordering (Krichene & Rendle, KDD 2020)."
    )
    return 0


def _cmd_reproduce(args: argparse.Namespace) -> int:
    from .report import summary_lines, write_report
    from .reproduce import ReproduceConfig, run_reproduce

    cfg = ReproduceConfig(
        data=args.data,
        n_samples=_sampling_design(args.n_samples, args.sampling, args.adaptive_max),
        repeats=args.repeats,
        seed=args.seed,
    )
    if args.quick:
        cfg.m_grid = (10, 100, 1000)
    log = None if args.quiet else (lambda s: print(f"[reproduce] {s}", flush=True))
    result = run_reproduce(cfg, progress=False if args.quiet else args.progress, log=log)
    out = write_report(result, args.out, plots=not args.no_plots)
    print()
    print("\n".join(summary_lines(result)))
    print(f"\nreport written to {out / 'report.md'} (tables as CSV, plots as PNG beside it); total {result.timings['total']:.1f} s")
    return 0


def _prior(text: str | None) -> BetaPrior | None:
    if text is None or text == "uniform":
        return None
    kind, _, arg = text.partition(":")
    if kind == "beta" and arg:
        from .priors import BetaPrior

        try:
            return BetaPrior(float(arg))
        except ValueError as exc:
            raise ValueError(f"--prior: {exc}") from None
    raise ValueError(f"--prior: expected 'uniform' or 'beta:A' (e.g. beta:0.5), got {text!r}")


def _cmd_table(args: argparse.Namespace) -> int:
    from .corrections import check_method, correction_table

    # the options given, as fields of the method object (one a method does not take is refused, naming it)
    given = {"gamma": args.gamma, "prior": _prior(args.prior), "rounding": args.rounding}
    method = registry.method_class(check_method(args.method))(**{k: v for k, v in given.items() if v is not None})
    table = correction_table(args.metric, args.n_items, _sampling_design(args.n_samples, args.sampling, None), method)
    lines = ["sampled_rank,value"] + [f"{i},{v:.12g}" for i, v in enumerate(table.tolist(), start=1)]
    if args.out:
        with open(args.out, "w") as fh:
            fh.write("\n".join(lines) + "\n")
        print(f"{len(table)} values written to {args.out}")
    else:
        print("\n".join(lines))
    return 0


def _note_unused_defaults(args: argparse.Namespace, data: Any) -> None:
    """``--n-items`` / ``--n-samples`` are the defaults of a rank file's lines without those columns: where the
    file's own columns say otherwise, a note on stderr says the flag went unused there (it was ignored silently). An
    adaptive design's m column holds each positive's final m, which ``--n-samples`` (the first stage's) is not."""
    given = (("--n-items", args.n_items, data.n_items, "n_candidates"),
             ("--n-samples", args.n_samples if args.adaptive_max is None else None, data.n_samples, "n_samples"))
    for flag, value, column, name in given:
        if value is not None and len(column) and bool((column != value).any()):
            print(f"reco-sampled: note: {flag} {value:,} is the default of lines without a {name} column; this file's "
                  f"lines give {int(column.min()):,}..{int(column.max()):,}, read as given", file=sys.stderr)


def _cmd_estimate(args: argparse.Namespace) -> int:
    import numpy as np

    from .estimators import estimate
    from .ranking import SampledRanks
    from .rank_files import read_ncf, read_rank_file

    options = _method_options(args.option)  # before anything is read or printed
    if args.file is not None:
        if args.test_rating or args.test_negative or args.scores:
            raise ValueError("estimate: give either a rank FILE or --test-rating/--test-negative/--scores, not both")
        data = read_rank_file(args.file, args.n_items, args.n_samples)
        _note_unused_defaults(args, data)
    else:
        if not (args.test_rating and args.test_negative and args.scores):
            raise ValueError("estimate: give a rank FILE, or all of --test-rating, --test-negative and --scores")
        if args.n_items is None:
            raise ValueError("--n-items: required with NCF files (the candidates each user's negatives came from)")
        data = read_ncf(args.test_rating, args.test_negative, args.scores, args.n_items,
                        distinct=args.sampling == "hypergeometric")
    if getattr(data, "popularity", False) or args.sampling == "popularity":
        return _estimate_popularity(args, data)
    args.sampling = args.sampling or "binomial"
    metrics = args.metric or list(_ESTIMATE_METRICS)
    if args.adaptive_max is not None and args.n_samples is None:
        raise ValueError("--adaptive-max: give --n-samples, the first stage's m of the adaptive sampling")
    # the design of the draws, when --n-samples gives it (adaptive: the file's m column holds each final m)
    if args.adaptive_top is not None and args.adaptive_max is None:
        raise ValueError("--adaptive-top: the continuation rule of adaptive sampling; give --adaptive-max too")
    design = None if args.n_samples is None else _sampling_design(args.n_samples, args.sampling, args.adaptive_max,
                                                                  args.adaptive_top)
    given = design  # what the file's lines may leave out: the plan hint passes it on (--pilot-n-samples ...)
    if data.inclusion is not None:  # exact_rank and inclusion columns: the design carries the file's exact share
        design = data.share_design(design or _sampling_design(int(np.max(data.n_samples)), args.sampling))
    adaptive = None if design is None else design.adaptive
    methods = args.method or [m for m in _default_methods() if design is None or registry.get(m).supports(design)]
    from .metric_names import parse_metric

    for metric in metrics:  # every name checked before anything is printed
        parse_metric(metric)
    known = registry.names()
    unknown = [m for m in methods if m not in known]
    if unknown:
        raise ValueError(f"--method: unknown {unknown}; use some of {known}")
    objects = _method_objects(methods, options)
    unsupported = [m for m in methods if design is not None and not registry.get(m).supports(design)]
    if unsupported and adaptive is not None:
        raise ValueError(f"--method: {unsupported} assume one fixed m per positive; with --adaptive-max use some of "
                         f"{registry.names(adaptive=True)}")
    if unsupported:
        assert design is not None  # unsupported is empty without a design
        raise ValueError(f"--method: {unsupported} do not support {design.describe()}; use some of "
                         f"{registry.names(design=design)}")
    print(f"{len(data.ranks):,} sampled ranks; n {int(data.n_items.min()):,}..{int(data.n_items.max()):,}; m {int(data.n_samples.min())}..{int(data.n_samples.max())}")
    if adaptive is not None:
        from ._rank_hist import as_histogram
        from ._adaptive_law import adaptive_cost, check_adaptive_histogram

        hist = as_histogram(data.ranks, data.n_items, data.n_samples)
        check_adaptive_histogram(hist, adaptive)
        cost = adaptive_cost(hist, adaptive)
        print(f"adaptive sampling m = {adaptive.n_samples} -> {adaptive.cap}: {cost.mean_samples:.1f} samples per "
              f"positive on average (max {cost.max_samples}); {100 * cost.share_at_cap:.1f}% reached the cap, "
              f"{100 * cost.share_first_at_cap:.1f}% still ranked first there"
              + (f" (drawing more while r~ <= {adaptive.top})" if adaptive.top > 1 else ""))
    from ._progress import progress_bar

    bar = progress_bar(total=len(metrics) * len(methods), desc="estimate", enabled=args.progress, unit="estimate")
    rows = []
    if design is None:  # the file's m column: the largest m, fixed
        design = _sampling_design(int(np.max(data.n_samples)), args.sampling)
    sample = SampledRanks.from_arrays(data.ranks, data.n_items, data.n_samples, design, share_ranks=data.exact_rank,
                                      inclusion=data.inclusion)
    for metric in metrics:
        for method, obj in zip(methods, objects):
            rows.append((metric, method, estimate(metric, sample, obj)))
            bar.update()
    bar.close()
    m_values = np.unique(np.asarray(data.n_samples)).astype(int).tolist()
    context = dict(n_items=int(data.n_items.max()), users=len(data.ranks),
                   n_samples=m_values[0] if len(m_values) == 1 else f"{m_values[0]}..{m_values[-1]}",
                   pilot=args.file, pilot_design=given)
    print("\n".join(estimate_table(rows, stderr=args.stderr, design=design, **context)))
    return 0


def _estimate_popularity(args: argparse.Namespace, data: Any) -> int:
    """``reco-sampled estimate`` of a popularity-sampled rank file (the ``hh_s1``, ``hh_s2`` columns): every metric
    by the registry's methods for the popularity design that estimate it (``registry.names(design=, metric=)``)
    and read such a file (not ``pl_fit``, which needs class counts a rank file does not carry: ``auto`` and ``hh``
    for AUC, ``none`` for top-K metrics), or by the ``--method`` s named."""
    from .estimators import estimate
    from .metric_names import parse_metric

    if not data.popularity:
        raise ValueError("--sampling: popularity-sampled ranks need each positive's Hansen-Hurwitz statistics, a rank "
                         "file with the columns sampled_rank,n_candidates,n_samples,hh_s1,hh_s2 "
                         "(rank_files.write_rank_file writes them from a draw); bare ranks cannot be corrected "
                         "(docs/popularity.md)")
    if args.sampling not in (None, "popularity"):
        raise ValueError(f"--sampling: {args.sampling!r} contradicts the file's hh_s1 / hh_s2 columns (popularity "
                         "draws); use --sampling popularity or leave it out")
    if args.adaptive_max is not None:
        raise ValueError("--adaptive-max: adaptive sampling draws uniformly; this file holds popularity draws")
    sampled = data.sampled()
    design = sampled.design
    metrics = args.metric or ["auc", *_ESTIMATE_METRICS]  # hh corrects AUC only
    for metric in metrics:
        parse_metric(metric)
    known = registry.names()
    unknown = [m for m in (args.method or []) if m not in known]
    if unknown:
        raise ValueError(f"--method: unknown {unknown}; use some of {known}")
    options = _method_options(args.option)
    print(f"{len(data.ranks):,} sampled ranks (popularity draws, m = {design.n_samples}); "
          f"n {int(data.n_items.min()):,}..{int(data.n_items.max()):,}")
    rows = []
    for metric in metrics:
        methods = args.method or [m for m in registry.names(design=design, metric=metric)
                                  if _reads_file(m, metric, sampled)]
        for method, obj in zip(methods, _method_objects(methods, options)):
            rows.append((metric, method, estimate(metric, sampled, obj)))
    # no --pilot in the suggested plan: the planner takes uniform pilots only (this file is popularity-sampled)
    context = dict(n_items=int(data.n_items.max()), users=len(data.ranks), n_samples=design.n_samples, pilot=None)
    print("\n".join(estimate_table(rows, stderr=args.stderr, design=design, **context)))
    return 0


def _method_options(given: list[str] | None) -> dict[str, Any]:
    """``--option NAME=VALUE`` flags as {name: value} (:func:`_option_value`)."""
    out: dict[str, Any] = {}
    for item in given or []:
        name, sep, value = item.partition("=")
        if not sep or not name.strip():
            raise ValueError(f"--option: expected NAME=VALUE such as gamma=0.2, got {item!r}")
        out[name.strip()] = _option_value(value)
    return out


def _option_value(text: str) -> Any:
    """An ``--option`` value: empty, ``null`` / ``none`` / ``~`` None; ``true`` / ``false`` (any case) booleans; JSON
    numbers and lists; other numbers Python's ``float`` reads (``.5``, ``1e-3``); anything else the string. Each
    option's kind checks the value (a string where a number is due is named). The core install has no YAML parser
    (PyYAML comes with the framework extras)."""
    t = text.strip()
    if t.lower() in ("", "null", "none", "~"):
        return None
    if t.lower() in ("true", "false"):
        return t.lower() == "true"
    try:
        return json.loads(t)
    except ValueError:
        pass
    try:
        return float(t)
    except ValueError:
        return t


def _method_objects(methods: list[str], options: dict[str, Any]) -> list[registry.Method]:
    """Each method's options object with the ``--option`` s it takes (each checked there); an option no method
    takes is refused (a ValueError naming ``--option``)."""
    unused = [k for k in options if not any(k in registry.get(m).option_names + registry.COMMON_OPTIONS
                                            for m in methods)]
    if unused:
        takes = [m for m in registry.names() if unused[0] in registry.get(m).option_names]
        raise ValueError(f"--option: {unused[0]} is an option of none of {list(methods)}"
                         + (f" (it is one of {takes})" if takes else ""))
    out = []
    for m in methods:
        cls = registry.method_class(m)
        out.append(cls(**{k: v for k, v in options.items() if k in cls.entry.option_names + registry.COMMON_OPTIONS}))
    return out


def _reads_file(method: str, metric: str, sampled: SampledRanks) -> bool:
    """Whether ``method`` (``auto``: the method it runs for ``metric``) can read these popularity-sampled ranks: a
    rank file carries the Hansen-Hurwitz sums, not the class counts of ``registry.Estimator.class_counts``."""
    entry = registry.get(method)
    if entry.family == "auto":
        entry = registry.get(registry.popularity_auto(metric))
    stats = sampled.popularity_stats
    return not entry.class_counts or (stats is not None and stats.has_profile)


#: ``estimate``'s metrics when none is named (popularity rank files: AUC first)
_ESTIMATE_METRICS = ("recall@10", "ndcg@10")


def _default_methods() -> tuple[str, ...]:
    """``estimate``'s methods when none is named: the plain sampled metric (the papers' number, beside it) and the
    default estimator (``registry.DEFAULT_ESTIMATOR``)."""
    return ("none", registry.DEFAULT_ESTIMATOR)


def estimate_table(rows: Iterable[tuple[str, str, Estimate]], *, stderr: bool = False, n_items: int | None = None,
                   users: int | None = None, n_samples: int | str | None = None, pilot: str | None = None,
                   pilot_design: Any = None, design: SamplingDesign | None = None) -> list[str]:
    """The lines of ``reco-sampled estimate``'s table: per (metric, method, Estimate) the estimate and its 95%
    interval (``Estimate.interval``: honest about the unresolved top), the standard error only with ``stderr``
    (sampling noise only), the flags; under it each flag in words (``explain_flags``, its advice fitted to
    ``design``, with the ``reco-sampled plan`` command for these data) and, where corrected methods show one identified interval, a note that equal intervals
    are not agreement."""
    from ._tables import format_table
    from ._estimate import SAME_INTERVAL_NOTE, explain_flags

    table: list[list[str]] = []  # metric, method, estimate, interval[, stderr], flags (after two spaces)
    flagged: dict[str, str] = {}  # flag -> the first metric it appeared for
    intervals: dict[str, list[str]] = {}  # metric -> the printed intervals of its corrected, unresolved methods
    for metric, method, est in rows:
        lo, hi = est.interval(0.95)  # widened where the top is unresolved (docs/estimators.md)
        interval = f"[{lo:.5f}, {hi:.5f}]"
        flags = est.flags  # ``uncorrected``: the plain sampled metric (none), its interval the sampled metric's
        # ``auto`` shows what it ran (auto:gmod / auto:mes)
        label = f"{method}:{est.details['auto']['method']}" if "auto" in est.details else method
        table.append([metric, label, f"{est.value:.5f}", interval] + ([f"{est.stderr:.5f}"] if stderr else [])
                     + [f"  {','.join(flags)}"])
        for f in flags:
            flagged.setdefault(f, metric)
        if "top_unresolved" in est.flags and registry.get(method).family != "none":
            intervals.setdefault(metric, []).append(interval)
    lines = format_table(["metric", "method", "estimate", "95% interval"] + (["stderr (sampling only)"] if stderr else [])
                         + ["  flags"], table, formats=["<12", "<14", ">11", ">22"] + ([">24"] if stderr else []) + [""])
    notes = [ln for f, metric in flagged.items()
             for ln in explain_flags([f], metric=metric, n_items=n_items, n_samples=n_samples, users=users,
                                     pilot=pilot, pilot_design=pilot_design, design=design)]
    if any(len(v) > 1 and len(set(v)) == 1 for v in intervals.values()):
        notes.append(SAME_INTERVAL_NOTE)
    if notes:
        lines += [""] + notes
    return lines


# ------------------------------------------------------------------------------------------------------- plan
def _design_arg(text: str) -> SamplingDesign:
    """``--design``: a design spec (``design.SPEC_SYNTAX``, read by ``design.parse_design``, as RecBole's
    ``rsp_design``), an argparse error naming what is wrong."""
    from .design import parse_design

    try:
        return parse_design(text)
    except ValueError as exc:  # argparse names --design itself
        raise argparse.ArgumentTypeError(str(exc).removeprefix("spec: ")) from None


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Add the ``plan`` subcommand to an argparse ``subparsers`` object (sets ``func=run_plan``)."""
    p = subparsers.add_parser(
        "plan", help="forecast which sampling design reaches a target accuracy, before evaluating",
        description="Forecast, by Monte Carlo under an assumed rank distribution (a pilot's, or a default family), "
                    "the relative error and cost of sampled evaluation designs (scored (user, item) pairs per user: "
                    "the positive and its drawn items, against full ranking's n), and recommend the cheapest that "
                    "meets the target; with --seconds-per-pair also each design's predicted scoring time next to "
                    "full ranking's. Example: reco-sampled plan --n-items 50000 --n-users 6000 --metric ndcg@10 "
                    "--target-rel-error 0.05 --seconds-per-pair 2e-5",
        epilog=_methods_epilog(registry.names()), formatter_class=_HelpFormatter,
    )
    p.add_argument("--n-items", type=int, required=True, help="catalogue size n (candidates per user)")
    p.add_argument("--n-users", type=int, required=True, help="users (held-out positives) in the evaluation")
    p.add_argument("--metric", required=True, help="metric, e.g. ndcg@10, hit@10, mrr")
    p.add_argument("--target-rel-error", type=float, required=True, help="target relative error, e.g. 0.05")
    p.add_argument("--target-rel-halfwidth", type=float, metavar="H",
                   help="target for the 95%% interval you will read: its median half-width relative to the value, "
                        "e.g. 0.1 for value +-10%% (default: full ranking's own half-width combined with 1.96 x "
                        "--target-rel-error)")
    p.add_argument("--pilot", help="rank file of a pilot's sampled ranks ('rank[,n_candidates[,n_samples]]' lines)")
    p.add_argument("--pilot-n-items", type=int,
                   help="the pilot's n when its file has no n column (default: --n-items)")
    p.add_argument("--pilot-n-samples", type=int,
                   help="the pilot's m when its file has no m column; for an adaptive pilot its first-stage m "
                        "(default: the smallest m in the file)")
    p.add_argument("--pilot-adaptive-max", type=int, help="the pilot's adaptive cap, if it was adaptive")
    p.add_argument("--pilot-adaptive-top", type=int, metavar="T",
                   help="the pilot's continuation rule, if it drew more while r~ <= T (default 1: while first)")
    p.add_argument("--design", action="append", type=_design_arg, metavar="M[:CAP[:topT]][+SHARE[:active]]",
                   help="candidate design (repeatable): fixed m (m:norepl without replacement), or adaptive m:cap "
                        "(m:cap:topT: drawing more while r~ <= T; m:cap:exact: exact_at_cap), with +share an exact "
                        "share of the positives ranked exactly (uniform, or :active); the spec the plan prints "
                        "(default: the built-in grid)")
    p.add_argument("--method", default=registry.DEFAULT_ESTIMATOR, metavar="METHOD",
                   help=f"estimator to forecast (default {registry.DEFAULT_ESTIMATOR}; the estimators are listed below)")
    p.add_argument("--repeats", type=int, default=20, help="Monte Carlo repeats per design (default 20)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seconds-per-pair", type=float, metavar="S",
                   help="the scorer's seconds per scored (user, item) pair, e.g. a scorer-loop run's "
                        "cost.scorer_seconds / cost.pairs: adds each design's and full ranking's predicted scoring "
                        "time (pairs x users x S)")
    p.add_argument("--screen", action=argparse.BooleanOptionalAction, default=True,
                   help="stop a design after its first 5 repeats when each of them misses the target or their "
                        "relative RMSE is above 2.5x the target (default; "
                        "--no-screen: every design runs --repeats)")
    p.add_argument("--workers", type=int, metavar="N",
                   help="threads forecasting designs side by side (the same plan whatever N; default 2, at most "
                        "the CPUs available: more threads contend for Python's GIL; 1: one design at a time)")
    p.add_argument("--forecast-all", action="store_true",
                   help="forecast every design (default: designs costlier than one found to meet the target are "
                        "not forecast, since they cannot be the pick; the pick is the same either way)")
    _add_progress(p)
    p.set_defaults(func=run_plan)
    return p


def run_plan(args: argparse.Namespace) -> int:
    """Run the ``plan`` subcommand: print ``plan(...).format()``; returns 0 (bad input raises ValueError)."""
    from .planner import PlanExecution, plan

    pilot = None
    if args.pilot is not None:
        from .rank_files import read_rank_file

        pilot_n_default = args.pilot_n_items if args.pilot_n_items is not None else args.n_items
        try:
            data = read_rank_file(args.pilot, pilot_n_default, args.pilot_n_samples)
        except ValueError as exc:  # the reader names estimate's flags; plan's are --pilot-*
            raise ValueError(str(exc).replace("--n-samples", "--pilot-n-samples")) from None
        if data.popularity:  # as plan(pilot=<SampledRanks read from a popularity rank file>) refuses
            raise ValueError(f"--pilot: {args.pilot} holds popularity-sampled ranks (hh_s1, hh_s2 columns), which "
                             "carry no popularity-class counts, and the planner's popularity world is fitted on them: "
                             "plan popularity designs from Python with the pilot's SampledRanks "
                             "(plan(n_items, n_users, metric, target, pilot=sampled), docs/popularity.md), or give a "
                             "uniform pilot (fixed m or adaptive)")
        design = None
        if args.pilot_adaptive_top is not None and args.pilot_adaptive_max is None:
            raise ValueError("--pilot-adaptive-top: the pilot's continuation rule; give --pilot-adaptive-max too")
        if args.pilot_adaptive_max is not None:
            m0 = args.pilot_n_samples if args.pilot_n_samples is not None else int(data.n_samples.min())
            try:
                design = _sampling_design(m0, "binomial", args.pilot_adaptive_max, args.pilot_adaptive_top)
            except ValueError as exc:  # named as plan's flags
                raise ValueError(str(exc).replace("--", "--pilot-", 1)) from None
        pilot = data.sampled(design)
    elif (args.pilot_adaptive_max is not None or args.pilot_adaptive_top is not None
          or args.pilot_n_samples is not None or args.pilot_n_items is not None):
        raise ValueError("--pilot-*: given without --pilot")
    result = plan(
        args.n_items, args.n_users, args.metric, args.target_rel_error, pilot=pilot, designs=args.design,
        method=args.method, target_rel_halfwidth=args.target_rel_halfwidth, repeats=args.repeats, seed=args.seed,
        seconds_per_pair=args.seconds_per_pair,
        execution=PlanExecution(screen=args.screen, forecast_all=args.forecast_all, workers=args.workers,
                                progress=args.progress),
    )
    print(result.format())
    return 0


def _recbole_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="reco-sampled recbole",
        description="RecBole's run_recbole with the plugin's metrics registered (and RecBole 1.2.1 patched to run "
                    "on numpy 2, torch >= 2.6, pandas 3). Any other --key=value is a RecBole config override, "
                    "e.g. --epochs=2 --metrics=\"['Recall','CorrectedRecall']\" --rsp_m=100.",
    )
    p.add_argument("--model", "-m", default=None,
                   help="RecBole model name (default: the config files' model:, else BPR)")
    p.add_argument("--dataset", "-d", default=None,
                   help="dataset name (default: the config files' dataset:, else ml-100k)")
    p.add_argument("--config", action="append", default=[], help="YAML config file (repeatable)")
    p.add_argument("--nosave", action="store_true", help="do not save the trained model")
    return p


def recbole_target(model: str | None, dataset: str | None, config_files: list[str]) -> tuple[str, str]:
    """The model and dataset a ``recbole`` command runs: a flag when given, else the last config file that sets
    ``model:`` / ``dataset:`` (as RecBole reads them), else BPR on ml-100k. A file that cannot be read is named."""
    from_files: dict = {}
    if config_files:
        try:
            import yaml  # RecBole's own dependency (the 'recbole' extra)
        except ImportError as exc:
            raise ValueError(f"recbole: the RecBole adapter needs the 'recbole' extra ({exc})") from None
    for path in config_files:
        try:
            with open(path, encoding="utf-8") as fh:
                data = yaml.safe_load(fh) or {}
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(f"--config: cannot read {path!r} ({exc})") from None
        except yaml.YAMLError as exc:
            raise ValueError(f"--config: {path!r} is not valid YAML ({exc})") from None
        if not isinstance(data, dict):
            raise ValueError(f"--config: {path!r} must hold a mapping of RecBole keys, got {type(data).__name__}")
        from_files.update({k: data[k] for k in ("model", "dataset") if data.get(k) is not None})
    model = model or from_files.get("model") or "BPR"
    dataset = dataset or from_files.get("dataset") or "ml-100k"
    return str(model), str(dataset)


def _cmd_recbole(argv: list[str]) -> int:
    args, overrides = _recbole_parser().parse_known_args(argv)
    args.model, args.dataset = recbole_target(args.model, args.dataset, args.config)
    for item in overrides:
        if not item.startswith("--") or "=" not in item:
            raise ValueError(f"recbole: config overrides take the form --key=value, got {item!r}")
    try:
        from .adapters.recbole import run_recbole
    except ImportError as exc:
        raise ValueError(f"recbole: the RecBole adapter needs the 'recbole' extra ({exc})") from None
    config_dict = {}
    if args.dataset == "ml-100k" and not any(o.startswith("--data_path=") for o in overrides):
        from .datasets import ml100k_path
        import os

        # the copy inside the recbole wheel: RecBole would otherwise try to download it
        config_dict["data_path"] = os.path.dirname(os.path.dirname(ml100k_path()))
    # RecBole's Config reads --key=value overrides from sys.argv itself
    saved_argv = sys.argv
    sys.argv = [saved_argv[0]] + overrides
    try:
        result = run_recbole(model=args.model, dataset=args.dataset, config_file_list=args.config or None,
                             config_dict=config_dict, saved=not args.nosave)
    finally:
        sys.argv = saved_argv
    for split in ("best_valid_result", "test_result"):
        values = result.get(split) or {}
        print(f"{split}:")
        if values:
            from ._tables import format_table

            print("\n".join(format_table(None, ([f"  {key}", f" {float(value):.4f}"] for key, value in values.items()),
                                          formats=["<38", ""])))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="reco-sampled",
        description="Exact, sampled and corrected ranking metrics for recommenders.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    demo = sub.add_parser("demo", help="exact vs sampled metrics on the paper's toy example (Tables 1 and 2)")
    demo.add_argument("--n-samples", "-m", type=int, default=99, help="sampled irrelevant items per relevant item (default 99)")
    _add_sampling(demo)
    demo.set_defaults(func=_cmd_demo)

    rep = sub.add_parser("reproduce", help="the papers' experiments on real data: tables, plots and a report folder",
                         description="Train iALS, two item-kNNs and popularity on a leave-last-out split, rank exactly, "
                                     "and report exact vs sampled vs corrected metrics (Krichene & Rendle Tables 3-4, "
                                     "Figures 5-6; Li et al.'s mapping).")
    rep.add_argument("--data", help="user,item[,rating,timestamp] file (default: MovieLens 100k inside the recbole wheel)")
    rep.add_argument("--out", default="reports/reproduce", help="report folder (default reports/reproduce)")
    rep.add_argument("--n-samples", "-m", type=int, default=100, help="sampled items per relevant item (default 100)")
    rep.add_argument("--repeats", type=int, default=100, help="sampling runs for standard deviations and Table 4 (default 100)")
    rep.add_argument("--seed", type=int, default=0)
    _add_sampling(rep)
    rep.add_argument("--no-plots", action="store_true", help="skip the PNG plots")
    rep.add_argument("--quick", action="store_true", help="fewer values of m for Figure 6")
    rep.add_argument("--quiet", action="store_true", help="no stage lines and no progress bars")
    _add_progress(rep)
    rep.add_argument("--adaptive-max", type=int, metavar="M",
                     help="also sample adaptively (m doubling for positives ranked first, up to M): rows "
                          "'adaptive:mes' in Tables 3 and 4, with the cost"),
    rep.set_defaults(func=_cmd_reproduce)

    tab = sub.add_parser("table", help="print or save a correction table (one value per sampled rank 1..m+1)")
    tab.add_argument("metric", help="e.g. recall@10, ndcg@10, ap, auc")
    tab.add_argument("--n-items", type=int, required=True, help="candidates n (relevant item included)")
    tab.add_argument("--n-samples", "-m", type=int, required=True, help="sampled items m")
    tab.add_argument("--method", default=registry.DEFAULT_CORRECTION,
                     help=f"{', '.join(registry.names(family=('none', 'correction'), fits_distribution=False))} "
                          f"(the table's correction, default {registry.DEFAULT_CORRECTION}; a table is not an estimate: "
                          f"`estimate` runs {registry.DEFAULT_ESTIMATOR} by default)")
    tab.add_argument("--gamma", type=float, help="bias-variance trade-off of bv, in [0, 1] (default 0.1)")
    _add_sampling(tab)
    tab.add_argument("--prior", help="uniform (default) or beta:A (ls, cls, bv)")
    tab.add_argument("--rounding", choices=["floor", "linear"], help="rank_estimate rounding (default floor)")
    tab.add_argument("--out", help="write CSV here instead of printing")
    tab.set_defaults(func=_cmd_table)

    add_plan_parser(sub)

    est = sub.add_parser("estimate", help="estimate exact metrics from a file of sampled ranks or from NCF files",
                         description="FILE: one line per relevant item 'rank[,n_candidates[,n_samples]]'. "
                                     "Or NCF-style files (.test.rating, .test.negative) plus a 'user item score' file. "
                                     "A draw in Python, e.g. an external scorer loop's sampled_ranks_from_scorer(...), "
                                     "is written as such a file by "
                                     "reco_sampled_plugin.rank_files.write_rank_file(path, sampled); its first lines "
                                     "name the flags that read it back (adaptive: --n-samples M0 --adaptive-max CAP).",
                         epilog=_methods_epilog(registry.names()), formatter_class=_HelpFormatter)
    est.add_argument("file", nargs="?", help="rank file")
    est.add_argument("--n-items", type=int, help="candidates n when the file has no such column")
    est.add_argument("--n-samples", "-m", type=int, help="sampled items m when the file has no such column")
    est.add_argument("--metric", action="append",
                     help=f"metric (repeatable; default {' and '.join(_ESTIMATE_METRICS)}; popularity rank files: "
                          "auc too)")
    est.add_argument("--method", action="append", metavar="METHOD",
                     help=f"estimator (repeatable; default {', '.join(_default_methods())}, those that take the "
                          "design; popularity rank files: every estimator that takes them); the estimators are "
                          "listed below")
    est.add_argument("--stderr", action="store_true",
                     help="also print the standard error (sampling noise only: not what the sampled data cannot "
                          "identify at the top, which the 95%% interval includes)")
    est.add_argument("--option", action="append", metavar="NAME=VALUE", default=None,
                     help="an estimator option (repeatable), e.g. gamma=0.2 for bv, n_bootstrap=0 for mes; given to "
                          "every --method that takes it, refused where none does (the options are listed below)")
    _add_sampling(est, popularity="the file holds each positive's hh_s1, hh_s2 (sums of 1/q~ and 1/q~^2 over "
                                  "its beating draws), which a five-column file implies")
    est.add_argument("--adaptive-max", type=int, metavar="M",
                     help="the ranks come from adaptive sampling from --n-samples up to M (the file's m column: "
                          "each positive's final m); the estimators marked [adaptive] below")
    est.add_argument("--adaptive-top", type=int, metavar="T",
                     help="with --adaptive-max: the draws went on while a positive's sampled rank was at most T "
                          "(default 1: while first)")
    est.add_argument("--test-rating", help="NCF .test.rating file ('user item' per line)")
    est.add_argument("--test-negative", help="NCF .test.negative file ('(user,item) neg1 neg2 ...' per line)")
    est.add_argument("--scores", help="'user item score' lines for the NCF pairs")
    _add_progress(est)
    est.set_defaults(func=_cmd_estimate)

    sub.add_parser("recbole", help="RecBole's run_recbole with the plugin's metrics registered (see recbole --help)",
                   add_help=False)
    return parser


# errors that bad input (arguments, files, folders) ends in: one line on stderr and exit status 2, not a traceback
# (MemoryError: the last resort where a size passes every check and the machine still runs out: one line, not a
# traceback; every allocation that grows with n or m is bounded by _checks.MAX_ELEMENTS before it is made)
_USER_ERRORS = (ValueError, UnicodeDecodeError, OverflowError, FileNotFoundError, IsADirectoryError,
                NotADirectoryError, PermissionError, MemoryError)


def _message(exc: BaseException) -> str:
    """One line for a user error: an OS error as ``<path>: <reason>``."""
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{exc.filename}: {exc.strerror or exc}"
    if isinstance(exc, OverflowError):
        return f"a number is too large ({exc})"
    if isinstance(exc, MemoryError):
        return f"out of memory ({exc or 'no detail'}); use smaller sizes (n_items, n_samples) or fewer instances"
    if isinstance(exc, UnicodeDecodeError):
        return f"an input file is not UTF-8 text ({exc.reason} at byte {exc.start})"
    return str(exc)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    if argv and argv[0] == "recbole":
        try:
            code = _cmd_recbole(argv[1:])
            sys.stdout.flush()
            return code
        except _USER_ERRORS as exc:
            print(f"reco-sampled: error: {_message(exc)}", file=sys.stderr)
            return 2
        except BrokenPipeError:
            return _closed_pipe()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        _check_int_arguments(args)
        code = args.func(args)
        sys.stdout.flush()  # a short output waits in the buffer: its write, and a closed pipe's error, come here
        return code
    except _USER_ERRORS as exc:
        print(f"reco-sampled: error: {_message(exc)}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _closed_pipe()


def _closed_pipe() -> int:
    """The reader closed the pipe (``| head``): stop quietly, as command-line tools do; stdout points at the null
    device from here on, so that Python's flush at exit does not raise again."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
