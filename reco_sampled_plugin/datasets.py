"""Real interaction data: read user,item[,rating,timestamp] files and split them as Krichene & Rendle section 6 do.

The setup of the paper (and of Rendle et al. before it): binarise the ratings, hold out each user's last event by
timestamp as the single relevant test item, train on the rest, and rank all items except the user's training items.

Conventions
- Users and items get contiguous int64 indices in order of first appearance in the file (as RecBole's remapping
  does); ``Interactions.user_ids`` / ``item_ids`` map an index back to the raw token (a string).
- Time is the timestamp column when there is one, otherwise the line order. Ties in time are broken by line order:
  among a user's events with the latest timestamp, the one on the later line is held out.
- A user needs at least two distinct items to get a test item; users with a single distinct item keep it in train
  and get test item -1. Repeated (user, item) pairs are collapsed: if the held-out item also occurs earlier for that
  user, those earlier events are dropped from train too, so a test item is never in its user's train row.

Nothing here downloads. MovieLens 100k is read from the copy shipped inside the ``recbole`` wheel (the ``recbole``
extra); recbole itself is never imported.
"""

from __future__ import annotations

import csv
import gzip
import zlib
import importlib.util
import io
import os
import warnings
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = [
    "Interactions",
    "LeaveLastOutSplit",
    "ml100k_path",
    "load_interactions",
    "binarize",
    "leave_last_out",
    "load_ml100k",
    "ml_latest_small_path",
    "load_ml_latest_small",
]

_USER_NAMES = {"user", "user_id", "userid", "uid", "users"}
_ITEM_NAMES = {"item", "item_id", "itemid", "iid", "movie", "movie_id", "movieid", "items"}
_RATING_NAMES = {"rating", "ratings", "score", "value", "label"}
_TIME_NAMES = {"timestamp", "time", "ts", "date", "datetime"}
_KNOWN_NAMES = _USER_NAMES | _ITEM_NAMES | _RATING_NAMES | _TIME_NAMES
_SEPARATORS = ("\t", "::", ",", ";")


@dataclass(frozen=True)
class Interactions:
    """Events as parallel arrays (one entry per line of the file, in file order).

    ``user`` and ``item`` are contiguous int64 indices into ``user_ids`` / ``item_ids`` (raw tokens, str).
    ``rating`` and ``timestamp`` are float64 arrays, or None when the file has no such column.
    """

    user: np.ndarray
    item: np.ndarray
    rating: np.ndarray | None
    timestamp: np.ndarray | None
    user_ids: np.ndarray
    item_ids: np.ndarray

    @property
    def n_users(self) -> int:
        return int(len(self.user_ids))

    @property
    def n_items(self) -> int:
        return int(len(self.item_ids))

    def __len__(self) -> int:
        return int(len(self.user))


@dataclass(frozen=True)
class LeaveLastOutSplit:
    """Result of :func:`leave_last_out`.

    ``train``: scipy CSR matrix (n_users x n_items, float32, values 1, duplicates collapsed).
    ``test_items``: int64 array of length n_users, the held-out item per user, -1 where the user has none.
    ``n_single``: users with exactly one distinct item (kept in train, no test item).
    ``n_dropped_duplicates``: events dropped from train because they repeat the user's held-out item.
    """

    train: sp.csr_matrix
    test_items: np.ndarray
    n_single: int
    n_dropped_duplicates: int
    interactions: Interactions | None = field(default=None, repr=False)

    @property
    def n_users(self) -> int:
        return int(self.train.shape[0])

    @property
    def n_items(self) -> int:
        return int(self.train.shape[1])

    @property
    def n_train(self) -> int:
        """Distinct (user, item) pairs in train."""
        return int(self.train.nnz)

    @property
    def test_users(self) -> np.ndarray:
        """Indices (int64) of the users that have a test item."""
        return np.flatnonzero(self.test_items >= 0).astype(np.int64)

    @property
    def n_test(self) -> int:
        return int((self.test_items >= 0).sum())


