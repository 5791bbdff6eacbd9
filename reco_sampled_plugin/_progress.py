"""Progress bars for long work (planner, CLI ``estimate``, estimator jobs, reproduce, benchmarks): one helper.

``progress: bool | None``: True shows a bar, False none, None (the default everywhere) shows one when stderr is a
terminal. Bars go to stderr (stdout stays the result), disappear when done, and never change a result. tqdm draws
them where installed (the ``report``, ``lightning`` and ``test`` extras bring it); otherwise a plain
``desc: i/total`` counter on stderr.
"""

from __future__ import annotations

import sys
from typing import Any, Iterable, Iterator, Protocol, TypeVar

__all__ = ["progress_enabled", "progress_bar"]

T = TypeVar("T")


class ProgressBar(Protocol):
    """What :func:`progress_bar` returns (a tqdm bar or this module's stand-ins): iterable, ``update``, ``close``."""

    def __iter__(self) -> Iterator[Any]: ...

    def update(self, n: int = 1) -> Any: ...

    def close(self) -> None: ...


def progress_enabled(progress: bool | None) -> bool:
    """Whether to show progress: ``progress`` itself, or for None whether stderr is a terminal."""
    if progress is None:
        isatty = getattr(sys.stderr, "isatty", None)
        return bool(isatty is not None and isatty())
    if type(progress).__module__ == "numpy" and type(progress).__name__ in ("bool_", "bool"):
        progress = bool(progress)  # a numpy bool is a bool (_options.check_bool's rule; this module imports no numpy)
    if not isinstance(progress, bool):
        raise ValueError(f"progress: expected True, False or None (a terminal decides), got {progress!r}")
    return progress


class _Silent:
    """The bar when progress is off: iterates, counts nothing, prints nothing."""

    def __init__(self, iterable: Iterable | None) -> None:
        self._iterable = iterable

    def __iter__(self) -> Iterator:
        return iter(self._iterable if self._iterable is not None else ())

    def update(self, n: int = 1) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_Silent":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _Plain(_Silent):
    """A ``desc: i/total`` counter on stderr, for when tqdm is not installed."""

    def __init__(self, iterable: Iterable | None, total: int | None, desc: str) -> None:
        super().__init__(iterable)
        self.total, self.desc, self.n = total, desc, 0

    def _show(self) -> None:
        of = f"/{self.total}" if self.total is not None else ""
        sys.stderr.write(f"\r{self.desc}: {self.n}{of}")
        sys.stderr.flush()

    def __iter__(self) -> Iterator:
        for item in super().__iter__():
            yield item
            self.update()
        self.close()

    def update(self, n: int = 1) -> None:
        self.n += n
        self._show()

    def close(self) -> None:
        if self.n:
            sys.stderr.write("\n")
            sys.stderr.flush()
            self.n = 0


def progress_bar(iterable: Iterable[T] | None = None, total: int | None = None, desc: str = "",
                 enabled: bool | None = None, unit: str = "it") -> ProgressBar:
    """``iterable`` wrapped in a progress bar on stderr (or a manual bar with ``update()`` and ``close()`` when
    ``iterable`` is None); ``enabled`` as :func:`progress_enabled`. Off: a silent stand-in with the same methods."""
    if not progress_enabled(enabled):
        return _Silent(iterable)
    if total is None and iterable is not None and hasattr(iterable, "__len__"):
        total = len(iterable)  # type: ignore[arg-type]
    try:
        from tqdm import tqdm
    except ImportError:
        return _Plain(iterable, total, desc)
    return tqdm(iterable, total=total, desc=desc, file=sys.stderr, leave=False, unit=unit, dynamic_ncols=True)
