"""Validation of options (keyword arguments that tune an estimator, a fit or a command): one helper per kind.

Every helper raises a ``ValueError`` whose message starts with the argument's name, so bad input never ends
as a deep TypeError, a silent NaN, a loop that never stops (``tol=nan``) or an option that is ignored.
Types are strict: a boolean option takes True / False (numpy bools too), never ``"False"`` or 0/1
(:func:`check_bool`); a float option refuses strings and bools (:func:`check_float` and its range variants); an
integer option refuses floats and bools (``_checks.check_int``); a list of names reads one string as one name
(:func:`check_names`). Every public entry point runs each of its options through the helper of its kind
(tests/test_option_types.py enumerates them). Sizes, ranks and weights are validated in ``_checks``.
"""

from __future__ import annotations

import math
import numbers
import os
from collections.abc import Callable, Iterable, Mapping
from typing import Any, TypeVar

import numpy as np

from .sampling_laws import check_law  # the one sampling-law check of the package
from ._checks import ArgumentTypeError, check_int  # the one integer check of the package, and its type error
from .metric_names import MetricSpec

_T = TypeVar("_T")

#: Most bootstrap replicates of a fit (``n_bootstrap``): each replicate is a whole refit (the defaults take 16-32),
#: and 2,000 is what a percentile interval needs (Efron & Tibshirani 1993, ch. 13); beyond it a fit would run for
#: hours and hold n_bootstrap x cells float64 for nothing.
MAX_BOOTSTRAP = 2000
#: Most iterations of a fit (``max_iter``, default 5000): the EM and L-BFGS-B loops stop at ``tol`` long before.
MAX_ITERATIONS = 1_000_000
#: Most B-spline coefficients of g-modelling (``df``, default 10): its penalty is a df x df matrix (2^24 values,
#: 128 MiB, at the bound: MAX_ELEMENTS / 8), its basis cells x df; at fit time df is also at most the number of
#: cells of the rank grid (coefficients beyond it are not identified by the data).
MAX_SPLINE_DF = 4096

__all__ = [
    "MAX_BOOTSTRAP",
    "MAX_ITERATIONS",
    "MAX_SPLINE_DF",
    "ArgumentTypeError",
    "NotFittedError",
    "MissingFileError",
    "check_options",
    "check_positive_float",
    "check_nonnegative_float",
    "check_fraction",
    "check_count",
    "check_seed",
    "check_bool",
    "check_float",
    "check_optional",
    "check_choice",
    "check_names",
    "check_law",
    "check_beta_shape",
    "check_path",
    "check_base_measure",
]


class NotFittedError(ValueError, RuntimeError):
    """A model used before ``fit``: a ValueError (the package's promise) that is also the RuntimeError raised
    before it."""


class MissingFileError(ValueError, FileNotFoundError):
    """A path that names no file: a ValueError whose message starts with the path (the package's promise), and
    the FileNotFoundError that ``open`` raises."""


def check_options(options: Mapping, allowed: Iterable[str], where: str) -> dict:
    """``options`` as a dict, raising a ValueError naming every unknown key and listing the allowed ones."""
    if not isinstance(options, Mapping):
        raise ValueError(f"{where}: options must be a mapping of keyword arguments, got {type(options).__name__}")
    allowed = tuple(allowed)
    unknown = [k for k in options if k not in allowed]
    if unknown:
        names = ", ".join(repr(k) for k in unknown)
        if not allowed:
            raise ValueError(f"{names}: unknown option(s); {where} takes no options")
        raise ValueError(f"{names}: unknown option(s) of {where}; allowed options: {', '.join(allowed)}")
    return dict(options)


