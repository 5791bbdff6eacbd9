"""Read sampled ranks from files: a plain rank file, or NCF-style test files plus a score file.

Rank file (``reco-sampled estimate FILE``): one relevant item per line, ``sampled_rank[,n_candidates[,n_samples]]``
(popularity-sampled draws: ``sampled_rank,n_candidates,n_samples,hh_s1,hh_s2`` on every line, hh_s1 = sum over the
draws that beat the positive of 1/q~ and hh_s2 = sum of 1/q~^2, q~ the probability the draw had, renormalised over the
row's candidates: ``SampledRanks.popularity_stats``, docs/popularity.md; read with ``--sampling popularity``)
separated by one comma, semicolon or tab (an empty field is an error) or by spaces; an optional header
line (its first field has no digit); ``#`` comments; fields may be in double quotes (``"3","100","10"``, as a CSV
writer quotes); UTF-8 with or without a byte-order mark, any line ends (``\n``, ``\r\n``, ``\r``). Missing columns
take the ``--n-items`` / ``--n-samples`` defaults. Adaptive sampling (``--adaptive-max M``, ``--n-samples`` = the first
stage's m): ``n_samples`` holds each positive's *final* m (m, 2m, 4m, ... up to M) and ``sampled_rank`` its rank
among those; e.g. ``1,9000,3200`` (still first at the cap) and ``3,9000,400`` (third after two doublings).

Writing one (:func:`write_rank_file`): the :class:`~reco_sampled_plugin.ranking.SampledRanks` of a draw, e.g. of an
external scorer loop (:func:`~reco_sampled_plugin.scorer_ranks.sampled_ranks_from_scorer`), become one
``sampled_rank,n_candidates,n_samples`` line per positive (padding dropped; adaptive: each positive's final m),
under ``#`` comment lines that name the design, the ``reco-sampled estimate`` flags that read it back and, from a
scorer loop, what the scoring cost. The format is the one above: nothing is added that the reader does not skip.

NCF files (He et al.'s format): ``X.test.rating`` lines ``user<TAB>item[<TAB>...]`` (one held-out item
per user), ``X.test.negative`` lines ``(user,item)<TAB>neg_1<TAB>...<TAB>neg_m``, and a score file with
lines ``user item score`` covering every (user, item) pair that is ranked.

Every malformed line raises a ValueError with the file name and the 1-based line number; so does a field
outside int64 (e.g. ``1e20``) or a line that is not UTF-8 text. A path that is a directory or cannot be read is
a ValueError naming it.

Reading: a rank file with one kind of separator throughout (what :func:`write_rank_file` and most tools write) is
parsed by ``np.loadtxt`` and checked column-wise (about ten times faster than line by line); a file it does not take
(separators mixed between lines, whole numbers written as floats like ``1e3``) or one that fails a check is read by
the line reader, the reference of the format, which gives the same values where both read a file and raises the
first error with its line. ``tests/test_readers.py`` checks the two readers agree on generated files of any shape.
"""

from __future__ import annotations

import dataclasses
import io
import math
import os
import re
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from ._checks import MAX_SIZE, MIN_INCLUSION, check_real_array, check_size
from ._options import check_path
from .design import SamplingDesign
from ._share import with_share_arrays
from .ranking import END_TIES, SampledRanks

__all__ = ["RankFile", "read_rank_file", "write_rank_file", "read_ncf"]

_SPLIT = re.compile(r"[,\t ;]+")
# rank files: one comma, semicolon or tab between fields (an empty field is an error), or runs of spaces
_FIELDS = re.compile(r" *[,;\t] *| +")
_WHOLE = re.compile(r"[+-]?[0-9]+")
_INT64_MAX = 2**63 - 1
#: The header of a rank file with an exact share (required: it tells the file from a popularity-sampled one):
#: exact_rank empty where the positive was not chosen, inclusion its probability pi on every line
SHARE_HEADER = ("sampled_rank", "n_candidates", "n_samples", "exact_rank", "inclusion")


