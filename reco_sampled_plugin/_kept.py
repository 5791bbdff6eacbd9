"""What an object of data keeps of what is derived from it: the one mechanism behind the fits kept on a
:class:`~reco_sampled_plugin._rank_hist.RankHistogram` (its fitted rank distributions, pooled forms, identification
programs and intervals) and on the popularity fit's :class:`~reco_sampled_plugin._popularity_fit.Units` (its
``pl_fit`` fits), and behind an owner remembering the last equal data it returned (``SampledRanks`` its histograms
and its popularity units), so that several metrics estimated from one sample derive once.

Nothing here is module-global state of data: what is kept lives on the object it was derived from, goes with it,
and is left out of its pickles and copies.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, TypeVar

__all__ = ["DERIVED_MAX", "KeepsDerived", "keep", "same_as_before"]

#: what one object keeps of what is derived from it (:meth:`KeepsDerived._derived`): a histogram's fits by method
#: object and law, its pooled forms, ...; the least recently used entry goes first
DERIVED_MAX = 8
#: the one lock of every kept table and remembered owner (lookups and inserts only: nothing is made under it)
LOCK = threading.Lock()
_T = TypeVar("_T")


def keep(table: "OrderedDict[Hashable, Any]", key: Hashable, make: Callable[[], _T], limit: int) -> _T:
    """``make()``, kept in ``table`` under ``key`` and returned again while the key comes back; at most ``limit``
    entries (the least recently used dropped); an unhashable key is made every time."""
    try:
        hash(key)
    except TypeError:
        return make()
    with LOCK:
        if key in table:
            table.move_to_end(key)
            return table[key]
    value = make()  # outside the lock: a fit may take seconds (two threads may both make it, alike)
    with LOCK:
        table[key] = value
        while len(table) > limit:
            table.popitem(last=False)
    return value


class KeepsDerived:
    """An immutable object of data that keeps what is derived from it (in ``__dict__["_kept"]``, an OrderedDict made
    on first use), which its pickles and copies leave out (:meth:`__getstate__`). ``_derived_max``: the most entries
    one object keeps (:data:`DERIVED_MAX`; a class whose entries are large keeps fewer)."""

    _derived_max = DERIVED_MAX

    def _derived(self, key: Hashable, make: Callable[[], _T]) -> _T:
        """``make()``, kept on this object under ``key`` and returned again while the key comes back, so several
        metrics of one object derive it once. At most ``_derived_max`` entries (:data:`DERIVED_MAX` unless the
        class says fewer; the least recently used dropped); an unhashable key is made every time. The object never
        changes (its arrays are read-only), so nothing kept goes stale; copies and pickles start without them. What
        is made must not hold this object (it would keep itself alive in a reference cycle until a full garbage
        collection): hold a copy (``copy.copy``, the same arrays without what is kept) instead."""
        with LOCK:
            table = self.__dict__.setdefault("_kept", OrderedDict())
        return keep(table, key, make, self._derived_max)

    def __getstate__(self) -> dict:
        """The fields (and their derived arrays), without what :meth:`_derived` keeps (pickles and copies)."""
        return {k: v for k, v in self.__dict__.items() if k != "_kept"}


def same_as_before(owner: Any, slot: str, value: _T, equal: Callable[[_T, _T], bool]) -> _T:
    """``value``, or the one equal to it (``equal(old, value)``) that this call returned before for ``owner`` under
    ``slot`` (the last two are remembered in ``owner.__dict__[slot]``): the same object, with what it keeps, so
    several metrics estimated from one sample derive once. Equal content, not the owner's identity, decides: an
    owner changed in place gets new ones. The owner's pickles and copies must leave ``slot`` out. The remembered
    values are read and the new one inserted under :data:`LOCK`; ``equal`` (which may read large arrays) runs
    outside it (two threads may both insert equal values: the later is remembered first)."""
    with LOCK:
        last: tuple = owner.__dict__.get(slot, ())
    for old in last:
        if equal(old, value):
            return old
    with LOCK:
        owner.__dict__[slot] = (value,) + owner.__dict__.get(slot, ())[:1]
    return value