def ml100k_path() -> str:
    """Path of ``ml-100k.inter`` (RecBole atomic file) inside the installed ``recbole`` wheel; imports nothing."""
    hint = "install the recbole extra (from a clone: pip install '.[recbole]'; or pip install recbole==1.2.1)"
    try:
        spec = importlib.util.find_spec("recbole")
    except (ImportError, ValueError):  # pragma: no cover - broken installs
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"MovieLens 100k ships inside the recbole package, which is not installed: {hint}")
    for root in spec.submodule_search_locations:
        path = os.path.join(root, "dataset_example", "ml-100k", "ml-100k.inter")
        if os.path.isfile(path):
            return path
    raise FileNotFoundError(
        f"recbole is installed but recbole/dataset_example/ml-100k/ml-100k.inter is missing "
        f"(searched {list(spec.submodule_search_locations)}); {hint}"
    )


def _detect_sep(line: str) -> str | None:
    for sep in _SEPARATORS:
        if sep in line:
            return sep
    return None  # any run of whitespace


def _unquote(field_: str) -> str:
    """A field in double quotes without them (``""`` inside stands for one ``"``, as CSV writers quote)."""
    if len(field_) >= 2 and field_[0] == field_[-1] == '"':
        return field_[1:-1].replace('""', '"')
    return field_


def _split(line: str, sep: str | None) -> list[str]:
    """A line's fields, stripped of outer blanks; a field in double quotes is read without them: with a one-character
    separator by the ``csv`` module (a quoted field may then hold the separator), else field by field."""
    if '"' in line and sep is not None and len(sep) == 1:
        return [f.strip() for f in next(csv.reader([line], delimiter=sep, skipinitialspace=True))]
    fields = [f.strip() for f in line.split(sep)] if sep is not None else line.split()
    return [_unquote(f) for f in fields] if '"' in line else fields


# str.splitlines() ends lines at these too, and str.split() splits at every str.isspace() character: a text with
# any of them is read line by line (np.loadtxt knows only "\n" and, between fields, " " and "\t")
_PLAIN_BLANKS = frozenset(" \t\n")


def _columns_by_loadtxt(text: str, start: int, sep: str | None, n_fields: int,
                        used: list[int]) -> list[np.ndarray] | None:
    """The stripped string columns ``used`` of the data lines (from line ``start`` on), read by ``np.loadtxt``
    where that reads the text as the line reader does (:func:`_split`); None otherwise (quotes, characters that end
    a line or separate fields for ``str`` but not for numpy, a changing number of fields, a blank line between
    fields, an empty id, no data line): the line reader then reads it and names the first bad line."""
    chars = set(text)
    if '"' in chars or "\x00" in chars or any(ch.isspace() for ch in chars - _PLAIN_BLANKS):
        return None  # NUL: numpy's strings drop trailing NULs ("1\x00" would read as 1); the line reader refuses it
    if sep == "::":  # numpy takes one-character separators; "\x1f" is not in the text (it is a blank)
        text, sep = text.replace("::", "\x1f"), "\x1f"
    offset = 0
    for _ in range(start):
        offset = text.find("\n", offset) + 1
        if offset == 0:
            return None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a blank line ("not counted towards max_rows"), no data: checked below
            table = np.loadtxt(io.StringIO(text[offset:]), dtype=str, delimiter=sep, comments=None, quotechar=None,
                               ndmin=2)
    except ValueError:
        return None
    if table.shape[0] == 0 or table.shape[1] != n_fields:
        return None
    columns = [np.char.strip(table[:, col]) for col in used]
    # the line reader's arrays are as wide as their longest token: so are these
    return [c.astype(f"<U{max(1, int(np.char.str_len(c).max()))}") for c in columns]