@dataclass(frozen=True)
class RankFile:
    """The columns of a rank file, one entry per positive: its sampled rank, candidate count n and sample size m;
    popularity-sampled files add the Hansen-Hurwitz statistics, files with an exact share the exact ranks."""

    ranks: np.ndarray
    """int64, the sampled rank r~ in 1..m + 1."""
    n_items: np.ndarray
    """int64, the candidates n (the positive included), n >= 2."""
    n_samples: np.ndarray
    """int64, the sampled irrelevant items m >= 1."""
    hh_s1: np.ndarray | None = None
    """float64, popularity-sampled files: S1 = sum of b_k / q~_j over the beating draws; None for other files."""
    hh_s2: np.ndarray | None = None
    """float64, popularity-sampled files: S2 = sum of (b_k / q~_j)^2; None for other files."""
    exact_rank: np.ndarray | None = None
    """int64, files with an exact share: the exact rank in 1..n, 0 where the positive was not chosen; else None."""
    inclusion: np.ndarray | None = None
    """float64, files with an exact share: each positive's inclusion probability pi; else None."""

    def __post_init__(self) -> None:
        """The columns checked and normalised (built by hand as well as by the readers): ranks, n and m whole numbers
        (int64; a NaN or 2.5 is a ValueError naming the column and the entry, never cast to a wrapped integer), one per
        positive, n >= 2, m >= 1, 1 <= r~ <= m + 1; hh_s1 and hh_s2 both or neither, finite numbers >= 0."""
        cols = {name: _whole_column(getattr(self, name), name, low)
                for name, low in (("ranks", 1), ("n_items", 2), ("n_samples", 1))}
        if len({c.shape for c in cols.values()}) != 1:
            raise ValueError(f"RankFile: ranks, n_items and n_samples need one value per positive each, got shapes "
                             f"{[c.shape for c in cols.values()]}")
        over = np.flatnonzero(cols["ranks"] > cols["n_samples"] + 1)
        if over.size:
            k = int(over[0])
            raise ValueError(f"ranks: entry {k}: sampled rank {int(cols['ranks'][k])} outside 1..m+1 = "
                             f"1..{int(cols['n_samples'][k]) + 1}")
        if (self.hh_s1 is None) != (self.hh_s2 is None):
            raise ValueError("hh_s1: give hh_s1 and hh_s2 together (a popularity-sampled file) or neither")
        for name in ("hh_s1", "hh_s2"):
            v = getattr(self, name)
            if v is not None:
                a = check_real_array(v, name)
                if a.shape != cols["ranks"].shape or not bool(np.all(np.isfinite(a) & (a >= 0))):
                    raise ValueError(f"{name}: expected one finite number >= 0 per positive")
                object.__setattr__(self, name, a)
        for name, c in cols.items():
            object.__setattr__(self, name, c)
        if self.exact_rank is not None or self.inclusion is not None:
            self._check_share()

    def _check_share(self) -> None:
        """An exact share's columns (:data:`SHARE_HEADER`): both, one value per positive, not with popularity
        statistics; exact_rank whole in 0..n (0: not chosen), inclusion in [MIN_INCLUSION, 1]."""
        if self.exact_rank is None or self.inclusion is None or self.hh_s1 is not None:
            raise ValueError("exact_rank: give exact_rank and inclusion together, without hh_s1 / hh_s2")
        e = check_real_array(self.exact_rank, "exact_rank", "whole numbers (one per positive)")
        p = check_real_array(self.inclusion, "inclusion")
        if e.shape != self.ranks.shape or p.shape != self.ranks.shape:
            raise ValueError("exact_rank: expected one exact rank (0: not chosen) and one inclusion probability per "
                             "positive")
        bad = ~(np.isfinite(e) & (e == np.round(e)) & (e >= 0) & (e <= self.n_items))
        if bool(bad.any()):
            k = int(np.argmax(bad))
            raise ValueError(f"exact_rank: entry {k} is {float(e[k])!r}, expected a whole number in 1..n = "
                             f"1..{int(self.n_items[k])} (0 or an empty field: not chosen)")
        bad = ~(np.isfinite(p) & (p >= MIN_INCLUSION) & (p <= 1))
        if bool(bad.any()):
            k = int(np.argmax(bad))
            raise ValueError(f"inclusion: entry {k} is {float(p[k])!r}, expected a probability in "
                             f"[{MIN_INCLUSION:g}, 1] (MIN_INCLUSION)")
        object.__setattr__(self, "exact_rank", e.astype(np.int64))
        object.__setattr__(self, "inclusion", p.astype(np.float64))

    def share_design(self, design: SamplingDesign) -> SamplingDesign:
        """``design`` with this file's exact share (itself without one): ``ExactShare(pi)`` where every positive had
        the same inclusion probability pi, else an active share of their mean (its floor the least pi)."""
        from .design import ExactShare

        if self.inclusion is None or design.exact_share is not None:
            return design
        p = self.inclusion
        share = (ExactShare(float(p[0])) if bool((p == p[0]).all()) else
                 ExactShare(float(p.mean()), choice="active", floor=float(p.min())))
        return dataclasses.replace(design, exact_share=share)

    @property
    def popularity(self) -> bool:
        """Whether the file carries popularity statistics (five columns)."""
        return self.hh_s1 is not None

    def sampled(self, design: SamplingDesign | None = None) -> SampledRanks:
        """This file's :class:`~reco_sampled_plugin.ranking.SampledRanks` for ``estimate(metric, sampled)`` or
        ``plan(..., pilot=sampled)``.

        A popularity file (``design`` None): the design draws by popularity (the weights themselves are not
        needed: the statistics are sufficient, docs/popularity.md; a placeholder stands for them), one m for every
        positive. Another file: ``design`` (default ``SamplingDesign(m)``, m the file's smallest; an adaptive
        design's m is its first stage), with each positive's m from the file where they differ from the design's m
        (an adaptive draw's final m).

        Raises:
            ValueError naming ``n_samples`` when a popularity file's m differ, or ``design`` given with one.
        """
        import torch

        from ._popularity import PopularityStats

        r = torch.from_numpy(self.ranks.astype(np.float64 if self.popularity else np.int64))
        if self.hh_s1 is None or self.hh_s2 is None:
            m_min = int(self.n_samples.min()) if self.n_samples.size else 1
            design = SamplingDesign(m_min) if design is None else design
            sizes = None
            if design.adaptive_max is not None or bool((self.n_samples != design.n_samples).any()):
                sizes = torch.from_numpy(self.n_samples.astype(np.int64))
            out = SampledRanks(r, torch.from_numpy(self.n_items.astype(np.int64)), None, self.share_design(design), sizes)
            if self.exact_rank is None:
                return out
            return with_share_arrays(out, torch.from_numpy(self.exact_rank), torch.from_numpy(self.inclusion))
        if design is not None:
            raise ValueError("design: a popularity-sampled rank file carries its own design (popularity draws)")
        ms = np.unique(self.n_samples)
        if ms.size != 1:
            raise ValueError(f"n_samples: a popularity-sampled rank file needs one m for every positive, got "
                             f"{ms.size} values ({int(ms.min())}..{int(ms.max())})")
        stats = PopularityStats(r - 1.0, torch.from_numpy(self.hh_s1), torch.from_numpy(self.hh_s2),
                                torch.zeros(r.shape, dtype=torch.int64))
        popularity = SamplingDesign.trusted(int(ms[0]), popularity=torch.ones(1, dtype=torch.float64))
        return SampledRanks(r, torch.from_numpy(self.n_items.astype(np.float64)), None, popularity,
                            popularity_stats=stats)