def _real(x: Any, name: str, what: str) -> float:
    """``x`` as a float when it is one real number: Python, numpy or 0-d torch (ints and floats); strings, bools
    (numpy and torch bools too), complex numbers and arrays of any other shape are refused."""
    dtype = str(getattr(x, "dtype", ""))
    if isinstance(x, (bool, np.bool_)) or "bool" in dtype or "complex" in dtype:
        raise ArgumentTypeError(f"{name}: expected {what}, got {x!r}")
    if not isinstance(x, numbers.Real):
        # numpy / torch scalars are numbers.Real or have __float__; strings and containers are refused
        if isinstance(x, (str, bytes)) or not hasattr(x, "__float__") or bool(getattr(x, "ndim", 0)):
            raise ArgumentTypeError(f"{name}: expected {what}, got {x!r}")
    try:
        return float(x)
    except (TypeError, ValueError, OverflowError):
        raise ValueError(f"{name}: expected {what}, got {x!r}") from None


def check_positive_float(x: Any, name: str) -> float:
    """``x`` as a float, raising a ValueError naming ``name`` unless it is a finite number > 0."""
    v = _real(x, name, "a finite number > 0")
    if not (math.isfinite(v) and v > 0):
        raise ValueError(f"{name}: expected a finite number > 0, got {x!r}")
    return v


def check_nonnegative_float(x: Any, name: str) -> float:
    """``x`` as a float, raising a ValueError naming ``name`` unless it is a finite number >= 0."""
    v = _real(x, name, "a finite number >= 0")
    if not (math.isfinite(v) and v >= 0):
        raise ValueError(f"{name}: expected a finite number >= 0, got {x!r}")
    return v


def check_float(x: Any, name: str) -> float:
    """``x`` as a float, raising a ValueError naming ``name`` unless it is a finite real number (Python, numpy or
    0-d torch; not a str such as ``"0.5"``, a bool, a complex number or an array of several values)."""
    v = _real(x, name, "a finite number")
    if not math.isfinite(v):
        raise ValueError(f"{name}: expected a finite number, got {x!r}")
    return v


def check_optional(x: Any, check: Callable[..., _T], name: str, *args: Any) -> _T | None:
    """None, or ``check(x, name, *args)``: an option whose None means "the default" or "off"."""
    return None if x is None else check(x, name, *args)


def check_fraction(x: Any, name: str) -> float:
    """``x`` as a float, raising a ValueError naming ``name`` unless it lies in [0, 1] (NaN refused)."""
    v = _real(x, name, "a number in [0, 1]")
    if not (0.0 <= v <= 1.0):
        raise ValueError(f"{name}: must lie in [0, 1], got {x!r}")
    return v


def check_count(x: Any, name: str, minimum: int = 0, maximum: int | None = None) -> int:
    """An integer option in ``minimum``..``maximum`` (:func:`~reco_sampled_plugin._checks.check_int`: Python, numpy
    or 0-d integer torch values; not a bool, not a float such as 2.5 or 1e3; None: at most 2^63 - 1)."""
    return check_int(x, name, minimum, maximum)


def check_seed(x: Any, name: str = "seed") -> int:
    """A random seed: an integer in 0 .. 2**63 - 1."""
    v = check_count(x, name, 0)
    if v > 2**63 - 1:
        raise ValueError(f"{name}: must be an integer in 0..2**63 - 1, got {v}")
    return v


def check_bool(x: Any, name: str) -> bool:
    """``x`` as a bool, raising a ValueError naming ``name`` unless it is True or False (numpy bools too): the
    one check of a boolean option. ``"False"``, ``0``, ``1``, ``None`` and one-element arrays are refused (a
    non-empty string is truthy: ``"False"`` would do what True does)."""
    if isinstance(x, (bool, np.bool_)):
        return bool(x)
    raise ArgumentTypeError(f"{name}: expected True or False, got {x!r}")


def check_choice(x: Any, choices: Iterable[_T], name: str) -> _T:
    """``x`` itself, raising a ValueError naming ``name`` and listing ``choices`` unless it is one of them
    (same type and value: ``1`` is not ``True``)."""
    choices = tuple(choices)
    for c in choices:
        if type(c) is type(x) and c == x:
            return c
    listing = ", ".join(repr(c) for c in choices)
    raise ValueError(f"{name}: expected one of {listing}, got {x!r}")


