"""The package's surface: ``__all__`` resolves and is catalogued, the registry's views are live, and importing the
package needs torch, numpy and scipy only. (Moved from the removed tests/test_compat.py: these are not about 0.1.)"""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

import reco_sampled_plugin as rsp


def test_all_is_unique_and_resolves():
    assert len(rsp.__all__) == len(set(rsp.__all__))
    ns: dict = {}
    exec("from reco_sampled_plugin import *", ns)  # noqa: S102
    assert set(rsp.__all__) <= set(ns)
    assert {"ESTIMATORS", "METHODS"} <= set(dir(rsp))


def test_catalogue_lists_every_exported_name():
    """The package docstring's catalogue (one ``name -- summary`` line per public name) covers ``__all__``."""
    listed = {line.split(" -- ")[0].strip() for line in rsp.__doc__.splitlines() if " -- " in line}
    assert set(rsp.__all__) <= listed, sorted(set(rsp.__all__) - listed)
    assert listed <= set(rsp.__all__), sorted(listed - set(rsp.__all__))


def test_method_lists_match_the_registry():
    from reco_sampled_plugin import adaptive, corrections, estimators, rank_distribution, registry

    mapping = importlib.import_module("reco_sampled_plugin.mapping")  # the package's ``mapping`` is the function

    assert tuple(estimators.ESTIMATORS) == registry.names() == rsp.ESTIMATORS
    assert set(estimators.METHOD_OPTIONS) == set(registry.names())
    assert tuple(corrections.METHODS) == rsp.METHODS
    assert tuple(mapping.MAPPING_METHODS) == registry.names(family="mapping")
    assert tuple(rank_distribution.RANK_DISTRIBUTION_METHODS) == registry.names(family="rank_distribution")
    assert set(adaptive.ADAPTIVE_METHODS) == set(registry.names(adaptive=True))


def test_registry_views_are_live():
    from reco_sampled_plugin.registry import Estimator, register, unregister

    assert "surface_probe" not in rsp.ESTIMATORS
    register(Estimator("surface_probe", "correction", "a probe", ".corrections:estimate_by_table"))
    try:
        assert "surface_probe" in rsp.ESTIMATORS
        assert "surface_probe" in rsp.METHODS
        from reco_sampled_plugin import ESTIMATORS

        assert "surface_probe" in ESTIMATORS
    finally:
        unregister("surface_probe")
    assert "surface_probe" not in rsp.ESTIMATORS and "surface_probe" not in rsp.METHODS
    with pytest.raises(AttributeError):
        rsp.NO_SUCH_NAME  # noqa: B018


def test_no_heavy_optional_imports():
    """``import reco_sampled_plugin`` needs torch, numpy and scipy only."""
    code = ("import sys, reco_sampled_plugin; "
            "print(sorted(m for m in ('pandas', 'matplotlib', 'lightning', 'pytorch_lightning', 'recbole', "
            "'torchmetrics') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stdout
