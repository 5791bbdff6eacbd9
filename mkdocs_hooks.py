"""MkDocs hooks of the documentation site (mkdocs.yml ``hooks:``): the Lightning callback's reference, Sphinx roles.

``RankingMetricsCallback`` is built at run time per Lightning namespace (``adapters.lightning.callback_class``), so
the static reader of mkdocstrings cannot see it. The marker ``<!-- lightning-callback-reference -->`` of a page is
replaced by the class's signature (``_RankingMetricsLogic.__init__``) and docstring (``_CALLBACK_DOC``), read with
``ast`` from the source: nothing is imported, the text is the one ``help(RankingMetricsCallback)`` shows.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

SOURCE = Path(__file__).resolve().parent / "reco_sampled_plugin" / "adapters" / "lightning.py"
MARKER = "<!-- lightning-callback-reference -->"


def _parts() -> tuple[str, str]:
    source = SOURCE.read_text(encoding="utf-8")
    tree = ast.parse(source)
    doc = init = None
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "_CALLBACK_DOC" for t in node.targets):
            doc = node.value.value
        if isinstance(node, ast.ClassDef) and node.name == "_RankingMetricsLogic":
            init = next(f for f in node.body if isinstance(f, ast.FunctionDef) and f.name == "__init__")
    if doc is None or init is None:
        raise ValueError(f"{SOURCE}: _CALLBACK_DOC or _RankingMetricsLogic.__init__ not found (update mkdocs_hooks.py)")
    header = re.match(r"def __init__\((.*?)\)\s*(?:->[^:]*)?:\n", ast.get_source_segment(source, init), re.S)
    params = [ln.strip() for ln in header.group(1).splitlines() if ln.strip() and ln.strip() != "self,"]
    body = "\n".join("    " + p for p in params)
    return doc.format(namespace="lightning.pytorch"), f"RankingMetricsCallback(\n{body}\n)"


def _markdown(doc: str, signature: str) -> str:
    """The docstring's summary, its ``Args:`` as a table and the text after it."""
    lines = doc.splitlines()
    summary, rest = lines[0], [ln[4:] if ln.startswith("    ") else ln for ln in lines[1:]]
    args, tail, current, mode = [], [], None, "before"
    for line in rest:
        if line.strip() == "Args:":
            mode = "args"
            continue
        if mode == "args":
            match = re.match(r"^    (\S[^:]*): (.*)$", line)
            if match:
                current = [match.group(1), match.group(2)]
                args.append(current)
                continue
            if line.startswith("        ") and current:
                current[1] += " " + line.strip()
                continue
            if not line.strip() and not args:
                continue
            mode = "after"
        if mode == "after":
            tail.append(line)
    table = ["| argument | meaning |", "| --- | --- |"]
    table += [f"| `{name}` | {text.replace('|', '&#124;')} |" for name, text in args]
    return "\n".join([f"```python\n{signature}\n```", "", summary, "", *table, "", *tail]).strip() + "\n"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    doc, signature = _parts()
    return markdown.replace(MARKER, _markdown(doc, signature))


# Sphinx roles of the docstrings (``:class:`~pkg.mod.Name```) as rendered by Markdown: the role's text before the
# code span. Shown as the code span alone, the last component for ``~`` (what Sphinx shows).
_ROLE = re.compile(r":(?:class|func|meth|mod|data|attr|exc|obj):<code>(~?)([\w.]+)</code>")


def _role(match: re.Match) -> str:
    name = match.group(2).rsplit(".", 1)[-1] if match.group(1) else match.group(2)
    return f"<code>{name}</code>"


def on_page_content(html: str, page, config, files) -> str:
    return _ROLE.sub(_role, html)