def _interactions_by_loadtxt(text: str, start: int, sep: str | None, n_fields: int,
                             columns: tuple[int, int, int | None, int | None]) -> Interactions | None:
    """The events read by ``np.loadtxt`` (:func:`_columns_by_loadtxt`), ratings and timestamps converted by
    Python's ``float`` as the line reader converts them; None where a value would be an error there (not a
    number, not finite, an empty id): the line reader then names its line."""
    ucol, icol, rcol, tcol = columns
    used = [c for c in columns if c is not None]
    read = _columns_by_loadtxt(text, start, sep, n_fields, used)
    if read is None:
        return None
    cols = dict(zip(used, read))
    if not ((cols[ucol] != "").all() and (cols[icol] != "").all()):
        return None
    numbers: dict[int, np.ndarray] = {}
    for col in (rcol, tcol):
        if col is not None:
            try:
                numbers[col] = cols[col].astype(np.float64)  # numpy converts str by Python's float()
            except ValueError:
                return None
            if not np.isfinite(numbers[col]).all():
                return None
    user, user_ids = _factorize(cols[ucol])
    item, item_ids = _factorize(cols[icol])
    return Interactions(user=user, item=item, rating=None if rcol is None else numbers[rcol],
                        timestamp=None if tcol is None else numbers[tcol], user_ids=user_ids, item_ids=item_ids)


def _column_name(field_: str) -> str:
    """'user_id:token' -> 'user_id'; 'Rating' -> 'rating'."""
    return field_.split(":", 1)[0].strip().strip('"').lower()


def _header_columns(names: list[str], path: str) -> tuple[int, int, int | None, int | None]:
    """Positions of user, item, rating, timestamp columns in a header."""

    def find(options: set[str], exact_first: str) -> int | None:
        if exact_first in names:
            return names.index(exact_first)
        for pos, name in enumerate(names):
            if name in options:
                return pos
        return None

    user, item = find(_USER_NAMES, "user_id"), find(_ITEM_NAMES, "item_id")
    if user is None or item is None:
        # A header without recognisable names: take the columns by position.
        user, item = 0, 1
        if len(names) < 2:
            raise ValueError(f"{path}:1: header needs at least two columns (user, item), got {names!r}")
        rating = 2 if len(names) > 2 else None
        time = 3 if len(names) > 3 else None
        return user, item, rating, time
    return user, item, find(_RATING_NAMES, "rating"), find(_TIME_NAMES, "timestamp")


def _is_header(fields: list[str]) -> bool:
    if any(":" in f and f.split(":", 1)[1].strip().lower() in {"token", "float", "token_seq", "float_seq"} for f in fields):
        return True  # RecBole atomic header
    return any(_column_name(f) in _KNOWN_NAMES for f in fields[:4])


def _check_columns(columns: Any) -> tuple[int, int, int | None, int | None] | None:
    """``columns``: None, or (user, item, rating or None, timestamp or None), distinct 0-based positions."""
    from ._checks import check_int

    if columns is None:
        return None
    what = "(user, item, rating or None, timestamp or None) column positions"
    if isinstance(columns, (str, bytes, dict)) or not hasattr(columns, "__len__") or len(columns) != 4:
        raise ValueError(f"columns: expected {what}, got {columns!r}")
    out: list[int | None] = []
    for k, (c, role) in enumerate(zip(columns, ("user", "item", "rating", "timestamp"))):
        if c is None and k >= 2:
            out.append(None)
            continue
        try:
            out.append(check_int(c, "columns", 0))
        except ValueError:
            raise ValueError(f"columns: the {role} position must be an integer >= 0"
                             f"{' or None' if k >= 2 else ''}, got {c!r} in {columns!r}") from None
    used = [c for c in out if c is not None]
    if len(set(used)) != len(used):
        raise ValueError(f"columns: positions must be distinct, got {columns!r}")
    user, item, rating, time = out
    assert user is not None and item is not None  # only rating and timestamp may be None (k >= 2 above)
    return user, item, rating, time


