"""Input validation shared by the core: every error is a ValueError naming the argument.

One helper per kind of argument, used by every public entry point that takes it:

* :func:`check_sizes` -- n_items / n_samples (and other counts) given as an int or per-instance values;
* :func:`check_rank_values` -- exact or sampled ranks (1-based; 0 is padding only where an API says so);
* :func:`check_weights` -- non-negative weights (per-positive weights, popularity, relevance);
* :func:`check_ranks_in_range` -- ranks inside 1..n;
* :func:`check_elements` -- the one bound (``MAX_ELEMENTS``) on an array whose size grows with n or m;
* :func:`check_generator` -- a ``generator`` argument (None or a ``torch.Generator``);
* :func:`check_device` -- a ``device`` argument (None, a name or a ``torch.device``; not ``meta``).
"""

from __future__ import annotations

import math
import sys
from typing import Any, Literal, TypeVar, overload

import numpy as np
import torch

_T = TypeVar("_T")

__all__ = [
    "ArgumentTypeError",
    "MAX_INT",
    "MAX_SIZE",
    "MAX_TOTAL_WEIGHT",
    "MAX_SAMPLES",
    "MAX_ELEMENTS",
    "MAX_FIT_ELEMENTS",
    "MIN_INCLUSION",
    "as_tensor",
    "check_elements",
    "check_generator",
    "check_without_replacement",
    "renamed",
    "check_device",
    "real_tensor",
    "check_same_device",
    "check_int",
    "check_required",
    "check_size",
    "check_sizes",
    "check_not_meta",
    "check_rank_values",
    "check_weights",
    "check_ranks_in_range",
    "check_sampled_support",
    "impossible_rank_message",
    "check_real_array",
    "check_dense",
]

#: Largest candidate count n or sample size m accepted anywhere (2^40, about 1.1e12 items). Below it every
#: rank is exact in float64 (2^53) and products such as (n - 1) m of the rank-estimate table stay inside
#: int64 for m up to 2^20; far beyond any catalogue.
MAX_SIZE = 1 << 40
#: Largest number of sampled items m per positive (2^24, about 1.7e7): a histogram group holds m + 1 counts
#: (128 MiB of float64 at the limit) and a draw B x P x m indices; useful designs use m = 10..1e4 (adaptive caps
#: up to ~1e5). Beyond it a ValueError names ``n_samples`` instead of an allocation failure.
MAX_SAMPLES = 1 << 24
#: Largest total weight of a histogram (2^53): the number of instances its standard errors assume; beyond
#: it the bootstrap's integer draw count and products of totals leave exact float64 / int64 arithmetic.
MAX_TOTAL_WEIGHT = float(1 << 53)
#: Largest array (values) that one call builds when its size grows with n or m (2^27: 1 GiB of float64): a whole
#: metric curve M(1..n), a prior vector p(1..n), a table P(r~ | r) of ranks x (m + 1). Quantities that are cheap
#: in closed form or by quadrature (sums over 1..n, the identification's shape rows, the planner's default
#: family) are computed so and need no bound; the others are refused before allocating.
MAX_ELEMENTS = 1 << 27
#: The one larger bound: a rank-distribution fit's likelihood P(r~ | cell) over every observed (group, r~), held whole
#: for the fit (1,020 cells x 144,234 observed r~ = 1.2 GB fitted in 74 s at m = 12,800 with 10,000 distinct n; the
#: 66 GiB of every r~ at m = 2^20 is refused)
MAX_FIT_ELEMENTS = 1 << 29
#: Least inclusion probability pi of an exact share's positive (a share, an active share's floor, a rank file's or an
#: array's pi): the Horvitz-Thompson weights 1/pi and their squares stay far inside float64 (a chosen positive at
#: pi = 1e-300 makes the design-based estimate NaN); a share of 1e-9 chooses about no positive of a billion.
MIN_INCLUSION = 1e-9
#: Largest integer option accepted where a caller sets no tighter bound (2^63 - 1: what an int64 holds; a seed's
#: range). Larger Python ints are refused, never wrapped around or passed on to an allocation.
MAX_INT = (1 << 63) - 1


