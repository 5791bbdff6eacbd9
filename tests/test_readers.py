"""Delimited files read by numpy's reader with the line reader's errors, and the one table writer.

Rank files (``rank_files.read_rank_file``) and interaction files (``datasets.load_interactions``) are read by
``np.loadtxt`` where the file has one separator throughout, and line by line otherwise; the two must give the same
values, and every error must name the file and the line, whichever reader saw the file first. The oracles: the
numbers written into each file, and the line reader (``_rank_file_by_line``, or ``load_interactions`` with the
numpy reader switched off) on files of any shape. Tables: ``_tables.format_table`` against hand-written Markdown and
the fixed-width lines the terminal printed before it existed.
"""

from __future__ import annotations

import contextlib
import re
import tempfile
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from _profiles import examples

from reco_sampled_plugin import datasets, rank_files
from reco_sampled_plugin._tables import format_table
from reco_sampled_plugin.datasets import load_interactions
from reco_sampled_plugin.rank_files import read_rank_file

ROWS = [(1, 100, 10), (4, 100, 10), (11, 5000, 10), (2, 7, 20), (1, 2, 1)]


def _table(rows, sep: str, quote: bool = False) -> list[str]:
    q = '"' if quote else ""
    return [sep.join(f"{q}{v}{q}" for v in row) for row in rows]


def _write(path: Path, lines: list[str], *, header: str | None = None, bom: bool = False, end: str = "\n") -> Path:
    text = end.join(([header] if header is not None else []) + lines) + end
    path.write_bytes(("\ufeff" if bom else "").encode("utf-8") + text.encode("utf-8"))
    return path


def _by_line(path, n_items=None, n_samples=None):
    path = Path(path)
    return rank_files._rank_file_by_line(path, rank_files._read_bytes(path), n_items, n_samples)


def _same(a, b) -> bool:
    fields = ("ranks", "n_items", "n_samples", "hh_s1", "hh_s2")
    return all((getattr(a, f) is None and getattr(b, f) is None)
               or (getattr(a, f).dtype == getattr(b, f).dtype and np.array_equal(getattr(a, f), getattr(b, f)))
               for f in fields)


