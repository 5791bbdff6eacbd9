"""docs/estimators.md lists every registered estimator, in a table rendered from the registry.

The table sits between the two markers below; this test renders it from ``registry.entries()`` and asserts the
page holds exactly that text. After changing the registry, print the new table and paste it over the old one:

    python tests/test_registry_docs.py
"""

from __future__ import annotations

import re
from pathlib import Path

from reco_sampled_plugin import registry

DOC = Path(__file__).resolve().parent.parent / "docs" / "estimators.md"
BEGIN = "<!-- registry table: rendered by tests/test_registry_docs.py (python tests/test_registry_docs.py prints it) -->"
END = "<!-- end of the registry table -->"


def _option(o: registry.Option) -> str:
    return f"`{o.name}`" if o.default is None else f"`{o.name}={o.default!r}`"


def _options(e: registry.Estimator, fit: tuple[str, ...]) -> str:
    names = e.option_names
    out = []
    if fit and set(fit) <= set(names):
        out.append("the fit options")
        names = tuple(n for n in names if n not in fit)
    out += [_option(e.option(n)) for n in names]
    return ", ".join(out) if out else "-"


def _designs(e: registry.Estimator) -> str:
    kinds = ["uniform"]
    if e.without_replacement:
        kinds.append("without replacement")
    if e.adaptive:
        kinds.append("adaptive")
    if e.popularity:
        kinds.append("popularity")
    return ", ".join(kinds)


def render() -> str:
    """The table of the registered estimators, one row each, in registry order."""
    fit = registry.fit_option_names()
    rows = [
        BEGIN,
        "| method | family | options | designs | summary |",
        "| --- | --- | --- | --- | --- |",
    ]
    for e in registry.entries():
        default = ""
        if e.name == registry.DEFAULT_ESTIMATOR and "default" not in e.summary:
            default = " (the default of `estimate()`)"
        summary = e.summary.replace("|", "\\|")
        rows.append(f"| `{e.name}` | {e.family} | {_options(e, fit)} | {_designs(e)} | {summary}{default} |")
    rows += [
        "",
        "The fit options (every method that fits a rank distribution): "
        + ", ".join(_option(o) for o in _fit_options()) + ". Designs: `uniform` is "
        "uniform sampling with replacement (`SamplingDesign(m)`); the others are `SamplingDesign(m, "
        "replacement=False)`, `SamplingDesign(m, adaptive_max=cap)` and `SamplingDesign(m, popularity=w)`.",
        END,
    ]
    return "\n".join(rows)


def _fit_options() -> tuple:
    fit = registry.fit_option_names()
    for e in registry.entries():
        if set(fit) <= set(e.option_names):
            return tuple(e.option(n) for n in fit)
    return ()


def test_every_registered_estimator_has_a_row():
    text = DOC.read_text()
    missing = [n for n in registry.names() if not re.search(rf"^\| `{re.escape(n)}` \|", text, re.M)]
    assert not missing, f"docs/estimators.md has no table row for {missing}; the table to paste:\n\n{render()}\n"


def test_the_table_matches_the_registry():
    text = DOC.read_text()
    expected = render()
    assert expected in text, (
        "docs/estimators.md: the registry table is out of date; replace the block between the markers by:\n\n"
        f"{expected}\n"
    )


if __name__ == "__main__":
    print(render())
