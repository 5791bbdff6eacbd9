"""One test per fix of the RecBole compatibility layer (reco_sampled_plugin/adapters/_recbole_compat.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest
import torch

from reco_sampled_plugin.adapters import _recbole_compat as compat  # noqa: E402
from reco_sampled_plugin.adapters import recbole as rb  # noqa: E402,F401  (applies the layer)

import recbole  # noqa: E402

DATA_PATH = os.path.join(os.path.dirname(recbole.__file__), "dataset_example")


# The checks that need a fresh interpreter (what importing the adapter does, with the layer on or switched off): each
# runs in a process of its own, forked from one interpreter that has imported the third-party libraries RecBole
# imports in both (torch, numpy, pandas, scipy, scikit-learn's metrics: :data:`_PRELOAD`) and nothing of RecBole, the
# plugin or ray, so that those are imported once for all the checks, not once per check (about 4 s of CPU each). The
# layer's fixes patch these libraries' attributes whenever they were imported (none hooks their import). A check's
# process sets its environment variables before it runs its code, which imports the plugin.
_PRELOAD = ("torch", "numpy", "pandas", "scipy.sparse", "scipy.stats", "sklearn.metrics")
_FRESH_CHECKS = {
    "ray_tune": (
        """
        import sys
        import reco_sampled_plugin.adapters.recbole
        from recbole.quick_start import quick_start as qs
        assert "ray" not in sys.modules  # ray is imported only when tuning uses it
        try:
            report = qs.tune.report
        except ImportError as exc:
            print("EXPLAINED", exc)
        else:
            print("REAL", callable(report))
        """,
        {},
    ),
    "switched_off": (
        """
        import reco_sampled_plugin.adapters._recbole_compat as c
        print("ENABLED", c.env_enabled())
        import reco_sampled_plugin.adapters.recbole
        print("APPLIED", sorted(c.applied()))
        import scipy.sparse as sp
        print("DOK", hasattr(sp.dok_matrix, "_update"))
        """,
        {compat.ENV_VAR: "0"},
    ),
}

# run by one interpreter: the libraries of _PRELOAD imported, then each check forked, its stdout and stderr in files,
# its exit status 1 on an exception; what each gave printed as JSON
_FORKING_RUNNER = """
import importlib, json, os, sys, tempfile, traceback
preload, checks = json.loads(sys.argv[1])
for module in preload:  # imported once, before the checks' processes are forked
    importlib.import_module(module)
assert not {"recbole", "ray", "reco_sampled_plugin"} & {m.split(".")[0] for m in sys.modules}, sorted(sys.modules)
out = {}
for name, (code, env) in checks.items():
    files = [tempfile.TemporaryFile(mode="w+") for _ in range(2)]
    sys.stdout.flush(); sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        os.dup2(files[0].fileno(), 1); os.dup2(files[1].fileno(), 2)
        status = 0
        try:
            os.environ.update(env)
            exec(compile(code, "<" + name + ">", "exec"), {"__name__": "__main__"})
        except BaseException:
            traceback.print_exc()
            status = 1
        sys.stdout.flush(); sys.stderr.flush()
        os._exit(status)
    _, status = os.waitpid(pid, 0)
    texts = []
    for f in files:
        f.seek(0)
        texts.append(f.read())
    out[name] = [os.waitstatus_to_exitcode(status), *texts]
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def fresh_checks() -> dict:
    """{check name: CompletedProcess-like (returncode, stdout, stderr)} of each of :data:`_FRESH_CHECKS` run in a
    fresh process of its own (forked after importing :data:`_PRELOAD` only: see :data:`_FORKING_RUNNER`)."""
    import json

    checks = {name: (textwrap.dedent(code), env) for name, (code, env) in _FRESH_CHECKS.items()}
    runner = subprocess.run([sys.executable, "-c", _FORKING_RUNNER, json.dumps([_PRELOAD, checks])],
                            capture_output=True, text=True, timeout=300)
    assert runner.returncode == 0, runner.stderr[-3000:]
    return {name: subprocess.CompletedProcess(name, rc, out, err)
            for name, (rc, out, err) in json.loads(runner.stdout.splitlines()[-1]).items()}


def test_apply_is_idempotent_and_reports_fixes():
    first = compat.apply()
    assert compat.apply() == first
    assert set(first) == set(compat.FIXES)
    assert compat.apply(enabled=False) == {name: False for name in compat.FIXES}
    with pytest.raises(ValueError, match="fixes"):
        compat.apply(fixes=("nope",))
    assert compat.applied()  # on this stack (numpy 2, torch >= 2.6, scipy >= 1.15, pandas 3) fixes apply