# ---------------------------------------------------------------------------------------------------- rank files
VARIANTS = {
    "commas": dict(sep=","),
    "semicolons": dict(sep=";"),
    "tabs": dict(sep="\t"),
    "spaces": dict(sep=" "),
    "runs of spaces": dict(sep="   "),
    "comma and space": dict(sep=", "),
    "header": dict(sep=",", header="sampled_rank,n_candidates,n_samples"),
    "BOM and header": dict(sep="\t", header="rank\tn\tm", bom=True),
    "BOM, no header": dict(sep=";", bom=True),
    "CRLF": dict(sep=",", end="\r\n", header="rank,n,m"),
    "CR": dict(sep=" ", end="\r"),
    "quoted": dict(sep=",", quote=True, header='"rank","n","m"'),
    "quoted, semicolons": dict(sep=";", quote=True),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_rank_file_formats_read_the_same_numbers(tmp_path, variant):
    """One table written with each separator, BOM, line end, header or none, quoted or not: the same int64 arrays,
    read by numpy's reader (one separator throughout) and equal to the line reader's."""
    kw = dict(VARIANTS[variant])
    sep, quote = kw.pop("sep"), kw.pop("quote", False)
    path = _write(tmp_path / "r.txt", _table(ROWS, sep, quote), **kw)
    data = read_rank_file(path)
    assert data.ranks.dtype == np.int64 and not data.popularity
    assert [tuple(x) for x in zip(data.ranks.tolist(), data.n_items.tolist(), data.n_samples.tolist())] == ROWS
    assert rank_files._rank_table(path.read_bytes(), None, None) is not None  # numpy's reader took it
    assert _same(data, _by_line(path))


def test_rank_file_mixed_separators_comments_and_defaults(tmp_path):
    """What only the line reader reads (separators mixed between lines, whole numbers written as floats) gives the
    same numbers; ``#`` comments and blank lines are skipped by both readers; missing columns take the defaults."""
    path = _write(tmp_path / "mixed.txt", ["# ranks", "1,100,10", "", "4;100;10  # a comment", "11\t5000\t10",
                                           "2   7 20", "1.0,2,1e0"])
    assert rank_files._rank_table(path.read_bytes(), None, None) is None
    data = read_rank_file(path)
    assert [tuple(x) for x in zip(data.ranks.tolist(), data.n_items.tolist(), data.n_samples.tolist())] == ROWS
    one = _write(tmp_path / "one.txt", ["# r only", "3", "1", "", "7  # last"])
    data = read_rank_file(one, n_items=50, n_samples=9)
    assert data.ranks.tolist() == [3, 1, 7] and data.n_items.tolist() == [50] * 3 and data.n_samples.tolist() == [9] * 3
    assert rank_files._rank_table(one.read_bytes(), 50, 9) is not None and _same(data, _by_line(one, 50, 9))
    two = _write(tmp_path / "two.txt", ["1 100", "2 300"], header="rank n")
    data = read_rank_file(two, n_samples=5)
    assert data.n_items.tolist() == [100, 300] and data.n_samples.tolist() == [5, 5]


def test_popularity_rank_file_statistics_exact_by_both_readers(tmp_path):
    """Five columns: the Hansen-Hurwitz statistics as float64, to the last bit (17 significant digits)."""
    s1, s2 = 2.3456789012345678, 3.3333333333333335
    lines = [f"1,100,10,0,0", f"3,100,10,{s1!r},{s2!r}", f"2,100,10,{1.5!r},{2.25!r}"]
    for sep in (",", "\t"):
        path = _write(tmp_path / "pop.csv", [ln.replace(",", sep) for ln in lines], header="r,n,m,s1,s2")
        data = read_rank_file(path)
        assert data.popularity and data.hh_s1.tolist() == [0.0, s1, 1.5] and data.hh_s2.tolist() == [0.0, s2, 2.25]
        assert rank_files._rank_table(path.read_bytes(), None, None) is not None and _same(data, _by_line(path))


@pytest.mark.parametrize("line", ['" 1",100,10', '1,100,"10 "', '" 1" 100 10', '1\t" 100"\t10', '"1";"100" ; "10"'])
def test_quoted_blanks_are_blanks_around_a_field(tmp_path, line):
    """Blanks inside quotes at either end of a field are the blanks around it, for numpy's reader and the line
    reader alike (a quoted first field starting with a blank is not taken for a header)."""
    path = _write(tmp_path / "q.txt", [line, line.replace("1", "2", 1)])
    data = read_rank_file(path)
    assert data.ranks.tolist() == [1, 2] and data.n_items.tolist() == [100, 100] and data.n_samples.tolist() == [10, 10]
    assert _same(data, _by_line(path))


def test_large_rank_file_error_names_its_late_line(tmp_path):
    """A file numpy reads fast up to one bad value: the error still names the line (the line reader's message)."""
    lines = [f"{1 + k % 10},1000,10" for k in range(5000)]
    lines[4321] = "12,1000,10"  # rank above m + 1
    path = _write(tmp_path / "big.csv", lines, header="rank,n,m")
    with pytest.raises(ValueError, match=re.escape(f"{path}:4323: sampled rank 12 outside 1..m+1 = 1..11")):
        read_rank_file(path)


BAD_RANK_FILES = [
    # (lines, line named, message): every separator below
    (["1,100,10", "2,100,x"], 2, "n_samples 'x' is not a number"),
    (["1,100,10", "2,100"], 2, "no sample size on the line and no --n-samples given"),  # ragged, no default m
    (["1,100,10", "2,100,10,5"], 2, "got 4 fields"),
    (["1,100", "2,100"], 1, "no sample size on the line and no --n-samples given"),  # a missing column
    (["1,,10"], 1, "empty field"),
    (["1,100,10", "1,1,10"], 2, "need n_candidates >= 2"),
    (["1,100,10", '"2",100,"x"'], 2, "n_samples 'x' is not a number"),
]


@pytest.mark.parametrize("sep, case", [(sep, case) for sep in (",", ";", "\t", " ") for case in range(len(BAD_RANK_FILES))
                                       if not (sep == " " and ",," in BAD_RANK_FILES[case][0][-1])])  # spaces: a run
def test_bad_rank_files_name_file_and_line(tmp_path, sep, case):
    lines, line, message = BAD_RANK_FILES[case]
    path = _write(tmp_path / "bad.csv", [ln.replace(",", sep) for ln in lines], header=f"rank{sep}n{sep}m")
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line + 1}: ")) as err:
        read_rank_file(path)
    assert message in str(err.value)


