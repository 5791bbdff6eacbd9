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

Deferred: index tensors' checks of score batches (``exact_ranks``; ``per_user_metrics`` returning a dict;
``sampled_ranks`` on an accelerator, uniform with replacement, with the draw's pool check). Read at
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

__all__ = ["DEFERRABLE", "FIRST", "DeferredChecks", "deferred_checks", "defer_checks", "defer_flags", "earliest_failure",
           "mark_failed", "message_at", "note_message"]

# the check kinds a block keeps (a Check's ``name``), each with the generic text of its error
DEFERRABLE: dict[str, str] = {
    "positives_range": "positives: item indices must lie in 0..n_items - 1 (or -1 for padding)",
    "positives_duplicates": "positives: a row lists the same item twice",
    "exclude_range": "exclude: item indices must lie in 0..n_items - 1 (or -1 for padding)",
    "exclude_duplicates": "exclude: a row lists the same item twice",
    "exclude_clash": "exclude: a row excludes one of its own positives; a relevant item cannot also be excluded",
    "scores_finite": "scores: NaN or inf in the score matrix; ranks would be meaningless",
    "sample_pool": "n_samples: some row has too few irrelevant candidates left to sample from",
}
_KIND = {name: i for i, name in enumerate(DEFERRABLE)}
# a failed check's mark: FIRST - the number of the call (or update) that failed it; the max over calls (or merged
# states) keeps the earliest, 0 where none failed. The torchmetrics adapters' ``failed_checks`` state is the same.
FIRST = 1 << 62
_active = threading.local()


def mark_failed(marks: torch.Tensor, failed: torch.Tensor, number: int) -> torch.Tensor:
    """``marks`` (kinds,) int64 with the kinds ``failed`` (kinds,) marks as failed by call ``number`` (the earliest
    failure of each kind kept): three operators, nothing read."""
    return torch.maximum(marks, failed * (FIRST - number))  # a bool or int64 flag: int64 marks


def earliest_failure(marks: Sequence[int], names: Sequence[str], unit: str) -> tuple[int, str, str] | None:
    """Of read ``marks`` (one per kind in ``names``): (the earliest failing call's number, its kind, the others as
    "; also failed: 'kind' (<unit> k), ..."), None where none failed; ties in the kinds' order."""
    failed = sorted((FIRST - v, i) for i, v in enumerate(marks) if v > 0)
    if not failed:
        return None
    number, i = failed[0]
    also = "; also failed: " + ", ".join(f"{names[j]!r} ({unit} {k})" for k, j in failed[1:]) if failed[1:] else ""
    return number, names[i], also


def note_message(log: dict[str, list[tuple[int, str]]], name: str, message: str, number: int) -> None:
    """Record check ``name``'s message from call ``number`` on in ``log`` (a new entry only where its text changed:
    a message names its call's numbers, e.g. the catalogue's size)."""
    told = log.setdefault(name, [])
    if not told or told[-1][1] != message:
        told.append((number, message))


def message_at(log: dict[str, list[tuple[int, str]]], name: str, number: int, default: str) -> str:
    """The message check ``name`` had at call ``number`` in ``log`` (the last recorded at or before it), else
    ``default``."""
    told = [message for first, message in log.get(name, []) if first <= number]
    return told[-1] if told else default


class DeferredChecks:
    """What a :func:`deferred_checks` block holds: ``calls`` (the calls that deferred their checks so far), and per
    device a (kinds,) int64 tensor, ``FIRST - call`` of the first call that failed each kind (0: none:
    :func:`mark_failed`), never read before the block ends."""

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
        for name, message in named:
            note_message(self._messages, name, message or DEFERRABLE[name], self.calls)
        state = self._state.get(device)
        if state is None:
            state = torch.zeros(len(DEFERRABLE), dtype=torch.int64, device=device)
        failed = torch.zeros_like(state).scatter_reduce_(0, index, (flags != 0).to(torch.int64), "amax")  # per kind
        self._state[device] = mark_failed(state, failed, self.calls)

    def raise_first(self) -> None:
        """Read the block's flags (one synchronisation per device) and raise the ValueError of the earliest call's
        failed check (the kinds' order within a call), with the others named; nothing where none failed."""
        reads = [state.tolist() for state in self._state.values()]
        marks = [max(column) for column in zip(*reads)] if reads else []  # the earliest over devices
        first = earliest_failure(marks, list(DEFERRABLE), "call")
        if first is None:
            return
        call, name, also = first
        raise ValueError(f"{message_at(self._messages, name, call, DEFERRABLE[name])} [check {name!r}, first failed "
                         f"at call {call} of {self.calls} in this deferred_checks block{also}: a call whose checks fail "
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
