"""Every code block of README.md and docs/*.md runs, so a snippet cannot rot.

* ``python`` blocks run in order in one namespace per file (a later block uses an earlier block's names), in a
  temporary folder (``examples/`` linked in);
* ``bash``/``sh``/``console`` blocks: each ``reco-sampled ...`` line runs through ``cli.main`` on small inputs
  written here under the names the snippet uses; synopsis notation is read as written (``[...]`` optional parts are
  left out, an upper-case placeholder such as ``N`` becomes a value); any other command needs a skip marker;
* ``pip install ...[extra]`` (in blocks or inline) must name an extra of pyproject.toml;
* ``yaml`` blocks must parse; ``text`` and unlabelled blocks are output and are not run.

A block is skipped only with a marker on the line before it, ``<!-- snippet: skip REASON -->``; the skips (and the
commands run in a reduced form) are listed in SKIPS / REDUCED below, so each one is a reviewed decision.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
FILES = [ROOT / "README.md"] + sorted((ROOT / "docs").rglob("*.md"))  # the site's pages (guides, api) too
# pages without a block to run: reference pages and the API reference (mkdocstrings ``:::`` blocks, built and checked
# by tests/test_docs_site.py), the figures page, the research notes (prose and tables)
NO_BLOCKS = ("gpu.md", "input_validation.md", "architecture.md", "figures.md", "torchrun.md", "research-notes.md")
INCLUDE = re.compile(r'^--8<--\s+"(?P<path>[^"]+)"\s*$')  # a pymdownx.snippets include of a repository file
FENCE = re.compile(r"^```(?P<lang>[\w-]*)[^\n]*\n(?P<body>.*?)^```[ \t]*$", re.M | re.S)
SKIP = re.compile(r"<!--\s*snippet:\s*skip\s+(?P<reason>.+?)\s*-->\s*$")
SHELL = {"bash", "sh", "shell", "console"}
OUTPUT = {"", "text"}

# (file, first line of the block) -> reason; must equal the markers in the documents
SKIPS = {
    ("README.md", "make demo"): "creates .venv and installs the project; `make test` is what runs this suite",
    ("README.md", "import reco_sampled_plugin.adapters.recbole as rb"): "trains a RecBole model on ml-100k "
    "(tests/test_examples.py::test_recbole_example runs examples/recbole)",
    ("lightning.md", "import lightning.pytorch as pl"): "needs your LightningModule and data loaders "
    "(tests/test_lightning_adapter.py trains the synthetic module and runs examples/lightning)",
    ("lightning.md", "python examples/lightning/mf_ml100k.py --epochs 3 --logger csv --out runs/mf"): "trains "
    "matrix factorisation on ml-100k for several epochs (tests/test_lightning_adapter.py runs the example)",
    ("recbole.md", "import reco_sampled_plugin.adapters.recbole as rb"): "trains a RecBole model on ml-100k "
    "(tests/test_examples.py::test_recbole_example runs examples/recbole)",
    ("scale.md", "import pyarrow as pa"): "needs your model and a Parquet dataset (tests/test_examples.py runs "
    "examples/ray_at_scale.py)",
    ("scale.md", "python examples/ray_at_scale.py"): "starts a Ray cluster "
    "(tests/test_examples.py::test_ray_at_scale_example runs the example)",
}
# commands run in a reduced form (appended arguments), or only parsed, and why
REDUCED = {
    "plan": (["--repeats", "2", "--design", "100", "--design", "100:3200"],
             "the default grid at n = 50,000 takes 10-15 s (mes fits; the plan's own time: BENCHMARKS.md)"),
}
PARSE_ONLY = {
    "reproduce": "trains four recommenders on ml-100k and runs 100 sampling runs (minutes); "
                 "tests/test_cli.py runs a cut-down reproduce",
    "recbole": "trains a RecBole model (tests/test_examples.py)",
}
PLACEHOLDERS = {"N": "1000", "M": "100", "FILE": "ranks.csv"}


def _blocks(path: Path):
    """(language, body, skip reason or None, first line) of each fenced block of ``path``."""
    text = path.read_text(encoding="utf-8")
    for match in FENCE.finditer(text):
        before = text[: match.start()].rstrip("\n").rsplit("\n", 1)[-1]
        skip = SKIP.search(before)
        body = match.group("body")
        first = re.sub(r"\s+#.*$", "", next((ln.strip() for ln in body.splitlines() if ln.strip()), ""))
        yield match.group("lang").lower(), body, skip.group("reason") if skip else None, first


def _commands(body: str) -> list[str]:
    """The command lines of a shell block: continuations joined, comments dropped."""
    out = []
    for line in body.replace("\\\n", " ").splitlines():
        line = re.sub(r"(^|\s)#.*$", "", line).strip()
        if line:
            out.append(line)
    return out


def _synopsis(command: str) -> list[str]:
    """A command line as written, without its ``[...]`` optional parts and with placeholders filled in."""
    while re.search(r"\[[^\[\]]*\]", command):
        command = re.sub(r"\s*\[[^\[\]]*\]", "", command)
    return [PLACEHOLDERS.get(tok, tok) for tok in shlex.split(command)]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """The small input files the documents' commands name, in a fresh folder."""
    return write_inputs(tmp_path_factory.mktemp("snippets"))


