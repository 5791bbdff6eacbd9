"""Compare-and-count kernels: for each reference score t[b, p], how many of the scores S[b, :] beat it.

Counting beats sorting: the 1-based rank of a relevant item is 1 + the number of candidates that
score higher, and every metric follows from that. A plain eager ``(S[:, None, :] > t[..., None]).sum()``
materialises a boolean of B x P x n and runs at a fraction of the score matmul's speed, so large
inputs go through a ``torch.compile`` kernel that fuses the compare and the sum (no temporaries).
Otherwise an eager path in bounded chunks: on a CPU, numpy's SIMD comparisons into a byte buffer counted 8 bytes at a
time, in blocks of rows (or of item segments) whose scores and bytes fit half a core's L2 (``_numpy_padded``: 1.1-1.35x
the compiled kernel's time, two numpy calls per block and group of references); on
other devices (or bfloat16 / float16 scores) a torch loop, one pass per reference over whole rows on an accelerator
(a fixed number of operators per call whatever B and n; temporaries: a (B, n) boolean, and ``ties="random"``'s (B, n)
int64 tie-break keys) and over cache-sized chunks of items on a CPU. All give identical integer counts; the backend is
chosen per call:

* ``auto`` (the default): the eager path until this process has done ``_COMPILE_AFTER_WORK`` comparisons
  (about as many as the eager path does in the seconds one compilation takes; ``_COMPILE_AFTER_WORK_FAST`` for the
  CPU's numpy path, whose gap to the compiled kernel is small; ``_COMPILE_AFTER_WORK_ACCELERATOR`` on an
  accelerator, whose eager passes cost ~1e-12 s per comparison more than the compiled kernel's), then compiled kernels for
  inputs of at least ``_COMPILE_MIN_WORK``. A first evaluation, or a small data set evaluated a few times
  (ml-100k: 1.6e6 scores per evaluation), never waits for a compiler (it cost 4-9 s, measured in a RecBole
  run, against ~0.05 s of eager counting); a large evaluation loop compiles once it has done that much work.
* ``RECO_SAMPLED_BACKEND=eager`` forces the eager path, ``=compiled`` forces compilation.
"""

from __future__ import annotations

import linecache
import logging
import math
import os
import threading
import warnings
from functools import partial
from typing import Any, Callable, NamedTuple, TypeVar

import numpy as np
import torch

from ._blas import torch_threads_per_thread
from ._pool import row_ranges
from ._inputs import finite_flags

logger = logging.getLogger(__name__)

__all__ = ["count_beating", "count_beating_checked", "count_beating_tile", "count_beating_rows", "count_tied_before", "item_keys",
           "host_array", "numpy_path", "sort_rows", "set_backend", "get_backend"]

# below this many comparisons (B * P * n) the eager path is faster than calling a compiled kernel
_COMPILE_MIN_WORK = 1 << 24
# the same for the row-indexed kernel (its eager path gathers rows: slower per comparison)
_COMPILE_MIN_WORK_ROWS = 1 << 20
# comparisons done eagerly (auto backend) before the first compilation: ~4e9, a few seconds of eager counting on
# a CPU core, about what one torch.compile costs, so compiling is never slower overall than staying eager by
# more than about 2x, and small or one-off evaluations never compile
_COMPILE_AFTER_WORK = 1 << 32
# the same where the eager path is the CPU's numpy one (``_numpy_padded``: 1.1-1.35x the compiled kernel's time,
# against 20x for the torch loop): a compilation saves ~0.02 ns per comparison on the 2-core Xeon (one or two threads;
# more with more threads, whose numpy calls share the GIL), so it pays for its ~4 s after ~2e11 comparisons; at 2^36
# (~7e10, ~11 s of eager counting on one core) a compilation that never pays costs at most ~1.4x staying eager
_COMPILE_AFTER_WORK_FAST = 1 << 36
# the same on an accelerator: its eager loop (one pass per reference over whole rows, replayed from a CUDA graph where
# shapes repeat, ``_graphs``) reads the scores and writes and reads a (B, n) boolean per reference (~6 bytes per
# comparison) where the compiled kernel reads the scores once for a group of references (~1 byte per comparison with
# 5): at ~4e12 bytes/s (an H200) ~1.3e-12 s saved per comparison, against ~10 s per compilation (9.6 s measured there
# for the counting kernel; 2^32 comparisons, the CPU's bound, are ~10 ms of eager counting there, which put a
# compilation inside a first evaluation of 20,000 x 100,000 scores: 13.5 s for a pass of ~0.04 s); it pays after ~8e12,
# and compiling at 2^42 is never slower overall than staying eager by more than about 2x
_COMPILE_AFTER_WORK_ACCELERATOR = 1 << 42
_work_done = [0]  # comparisons counted so far in this process (shapes only: no device synchronisation)
_work_lock = threading.Lock()
# comparisons per chunk of the torch loop on a CPU (half-precision scores, the random tie policy): chunks of
# 2^19 / (B P) items (at least 64), 2x faster there than whole rows (1,024 x 100,000 scores, 5 references: the random
# tie policy 1.5-2.0 s against 4-9 s, bfloat16 0.9 against 1.9 s; the 2-core machine, one thread; the same as the
# former chunks, which compared all P references at once)
_EAGER_CPU_CHUNK_ELEMENTS = 1 << 19
_cpu_chunks = [True]  # tests clear it to run an accelerator's loop (whole rows) on a CPU


def _whole_rows(scores: torch.Tensor) -> bool:
    """Whether the torch loop compares whole rows (an accelerator: a fixed number of kernels per call whatever B and n;
    the former chunks of 2^22 comparisons launched ~5 kernels each, 5,981 operators for one ``exact_ranks`` call of
    1,024 x 100,000 scores with 5 positives, 93 now) or cache-sized chunks (a CPU)."""
    return scores.device.type != "cpu" or not _cpu_chunks[0]


_backend = os.environ.get("RECO_SAMPLED_BACKEND", "auto").lower()
_compiled: dict[str, Callable] = {}
_compile_failed: set[str] = set()
_lock = threading.Lock()


