"""The package as a user installs it: a wheel built from the repository, installed into a fresh virtual environment,
imported and run from there; the version from one place; no ``print`` in the library and one
logger per module named after it.

The wheel test downloads nothing: the wheel is built with the test environment's setuptools (``pip wheel
--no-build-isolation``; the ``test`` extra installs setuptools >= 77) and installed with ``pip install --no-deps
--no-index``. A venv's ``--system-site-packages`` reaches the base interpreter's packages, not those of the test
environment (itself a venv), so a ``.pth`` file adds the test environment's site-packages *after* the new venv's own:
torch, numpy and scipy come from there, ``reco_sampled_plugin`` from the wheel (the editable install's finder and
``.pth`` files of the test environment are not processed from a ``.pth`` path).
"""

from __future__ import annotations

import ast
import functools
import json
import logging
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import textwrap
import tomllib
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "reco_sampled_plugin"
# what the build reads: pyproject.toml names the readme, the licence file and the packages (with their data)
BUILD_INPUTS = ["pyproject.toml", "README.md", "LICENSE", "reco_sampled_plugin"]


def _version_in_source() -> str:
    """``__version__`` of reco_sampled_plugin/__init__.py, read from the AST (the one place of the version)."""
    tree = ast.parse((PACKAGE / "__init__.py").read_text(encoding="utf-8"))
    found = [node.value.value for node in tree.body if isinstance(node, ast.Assign)
             and any(isinstance(t, ast.Name) and t.id == "__version__" for t in node.targets)
             and isinstance(node.value, ast.Constant)]
    assert len(found) == 1, "reco_sampled_plugin/__init__.py must assign __version__ one string literal"
    return found[0]