def load_interactions(
    path: str | os.PathLike,
    sep: str | None = "auto",
    header: bool | None = None,
    columns: tuple[int, int, int | None, int | None] | None = None,
) -> Interactions:
    """Read a user,item[,rating,timestamp] file.

    Accepted: RecBole atomic ``.inter`` files (tab-separated, header ``user_id:token item_id:token rating:float
    timestamp:float``; columns chosen by name), and plain CSV/TSV/``::``/whitespace files with or without a header
    (``header=None`` detects it from known column names; without a header the columns are user, item, rating,
    timestamp by position and the last two are optional). ``sep="auto"`` picks tab, ``::``, comma or semicolon
    from the first line, else whitespace; ``sep=None`` means whitespace. ``columns`` overrides the positions
    (user, item, rating or None, timestamp or None), 0-based. Blank lines are skipped. A path ending in ``.gz``
    is read through gzip. UTF-8, a byte-order mark dropped; any line ends. A field in double quotes is read
    without them (CSV quoting: ``"Smith, J."`` is one field of a comma-separated file, ``""`` inside is one ``"``).

    Files without quotes are parsed by ``np.loadtxt`` (its columns then checked as arrays); the line reader reads
    the others and any file that fails a check, gives the same arrays where both read a file, and names the line of
    the first error.

    Raises ValueError with ``path:line`` for a malformed line (wrong field count, empty id, non-numeric or
    non-finite rating or timestamp) and for a file without data lines.
    """
    from ._options import check_bool, check_optional, check_path  # torch-free callers import nothing more

    path = check_path(path)
    if sep is not None and not (isinstance(sep, str) and sep):  # "auto" is a str: checked before any comparison
        raise ValueError(f"sep: expected 'auto', None (whitespace) or a non-empty string, got {sep!r}")
    header = check_optional(header, check_bool, "header")
    columns = _check_columns(columns)
    text = _read_text(path)
    lines = text.splitlines()
    first = next((k for k, line in enumerate(lines) if line.strip()), None)
    if first is None:
        raise ValueError(f"{path}: no interactions (the file is empty)")
    if sep == "auto":
        sep = _detect_sep(lines[first])
    head = _split(lines[first], sep)
    if header is None:
        header = _is_header(head)
    found = _file_columns(head, header, columns, path, first + 1)
    start = first + 1 if header else first
    fast = _interactions_by_loadtxt(text, start, sep, len(head), found)
    if fast is not None:
        return fast
    return _interactions_by_lines(lines, start, sep, len(head), found, path)


def _read_text(path: str) -> str:
    """The text of ``path`` (UTF-8, a byte-order mark dropped; ``.gz`` through gzip), any line ends read as
    ``\\n``; a file that cannot be read is a ValueError naming it (a missing one a MissingFileError)."""
    from ._options import MissingFileError

    opener = gzip.open if path.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8-sig", newline=None) as fh:  # -sig: a byte-order mark is dropped
            return fh.read()
    except UnicodeDecodeError as exc:
        raise ValueError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason})") from None
    except (gzip.BadGzipFile, EOFError, zlib.error) as exc:  # a .gz that is not gzip, or is cut short
        raise ValueError(f"{path}: not a readable gzip file, as its suffix .gz says ({exc}); gunzip it to check, or "
                         "rename a plain text file without .gz") from None
    except (IsADirectoryError, PermissionError) as exc:
        raise ValueError(f"{path}: cannot read ({exc.strerror or exc})") from None
    except FileNotFoundError:
        raise MissingFileError(f"{path}: no such file") from None


def _file_columns(head: list[str], header: bool, columns: tuple[int, int, int | None, int | None] | None,
                  path: str, line: int) -> tuple[int, int, int | None, int | None]:
    """The (user, item, rating or None, timestamp or None) positions of a file whose first line (number ``line``,
    1-based) splits into ``head``: ``columns`` when given, else by the header's names, else by position; checked
    against the line's field count (a ValueError naming ``path:line``)."""
    where = f"{path}:{line}"
    if columns is not None:
        ucol, icol, rcol, tcol = columns
    elif header:
        ucol, icol, rcol, tcol = _header_columns([_column_name(f) for f in head], path)
    else:
        if len(head) < 2:
            raise ValueError(f"{where}: expected at least 2 fields (user, item), got {len(head)}")
        ucol, icol = 0, 1
        rcol = 2 if len(head) > 2 else None
        tcol = 3 if len(head) > 3 else None
    used = [c for c in (ucol, icol, rcol, tcol) if c is not None]
    if max(used) >= len(head) or min(used) < 0:
        raise ValueError(f"{where}: column positions {columns or used} do not fit {len(head)} field(s)")
    return ucol, icol, rcol, tcol