class ArgumentTypeError(ValueError, TypeError):
    """An argument of the wrong type (a string, a float or a bool where an integer is expected, None where a design
    is required): a ValueError (the package's promise) that is also the TypeError Python raises for a wrong type.
    Its message starts with the argument's name."""


def check_elements(count: int, name: str, what: str, bound: int | None = None) -> None:
    """Raise a ValueError naming ``name`` when ``what`` (an array of ``count`` values that grows with the argument
    ``name``) would exceed :data:`MAX_ELEMENTS` (or ``bound``, a documented larger one such as
    :data:`MAX_FIT_ELEMENTS`), before anything is allocated."""
    limit = MAX_ELEMENTS if bound is None else bound
    if count > limit:
        label = (f"the bound 2^27 = {limit} (MAX_ELEMENTS: 1 GiB of float64)" if bound is None else
                 f"the bound 2^{limit.bit_length() - 1} = {limit} (MAX_FIT_ELEMENTS: {limit >> 27} GiB of float64)")
        raise ValueError(f"{name}: {what} would hold {_show(count)} values, above {label} on arrays that grow with "
                         "n or m")


def renamed(message: str, names: dict[str, str]) -> str:
    """``message`` of a helper's ValueError, its leading argument name replaced by the caller's (``names``: the
    helper's name -> the public argument's, e.g. ``sampled_ranks`` -> ``pilot``), so that a message always starts
    with the argument the caller typed."""
    head, sep, rest = message.partition(":")
    return f"{names[head]}{sep}{rest}" if sep and head in names else message


def check_without_replacement(n_items: Any, n_samples: Any, law: str) -> None:
    """Raise a ValueError naming ``n_samples`` when draws without replacement (``law`` ``"hypergeometric"``) ask
    for more items than the n - 1 irrelevant candidates hold (m > n - 1, per instance or group): such sampled
    ranks cannot exist, whatever the estimator (the mappings, which assume no law, included)."""
    if law == "hypergeometric" and np.any(np.asarray(n_samples) > np.asarray(n_items) - 1):
        raise ValueError("n_samples: m draws without replacement need at least m irrelevant candidates (n - 1 >= m)")


def check_generator(generator: Any, name: str = "generator") -> torch.Generator | None:
    """``generator`` itself when it is None or a ``torch.Generator``; a ValueError naming ``name`` otherwise (a numpy
    Generator, a seed or a string would fail deep inside torch)."""
    if generator is not None and not isinstance(generator, torch.Generator):
        raise ValueError(
            f"{name}: expected a torch.Generator or None, got {type(generator).__name__} "
            "(for a seed, pass torch.Generator().manual_seed(seed))"
        )
    return generator


def check_not_meta(t: torch.Tensor, name: str) -> torch.Tensor:
    """``t`` unless it is a ``meta`` tensor (shape only, no values: nothing can be ranked or counted from it)."""
    if t.device.type == "meta":
        raise ValueError(f"{name}: a 'meta' tensor holds no values; move it to a real device (cpu, cuda, ...)")
    return t


def as_tensor(x: Any, name: str, dtype: torch.dtype | None = None, device: torch.device | None = None) -> torch.Tensor:
    """Convert ``x`` (tensor, array, list or scalar) to a tensor, keeping tensors on their device."""
    if isinstance(x, torch.Tensor):
        t = check_not_meta(x, name)
    else:
        try:
            t = torch.as_tensor(x)
        except Exception as exc:  # strings, objects, ragged lists
            raise ValueError(f"{name}: cannot convert {type(x).__name__} to a tensor ({exc})") from None
    if device is not None and t.device != device:
        t = t.to(device)
    if dtype is not None and t.dtype != dtype:
        t = t.to(dtype)
    return t