def _clean_env() -> dict[str, str]:
    """The environment of the subprocesses: no PYTHONPATH (the tests run with the source tree on it), no user site,
    no pip self-check (it would query the index)."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "PYTHONSTARTUP")}
    env.update(PYTHONNOUSERSITE="1", PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_NO_INPUT="1")
    return env


def _run(argv: list, cwd: Path) -> subprocess.CompletedProcess:
    out = subprocess.run([str(a) for a in argv], cwd=cwd, env=_clean_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, f"{argv} exited {out.returncode}:\n{out.stdout}\n{out.stderr}"
    return out


def test_version_has_one_place():
    """pyproject.toml takes the version from ``reco_sampled_plugin.__version__`` (no second literal), a PEP 440
    release number."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    assert "version" not in project["project"], "pyproject.toml: the version is read from __init__.py (dynamic)"
    assert "version" in project["project"]["dynamic"]
    assert project["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "reco_sampled_plugin.__version__"}
    version = _version_in_source()
    assert re.fullmatch(r"\d+\.\d+\.\d+", version), version


def test_changelog_names_the_version():
    """CHANGELOG.md (Keep a Changelog) opens with an Unreleased section (the next version's, ``## X.Y.Z
    (unreleased)``, may come first), then a dated section for the current version; every release heading is
    ``## [X.Y.Z] - YYYY-MM-DD``, newest first."""
    text = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^## (.*)$", text, re.M)
    if re.fullmatch(r"\d+\.\d+\.\d+ \(unreleased\)", headings[0]):
        headings = headings[1:]
    assert headings[0] == "[Unreleased]", headings
    releases = [re.fullmatch(r"\[(\d+\.\d+\.\d+)\] - (\d{4}-\d{2}-\d{2})", h) for h in headings[1:]]
    assert releases and all(releases), f"release headings must read '## [X.Y.Z] - YYYY-MM-DD': {headings[1:]}"
    assert releases[0].group(1) == _version_in_source(), "the newest release section is not __version__"
    versions = [tuple(int(p) for p in r.group(1).split(".")) for r in releases]
    assert versions == sorted(versions, reverse=True) and [r.group(2) for r in releases] == sorted(
        (r.group(2) for r in releases), reverse=True)
    for section in re.findall(r"^### (.*)$", text, re.M):
        kind = section.split(":", 1)[0]  # "Changed: the top-level surface": a kind and its subject
        assert kind in {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, section


def test_readme_install_names_every_extra():
    """The README's Install section shows ``pip install .`` and ``pip install ".[recbole,lightning]"``, and the install
    page it links (docs/install.md, where the extras table moved) shows both too and names each extra of pyproject.toml
    (a new extra without a line there fails)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = re.search(r"^## Install\n(.*?)^## ", readme, re.M | re.S)
    assert section, "README.md has no '## Install' section"
    text = section.group(1)
    assert re.search(r"^pip install \.\s", text, re.M)
    assert 'pip install ".[recbole,lightning]"' in text
    assert "docs/install.md" in text, "README Install: no link to the install page"
    page = (ROOT / "docs" / "install.md").read_text(encoding="utf-8")
    assert re.search(r"^pip install \.\s", page, re.M) and 'pip install ".[recbole,lightning]"' in page
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["optional-dependencies"]
    for extra in extras:
        assert f"| `{extra}` |" in page, f"docs/install.md: the extra {extra!r} has no row"


@pytest.mark.slow
def test_wheel_installs_into_a_fresh_venv_and_runs(tmp_path):
    """Build the wheel (offline), install it into a fresh venv (offline), and from a folder outside the repository:
    import the package from the venv, read its version and py.typed, run ``reco-sampled --help``, ``--version`` and
    ``estimate`` on a three-line rank file whose answer is known (n = m + 1: the sampled ranks are the exact ranks)."""
    setuptools_version = metadata.version("setuptools")
    assert tuple(int(p) for p in setuptools_version.split(".")[:2]) >= (77, 0), (
        f"setuptools {setuptools_version} cannot build the wheel offline: pip install -e '.[test]' installs >= 77")
    version = _version_in_source()

    # build from a copy, so the source tree gets no build/ or *.egg-info
    src = tmp_path / "src"
    for name in BUILD_INPUTS:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    dist = tmp_path / "dist"
    built = _run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-v",
                  "--wheel-dir", dist, src], cwd=tmp_path)
    # no setuptools warning at install (e.g. a data folder Python can import, absent from `packages`)
    assert "Warning" not in built.stdout + built.stderr, built.stdout + built.stderr
    (wheel,) = dist.glob("*.whl")
    assert wheel.name == f"reco_sampled_plugin-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as zf:
        names = set(zf.namelist())
        meta = zf.read(f"reco_sampled_plugin-{version}.dist-info/METADATA").decode("utf-8")
    # the extras of `pip install ".[recbole,lightning]"` are declared with their requirements
    provides = set(re.findall(r"^Provides-Extra: (\S+)$", meta, flags=re.M))
    assert {"recbole", "lightning"} <= provides, provides
    assert re.search(r'^Requires-Dist: recbole==1\.2\.1; extra == "recbole"$', meta, flags=re.M)
    assert re.search(r'^Requires-Dist: lightning>=2\.0; extra == "lightning"$', meta, flags=re.M)
    assert "reco_sampled_plugin/py.typed" in names
    assert "reco_sampled_plugin/data/ml-latest-small/ratings.csv.gz" in names
    assert "reco_sampled_plugin/adapters/recbole.py" in names

    # a fresh venv: the wheel installed with the test environment's pip (pip --python), nothing downloaded
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--system-site-packages", "--without-pip", venv], cwd=tmp_path)
    python = venv / ("Scripts/python.exe" if os.name == "nt" else "bin/python")
    site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                     cwd=tmp_path).stdout.strip())
    parent = dict.fromkeys(sysconfig.get_paths()[k] for k in ("purelib", "platlib"))  # torch, numpy, scipy
    (site / "_test_environment.pth").write_text("".join(f"{p}\n" for p in parent))
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index", "-q", wheel],
         cwd=tmp_path)

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # n = 101 candidates, m = 100 samples: every irrelevant item is drawn, r~ = r; AUC = mean (n - r) / (n - 1)
    (elsewhere / "ranks.csv").write_text("1,101,100\n3,101,100\n50,101,100\n")
    # one process of the venv's interpreter: the package and `estimate` through the console script's function (first,
    # as in a fresh console script: nothing else imported; the script itself runs --help and --version below), then
    # the adapters of the [recbole,lightning] extras (their requirements are the test environment's, reached through
    # the .pth: nothing is downloaded)
    probe = textwrap.dedent("""
        import contextlib, importlib.metadata as md, io, json, pathlib
        import reco_sampled_plugin as rsp
        from reco_sampled_plugin.cli import main
        out = {"file": rsp.__file__, "version": rsp.__version__, "dist_version": md.version("reco-sampled-plugin"),
               "typed": pathlib.Path(rsp.__file__).with_name("py.typed").is_file()}
        text = io.StringIO()
        with contextlib.redirect_stdout(text):
            out["estimate_status"] = main(["estimate", "ranks.csv", "--metric", "auc", "--method", "none"])
        out["estimate"] = text.getvalue()
        import reco_sampled_plugin.adapters.recbole as r, reco_sampled_plugin.adapters.lightning as lt
        import reco_sampled_plugin.adapters.torchmetrics as tm
        out["adapters"] = [r.__file__, lt.__file__, tm.__file__]
        print(json.dumps(out))
    """)
    got = json.loads(_run([python, "-c", probe], cwd=elsewhere).stdout.strip().splitlines()[-1])
    assert Path(got["file"]).resolve().is_relative_to(site.resolve()), f"imported {got['file']}, not the venv's copy"
    assert got["version"] == got["dist_version"] == version
    assert got["typed"] is True
    for path in got["adapters"]:
        assert Path(path).resolve().is_relative_to(site.resolve()), f"imported {path}, not the venv's copy"

    script = venv / ("Scripts/reco-sampled.exe" if os.name == "nt" else "bin/reco-sampled")
    assert "estimate" in _run([script, "--help"], cwd=elsewhere).stdout
    assert _run([script, "--version"], cwd=elsewhere).stdout.split() == ["reco-sampled", version]
    assert got["estimate_status"] in (0, None)
    row = next(line.split() for line in got["estimate"].splitlines() if line.startswith("auc"))
    assert row[1] == "none" and float(row[2]) == pytest.approx((100 + 98 + 51) / 300, abs=5e-6)


# ----------------------------------------------------------------------------------------------------- logging
# Diagnostics go to one logger per module, named after it (``logging.getLogger(__name__)``: the hierarchy under
# ``reco_sampled_plugin`` lets a user turn them on per module); ``warnings.warn`` is kept for what a user must act
# on; ``print`` only in the CLI (and the benchmarks and examples, outside the package).
PRINT_ALLOWED = {"reco_sampled_plugin/cli.py"}
LOG_METHODS = {"debug", "info", "warning", "error", "exception", "critical", "log"}


@functools.lru_cache(maxsize=1)
def _modules() -> tuple:
    """(path relative to the repository, AST) of every module of the package, parsed once."""
    return tuple((path.relative_to(ROOT).as_posix(), ast.parse(path.read_text(encoding="utf-8")))
                 for path in sorted(PACKAGE.rglob("*.py")))


def _is_module_logger(node: ast.stmt) -> bool:
    """``logger = logging.getLogger(__name__)`` (a module-level statement)."""
    return (isinstance(node, ast.Assign) and [getattr(t, "id", None) for t in node.targets] == ["logger"]
            and isinstance(node.value, ast.Call) and ast.unparse(node.value) == "logging.getLogger(__name__)")


def test_no_print_in_the_library():
    found = [f"{name}:{node.lineno}" for name, tree in _modules() if name not in PRINT_ALLOWED
             for node in ast.walk(tree)
             if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "print"]
    assert not found, f"print( in library modules (log or warn instead): {found}"


def test_each_module_logs_on_a_logger_named_after_itself():
    """Every getLogger call is ``logging.getLogger(__name__)`` bound to a module-level ``logger``; a module that calls
    ``logger.<level>(...)`` defines that logger (or is handed one: a helper's ``logger`` parameter, as
    ``adapters._shared.explain_once``), and one that defines it uses it; nothing logs on the root logger
    (``logging.info(...)``); no module-level ``logger`` is shadowed by a local of the same name."""
    problems, logging_modules = [], []
    for name, tree in _modules():
        defines = any(_is_module_logger(node) for node in tree.body)
        calls = handed = read = False
        for node in ast.walk(tree):
            if isinstance(node, ast.arg) and node.arg == "logger":
                handed = True
            if isinstance(node, ast.Name) and node.id == "logger" and isinstance(node.ctx, ast.Load):
                read = True
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                owner = ast.unparse(node.func.value)
                if node.func.attr == "getLogger" and not (
                        owner == "logging" and any(_is_module_logger(s) and s.value is node for s in tree.body)):
                    problems.append(f"{name}:{node.lineno}: {ast.unparse(node)} (use a module-level "
                                    "logger = logging.getLogger(__name__))")
                if node.func.attr in LOG_METHODS and owner == "logging":
                    problems.append(f"{name}:{node.lineno}: logs on the root logger")
                if node.func.attr in LOG_METHODS and owner == "logger":
                    calls = True
            if isinstance(node, (ast.Name, ast.arg)) and getattr(node, "id", getattr(node, "arg", None)) == "logger" \
                    and isinstance(getattr(node, "ctx", ast.Store()), ast.Store) and defines \
                    and not any(_is_module_logger(s) and node in s.targets for s in tree.body):
                problems.append(f"{name}:{node.lineno}: a local 'logger' shadows the module's")
        if calls and not defines and not handed:
            problems.append(f"{name}: calls logger.<level>() without logger = logging.getLogger(__name__)")
        if defines and not read:
            problems.append(f"{name}: defines a logger it never uses")
        if defines:
            logging_modules.append(name)
    assert not problems, "\n".join(problems)
    # the modules that log diagnostics today (a new one is fine: this pins that the scan sees them)
    assert {"reco_sampled_plugin/counting.py", "reco_sampled_plugin/scorer_ranks.py",
            "reco_sampled_plugin/adapters/recbole.py", "reco_sampled_plugin/adapters/torchmetrics.py"} <= set(
        logging_modules)


def test_scorer_loop_logs_its_cost_on_its_own_logger(caplog):
    """sampled_ranks_from_scorer's cost (pairs, calls, seconds) goes to ``reco_sampled_plugin.scorer_ranks`` at
    DEBUG, with the numbers of the returned ScoringCost; nothing at WARNING or above, nothing printed."""
    import torch

    from reco_sampled_plugin.scorer_ranks import sampled_ranks_from_scorer

    scores = torch.randn(5, 40, generator=torch.Generator().manual_seed(0), dtype=torch.float64)

    def scorer(users, items):
        return scores[users.unsqueeze(1).expand_as(items), items]

    with caplog.at_level(logging.DEBUG, logger="reco_sampled_plugin"):
        got = sampled_ranks_from_scorer(scorer, torch.tensor([[0], [1], [2], [3], [4]]), 40, 10,
                                        generator=torch.Generator().manual_seed(1))
    records = [r for r in caplog.records if r.name == "reco_sampled_plugin.scorer_ranks"]
    assert len(records) == 1 and records[0].levelno == logging.DEBUG
    assert f"{got.cost.pairs} (user, item) pairs scored in {got.cost.calls} call(s)" in records[0].getMessage()
    assert got.cost.pairs == 5 * (1 + 10) and f"of full ranking's {5 * 40}" in records[0].getMessage()
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]


def test_tables_over_n_log_what_was_built(caplog):
    """``_over_n.tables_over_n`` says at DEBUG how many tables it built exactly and how many it interpolated: the
    numbers of its ``info``."""
    import numpy as np

    from reco_sampled_plugin._over_n import tables_over_n

    ns = np.arange(100, 400, 3)
    with caplog.at_level(logging.DEBUG, logger="reco_sampled_plugin._over_n"):
        _, info = tables_over_n(lambda n: np.array([1.0 / n, 1.0 / n**2]), ns)
    (record,) = [r for r in caplog.records if r.name == "reco_sampled_plugin._over_n"]
    assert info["interpolated"] > 0 and info["built"] < ns.size
    assert f"{ns.size} candidate counts: {info['built']} built exactly, {info['interpolated']} interpolated" in \
        record.getMessage()


def test_page_titles_carry_no_internal_issue_numbers():
    """Headings of README.md and docs/*.md (outside code blocks) name their subject, not the project's internal
    issue or session numbers (``## Adaptive sampling``, with no "(issue N)" after it)."""
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        inside = False
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("```"):
                inside = not inside
            elif not inside and line.startswith("#") and re.search(r"\b(issue|session)s? \d", line, re.I):
                found.append(f"{path.name}:{number}: {line}")
    assert not found, "\n".join(found)


def _install_recipe(tmp_path: Path, fail: str) -> subprocess.CompletedProcess:
    """The Makefile's install recipe run with stand-ins for pip and python: ``fail`` names the one step that exits 1
    (``pip-test``: pip's install of the test extra; ``warm-torch`` / ``warm-rest``: an import of the bytecode
    warm-up; ``none``)."""
    makefile = (ROOT / "Makefile").read_text()
    stamp = re.search(r"^\$\(STAMP\):.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert stamp is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "pip").write_text(f'#!/bin/sh\ncase "$*" in *".[test]"*) [ {fail} = pip-test ] && exit 1;; esac\nexit 0\n')
    (bin_dir / "python").write_text(
        f'#!/bin/sh\ncase "$2" in *torch._dynamo*) [ {fail} = warm-torch ] && exit 1;; *scipy.stats*) [ {fail} = warm-rest ] && exit 1;; esac\nexit 0\n')
    for tool in ("pip", "python"):
        (bin_dir / tool).chmod(0o755)
    variables = "\n".join(line for line in makefile.splitlines() if re.match(r"^(TORCH|RAY|WARM_\w+)\s*:?=", line)
                          or line.startswith("              "))
    (tmp_path / "Makefile").write_text(f"BIN := {bin_dir}\nSTAMP := done\n{variables}\n$(STAMP):\n" + stamp.group(1))
    return subprocess.run(["make", "-s"], cwd=tmp_path, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("fail", ["none", "pip-test", "warm-torch", "warm-rest"])
def test_install_fails_when_pip_or_an_import_after_it_fails(tmp_path, fail):
    """The install recipe (``$(STAMP)``): it fails when pip fails or an import after pip fails (the test extra is
    broken); the warm-up of torch's stack beside pip only writes bytecode, so its failure alone does not."""
    done = _install_recipe(tmp_path, fail)
    assert (done.returncode == 0) == (fail in ("none", "warm-torch")), done
    assert (tmp_path / "done").exists() == (fail in ("none", "warm-torch"))
