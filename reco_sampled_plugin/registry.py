"""The estimator registry: one table, from which every list of methods in the package is derived.

Each :class:`Estimator` entry says what a method is (family, summary), what it takes (its options, with their
kinds and defaults), which sampling designs it supports (adaptive, without replacement, popularity), whether it
fits a rank distribution, and where its code lives (``compute``: ``"module:function"``, imported on first use, so
reading the table imports neither torch nor scipy: ``reco-sampled --help`` lists the methods for free).

Derived views (never kept by hand): :func:`names` (``ESTIMATORS``), :func:`method_options` (``METHOD_OPTIONS``),
``names(adaptive=True)`` (``ADAPTIVE_METHODS``), ``names(family=...)`` (the mapping, rank-distribution and
correction lists), :func:`recbole_choices` (the estimators each RecBole metric family runs, from ``rsp_estimators``),
the CLI's ``--method`` choices and help, the planner's and the report's lists, the docs' table (a test checks it).

The compute protocol (``estimators.estimate`` calls it after validating the options and building the histogram)::

    compute(spec: MetricSpec, hist: RankHistogram, *, method: str, sampling: str, options: dict)
        -> object with value, stderr, n_instances, details, flags

``options`` holds the method's own options (defaults filled in for the named ones: ``a``, ``gamma``, ``prior``,
``rounding``). A rank-distribution method also names its ``fitter`` (``rank_distribution`` dispatches on it).
A method that corrects popularity designs (``popularity=True``, family other than ``none``) also finds
``options["draws"]``: the per-positive statistics of the beating draws (``popularity.PopularityDraws``), which the
histogram cannot carry. ``metrics`` restricts the metric kinds a method estimates (``hh``: AUC only). Its output may
carry an ``identification`` (``_estimate.EstimatorOutput``): under popularity sampling ``estimate`` takes the interval
of the unresolved top from it (``pl_fit``), not from the uniform law.

Adding an estimator (docs/architecture.md): its module (the compute function), one :func:`register` call in
``_BUILTIN`` below (or at run time, for a user's own method), its row in docs/estimators.md, its test; the
contract test (tests/test_registry.py) then runs it on known histograms, refuses options it does not take and
checks every design it claims, and every entry point offers it.
"""

from __future__ import annotations

import dataclasses
import importlib
import keyword
import math
import re
from dataclasses import dataclass, field
from typing import Any, Callable, ClassVar, TypedDict

__all__ = [
    "FAMILIES",
    "OPTION_KINDS",
    "Option",
    "Estimator",
    "Method",
    "COMMON_OPTIONS",
    "method_class",
    "as_method",
    "register",
    "check_entry",
    "check_output",
    "unregister",
    "get",
    "entries",
    "names",
    "method_options",
    "fit_option_names",
    "module_views",
    "recbole_choices",
    "DEFAULT_ESTIMATOR",
    "DEFAULT_CORRECTION",
    "AUTO_CHOICES",
    "popularity_auto",
]

#: The families of estimators: how an estimate is made from the sampled-rank histogram.
FAMILIES = {
    "none": "no correction: the sampled metric itself (not an estimate of the full-catalogue one)",
    "correction": "a table of m + 1 corrected values per (n, m), looked up at each sampled rank (Krichene & Rendle)",
    "mapping": "sampled ranks mapped onto exact ranks, the metric averaged over each mapped interval (Li et al.)",
    "rank_distribution": "the distribution of exact ranks fitted by likelihood, the metric its expectation",
    "hansen_hurwitz": "each beating draw weighted by 1/q, its inclusion probability (Hansen-Hurwitz): unbiased for "
                      "metrics linear in the rank (AUC), under uniform and popularity sampling",
    "auto": "chooses a registered estimator per design and metric (AUTO_CHOICES), then runs it",
    "popularity_fit": "the distribution of exact ranks fitted by the likelihood of which drawn items beat each "
                      "positive, the items above it modelled as popularity-tilted (Plackett-Luce with weights w^beta); "
                      "every metric, under popularity and uniform sampling",
    "design_based": "the model's per-positive predictions corrected by the Horvitz-Thompson mean of their residuals "
                    "over a keyed random share of exactly ranked positives: unbiased whatever the model",
}

#: Kinds of option values; each is validated by the named helper of ``_options`` (or the module named).
OPTION_KINDS = {
    "fraction": "a number in [0, 1]",
    "positive_float": "a finite number > 0",
    "nonnegative_float": "a finite number >= 0, or None for the default",
    "count": "an integer >= 1",
    "count0": "an integer >= 0, or None for the default",
    "bootstrap": "an integer in 0..2000 (replicates), or None for the default",
    "iterations": "an integer in 1..1000000",
    "spline_df": "an integer in 4..4096 (cubic B-spline coefficients), at most the rank grid's cells",
    "seed": "an integer in 0..2**63 - 1",
    "bool": "True or False",
    "choice": "one of the listed values",
    "prior": "a prior: 'uniform', ('beta', a), a vector over ranks, a callable, or a Prior",
    "beta_shape": "the Beta shape a, a number in [1e-6, 1e6]",
    "base_measure": "a number in [0, 2]",
}


def _code(ref: str) -> Any:
    """The object named by ``"module:name"`` (a module relative to this package when it starts with a dot),
    imported on first use."""
    module, _, obj = ref.partition(":")
    return getattr(importlib.import_module(module if not module.startswith(".") else __package__ + module), obj)