def test_empty_and_header_only_rank_files(tmp_path):
    for text in ("", "\n\n", "# nothing\n", "rank,n,m\n", "\ufeff"):
        path = tmp_path / "empty.csv"
        path.write_bytes(text.encode("utf-8"))
        with pytest.raises(ValueError, match=re.escape(f"{path}: no ranks found")):
            read_rank_file(path)


_CELLS = st.sampled_from(["1", "2", "3", "7", "10", "100", "+4", "007", "3.0", "1e2", "x", "", "nan", "-1", "0",
                          '"5"', '"1"0', "2.5", "9223372036854775808", " 6 ", "1_0", '" 6"', '"6 "', '""'])
_SEPS = st.sampled_from([",", ";", "\t", " ", "  ", ", ", " ;"])


@settings(max_examples=examples(150), deadline=None)
@given(rows=st.lists(st.tuples(st.lists(_CELLS, min_size=1, max_size=5), _SEPS), min_size=0, max_size=6),
       header=st.booleans(), bom=st.booleans(), end=st.sampled_from(["\n", "\r\n", "\r"]),
       defaults=st.sampled_from([(None, None), (100, 10)]))
def test_numpy_reader_never_differs_from_the_line_reader(rows, header, bom, end, defaults):
    """Any file: read_rank_file (numpy's reader where it takes the file) gives what the line reader gives, values
    or error message."""
    lines = [sep.join(cells) for cells, sep in rows]
    with tempfile.TemporaryDirectory() as tmp:
        path = _write(Path(tmp) / "f.txt", lines, header="rank,n,m" if header else None, bom=bom, end=end)

        def outcome(read):
            try:
                return read(path, *defaults)
            except ValueError as exc:
                return str(exc)

        got, want = outcome(read_rank_file), outcome(_by_line)
    if isinstance(want, str):
        assert got == want
    else:
        assert not isinstance(got, str) and _same(got, want), (got, want)


# ---------------------------------------------------------------------------------------------------- NCF files
def _ncf_files(tmp_path, sep=" ", seed=0, users=30, m=9, n=60):
    """NCF test files and a score file with ties (scores rounded to 1 decimal); the exact sampled ranks by brute
    force: 1 + the negatives scoring above (optimistic) or at least (pessimistic) the held-out item."""
    gen = np.random.default_rng(seed)
    rating, negative, score_lines, truth = [], [], [], {"pessimistic": [], "optimistic": []}
    for u in range(users):
        items = gen.choice(n, m + 1, replace=False)
        scores = np.round(gen.normal(size=m + 1), 1)
        rating.append(f"{u}\t{items[0]}\t5\t0")
        negative.append(f"({u},{items[0]})\t" + "\t".join(map(str, items[1:])))
        order = gen.permutation(m + 1)  # the score file in any order
        score_lines += [f"{u}{sep}{items[k]}{sep}{float(scores[k])!r}" for k in order]
        truth["pessimistic"].append(1 + int((scores[1:] >= scores[0]).sum()))
        truth["optimistic"].append(1 + int((scores[1:] > scores[0]).sum()))
    (tmp_path / "x.test.rating").write_text("\n".join(rating) + "\n")
    (tmp_path / "x.test.negative").write_text("\n".join(negative) + "\n")
    (tmp_path / "s.txt").write_text("# user item score\n" + "\n".join(score_lines) + "\n")
    return truth


def _read_ncf(tmp_path, n=60, ties="pessimistic"):
    return rank_files.read_ncf(tmp_path / "x.test.rating", tmp_path / "x.test.negative", tmp_path / "s.txt", n, ties)


@pytest.mark.parametrize("sep", [" ", "\t", "  ", ",", " ; "])
def test_ncf_ranks_against_brute_force(tmp_path, sep):
    """Blank- or tab-separated score files are read by numpy's reader, commas and semicolons by the line reader:
    the same ranks, those of the brute-force count, for both tie policies."""
    truth = _ncf_files(tmp_path, sep)
    data = (tmp_path / "s.txt").read_bytes()
    assert (rank_files._score_table(data) is None) == (sep.strip() != "")
    for ties in ("pessimistic", "optimistic"):
        got = _read_ncf(tmp_path, ties=ties)
        assert got.ranks.tolist() == truth[ties] and got.n_samples.tolist() == [9] * 30 and got.n_items.tolist() == [60] * 30
    by_line = rank_files._scores_by_line(tmp_path / "s.txt", data)
    table = rank_files._score_table(data)
    if table is not None:
        assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(table, by_line))


