"""GPU-readiness probes that run on the CPU.

* :class:`SyncCounter` — a ``TorchFunctionMode`` that counts the calls which force a host-device
  synchronisation on an accelerator (a value read back to Python, a data-dependent output size).
  On the CPU nothing synchronises, but the same calls would, so counting them here bounds what a GPU
  run would pay per call.
* :class:`PeakTemporary` — a ``TorchDispatchMode`` that records the largest tensor (in elements) that
  any aten operator produced, with the operator's name: the bound on a hot path's temporaries.
* :class:`OpCounter` — a ``TorchDispatchMode`` that counts the aten operators dispatched in a block: on an
  accelerator each is (at least) one kernel launch, so the count bounds a call's fixed cost there.

Both are test tools (they live in ``tests/``), not part of the package.
"""

from __future__ import annotations

from collections import Counter

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

# Calls that read a value back to the host or whose output size depends on the data (so the host must
# wait for the device before it can allocate): each is one synchronisation on CUDA.
_SYNC_METHODS = {
    "item",
    "tolist",
    # not "numpy": a CUDA tensor's .numpy() raises, so device-agnostic code reaches numpy through .cpu() / .to("cpu")
    # (counted); a .numpy() call is a CPU-only path (the CPU's numpy counting kernels), no synchronisation anywhere
    "cpu",
    "__bool__",
    "__int__",
    "__float__",
    "__index__",
    "__len__",  # free on a tensor (shape); listed so a len() of a data-dependent result is not missed
    "nonzero",
    "argwhere",
    "unique",
    "unique_consecutive",
    "bincount",
    "masked_select",
    "repeat_interleave",
    "any",  # harmless alone; counted only when followed by __bool__ (see below)
}
_SYNC_FUNCTIONS = {
    torch.nonzero,
    torch.argwhere,
    torch.unique,
    torch.unique_consecutive,
    torch.bincount,
    torch.masked_select,
    torch.repeat_interleave,
    torch.where,  # only the one-argument form (= nonzero) syncs: checked below
}


class _Calls:
    """A Counter of call names, ``calls``, and their total, ``count`` (the counters' shared part)."""

    calls: Counter[str]

    @property
    def count(self) -> int:
        return sum(self.calls.values())


class SyncCounter(_Calls, TorchFunctionMode):
    """Count host synchronisations during a block: ``with SyncCounter() as s: f(); s.count``.

    ``s.calls`` is a Counter of the offending call names (to say *which* in a failing assertion).
    A tensor moved to the host with ``.to("cpu")``/``.cpu()``, a boolean-mask index ``x[mask]``, and
    ``repeat_interleave`` without ``output_size`` count too.
    """

    def __init__(self) -> None:
        super().__init__()
        self.calls = Counter()

    def _hit(self, name: str) -> None:
        self.calls[name] += 1

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", str(func))
        if func in (torch.Tensor.__len__, torch.Tensor.any):
            pass
        elif func is torch.where or name == "where":
            if len(args) + len(kwargs) == 1:
                self._hit("where(cond)")
        elif func in (torch.repeat_interleave, torch.Tensor.repeat_interleave):
            if "output_size" not in kwargs and isinstance(args[1] if len(args) > 1 else kwargs.get("repeats"), torch.Tensor):
                self._hit("repeat_interleave")
        elif func is torch.Tensor.to:
            dev = kwargs.get("device")
            for a in args[1:]:
                if isinstance(a, (str, torch.device)):
                    dev = a
            if dev is not None and torch.device(dev).type == "cpu" and _on_accelerator_or_cpu(args[0]):
                self._hit("to(cpu)")
        elif func is torch.Tensor.__getitem__:
            if _has_bool_index(args[1]):
                self._hit("x[bool mask]")
        elif func in _SYNC_FUNCTIONS or func in _SYNC_METHOD_OBJECTS:
            self._hit(name)
        return func(*args, **kwargs)


_SYNC_METHOD_OBJECTS = {getattr(torch.Tensor, n) for n in _SYNC_METHODS - {"__len__", "any"} if hasattr(torch.Tensor, n)}


def _on_accelerator_or_cpu(x) -> bool:
    # On an accelerator ``.to("cpu")`` copies to the host; on the CPU it is a no-op, but it marks code that
    # would copy on a GPU (a tensor already on the CPU in a GPU run is not a hot-path tensor). Counted.
    return isinstance(x, torch.Tensor)


def _has_bool_index(index) -> bool:
    items = index if isinstance(index, tuple) else (index,)
    return any(isinstance(i, torch.Tensor) and i.dtype == torch.bool for i in items)


def count_syncs(fn, *args, **kwargs) -> tuple[object, SyncCounter]:
    """Run ``fn(*args, **kwargs)`` under a :class:`SyncCounter`; return (result, counter)."""
    with SyncCounter() as counter:
        out = fn(*args, **kwargs)
    return out, counter


class PeakTemporary(TorchDispatchMode):
    """Record the largest tensor any aten operator produced in a block (elements, and the op's name)."""

    def __init__(self) -> None:
        super().__init__()
        self.peak = 0
        self.op = ""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor) and t.numel() > self.peak:
                self.peak, self.op = t.numel(), str(func)
        return out


def peak_temporary(fn, *args, **kwargs) -> tuple[object, PeakTemporary]:
    """Run ``fn`` under a :class:`PeakTemporary`; return (result, recorder)."""
    with PeakTemporary() as rec:
        out = fn(*args, **kwargs)
    return out, rec


class OpCounter(_Calls, TorchDispatchMode):
    """Count the aten operators dispatched in a block: ``with OpCounter() as ops: f(); ops.count``; ``ops.calls`` a
    Counter of their names (to say which in a failing assertion)."""

    def __init__(self) -> None:
        super().__init__()
        self.calls = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls[str(func)] += 1
        return func(*args, **(kwargs or {}))