def _whole_column(x: Any, name: str, minimum: int) -> np.ndarray:
    """A :class:`RankFile` column as a 1-D int64 array: whole finite numbers in minimum..MAX_SIZE, else a ValueError
    naming the column and the first bad entry."""
    a = check_real_array(x, name, "whole numbers (one per positive)")
    if a.ndim != 1:
        raise ValueError(f"{name}: expected one value per positive (1-D), got shape {a.shape}")
    bad = ~(np.isfinite(a) & (a == np.round(a)) & (a >= minimum) & (a <= MAX_SIZE))
    if bool(bad.any()):
        k = int(np.argmax(bad))
        raise ValueError(f"{name}: entry {k} is {a[k]!r}, expected a whole number in {minimum}..2^40")
    return a.astype(np.int64)


def _float(field: str, path: Path, number: int, what: str) -> float:
    """A finite number >= 0 (a popularity statistic)."""
    try:
        f = float(field)
    except ValueError:
        raise ValueError(f"{path}:{number}: {what} {field!r} is not a number") from None
    if not math.isfinite(f) or f < 0:
        raise ValueError(f"{path}:{number}: {what} {field!r} must be a finite number >= 0")
    return f


def _check_hh(b: int, s1: float, s2: float, path: Path, number: int) -> None:
    """The bounds that each positive's statistics of a popularity draw obey (b = r~ - 1 beating draws, each weighing
    z = 1/q~ >= 1 because the draw's probabilities sum to one over the row's candidates): S1 = S2 = 0 without a
    beating draw; otherwise S1 >= b, S2 >= S1 (z^2 >= z) and b S2 >= S1^2 (Cauchy-Schwarz); relative slack 1e-9."""
    tol = 1e-9
    if b == 0:
        if s1 != 0 or s2 != 0:
            raise ValueError(f"{path}:{number}: hh_s1 and hh_s2 must be 0 where no draw beats the positive (rank 1), "
                             f"got {s1:g}, {s2:g}")
        return
    if s1 < b * (1 - tol):
        raise ValueError(f"{path}:{number}: hh_s1 {s1:g} is below the {b} beating draws: each weighs 1/q~ >= 1 "
                         "(the probabilities q~ of a row's candidates sum to one); is the column sum(1/q~)?")
    if s2 < s1 * (1 - tol) or b * s2 < s1 * s1 * (1 - tol):
        raise ValueError(f"{path}:{number}: hh_s2 {s2:g} is below what hh_s1 {s1:g} and {b} beating draws allow "
                         "(S2 >= S1 and b S2 >= S1^2); is the column sum(1/q~^2)?")


_NEWLINE = re.compile(r"\r\n|\r|\n")  # the line ends of text mode (universal newlines)
_CR = re.compile(r"\r\n?")


def _utf8_text(data: bytes) -> str | None:
    """``data`` as UTF-8 text with a byte-order mark dropped and ``\\r\\n`` / ``\\r`` line ends as ``\\n``; None
    where it is not UTF-8 (the line reader then reads it and names the line)."""
    try:
        text = data.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError:
        return None
    if "\x00" in text:  # numpy drops a field's trailing NULs ("1\x00" would read as 1): the line reader refuses them
        return None
    return _CR.sub("\n", text) if "\r" in text else text


def _read_bytes(path: Path) -> bytes:
    """The file's bytes; a missing file, a directory or an unreadable file is a ValueError naming it."""
    if not path.exists():
        raise ValueError(f"{path}: no such file")
    if path.is_dir():
        raise ValueError(f"{path}: is a directory, not a file")
    try:
        with open(path, "rb") as fh:
            return fh.read()
    except PermissionError:
        raise ValueError(f"{path}: permission denied (cannot read the file)") from None
    except OSError as exc:
        raise ValueError(f"{path}: cannot be read ({exc.strerror or exc})") from None


def _lines(path: Path, data: bytes | None = None) -> Iterator[tuple[int, str]]:
    """(1-based line number, text without its ``#`` comment) of every non-blank line of ``path`` (or of its bytes
    ``data``, already read). Decoded line by line, so a byte that is not UTF-8 is reported on its own line (a
    text-mode read decodes whole blocks at once)."""
    if data is None:
        data = _read_bytes(path)
    number = 0
    for raw in io.BytesIO(data):
        try:
            chunk = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            before = len(_NEWLINE.findall(raw[: exc.start].decode("utf-8")))
            raise ValueError(f"{path}:{number + 1 + before}: not UTF-8 text ({exc.reason}); "
                             "is this a text file of ranks?") from None
        if number == 0:
            chunk = chunk.removeprefix("\ufeff")  # a byte-order mark is not part of the first field
        pieces = _NEWLINE.split(chunk)
        if pieces[-1] == "":
            pieces.pop()  # the end of the last line
        for line in pieces:
            number += 1
            text = line.split("#", 1)[0].strip()
            if text:
                yield number, text


