"""Every next step the product prints runs when pasted: the ``reco-sampled plan`` command under ``estimate``'s
flags (fixed-m files without an m column, adaptive files), the adapters' and the report's warnings, and the
``reco-sampled plan`` commands of the README and the docs, each run through ``cli.main`` on real small files.

The pasted commands run as printed with ``--repeats 2`` (and, where the documented grid is large, one ``--design``)
appended: the flags, the pilot file and the plan are exercised, in a fraction of the default plan's time."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from reco_sampled_plugin.cli import main

ROOT = Path(__file__).resolve().parents[1]
FAST = ["--repeats", "2"]


def _plan_hints(text: str) -> list[str]:
    """The ``reco-sampled plan ...`` commands inside ``(...)`` of printed lines."""
    return re.findall(r"\((reco-sampled plan [^)]*)\)", text)


def _run_pasted(command: str, capsys, extra: list[str] = FAST) -> str:
    argv = shlex.split(command)
    assert argv[0] == "reco-sampled"
    assert main(argv[1:] + extra) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "Recommendation:" in out
    return out


def test_estimate_hint_runs_for_a_file_without_an_m_column(tmp_path, capsys):
    # the examples/cli script's file: rank,n_candidates lines, m = 100 given on the command line
    rng = np.random.default_rng(0)
    n = rng.integers(1000, 2001, size=600)
    exact = np.clip(np.ceil(rng.beta(0.4, 4.0, size=600) * n).astype(int), 1, n)
    sampled = 1 + rng.binomial(100, (exact - 1) / (n - 1))
    f = tmp_path / "ranks.csv"
    f.write_text("".join(f"{r},{k}\n" for r, k in zip(sampled, n)))
    assert main(["estimate", str(f), "-m", "100", "--metric", "ndcg@10"]) == 0
    hints = _plan_hints(capsys.readouterr().out)
    assert hints and all("--pilot-n-samples 100" in h for h in hints)
    _run_pasted(hints[0], capsys, FAST + ["--design", "50"])
    # without the m the file leaves out, plan names its own flag
    bare = hints[0].replace(" --pilot-n-samples 100", "")
    assert main(shlex.split(bare)[1:] + FAST) == 2
    assert "no --pilot-n-samples given" in capsys.readouterr().err


def test_estimate_hint_runs_for_an_adaptive_file(tmp_path, capsys):
    from reco_sampled_plugin import SamplingDesign
    from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
    from reco_sampled_plugin.ranking import SampledRanks
    from reco_sampled_plugin.rank_files import write_rank_file

    g = torch.Generator().manual_seed(1)
    exact = torch.from_numpy(np.minimum(np.random.default_rng(1).geometric(0.02, 500), 3000))
    design = SamplingDesign(20, adaptive_max=160)
    res = adaptive_sampled_ranks_from_exact(exact, torch.full((500,), 3000), design, generator=g)
    f = tmp_path / "adaptive ranks.csv"  # a space: the hint quotes the path
    write_rank_file(f, SampledRanks.from_arrays(res.ranks, 3000, res.n_samples, design))
    assert main(["estimate", str(f), "--n-samples", "20", "--adaptive-max", "160", "--metric", "ndcg@10"]) == 0
    hints = _plan_hints(capsys.readouterr().out)
    assert hints and "--pilot-n-samples 20 --pilot-adaptive-max 160" in hints[0]  # cap_reached's advice
    out = _run_pasted(hints[0], capsys, FAST + ["--design", "20:640"])
    assert "adaptive m = 20->160" in out  # the pilot read as the adaptive draw it is


def _documented_plan_commands() -> list[tuple[str, str]]:
    """(file, command) of each ``reco-sampled plan`` command in a code block of the README and the docs
    (continuation lines joined; a synopsis' optional ``[...]`` kept, brackets dropped)."""
    out = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        lang, block = None, []
        for line in path.read_text().splitlines():
            if line.lstrip().startswith("```"):
                if lang is None:
                    lang, block = line.strip()[3:], []
                    continue
                if lang in ("bash", "sh", "console", ""):
                    for cmd in "\n".join(block).replace("\\\n", " ").splitlines():
                        cmd = cmd.split("#", 1)[0].strip()
                        if cmd.startswith("reco-sampled plan "):
                            out.append((path.name, re.sub(r"\[([^\]]*)\]", r"\1", cmd)))
                lang = None
            elif lang is not None:
                block.append(line)
    return out


def test_documented_plan_commands_run(tmp_path, capsys, monkeypatch):
    """Each documented ``plan`` command runs on the files the docs make: ``ranks.csv`` (examples/cli's: rank and n
    per line, m = 100 given by ``--pilot-n-samples``) and ``scorer_ranks.csv`` (docs/estimators.md's scorer
    pilot written by ``write_rank_file``: adaptive 50 -> 1,600 on 5,000 items)."""
    from reco_sampled_plugin import SamplingDesign
    from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
    from reco_sampled_plugin.ranking import SampledRanks
    from reco_sampled_plugin.rank_files import write_rank_file

    commands = _documented_plan_commands()
    assert len(commands) >= 4 and any("--pilot scorer_ranks.csv" in c for _, c in commands)
    monkeypatch.chdir(tmp_path)
    g = torch.Generator().manual_seed(2)
    rng = np.random.default_rng(2)
    exact = torch.from_numpy(np.minimum(rng.geometric(0.01, 400), 5000))
    design = SamplingDesign(50, adaptive_max=1600)
    res = adaptive_sampled_ranks_from_exact(exact, torch.full((400,), 5000), design, generator=g)
    write_rank_file("scorer_ranks.csv", SampledRanks.from_arrays(res.ranks, 5000, res.n_samples, design))
    fixed = 1 + rng.binomial(100, (exact.numpy() - 1) / 4999)
    Path("ranks.csv").write_text("".join(f"{int(r)},5000\n" for r in fixed))  # as examples/cli writes it: no m
    for name, command in commands:
        n_items = int(shlex.split(command)[shlex.split(command).index("--n-items") + 1])
        # one design of the documented grid keeps the test cheap (a fixed m below the catalogue)
        _run_pasted(command, capsys, FAST + ["--design", str(min(100, n_items // 4))])


def test_adapter_warning_hint_runs(caplog, capsys):
    """The warning ``SampledRankingMetrics`` logs once for an unresolved top names a ``reco-sampled plan`` command
    with this evaluation's sizes (the adapters' one path, ``_shared.explain_once``): it runs as printed."""
    import logging

    from reco_sampled_plugin.adapters.torchmetrics import SampledRankingMetrics

    g = torch.Generator().manual_seed(0)
    scores = torch.randn(40, 317, generator=g)  # a catalogue of its own: the warning is logged once per process
    pos = torch.randint(0, 317, (40, 1), generator=g)
    scores[torch.arange(40), pos[:, 0]] += 2.0
    metric = SampledRankingMetrics(("ndcg@10",), 20, ("bv",), seed=1)
    metric.update(scores, pos)
    with caplog.at_level(logging.WARNING):
        metric.compute()
    hints = _plan_hints(caplog.text)
    assert hints and "--n-items 317 --n-users 40 --metric ndcg@10" in hints[0]
    _run_pasted(hints[0], capsys, FAST + ["--design", "20"])