def check_device(device: Any, name: str = "device") -> torch.device | None:
    """``device`` as a ``torch.device`` (None stays None), raising a ValueError naming ``name`` for what torch
    cannot parse, for ``meta`` (a device of shapes only: nothing can be computed there) and for an accelerator this
    process has not (``torch.<type>.is_available()`` False, or an index past its count)."""
    if device is None:
        return None
    if not isinstance(device, (str, torch.device)) or isinstance(device, bool):
        raise ValueError(f"{name}: expected None, a device name such as 'cpu' or 'cuda:0', or a torch.device, "
                         f"got {type(device).__name__}")
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError) as exc:
        raise ValueError(f"{name}: not a device ({exc})") from None
    if dev.type == "meta":
        raise ValueError(f"{name}: 'meta' holds shapes only, no values; use a real device (cpu, cuda, ...)")
    backend = getattr(torch, dev.type, None)  # torch.cuda, torch.xpu, torch.mps, ...: a deep AssertionError later
    available = getattr(backend, "is_available", None)
    if dev.type != "cpu" and callable(available) and not available():
        raise ValueError(f"{name}: {dev.type!r} is not available here (this torch build or machine has none); "
                         "use 'cpu' or an available device")
    count = getattr(backend, "device_count", None)
    if dev.type != "cpu" and dev.index is not None and callable(count) and dev.index >= count():
        raise ValueError(f"{name}: {str(dev)!r} does not exist ({count()} {dev.type} device(s) here)")
    return dev


def check_same_device(**tensors: torch.Tensor | None) -> None:
    """Raise a ValueError when the given tensors live on different devices."""
    devices = {name: t.device for name, t in tensors.items() if isinstance(t, torch.Tensor)}
    if len(set(devices.values())) > 1:
        listing = ", ".join(f"{name} on {dev}" for name, dev in devices.items())
        raise ValueError(f"tensors are on different devices: {listing}; move them to one device")


def check_int(value: Any, name: str, minimum: int | None = None, maximum: int | None = None) -> int:
    """The one check of an integer option (a seed, an iteration count, a batch size, k...): ``value`` as an int
    when it is a Python, numpy or 0-d torch integer in minimum..maximum (``maximum`` None: :data:`MAX_INT`).

    Raises:
        ArgumentTypeError (a ValueError and a TypeError) naming ``name`` for a value of another type: bools,
            strings (``"10"``), floats (even 3.0), complex numbers, arrays.
        ValueError naming ``name`` for an integer outside minimum..maximum (2^70 included).

    Sizes (n, m) that may arrive as whole floats go through :func:`check_size` instead."""
    dtype = str(getattr(value, "dtype", ""))
    bad_type = (isinstance(value, (bool, np.bool_)) or any(k in dtype for k in ("bool", "float", "complex"))
                or bool(getattr(value, "ndim", 0)) or not hasattr(value, "__index__"))
    try:
        v = None if bad_type else int(value.__index__())
    except (TypeError, ValueError, RuntimeError):
        v = None
    if v is None:
        bound = "" if minimum is None else f" >= {minimum}"
        raise ArgumentTypeError(f"{name}: expected an integer{bound}, got {type(value).__name__} {value!r}") from None
    if minimum is not None and v < minimum:
        raise ValueError(f"{name}: must be >= {minimum}, got {v}")
    top = MAX_INT if maximum is None else maximum
    if v > top:
        raise ValueError(f"{name}: must be <= {top}{' (2^63 - 1, an int64)' if maximum is None else ''}, got {_show(v)}")
    return v


def check_required(value: _T, name: str, what: str) -> _T:
    """``value`` unless it is None: an :class:`ArgumentTypeError` naming ``name`` says that ``what`` (e.g. "a
    SamplingDesign or an int m") is required there, where None would fail later as an AttributeError."""
    if value is None:
        raise ArgumentTypeError(f"{name}: required, expected {what}, got None")
    return value


