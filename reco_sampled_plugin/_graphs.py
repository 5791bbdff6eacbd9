"""A hot path's device work captured in a CUDA graph and replayed, where a call's shapes repeat.

On a GPU a batch's exact ranks and metrics are ~70-300 small kernels, each launched from Python at ~15 us on the
hosts measured (BENCHMARKS.md, "GPU"): a batch of 1,024 x 100,000 scores spends ~6 ms dispatching what the device does
in under 1 ms. A CUDA graph records those launches once and replays them in one. :func:`run` does that for a pure
device function ``fn(*tensors) -> tuple of tensors`` that reads nothing back to the host (the callers' checks are
returned as flags and read once after the replay):

* a call is captured the second time its *signature* is seen (shapes, strides, dtypes, device, the caller's options
  and the counting backend's stage), so one-off shapes never pay for a capture (a warm-up run and the capture: about
  two calls' time), and an evaluation loop's batches (and its shorter last batch, seen again each epoch) replay;
* inputs: a graph reads the addresses it was captured with. Small inputs (at most ``_COPY_ELEMENTS`` elements) are
  copied into buffers of the graph's own before each replay; larger ones (the scores) are read in place, their
  addresses part of the signature: a call is captured when its scores sit where one of its signature's last
  ``_RECENT`` calls had them (an evaluation loop writing each batch's scores into a block the allocator freed, or
  alternating between two), and scores at a new address every call are never captured (no copy of a score batch is
  ever kept);
* outputs are the graph's own buffers, overwritten by the next replay: :func:`run` returns copies;
* ``fn`` must not read a device tensor cached across calls (a replay would read that memory after the cache let it
  go, and never sees the cache's Python): it computes such values itself (``factor_ranks.overflow_flag(cached=False)``);
* any error while capturing marks the signature as not capturable (that call and the later ones run ``fn`` as it is;
  a debug log says why); ``RECO_SAMPLED_GRAPHS=off`` turns capture off, as ``RECO_SAMPLED_BACKEND=eager`` (or
  ``counting.set_backend("eager")``) does with compilation.

Memory: at most ``_MAX_GRAPHS`` captured calls per process, each holding its temporaries (the same bytes as one
eager call's peak: a (B, n) boolean on the eager counting path) and copies of its small inputs. When they are all
held, a new signature is captured only in place of the least recently used one, and only where that one went
unused for ``_STALE`` calls: a loop cycling through more signatures than fit keeps replaying the ones it holds and
runs the others eagerly, instead of capturing each anew (a capture costs about two calls) and evicting the next.
The counting backend's work counter advances on each replay by the work the captured call counted, so a long
evaluation still reaches the compiled kernels (a new signature: captured again with them).
"""

from __future__ import annotations

import logging
import os
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Sequence

import torch
from torch.overrides import TorchFunctionMode

from . import counting

logger = logging.getLogger(__name__)

# captured calls kept per process (each holds its temporaries and copied inputs)
_MAX_GRAPHS = 8
# calls (to any captured function) for which a held graph must go unused before a new signature may take its place
_STALE = 64
# inputs of at most this many elements are copied into the graph's buffers before each replay (a launch each);
# larger ones are read in place (a call whose large inputs sit at new addresses is not captured)
_COPY_ELEMENTS = 1 << 22
_SEEN_LIMIT = 256  # signatures remembered before the first capture (cleared when full)

_lock = threading.RLock()
_graphs: "OrderedDict[Hashable, _Captured]" = OrderedDict()
_failed: set[Hashable] = set()  # signatures whose capture failed: run eagerly (cleared when _SEEN_LIMIT are held)
# signature without addresses -> the large inputs' addresses of its recent calls (at most _RECENT)
_seen: dict[Hashable, list[tuple[int, ...]]] = {}
_RECENT = 4
_stats = {"captures": 0, "replays": 0, "failures": 0}
_clock = [0]  # calls through :func:`run` where capture is enabled
_fake = [False]  # tests: capture on a CPU with :class:`_FakeGraph` (the same bookkeeping, no CUDA)
# ``RECO_SAMPLED_GRAPHS=off`` (or 0 / false / no) turns capture off, whatever the counting backend
_switched_on = [os.environ.get("RECO_SAMPLED_GRAPHS", "on").strip().lower() not in ("off", "0", "false", "no")]