@pytest.mark.parametrize("sep", [" ", ","])
@pytest.mark.parametrize("bad, line, message", [
    ("1 2 x", 5, "score 'x' is not a number"),
    ("1 2 nan", 5, "score is NaN or inf"),
    ("0 {item0} 0.5", 5, "scored twice"),
    ("1 2", 5, "expected 'user item score'"),
])
def test_bad_score_files_name_file_and_line(tmp_path, sep, bad, line, message):
    _ncf_files(tmp_path, users=1, m=2)
    lines = (tmp_path / "s.txt").read_text().splitlines()  # header comment, then three pairs of user 0
    item0 = (tmp_path / "x.test.rating").read_text().split("\t")[1]
    lines.append(bad.format(item0=item0))
    (tmp_path / "s.txt").write_text("\n".join(ln.replace(" ", sep) if not ln.startswith("#") else ln for ln in lines))
    with pytest.raises(ValueError, match=re.escape(f"{tmp_path / 's.txt'}:{line}: ") + ".*" + re.escape(message)):
        _read_ncf(tmp_path)


def test_missing_score_names_the_negative_line(tmp_path):
    _ncf_files(tmp_path, users=3, m=4)
    lines = (tmp_path / "s.txt").read_text().splitlines()
    negative = (tmp_path / "x.test.negative").read_text().splitlines()[1]  # user 1
    item = int(negative.split("\t")[3])
    kept = [ln for ln in lines if ln != f"1 {item}" and not ln.startswith(f"1 {item} ")]
    assert len(kept) == len(lines) - 1
    (tmp_path / "s.txt").write_text("\n".join(kept) + "\n")
    with pytest.raises(ValueError, match=re.escape(f"x.test.negative:2: no score for (user, item) (1, {item}) in s.txt")):
        _read_ncf(tmp_path)


_SCORE_CELLS = st.sampled_from(["0", "1", "2", "3", "0.5", "-1e3", "+2", "nan", "x", "", "1.0", "1_0", '"1"', "007"])


@settings(max_examples=examples(100), deadline=None)
@given(rows=st.lists(st.tuples(st.lists(_SCORE_CELLS, min_size=1, max_size=4), st.sampled_from([" ", "\t", "  ", ","])),
                     max_size=8), end=st.sampled_from(["\n", "\r\n"]))
def test_score_reader_never_differs_from_the_line_reader(rows, end):
    text = end.join(sep.join(cells) for cells, sep in rows) + end
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "s.txt"
        path.write_bytes(text.encode())
        try:
            want = rank_files._scores_by_line(path, path.read_bytes())
        except ValueError:
            want = None
    got = rank_files._score_table(text.encode())
    if got is not None:  # numpy's reader takes a file only where the line reader reads the same
        assert want is not None and all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(got, want))


# ------------------------------------------------------------------------------------------------- interactions
EVENTS = [("u1", "a", 4.5, 100), ("u2", "b", 1.0, 50), ("u1", "b", 2.0, 300), ("u3", "a", 5.0, 7)]


def _events_file(tmp_path, sep, *, header=True, bom=False, end="\n", quote=False):
    q = '"' if quote else ""
    head = [sep.join(f"{q}{h}{q}" for h in ("user_id", "item_id", "rating", "timestamp"))] if header else []
    lines = head + [sep.join(f"{q}{v}{q}" for v in row) for row in EVENTS]
    path = tmp_path / "events.txt"
    path.write_bytes(("\ufeff" if bom else "").encode() + (end.join(lines) + end).encode())
    return path


def _check_events(inter):
    assert list(inter.user_ids[inter.user]) == [e[0] for e in EVENTS]
    assert list(inter.item_ids[inter.item]) == [e[1] for e in EVENTS]
    assert inter.rating.tolist() == [e[2] for e in EVENTS] and inter.timestamp.tolist() == [e[3] for e in EVENTS]
    assert inter.user.dtype == np.int64 and inter.rating.dtype == np.float64