def check_size(value: Any, name: str, minimum: int = 1, maximum: int = MAX_SIZE) -> int:
    """One size such as n_items (n) or n_samples (m) as an int: a whole number of any real type (100, 100.0,
    np.int32(100), a one-element tensor), finite, in minimum..maximum; the same rule as :func:`check_sizes`
    for per-instance sizes, so ``n_samples=10.0`` is accepted wherever ``n_items=100.0`` is."""
    return check_sizes(value, name, minimum, maximum=maximum, one=True)


def _numeric(x: Any, name: str, what: str, device: torch.device | None = None, booleans: bool = False) -> torch.Tensor:
    """``x`` as a real numeric tensor (tensors keep their dtype and device; arrays, lists and Python numbers
    go through numpy, so 1e300 stays a finite float64 instead of overflowing float32). Bools (unless
    ``booleans``: masks), complex numbers and sparse matrices (torch sparse layouts: no elementwise checks run on
    them) are refused with a ValueError naming ``name``."""
    check_dense(x, name)
    if isinstance(x, torch.Tensor):
        t = check_not_meta(x, name)
    else:
        if isinstance(x, (bool, np.bool_)) and not booleans:
            raise ArgumentTypeError(f"{name}: expected {what}, got the bool {x!r}")
        try:
            a = np.asarray(x)
        except Exception as exc:  # ragged lists and the like
            raise ValueError(f"{name}: expected {what}, got {type(x).__name__} ({exc})") from None
        if a.dtype.kind not in "biufc":
            raise ArgumentTypeError(f"{name}: expected {what}, got {type(x).__name__} of dtype {a.dtype}")
        if a.dtype.kind == "u" and a.dtype.itemsize == 8:  # torch has little uint64 support
            if a.size and a.max() > np.iinfo(np.int64).max:
                raise ValueError(f"{name}: values too large, got {a.max()}")
            a = a.astype(np.int64)
        if not a.flags.writeable:  # torch warns on read-only arrays (a RankHistogram's, for one)
            a = a.copy()
        t = torch.as_tensor(a)
    if t.dtype == torch.bool and not booleans:
        raise ArgumentTypeError(f"{name}: expected {what}, got booleans (dtype {t.dtype})")
    if t.is_complex():
        raise ArgumentTypeError(f"{name}: expected {what}, got complex numbers (dtype {t.dtype})")
    if device is not None and t.device != device:
        t = t.to(device)
    return t


def check_dense(x: _T, name: str) -> _T:
    """``x`` unless it is a sparse matrix (scipy sparse, or a torch tensor of a sparse layout): a ValueError naming
    ``name`` says to pass it dense, where NumPy and torch would fail with "sparse array length is ambiguous"."""
    sparse = (isinstance(x, torch.Tensor) and x.layout != torch.strided) or (
        hasattr(x, "tocsr") and hasattr(x, "nnz") and type(x).__module__.startswith("scipy.sparse"))
    if sparse:
        raise ValueError(f"{name}: expected a dense matrix (tensor or array), got a sparse {type(x).__name__}"
                         + ("" if isinstance(x, torch.Tensor) else "; call .toarray() first"))
    return x


def check_real_array(x: Any, name: str, what: str = "real numbers") -> np.ndarray:
    """``x`` as a float64 numpy array of real numbers: integer or floating dtypes only. Strings (``"17"``,
    ``"2020-01-01"``: never parsed), bools, complex numbers (never made real silently), objects and ragged
    lists are refused with a ValueError naming ``name``; finiteness is the caller's rule."""
    if isinstance(x, torch.Tensor):
        x = check_not_meta(x, name).detach().cpu().resolve_conj().numpy()
    try:
        a = np.asarray(x)
    except Exception as exc:  # ragged lists and the like
        raise ValueError(f"{name}: expected {what}, got {type(x).__name__} ({exc})") from None
    if a.dtype.kind not in "iuf":
        hint = " (convert them to numbers first)" if a.dtype.kind in "OUSM" else ""
        raise ValueError(f"{name}: expected {what}, got dtype {a.dtype}{hint}")
    return a.astype(np.float64)
