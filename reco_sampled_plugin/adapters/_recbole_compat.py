"""Narrow fixes that let unmodified RecBole 1.2.1 run on today's stack.

Each fix checks that it is needed, changes one thing, and logs once (logger
``reco_sampled_plugin.adapters.recbole``) when it is applied:

=================  =================================================================================
fix                what breaks, and the change
=================  =================================================================================
``numpy``          numpy 2 removed ``np.float_``, ``np.complex_``, ``np.unicode_``: RecBole's
                   ``Config.compatibility_settings`` raises. It is replaced by the same aliases
                   (``np.float``, ``np.int``, ``np.bool``, ...) built from names numpy 2 still has;
                   existing numpy attributes are never overwritten.
``torch_load``     torch >= 2.6 loads with ``weights_only=True``; RecBole's checkpoints hold its
                   ``Config``. Calls of ``torch.load`` made from RecBole's own modules without an
                   explicit ``weights_only`` get ``weights_only=False`` (as before torch 2.6); every
                   other caller is untouched. Only load checkpoints you trust.
``ray``            ``recbole.quick_start`` does ``from ray import tune`` at import (only
                   ``objective_function`` uses it). While that module is imported, ``ray.tune``
                   resolves to a lazy stand-in that imports the real ``ray.tune`` on first use,
                   and raises a clear ImportError if ray cannot be imported there.
``pkg_resources``  ray 2.6 imports ``pkg_resources`` (gone from setuptools >= 81) and uses
                   ``np.bool8``. Only when the lazy ``ray.tune`` is first used: a minimal
                   ``pkg_resources`` module (``get_distribution``, ``require``, ``packaging``) backed
                   by ``importlib.metadata`` is installed if none is importable, and ``np.bool8``
                   is aliased to ``np.bool_``.
``scipy``          scipy >= 1.15 removed ``dok_matrix._update``, which the graph models (LightGCN,
                   NGCF, NCL, GCMC, SpectralCF, KGIN, MCCLK) call; it is restored as an update of
                   the matrix's internal dict.
``pandas``         pandas 3 (copy-on-write) ignores RecBole's chained ``df[f].fillna(..., inplace=True)``
                   so missing sequence values crash the loader and missing token / float values stay
                   NaN. ``Dataset._fill_nan`` is replaced by the same logic written as assignments,
                   and the dataset module's ``read_csv`` fills missing sequence fields with ``""``.
                   pandas 3's ``Series.agg(len)`` is the Series' length, which broke the remapping of
                   token-sequence fields: ``Dataset._remap`` takes per-row lengths with ``map(len)``.
=================  =================================================================================

Disable all of them with ``RECO_SAMPLED_RECBOLE_COMPAT=0`` (read when
``reco_sampled_plugin.adapters.recbole`` is imported) or ``apply(enabled=False)``; pick some with
``apply(fixes=("scipy",))``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import sys
import types
from typing import Any, Callable, Iterable

__all__ = ["ENV_VAR", "FIXES", "apply", "applied", "env_enabled"]

logger = logging.getLogger(__name__)

ENV_VAR = "RECO_SAMPLED_RECBOLE_COMPAT"
FIXES = ("numpy", "torch_load", "ray", "scipy", "pandas")
_applied: dict[str, str] = {}  # fix -> message logged when it was applied


def env_enabled() -> bool:
    """False when the environment variable switches the compatibility layer off."""
    return os.environ.get(ENV_VAR, "1").strip().lower() not in ("0", "false", "no", "off")


def applied() -> dict[str, str]:
    """The fixes applied in this process, with the message each logged."""
    return dict(_applied)


def _log_once(fix: str, message: str) -> None:
    if fix not in _applied:
        _applied[fix] = message
        logger.info("reco_sampled_plugin RecBole compat [%s]: %s", fix, message)


def _version_tuple(version: str) -> tuple[int, ...]:
    out = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        out.append(int(digits))
    return tuple(out)


# ------------------------------------------------------------------------------------------- numpy
_NUMPY_ALIASES = {
    "bool": "bool_",
    "int": "int_",
    "float": "float64",
    "complex": "complex128",
    "object": "object_",
    "str": "str_",
    "long": "int_",
    "unicode": "str_",
}


def _numpy_compatibility_settings(self: Any) -> None:
    """RecBole's ``Config.compatibility_settings`` without names numpy 2 removed."""
    import numpy as np

    for alias, target in _NUMPY_ALIASES.items():
        if alias not in np.__dict__:  # never overwrite an attribute numpy defines
            setattr(np, alias, getattr(np, target))


