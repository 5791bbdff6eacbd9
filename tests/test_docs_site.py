"""The documentation site: ``mkdocs.yml`` builds with ``mkdocs build --strict`` (a broken
link, a missing page, anchor or API reference fails the suite), the API reference documents every public name of
``reco_sampled_plugin`` and the adapters from their docstrings, nothing is fetched (no plugin or theme feature that
downloads; no page loads anything from another host), every figure script runs, and the RecBole guide's configs are
accepted by the adapter.

The site: MkDocs with the Material theme and mkdocstrings (Python handler: griffe reads the sources statically).
``make docs`` serves it locally; the ``docs`` extra (pulled in by the ``test`` extra) installs it.
"""

from __future__ import annotations

import html
import os
import re
import runpy
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

import reco_sampled_plugin as rsp

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
# the only plugins allowed: neither fetches anything at build time (material's social, privacy, blog, optimize
# plugins download fonts, images or assets; mkdocstrings' inventories would download objects.inv files)
ALLOWED_PLUGINS = {"search", "mkdocstrings"}
# adapters and modules outside the namespace whose API the reference must show (module -> names); the names that
# left the top level in 0.2 (tests/test_surface.py's MOVED) are shown at their module's path
ADAPTER_NAMES = {
    "reco_sampled_plugin.adapters.torchmetrics": ["RankingSettings", "SampledRankingMetrics", "ExactRankingMetrics",
                                                  "estimate_values"],
    "reco_sampled_plugin.adapters.lightning": ["RankingMetricsCallback", "PLRankingMetricsCallback", "callback_class"],
    "reco_sampled_plugin.adapters.recbole": ["run_recbole", "register", "validate_config", "positive_table"],
    "reco_sampled_plugin.planner": ["Plan", "DesignForecast"],
}


def _config() -> dict:
    return yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))


def _nav_pages(nav) -> list[str]:
    """Every page path of a nav (nested lists of {title: page or list})."""
    out = []
    for item in nav:
        value = next(iter(item.values())) if isinstance(item, dict) else item
        out.extend(_nav_pages(value) if isinstance(value, list) else [value])
    return out


def _offline_prefix() -> list[str]:
    """``unshare -rn`` (a new network namespace without interfaces: nothing can be fetched) where the system allows
    it, else nothing (the build then runs with the network, and test_nothing_is_fetched checks the config and pages)."""
    if shutil.which("unshare") is None:
        return []
    try:
        ok = subprocess.run(["unshare", "-rn", "true"], capture_output=True, timeout=30).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return ["unshare", "-rn"] if ok else []


_OFFLINE = _offline_prefix()


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> dict:
    """The site built once with ``mkdocs build --strict`` into a temporary folder, without a network where the
    system allows it: {"dir", "seconds", "output"}."""
    config = _config()
    missing = [p for p in _nav_pages(config["nav"]) if not (DOCS / p).is_file()]
    assert not missing, f"mkdocs.yml's nav names pages that do not exist: {missing}"
    config_file = ROOT / "mkdocs.yml"
    out_dir = tmp_path_factory.mktemp("site")
    start = time.perf_counter()
    done = subprocess.run([*_OFFLINE, sys.executable, "-m", "mkdocs", "build", "--strict", "--config-file", str(config_file),
                           "--site-dir", str(out_dir)], cwd=ROOT, capture_output=True, text=True, timeout=600,
                          env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})
    seconds = time.perf_counter() - start
    assert done.returncode == 0, f"mkdocs build --strict failed:\n{done.stdout}\n{done.stderr}"
    return {"dir": out_dir, "seconds": seconds, "output": done.stderr}


def _text(path: Path) -> str:
    """The visible text of a built page (tags dropped, entities decoded, whitespace collapsed)."""
    raw = re.sub(r"<script.*?</script>|<style.*?</style>", " ", path.read_text(encoding="utf-8"), flags=re.S)
    return re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", raw)))


def _api_html(site) -> str:
    return "\n".join(p.read_text(encoding="utf-8") for p in sorted((site["dir"] / "api").rglob("*.html")))