def _line_reader_only():
    return mock.patch.object(datasets, "_columns_by_loadtxt", lambda *a, **k: None)


def _same_interactions(a, b) -> bool:
    return all((getattr(a, f) is None and getattr(b, f) is None)
               or (getattr(a, f).dtype == getattr(b, f).dtype and np.array_equal(getattr(a, f), getattr(b, f)))
               for f in ("user", "item", "rating", "timestamp", "user_ids", "item_ids"))


def _path_call(reader: str, path):
    if reader == "read_ncf":
        return rank_files.read_ncf(path, "x.test.negative", "x.scores", n_items=10)
    if reader == "write_rank_file":
        import torch

        import reco_sampled_plugin as rsp

        sampled = rsp.sampled_ranks(torch.rand(2, 10, generator=torch.Generator().manual_seed(0)),
                                    torch.tensor([[1], [2]]), 3, generator=torch.Generator().manual_seed(1))
        return rank_files.write_rank_file(path, sampled)
    return {"read_rank_file": read_rank_file, "load_interactions": load_interactions}[reader](path)


@pytest.mark.parametrize("path, kind", [(None, "type"), (3, "type"), (3.5, "type"), (b"ranks.txt", "type"),
                                        ("", "empty"), ("  ", "empty")],
                         ids=["None", "int", "float", "bytes", "empty", "blank"])
@pytest.mark.parametrize("reader", ["read_rank_file", "load_interactions", "read_ncf", "write_rank_file"])
def test_every_reader_names_a_path_that_is_not_a_file_name(reader, path, kind):
    """One check of a file name (``_options.check_path``) for every reader and writer: None, numbers and bytes are an
    ArgumentTypeError naming the argument (not os.fspath's TypeError), an empty name a ValueError (not the current
    directory read as the file)."""
    from reco_sampled_plugin._checks import ArgumentTypeError

    name = "test_rating" if reader == "read_ncf" else "path"
    with pytest.raises(ArgumentTypeError if kind == "type" else ValueError, match=f"^{name}: expected a file name"):
        _path_call(reader, path)


@pytest.mark.parametrize("sep", [",", ";", "\t", "::", " "])
@pytest.mark.parametrize("form", ["plain", "no header", "BOM", "CRLF", "quoted"])
def test_interaction_formats_read_the_same_events(tmp_path, sep, form):
    """The same events with each separator, header or none, a byte-order mark, CRLF and quoted fields: the same
    arrays, by numpy's reader (quotes: the line reader, which drops them) and by the line reader."""
    kw = {"no header": dict(header=False), "BOM": dict(bom=True), "CRLF": dict(end="\r\n"),
          "quoted": dict(quote=True)}.get(form, {})
    path = _events_file(tmp_path, sep, **kw)
    inter = load_interactions(path)
    _check_events(inter)
    with _line_reader_only():
        assert _same_interactions(inter, load_interactions(path))


def test_quoted_interaction_fields_may_hold_the_separator(tmp_path):
    path = tmp_path / "q.csv"
    path.write_text('user,item,rating\n"Smith, J.","Heat (1995)",4\n"Doe","say ""hi""",3\n', encoding="utf-8")
    inter = load_interactions(path)
    assert list(inter.user_ids) == ["Smith, J.", "Doe"] and list(inter.item_ids) == ["Heat (1995)", 'say "hi"']
    assert inter.rating.tolist() == [4.0, 3.0]


BAD_EVENTS = [
    ("user,item,rating\n1,2,3\n1,3,x\n", 3, "rating 'x' is not a number"),  # a non-numeric cell
    ("1,2,3,100\n1,3,4\n", 2, "expected 4 fields, got 3"),  # a ragged row
    ("user,item,rating,timestamp\n1,2,3,100\n1,3,4,inf\n", 3, "timestamp 'inf' is not finite"),
    ("1,2\n,3\n", 2, "empty user or item id"),
    ("user,item\n1\n", 2, "expected 2 fields, got 1"),  # a missing column
]


@pytest.mark.parametrize("sep", [",", ";", "\t", "::"])
@pytest.mark.parametrize("case", range(len(BAD_EVENTS)))
def test_bad_interaction_files_name_file_and_line(tmp_path, sep, case):
    text, line, message = BAD_EVENTS[case]
    path = tmp_path / "bad.csv"
    path.write_text(text.replace(",", sep), encoding="utf-8")
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line}: ")) as err:
        load_interactions(path)
    assert message in str(err.value)
    with pytest.raises(ValueError, match=re.escape(f"{path}:{line}: ")), _line_reader_only():
        load_interactions(path)