def _fix_numpy() -> bool:
    import numpy as np

    if "float_" in np.__dict__:  # numpy 1.x: RecBole's own settings work
        return False
    from recbole.config import configurator

    if getattr(configurator.Config.compatibility_settings, "_reco_sampled", False):
        return True
    _numpy_compatibility_settings._reco_sampled = True  # type: ignore[attr-defined]
    configurator.Config.compatibility_settings = _numpy_compatibility_settings
    _log_once("numpy", f"numpy {np.__version__}: Config.compatibility_settings aliases np.float etc. without np.float_")
    return True


# -------------------------------------------------------------------------------------- torch.load
def _fix_torch_load() -> bool:
    import torch

    if _version_tuple(torch.__version__) < (2, 6):
        return False
    if getattr(torch.load, "_reco_sampled", False):
        return True
    original = torch.load

    def load(*args: Any, **kwargs: Any) -> Any:
        if "weights_only" not in kwargs:
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller == "recbole" or caller.startswith("recbole."):
                kwargs["weights_only"] = False  # RecBole's checkpoints pickle its Config
        return original(*args, **kwargs)

    load.__doc__ = original.__doc__
    load.__wrapped__ = original  # type: ignore[attr-defined]
    load._reco_sampled = True  # type: ignore[attr-defined]
    torch.load = load
    _log_once(
        "torch_load",
        f"torch {torch.__version__}: torch.load called from RecBole modules defaults to weights_only=False "
        "(RecBole checkpoints hold its Config; load only checkpoints you trust)",
    )
    return True


# --------------------------------------------------------------------------------------------- ray
class _PkgResourcesDistribution:
    def __init__(self, name: str) -> None:
        self.project_name = name
        self.version = importlib.metadata.version(name)


def _pkg_resources_shim() -> types.ModuleType:
    """A minimal ``pkg_resources`` for ray 2.6 (version look-ups and ``packaging``)."""
    import packaging
    import packaging.version

    mod: Any = types.ModuleType("pkg_resources")  # a stand-in module: attributes set below
    mod.__doc__ = "Minimal stand-in installed by reco_sampled_plugin for ray 2.6 (setuptools >= 81 has no pkg_resources)."

    class DistributionNotFound(Exception):
        pass

    def get_distribution(name: str) -> _PkgResourcesDistribution:
        try:
            return _PkgResourcesDistribution(str(name))
        except importlib.metadata.PackageNotFoundError:
            raise DistributionNotFound(name) from None

    def require(name: str) -> list:
        return [get_distribution(str(name).split("=")[0].split("<")[0].split(">")[0].strip())]

    mod.DistributionNotFound = DistributionNotFound
    mod.get_distribution = get_distribution
    mod.require = require
    mod.packaging = packaging
    vendor: Any = types.ModuleType("pkg_resources._vendor")
    vendor.packaging = packaging
    mod._vendor = vendor
    return mod


def _install_pkg_resources() -> None:
    """Make ``import pkg_resources`` work for ray (only if no real one is importable)."""
    if "pkg_resources" in sys.modules:
        return
    try:
        importlib.import_module("pkg_resources")
        return
    except ImportError:
        pass
    import packaging.version

    shim = _pkg_resources_shim()
    sys.modules["pkg_resources"] = shim
    sys.modules["pkg_resources._vendor"] = shim._vendor
    sys.modules["pkg_resources._vendor.packaging"] = shim.packaging
    sys.modules["pkg_resources._vendor.packaging.version"] = packaging.version
    _log_once("pkg_resources", "setuptools has no pkg_resources: installed a minimal pkg_resources module for ray")