def real_tensor(x: Any, name: str, what: str = "real numbers", *, booleans: bool = False) -> torch.Tensor:
    """``x`` (a tensor, array, list or number) as a real numeric tensor, the one conversion of array arguments:
    ragged lists, strings, objects such as scipy sparse matrices, bools (unless ``booleans``: masks), complex
    numbers and ``meta`` tensors give a ValueError naming ``name`` (tensors keep their dtype and device)."""
    return _numeric(x, name, what, booleans=booleans)


def _first(t: torch.Tensor, bad: torch.Tensor) -> float:
    return t[bad].reshape(-1)[0].item()


def _show(v: object) -> str:
    """A count for a message: whole numbers as integers (2^62 as 4611686018427387904, not 4.6e+18)."""
    if isinstance(v, float) and v.is_integer() and abs(v) < 2.0**63:
        return str(int(v))
    return f"{v:g}" if isinstance(v, float) else str(v)


def _broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...] | None:
    """The broadcast shape of two shapes, None where they do not broadcast (numpy's rule, which is torch's;
    ``torch.broadcast_shapes`` would import sympy through torch._refs: ~1 s at the first call of a process)."""
    try:
        return tuple(np.broadcast_shapes(tuple(a), tuple(b)))
    except ValueError:
        return None


@overload
def check_sizes(
    x: Any, name: str, minimum: int | None = 1, *, like: torch.Tensor | None = None, like_name: str = "ranks",
    exact: bool = False, maximum: int | None = MAX_SIZE, device: torch.device | None = None, one: Literal[True],
) -> int: ...
@overload
def check_sizes(
    x: Any, name: str, minimum: int | None = 1, *, like: torch.Tensor | None = None, like_name: str = "ranks",
    exact: bool = False, maximum: int | None = MAX_SIZE, device: torch.device | None = None, one: bool = False,
) -> int | torch.Tensor: ...
def check_sizes(
    x: Any,
    name: str,
    minimum: int | None = 1,
    *,
    like: torch.Tensor | None = None,
    like_name: str = "ranks",
    exact: bool = False,
    maximum: int | None = MAX_SIZE,
    device: torch.device | None = None,
    one: bool = False,
) -> int | torch.Tensor:
    """Validate counts such as n_items (candidates) or n_samples (m), given as one number or per instance.

    Whole numbers (integer dtype, or floats without a fractional part), finite, in minimum..maximum; bools and
    complex numbers are refused. With ``like`` (the ranks they belong to) the values must broadcast against
    ``like``'s shape (``exact``: broadcast *to* it, one value per instance or one for all).

    Returns:
        an ``int`` when ``x`` is a Python or numpy scalar (or ``one``: a single number is expected, in any
        form), else an int64 tensor (on ``device`` when given).

    Raises:
        ValueError naming ``name``.
    """
    scalar = isinstance(x, (int, float, np.integer, np.floating)) and not isinstance(x, (bool, np.bool_))
    t = _numeric(x, name, "whole numbers (a count)", device)
    if t.numel():
        if t.is_floating_point():
            t64 = t.to(torch.float64)
            finite = torch.isfinite(t64)
            whole = finite & (t64 == torch.round(t64))
            lo_hi = torch.stack([whole.all().to(torch.float64), finite.all().to(torch.float64),
                                 t64.masked_fill(~finite, math.inf).min(), t64.masked_fill(~finite, -math.inf).max()])
            ok_whole, ok_finite, lo, hi = lo_hi.tolist()  # one host synchronisation
            if not ok_finite:
                raise ValueError(f"{name}: must be finite whole numbers (a count), got {_first(t, ~finite)}")
            if not ok_whole:
                raise ValueError(f"{name}: must be whole numbers (a count), got {_first(t, ~whole)}")
        else:
            lo, hi = (int(v) for v in torch.stack([t.min(), t.max()]).tolist())
        if minimum is not None and lo < minimum:
            raise ValueError(f"{name}: must be >= {minimum}, got {_show(lo)}")
        if maximum is None:  # no bound of the caller's: still one an int64 holds exactly (2^63 would wrap around)
            maximum = 1 << 62
        if hi > maximum:
            why = " = 2^40 (larger counts leave exact int64 / float64 arithmetic)" if maximum == MAX_SIZE else ""
            raise ValueError(f"{name}: must be <= {maximum}{why}, got {_show(hi)}")
    t = t.to(torch.int64)
    if like is not None:
        shape = _broadcast_shape(t.shape, like.shape)
        if shape is None or (exact and shape != tuple(like.shape)):
            how = "broadcast to" if exact else "broadcast against"
            row = (f"; one value per row is shape ({like.shape[0]}, 1)" if t.dim() == 1 and like.dim() == 2
                   and t.shape[0] == like.shape[0] else "")
            raise ValueError(
                f"{name}: shape {tuple(t.shape)} does not {how} the shape {tuple(like.shape)} of {like_name} "
                f"(give one value, or one per instance){row}"
            )
    if one and t.numel() != 1:
        raise ValueError(f"{name}: expected one number, got shape {tuple(t.shape)}")
    if scalar or one:
        return int(t)
    return t