def _fields(text: str) -> list[str]:
    """A rank-file line's fields: split at one comma, semicolon or tab or at runs of spaces; double quotes dropped
    (``"3","100"`` reads as ``3,100``: what a CSV writer's quoting leaves, and what ``np.loadtxt`` reads)."""
    return _FIELDS.split(text.replace('"', "").strip() if '"' in text else text)  # '" 1",2': no empty first field


def _int(field: str, path: Path, number: int, what: str) -> int:
    """A whole number within int64: digits are read exactly (no rounding through a float above 2**53);
    ``3.0`` or ``1e3`` are accepted when whole."""
    if _WHOLE.fullmatch(field):
        value = int(field)
    else:
        try:
            f = float(field)
        except ValueError:
            raise ValueError(f"{path}:{number}: {what} {field!r} is not a number") from None
        if not math.isfinite(f):
            raise ValueError(f"{path}:{number}: {what} {field!r} is not finite")
        if f != int(f):
            raise ValueError(f"{path}:{number}: {what} {field!r} is not a whole number")
        value = int(f)
    if not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        raise ValueError(f"{path}:{number}: {what} {field!r} is out of range (a 64-bit integer, below 2**63)")
    return value


def read_rank_file(path: str | os.PathLike, n_items: int | None = None, n_samples: int | None = None) -> RankFile:
    """Read a rank file (see the module doc); validates 1 <= r~ <= m + 1, n >= 2 and m >= 1 (m may exceed
    n - 1 for draws with replacement; the estimators check it for the hypergeometric law).

    A file with one separator throughout (the common case, e.g. what :func:`write_rank_file` writes) is read by
    ``np.loadtxt`` and checked as whole columns; any other (separators mixed between lines, whole numbers written
    as floats such as ``1e3``) or any file that fails a check is read line by line, which gives the same values
    where both read a file and names the file, the line and the field of the first error."""
    if n_items is not None:
        n_items = check_size(n_items, "n_items", 2, MAX_SIZE)
    if n_samples is not None:
        n_samples = check_size(n_samples, "n_samples", 1, MAX_SIZE)
    path = Path(check_path(path))
    data = _read_bytes(path)
    if _names_share(data):
        return _share_rank_file(path, data)
    table = _rank_table(data, n_items, n_samples)
    return table if table is not None else _rank_file_by_line(path, data, n_items, n_samples)


def _data_line(text: str, start: int) -> tuple[str, int] | None:
    """The first line from offset ``start`` of ``text`` (line ends ``\\n``) with data, its ``#`` comment and outer
    blanks dropped, and the offset after it; None without one."""
    while start < len(text):
        end = text.find("\n", start)
        end = len(text) if end < 0 else end
        line = text[start:end].split("#", 1)[0].strip()
        if line:
            return line, end + 1
        start = end + 1
    return None


_POPULARITY_ROW = np.dtype([("r", np.int64), ("n", np.int64), ("m", np.int64), ("s1", np.float64), ("s2", np.float64)])


def _rank_table(data: bytes, n_items: int | None, n_samples: int | None) -> RankFile | None:
    """The file read by ``np.loadtxt`` where that reads it as the line reader would, and every check passes; None
    otherwise (the line reader then reads it, and names the first error's line).

    Read so: UTF-8 text (a byte-order mark dropped; ``\\r\\n`` and ``\\r`` line ends), an optional header line, then
    lines of 1, 2, 3 or 5 numbers separated by one kind of separator: the one of comma, semicolon or tab that the
    data contain (no other), or spaces where they contain none. Nothing the line reader refuses is accepted: the
    integer columns take digits only (``3.0`` goes to the line reader), an empty field or a changing number of
    fields fails, numpy's warnings (an empty file) are errors."""
    text = _utf8_text(data)
    if text is None:
        return None
    first = _data_line(text, 0)
    if first is None:
        return None
    line, after = first
    start = 0
    if _is_header(_fields(line)[0]):  # the header: the data start after it
        start, first = after, _data_line(text, after)
        if first is None:
            return None
        line = first[0]
    body = text[start:]
    seps = [sep for sep in ",;\t" if sep in body]
    if len(seps) > 1:
        return None  # separators mixed (or in comments): the line reader's split
    columns = len(_fields(line))
    if columns not in (1, 2, 3, 5):
        return None
    rows: np.ndarray[Any, np.dtype[Any]]  # int64 columns, or the records of _POPULARITY_ROW
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rows = np.loadtxt(io.StringIO(body), dtype=_POPULARITY_ROW if columns == 5 else np.int64,
                              delimiter=seps[0] if seps else None, comments="#", quotechar='"', ndmin=1 if columns == 5 else 2)
    except (ValueError, TypeError, Warning):
        return None
    n: np.ndarray | None
    m: np.ndarray | None
    s1: np.ndarray | None
    s2: np.ndarray | None
    if columns == 5:
        r, n, m, s1, s2 = (rows[name] for name in ("r", "n", "m", "s1", "s2"))
    else:
        if rows.shape[1] != columns:
            return None
        r = rows[:, 0]
        n = rows[:, 1] if columns > 1 else None
        m = rows[:, 2] if columns > 2 else None
        s1 = s2 = None
    if (n is None and n_items is None) or (m is None and n_samples is None):
        return None  # the line reader names the first line without them
    n = np.full(len(r), n_items, dtype=np.int64) if n is None else np.ascontiguousarray(n)
    m = np.full(len(r), n_samples, dtype=np.int64) if m is None else np.ascontiguousarray(m)
    r = np.ascontiguousarray(r)
    ok = (m >= 1) & (n >= 2) & (r >= 1) & (r - 1 <= m) & (n <= MAX_SIZE) & (m <= MAX_SIZE)
    if s1 is not None and s2 is not None:  # _check_hh, column-wise (both or neither are read)
        tol = 1e-9
        s1, s2 = np.ascontiguousarray(s1), np.ascontiguousarray(s2)
        b = (r - 1).astype(np.float64)
        with np.errstate(invalid="ignore", over="ignore"):
            ok &= np.isfinite(s1) & np.isfinite(s2) & (s1 >= 0) & (s2 >= 0)
            ok &= np.where(b == 0, (s1 == 0) & (s2 == 0),
                           (s1 >= b * (1 - tol)) & (s2 >= s1 * (1 - tol)) & (b * s2 >= s1 * s1 * (1 - tol)))
    if not bool(ok.all()):
        return None
    return RankFile(r, n, m, s1, s2)