def _import_real_tune() -> types.ModuleType:
    import numpy as np

    if "bool8" not in np.__dict__:
        setattr(np, "bool8", np.bool_)  # ray 2.6 uses np.bool8 (removed in numpy 2)
    _install_pkg_resources()
    return importlib.import_module("ray.tune")


class _LazyTune(types.ModuleType):
    """Stands in for ``ray.tune`` in ``recbole.quick_start``: imports ray on first attribute access."""

    def __init__(self) -> None:
        super().__init__("ray.tune", "Lazy ray.tune installed by reco_sampled_plugin's RecBole compat layer.")
        self._real: types.ModuleType | None = None

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        if self._real is None:
            try:
                self._real = _import_real_tune()
            except Exception as exc:
                raise ImportError(
                    f"ray.tune is not usable in this environment ({type(exc).__name__}: {exc}); RecBole needs it "
                    "only for hyper-parameter tuning (objective_function / run_hyper)"
                ) from exc
        return getattr(self._real, name)


def _fix_ray() -> bool:
    if "recbole.quick_start.quick_start" in sys.modules:
        return "ray" in _applied  # already imported (with a working ray, or by this fix)
    saved = {k: sys.modules.get(k) for k in ("ray", "ray.tune")}
    if saved["ray.tune"] is not None:
        return False  # a usable ray.tune is already imported
    stub_ray = types.ModuleType("ray", "Temporary stand-in used while recbole.quick_start is imported.")
    stub_ray.tune = _LazyTune()  # type: ignore[attr-defined]
    sys.modules["ray"] = stub_ray
    sys.modules["ray.tune"] = stub_ray.tune
    try:
        importlib.import_module("recbole.quick_start.quick_start")
    finally:
        for key, value in saved.items():  # the stand-ins never outlive the import
            if value is None:
                sys.modules.pop(key, None)
            else:
                sys.modules[key] = value
    _log_once("ray", "recbole.quick_start imported with a lazy ray.tune (ray is imported only if tuning uses it)")
    return True


# ------------------------------------------------------------------------------------------- scipy
def _dok_update(self: Any, data: Any) -> None:
    """``dok_matrix._update`` of scipy < 1.15: store the (row, col) -> value items without checks."""
    store = self.__dict__.get("_dict")
    if store is not None:
        store.update(data)
    else:  # pragma: no cover - layouts where the matrix is the dict
        dict.update(self, data)


def _fix_scipy() -> bool:
    import scipy.sparse as sp

    if hasattr(sp.dok_matrix, "_update"):
        return False
    sp.dok_matrix._update = _dok_update
    import scipy

    _log_once("scipy", f"scipy {scipy.__version__}: restored dok_matrix._update for RecBole's graph models")
    return True


# ------------------------------------------------------------------------------------------ pandas
def _fill_nan(self: Any) -> None:
    """RecBole's ``Dataset._fill_nan`` written with assignments (pandas 3 copy-on-write)."""
    import numpy as np
    from recbole.utils import FeatureType

    for feat_name in self.feat_name_list:
        feat = getattr(self, feat_name)
        for field in feat:
            ftype = self.field2type[field]
            if ftype == FeatureType.TOKEN:
                feat[field] = feat[field].fillna(value=0)
            elif ftype == FeatureType.FLOAT:
                feat[field] = feat[field].fillna(value=feat[field].mean())
            else:
                dtype = np.int64 if ftype == FeatureType.TOKEN_SEQ else np.float64
                feat[field] = feat[field].apply(lambda x: np.array([], dtype=dtype) if isinstance(x, float) else x)