@pytest.mark.skipif("float_" in np.__dict__, reason="numpy 1.x has np.float_")
def test_numpy_config_settings_without_float_():
    from recbole.config import Config

    Config(model="BPR", dataset="ml-100k", config_dict={"data_path": DATA_PATH, "device": "cpu"})
    assert np.float is np.float64 and np.int is np.int_ and np.unicode is np.str_
    assert "float_" not in np.__dict__  # the removed name itself is not brought back
    assert "numpy" in compat.applied()


@pytest.mark.skipif(compat._version_tuple(torch.__version__) < (2, 6), reason="torch < 2.6 loads full pickles")
def test_torch_load_only_for_recbole_callers(tmp_path):
    path = tmp_path / "ckpt.pth"
    torch.save({"config": compat._PkgResourcesDistribution("numpy"), "state_dict": {}}, path)  # a non-tensor object
    with pytest.raises(Exception):  # any other caller keeps torch's weights_only=True default
        torch.load(path)
    scope = {"__name__": "recbole.trainer.fake", "torch": torch, "path": str(path)}
    exec("loaded = torch.load(path)", scope)  # noqa: S102 - a call made from a RecBole module
    assert scope["loaded"]["config"].version == np.__version__
    with pytest.raises(Exception):  # an explicit weights_only=True from RecBole is respected
        exec("torch.load(path, weights_only=True)", scope)  # noqa: S102


def test_ray_lazy_tune_in_quick_start():
    import recbole.quick_start.quick_start as qs

    assert isinstance(qs.tune, compat._LazyTune)
    stub = sys.modules.get("ray")
    assert stub is None or not (stub.__doc__ or "").startswith("Temporary stand-in")  # no stand-in left behind


def test_ray_tune_resolves_or_explains_in_subprocess(fresh_checks):
    out = fresh_checks["ray_tune"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "REAL True" in out.stdout or "EXPLAINED ray.tune is not usable" in out.stdout


def test_switched_off_by_environment_variable(fresh_checks):
    out = fresh_checks["switched_off"]
    assert out.returncode == 0, out.stderr[-3000:]
    assert "ENABLED False" in out.stdout and "APPLIED []" in out.stdout
    assert "DOK False" in out.stdout


def test_pkg_resources_shim():
    shim = compat._pkg_resources_shim()
    assert shim.get_distribution("numpy").version == np.__version__
    with pytest.raises(shim.DistributionNotFound):
        shim.get_distribution("surely-not-an-installed-distribution")
    assert shim._vendor.packaging.version.parse("2.6.3") > shim.packaging.version.parse("2.6")
    assert shim.require("numpy>=1")[0].version == np.__version__


def test_scipy_dok_update():
    import scipy.sparse as sp

    a = sp.dok_matrix((3, 4), dtype=np.float32)
    a._update({(0, 1): 1, (2, 3): 2})
    np.testing.assert_array_equal(a.toarray(), [[0, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 2]])
    assert a.nnz == 2


def test_pandas_missing_values_are_filled(tmp_path):
    from recbole.config import Config
    from recbole.data import create_dataset

    folder = tmp_path / "tiny"
    folder.mkdir()
    inter = ["user_id:token\titem_id:token\trating:float\ttimestamp:float"]
    inter += [f"{u}\t{i}\t{(u + i) % 5 + 1}\t{u * 100 + i}" for u in range(1, 9) for i in range(1, 9) if (u + i) % 3]
    (folder / "tiny.inter").write_text("\n".join(inter) + "\n")
    items = ["item_id:token\ttitle:token_seq\tyear:float\tgenre:token"]
    for i in range(1, 9):  # missing sequence, float and token values
        items.append(f"{i}\t{'' if i == 2 else f'movie {i}'}\t{'' if i == 3 else 1990 + i}\t{'' if i == 4 else 'drama'}")
    (folder / "tiny.item").write_text("\n".join(items) + "\n")
    config = Config(
        model="BPR",
        dataset="tiny",
        config_dict={
            "data_path": str(tmp_path),
            "device": "cpu",
            "load_col": {"inter": ["user_id", "item_id"], "item": ["item_id", "title", "year", "genre"]},
            "normalize_all": False,
            "user_inter_num_interval": "[0,inf)",
            "item_inter_num_interval": "[0,inf)",
        },
    )
    dataset = create_dataset(config)  # raised AttributeError ('float' has no 'split') without the fix
    item_feat = dataset.item_feat
    years = np.asarray(item_feat["year"], dtype=np.float64)
    assert np.isfinite(years).all()  # the missing year was filled with the mean, not left NaN
    titles = list(item_feat["title"])
    assert sorted(len(t) for t in titles)[:3] == [0, 0, 2]  # padding row and item 2 (missing title): empty
    assert all(np.issubdtype(np.asarray(t).dtype, np.integer) for t in titles if len(t))  # remapped to ids
    assert "pandas" in compat.applied()