def _interactions_by_lines(lines: list[str], start: int, sep: str | None, n_fields: int,
                           columns: tuple[int, int, int | None, int | None], path: str) -> Interactions:
    """The events of the data lines (``lines[start:]``, blank ones skipped) read one by one (:func:`_split`); the
    first malformed line is a ValueError naming ``path:line``."""
    ucol, icol, rcol, tcol = columns
    users: list[str] = []
    items: list[str] = []
    ratings: list[float] = []
    times: list[float] = []
    for k in range(start, len(lines)):
        line = lines[k]
        if not line.strip():
            continue
        if "\x00" in line:  # binary data (e.g. a compressed file without its .gz)
            raise ValueError(f"{path}:{k + 1}: a NUL character: not a text file of interactions (compressed or binary "
                             "data?)")
        fields = _split(line, sep)
        if len(fields) != n_fields:
            raise ValueError(f"{path}:{k + 1}: expected {n_fields} fields, got {len(fields)}: {line!r}")
        u, i = fields[ucol], fields[icol]
        if not u or not i:
            raise ValueError(f"{path}:{k + 1}: empty user or item id: {line!r}")
        users.append(u)
        items.append(i)
        for col, out, what in ((rcol, ratings, "rating"), (tcol, times, "timestamp")):
            if col is None:
                continue
            try:
                value = float(fields[col])
            except ValueError:
                raise ValueError(f"{path}:{k + 1}: {what} {fields[col]!r} is not a number") from None
            if not np.isfinite(value):
                raise ValueError(f"{path}:{k + 1}: {what} {fields[col]!r} is not finite")
            out.append(value)
    if not users:
        raise ValueError(f"{path}: no interactions (only a header)")

    user, user_ids = _factorize(users)
    item, item_ids = _factorize(items)
    return Interactions(
        user=user,
        item=item,
        rating=np.asarray(ratings, dtype=np.float64) if rcol is not None else None,
        timestamp=np.asarray(times, dtype=np.float64) if tcol is not None else None,
        user_ids=user_ids,
        item_ids=item_ids,
    )