def check_rank_values(x: Any, name: str, *, whole: bool = False, padding: bool = False,
                      device: torch.device | None = None) -> torch.Tensor:
    """Validate rank inputs (exact or sampled, 1-based): an integer tensor, or floats (fractional ranks come
    from ``ties="average"``; ``whole`` refuses them) without NaN or inf. Bools and complex numbers are refused:
    a bool mask is not a rank. NaN is an error, never padding (``padding``: the API pads with 0). Returns the
    ranks as a tensor of their own dtype; the range (1..n) is :func:`check_ranks_in_range`'s job.

    Raises:
        ValueError naming ``name``.
    """
    t = _numeric(x, name, "ranks (1-based integers" + (", 0 for padding)" if padding else ")"), device)
    if t.is_floating_point() and t.numel():
        finite = torch.isfinite(t)
        good = finite & (t == torch.round(t)) if whole else finite
        if not bool(good.all()):
            if not bool(finite.all()):
                pad = " (pad with 0, not NaN)" if padding else ""
                raise ValueError(f"{name}: contains NaN or inf{pad}; ranks are 1-based numbers")
            raise ValueError(f"{name}: must be whole-number ranks, got {_first(t, ~good)}")
    return t


def check_weights(x: Any, name: str, *, like: torch.Tensor | None = None, like_name: str = "sampled_ranks",
                  max_total: float | None = None, device: torch.device | None = None,
                  counts: bool = False) -> torch.Tensor:
    """Validate non-negative weights: real numbers (no bools, no complex), finite, >= 0, whose total is finite
    in float64 (and at most ``max_total``). With ``like`` they must broadcast against its shape. ``counts``: the
    weights count instances (an estimate's ``weights``, whose total it divides by): a positive total must be a normal
    float64 number (popularity weights and relevance grades are scale-free: any total).

    Returns:
        the weights as a float64 tensor (on ``device`` when given).

    Raises:
        ValueError naming ``name``.
    """
    t = _numeric(x, name, "non-negative real weights", device).to(torch.float64)
    if t.numel():
        lo, hi, total = torch.stack([t.min(), t.max(), t.sum()]).tolist()  # NaN propagates to min and max
        if math.isnan(lo) or math.isnan(hi) or math.isinf(hi) or math.isinf(lo):
            raise ValueError(f"{name}: must be finite, got {_first(t, ~torch.isfinite(t))}")
        if lo < 0:
            raise ValueError(f"{name}: must be >= 0, got {lo:g}")
        if not math.isfinite(total):
            raise ValueError(f"{name}: the total overflows float64 (largest weight {hi:g}); scale the weights down")
        if counts and 0 < total < sys.float_info.min:  # estimates divide by the total (mes: lambda / total overflows)
            raise ValueError(f"{name}: the total {total:g} is below float64's smallest normal number "
                             f"({sys.float_info.min:g}); scale the weights up (their total counts the instances)")
        if max_total is not None and total > max_total:
            raise ValueError(
                f"{name}: the total {total:g} exceeds {max_total:g}, the most instances standard errors can count "
                "exactly; scale the weights down (their total is the number of instances)"
            )
    if like is not None:
        shape = _broadcast_shape(t.shape, like.shape)
        if shape is None:
            raise ValueError(
                f"{name}: shape {tuple(t.shape)} does not broadcast against the shape {tuple(like.shape)} of {like_name}"
            )
        if tuple(shape) != tuple(like.shape):  # e.g. (B,) against (B, 1): broadcasting would make B x B instances
            hint = (f"; per-row weights of {like_name} with shape {tuple(like.shape)} are given as shape "
                    f"({like.shape[0]}, 1)" if t.dim() == 1 and like.dim() == 2 and t.shape[0] == like.shape[0] else "")
            raise ValueError(f"{name}: shape {tuple(t.shape)} would broadcast the shape {tuple(like.shape)} of "
                             f"{like_name} to {tuple(shape)} (one weight per {like_name} entry at most){hint}")
    return t


