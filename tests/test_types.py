"""The package is fully annotated and type-checked.

``make test`` runs ``python -m mypy`` (pyproject's ``[tool.mypy]``: the whole package) beside pytest; this file pins
what that check means, on the source alone (fast, nothing imported): every function of the package annotated (the
rule ``disallow_untyped_defs`` enforces), the settings strict where they matter, no module of the package
exempted (``ignore_errors``), every ``# type: ignore`` narrowed to an error code, and the Makefile and the ``test``
extra wired to run it.
"""

from __future__ import annotations

import ast
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "reco_sampled_plugin"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
MYPY = PYPROJECT["tool"]["mypy"]



def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _overrides(key: str) -> list[str]:
    """The module patterns of the ``[[tool.mypy.overrides]]`` that set ``key``."""
    out: list[str] = []
    for o in MYPY.get("overrides", []):
        if o.get(key):
            mods = o["module"]
            out += [mods] if isinstance(mods, str) else list(mods)
    return out


def _unannotated(path: Path) -> list[str]:
    """``name:line what`` for each function of ``path`` missing a parameter or return annotation (mypy's
    ``disallow_untyped_defs`` / ``disallow_incomplete_defs``: ``self`` / ``cls`` may stay bare, and ``__init__``
    may leave out ``-> None`` once a parameter is annotated)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        a = node.args
        params = a.posonlyargs + a.args + a.kwonlyargs + [p for p in (a.vararg, a.kwarg) if p is not None]
        bare = [p.arg for p in params if p.annotation is None and p.arg not in ("self", "cls")]
        if bare:
            out.append(f"{node.name}:{node.lineno} parameters {bare}")
        if node.returns is None and not (node.name == "__init__" and any(p.annotation for p in params)):
            out.append(f"{node.name}:{node.lineno} return")
    return out


def _checked_files() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_mypy_settings_are_strict_where_they_matter():
    """The whole package, at the oldest supported Python, every function annotated and its body checked; an
    Optional written out, an unused ``# type: ignore`` reported."""
    assert MYPY["files"] == ["reco_sampled_plugin"]
    oldest = re.fullmatch(r">=\s*(\d+\.\d+)", PYPROJECT["project"]["requires-python"]).group(1)
    assert MYPY["python_version"] == oldest
    for key in ("disallow_untyped_defs", "disallow_incomplete_defs", "check_untyped_defs", "no_implicit_optional",
                "warn_unused_ignores"):
        assert MYPY.get(key) is True, key
    assert not MYPY.get("ignore_errors") and not MYPY.get("ignore_missing_imports")  # only per module
    for key in ("disallow_untyped_defs", "check_untyped_defs"):  # no module switched back off
        assert not [o["module"] for o in MYPY.get("overrides", []) if o.get(key) is False], key


def test_no_module_of_the_package_skips_the_check():
    """No ``ignore_errors`` for any module of the package (the modules once exempted while other work rewrote them
    are annotated now), and ``ignore_missing_imports`` only for third-party packages, never for the package's own
    modules."""
    assert not _overrides("ignore_errors")  # third-party modules are not checked: nothing to exempt there either
    for pattern in _overrides("ignore_missing_imports"):
        assert not pattern.startswith("reco_sampled_plugin"), pattern


def test_every_function_of_the_checked_modules_is_annotated():
    files = _checked_files()
    assert len(files) >= 40  # the package's modules, not an empty walk
    missing = {_module(p): bad for p in files if (bad := _unannotated(p))}
    assert not missing, missing


def test_the_annotation_walk_finds_what_mypy_would_refuse(tmp_path):
    """The walk above flags a bare parameter, a missing return and a bare ``*args``, and accepts ``self`` and an
    ``__init__`` without ``-> None``: the rules of ``disallow_untyped_defs`` / ``disallow_incomplete_defs``."""
    src = tmp_path / "mod.py"
    src.write_text(
        "class A:\n"
        "    def __init__(self, x: int):\n        self.x = x\n"
        "    def ok(self, y: int) -> int:\n        return y\n"
        "    def bare(self, y):\n        return y\n"
        "def no_return(a: int):\n    return a\n"
        "def star(*args, **kw: int) -> None:\n    pass\n"
    )
    got = sorted(_unannotated(src))
    assert got == ["bare:6 parameters ['y']", "bare:6 return", "no_return:8 return", "star:10 parameters ['args']"]


def test_type_ignores_name_their_error_code_and_are_rare():
    """A ``# type: ignore`` always says which error it silences (``[code]``), and there are few of them."""
    pattern = re.compile(r"#\s*type:\s*ignore(?!\[[a-z-]+(,\s*[a-z-]+)*\])")
    count = 0
    for path in sorted(PACKAGE.rglob("*.py")):
        for i, line in enumerate(path.read_text().splitlines(), 1):
            if "type: ignore" in line:
                count += 1
                assert not pattern.search(line), f"{path.relative_to(ROOT)}:{i}: {line.strip()}"
    assert count <= 20  # most mark wrapped functions (RecBole patches) with attributes


def test_make_test_runs_mypy_beside_pytest_and_fails_when_either_fails():
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert target is not None
    recipe = " ".join(line.strip().rstrip("\\") for line in target.group(1).splitlines())
    assert re.search(r"\$\(BIN\)/python -m mypy >\$\$log 2>&1 & mypy_pid=\$\$!;", recipe)
    assert "$(BIN)/python -m pytest -q -n auto --dist worksteal; pytest_rc=$$?;" in recipe
    assert "wait $$mypy_pid; mypy_rc=$$?;" in recipe
    assert recipe.rstrip().endswith("test $$pytest_rc -eq 0 -a $$mypy_rc -eq 0")


@pytest.mark.parametrize(("mypy_rc", "pytest_rc"), [(1, 0), (0, 1), (0, 0)])
def test_make_test_recipe_fails_when_either_fails(tmp_path, mypy_rc, pytest_rc):
    """The recipe's shell, run with a stand-in interpreter whose mypy and pytest exit as given: the target fails
    when either does, and prints both reports."""
    makefile = (ROOT / "Makefile").read_text()
    target = re.search(r"^test:.*\n((?:\t.*\n)+)", makefile, flags=re.M)
    assert target is not None
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    python = bin_dir / "python"
    python.write_text(f'#!/bin/sh\nif [ "$2" = mypy ]; then echo "mypy says {mypy_rc}"; exit {mypy_rc}; fi\n'
                      f'echo "pytest says {pytest_rc}"; exit {pytest_rc}\n')
    python.chmod(0o755)
    (tmp_path / "Makefile").write_text(f"BIN := {bin_dir}\nSTAMP :=\ntest:\n" + target.group(1))
    done = subprocess.run(["make", "-s", "test"], cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert (done.returncode == 0) == (mypy_rc == 0 and pytest_rc == 0), done
    assert f"mypy says {mypy_rc}" in done.stdout and f"pytest says {pytest_rc}" in done.stdout


@pytest.mark.parametrize("requirement", ["mypy", "types-PyYAML"])
def test_the_test_extra_installs_the_type_checker(requirement):
    test_extra = PYPROJECT["project"]["optional-dependencies"]["test"]
    found = [r for r in test_extra if re.match(rf"{re.escape(requirement)}\s*>=", r)]
    assert found, f"{requirement} with a lower bound in the test extra"


def test_the_package_ships_its_annotations():
    """PEP 561: the ``py.typed`` marker exists and is package data, so type checkers read the installed package."""
    assert (PACKAGE / "py.typed").is_file()
    assert "py.typed" in PYPROJECT["tool"]["setuptools"]["package-data"]["reco_sampled_plugin"]