def test_site_builds_in_strict_mode(site):
    """The build succeeded under --strict (the fixture) with no warning left in its log, and wrote every page of
    the nav and the landing page."""
    assert "WARNING" not in site["output"], site["output"]
    for page in _nav_pages(_config()["nav"]):
        built = site["dir"] / (page[:-3] + "/index.html" if page != "index.md" else "index.html")
        assert built.is_file(), f"{page} was not built ({built})"
    print(f"mkdocs build --strict: {site['seconds']:.1f} s")


def test_strict_build_fails_on_a_broken_link(tmp_path):
    """The check can fail: a page linking to a page that does not exist stops a strict build (same config)."""
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "index.md").write_text("# Home\n\n[gone](missing.md)\n", encoding="utf-8")
    (tmp_path / "mkdocs.yml").write_text(
        "site_name: t\ntheme: {name: material, font: false}\nvalidation: {links: {not_found: warn}}\n"
        "nav: [{Home: index.md}]\n", encoding="utf-8")
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(tmp_path / "s")],
                          cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "missing.md" in done.stderr


def test_api_reference_documents_every_public_name(site):
    """Each name of ``reco_sampled_plugin.__all__``, each name that left the top level (at its module's path) and
    the adapters' entry points has its own anchor in the API reference, with its docstring's first line as text: a
    public function without a reference entry, or one the build could not resolve, fails."""
    from test_surface import MOVED

    api = _api_html(site)
    anchors = set(re.findall(r'id="([\w.]+)"', api))
    text = re.sub(r"\s+", " ", html.unescape(re.sub(r"<[^>]+>", " ", api)))
    expected = [f"reco_sampled_plugin.{n}" for n in rsp.__all__]
    expected += [f"reco_sampled_plugin.{module}.{n}" for n, module in MOVED.items()]
    expected += [f"{module}.{n}" for module, names in ADAPTER_NAMES.items() for n in names]
    missing = [name for name in expected if name not in anchors]
    assert not missing, f"not in the API reference: {missing}"
    for qualified in ("reco_sampled_plugin.estimate", "reco_sampled_plugin.mapping.mapping",
                      "reco_sampled_plugin.sampled_ranks", "reco_sampled_plugin.sampled_ranks_from_scorer",
                      "reco_sampled_plugin.plan", "reco_sampled_plugin.corrections.correction_table",
                      "reco_sampled_plugin.SamplingDesign",
                      "reco_sampled_plugin.adapters.lightning.RankingMetricsCallback",
                      "reco_sampled_plugin.adapters.torchmetrics.SampledRankingMetrics",
                      "reco_sampled_plugin.adapters.torchmetrics.ExactRankingMetrics"):
        module, _, name = qualified.rpartition(".")
        obj = getattr(__import__(module, fromlist=[name]), name)
        first = re.sub(r"\s+", " ", (obj.__doc__ or "").strip().split("\n\n")[0])
        first = re.sub(r"``|:\w+:`~?|`", "", first)[:60]
        assert first and first in text, f"{qualified}: its docstring ({first!r}) is not on the API pages"


def test_nothing_is_fetched(site):
    """No plugin that downloads, no web fonts, no inventories; the built pages load scripts, styles and images from
    the site itself only (links to other sites are plain anchors)."""
    config = _config()
    plugins = {next(iter(p)) if isinstance(p, dict) else p for p in config["plugins"]}
    assert plugins <= ALLOWED_PLUGINS, f"plugins beyond {ALLOWED_PLUGINS}: {plugins - ALLOWED_PLUGINS}"
    assert config["theme"].get("font") is False, "theme.font must be false (Material loads Google Fonts otherwise)"
    for plugin in config["plugins"]:
        if isinstance(plugin, dict) and "mkdocstrings" in plugin:
            for handler in plugin["mkdocstrings"]["handlers"].values():
                assert "import" not in handler and "inventories" not in handler, "inventories are downloaded"
    remote = re.compile(r'<(?:script|link|img|iframe)\b[^>]*(?:src|href)="(?:https?:)?//', re.I)
    offenders = [str(p.relative_to(site["dir"])) for p in site["dir"].rglob("*.html")
                 if remote.search(p.read_text(encoding="utf-8"))]
    assert not offenders, f"pages that load from another host: {offenders[:5]}"
    assert not any(site["dir"].rglob("*.woff2")), "web fonts were bundled"