def _is_header(field: str) -> bool:
    """Whether a first line's first field is a header's: no digit in it, and not a number Python reads without one
    (``nan``, ``inf``: a damaged rank, reported as such, never dropped as a header)."""
    if any(ch.isdigit() for ch in field):
        return False
    try:
        float(field)
    except ValueError:
        return True
    return False


def _rank_file_by_line(path: Path, data: bytes, n_items: int | None, n_samples: int | None) -> RankFile:
    """The line reader of rank files: every format of the module doc, and the first error with its line."""
    ranks: list[int] = []
    ns: list[int] = []
    ms: list[int] = []
    s1s: list[float] = []
    s2s: list[float] = []
    first = True
    split = _FIELDS.split
    for number, text in _lines(path, data):
        fields = split(text) if '"' not in text else _fields(text)
        if first and _is_header(fields[0]):
            first = False
            continue  # a header (a first field without digits); a malformed number is reported below
        first = False
        if "" in fields:
            raise ValueError(f"{path}:{number}: empty field in {text!r}")
        if len(fields) not in (1, 2, 3, 5) or (s1s and len(fields) != 5) or (ranks and not s1s and len(fields) == 5):
            raise ValueError(f"{path}:{number}: expected 'rank[,n_candidates[,n_samples]]' or, on every line of a "
                             f"popularity-sampled file, 'rank,n_candidates,n_samples,hh_s1,hh_s2', got {len(fields)} "
                             "fields")
        r, n, m = _rank_fields(fields, path, number, n_items, n_samples)
        if len(fields) == 5:
            s1, s2 = _float(fields[3], path, number, "hh_s1"), _float(fields[4], path, number, "hh_s2")
            _check_hh(r - 1, s1, s2, path, number)
            s1s.append(s1)
            s2s.append(s2)
        ranks.append(r)
        ns.append(n)
        ms.append(m)
    if not ranks:
        raise ValueError(f"{path}: no ranks found")
    hh = (np.asarray(s1s, dtype=np.float64), np.asarray(s2s, dtype=np.float64)) if s1s else (None, None)
    return RankFile(np.asarray(ranks, dtype=np.int64), np.asarray(ns, dtype=np.int64), np.asarray(ms, dtype=np.int64),
                    *hh)


def _rank_fields(fields: list[str], path: Path, number: int, n_items: int | None,
                 n_samples: int | None) -> tuple[int, int, int]:
    """(r~, n, m) of a line's first fields (n, m from the defaults where the line has none), checked."""
    r = _int(fields[0], path, number, "rank")
    n = _int(fields[1], path, number, "n_candidates") if len(fields) > 1 else n_items
    m = _int(fields[2], path, number, "n_samples") if len(fields) > 2 else n_samples
    if n is None:
        raise ValueError(f"{path}:{number}: no candidate count on the line and no --n-items given")
    if m is None:
        raise ValueError(f"{path}:{number}: no sample size on the line and no --n-samples given")
    if m < 1 or n < 2:
        raise ValueError(f"{path}:{number}: need n_candidates >= 2 and n_samples >= 1, got n = {n}, m = {m}")
    if max(n, m) > MAX_SIZE:
        raise ValueError(f"{path}:{number}: n_candidates and n_samples are at most 2^40 = {MAX_SIZE}, got n = {n}, "
                         f"m = {m}")
    if not 1 <= r <= m + 1:
        raise ValueError(f"{path}:{number}: sampled rank {r} outside 1..m+1 = 1..{m + 1}")
    return r, n, m


def _names_share(data: bytes) -> bool:
    """Whether the file's header (its first data line, without digits in its first field) names ``exact_rank``."""
    text = _utf8_text(data)
    first = None if text is None else _data_line(text, 0)
    if first is None:
        return False
    fields = [f.strip().lower() for f in _fields(first[0])]
    return _is_header(fields[0]) and "exact_rank" in fields