def test_empty_interaction_files_and_columns_that_do_not_fit(tmp_path):
    for text in ("", "\ufeff\n", "user_id:token\titem_id:token\n"):
        path = tmp_path / "e.inter"
        path.write_bytes(text.encode("utf-8"))
        with pytest.raises(ValueError, match=re.escape(f"{path}: no interactions")):
            load_interactions(path)
    path = tmp_path / "c.csv"
    path.write_text("1,2,3\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:1: column positions")):
        load_interactions(path, columns=(0, 1, 2, 5))


_TOKENS = st.sampled_from(["u", "v", "7", " w ", "", '"q"', '"a,b"', "x y", "4.5", "nan", "1e3", "\xa0z", "::",
                           "1_0", '"', "\u0661"])


@settings(max_examples=examples(150), deadline=None)
@given(rows=st.lists(st.lists(_TOKENS, min_size=1, max_size=5), min_size=0, max_size=6),
       sep=st.sampled_from([",", ";", "\t", "::", " "]), header=st.booleans(), end=st.sampled_from(["\n", "\r\n"]))
def test_interactions_numpy_reader_never_differs_from_the_line_reader(rows, sep, header, end):
    text = end.join(([sep.join(["user", "item", "rating", "timestamp"])] if header else [])
                    + [sep.join(r) for r in rows]) + end
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "f.txt"
        path.write_bytes(text.encode("utf-8"))

        def outcome():
            try:
                return load_interactions(path)
            except ValueError as exc:
                return str(exc)

        got = outcome()
        with _line_reader_only():
            want = outcome()
    if isinstance(want, str):
        assert got == want
    else:
        assert not isinstance(got, str) and _same_interactions(got, want)


# ------------------------------------------------------------------------------------------------------- tables
def test_markdown_table_exactly():
    assert format_table(["metric", "recommender", "bv:0.1"], [["recall@10", "iALS", "0.1165 ± 0.0100"],
                                                              ["ndcg@10", "a|b", 3]]) == [
        "| metric | recommender | bv:0.1 |",
        "| --- | --- | --- |",
        "| recall@10 | iALS | 0.1165 ± 0.0100 |",
        r"| ndcg@10 | a\|b | 3 |",
    ]
    assert format_table(["a"], []) == ["| a |", "| --- |"]


def test_text_table_exactly():
    assert format_table(["recommender", "exact", "none"], [["iALS", "0.1294", "0.6365"]],
                        formats=["<22", ">9", ">12"]) == [
        "recommender               exact        none",
        "iALS                     0.1294      0.6365",
    ]
    # a cell longer than its width is not cut; no header line
    assert format_table(None, [["  a_very_long_key_name", " 0.5000"]], formats=["<8", ""]) == ["  a_very_long_key_name 0.5000"]


def test_table_refuses_ragged_rows():
    with pytest.raises(ValueError, match="^rows: row 1 has 1 cells, the table 2 columns"):
        format_table(["a", "b"], [["1", "2"], ["3"]])
    with pytest.raises(ValueError, match="^header: "):
        format_table(None, [["1"]])
    with pytest.raises(ValueError, match="^header: 1 names for 2 columns"):
        format_table(["a"], [], formats=["<3", ""])


def test_estimate_table_lines_as_before():
    """``reco-sampled estimate``'s table through the shared writer: the lines of the fixed-width f-strings it had."""
    import reco_sampled_plugin as rsp
    from reco_sampled_plugin.cli import estimate_table

    gen = np.random.default_rng(0)
    ranks = 1 + gen.binomial(100, gen.uniform(0, 1, 400))
    rows = [(metric, method, rsp.estimate(metric, rsp.SampledRanks.from_arrays(ranks, 2000, 100), method))
            for metric in ("auc", "ndcg@10") for method in ("none", "bv", "auto")]
    for stderr in (False, True):
        lines = estimate_table(rows, stderr=stderr, n_items=2000, users=400, n_samples=100)
        se_head = f"{'stderr (sampling only)':>24}" if stderr else ""
        expected = [f"{'metric':12}{'method':14}{'estimate':>11}{'95% interval':>22}{se_head}  flags"]
        for metric, method, est in rows:
            lo, hi = est.interval(0.95)
            flags = est.flags  # ``uncorrected`` set by estimate() (none, but for AUC at a fixed uniform m)
            label = f"{method}:{est.details['auto']['method']}" if "auto" in est.details else method
            se = f"{est.stderr:24.5f}" if stderr else ""
            expected.append(f"{metric:12}{label:14}{est.value:11.5f}{f'[{lo:.5f}, {hi:.5f}]':>22}{se}  {','.join(flags)}")
        assert lines[: len(expected)] == expected