def test_landing_page_answers_which_estimator_design_and_when_exact(site):
    """The landing page names the resolution, the default estimator and what it runs where, adaptive sampling,
    exact ranking and the planner, and shows the regime map."""
    text = _text(site["dir"] / "index.html")
    for phrase in ("b = (n - 1)/(m + 1) + 1", "auto", "gmod", "mes", "adaptive_max", "rank exactly",
                   "reco-sampled plan", "bv"):
        assert phrase in text, phrase
    assert 'src="img/regime_map.png"' in (site["dir"] / "index.html").read_text(encoding="utf-8")


def test_every_docs_page_is_in_the_nav():
    """Each Markdown page under docs/ is in mkdocs.yml's nav (strict mode also warns, this names them)."""
    nav = set(_nav_pages(_config()["nav"]))
    pages = {p.relative_to(DOCS).as_posix() for p in DOCS.rglob("*.md")}
    assert pages - nav == set(), f"pages not in the nav: {sorted(pages - nav)}"


FIGURES = {"regime_map.py": ["regime_map.png"],
           "accuracy_small_multiples.py": ["accuracy_ml100k_by_m.png", "accuracy_at_scale_by_m.png"],
           "interval_coverage.py": ["interval_coverage.png"], "cost_accuracy.py": ["cost_accuracy.png"]}


@pytest.mark.parametrize("script", sorted(FIGURES))
def test_figure_scripts_write_their_figures(script, tmp_path, monkeypatch):
    """Each figure script of benchmarks/figures runs (recorded tables read from docs/research-notes.md) and writes its
    PNGs; the committed images it makes are shown on the site (docs/img, referenced by figures.md)."""
    monkeypatch.syspath_prepend(str(ROOT / "benchmarks" / "figures"))
    module = runpy.run_path(str(ROOT / "benchmarks" / "figures" / script))
    module["main"](["--out", str(tmp_path)])
    figures_page = (DOCS / "figures.md").read_text(encoding="utf-8")
    for name in FIGURES[script]:
        made = tmp_path / name
        assert made.is_file() and made.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", name
        assert (DOCS / "img" / name).is_file() and f"img/{name}" in figures_page, name


def test_recorded_tables_read_as_published():
    """The figures read the tables the page publishes: every estimator row, one value per m, numbers checked
    against cells quoted in the pages' text (mes 9.4% HR at m = 100: docs/research-notes.md, "Accuracy on MovieLens
    100k"; bv(0.1) HR@10 12.6% on ml-100k: docs/estimators.md, "The defaults, and why")."""
    sys.path.insert(0, str(ROOT / "benchmarks" / "figures"))
    try:
        import accuracy_small_multiples as acc
        import cost_accuracy
        import interval_coverage as cov
    finally:
        sys.path.remove(str(ROOT / "benchmarks" / "figures"))
    ms, mean = acc.ml100k_mean_errors()
    assert ms == [50, 100, 500] and len(mean) == 13
    assert mean["mes"]["HR"][1] == pytest.approx(0.094) and mean["mle"]["HR"][1] == pytest.approx(0.258)
    ms, worst = acc.at_scale_errors()
    assert worst["bv(0.1)"][("ml-100k", "HR@10")][1] == pytest.approx(0.126)
    assert worst["mes"][("ml-latest-small", "NDCG@10")][1] == pytest.approx(0.412)
    rows = cov.honest_rows()
    assert len(rows) == 6 and all(r["honest_worst"] == 1.0 for r in rows)
    designs = cost_accuracy.designs()
    mls = {(r["design"], r["metric"]): r for r in designs["ml-latest-small"]}
    assert len(designs["ml-100k"]) == len(mls) == 10
    # the research notes' text: 100 -> 3200 costs 3.2 m per positive and cuts the worst RMSE of NDCG@10 from 56% to 16%
    assert mls[("m=100->3200", "ndcg@10")]["mean_m"] == 319 and mls[("m=100->3200", "ndcg@10")]["adaptive"]
    assert mls[("m=100", "ndcg@10")]["worst_rmse"] == pytest.approx(0.558)
    assert mls[("m=100->3200", "ndcg@10")]["worst_rmse"] == pytest.approx(0.158)