def _remap(self: Any, remap_list: Any) -> None:
    """RecBole's ``Dataset._remap`` with per-row sequence lengths taken by ``map(len)``: pandas 3's
    ``Series.agg(len)`` returns the length of the Series, which broke token-sequence fields."""
    import numpy as np
    from recbole.utils import FeatureType

    if len(remap_list) == 0:
        return
    tokens, split_point = self._concat_remaped_tokens(remap_list)
    new_ids_list, mp = self._rsp_pandas.factorize(tokens)
    new_ids_list = np.split(new_ids_list + 1, split_point)
    mp = np.array(["[PAD]"] + list(mp))
    token_id = {t: i for i, t in enumerate(mp)}
    for (feat, field, ftype), new_ids in zip(remap_list, new_ids_list):
        if field not in self.field2id_token:
            self.field2id_token[field] = mp
            self.field2token_id[field] = token_id
        if ftype == FeatureType.TOKEN:
            feat[field] = new_ids
        elif ftype == FeatureType.TOKEN_SEQ:
            split_point = np.cumsum(feat[field].map(len).to_numpy())[:-1]
            feat[field] = np.split(new_ids, split_point)


class _PandasForRecBole(types.ModuleType):
    """``pandas`` as seen by ``recbole.data.dataset.dataset``: ``read_csv`` fills missing ``*_seq`` fields."""

    def __init__(self, pandas_module: types.ModuleType) -> None:
        super().__init__("pandas")
        self._pandas = pandas_module

    def __getattr__(self, name: str) -> Any:
        return getattr(self._pandas, name)

    def read_csv(self, *args: Any, **kwargs: Any) -> Any:
        df = self._pandas.read_csv(*args, **kwargs)
        usecols = kwargs.get("usecols")
        if usecols is not None:
            for column in usecols:
                if isinstance(column, str) and column.endswith("seq") and column in df.columns:
                    df[column] = df[column].fillna("")
        return df


def _fix_pandas() -> bool:
    import pandas as pd

    if _version_tuple(pd.__version__) < (3,):
        return False
    from recbole.data.dataset import dataset as dataset_module

    if getattr(dataset_module.Dataset._fill_nan, "_reco_sampled", False):
        return True
    _fill_nan._reco_sampled = True  # type: ignore[attr-defined]
    dataset_module.Dataset._fill_nan = _fill_nan
    dataset_module.Dataset._remap = _remap
    dataset_module.Dataset._rsp_pandas = pd
    dataset_module.pd = _PandasForRecBole(pd)
    _log_once(
        "pandas",
        f"pandas {pd.__version__}: Dataset._fill_nan and sequence-field loading without chained inplace, "
        "Dataset._remap with per-row sequence lengths",
    )
    return True


_FIX_FUNCTIONS: dict[str, Callable[[], bool]] = {
    "numpy": _fix_numpy,
    "torch_load": _fix_torch_load,
    "ray": _fix_ray,
    "scipy": _fix_scipy,
    "pandas": _fix_pandas,
}


def apply(enabled: bool | None = None, fixes: Iterable[str] | None = None) -> dict[str, bool]:
    """Apply the compatibility fixes (idempotent).

    Args:
        enabled: False applies nothing; None (default) follows ``RECO_SAMPLED_RECBOLE_COMPAT``.
        fixes: a subset of :data:`FIXES` (default: all).

    Returns:
        ``{fix: True if it is in place (applied now or before), False if not needed or not applied}``.
    """
    if enabled is None:
        enabled = env_enabled()
    else:  # "False" would switch it on: a bool only (the package's one bool check)
        from reco_sampled_plugin._options import check_bool

        try:
            enabled = check_bool(enabled, "compat")
        except ValueError:
            raise ValueError(f"compat: expected True, False or None, got {enabled!r}") from None
    names = tuple(FIXES if fixes is None else fixes)
    unknown = [f for f in names if f not in FIXES]
    if unknown:
        raise ValueError(f"fixes: unknown fix(es) {unknown}; known: {FIXES}")
    if not enabled:
        return {name: False for name in names}
    # numpy and scipy first: the ray fix imports recbole.quick_start, which imports much of RecBole
    order = [f for f in ("numpy", "scipy", "pandas", "torch_load", "ray") if f in names]
    return {name: _FIX_FUNCTIONS[name]() for name in order}
