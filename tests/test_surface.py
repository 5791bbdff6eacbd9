"""The top-level surface of ``reco_sampled_plugin``: at most 40 names, generated from one table (``_SURFACE``).

``__all__``, the lazy imports and the package docstring's catalogue are derived from the table; the static
``if TYPE_CHECKING:`` imports (mypy's view) cannot be, so they are checked against it here. The names that left
the top level stay importable from their modules.
"""

from __future__ import annotations

import ast
import importlib
import importlib.machinery
import subprocess
import sys
import types
from pathlib import Path

import pytest

import reco_sampled_plugin as rsp

ROOT = Path(__file__).resolve().parents[1]
INIT = ROOT / "reco_sampled_plugin" / "__init__.py"

# the names that left the top level in 0.2 and the module each lives in now (CHANGELOG, "the top-level surface")
MOVED = {
    "adaptive_sampled_ranks_from_exact": "adaptive",
    "metric_curve": "metrics",
    "user_metric_values": "user_metrics",
    "as_design": "design",
    "expected_sampled": "sampling_laws",
    "sampled_rank_pmf": "sampling_laws",
    "log_sampled_rank_pmf": "sampling_laws",
    "correction_table": "corrections",
    "expected_corrected": "corrections",
    "table_bias": "corrections",
    "clear_correction_cache": "corrections",
    "mapping": "mapping",
    "fit_beta": "mapping",
    "BetaFit": "mapping",
    "mapping_estimate": "mapping",
    "mapped_points": "mapping",
    "sampled_hit_rate_curve": "mapping",
    "dataset_beta": "mapping",
    "fit_rank_distribution": "rank_distribution",
    "RankDistribution": "rank_distribution",
    "Prior": "priors",
    "UniformPrior": "priors",
    "BetaPrior": "priors",
    "VectorPrior": "priors",
    "CallablePrior": "priors",
    "fit_beta_prior": "priors",
    "empirical_prior": "priors",
    "IdentifiedInterval": "identification",
}


def _table() -> list[tuple[str, str, str]]:
    return [entry for _, entries in rsp._SURFACE for entry in entries]


def test_at_most_40_names_each_once_in_the_table():
    names = [name for name, _, _ in _table()]
    assert len(names) <= 40, len(names)
    assert len(set(names)) == len(names), "a name appears twice in _SURFACE"
    assert rsp.__all__ == names
    assert all(summary and "\n" not in summary for _, _, summary in _table())


def test_every_name_resolves_to_its_module():
    for name, module, _ in _table():
        value = getattr(rsp, name)
        source = importlib.import_module(f"reco_sampled_plugin.{module}")
        assert value is (source if module == name else getattr(source, name)), name
    assert set(rsp.__all__) <= set(dir(rsp))


def test_static_imports_name_exactly_the_table():
    """The module-level imports of __init__.py (the eager ones and those under ``if TYPE_CHECKING:``) import each
    table name from its table module, and nothing else of the package: the two cannot drift."""
    tree = ast.parse(INIT.read_text(encoding="utf-8"))
    nodes = list(tree.body)
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
            nodes += node.body
    static = set()
    for node in nodes:
        if isinstance(node, ast.ImportFrom) and node.level == 1:
            for alias in node.names:
                assert alias.asname is None, ast.unparse(node)
                static.add((alias.name, node.module or alias.name))
    assert static == {(name, module) for name, module, _ in _table()}


def test_the_catalogue_lists_every_name_with_its_summary():
    doc = rsp.__doc__ or ""
    for section, entries in rsp._SURFACE:
        assert f"\n{section}\n{'=' * len(section)}\n" in doc, section
        for name, _, summary in entries:
            assert f"\n{name} -- {summary}\n" in doc, name


@pytest.mark.parametrize("name", sorted(MOVED))
def test_a_name_that_left_lives_in_its_module(name):
    module = importlib.import_module(f"reco_sampled_plugin.{MOVED[name]}")
    assert hasattr(module, name)
    assert name not in rsp.__all__
    if name == MOVED[name]:  # ``rsp.mapping`` is simply the module
        assert getattr(rsp, name) is module
    else:
        assert not hasattr(rsp, name)


def test_no_name_is_both_a_module_and_a_function():
    """``rsp.estimate`` is the function (its result class lives in the private ``_estimate``), ``rsp.mapping`` the
    module, and the registry's views left: ``rsp.registry.names()``."""
    assert isinstance(rsp.mapping, types.ModuleType)
    assert callable(rsp.estimate) and not isinstance(rsp.estimate, types.ModuleType)
    # looked up on the package's own path (the venv's editable-install finder may map other checkouts' modules)
    assert importlib.machinery.PathFinder.find_spec("reco_sampled_plugin.estimate", list(rsp.__path__)) is None
    assert type(rsp) is types.ModuleType  # no module-class trick
    assert not hasattr(rsp, "ESTIMATORS") and not hasattr(rsp, "METHODS")
    with pytest.raises(AttributeError, match="no attribute 'nothing_here'"):
        getattr(rsp, "nothing_here")


def test_import_and_dir_stay_light():
    """``import reco_sampled_plugin``, its docstring and ``dir()`` import neither torch nor numpy nor scipy."""
    code = ("import sys, reco_sampled_plugin as rsp\n"
            "dir(rsp); rsp.__doc__; rsp.__all__; rsp.registry.names()\n"
            "print(sorted(m for m in ('torch', 'numpy', 'scipy') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