def set_backend(name: str) -> None:
    """Choose the counting backend: ``"auto"`` (default), ``"compiled"`` or ``"eager"``."""
    global _backend
    if name not in ("auto", "compiled", "eager"):
        raise ValueError(f"backend: expected 'auto', 'compiled' or 'eager', got {name!r}")
    _backend = name


def get_backend() -> str:
    """The current counting backend name."""
    return _backend


def work_done() -> int:
    """Comparisons counted so far in this process (the ``auto`` backend's clock)."""
    return _work_done[0]


def add_work(work: int) -> None:
    """Advance :func:`work_done` by ``work`` comparisons done without calling the kernels' Python (a replayed graph)."""
    with _work_lock:
        _work_done[0] += int(work)


def compile_stage() -> tuple[str, bool, bool, bool]:
    """What decides between the eager and the compiled kernels, apart from an input's size: the backend and whether
    this process has passed each compile threshold (part of a captured call's signature, :mod:`._graphs`)."""
    return (_backend, _work_done[0] >= _COMPILE_AFTER_WORK, _work_done[0] >= _COMPILE_AFTER_WORK_FAST,
            _work_done[0] >= _COMPILE_AFTER_WORK_ACCELERATOR)


# --- kernels (pure tensor functions; compiled on demand) -------------------------------------------


# The compiled kernels accumulate in int32 (counts are at most n < 2^31; `_run` checks): the generated
# reduction vectorises over int32 lanes, about twice as fast on CPU as an int64 accumulator (measured
# 21 vs 39 ms for 1,024 x 100,000 scores x 5 references). Callers get int64.
#
# Padded references (B, P) are counted in passes over the scores that each compare every score with up to
# _GROUP references held in registers (one load, P compares: 34 ms for 1,024 x 100,000 x 5 against 45 ms
# for a (B, P, n) reduction that re-reads each row P times; more than 5 references per pass spill
# registers: 6 took 51 ms, 8 took 96 ms). The same pass sums scores - scores per row, 0 for a finite
# row and NaN once the row holds a NaN or an infinity: the NaN/inf check rides along for about 5 ms
# instead of a separate 20-25 ms pass over the scores (aminmax). Each group size p is a separate
# function (own code object, own compile cache), built from this template.
_GROUP = 5
_MULTI_TEMPLATE = """
def kernel(scores, ref):
    counts = [(scores {op} ref[:, j : j + 1]).sum(1, dtype=torch.int32) for j in range({p})]
    return torch.stack(counts, 1), (scores - scores).sum(1)
"""


def _source_kernel(source: str, name: str, namespace: dict) -> Callable:
    """The function ``kernel`` that ``source`` defines, with its own code object (so its own torch.compile cache) and
    its source registered in ``linecache`` under ``<reco_sampled_plugin.counting name>``: tracebacks show its lines,
    and ``inspect.getsourcefile`` finds it. torch.compile before 2.13 wraps a function without a source file in one
    shared frame (``external_utils.wrap_inline``'s ``inner``), so that every kernel built here shared one cache and
    the ninth recompiled past ``recompile_limit`` (8) and ran eagerly (seen on an H200 with torch 2.11)."""
    filename = f"<reco_sampled_plugin.counting {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)  # mtime None: never dropped
    exec(compile(source, filename, "exec"), namespace)
    return namespace["kernel"]


def _multi_kernel(p: int, inclusive: bool) -> Callable:
    """(scores (B, n), ref (B, p)) -> (int32 counts (B, p), per-row sums of scores - scores (B,))."""
    source = _MULTI_TEMPLATE.format(op=">=" if inclusive else ">", p=p)
    return _source_kernel(source, f"{'ge' if inclusive else 'gt'}{p}", {"torch": torch})