# what a capture refuses (a read back to the host), as the stand-in graph checks it on a CPU
_READS = frozenset({"item", "tolist", "__bool__", "__int__", "__float__", "__index__", "cpu", "numpy", "nonzero",
                    "argwhere", "masked_select", "unique", "unique_consecutive", "bincount"})


class _NoReadBack(TorchFunctionMode):
    """Raise on a read back to the host (what a CUDA graph capture refuses), as the stand-in graph captures."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if getattr(func, "__name__", "") in _READS:
            raise RuntimeError(f"{func.__name__}: a read back to the host while capturing")
        return func(*args, **(kwargs or {}))


class _FakeGraph:
    """A CPU stand-in for ``torch.cuda.CUDAGraph`` with its semantics (tests): ``capture`` runs the function once,
    refusing any read back as a capture does; ``replay`` runs it again on the captured inputs and writes its results
    into the outputs returned at capture. (Run with the accelerators' torch paths on the CPU: numpy's are CPU-only.)"""

    runs = 1  # runs of the captured function in :meth:`capture`

    def capture(self, fn: Callable[..., tuple[torch.Tensor, ...]], inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        self.fn, self.inputs = fn, tuple(inputs)
        with _NoReadBack():
            self.outputs = fn(*inputs)
        return self.outputs

    def replay(self) -> None:
        before = counting.work_done()  # a real replay runs no Python: the work counter is the caller's to advance
        for out, new in zip(self.outputs, self.fn(*self.inputs)):
            out.copy_(new)
        counting.add_work(before - counting.work_done())


class _CudaGraph:
    """``torch.cuda.CUDAGraph`` captured after one warm-up run on a side stream (lazy initialisations, compiled
    kernels' first calls), errors confined to this thread's capture."""

    runs = 2  # the warm-up and the capture

    def capture(self, fn: Callable[..., tuple[torch.Tensor, ...]], inputs: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
        self.device = inputs[0].device
        with torch.cuda.device(self.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                fn(*inputs)
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
                outputs = fn(*inputs)
        return outputs

    def replay(self) -> None:
        with torch.cuda.device(self.device):
            self.graph.replay()


class _Captured:
    """One captured call: its graph, the tensors it reads (``None`` where the caller's tensor is read in place), the
    outputs it writes, the counting work one call does and the notes its function made (:func:`run`)."""

    def __init__(self, graph: Any, buffers: list[torch.Tensor | None], outputs: tuple[torch.Tensor, ...], work: int,
                 notes: list):
        self.graph, self.buffers, self.outputs, self.work, self.notes = graph, buffers, outputs, work, notes
        self.used = _clock[0]  # the clock at its last replay


def enabled(device: torch.device) -> bool:
    """Whether calls on ``device`` are captured: CUDA (or a CPU with the tests' fake graph), unless the counting
    backend is ``"eager"`` or ``RECO_SAMPLED_GRAPHS=off``."""
    if counting.get_backend() == "eager" or not _switched_on[0]:
        return False
    return device.type == "cuda" or (_fake[0] and device.type == "cpu")


def _form(t: torch.Tensor) -> tuple:
    return (tuple(t.shape), t.stride(), t.dtype, t.device)


def run(name: str, options: Hashable, fn: Callable[..., tuple[torch.Tensor, ...]],
        tensors: Sequence[torch.Tensor], notes: list | None = None) -> tuple[torch.Tensor, ...]:
    """``fn(*tensors)``, replayed from a captured graph where this signature was seen before (see the module doc);
    the results are the caller's own (copies of the graph's outputs). ``fn`` must queue device work only (no read
    back, no input-dependent shapes) and depend on nothing but ``tensors`` and ``options``. ``notes``: a list that
    ``fn`` fills with what the caller needs besides tensors (e.g. messages; the same for every call of a signature),
    filled from the captured call's on a replay."""
    if not tensors or not enabled(tensors[0].device):
        return fn(*tensors)
    large = tuple(i for i, t in enumerate(tensors) if t.numel() > _COPY_ELEMENTS)
    base = (name, options, counting.compile_stage(), tuple(_form(t) for t in tensors))
    addresses = tuple(tensors[i].data_ptr() for i in large)
    with _lock:
        _clock[0] += 1
        if base in _failed:
            return fn(*tensors)
        key = (base, addresses)
        if key in _graphs:
            _graphs.move_to_end(key)
            entry = _graphs[key]
            if notes is not None:
                notes[:] = entry.notes
            return _replay(entry, tensors)
        recent = _seen.get(base, [])
        if addresses not in recent or not _room():  # first sight here (or no room): run as it is, remember them
            if len(_seen) >= _SEEN_LIMIT:
                _seen.clear()
            out = fn(*tensors)
            _seen[base] = ([a for a in recent if a != addresses] + [addresses])[-_RECENT:]
            return out
        recent.remove(addresses)
        return _capture(name, base, addresses, fn, tensors, set(large), notes)


def _room() -> bool:
    """Whether a new capture may be held: fewer than ``_MAX_GRAPHS`` are, or the least recently used one went unused
    for ``_STALE`` calls (then evicted here)."""
    if len(_graphs) < _MAX_GRAPHS:
        return True
    key, oldest = next(iter(_graphs.items()))
    if _clock[0] - oldest.used <= _STALE:
        return False
    del _graphs[key]
    return True


def _capture(name: str, base: Hashable, addresses: tuple[int, ...], fn: Callable[..., tuple[torch.Tensor, ...]],
             tensors: Sequence[torch.Tensor], in_place: set[int], notes: list | None) -> tuple[torch.Tensor, ...]:
    """Capture ``fn`` for signature ``base`` with its large inputs read in place at ``addresses`` (the inputs
    ``in_place``; the others copied), then replay it for this call; a failure marks ``base`` as run eagerly."""
    graph = _FakeGraph() if tensors[0].device.type == "cpu" else _CudaGraph()
    before = counting.work_done()
    try:
        # in inference mode (no autograd records; a Lightning validation loop runs in it): the graph's tensors are
        # inference tensors, written in it at each replay, and returned as copies made outside it
        with torch.inference_mode():
            buffers = [None if i in in_place else t.clone() for i, t in enumerate(tensors)]
            inputs = [t if b is None else b for t, b in zip(tensors, buffers)]
            outputs = tuple(graph.capture(fn, inputs))
    except Exception as exc:  # e.g. an operator that reads back: this signature runs eagerly from now on
        logger.debug("reco_sampled_plugin: %s not captured in a CUDA graph (%s: %s); running eagerly", name,
                     type(exc).__name__, exc)
        _stats["failures"] += 1
        if len(_failed) >= _SEEN_LIMIT:
            _failed.clear()
        _failed.add(base)
        return fn(*tensors)
    counted = counting.work_done() - before  # the capture's runs of ``fn``; the replay below counts the call's work
    counting.add_work(-counted)
    work = counted // graph.runs
    entry = _Captured(graph, buffers, outputs, work, list(notes or ()))
    logger.debug("reco_sampled_plugin: %s captured in a CUDA graph (inputs %s)", name,
                 [tuple(t.shape) for t in tensors])
    _stats["captures"] += 1
    _store((base, addresses), entry)
    return _replay(entry, tensors)


def _store(key: Hashable, entry: _Captured) -> None:
    _graphs[key] = entry
    while len(_graphs) > _MAX_GRAPHS:  # not reached: :func:`_room` made room before the capture
        _graphs.popitem(last=False)


def _replay(entry: _Captured, tensors: Sequence[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    with torch.inference_mode():
        for buf, t in zip(entry.buffers, tensors):
            if buf is not None:
                buf.copy_(t)
        entry.graph.replay()
    counting.add_work(entry.work)
    entry.used = _clock[0]
    _stats["replays"] += 1
    return tuple(out.clone() for out in entry.outputs)


def clear() -> None:
    """Forget every captured call (frees their memory), every signature seen and every failed capture."""
    with _lock:
        _graphs.clear()
        _seen.clear()
        _failed.clear()