# ------------------------------------------------------------------------- every reader, the same bytes, both paths
_PLAIN_FIELDS = st.sampled_from([b"1", b"2", b"10", b"100", b"0", b"-1", b"+3", b"1e2", b"3.0", b"2.5", b"u", b"x"])
#: Bytes around a field beyond the well-formed: control characters (NUL, which numpy's strings drop at a field's
#: end; vertical tab, form feed, file separators; NEL and U+2028, which end a line for str but not for numpy), digits
#: and numbers that Python's float() and numpy read differently or not at all, quotes, comments, long integers.
_ODD_BYTES = st.sampled_from([b"\x00", b"\x0b", b"\x0c", b"\x1c", b"\xc2\x85", b"\xe2\x80\xa8", b"\xef\xbb\xbf",
                              b"\xff", b'"', b"#", b"\r", b" ", b"::", b"_0", b"nan", b"inf", b"e400",
                              b"9223372036854775808", b"\xd9\xa3", b"\xc2\xa0", b"j", b"."])


@st.composite
def _file_bytes(draw) -> bytes:
    """A file: lines of plain fields, one field count throughout (so that the fast paths take it), with one or two
    odd bytes put at the start or the end of a field; or any bytes at all."""
    if draw(st.integers(0, 4)) == 0:
        return draw(st.binary(max_size=24))
    sep = draw(st.sampled_from([b",", b";", b"\t", b" "]))
    width = draw(st.integers(1, 5))
    lines = draw(st.lists(st.lists(_PLAIN_FIELDS, min_size=width, max_size=width), min_size=1, max_size=4))
    for _ in range(draw(st.integers(1, 2))):
        row, col = draw(st.integers(0, len(lines) - 1)), draw(st.integers(0, width - 1))
        odd = draw(_ODD_BYTES)
        lines[row][col] = odd + lines[row][col] if draw(st.booleans()) else lines[row][col] + odd
    return b"\n".join(sep.join(fields) for fields in lines) + draw(st.sampled_from([b"", b"\n"]))


def _reader_outcomes(reader: str, data: bytes, path: Path) -> tuple[object, object]:
    """(fast path's outcome, line reader's outcome) of ``reader`` on ``data``: the value, None where the fast path
    declines the file, or the error message."""
    path.write_bytes(data)

    def outcome(read):
        try:
            return read()
        except ValueError as exc:
            return str(exc)

    if reader == "rank":
        return outcome(lambda: rank_files._rank_table(data, 100, 10)), outcome(lambda: _by_line(path, 100, 10))
    if reader == "score":
        return outcome(lambda: rank_files._score_table(data)), outcome(lambda: rank_files._scores_by_line(path, data))
    fast = outcome(lambda: load_interactions(path, header=False))
    with _line_reader_only():
        return fast, outcome(lambda: load_interactions(path, header=False))


def _agree(reader: str, fast: object, slow: object) -> bool:
    if reader == "interactions":  # the public reader: the same value or the same message
        return fast == slow if isinstance(slow, str) else not isinstance(fast, str) and _same_interactions(fast, slow)
    if fast is None:  # the fast path declined: the line reader decides alone
        return True
    if isinstance(slow, str):  # the line reader refuses: the fast path must not have read it
        return False
    if reader == "rank":
        return _same(fast, slow)
    return all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(fast, slow))


@pytest.mark.parametrize("reader", ["rank", "score", "interactions"])
@settings(max_examples=examples(80), deadline=None)
@given(data=_file_bytes())
def test_every_reader_fast_path_refuses_what_its_line_reader_refuses(reader, data):
    """The same bytes through both paths of each reader (rank files, score files, interactions): the fast path
    takes a file only where the line reader reads the same values, and never one the line reader refuses."""
    with tempfile.TemporaryDirectory() as tmp:
        fast, slow = _reader_outcomes(reader, data, Path(tmp) / "f.txt")
    assert _agree(reader, fast, slow), (data, fast, slow)