def _share_rank_file(path: Path, data: bytes) -> RankFile:
    """A rank file with an exact share: the header :data:`SHARE_HEADER`, then per positive
    ``sampled_rank,n_candidates,n_samples,exact_rank,inclusion`` (one comma, semicolon or tab between fields; exact_rank
    empty where the positive was not chosen). The first error names its line."""
    cols: list[tuple[int, int, int, int, float]] = []
    lines = _lines(path, data)
    number, text = next(lines)
    header = tuple(f.strip().lower() for f in _fields(text))
    if header != SHARE_HEADER:
        raise ValueError(f"{path}:{number}: a rank file with exact ranks needs the header {','.join(SHARE_HEADER)} "
                         f"(exact_rank empty where the positive was not chosen), got {text!r}")
    for number, text in lines:
        fields = [f.strip() for f in re.split(r"[,;\t]", text.replace('"', ""))]
        if len(fields) != len(SHARE_HEADER):
            raise ValueError(f"{path}:{number}: expected {len(SHARE_HEADER)} fields {','.join(SHARE_HEADER)}, got "
                             f"{len(fields)}")
        if "" in fields[:3] or not fields[4]:
            raise ValueError(f"{path}:{number}: empty field in {text!r} (only exact_rank may be empty)")
        r, n, m = _rank_fields(fields, path, number, None, None)
        e = _int(fields[3], path, number, "exact_rank") if fields[3] else 0
        if fields[3] and not 1 <= e <= n:
            raise ValueError(f"{path}:{number}: exact_rank {e} outside 1..n = 1..{n} (leave it empty where the "
                             "positive was not chosen)")
        p = _float(fields[4], path, number, "inclusion")
        if not MIN_INCLUSION <= p <= 1:
            raise ValueError(f"{path}:{number}: inclusion {fields[4]!r} must be a probability in "
                             f"[{MIN_INCLUSION:g}, 1] (MIN_INCLUSION)")
        cols.append((r, n, m, e, p))
    if not cols:
        raise ValueError(f"{path}: no ranks found")
    r_, n_, m_, e_, p_ = (np.asarray(c) for c in zip(*cols))
    return RankFile(r_, n_, m_, exact_rank=e_, inclusion=p_.astype(np.float64))


def _estimate_flags(design: SamplingDesign) -> str:
    """The ``reco-sampled estimate`` flags that read a rank file of ``design`` back."""
    flags = f"--n-samples {design.n_samples}"
    if design.adaptive_max is not None:
        flags += f" --adaptive-max {design.adaptive_max}"
    if not design.replacement:
        flags += " --sampling hypergeometric"
    if design.popularity is not None:
        flags += " --sampling popularity --metric auc --method hh"
    return flags