def _factorize(tokens: list[str] | np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Contiguous int64 codes in order of first appearance, and the raw tokens per code."""
    raw = np.asarray(tokens, dtype=str)
    uniq, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")  # code -> position in uniq
    remap = np.empty(len(uniq), dtype=np.int64)
    remap[order] = np.arange(len(uniq), dtype=np.int64)
    return remap[inverse.reshape(-1)], uniq[order]


def _check_threshold(threshold: Any) -> float | None:
    """None, or a finite rating threshold (NaN would keep no interaction: every comparison with NaN is False)."""
    from ._options import check_float

    return None if threshold is None else check_float(threshold, "threshold")


def _check_interactions(interactions: Any) -> None:
    if not isinstance(interactions, Interactions):
        raise ValueError(f"interactions: expected an Interactions (load_interactions), got {type(interactions).__name__}")


def binarize(interactions: Interactions, threshold: float | None = None) -> Interactions:
    """Implicit feedback: keep every event (``threshold=None``, the paper's setup) or those with rating >= threshold.

    Ratings of the kept events become 1.0. The index space (n_users, n_items) is kept unchanged, so users or items
    left without events stay in the catalogue.
    """
    _check_interactions(interactions)
    threshold = _check_threshold(threshold)
    keep = np.ones(len(interactions), dtype=bool)
    if threshold is not None:
        if interactions.rating is None:
            raise ValueError("threshold: the interactions have no rating column to threshold")
        keep = interactions.rating >= threshold
    return Interactions(
        user=interactions.user[keep],
        item=interactions.item[keep],
        rating=np.ones(int(keep.sum()), dtype=np.float64),
        timestamp=None if interactions.timestamp is None else interactions.timestamp[keep],
        user_ids=interactions.user_ids,
        item_ids=interactions.item_ids,
    )


def leave_last_out(interactions: Interactions) -> LeaveLastOutSplit:
    """Hold out each user's latest event (Krichene & Rendle section 6); train on the rest.

    Time is ``timestamp`` (line order when absent); among equal timestamps the later line is the later event.
    Users with fewer than two distinct items keep everything in train (test item -1). Events repeating a user's
    held-out item are dropped from train. Vectorised: one lexsort over all events.
    """
    _check_interactions(interactions)
    n_users, n_items = interactions.n_users, interactions.n_items
    user, item = interactions.user, interactions.item
    n = len(user)
    position = np.arange(n, dtype=np.int64)
    from ._checks import check_real_array

    if interactions.timestamp is None:
        time = position.astype(np.float64)
    else:  # numbers only: strings would sort as text ("10" before "9"), complex numbers lose their imaginary part
        time = check_real_array(interactions.timestamp, "timestamp", "real numbers (e.g. seconds since the epoch)")
        if time.shape != (n,):
            raise ValueError(f"timestamp: expected one value per event ({n}), got shape {time.shape}")
    order = np.lexsort((position, time, user))  # by user, then time, then line
    u_sorted = user[order]
    is_last = np.ones(n, dtype=bool)
    is_last[:-1] = u_sorted[1:] != u_sorted[:-1]
    last_event = order[is_last]  # one per user that has events, in user order

    pairs = sp.csr_matrix(
        (np.ones(n, dtype=np.float32), (user, item)), shape=(n_users, n_items)
    )
    pairs.sum_duplicates()
    distinct = np.diff(pairs.indptr)

    test_items = np.full(n_users, -1, dtype=np.int64)
    users_with_events = user[last_event]
    eligible = distinct[users_with_events] >= 2
    test_items[users_with_events[eligible]] = item[last_event[eligible]]

    in_test = test_items[user] == item  # every event on the held-out (user, item) pair
    n_dropped = int(in_test.sum()) - int(eligible.sum())
    keep = ~in_test
    train = sp.csr_matrix(
        (np.ones(int(keep.sum()), dtype=np.float32), (user[keep], item[keep])), shape=(n_users, n_items)
    )
    train.sum_duplicates()
    train.data[:] = 1.0
    train.sort_indices()
    return LeaveLastOutSplit(
        train=train,
        test_items=test_items,
        n_single=int((distinct == 1).sum()),
        n_dropped_duplicates=n_dropped,
        interactions=interactions,
    )


def load_ml100k(threshold: float | None = None) -> LeaveLastOutSplit:
    """MovieLens 100k from the recbole wheel: load, binarise (all ratings by default), leave last out.

    943 users, 1682 items, 100,000 events (no repeated pairs); every user has at least 20 events.
    """
    threshold = _check_threshold(threshold)  # before any file is read
    return leave_last_out(binarize(load_interactions(ml100k_path()), threshold))


def ml_latest_small_path() -> str:
    """Path of the vendored MovieLens latest-small ratings (``ratings.csv.gz``: userId, movieId, rating, timestamp;
    100,836 ratings, 610 users, 9,742 movies), shipped inside this package with the GroupLens README.txt (its
    licence: research use, redistribution under the same terms with the README beside the data)."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "ml-latest-small", "ratings.csv.gz")
    if not os.path.exists(path):  # pragma: no cover - the file ships with the package
        raise FileNotFoundError(f"{path} is missing: reinstall reco-sampled-plugin (it ships the data file)")
    return path


def load_ml_latest_small(threshold: float | None = None) -> LeaveLastOutSplit:
    """MovieLens latest-small (9,742 items): load, binarise (all ratings by default), leave last out.

    The larger-catalogue companion of :func:`load_ml100k`: one sampled rank at m = 100 spans about 96 exact
    ranks here (17 on ml-100k), so cut-offs like K = 10 lie inside the first sampled bin. ``threshold`` as in
    :func:`binarize`."""
    threshold = _check_threshold(threshold)  # before any file is read
    return leave_last_out(binarize(load_interactions(ml_latest_small_path()), threshold))