def write_inputs(d: Path) -> Path:
    """Write the inputs into ``d``: rank files (fixed m, adaptive, an adaptive pilot at n = 50,000) and NCF files."""
    from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
    from reco_sampled_plugin.design import SamplingDesign
    from reco_sampled_plugin.simulate import simulate_sampled_ranks

    (d / "examples").symlink_to(ROOT / "examples")
    gen = torch.Generator().manual_seed(0)
    n = torch.tensor([900, 1000, 1100])[torch.randint(0, 3, (300,), generator=gen)]  # candidates per item
    exact = torch.minimum((torch.rand(300, generator=gen) ** 3 * n).long() + 1, n)
    sampled = simulate_sampled_ranks(exact, n, 100, generator=gen)
    (d / "ranks.csv").write_text("".join(f"{r},{k},100\n" for r, k in zip(sampled.tolist(), n.tolist())))
    drawn = adaptive_sampled_ranks_from_exact(exact, n, SamplingDesign(100, adaptive_max=3200), gen)
    ada, sizes = drawn.ranks, drawn.n_samples
    (d / "adaptive_ranks.csv").write_text("".join(f"{r},{k},{s}\n" for r, k, s in zip(ada.tolist(), n.tolist(),
                                                                                    sizes.tolist())))
    big = torch.full((300,), 50_000)
    drawn = adaptive_sampled_ranks_from_exact(torch.minimum(exact * 40, big), big,
                                              SamplingDesign(100, adaptive_max=6400), gen)
    pilot, psizes = drawn.ranks, drawn.n_samples
    (d / "pilot_ranks.csv").write_text("".join(f"{r},{s}\n" for r, s in zip(pilot.tolist(), psizes.tolist())))
    # NCF files: 20 users, 99 negatives each among 1000 items, scores of a model
    rng = np.random.default_rng(0)
    rating, negative, scores = [], [], []
    for u in range(20):
        items = rng.choice(1000, size=100, replace=False)
        rating.append(f"{u}\t{items[0]}\t5\t0\n")
        negative.append(f"({u},{items[0]})\t" + "\t".join(map(str, items[1:])) + "\n")
        scores += [f"{u} {i} {s:.6f}\n" for i, s in zip(items, rng.random(100))]
    (d / "X.test.rating").write_text("".join(rating))
    (d / "X.test.negative").write_text("".join(negative))
    (d / "scores.txt").write_text("".join(scores))
    return d


def _run_shell(name: str, body: str, capsys) -> None:
    from reco_sampled_plugin import cli

    for command in _commands(body):
        argv = _synopsis(command)
        if argv[:2] == ["pip", "install"]:
            continue  # checked in test_pip_install_names_an_extra
        assert argv[0] == "reco-sampled", f"{name}: {command!r} is not a reco-sampled command (mark the block skip)"
        args = argv[1:]
        if args[0] in PARSE_ONLY:
            if args[0] == "recbole":
                cli._recbole_parser().parse_known_args(args[1:])
            else:
                cli.build_parser().parse_args(args)
            continue
        args = args + REDUCED.get(args[0], ([], ""))[0]
        code = cli.main(args)
        out = capsys.readouterr()
        assert code == 0, f"{name}: {command!r} exited {code}: {out.err}"
        assert out.out.strip(), f"{name}: {command!r} printed nothing"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_snippets_run(path, inputs, monkeypatch, capsys):
    monkeypatch.chdir(inputs)
    namespace: dict = {"__name__": "__snippets__"}
    ran = 0
    for lang, body, skip, first in _blocks(path):
        if skip is not None or lang in OUTPUT:
            continue
        include = INCLUDE.match(body.strip())
        if include:  # the site shows the repository's file: check the file
            body = (ROOT / include.group("path")).read_text(encoding="utf-8")
        if lang == "python":
            torch.manual_seed(0)
            exec(compile(body, f"{path.name}:{first}", "exec"), namespace)
        elif lang in SHELL:
            _run_shell(path.name, body, capsys)
        elif lang == "yaml":
            import yaml  # the test extra installs PyYAML
            assert isinstance(yaml.safe_load(body), dict)
        else:
            pytest.fail(f"{path.name}: a ```{lang} block: the snippet test does not know how to check it")
        ran += 1
    capsys.readouterr()
    assert ran > 0 or path.name in NO_BLOCKS or path.parent.name == "api"


def test_skips_are_the_reviewed_ones():
    found = {(p.name, first): reason for p in FILES for _, _, reason, first in _blocks(p) if reason is not None}
    assert found == SKIPS


def test_pip_install_names_an_extra():
    import tomllib

    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"])
    texts = {p.name: p.read_text(encoding="utf-8") for p in FILES}
    named = [e for t in texts.values() for e in re.findall(r"pip install\s+(?:-e\s+)?['\"]?\.\[([\w,-]+)\]", t)]
    assert named, "no `pip install \".[extra]\"` found: update this test"
    for extra in ",".join(named).split(","):
        assert extra in extras, f"pip install names the extra {extra!r}, which pyproject.toml does not define"
    # the package is installed from a clone: no index has it under its name
    for name, text in texts.items():
        assert not re.search(r"pip install\s+['\"]?reco-sampled-plugin", text), f"{name}: pip install from an index"