def write_rank_file(path: str | os.PathLike, sampled: SampledRanks) -> Path:
    """Write the :class:`~reco_sampled_plugin.ranking.SampledRanks` of a draw as a rank file (module docstring):
    ``sampled_rank,n_candidates,n_samples`` per positive, in row order (padding dropped), adaptive draws with each
    positive's final m, popularity draws with ``hh_s1,hh_s2`` (each positive's statistics, 17 digits); ``#`` lines above name the design, the ``reco-sampled estimate`` flags for it and the
    scorer loop's cost (``sampled.cost``) when there is one. ``reco-sampled estimate FILE <flags>`` (or
    :func:`read_rank_file` and ``estimate(metric, ranks, n, m, adaptive=...)``) then gives what
    ``estimate(metric, sampled)`` gives.

    Args:
        path: the file to write (replaced if it exists).
        sampled: the draw's SampledRanks (from ``sampled_ranks``, ``adaptive_sampled_ranks`` or
            ``sampled_ranks_from_scorer``), carrying its design.

    Returns:
        the path written.

    Raises:
        ValueError: not a SampledRanks, no design, popularity draws without statistics (or with unreachable
            candidates), exact ranks of an ``exact_at_cap`` design (no column for them), ranks that are not whole
            (``ties="average"``), no positive, or a path that cannot
            be written.
    """
    import torch

    path = check_path(path)
    if not isinstance(sampled, SampledRanks):
        raise ValueError(f"sampled: expected the SampledRanks of a draw (sampled_ranks, adaptive_sampled_ranks, "
                         f"sampled_ranks_from_scorer), got {type(sampled).__name__}")
    design = sampled.design
    if design is None:
        raise ValueError("sampled: these SampledRanks carry no design; a rank file needs the draw's m")
    stats = sampled.popularity_stats
    if design.popularity is not None and stats is None:
        raise ValueError("sampled: these popularity-sampled ranks carry no per-draw statistics (draws without "
                         "replacement keep none), and a rank file of popularity draws needs them (hh_s1, hh_s2)")
    if sampled.exact_ranks is not None:  # the format has no column for them: refused, not dropped
        raise ValueError("sampled: exact_at_cap ranks cannot be written to a rank file (it has no column for the "
                         "exact ranks of the completed positives); estimate in Python: estimate(metric, sampled)")
    share = sampled.share_ranks is not None
    if share and design.popularity is not None:  # the five columns of either: one file cannot hold both
        raise ValueError("sampled: popularity-sampled ranks with an exact share cannot be written to a rank file "
                         "(its columns hold the exact share or the Hansen-Hurwitz statistics); estimate in Python")
    ranks = sampled.ranks.cpu()
    if ranks.is_floating_point() and not bool((ranks == ranks.floor()).all()):
        raise ValueError("sampled: the ranks are not whole (ties='average'); draw with ties='pessimistic' or "
                         "'optimistic' to write a rank file")
    keep = ranks > 0
    if not bool(keep.any()):
        raise ValueError("sampled: no positive to write (every slot is padding)")
    sizes = sampled.sizes()
    m = sizes.cpu()[keep] if isinstance(sizes, torch.Tensor) else torch.full((int(keep.sum()),), int(sizes))
    table = torch.stack([ranks[keep].to(torch.int64), sampled.candidates().cpu()[keep].to(torch.int64),
                         m.to(torch.int64)], 1).numpy()
    if design.popularity is not None:
        assert stats is not None  # refused above: a popularity design without statistics
        if bool((stats.unreachable.cpu()[keep] > 0).any()):
            raise ValueError("popularity: some evaluated positives have drawable candidates of weight 0 (never drawn): "
                             "no estimate counts them, so no rank file is written for them")
        hh = torch.stack([stats.inv_q.cpu()[keep], stats.inv_q2.cpu()[keep]], 1).to(torch.float64).numpy()
    lines = [f"# reco-sampled rank file: {len(table):,} positives; design: {design.describe()}",
             f"# read back: reco-sampled estimate FILE {_estimate_flags(design)}"]
    cost = sampled.cost
    if cost is not None:
        per_pair = cost.scorer_seconds / cost.pairs if cost.pairs else math.nan
        lines.append(f"# scorer cost: {cost.pairs:,} pairs in {cost.calls:,} calls, {cost.scorer_seconds:.6g} s in "
                     f"the scorer ({per_pair:.6g} s per pair: reco-sampled plan --seconds-per-pair), "
                     f"{cost.loop_seconds:.6g} s in the loop; full ranking: {cost.full_pairs:,} pairs")
    lines.append(",".join(SHARE_HEADER) if share else
                 "sampled_rank,n_candidates,n_samples" + (",hh_s1,hh_s2" if design.popularity is not None else ""))
    path = Path(path)
    try:
        with open(path, "w", encoding="utf-8", newline="\n") as fh:
            fh.write("\n".join(lines) + "\n")
            if share:  # exact_rank empty where not chosen; pi to 17 significant digits: read back exactly
                assert sampled.share_ranks is not None and sampled.inclusion is not None
                e = sampled.share_ranks.cpu()[keep].to(torch.int64).tolist()
                p = sampled.inclusion.cpu()[keep].to(torch.float64).tolist()
                fh.writelines(f"{r},{n},{k},{x or ''},{q!r}\n" for (r, n, k), x, q in zip(table.tolist(), e, p))
            elif design.popularity is None:
                np.savetxt(fh, table, fmt="%d", delimiter=",")
            else:  # the statistics to 17 significant digits: read back exactly
                fh.writelines(f"{r},{n},{k},{a!r},{b!r}\n" for (r, n, k), (a, b) in
                              zip(table.tolist(), hh.tolist()))
    except OSError as exc:
        raise ValueError(f"{path}: cannot be written ({exc.strerror or exc})") from None
    return path


def _items(fields: list[str], path: Path, number: int) -> np.ndarray:
    """A line's negative items (int64), each read as :func:`_int` reads it: ASCII digits converted at once by numpy
    (the same integers), anything else field by field (its error names the field)."""
    if all(f.isascii() and f.isdigit() for f in fields) and all(len(f) < 19 for f in fields):
        return np.array(fields, dtype=np.int64)  # below 10**18: inside int64
    return np.array([_int(f, path, number, "negative item") for f in fields], dtype=np.int64)