@dataclass(frozen=True)
class Option:
    """One option of an estimator: its name, kind (:data:`OPTION_KINDS`), default and a one-line summary.

    ``named``: a named keyword of ``estimate()`` (``a``, ``gamma``, ``prior``, ``rounding``), whose None means the
    default; the other options travel in ``**options``."""

    name: str
    kind: str
    default: Any = None
    summary: str = ""
    choices: tuple = ()
    named: bool = False

    def __post_init__(self) -> None:
        _check_identifier(self.name, "name", "an option")
        if not isinstance(self.kind, str) or self.kind not in OPTION_KINDS:
            raise ValueError(f"kind: unknown option kind {self.kind!r} of option {self.name!r}; use one of "
                             f"{tuple(OPTION_KINDS)}")
        _check_text(self.summary, "summary", self.name)
        if not isinstance(self.choices, tuple) or (self.kind == "choice") != bool(self.choices):
            raise ValueError(f"choices: option {self.name!r} of kind {self.kind!r} "
                             + ("needs a non-empty tuple of its values" if self.kind == "choice" else
                                "takes no choices (only kind 'choice' does)") + f", got {self.choices!r}")
        object.__setattr__(self, "named", _check_bool(self.named, "named"))

    def check_default(self) -> None:
        """Raise a ValueError naming the option where its default is not a value of its kind (None passes where it
        means the default: the kinds that allow None, and ``named`` options)."""
        if self.default is None and self.named:
            return
        try:
            self.check(self.default)
        except ValueError as exc:
            raise ValueError(f"{self.name}: the default {self.default!r} is not a value of its kind "
                             f"{self.kind!r} ({OPTION_KINDS[self.kind]}): {exc}") from None

    def check(self, value: Any) -> Any:
        """``value`` validated and normalised (a ValueError naming the option otherwise); None is the default
        where the kind allows it."""
        from . import _options as o

        k, n = self.kind, self.name
        if value is None and k in ("nonnegative_float", "count0", "bootstrap", "prior", "beta_shape"):
            return None
        if k == "fraction":
            return o.check_fraction(value, n)
        if k == "positive_float":
            return o.check_positive_float(value, n)
        if k == "nonnegative_float":
            return o.check_nonnegative_float(value, n)
        if k == "count":
            return o.check_count(value, n, 1)
        if k == "count0":
            return o.check_count(value, n, 0)
        if k == "bootstrap":
            return o.check_count(value, n, 0, o.MAX_BOOTSTRAP)
        if k == "iterations":
            return o.check_count(value, n, 1, o.MAX_ITERATIONS)
        if k == "spline_df":
            return o.check_count(value, n, 4, o.MAX_SPLINE_DF)
        if k == "seed":
            return o.check_seed(value, n)
        if k == "bool":
            return o.check_bool(value, n)
        if k == "choice":
            return o.check_choice(value, self.choices, n)
        if k == "prior":
            from .priors import as_prior

            as_prior(value)  # the type and values; a vector's length is checked against n at compute
            return value
        if k == "beta_shape":
            return o.check_beta_shape(value, n)
        if k == "base_measure":
            return o.check_base_measure(value)
        raise AssertionError(k)  # pragma: no cover - kinds are checked at construction


