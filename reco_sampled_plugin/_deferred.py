"""A block of calls whose input checks are read once, at its end: an evaluation loop without a host
synchronisation per batch.

``exact_ranks`` and ``per_user_metrics`` read their validity checks (indices in range, no duplicates, no positive
also excluded, no NaN/inf score) back to the host once per call, after the call's work is queued: on a GPU that read
waits for the batch and keeps the host from queueing the next one meanwhile (BENCHMARKS.md, "GPU": a replayed batch of
ten metrics left the device idle ~40% of its wall time). Inside :func:`deferred_checks` those checks stay on the
device, folded per kind into the first call that failed it, and are read once when the block ends, which then raises
the ValueError of the earliest failure, naming the check and the call. A call whose checks failed has computed on
safe stand-ins (out-of-range indices ranked as padding; NaN rows as they are): its results, and so the block's, are
meaningless, which is why the block raises.

Deferred: index tensors' checks of score batches (``exact_ranks``; ``per_user_metrics`` returning a dict). Read at
once as before: masks (their widths are read first anyway, the checks with them), a DataFrame (copied to the host
anyway), factors (an overflow bound switches them to another path), ``relevance``, and every other call. Memory: a
(kinds,) integer tensor per device, whatever the number of calls.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Sequence

import torch

from ._inputs import Check, check_flags, run_checks

__all__ = ["DEFERRABLE", "DeferredChecks", "deferred_checks", "defer_checks", "defer_flags"]

# the check kinds a block keeps (a Check's ``name``), each with the generic text of its error
DEFERRABLE: dict[str, str] = {
    "positives_range": "positives: item indices must lie in 0..n_items - 1 (or -1 for padding)",
    "positives_duplicates": "positives: a row lists the same item twice",
    "exclude_range": "exclude: item indices must lie in 0..n_items - 1 (or -1 for padding)",
    "exclude_duplicates": "exclude: a row lists the same item twice",
    "exclude_clash": "exclude: a row excludes one of its own positives; a relevant item cannot also be excluded",
    "scores_finite": "scores: NaN or inf in the score matrix; ranks would be meaningless",
}
_KIND = {name: i for i, name in enumerate(DEFERRABLE)}
_FIRST = 1 << 62  # a failed kind's entry: _FIRST - call number (the max over calls: the earliest call)
_active = threading.local()


class DeferredChecks:
    """What a :func:`deferred_checks` block holds: ``calls`` (the calls that deferred their checks so far), and per
    device a (kinds,) int64 tensor, ``_FIRST - call`` of the first call that failed each kind (0: none), never read
    before the block ends."""

    def __init__(self) -> None:
        self.calls = 0
        self._state: dict[torch.device, torch.Tensor] = {}
        self._index: dict[tuple[torch.device, tuple[str, ...]], torch.Tensor] = {}
        self._messages: dict[str, list[tuple[int, str]]] = {}  # per kind: (first call, message) where it changed

    def add(self, flags: torch.Tensor, named: Sequence[tuple[str, str]]) -> None:
        """Keep one call's flags (``flags`` (k,): non-zero where failed; ``named`` the k checks' (kind, message)),
        nothing read: four operators."""
        self.calls += 1
        device = flags.device
        kinds = tuple(name for name, _ in named)
        index = self._index.get((device, kinds))
        if index is None:  # copied to the device once per distinct list of kinds
            index = self._index[(device, kinds)] = torch.tensor([_KIND[k] for k in kinds], device=device)
        for name, message in named:  # a message names its call's numbers (e.g. the catalogue's size)
            told = self._messages.setdefault(name, [])
            if not told or told[-1][1] != (message or DEFERRABLE[name]):
                told.append((self.calls, message or DEFERRABLE[name]))
        state = self._state.get(device)
        if state is None:
            state = torch.zeros(len(DEFERRABLE), dtype=torch.int64, device=device)
        marks = torch.zeros_like(state).scatter_reduce_(0, index, (flags != 0).to(torch.int64) * (_FIRST - self.calls),
                                                        "amax")
        self._state[device] = torch.maximum(state, marks)

    def raise_first(self) -> None:
        """Read the block's flags (one synchronisation per device) and raise the ValueError of the earliest call's
        failed check (the kinds' order within a call), with the others named; nothing where none failed."""
        failed = sorted((_FIRST - v, i) for state in self._state.values() for i, v in enumerate(state.tolist()) if v)
        if not failed:
            return
        names = list(DEFERRABLE)
        call, i = failed[0]
        also = "; also failed: " + ", ".join(f"{names[j]!r} (call {c})" for c, j in failed[1:]) if failed[1:] else ""
        message = [text for first, text in self._messages.get(names[i], []) if first <= call][-1]
        raise ValueError(f"{message} [check {names[i]!r}, first failed at "
                         f"call {call} of {self.calls} in this deferred_checks block{also}: a call whose checks fail "
                         "computes on safe stand-ins, so the block's results are meaningless]")


@contextlib.contextmanager
def deferred_checks() -> Iterator[DeferredChecks]:
    """Defer the input checks of ``exact_ranks`` and ``per_user_metrics`` (index tensors; ``as_frame=False``) inside
    the block to its end: no host synchronisation per call, so that on a GPU the host queues batch k + 1 while the
    device ranks batch k. At the end, one read; the earliest failed check raises its ValueError (naming the check
    and the call), and every result computed in the block is then meaningless. Masks, DataFrames, factors and
    ``relevance`` are checked at once, as outside. Blocks nest (the inner one reads its own); an exception leaving
    the block propagates without the read.

        with rsp.deferred_checks():
            for users in batches:
                values = rsp.per_user_metrics(model(users), pos[users], exclude=exc[users], as_frame=False)
    """
    block = DeferredChecks()
    outer = getattr(_active, "block", None)
    _active.block = block
    try:
        yield block
    finally:
        _active.block = outer
    block.raise_first()


def defer_flags(flags: torch.Tensor, named: Sequence[tuple[str, str]]) -> bool:
    """Inside a :func:`deferred_checks` block, keep a call's unread ``flags`` (with their checks' (kind, message))
    and return True; False (the caller reads them) outside one, without named checks, or where a check is not a kind
    it keeps."""
    block = getattr(_active, "block", None)
    if block is None or not named or not all(name in _KIND for name, _ in named):
        return False
    block.add(flags, named)
    return True


def defer_checks(checks: list[Check]) -> None:
    """``checks`` kept by the active :func:`deferred_checks` block (:func:`defer_flags`), else read at once
    (:func:`~reco_sampled_plugin._inputs.run_checks`)."""
    named = [(c.name, c.message) for c in checks]
    if not (checks and getattr(_active, "block", None) is not None and defer_flags(check_flags(checks), named)):
        run_checks(checks)