def test_a_nul_character_is_refused_by_both_paths_naming_the_line(tmp_path):
    """numpy's strings drop a field's trailing NULs ("1\\x00" would read as the rating 1.0, "a\\x00" as the id "a"):
    the fast path declines such files and the line reader refuses them with the file and line."""
    path = tmp_path / "i.csv"
    for body in (b"u,i,1\x00\nv,j,2\n", b"u,i,1\nv\x00,j,2\n"):
        path.write_bytes(body)
        line = 1 if body.index(b"\x00") < body.index(b"\n") else 2
        for ctx in (contextlib.nullcontext(), _line_reader_only()):
            with ctx, pytest.raises(ValueError, match=re.escape(f"{path}:{line}: a NUL character")):
                load_interactions(path, header=False)
    rank = tmp_path / "r.txt"
    rank.write_bytes(b"1\x00,100,10\n")
    assert rank_files._rank_table(rank.read_bytes(), None, None) is None
    with pytest.raises(ValueError, match=re.escape(f"{rank}:1: rank '1\\x00' is not a number")):
        read_rank_file(rank)


# The ids are fixed: a gzip header carries its mtime, and xdist refuses workers that collect different ids.
@pytest.mark.parametrize("name, data", [
    ("plain.csv.gz", b"u,i\n1,2\n"),  # not compressed at all
    ("bz.csv.gz", b"BZh91AY&SY" + bytes(20)),  # another compressor's data
    ("cut.csv.gz", __import__("gzip").compress(b"u,i\n1,2\n" * 40, mtime=0)[:25]),  # gzip cut short
], ids=["not-compressed", "bzip2", "cut-short"])
def test_a_gz_file_that_is_not_gzip_is_a_value_error_naming_it(tmp_path, name, data):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ValueError, match=re.escape(f"{path}: not a readable gzip file")):
        load_interactions(path)


def test_gzip_data_without_its_suffix_is_a_value_error_naming_it(tmp_path):
    import gzip

    for name, read in (("i.csv", load_interactions), ("r.txt", read_rank_file)):
        path = tmp_path / name
        path.write_bytes(gzip.compress(b"1,100,10\n"))
        with pytest.raises(ValueError, match=re.escape(str(path))):
            read(path)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf, 2.5, 0.0, 1.0, float(2**41)])
def test_rank_file_columns_are_whole_counts(bad):
    """A RankFile built by hand (or by a reader) holds whole numbers: a NaN n used to be cast to -2^63."""
    with pytest.raises(ValueError, match=r"^n_items: entry 1 is"):
        rank_files.RankFile(np.array([1, 2]), np.array([100.0, bad]), np.array([10, 10]))
    with pytest.raises(ValueError, match=r"^ranks: entry 0: sampled rank 12 outside 1..m\+1 = 1..11"):
        rank_files.RankFile(np.array([12]), np.array([100]), np.array([10]))
    with pytest.raises(ValueError, match=r"^hh_s1: give hh_s1 and hh_s2 together"):
        rank_files.RankFile(np.array([1]), np.array([100]), np.array([10]), np.array([0.0]))
    f = rank_files.RankFile(np.array([1.0, 3.0]), np.array([100.0, 50.0]), np.array([10, 10]))
    assert f.n_items.dtype == np.int64 and f.n_items.tolist() == [100, 50] and f.ranks.tolist() == [1, 3]


@pytest.mark.parametrize("n_items", [float("nan"), float("inf"), 1, 2.5, "60", None])
def test_ncf_n_items_is_checked(tmp_path, n_items):
    _ncf_files(tmp_path)
    with pytest.raises(ValueError, match=r"^n_items: "):
        _read_ncf(tmp_path, n=n_items)


def test_rank_file_counts_above_2_40_name_their_line(tmp_path):
    path = tmp_path / "r.txt"
    path.write_text(f"1,100,10\n1,{2**41},10\n")
    with pytest.raises(ValueError, match=re.escape(f"{path}:2: n_candidates and n_samples are at most 2^40")):
        read_rank_file(path)