@dataclass(frozen=True)
class Estimator:
    """One registered estimator (module docstring).

    Attributes:
        name: the method name users pass (``method="mes"``, ``rsp_estimators: [bv]``, ``--method cls``).
        family: a key of :data:`FAMILIES`.
        summary: one line for docs and ``--help``.
        compute: ``"module:function"`` (relative to the package) or a callable (the compute protocol).
        options: its :class:`Option` s.
        adaptive: takes adaptive designs (the final (n, M, r~) of each positive).
        without_replacement: takes the hypergeometric law of draws without replacement.
        popularity: takes popularity-sampled designs.
        fits_distribution: fits a rank distribution (its fit options apply; the planner asks it for no bootstrap).
        exact_groups: reads the exact groups of ``exact_at_cap`` designs (completed positives, ``RankHistogram.exact``)
            as point masses at their exact ranks; an estimator without it reads every positive's sampled rank r~.
        fitter: rank-distribution methods: ``"module:object"`` of the fitter ``rank_distribution`` dispatches to
            (their options include the fit options, :func:`fit_option_names`: the method object is the options
            object of :func:`~reco_sampled_plugin.rank_distribution.fit_rank_distribution`).
        reference: the paper and equations.
        metrics: the metric kinds it estimates (``metric_names.METRIC_KINDS`` keys), None for every one;
            ``estimate`` refuses the others, naming ``metric``.
        class_counts: reads each positive's popularity-class counts (``_popularity.PopularityStats.profile``,
            ``beat_bins``, ``miss_bins``) under popularity designs, which rank files do not carry (there it refuses).
        exact_share: reads the exact share of a design (``SamplingDesign(m, exact_share=...)``): :func:`names`
            lists it for a design only where the design carries one (on a sample without, it gives ``auto``'s
            estimate, flagged ``no_exact_share``).
    """

    name: str
    family: str
    summary: str
    compute: str | Callable
    options: tuple[Option, ...] = ()
    adaptive: bool = False
    without_replacement: bool = True
    popularity: bool = False
    fits_distribution: bool = False
    exact_groups: bool = False
    fitter: str | Callable | None = None
    reference: str = ""
    metrics: tuple[str, ...] | None = None
    class_counts: bool = False
    exact_share: bool = False
    _resolved: dict = field(default_factory=dict, init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        _check_identifier(self.name, "name", "an estimator")
        _check_text(self.summary, "summary", self.name, empty=False)
        _check_text(self.reference, "reference", self.name)
        _check_reference(self.compute, "compute", self.name)
        if self.fitter is not None:
            _check_reference(self.fitter, "fitter", self.name)
        if isinstance(self.options, list):
            object.__setattr__(self, "options", tuple(self.options))
        if not isinstance(self.options, tuple) or not all(isinstance(o, Option) for o in self.options):
            bad = self.options if not isinstance(self.options, tuple) else \
                next(o for o in self.options if not isinstance(o, Option))
            raise ValueError(f"options: estimator {self.name!r} takes a tuple of registry.Option, got {bad!r}")
        seen = [o.name for o in self.options]
        twice = sorted({x for x in seen if seen.count(x) > 1})
        if twice:
            raise ValueError(f"options: estimator {self.name!r} lists the option {twice[0]!r} twice")
        for flag in ("adaptive", "without_replacement", "popularity", "fits_distribution", "exact_groups",
                     "class_counts", "exact_share"):
            object.__setattr__(self, flag, _check_bool(getattr(self, flag), flag))
        if not isinstance(self.family, str) or self.family not in FAMILIES:
            raise ValueError(f"family: unknown estimator family {self.family!r}; use one of {tuple(FAMILIES)}")
        if self.family == "rank_distribution" and self.fitter is None:
            raise ValueError(f"fitter: the rank-distribution method {self.name!r} needs a fitter")
        if self.family == "rank_distribution" and not set(fit_option_names()) <= set(self.option_names):
            raise ValueError(f"options: the rank-distribution method {self.name!r} takes the fit options "
                             f"{fit_option_names()} (its method object is the fit's options object)")
        if self.metrics is not None and (not isinstance(self.metrics, tuple) or not self.metrics
                                         or not all(isinstance(k, str) for k in self.metrics)):
            raise ValueError(f"metrics: expected a non-empty tuple of metric kinds such as ('auc',) or None, "
                             f"got {self.metrics!r}")

    def takes_metric(self, kind: str) -> bool:
        """Whether it estimates metrics of ``kind`` (a ``MetricSpec.kind`` such as ``"auc"``, ``"ndcg"``)."""
        return self.metrics is None or kind in self.metrics

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(o.name for o in self.options)

    def option(self, name: str) -> Option | None:
        for o in self.options:
            if o.name == name:
                return o
        return None

    def _load(self, attr: str) -> Any:
        target = getattr(self, attr)
        if callable(target):
            return target
        if attr not in self._resolved:
            self._resolved[attr] = _code(target)
        return self._resolved[attr]

    def compute_function(self) -> Callable:
        return self._load("compute")

    def fitter_object(self) -> Any:
        return self._load("fitter")

    def supports(self, design: Any) -> bool:
        """Whether this estimator takes ``design`` (a :class:`~reco_sampled_plugin.design.SamplingDesign`)."""
        if design.adaptive_max is not None and not self.adaptive:
            return False
        if design.popularity is not None and not self.popularity:
            return False
        if not design.replacement and not self.without_replacement:
            return False
        if design.popularity is not None and not design.replacement and self.family != "none":
            return False  # popularity draws without replacement keep no per-draw statistics: nothing corrects them
        return True


#: name -> the method class (its ``entry`` the :class:`Estimator` record), in table order
_REGISTRY: dict[str, type["Method"]] = {}

#: The options every method takes besides its own (fields of :class:`Method`).
COMMON_OPTIONS = ("max_rel_n_spread", "top_shape")


@dataclass(frozen=True, init=False)
class Method:
    """A frozen options object of one estimator: ``estimate(metric, sample, method=Bv(gamma=0.2))``.

    Each registered estimator has one subclass (``Bv``, ``Mes``, ``Gmod``, ``Auto``, ...: :func:`method_class`),
    built from its registry entry (the class attribute ``entry``, an :class:`Estimator`): its fields are the
    entry's options (keyword-only, defaults from the table) plus the options every method takes:

    - ``max_rel_n_spread``: None (a table or likelihood per distinct candidate count n) or s > 0 (counts moved
      onto a geometric grid of n whose consecutive nodes lie within a factor 1 + s, flagged ``pooled_n``).
    - ``top_shape``: the shape assumption of the identified interval (``identification.TopShape``; None: the
      default shape).

    Every value is checked once, at construction, by its option's kind (:data:`OPTION_KINDS`; a ValueError naming
    the option: an option the method does not take, a NaN ``tol``, ``gamma`` outside [0, 1]...). A method name
    given as a string means its class with the defaults (:func:`as_method`)."""

    entry: ClassVar[Estimator]
    max_rel_n_spread: float | None = None
    top_shape: Any = None

    def __init__(self, **options: Any) -> None:
        entry = getattr(type(self), "entry", None)
        if entry is None:
            raise ValueError("Method: the base class has no estimator; use a registered class such as Bv or Mes "
                             "(registry.method_class(name))")
        allowed = entry.option_names + COMMON_OPTIONS
        unknown = [k for k in options if k not in allowed]
        if unknown:
            key, own = unknown[0], entry.option_names
            users = [e.name for e in entries() if key in e.option_names]
            raise ValueError(f"{key}: method {entry.name!r} does not use it; "
                             + (f"allowed options: {', '.join(own)}" if own else "it takes no options of its own")
                             + f" (every method takes {', '.join(COMMON_OPTIONS)})"
                             + (f"; {key} is an option of {', '.join(users)}" if users else ""))
        for f in dataclasses.fields(self):
            object.__setattr__(self, f.name, options.get(f.name, f.default))
        self.__post_init__()

    def __post_init__(self) -> None:
        entry = type(self).entry
        for o in entry.options:
            value = getattr(self, o.name)
            object.__setattr__(self, o.name, o.default if value is None and o.named else o.check(value))
        # the checks below live with the code they guard and are named by reference, as compute functions are:
        # the table imports nothing heavy, and no module that reads the table is imported back by it
        if self.max_rel_n_spread is not None:
            object.__setattr__(self, "max_rel_n_spread", _code("._rank_hist:check_spread")(self.max_rel_n_spread))
        if self.top_shape is not None and not isinstance(self.top_shape, _code(".identification:TopShape")):
            raise ValueError(f"top_shape: expected an identification.TopShape, got {type(self.top_shape).__name__}")

    @property
    def name(self) -> str:
        """The registered name (``"bv"``)."""
        return type(self).entry.name

    def options(self) -> dict[str, Any]:
        """The method's own options (not the common ones) as the compute function reads them."""
        return {o.name: getattr(self, o.name) for o in type(self).entry.options}

    def given(self) -> dict[str, Any]:
        """The options (common ones included) whose value differs from the default."""
        out = {}
        for f in dataclasses.fields(self):
            v = getattr(self, f.name)
            if v is not f.default and not _same(v, f.default):
                out[f.name] = v
        return out


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # arrays: ambiguous truth value
        return False


def _class_name(name: str) -> str:
    """``"bv_mle"`` -> ``"BvMle"``; ``"none"`` -> ``"Uncorrected"`` (``None`` is Python's)."""
    if name == "none":
        return "Uncorrected"
    return "".join(part[:1].upper() + part[1:] for part in name.replace("-", "_").split("_")) or "Method_"


def _make_class(entry: Estimator) -> type[Method]:
    """The method class of ``entry``: a frozen dataclass whose fields are its options (the table's defaults)."""
    fields = [(o.name, Any, field(default=o.default)) for o in entry.options]
    doc = f"Options of the estimator {entry.name!r} ({entry.family}): {entry.summary}."
    if entry.options:
        doc += "\n\nOptions: " + "; ".join(f"``{o.name}`` ({OPTION_KINDS[o.kind]}, default {o.default!r}): {o.summary}"
                                          for o in entry.options) + "."
    cls = dataclasses.make_dataclass(_class_name(entry.name), fields, bases=(Method,), frozen=True, init=False,
                                     namespace={"entry": entry, "__doc__": doc})
    cls.__module__ = __name__
    return cls


def method_class(name: Any) -> type[Method]:
    """The class of the registered estimator ``name`` (``method_class("bv")`` is :data:`Bv`); a ValueError naming
    ``method`` for an unknown name."""
    try:
        return _REGISTRY[name]
    except (KeyError, TypeError):
        raise ValueError(f"method: unknown estimator {name!r}; use one of {names()}") from None


def as_method(method: Any) -> Method:
    """``method`` as a method object: a registered name means its class with the defaults; an object of a method
    class is itself (whatever the registry holds now: the object carries its entry)."""
    if isinstance(method, Method):
        return method
    if isinstance(method, str):
        return method_class(method)()
    if isinstance(method, type) and issubclass(method, Method) and method is not Method:
        return method()
    raise ValueError(f"method: expected a registered name such as 'auto' or a method object such as Bv(gamma=0.1), "
                     f"got {type(method).__name__}")


def _check_bool(x: Any, name: str) -> bool:
    """:func:`~reco_sampled_plugin._options.check_bool`'s rule (True or False, numpy bools too; never "False", 0 or
    1) without importing numpy: the registry is read by ``reco-sampled --help``, which imports neither numpy nor torch."""
    if type(x) is bool or (type(x).__module__ == "numpy" and type(x).__name__ in ("bool_", "bool")):
        return bool(x)
    raise ValueError(f"{name}: expected True or False, got {x!r}")


_NAME = re.compile(r"[a-z][a-z0-9_]*\Z")
_REFERENCE = re.compile(r"\.?[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*\Z")
#: Names a method object uses itself: no option may take them.
_RESERVED = COMMON_OPTIONS + ("entry", "name", "options", "given")


def _check_identifier(x: Any, what: str, of: str) -> None:
    """A method or option name: lower-case letters, digits and ``_``, a letter first (what ``--method``, RecBole's
    ``rsp_estimators`` and a keyword argument can carry); no Python keyword."""
    if not isinstance(x, str) or not _NAME.match(x) or keyword.iskeyword(x):
        raise ValueError(f"{what}: {of} name is lower-case letters, digits and '_', a letter first, and no Python "
                         f"keyword (e.g. 'my_method'), got {x!r}")


def _check_text(x: Any, what: str, owner: str, empty: bool = True) -> None:
    """A one-line text (summary, reference) of ``owner``."""
    if not isinstance(x, str) or "\n" in x or (not empty and not x.strip()):
        raise ValueError(f"{what}: {owner!r} needs {'a' if empty else 'a non-empty'} one-line string, got {x!r}")


def _check_reference(x: Any, what: str, owner: str) -> None:
    """``compute`` / ``fitter``: a callable or ``"module:name"`` (module relative to the package when it starts
    with a dot); its target is imported by :func:`register`."""
    if not callable(x) and not (isinstance(x, str) and _REFERENCE.match(x)):
        raise ValueError(f"{what}: estimator {owner!r} needs a callable or a 'module:name' reference such as "
                         f"'.corrections:estimate_by_table' or 'mypackage.mymodule:compute', got {x!r}")


def _resolved(entry: Estimator, attr: str) -> Any:
    """The target of ``entry.<attr>`` (``compute`` or ``fitter``), imported now: a ValueError naming ``attr`` where
    the module or the name does not exist."""
    ref = getattr(entry, attr)
    if callable(ref):
        return ref
    try:
        return _code(ref)
    except ImportError as exc:
        raise ValueError(f"{attr}: estimator {entry.name!r} names {ref!r}, whose module cannot be imported ({exc})") from None
    except AttributeError:
        raise ValueError(f"{attr}: estimator {entry.name!r} names {ref!r}, which its module does not define") from None


def check_entry(entry: Estimator) -> None:
    """What :func:`register` checks beyond the entry's construction: its ``compute`` is a function taking the
    compute protocol's arguments, its ``fitter`` (rank-distribution methods) has ``fit``, every option's default is
    a value of its kind, its metric kinds exist. A ValueError names the attribute."""
    import inspect

    fn = _resolved(entry, "compute")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        raise ValueError(f"compute: estimator {entry.name!r}: {fn!r} is not a function") from None
    try:
        signature.bind(None, None, method=entry.name, sampling="binomial", options={})
    except TypeError as exc:
        raise ValueError(f"compute: estimator {entry.name!r}: {getattr(fn, '__name__', fn)!r} does not take the compute "
                         "protocol's arguments (spec, hist, *, method, sampling, options): " + str(exc)) from None
    if entry.fitter is not None and not callable(getattr(_resolved(entry, "fitter"), "fit", None)):
        raise ValueError(f"fitter: estimator {entry.name!r}: {entry.fitter!r} has no fit method (rank_distribution's "
                         "fitters: EM_FITTER, MES_FITTER, G_FITTER)")
    for o in entry.options:
        o.check_default()
    if entry.metrics is not None:
        from .metric_names import METRIC_KINDS

        unknown = [k for k in entry.metrics if k not in METRIC_KINDS]
        if unknown:
            raise ValueError(f"metrics: estimator {entry.name!r}: unknown metric kind {unknown[0]!r}; use those of "
                             f"{tuple(METRIC_KINDS)}")


def register(entry: Estimator, *, replace: bool = False) -> Estimator:
    """Add ``entry`` to the registry (every entry point offers it from then on); ``replace`` to redefine. Its
    method class is built from it (:func:`method_class`; its fields are the entry's options). Checked first
    (:func:`check_entry`: its compute function and fitter are imported and must take the protocol, its options'
    defaults must be values of their kinds), so a bad entry is refused here, never later elsewhere."""
    if not isinstance(entry, Estimator):
        raise ValueError(f"entry: expected a registry.Estimator, got {type(entry).__name__}")
    replace = _check_bool(replace, "replace")
    if not any(entry is b for b in _BUILTIN):  # the built-in table is checked by its tests (read without importing)
        check_entry(entry)
    if entry.name in _REGISTRY and not replace:
        raise ValueError(f"name: estimator {entry.name!r} is registered already (replace=True to redefine it)")
    clash = [o.name for o in entry.options if o.name in _RESERVED]
    if clash:
        raise ValueError(f"options: {clash[0]!r} is reserved (every method takes {', '.join(COMMON_OPTIONS)})")
    _REGISTRY[entry.name] = _make_class(entry)
    return entry


def unregister(name: str) -> None:
    """Remove a registered estimator (built-in ones too: meant for tests and for replacing a method); a name not
    registered is a no-op, one that is not a string a ValueError naming ``name``."""
    if not isinstance(name, str):
        raise ValueError(f"name: expected an estimator's name (a string such as 'bv'), got {type(name).__name__}")
    _REGISTRY.pop(name, None)


def get(name: Any) -> Estimator:
    """The entry of ``name``, or a ValueError naming ``method`` and listing the registered estimators."""
    if isinstance(name, Method):
        return type(name).entry
    return method_class(name).entry


def entries() -> tuple[Estimator, ...]:
    return tuple(c.entry for c in _REGISTRY.values())


def names(*, family: str | tuple[str, ...] | None = None, adaptive: bool | None = None,
          fits_distribution: bool | None = None, design: Any = None, metric: Any = None) -> tuple[str, ...]:
    """Registered method names in table order, optionally only one ``family`` (or several), those that take
    adaptive designs (or not), those that fit a distribution (or not), those that support ``design``, or those
    that estimate ``metric`` (a name such as ``"ndcg@10"`` or a kind such as ``"auc"``)."""
    kind: Any = None if metric is None else getattr(metric, "kind", None) or _metric_kind(metric)
    fams = _check_families(family)
    adaptive = None if adaptive is None else _check_bool(adaptive, "adaptive")
    fits_distribution = None if fits_distribution is None else _check_bool(fits_distribution, "fits_distribution")
    if design is not None:
        _check_design(design)
    out = []
    for e in entries():
        if fams is not None and e.family not in fams:
            continue
        if adaptive is not None and e.adaptive != adaptive:
            continue
        if fits_distribution is not None and e.fits_distribution != fits_distribution:
            continue
        if design is not None and (not e.supports(design)
                                   or e.exact_share and getattr(design, "exact_share", None) is None):
            continue
        if metric is not None and not e.takes_metric(kind):
            continue
        out.append(e.name)
    return tuple(out)


def _check_families(family: Any) -> tuple[str, ...] | None:
    """``names``' ``family`` filter as a tuple: None, a key of :data:`FAMILIES` or a tuple / list of them (a
    ValueError naming ``family`` otherwise: a misspelt family would silently list nothing)."""
    if family is None:
        return None
    fams = (family,) if isinstance(family, str) else family
    if not isinstance(fams, (tuple, list)) or not fams or any(not isinstance(f, str) or f not in FAMILIES for f in fams):
        raise ValueError(f"family: expected one of {tuple(FAMILIES)} or a tuple of them, got {family!r}")
    return tuple(fams)


def _check_design(design: Any) -> None:
    """A ``design`` filter: a :class:`~reco_sampled_plugin.design.SamplingDesign` (a ValueError naming ``design``)."""
    if not isinstance(design, _code(".design:SamplingDesign")):
        raise ValueError(f"design: expected a SamplingDesign (SamplingDesign(m), SamplingDesign(m, popularity=w), "
                         f"...), got {type(design).__name__}")


def _real_number(x: Any) -> bool:
    """A real number (Python, numpy or one-element torch), never a bool, a str or an array of several."""
    if isinstance(x, (bool, str, bytes)) or "bool" in str(getattr(x, "dtype", "")) or bool(getattr(x, "ndim", 0)):
        return False
    try:
        float(x)
    except (TypeError, ValueError, RuntimeError):
        return False
    return not isinstance(x, complex)


def check_output(name: str, res: Any) -> None:
    """What the compute function of estimator ``name`` returned, checked before an ``Estimate`` is built from it
    (a ValueError naming ``compute`` and the estimator): an object with ``value`` (a finite real number),
    ``stderr`` (None, or a real number >= 0: inf allowed, NaN only for at most one instance), ``n_instances`` (a
    finite number >= 0), ``details`` (a dict), ``flags`` (a tuple or list of strings) and, if any,
    ``identification`` (an ``interval(level)`` whose ``lo`` and ``hi`` are ordered real numbers, and a
    ``metric_range``). The estimate's own interval then holds its value (the hull of the sampling interval around
    it and the identified one)."""
    where = f"compute: estimator {name!r} returned"
    if not all(hasattr(res, a) for a in ("value", "stderr", "n_instances", "details", "flags")):
        raise ValueError(f"{where} {type(res).__name__}, not an object with value, stderr, n_instances, details and "
                         "flags (_estimate.EstimatorOutput)")
    value, se, n = res.value, res.stderr, res.n_instances
    if not _real_number(value) or not math.isfinite(float(value)):
        raise ValueError(f"{where} the value {value!r}: expected a finite real number")
    if not _real_number(n) or not math.isfinite(float(n)) or float(n) < 0:
        raise ValueError(f"{where} n_instances {n!r}: expected a finite number >= 0")
    if se is not None and (not _real_number(se) or float(se) < 0
                           or (math.isnan(float(se)) and float(n) > 1)):
        raise ValueError(f"{where} the standard error {se!r}: expected None or a number >= 0 (NaN only for at most "
                         f"one instance; n_instances = {float(n):g})")
    if not isinstance(res.details, dict):
        raise ValueError(f"{where} details of type {type(res.details).__name__}: expected a dict")
    flags = res.flags
    if not isinstance(flags, (tuple, list)) or not all(isinstance(f, str) for f in flags):
        raise ValueError(f"{where} flags {flags!r}: expected a tuple of flag names")
    twin = res.details.get("twin_gap")
    if twin is not None and (not isinstance(twin, (tuple, list)) or len(twin) != 2
                             or not all(_real_number(g) and 0 <= float(g) < math.inf for g in twin)):
        raise ValueError(f"{where} details['twin_gap'] {twin!r}: expected two finite numbers >= 0 (down, up)")
    ident = getattr(res, "identification", None)
    if ident is not None:
        try:
            iv = ident.interval(0.95)
            lo, hi, _ = iv.lo, iv.hi, ident.metric_range
        except (AttributeError, TypeError, ValueError) as exc:
            raise ValueError(f"{where} an identification without a usable interval(level) with lo and hi, or without "
                             f"metric_range ({exc})") from None
        if not (_real_number(lo) and _real_number(hi)) or not float(lo) <= float(hi):
            raise ValueError(f"{where} an identified interval ({lo!r}, {hi!r}): expected ordered real numbers")


def _metric_kind(name: str) -> str:
    """The kind of a metric name (``"mrr"`` -> ``"rr"``), read from ``metric_names`` when the package is loaded; the
    name itself where it is not (``registry.py`` read alone, as ``reco-sampled --help`` may)."""
    try:
        from .metric_names import METRIC_KINDS, parse_metric
    except ImportError:  # pragma: no cover - registry.py loaded outside the package
        return name
    if name in METRIC_KINDS:  # a kind ("hit", which as a name needs a cut-off)
        return name
    return parse_metric(name).kind


def method_options() -> dict[str, tuple[str, ...]]:
    """{method: the names of the options it takes} (``estimators.METHOD_OPTIONS``)."""
    return {e.name: e.option_names for e in entries()}


#: ``diff``'s choices of lambda (eq. 1 of ``_design_based``: 1, or PPI++'s variance-optimal value clipped to [0, 1])
#: and its default: module constants, so that a registry entry replaced or removed cannot change them.
DIFF_COEFS: tuple[str, ...] = ("one", "tuned")
DIFF_COEF = "one"

def fit_option_names() -> tuple[str, ...]:
    """The options of the rank-distribution fit shared by every fitting method (the common fit options)."""
    return tuple(o.name for o in _FIT_OPTIONS)


def module_views(module: str, **views: dict[str, Any]) -> Callable[[str], tuple[str, ...]]:
    """A module ``__getattr__`` serving live views of the table: ``views`` maps an attribute name to the filters
    of :func:`names` it lists (``RANK_DISTRIBUTION_METHODS={"family": "rank_distribution"}``), so an estimator
    registered later appears in it."""

    def __getattr__(name: str) -> tuple[str, ...]:
        if name in views:
            return names(**views[name])
        raise AttributeError(f"module {module!r} has no attribute {name!r}")

    return __getattr__


def recbole_choices(family: str) -> tuple[str, ...]:
    """The estimators a RecBole metric family runs (the one of them listed in ``rsp_estimators``): ``"corrected"``
    (``Corrected*``: ``auto``, the default, the ``none`` and ``correction`` families, ``bv_mle`` included, and the
    per-positive ``hansen_hurwitz`` ``hh``), ``"mapped"`` (``Mapped*``: the mappings) or ``"rankdist"``
    (``RankDist*``: ``auto`` and the rank-distribution fits)."""
    if family == "corrected":
        return names(family=("auto", "none", "correction", "hansen_hurwitz"))
    if family == "mapped":
        return names(family="mapping")
    if family == "rankdist":
        return names(family=("auto", "rank_distribution"))
    raise ValueError(f"family: no RecBole metric family {family!r}; use 'corrected', 'mapped' or 'rankdist'")


# ------------------------------------------------------------------------------------------------ the table
_FIT_OPTIONS = (
    Option("n_bootstrap", "bootstrap", None, "bootstrap replicates of the fit (default 32 for mle, 16 for mes and gmod; 0: none)"),
    Option("seed", "seed", 0, "seed of the bootstrap"),
    Option("tol", "positive_float", 1e-7, "stopping tolerance (log-likelihood gain per positive; L-BFGS-B ftol)"),
    Option("max_iter", "iterations", 5000, "iteration cap (flag not_converged when reached)"),
    Option("max_groups", "count", 16, "distinct (n, m) groups beyond which n is pooled into quantile bins"),
    Option("delta", "positive_float", 0.05, "relative width of the rank grid's cells"),
    Option("kappa", "positive_float", 0.25, "grid refinement inside the first sampled bin"),
    Option("trace", "bool", False, "keep the per-iteration objective"),
)
_GAMMA = Option("gamma", "fraction", 0.1, "bias-variance weight (eq. 25)", named=True)
_PRIOR = Option("prior", "prior", None, "prior over exact ranks (default uniform)", named=True)

_BUILTIN = (
    Estimator("linear", "mapping", "Li et al. linear mapping f(k) = (k - 1)(N - 1)/(n - 1) + 1",
              ".mapping:estimate_by_mapping", reference="Li, Jin et al. KDD 2020, eq. 9"),
    Estimator("bound", "mapping", "Li et al. bound mapping (rounded linear)", ".mapping:estimate_by_mapping",
              reference="Li, Jin et al. KDD 2020, eq. 13"),
    Estimator("beta", "mapping", "Li et al. Beta mapping with a given shape a (a = 1: eq. 18)",
              ".mapping:estimate_by_mapping",
              options=(Option("a", "beta_shape", None, "the Beta shape a in [1e-6, 1e6] (required)", named=True),),
              reference="Li, Jin et al. KDD 2020, eq. 16-18"),
    Estimator("beta_fit", "mapping", "Li et al. Beta mapping with a fitted on these sampled ranks",
              ".mapping:estimate_by_mapping",
              options=(Option("a", "beta_shape", None, "the fit's starting value", named=True),),
              reference="Li, Jin et al. KDD 2020, eq. 19"),
    Estimator("mle", "rank_distribution", "rank distribution by EM (NPMLE on a log grid), then sum_R P(R) M(R)",
              ".rank_distribution:estimate_by_fit", options=_FIT_OPTIONS, adaptive=True, fits_distribution=True,
              exact_groups=True, fitter=".rank_distribution:EM_FITTER", reference="Jin et al. AAAI 2021"),
    Estimator("mes", "rank_distribution", "maximum-entropy-regularised rank distribution (auto's choice where the top is unresolved)",
              ".rank_distribution:estimate_by_fit",
              options=_FIT_OPTIONS + (
                  Option("lam", "nonnegative_float", None, "entropy weight (default 10 / #positives)"),
                  Option("beta", "base_measure", 0.0, "base measure r^-beta of the entropy (0: uniform)"),
              ), adaptive=True, fits_distribution=True, exact_groups=True, fitter=".rank_distribution:MES_FITTER",
              reference="Jin et al. AAAI 2021 (MES)"),
    Estimator("gmod", "rank_distribution", "g-modelling: log P(R) a penalised B-spline in log R",
              ".rank_distribution:estimate_by_fit",
              options=_FIT_OPTIONS + (
                  Option("df", "spline_df", 10, "B-spline coefficients of log P(R) on the log-rank scale (>= 4)"),
                  Option("penalty", "nonnegative_float", 1.0, "weight of the coefficients' squared second differences"),
              ), adaptive=True, fits_distribution=True, exact_groups=True, fitter=".rank_distribution:G_FITTER",
              reference="Efron, Biometrika 2016 (g-modelling)"),
    Estimator("auto", "auto", "the default: gmod where the design resolves the top (adaptive, or K >= b), else mes; AUC at a fixed m: none; "
              "popularity designs: hh for AUC, pl_fit for the others",
              "._auto:estimate_auto", options=_FIT_OPTIONS, adaptive=True, popularity=True, fits_distribution=True,
              exact_groups=True,
              reference="docs/estimators.md, 'The defaults, and why'"),
    Estimator("none", "none", "the uncorrected sampled metric", ".corrections:estimate_by_table", adaptive=True,
              popularity=True, reference="Krichene & Rendle KDD 2020, eq. 4"),
    Estimator("rank_estimate", "correction", "Krichene & Rendle's rank estimate 1 + (n - 1)(r~ - 1)/m",
              ".corrections:estimate_by_table",
              options=(Option("rounding", "choice", "floor", "rounding of the estimated rank", ("floor", "linear"),
                              named=True),),
              reference="Krichene & Rendle KDD 2020, eq. 20"),
    Estimator("ls", "correction", "minimal-bias least squares", ".corrections:estimate_by_table", options=(_PRIOR,),
              reference="Krichene & Rendle KDD 2020, eq. 21-22"),
    Estimator("cls", "correction", "monotone constrained least squares", ".corrections:estimate_by_table",
              options=(_PRIOR,), reference="Krichene & Rendle KDD 2020, eq. 23"),
    Estimator("bv", "correction", "bias-variance trade-off with gamma and prior", ".corrections:estimate_by_table",
              options=(_GAMMA, _PRIOR), reference="Krichene & Rendle KDD 2020, eq. 24-25"),
    Estimator("bv_mle", "correction", "bv with its prior estimated by mle on the same sampled ranks",
              ".corrections:estimate_by_fitted_prior", options=(_GAMMA,) + _FIT_OPTIONS, fits_distribution=True,
              reference="Krichene & Rendle eq. 25 with Jin et al.'s mle prior"),
    Estimator("hh", "hansen_hurwitz", "Hansen-Hurwitz: AUC (and the mean rank in details) unbiased under uniform "
              "and popularity sampling, beating draws weighted by 1/q (AUC only)", ".popularity:estimate_by_hh",
              popularity=True, metrics=("auc",),
              reference="Hansen & Hurwitz 1943; uniform q: Krichene & Rendle KDD 2020, eq. 20"),
    Estimator("pl_fit", "popularity_fit", "popularity sampling, every metric: rank distribution fitted with a "
              "Plackett-Luce (w^beta) model of the items above each positive, beta by likelihood; the top's "
              "interval spans the beta set and the top shapes allowed", ".popularity:estimate_by_pl_fit",
              without_replacement=False, popularity=True,
              class_counts=True,
              options=(Option("niche", "choice", "hedge", "where the niche-top test rejects beta_top >= "
                              "beta_deep: the hedge of both branches (harmonic mean), or the constrained fit's value",
                              ("hedge", "constrained")),
                       Option("rank_prior", "choice", "spline", "the prior of the value at the fitted tilt: g-modelling "
                              "(log-spline in log R, gmod's basis and penalty) or the EM prior the tilt was chosen "
                              "with", ("spline", "em")),
                       Option("strata", "choice", "positive", "fit the positives in two strata of their own "
                              "popularity, each with its own tilt and prior (where each holds 200 positives and "
                              "the draw kept their weights), or all as one", ("positive", "none")),
                       Option("count_term", "choice", "on", "the likelihood conditions the drawn items' memberships "
                              "on the rank's count |A| = R - 1 (exactly in the single-rank cells up to 32), or "
                              "takes them independent given R", ("on", "off"))),
              reference="Plackett 1975 / Luce 1959 inclusion (conditional Poisson); NPMLE as Jin et al. AAAI 2021"),
    Estimator("diff", "design_based", "difference estimator on an exact share (SamplingDesign(m, exact_share=...)): "
              "auto's fit predicts each positive, the exact share corrects it; its interval holds by design "
              "(auto's choice whenever the sample carries exact ranks)", "._design_based:estimate_by_design",
              options=_FIT_OPTIONS + (Option("coef", "choice", DIFF_COEF, "lambda of the predictions: 1 (exactly "
                                             "unbiased), or PPI++'s variance-optimal value clipped to [0, 1] (a bias "
                                             "of order 1 / #exact; narrower with many exact hits)",
                                             DIFF_COEFS),),
              adaptive=True, popularity=True, fits_distribution=True, exact_groups=True, exact_share=True,
              reference="Horvitz & Thompson 1952; Sarndal et al. 1992 ch. 6; Angelopoulos et al. 2023 (PPI, PPI++); "
                        "Zrnic & Candes ICML 2024"),
)
for _entry in _BUILTIN:
    register(_entry)
del _entry

# the built-in method classes (module docstring of ``estimators``): ``Bv(gamma=0.2)``, ``Mes(n_bootstrap=0)``...
Linear = method_class("linear")
Bound = method_class("bound")
Beta = method_class("beta")
BetaFit = method_class("beta_fit")
Mle = method_class("mle")
Mes = method_class("mes")
Gmod = method_class("gmod")
Auto = method_class("auto")
Uncorrected = method_class("none")
RankEstimate = method_class("rank_estimate")
Ls = method_class("ls")
Cls = method_class("cls")
Bv = method_class("bv")
BvMle = method_class("bv_mle")
Hh = method_class("hh")
PlFit = method_class("pl_fit")
Diff = method_class("diff")

#: The default estimator of ``estimate()`` (docs/estimators.md), and of every entry point that runs an estimator:
#: the Lightning callback and torchmetrics' ``SampledRankingMetrics`` (with ``none``), RecBole's ``RankDist*``
#: (``rsp_estimators``), the planner and ``reco-sampled plan``. ``auto`` picks per design and metric (below).
DEFAULT_ESTIMATOR = "auto"

#: What ``auto`` runs: ``"resolved"`` where the design resolves the top (an adaptive design, or a fixed m whose
#: resolution b = (n - 1)/(m + 1) + 1 is at most the metric's cut-off K in every group with positives at r~ = 1),
#: ``"unresolved"`` elsewhere (docs/estimators.md: gmod has half mes's error where the top is resolved, and 2-4x
#: its error where it is not).
#: ``"popularity"``: under a popularity design, the first of these that estimates the metric (its entry's
#: ``metrics``): ``hh`` for AUC (linear in the rank: unbiased, no model), ``pl_fit`` for every other metric (top-K
#: metrics need its model of the items above each positive; docs/popularity.md).
#: ``"auc"``: AUC at a fixed uniform m, the sampled AUC itself (``none``): unbiased, E[(m + 1 - r~)/m] = (n - R)/(n - 1)
#: under both uniform laws, and its interval covered the exact AUC in every cell of ``benchmarks/auc_default.py``
#: (ml-100k, ml-latest-small, six recommenders, m = 50/100/500), where ``gmod``'s smooth fit missed ItemKNN(q = 1)'s
#: (coverage 0.00-0.65) and ``mes`` erred up to 30x more.
class AutoChoices(TypedDict):
    """The type of :data:`AUTO_CHOICES`: one method per uniform regime, a preference order under popularity."""

    resolved: str
    unresolved: str
    auc: str
    popularity: tuple[str, ...]


AUTO_CHOICES: AutoChoices = {"resolved": "gmod", "unresolved": "mes", "auc": "none", "popularity": ("hh", "pl_fit")}


def popularity_auto(metric: Any, design: Any = None) -> str:
    """What ``auto`` runs for ``metric`` (a name, kind or ``MetricSpec``) under a popularity design: the first of
    ``AUTO_CHOICES["popularity"]`` whose entry estimates its kind (and takes ``design``, a ``SamplingDesign``, when
    given).

    Raises:
        ValueError: ``method: auto ...`` where none of them takes the design (e.g. draws without replacement for a
            top-K metric), naming what does.
    """
    kind = getattr(metric, "kind", None) or _metric_kind(metric)
    if design is not None:
        _check_design(design)
    for name in AUTO_CHOICES["popularity"]:
        if get(name).takes_metric(kind) and (design is None or get(name).supports(design)):
            return name
    others = tuple(n for n in names(design=design, metric=kind) if n != "auto") if design is not None else ()
    raise ValueError(f"method: auto has no estimator of {kind} for this design "
                     f"({design.describe() if design is not None else 'popularity'}); "
                     f"AUTO_CHOICES['popularity'] = {AUTO_CHOICES['popularity']} do not take it"
                     + (f"; use one of {others}" if others else ""))

#: The default where a correction table is needed (one value per sampled rank, so not a fitted method): RecBole's
#: ``Corrected*`` (``rsp_estimators``), ``reco-sampled table``,
#: :func:`~reco_sampled_plugin.uncertainty.paired_difference`.
DEFAULT_CORRECTION = "bv"