def check_ranks_in_range(ranks: torch.Tensor, upper: torch.Tensor | int, name: str = "ranks") -> None:
    """Raise unless every rank lies in 1..upper (upper broadcast against ranks)."""
    if ranks.numel() == 0:
        return
    if ranks.is_floating_point() and not torch.isfinite(ranks).all():
        raise ValueError(f"{name}: contains NaN or inf")
    low = ranks < 1
    high = ranks > upper
    bad = low | high
    if bool(bad.any()):
        n_bad = int(bad.sum())
        example = ranks[bad].flatten()[0].item()
        raise ValueError(
            f"{name}: {n_bad} value(s) outside 1..n (1-based ranks, n = number of candidates), e.g. {example}"
        )


def impossible_rank_message(r: int, n: int, m: int, law: str = "uniform") -> str:
    """The one message for an observed sampled rank r~ that no exact rank can produce (:func:`check_sampled_support`,
    and the likelihood's own check in ``rank_distribution``)."""
    return (f"sampled_ranks: r~ = {r} cannot occur with n_items = {n} and n_samples = {m} under the {law} law (no exact "
            "rank gives it a probability; with n_items = 2 every draw is the one irrelevant item, so r~ is 1 or m + 1): "
            "the ranks, n or m are not those of one design")


def check_sampled_support(ranks: torch.Tensor, n_items: Any, n_samples: Any, law: str = "uniform") -> None:
    """Raise a ValueError naming ``sampled_ranks`` where an observed r~ cannot occur under uniform draws of m
    irrelevant candidates among n - 1 (with or without replacement, adaptive stages included): with n = 2 the one
    irrelevant item is every draw, so r~ is 1 or m + 1 and r~ in 2..m has probability 0 (for n >= 3 every r~ in
    1..m + 1 has a positive probability). The one support check of every estimator (corrections, mappings and
    likelihoods alike). ``ranks``, ``n_items``, ``n_samples``: broadcastable numbers (tensors or arrays); ranks
    0 (padding) pass."""
    r = torch.as_tensor(ranks)
    if r.numel() == 0:
        return
    n, m = torch.as_tensor(n_items, device=r.device), torch.as_tensor(n_samples, device=r.device)
    bad = (n == 2) & (r > 1) & (r <= m)
    if bool(bad.any()):
        r, n, m = torch.broadcast_tensors(r, n, m)
        i = bad.reshape(-1).nonzero()[0, 0]
        raise ValueError(impossible_rank_message(int(r.reshape(-1)[i]), 2, int(m.reshape(-1)[i]), law))