# one reference per positive against its own row (an indirect row index): no padding to the largest
# number of positives per row; the compiled kernel reads the row in place (no gathered copy)
def _kernel_rows_gt(scores: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (scores[rows] > ref.unsqueeze(1)).sum(-1, dtype=torch.int32)


def _kernel_rows_ge(scores: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    return (scores[rows] >= ref.unsqueeze(1)).sum(-1, dtype=torch.int32)


_IntOrTensor = TypeVar("_IntOrTensor", int, torch.Tensor)


def mix32(x: _IntOrTensor) -> _IntOrTensor:
    """The package's one keyed-hash mix: a bijective 32-bit integer mix (xorshift-multiply), on int64 tensors
    holding 32-bit values (or Python ints: the same arithmetic, the same result)."""
    mask = 0xFFFFFFFF
    x = x & mask
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & mask
    x = ((x ^ (x >> 16)) * 0x45D9F3B) & mask
    return x ^ (x >> 16)


def item_keys(columns: torch.Tensor, row_seed: torch.Tensor) -> torch.Tensor:
    """Pseudo-random tie-breaking keys: distinct for distinct columns within a row (a bijection).

    ``columns`` (int64, any shape broadcastable with ``row_seed``) are item indices, ``row_seed``
    one int64 seed per row. Ordering tied items by key is a uniformly scrambled permutation.
    """
    return mix32(columns + row_seed)


# tied items with a smaller key, p references per pass ("tb{p}"), like the multi kernels: should it ever run
# eagerly (compile errors suppressed), its temporaries are (B, n), never (B, p, n)
_TIED_TEMPLATE = """
def kernel(scores, ref, ref_keys, row_seed, cols):
    keys = item_keys(cols, row_seed)
    counts = [((scores == ref[:, j : j + 1]) & (keys < ref_keys[:, j : j + 1])).sum(1, dtype=torch.int32) for j in range({p})]
    return torch.stack(counts, 1)
"""


def _tied_kernel(p: int) -> Callable:
    """(scores (B, n), ref (B, p), ref_keys (B, p), row_seed (B, 1), cols (1, n)) -> int32 (B, p) tied items with
    smaller keys."""
    return _source_kernel(_TIED_TEMPLATE.format(p=p), f"tb{p}", {"torch": torch, "item_keys": item_keys})


def host_array(x: torch.Tensor) -> np.ndarray:
    """A CPU tensor's values as a numpy array: a view (no copy, no dispatched operator unless it needs a detach),
    but of a view with torch's negative bit (``z.conj().imag``), which numpy cannot view: its values, copied."""
    return (x.detach() if x.requires_grad else x).resolve_neg().numpy()


def sort_rows(x: torch.Tensor) -> torch.Tensor:
    """``torch.sort(x, dim=-1).values``: on a CPU by numpy (a (256, 738) int64 / float32 block: 2 ms against torch's
    22 / 45 ms, measured on the 2-core machine); elsewhere (and for dtypes numpy lacks) by torch. The same values in
    the same order (ascending; NaN last in both; equal values are interchangeable)."""
    if x.device.type == "cpu" and x.dtype in _NUMPY_SORTED and x.dim() and x.shape[-1] > 1 and not _numpy_blocked[0]:
        return torch.from_numpy(np.sort(host_array(x), axis=-1))
    return torch.sort(x, dim=-1).values


_NUMPY_SORTED = (torch.int32, torch.int64, torch.float32, torch.float64)


_KERNELS: dict[str, Callable] = {
    "rows_gt": _kernel_rows_gt,
    "rows_ge": _kernel_rows_ge,
}


def _one_graph(compiled: Callable) -> Callable:
    """``compiled`` called so that the forms of one input that count alike share one graph (a compiled function guards
    on each form, and would trace, and compile or look up its cache, once more for each): without autograd whatever
    the caller's grad mode (the counts are integers), on detached arguments. Grad mode and ``requires_grad`` are
    guarded on (a training loop's validation counts both inside and outside ``torch.no_grad()``); and a view is traced
    with its base (a tile of the factor path's flat buffer), so that a graph traced for a view guards on its base and
    misses a tensor of its own, or the reverse; a detached tensor is no view."""

    def call(*args: torch.Tensor) -> Any:
        with torch.no_grad():
            return compiled(*(a.detach() for a in args))

    return call


def _get_compiled(name: str) -> Callable | None:
    if name in _compile_failed:
        return None
    fn = _compiled.get(name)
    if fn is None:
        with _lock:
            fn = _compiled.get(name)
            if fn is None:
                kernel = _KERNELS.get(name) or (
                    _tied_kernel(int(name[2:])) if name.startswith("tb") else _multi_kernel(int(name[2:]), name.startswith("ge")))
                fn = _one_graph(torch.compile(kernel, dynamic=True))
                _compiled[name] = fn
                logger.debug("counting kernel %s: compiled path chosen (backend %r, %d comparisons counted in this "
                             "process); torch.compile runs at its first call", name, _backend, _work_done[0])
    return fn


def _count_true(mask: torch.Tensor) -> torch.Tensor:
    """Number of True entries along the last axis, accumulated in int32 where a row cannot overflow it (fewer than
    2^31 entries): a bool tensor's ``.sum()`` accumulates in int64 through a slow path on CPU (60 ms against 9 ms
    for 2,490 x 1,682 entries, measured on a 2-core CPU); the counts are the same integers either way."""
    return mask.sum(-1, dtype=torch.int32 if mask.shape[-1] < 2**31 - 1 else torch.int64)


# elements of a block from which the torch loop counts its masks by their bytes (:func:`_count_columns`): below, the
# plain sum's fewer operators (each a kernel launch, ~10 us from Python) cost more than the bytes saved (8 per element,
# ~3 us per 2^20 at an H200's bandwidth)
_WORD_COUNT_MIN = 1 << 23


def _cols(x: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """Columns lo:hi of ``x`` (``x`` itself when that is all of them: no operator)."""
    return x if lo == 0 and hi == x.shape[-1] else x[..., lo:hi]


def _beating(compare: Callable, block: torch.Tensor, ref: torch.Tensor, lo: int, hi: int) -> torch.Tensor:
    """``compare(block, ref)`` on columns lo:hi of ``block`` (a (B, 1) reference column)."""
    return compare(_cols(block, lo, hi), ref)


def _tied_smaller(block: torch.Tensor, keys: torch.Tensor, ref: torch.Tensor, ref_key: torch.Tensor, lo: int,
                  hi: int) -> torch.Tensor:
    """Columns lo:hi of ``block`` tied with the (B, 1) reference whose tie-break keys are smaller than its key."""
    return (_cols(block, lo, hi) == ref) & (_cols(keys, lo, hi) < ref_key)


def _words_view(mask: torch.Tensor) -> bool:
    """Whether a bool mask can be read as 64-bit words along its last axis in place: unit stride there, every other
    stride and the storage offset whole words (``is_contiguous`` ignores size-1 axes: a (1, n) view of an (n, 1)
    tensor has row stride 1)."""
    return mask.stride(-1) == 1 and mask.storage_offset() % 8 == 0 and all(st % 8 == 0 for st in mask.stride()[:-1])


def _count_columns(mask_of: Callable[[int, int], torch.Tensor], rows: int, n: int) -> torch.Tensor:
    """True entries along the last axis of the (rows, n) bool mask that ``mask_of(lo, hi)`` builds for columns lo:hi,
    int32. From ``_WORD_COUNT_MIN`` elements, the first 8 g k columns (g groups of k <= 255 whole 64-bit words) are
    counted from the mask's bytes: the words summed per group (no byte lane exceeds 255, so none carries), then the
    groups' lanes; the last < 8 (g + 1) columns, where any are left, by :func:`_count_true`. The mask is read once, a
    byte per entry, where ``_count_true``'s int32 sum first casts it (4 bytes written and read again): with the
    compare, 6 bytes per float32 score against 14 (the eager accelerator path's ten metrics spent 3.2 of their 4.2 ms
    per 1,024 x 100,000 batch in those casts and sums on an H200), for one more kernel (and 5 metadata operators).
    Smaller masks, a mask not readable as words (:func:`_words_view`), n < 8: :func:`_count_true`."""
    words = n // 8
    if rows * n < _WORD_COUNT_MIN or not words or n >= 2**31 - 1:
        return _count_true(mask_of(0, n))
    groups = -(-words // 255)
    k = words // groups
    head = 8 * groups * k
    mask = mask_of(0, head)
    if not _words_view(mask):
        counts = _count_true(mask)
    else:
        lanes = mask.view(torch.int64).view(*mask.shape[:-1], groups, k).sum(-1)  # int64 in, int64 out: no cast
        counts = lanes.view(torch.uint8).sum(-1, dtype=torch.int32)
    return counts if head == n else counts + _count_true(mask_of(head, n))


def numpy_path(scores: torch.Tensor) -> bool:
    """Whether the CPU's numpy paths take ``scores`` (the counting's, and other modules' that follow it): float32 /
    float64 CPU tensors that numpy can view (bfloat16, float16 and other devices take the torch loop), unless the
    tests block them to run the accelerators' torch paths on a CPU. The CPU eager path compares in numpy (SIMD
    comparisons into a reused byte buffer: about 6x torch's comparison into a bool tensor, measured 6 vs 37 ms for
    3.2e7 float32 comparisons)."""
    return (scores.device.type == "cpu" and scores.dtype in (torch.float32, torch.float64) and scores.shape[-1] > 0
            and not _numpy_blocked[0])


_numpy_blocked = [False]  # tests flip it to run the torch loop on a CPU (the reference of the numpy path)


def _l2_bytes(base: str = "/sys/devices/system/cpu/cpu0/cache") -> int | None:
    """A core's L2 cache in bytes where Linux says (sysfs: ``index*/level`` 2, its ``size`` as "2048K"), else None."""
    try:
        for index in sorted(os.listdir(base)):
            with open(f"{base}/{index}/level") as f:
                if f.read().strip() != "2":
                    continue
            with open(f"{base}/{index}/size") as f:
                size = f.read().strip().upper()
            scale = {"K": 1 << 10, "M": 1 << 20}.get(size[-1:], 1)
            return int(size.rstrip("KM")) * scale
    except (OSError, ValueError):
        pass
    return None


# bytes a block of the numpy path keeps in cache: its scores (rows x a segment of items) and their comparison bytes
# (rows x references x items): half a core's L2 (256 KiB to 2 MiB; 512 KiB where the machine does not say), so the
# block compared against each group of references and then checked for NaN/inf is read from L2, not from memory.
# 1,024 x 100,000 float32 scores, 5 references, with the NaN/inf flags, the 2-core machine (L2 2 MiB), one thread:
# 89 ms at 0.5-1 MiB against 123 ms at the former 2 MiB of comparison bytes alone (5 rows of scores: 3.6 MiB in all)
_NUMPY_CHUNK_BYTES = min(max((_l2_bytes() or 1 << 20) // 2, 1 << 18), 1 << 21)
_NUMPY_GROUP = 8  # references compared per numpy call at most (balanced groups)
# rows per block below which the NaN/inf check is two more references compared with the others (:func:`_sentinels`:
# two numpy calls fewer per block; above, a min and a max per block cost less than the sentinels' compares). Two
# threads, the 2-core machine, float32, 5 references, three alternating runs: 1,024 x 100,000 (one row per block)
# 53-57 -> 48-50 ms, 4,096 x 20,000 (4 rows) 44-46 -> 36; 16,384 x 2,000 (47 rows) 35-38 with either; one thread the same
_SENTINEL_ROWS = 8


def _lanes(n: int) -> tuple[int, int]:
    """(groups, words per group) of a row of n comparison bytes read as 64-bit words: each group sums at most 255
    words, so each byte lane of the sum counts at most 255 and never carries into the next (SWAR counting)."""
    words = -(-n // 8)
    groups = max(1, -(-words // 255))
    return groups, -(-words // groups)


class _Blocks(NamedTuple):
    """How the numpy path walks a (b, n) score matrix: ``rows`` rows at a time, items in ``segment``-long ranges,
    ``group`` references per comparison; ``size`` bytes of comparison buffer per worker."""

    rows: int
    segment: int
    group: int
    size: int


def _blocks(b: int, n: int, p: int, itemsize: int) -> _Blocks:
    """Blocks whose scores and comparison bytes fit ``_NUMPY_CHUNK_BYTES``, the bytes never more than the b x n
    scores (the temporaries' bound, docs/gpu.md): references in balanced groups of at most ``_NUMPY_GROUP``, fewer
    where that keeps a whole row in a block of up to 1.5 x that budget (a segment costs numpy calls: their Python
    holds the GIL, which threads share; two threads, 1,024 x 100,000 float32 scores with 5 references and the two
    sentinels, 1.1 MB a row: 58-62 ms in two segments, 47-50 whole), else items in balanced segments (multiples of 8:
    whole 64-bit words); then as many rows as fit (at least one)."""
    cap = min(_NUMPY_CHUNK_BYTES, b * n)
    whole = _NUMPY_CHUNK_BYTES * 3 // 2  # a whole row may take 3/4 of L2: a segment costs numpy calls
    fit = whole // max(n, 1) - itemsize  # references whose bytes fit beside a whole row's scores
    most = min(p, _NUMPY_GROUP, fit if fit >= 1 else _NUMPY_GROUP, max(b, 1))  # at most b: bytes within b x n
    group = -(-p // -(-p // most))  # balanced groups of at most ``most``
    per_item = itemsize + group
    segments = 1 if n * per_item <= whole else -(-n * per_item // _NUMPY_CHUNK_BYTES)
    segment = min(n, -(-(-(-n // segments)) // 8) * 8)
    groups, k = _lanes(segment)
    rows = max(1, min(b, _NUMPY_CHUNK_BYTES // (segment * per_item), cap // (group * groups * k * 8)))
    return _Blocks(rows, segment, group, rows * group * groups * k * 8)


class _Segment(NamedTuple):
    """Items ``lo``..``hi`` of a row, their comparison bytes as ``groups`` x ``words`` 64-bit words (:func:`_lanes`;
    ``width`` bytes in all), whose word sums go to lanes ``at``..``at + groups`` of the row's (:func:`_segments`)."""

    lo: int
    hi: int
    groups: int
    words: int
    width: int
    at: int


def _segments(n: int, segment: int) -> tuple[list[_Segment], int]:
    """The segments of a row of n items (``segment`` long, the last one shorter) and their lanes in all."""
    out, at = [], 0
    for lo in range(0, n, segment):
        hi = min(lo + segment, n)
        groups, k = _lanes(hi - lo)
        out.append(_Segment(lo, hi, groups, k, groups * k * 8, at))
        at += groups
    return out, at


def _buffers(size: int, parts: list[_Segment]) -> dict[int, np.ndarray]:
    """A worker's comparison buffers, one of ``size`` bytes per segment length (at most two), their bytes past the
    segment in each row of ``width`` zero whatever (rows, references) shape they are viewed as: lanes that count
    nothing, written once."""
    out = {}
    for part in parts:
        if part.hi - part.lo not in out:
            flat = torch.empty(size, dtype=torch.uint8).numpy().view(np.bool_)
            flat[: size // part.width * part.width].reshape(-1, part.width)[:, part.hi - part.lo:] = False
            out[part.hi - part.lo] = flat
    return out


def _numpy_padded(scores: torch.Tensor, ref: torch.Tensor, inclusive: bool,
                  finite: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """:func:`_padded`'s eager path on a CPU (:func:`_numpy_counts` over the rows as they are)."""
    counts, flags = _numpy_counts(host_array(scores), host_array(ref), inclusive, finite)
    return torch.from_numpy(counts), None if flags is None else torch.from_numpy(flags)


def _sentinels(t: np.ndarray, dtype: np.dtype, inclusive: bool) -> np.ndarray:
    """``t`` with two references appended whose counts say whether a row of ``dtype`` scores is finite: with ``>``,
    -inf (beaten by every score but NaN and -inf: n where the row has neither) and the largest finite value (beaten by
    +inf alone: 0 where the row has none); with ``>=``, the lowest finite value and +inf."""
    big = np.finfo(dtype).max
    out = np.empty((t.shape[0], t.shape[1] + 2), dtype=np.result_type(t.dtype, dtype))
    out[:, :-2] = t
    out[:, -2:] = (-big, np.inf) if inclusive else (-np.inf, big)
    return out


def _numpy_counts(s: np.ndarray, t: np.ndarray, inclusive: bool, finite: bool,
                  at: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray | None]:
    """(b, p) counts of the scores of row ``at[i]`` of ``s`` (row i where ``at`` is None) beating ``t[i]``, and the
    rows' finite flags. The scores in cache-sized blocks (:func:`_blocks`: rows, and segments of items where a row
    does not fit) are compared by numpy with each group of references into byte buffers allocated once per worker
    (:func:`_buffers`; rows picked by ``at`` are gathered into one as well), their 64-bit words summed into lanes
    (:func:`_lanes`) whose bytes each worker adds up once its rows are done. The NaN/inf flags, while the block is in
    cache: where a block holds fewer than ``_SENTINEL_ROWS`` rows, the counts of two more references compared in the
    same numpy calls (:func:`_sentinels`: the calls' Python holds the GIL, which threads share, and a block of one
    row is all calls), else each block's min and max (both propagate NaN; numpy's SIMD reductions). Every numpy call
    of a block writes into its place (``out=``): an allocation per block costs the threads a third of their gain (two
    threads, 256 x 1,000,000 scores), and a gathered block that outlives the next one's allocation costs fresh pages.
    Large inputs split their rows between torch's intra-op threads (numpy releases the GIL in its loops). Memory
    besides the buffers: the lanes, b x (p + 2) x ceil(n / 2,040) 8-byte words ((p + 2) / 1,020 of float32 scores'
    bytes). Counts equal the torch loop's (the same IEEE comparisons: NaN beats nothing, nothing beats a NaN
    reference)."""
    p, n = t.shape[1], s.shape[1]
    sentinel = finite and _blocks(t.shape[0], n, p + 2, s.itemsize).rows < _SENTINEL_ROWS
    if sentinel:
        t = _sentinels(t, s.dtype, inclusive)
    b, refs = t.shape
    rows, segment, group, size = _blocks(b, n, refs, s.itemsize)
    parts, total = _segments(n, segment)
    lanes = np.empty((b, refs, total), dtype=np.uint64)
    counts = np.empty((b, refs), dtype=np.int64)
    ends = np.empty((2, b, len(parts)), dtype=s.dtype) if finite and not sentinel else None  # blocks' min and max
    compare = np.greater_equal if inclusive else np.greater

    def work(first: int, last: int) -> None:
        bufs = _buffers(size, parts)
        picked = None if at is None else np.empty((rows, segment), dtype=s.dtype)  # rows gathered in place
        for lo in range(first, last, rows):  # cache-sized blocks; each is one vectorised compare and count per group
            hi = min(lo + rows, last)
            for j, part in enumerate(parts):
                if picked is None or at is None:
                    block = s[lo:hi, part.lo:part.hi]
                else:
                    block = picked[: hi - lo, : part.hi - part.lo]
                    np.take(s[:, part.lo:part.hi], at[lo:hi], axis=0, out=block, mode="clip")  # in range: no check
                flat, w = bufs[part.hi - part.lo], part.width
                for g in range(0, refs, group):
                    q = min(group, refs - g)
                    cells = flat[: (hi - lo) * q * w].reshape(hi - lo, q, w)
                    compare(block[:, None, :], t[lo:hi, g:g + q, None], out=cells[..., :part.hi - part.lo])
                    np.add.reduce(cells.view(np.uint64).reshape(hi - lo, q, part.groups, part.words), axis=-1,
                                  out=lanes[lo:hi, g:g + q, part.at:part.at + part.groups])
                if ends is not None:
                    np.minimum.reduce(block, axis=1, out=ends[0, lo:hi, j])
                    np.maximum.reduce(block, axis=1, out=ends[1, lo:hi, j])
        np.add.reduce(lanes[first:last].view(np.uint8).reshape(last - first, refs, total * 8), axis=-1,
                      out=counts[first:last])

    _in_threads(work, b, rows, b * refs * n)
    if not finite:
        return counts, None
    if ends is not None:
        return counts, np.asarray(np.isfinite(ends).all(axis=(0, 2)))
    return np.ascontiguousarray(counts[:, :p]), (counts[:, p] == n) & (counts[:, p + 1] == 0)


# comparisons of one call from which the CPU eager path splits its rows between threads (below, one thread). Two
# threads against one, best of 15 (the 2-core machine, 5 references): 1e7 comparisons 0.79-1.15 ms against 0.85-0.88,
# 2e7 2.24 against 2.38-2.88, 4e7 2.9-3.1 against 4.3-4.5; the factor path's tiles (2^21 scores: 1e7 comparisons with
# 5 positives, 200 per 4,096 x 100,000 evaluation) split at 2^23 made its first pass 1.30-1.56 s against 0.94-1.21 s
# unsplit (three alternating pairs, torch's two threads)
_THREAD_MIN_WORK = 1 << 25


def _in_threads(work: Callable[[int, int], None], b: int, rows: int, comparisons: int) -> None:
    """Run ``work(first, last)`` over rows 0..b in ranges of whole blocks of ``rows``, one range per torch intra-op
    thread for large inputs (``comparisons`` >= ``_THREAD_MIN_WORK``)."""
    row_ranges(work, b, rows, min(torch.get_num_threads(), -(-b // rows)) if comparisons >= _THREAD_MIN_WORK else 1)


def tile_workers(tiles: int, work: int, dtype: torch.dtype = torch.float32) -> int:
    """Threads for a CPU loop of ``tiles`` score tiles (``factor_ranks``'; ``work`` the call's comparisons in all)
    of ``dtype`` counted on numpy's eager path (float32 / float64): torch's intra-op threads, each taking a range of
    tiles with their matmuls on one thread (:func:`row_ranges`; torch's OpenMP backend, whose thread count is set per
    thread), where the work reaches ``_THREAD_MIN_WORK`` and no tile of the call can reach a
    compiled kernel (whose compilation must not start in a worker, and which threads itself); else 1 (each tile's
    matmul threaded by torch, its count on one thread: at 2 threads a core idle while it counts). 4,096 x 100,000
    scores from d = 64 factors, 5 positives, the 2-core machine, six alternating runs, medians: in calls of 256 /
    1,024 / 4,096 users 0.71 / 0.67 / 0.64 s on one loop against 0.62 / 0.52 / 0.45 s in two."""
    threads = torch.get_num_threads()
    if threads < 2 or work < _THREAD_MIN_WORK or tiles < 2 or _numpy_blocked[0] or \
            dtype not in (torch.float32, torch.float64) or not torch_threads_per_thread():
        return 1  # half precision: the torch loop, compiled from 2^32; a process-wide pool: its matmuls would contend
    if _backend == "compiled" or (_backend == "auto" and _work_done[0] + work >= _COMPILE_AFTER_WORK_FAST
                                  and not _dynamo_disabled() and not {"ge", "gt"} <= _compile_failed):
        return 1
    return threads


def _numpy_rows(inclusive: bool, scores: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """:func:`_eager_rows` on a CPU: the references grouped by their row, w side by side (NaN padding: nothing beats
    it), so that a row is compared with w of them per pass while it is in cache (:func:`_numpy_counts` over units
    of a row and up to w of its references), w in 1..8 the cheapest for the rows' reference counts: a pass costs about
    ``_ROW_PASS`` + w references' comparisons (a row's gather and first read against its compares), so one row with
    many references does not pad every other row to its width."""
    idx, t = host_array(rows), host_array(ref)
    out = np.zeros(idx.shape[0], dtype=np.int64)
    if idx.size == 0:
        return torch.from_numpy(out)
    order = np.argsort(idx, kind="stable")
    at, first, per = np.unique(idx[order], return_index=True, return_counts=True)
    if at[0] < 0 or at[-1] >= scores.shape[0]:  # the gathers below would clip (torch's indexing raises)
        raise ValueError(f"rows: row indices must lie in 0..{scores.shape[0] - 1}, got {int(at[0])}..{int(at[-1])}")
    w = min(range(1, _NUMPY_GROUP + 1), key=lambda q: int((-(-per // q) * (_ROW_PASS + q)).sum()))
    units = -(-per // w)  # passes per row
    slot = np.arange(idx.size) - np.repeat(first, per)  # each reference's place among its row's
    unit = np.repeat(np.cumsum(units) - units, per) + slot // w
    padded = np.full((int(units.sum()), w), np.nan, dtype=t.dtype)
    padded[unit, slot % w] = t[order]
    counts, _ = _numpy_counts(host_array(scores), padded, inclusive, False, np.repeat(at, units))
    out[order] = counts[unit, slot % w]
    return torch.from_numpy(out)


# a row's pass of the row-indexed count, in references' comparisons (1,024 x 100,000 float32, one thread: 1 / 2 / 5
# references per row 60 / 67 / 98 ms, ~52 ms per pass over the rows and ~9 ms per reference)
_ROW_PASS = 6


def _eager(name: str, scores: torch.Tensor, ref: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
    """The eager kernels: on a CPU the comparisons and counts run in numpy (:func:`_numpy_padded`, :func:`_numpy_rows`);
    elsewhere (and for half-precision scores or the random tie policy) a torch loop, one pass per reference over
    chunks of items (:func:`_whole_rows`: whole rows on an accelerator, so that the operators dispatched do not grow
    with B or n)."""
    if name.startswith("rows_"):
        if numpy_path(scores) and ref.numel():
            return _numpy_rows(name == "rows_ge", scores, extra[0], ref)
        return _eager_rows(name == "rows_ge", scores, extra[0], ref)
    if name in ("gt", "ge") and numpy_path(scores) and ref.numel():
        return _numpy_padded(scores, ref, name == "ge", False)[0]
    b, n = scores.shape
    p = ref.shape[1]
    if not p:
        return torch.zeros(ref.shape, dtype=torch.int64, device=scores.device)
    compare = torch.ge if name == "ge" else torch.gt
    out = None
    # items per pass: whole rows on an accelerator; on a CPU a cache-sized chunk (at least 64 items at large B P)
    step = max(n, 1) if _whole_rows(scores) else max(64, _EAGER_CPU_CHUNK_ELEMENTS // max(b * p, 1))
    for start in range(0, max(n, 1), step):  # one chunk (whole rows) on an accelerator
        block = scores if step >= n else scores[:, start : start + step]
        if name == "tied_before":  # equal scores with smaller tie-break keys
            ref_keys, row_seed = extra
            cols = torch.arange(start, start + block.shape[1], device=scores.device, dtype=torch.int64)
            keys = item_keys(cols.unsqueeze(0), row_seed)
            parts = [_count_columns(partial(_tied_smaller, block, keys, ref[:, j : j + 1], ref_keys[:, j : j + 1]),
                                    *block.shape) for j in range(p)]
        else:
            parts = [_count_columns(partial(_beating, compare, block, ref[:, j : j + 1]), *block.shape)
                     for j in range(p)]
        counts = torch.stack(parts, 1)
        out = counts if out is None else out + counts
    assert out is not None  # at least one pass
    return out.to(torch.int64)


def _eager_rows(inclusive: bool, scores: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor) -> torch.Tensor:
    """:func:`count_beating_rows` in torch: the positives' rows gathered in blocks (of B rows on an accelerator: the
    gathered block within the score block, about P passes whatever n; cache-sized on a CPU)."""
    step = max(1, scores.shape[0] if _whole_rows(scores) else _EAGER_CPU_CHUNK_ELEMENTS // max(scores.shape[1], 1))
    parts = []
    for start in range(0, ref.shape[0], step):
        block = scores.index_select(0, rows[start : start + step])
        t = ref[start : start + step].unsqueeze(1)
        parts.append(_count_columns(partial(_beating, torch.ge if inclusive else torch.gt, block, t), *block.shape))
    if not parts:
        return torch.zeros(ref.shape, dtype=torch.int64, device=scores.device)
    return (parts[0] if len(parts) == 1 else torch.cat(parts)).to(torch.int64)


def _use_compiled(work: int, n: int, tile: bool = False, fast_eager: bool = False, accelerator: bool = False) -> bool:
    """Compiled kernel or eager path: with the ``auto`` backend, large inputs (any size for a tile of a tiled
    loop) once the process has counted ``_COMPILE_AFTER_WORK`` comparisons (``_COMPILE_AFTER_WORK_FAST`` where the
    eager path is the numpy one, ``fast_eager``; ``_COMPILE_AFTER_WORK_ACCELERATOR`` on an accelerator);
    ``compiled`` / ``eager`` force one path. int32 accumulators need n < 2^31."""
    add_work(work)  # under a lock: tiles are counted from several threads (:func:`tile_workers`)
    if _backend == "eager":
        return False
    if _backend == "auto":
        after = (_COMPILE_AFTER_WORK_FAST if fast_eager else
                 _COMPILE_AFTER_WORK_ACCELERATOR if accelerator else _COMPILE_AFTER_WORK)
        wanted = (tile or work >= _COMPILE_MIN_WORK) and _work_done[0] >= after
    else:
        wanted = True
    return wanted and n < 2**31 - 1 and not _dynamo_disabled()


def _dynamo_disabled() -> bool:
    """torch.compile switched off (``TORCHDYNAMO_DISABLE=1``): its functions would run the kernels eagerly, unchunked."""
    try:
        import torch._dynamo

        return bool(torch._dynamo.config.disable)
    except Exception:  # pragma: no cover - no dynamo in this build
        return True


def _is_oom(exc: BaseException) -> bool:
    """An out-of-memory error (the input is too large, not a compiler problem): re-raised, never a fallback."""
    oom = getattr(torch, "OutOfMemoryError", None)
    return (oom is not None and isinstance(exc, oom)) or (isinstance(exc, RuntimeError) and "out of memory" in str(exc).lower())


def _compile_failure(name: str, exc: Exception) -> None:
    """A failed compiled kernel: re-raise out-of-memory errors; otherwise warn once and use the eager path for
    this kernel from now on."""
    if _is_oom(exc):
        raise exc
    _compile_failed.add(name)
    warnings.warn(
        f"reco_sampled_plugin: torch.compile of the counting kernel failed ({type(exc).__name__}: "
        f"{str(exc).splitlines()[0] if str(exc) else ''}); using the slower eager path (fix the compiler toolchain, "
        "or choose the eager path: counting.set_backend('eager') or RECO_SAMPLED_BACKEND=eager)",
        RuntimeWarning,
        stacklevel=4,
    )


def _fresh(ref: torch.Tensor) -> torch.Tensor:
    """A group of references as a compiled kernel's argument: a copy with its own storage and row-major strides (B x
    at most ``_GROUP`` values). A slice of the caller's references (or one row of a tile) keeps its base's strides,
    which the compiled function guards on (a one-row view leaves them free): it would compile again for the next slice
    or row count. (Its base is not traced: :func:`_one_graph` detaches the arguments.)"""
    return ref.clone(memory_format=torch.contiguous_format)


def _run(name: str, scores: torch.Tensor, ref: torch.Tensor, *extra: torch.Tensor) -> torch.Tensor:
    if name.startswith("rows_"):  # (rows, ref) per positive: compiled from a smaller size (no padding)
        work = scores.shape[1] * ref.shape[0] * (_COMPILE_MIN_WORK // _COMPILE_MIN_WORK_ROWS)
        fn_args: tuple = (extra[0], ref)
    else:
        work = scores.shape[0] * scores.shape[1] * max(ref.shape[1], 1)
        fn_args = (ref, *extra)
    if _use_compiled(work, scores.shape[1], fast_eager=numpy_path(scores), accelerator=scores.device.type != "cpu"):
        fn = _get_compiled(name)
        if fn is not None:
            try:
                return fn(scores, *fn_args).to(torch.int64)
            except Exception as exc:  # compilation unavailable (no compiler, no triton...): fall back once
                _compile_failure(name, exc)
    return _eager(name, scores, ref, *extra)


def _padded(scores: torch.Tensor, ref: torch.Tensor, inclusive: bool, finite: bool,
            tile: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Counts (B, P) int64 of scores beating each padded reference, and (when ``finite``) the (B,) bool
    finite rows; compiled in passes of up to ``_GROUP`` references, else eager (small inputs unless
    ``tile``, or the eager backend)."""
    b, n = scores.shape
    p = ref.shape[1]
    family = "ge" if inclusive else "gt"
    compiled = _use_compiled(b * n * p, n, tile, numpy_path(scores), scores.device.type != "cpu")
    if p and compiled and family not in _compile_failed:
        size = math.ceil(p / math.ceil(p / _GROUP))  # balanced groups of at most _GROUP references
        try:
            parts: list[torch.Tensor] = []
            row_sums: Any = None
            for start in range(0, p, size):
                fn = _get_compiled(f"{family}{min(size, p - start)}")
                assert fn is not None  # None only for a name in _compile_failed (this family is not)
                counts, sums = fn(scores, _fresh(ref[:, start : start + size]))
                parts.append(counts)
                row_sums = sums if row_sums is None else row_sums
            counts = (parts[0] if len(parts) == 1 else torch.cat(parts, 1)).to(torch.int64)
            return counts, (row_sums == 0 if finite else None)
        except Exception as exc:  # compilation unavailable (no compiler...): fall back once
            _compile_failure(family, exc)
    if p and numpy_path(scores):
        return _numpy_padded(scores, ref, inclusive, finite)
    return _eager(family, scores, ref), (finite_flags(scores, dim=1) if finite else None)


def count_beating(scores: torch.Tensor, ref: torch.Tensor, inclusive: bool = False) -> torch.Tensor:
    """Count, for each ``ref[b, p]``, the entries of ``scores[b, :]`` that are > it (>= if ``inclusive``).

    Args:
        scores: (B, n) floating scores.
        ref: (B, P) reference scores, same dtype and device.
        inclusive: count ties too (``>=``).

    Returns:
        (B, P) int64 counts.
    """
    return _padded(scores, ref, inclusive, False)[0]


def count_beating_tile(scores: torch.Tensor, ref: torch.Tensor, inclusive: bool = False) -> torch.Tensor:
    """:func:`count_beating` for one cache-sized tile of a larger score matrix: compiled whatever the tile's
    size (the per-call threshold that keeps small one-off inputs eager does not apply to a loop of tiles),
    unless the backend is ``eager``."""
    return _padded(scores, ref, inclusive, False, tile=True)[0]


def count_beating_checked(scores: torch.Tensor, ref: torch.Tensor, inclusive: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`count_beating` and, from the same pass over the scores, which rows are free of NaN and inf.

    Returns:
        ((B, P) int64 counts, (B,) bool: True where every score of the row is finite).
    """
    counts, finite = _padded(scores, ref, inclusive, True)
    assert finite is not None  # finite=True: the flags are computed
    return counts, finite


def count_beating_rows(scores: torch.Tensor, rows: torch.Tensor, ref: torch.Tensor, inclusive: bool = False) -> torch.Tensor:
    """Count, for each positive j, the entries of ``scores[rows[j], :]`` that are > ``ref[j]`` (>= if
    ``inclusive``): one reference per positive against its own row, for rows with different numbers of
    positives (no padding to the largest, unlike :func:`count_beating`).

    Args:
        scores: (B, n) floating scores.
        rows: (N,) int64 row of each positive, in 0..B-1.
        ref: (N,) reference scores, same dtype and device as ``scores``.
        inclusive: count ties too (``>=``).

    Returns:
        (N,) int64 counts.
    """
    if rows.shape != ref.shape or rows.dim() != 1:
        raise ValueError(f"rows / ref: expected two 1-D tensors of one length, got {tuple(rows.shape)} and {tuple(ref.shape)}")
    return _run("rows_ge" if inclusive else "rows_gt", scores, ref, rows)


def count_tied_before(scores: torch.Tensor, ref: torch.Tensor, ref_keys: torch.Tensor, row_seed: torch.Tensor) -> torch.Tensor:
    """Count the entries of ``scores[b, :]`` equal to ``ref[b, p]`` whose :func:`item_keys` key is
    smaller than ``ref_keys[b, p]``: the tied items a seeded random tie-break puts in front.
    (B, P) int64; compiled in passes of up to ``_GROUP`` references for large inputs, else eager in chunks."""
    b, n = scores.shape
    p = ref.shape[1]
    if p and _use_compiled(b * n * p, n, accelerator=scores.device.type != "cpu") and "tb" not in _compile_failed:
        size = math.ceil(p / math.ceil(p / _GROUP))
        try:
            parts = []
            cols = torch.arange(n, device=scores.device, dtype=torch.int64).unsqueeze(0)  # (1, n) item indices
            for start in range(0, p, size):
                sl = slice(start, start + size)
                fn = _get_compiled(f"tb{min(size, p - start)}")
                assert fn is not None  # None only for a name in _compile_failed ("tb" is not)
                parts.append(fn(scores, _fresh(ref[:, sl]), _fresh(ref_keys[:, sl]), row_seed, cols))
            return (parts[0] if len(parts) == 1 else torch.cat(parts, 1)).to(torch.int64)
        except Exception as exc:  # compilation unavailable: fall back once (out-of-memory errors propagate)
            _compile_failure("tb", exc)
    return _eager("tied_before", scores, ref, ref_keys, row_seed)