def _sorted_scores(u: np.ndarray, i: np.ndarray, s: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.lexsort((i, u))
    return u[order], i[order], s[order]


def _score_table(data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """A score file (``user item score`` lines, blanks or tabs between fields) read by ``np.loadtxt``: the
    (user, item, score) columns sorted by user and item; None where the line reader must read it (commas or
    semicolons, which it also takes as separators; blanks numpy does not split at; a field numpy does not read;
    a score not finite; a pair scored twice): it then names the line."""
    text = _utf8_text(data)
    if text is None:
        return None
    if "," in text or ";" in text or any(ch.isspace() for ch in set(text) - {" ", "\t", "\n"}):
        return None
    row = np.dtype([("u", np.int64), ("i", np.int64), ("s", np.float64)])
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            rows = np.loadtxt(io.StringIO(text), dtype=row, delimiter=None, comments="#", quotechar=None, ndmin=1)
    except (ValueError, TypeError, Warning):
        return None
    su, si, ss = _sorted_scores(rows["u"], rows["i"], rows["s"])
    if not bool(np.isfinite(ss).all()) or bool(((su[1:] == su[:-1]) & (si[1:] == si[:-1])).any()):
        return None
    return su, si, ss


def _scores_by_line(scores: Path, data: bytes) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The line reader of score files (any of blanks, tabs, commas, semicolons between fields): the columns sorted
    by user and item, or the first bad line's error."""
    score: dict[tuple[int, int], float] = {}
    for number, text in _lines(scores, data):
        fields = [f for f in _SPLIT.split(text) if f]
        if len(fields) != 3:
            raise ValueError(f"{scores}:{number}: expected 'user item score', got {text!r}")
        try:
            s = float(fields[2])
        except ValueError:
            raise ValueError(f"{scores}:{number}: score {fields[2]!r} is not a number") from None
        if not np.isfinite(s):
            raise ValueError(f"{scores}:{number}: score is NaN or inf")
        pair = (_int(fields[0], scores, number, "user"), _int(fields[1], scores, number, "item"))
        if pair in score:
            raise ValueError(f"{scores}:{number}: (user, item) {pair} scored twice")
        score[pair] = s
    pairs = np.array(list(score), dtype=np.int64).reshape(-1, 2)
    return _sorted_scores(pairs[:, 0], pairs[:, 1], np.fromiter(score.values(), dtype=np.float64, count=len(score)))


def read_ncf(test_rating: str | os.PathLike, test_negative: str | os.PathLike, scores: str | os.PathLike, n_items: int,
             ties: str = "pessimistic", distinct: bool = False) -> RankFile:
    """Sampled ranks of NCF-style test files: each held-out item against its listed negatives.

    ``n_items`` is the number of candidates per user (n, the held-out item included) that the
    negatives were drawn from. Ties count against the held-out item (``pessimistic``) or for it
    (``optimistic``). ``distinct``: the negatives were drawn without replacement, so a line that lists an item
    twice is refused (its hypergeometric law would be applied to draws that are not). A score file with blanks or tabs between fields is read by ``np.loadtxt`` and looked up
    sorted by (user, item); others (commas or semicolons) and any file that fails a check by the line reader,
    which names the line of the first error.
    """
    n_items = check_size(n_items, "n_items", 2)
    test_rating, test_negative, scores = (Path(check_path(p, k)) for p, k in (
        (test_rating, "test_rating"), (test_negative, "test_negative"), (scores, "scores")))
    if not isinstance(ties, str) or ties not in END_TIES:
        raise ValueError(f"ties: use 'pessimistic' or 'optimistic', got {ties!r}")
    held_out: dict[int, int] = {}
    for number, text in _lines(test_rating):
        fields = [f for f in _SPLIT.split(text) if f]
        if len(fields) < 2:
            raise ValueError(f"{test_rating}:{number}: expected 'user<TAB>item', got {text!r}")
        user = _int(fields[0], test_rating, number, "user")
        if user in held_out:
            raise ValueError(f"{test_rating}:{number}: user {user} listed twice (one held-out item per user)")
        held_out[user] = _int(fields[1], test_rating, number, "item")
    score_data = _read_bytes(scores)
    table = _score_table(score_data)
    su, si, ss = table if table is not None else _scores_by_line(scores, score_data)
    ranks, ms = [], []
    pat = re.compile(r"^\(\s*(\d+)\s*,\s*(\d+)\s*\)\s*(.*)$")
    for number, text in _lines(test_negative):
        match = pat.match(text)
        if match is None:
            raise ValueError(f"{test_negative}:{number}: expected '(user,item)<TAB>neg_1<TAB>...', got {text[:40]!r}")
        u, i = int(match.group(1)), int(match.group(2))
        if held_out.get(u) != i:
            raise ValueError(f"{test_negative}:{number}: ({u},{i}) is not the held-out pair of {test_rating.name}")
        negs = _items([f for f in _SPLIT.split(match.group(3).strip()) if f], test_negative, number)
        if not negs.size:
            raise ValueError(f"{test_negative}:{number}: no negatives listed")
        if bool((negs == i).any()):
            raise ValueError(f"{test_negative}:{number}: the held-out item {i} is listed among its own negatives")
        if distinct and np.unique(negs).size < negs.size:
            raise ValueError(f"{test_negative}:{number}: an item listed twice among the negatives, which draws without "
                             "replacement (--sampling hypergeometric) cannot give; drop the option if they were drawn "
                             "with replacement")
        # the user's scored items: a slice of the pairs sorted by (user, item)
        lo, hi = np.searchsorted(su, u, side="left"), np.searchsorted(su, u, side="right")
        wanted = np.concatenate([np.array([i], dtype=np.int64), negs])
        where = lo + np.searchsorted(si[lo:hi], wanted)
        found = (where < hi) & (si[np.minimum(where, len(si) - 1)] == wanted) if len(si) else np.zeros(len(wanted), bool)
        if not bool(found.all()):
            missing = (u, int(wanted[int(np.argmin(found))]))
            raise ValueError(f"{test_negative}:{number}: no score for (user, item) {missing} in {scores.name}")
        s_pos, s_neg = ss[where[0]], ss[where[1:]]
        beats = (s_neg >= s_pos) if ties == "pessimistic" else (s_neg > s_pos)
        ranks.append(1 + int(beats.sum()))
        ms.append(len(negs))
    if not ranks:
        raise ValueError(f"{test_negative}: no test lines found")
    m = np.asarray(ms, dtype=np.int64)
    if int(m.max()) >= n_items:
        raise ValueError(f"n_items: {n_items} candidates cannot hold {int(m.max())} distinct negatives plus the held-out item")
    return RankFile(np.asarray(ranks, dtype=np.int64), np.full(len(ranks), n_items, dtype=np.int64), m)