def test_accuracy_benchmark_draws_small_multiples(tmp_path, monkeypatch):
    """benchmarks/accuracy_ml100k.py draws one panel per estimator (not 13 lines in one plot), each with a line per
    (metric, m): checked on synthetic errors of the shape its summary writes."""
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    import accuracy_ml100k as bench

    rows = [dict(m=m, model=model, metric=f"{kind}@{k}", estimator=est, rel_err=0.1 * k / m)
            for m in (50, 100) for model in ("a", "b") for kind in ("hit", "ndcg") for k in (1, 5, 10)
            for est in bench.ESTIMATOR_ORDER]
    seen = []
    save = Figure.savefig
    monkeypatch.setattr(Figure, "savefig", lambda fig, *a, **kw: (seen.append(fig), save(fig, *a, **kw))[1])
    bench._plot(rows, [50, 100], tmp_path / "accuracy_ml100k.png")
    panels = [ax for ax in seen[0].axes if ax.get_visible()]
    assert len(panels) == len(bench.ESTIMATOR_ORDER)
    assert {ax.get_title() for ax in panels} == set(bench.ESTIMATOR_ORDER)
    assert all(len(ax.get_lines()) == 2 * 2 + 1 for ax in panels)  # HR and NDCG x two m, and the 5% line
    assert (tmp_path / "accuracy_ml100k.png").is_file()


@pytest.mark.parametrize("config", ["bpr_ml100k.yaml", "sasrec_ml100k.yaml", "deepfm_ml100k.yaml"])
def test_recbole_guide_configs_are_accepted(config):
    """The RecBole guide's three configs (general, sequential, context-aware; shown on the site from
    examples/recbole) build a RecBole Config and pass the adapter's validation with the design they state."""
    import reco_sampled_plugin.adapters.recbole as rb
    from recbole.config import Config

    path = ROOT / "examples" / "recbole" / config
    raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    settings = rb.validate_config(Config(model=raw["model"], dataset=raw["dataset"], config_file_list=[str(path)]))
    assert settings is not None and settings.m == raw["rsp_m"]
    assert settings.adaptive_max == raw.get("rsp_adaptive_max")
    assert f'--8<-- "examples/recbole/{config}"' in (DOCS / "guides" / "recbole.md").read_text(encoding="utf-8")


def test_every_recbole_key_is_documented_with_its_default():
    """docs/recbole.md's key table has a row for every plugin config key (``CONFIG_DEFAULTS``), its default column
    the code's where the default is a plain value, and the ``rsp_design`` row names every key it sets
    (``DESIGN_KEYS``): a key added or a default changed without the docs fails here."""
    from reco_sampled_plugin.adapters._recbole_settings import CONFIG_DEFAULTS, DESIGN_KEYS

    text = (DOCS / "recbole.md").read_text(encoding="utf-8")
    rows = {}
    for line in text.splitlines():
        if line.startswith("| `rsp_"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[cells[0].strip("`")] = cells[1]
    assert set(CONFIG_DEFAULTS) <= set(rows), sorted(set(CONFIG_DEFAULTS) - set(rows))
    words = {True: "`true`", False: "`false`"}
    for key, default in CONFIG_DEFAULTS.items():
        if isinstance(default, bool):
            assert rows[key] == words[default], (key, rows[key])
        elif isinstance(default, (int, float)):
            assert rows[key] == f"`{default}`", (key, rows[key])
    design_row = next(line for line in text.splitlines() if line.startswith("| `rsp_design`"))
    assert all(f"`{k}`" in design_row for k in DESIGN_KEYS), [k for k in DESIGN_KEYS if f"`{k}`" not in design_row]