def check_names(x: Any, name: str, what: str = "metric names such as 'ndcg@10'") -> tuple:
    """A list option of names (metrics, methods) as a tuple: one ``str`` (or :class:`~.metric_names.MetricSpec`)
    is one name, not its letters; any other iterable (list, tuple, generator) must hold only such names and at
    least one. A ValueError naming ``name`` for an int, a float, bytes, a mapping or a non-name element."""
    if isinstance(x, (str, MetricSpec)):
        return (x,)
    if isinstance(x, (bytes, bytearray, Mapping)) or not isinstance(x, Iterable) or getattr(x, "ndim", 1) == 0:
        raise ValueError(f"{name}: expected a list of {what} (or one name alone), got {x!r}")
    names = tuple(x)
    bad = [v for v in names if not isinstance(v, (str, MetricSpec))]
    if bad:
        raise ValueError(f"{name}: expected {what}, got {bad[0]!r} in {list(names)!r}")
    if not names:
        raise ValueError(f"{name}: give at least one; expected {what}")
    return names


def check_metric_names(x: Any, name: str = "metrics") -> tuple[MetricSpec, ...]:
    """A list of metrics (:func:`check_names`) parsed into MetricSpecs; an unknown name
    is a ValueError naming ``name`` (the argument the caller typed, not ``metric``)."""
    from .metric_names import parse_metric

    specs = []
    for m in check_names(x, name):
        try:
            specs.append(parse_metric(m))
        except ValueError as exc:
            raise ValueError(f"{name}: {str(exc).removeprefix('metric: ')}") from None
    return tuple(specs)


#: The Beta shapes a the mapping computes (eq. 16-17): at a = 1e-20 or 1e300 its values collapse in float64 (the
#: mapping stops increasing, eq. 19's update divides by 0); fit_beta's iteration stops above 1e6 as well.
BETA_SHAPE_RANGE = (1e-6, 1e6)


def check_path(path: Any, name: str = "path") -> str:
    """A file name argument as a str: a ``str`` or ``os.PathLike`` naming text (an ArgumentTypeError naming ``name``
    for None, numbers, bytes; a ValueError for an empty name, which would read the current directory)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ArgumentTypeError(f"{name}: expected a file name (str or os.PathLike), got {type(path).__name__}")
    text = os.fspath(path)
    if not isinstance(text, str):  # a bytes path
        raise ArgumentTypeError(f"{name}: expected a file name as str, got {text!r}")
    if not text.strip():
        raise ValueError(f"{name}: expected a file name, got the empty name {text!r}")
    return text


def check_beta_shape(a: Any, name: str = "a") -> float:
    """The Beta shape a of Li et al.'s mapping (eq. 16-17) as a float: a ValueError naming ``name`` unless a number in
    :data:`BETA_SHAPE_RANGE` (None: the method ``beta`` needs one)."""
    lo, hi = BETA_SHAPE_RANGE
    if a is None:
        raise ValueError(f"{name}: method 'beta' needs the Beta shape a in [{lo:g}, {hi:g}] (a = 1 is eq. 18; use "
                         "fit_beta for eq. 19)")
    v = _real(a, name, f"the Beta shape, a number in [{lo:g}, {hi:g}]")
    if not lo <= v <= hi:  # NaN included
        raise ValueError(f"{name}: the Beta shape must be a number in [{lo:g}, {hi:g}] (the mapping's float64 range), "
                         f"got {a!r}")
    return v


def check_base_measure(beta: Any) -> float:
    """The exponent of MES' base measure r^-beta: a number in [0, 2] (a ValueError naming ``beta`` otherwise)."""
    if not (isinstance(beta, (int, float)) and not isinstance(beta, bool) and math.isfinite(beta) and 0 <= beta <= 2):
        raise ValueError(f"beta: must be a number in [0, 2], got {beta!r}")
    return float(beta)
