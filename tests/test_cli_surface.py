"""The command line's surface: ``--help`` starts without torch, and every flag is the Python parameter's
name (``-`` for ``_``)."""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import subprocess
import sys
from pathlib import Path

import pytest

from reco_sampled_plugin import cli

ROOT = Path(__file__).resolve().parents[1]
COMMANDS = ["demo", "reproduce", "table", "estimate", "plan", "recbole"]


@pytest.mark.parametrize("command", [None] + COMMANDS)
def test_help_imports_neither_torch_nor_scipy(command):
    argv = ["--help"] if command is None else [command, "--help"]
    code = (
        "import sys\n"
        "from reco_sampled_plugin.cli import main\n"
        "try:\n"
        f"    main({argv!r})\n"
        "except SystemExit as exc:\n"
        "    assert exc.code in (0, None), exc.code\n"
        "heavy = sorted(m for m in ('torch', 'scipy', 'numpy', 'pandas', 'yaml', 'recbole') if m in sys.modules)\n"
        "print('HEAVY', heavy)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert out.returncode == 0, out.stderr
    assert "usage:" in out.stdout
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


def _subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def _params(*functions) -> set[str]:
    names: set[str] = set()
    for f in functions:
        if dataclasses.is_dataclass(f):
            names |= {fld.name for fld in dataclasses.fields(f)}
        else:
            names |= set(inspect.signature(f).parameters)
    return names


def _python_names() -> dict[str, set[str]]:
    from reco_sampled_plugin import registry
    from reco_sampled_plugin.corrections import correction_table
    from reco_sampled_plugin.design import SamplingDesign
    from reco_sampled_plugin.estimators import estimate
    from reco_sampled_plugin.planner import PlanExecution, plan
    from reco_sampled_plugin.rank_files import read_ncf, read_rank_file
    from reco_sampled_plugin.report import write_report
    from reco_sampled_plugin.reproduce import ReproduceConfig, run_reproduce
    from reco_sampled_plugin.toy import toy_table

    return {
        "demo": _params(toy_table),
        "reproduce": _params(ReproduceConfig, run_reproduce, write_report, SamplingDesign),
        "table": _params(correction_table, registry.Bv, registry.RankEstimate),
        "estimate": _params(estimate, read_rank_file, read_ncf, SamplingDesign, cli.estimate_table),
        "plan": _params(plan, PlanExecution, SamplingDesign),
    }


# flags with no Python parameter of that name, and why (kept short: each is a CLI-only convenience or the singular
# of a repeatable flag that fills a list parameter)
CLI_ONLY = {
    ("reproduce", "out"): "write_report's out_dir: the report folder",
    ("reproduce", "no_plots"): "write_report(plots=False)",
    ("reproduce", "quick"): "a shorter m grid (ReproduceConfig.m_grid)",
    ("reproduce", "quiet"): "no stage lines and no progress bars",
    ("reproduce", "sampling"): "the design's law: ReproduceConfig(n_samples=SamplingDesign(m, replacement=False))",
    ("table", "out"): "the CSV file to write",
    ("table", "sampling"): "the table's design: SamplingDesign(m, replacement=False) for hypergeometric",
    ("estimate", "file"): "read_rank_file's path (positional)",
    ("estimate", "sampling"): "the rank file's design: SamplingDesign(m, replacement=False) for hypergeometric",
    ("estimate", "option"): "repeatable NAME=VALUE: a field of each --method's options object (registry.Bv(gamma=...))",
    ("estimate", "progress"): "a bar over the (metric, method) estimates, as SampledRankingMetrics.estimates(progress=)",
    ("plan", "design"): "repeatable: one entry of plan(designs=...)",
    ("plan", "pilot_n_items"): "the pilot file's n when it has no n column (its SampledRanks.n_candidates)",
    ("plan", "pilot_n_samples"): "the pilot file's m when it has no m column (its design's n_samples)",
    ("plan", "pilot_adaptive_max"): "the adaptive_max of the pilot's design (plan(pilot=SampledRanks(...)))",
    ("plan", "pilot_adaptive_top"): "the adaptive_top of the pilot's design (plan(pilot=SampledRanks(...)))",
}


def test_every_flag_is_a_python_parameter_name():
    names = _python_names()
    mismatched = []
    for command, sub in _subparsers(cli.build_parser()).items():
        if command == "recbole":  # its own parser (RecBole's run_recbole), checked below
            continue
        for action in sub._actions:
            if action.dest in ("help", argparse.SUPPRESS) or action.help == argparse.SUPPRESS:
                continue
            if (command, action.dest) in CLI_ONLY:
                continue
            flag = "--" + action.dest.replace("_", "-")
            allowed = {flag, "--no-" + flag[2:]} if isinstance(action, argparse.BooleanOptionalAction) else {flag}
            long_flags = [s for s in action.option_strings if s.startswith("--")]
            if action.dest not in names[command] or any(f not in allowed for f in long_flags):
                mismatched.append((command, action.option_strings or action.dest))
    assert mismatched == []


def test_recbole_flags_are_run_recbole_parameters():
    from reco_sampled_plugin.adapters.recbole import run_recbole

    params = set(inspect.signature(run_recbole).parameters)
    dests = {a.dest for a in cli._recbole_parser()._actions if a.dest != "help"}
    # --config fills config_file_list and --nosave is saved=False, the spellings of RecBole's own run script
    assert dests - params == {"config", "nosave"}
    assert {"model", "dataset", "config_file_list", "saved"} <= params


def test_plan_n_users(capsys):
    args = cli.build_parser().parse_args(["plan", "--n-items", "3000", "--n-users", "400", "--metric", "ndcg@10",
                                          "--target-rel-error", "0.1"])
    assert args.n_users == 400 and capsys.readouterr().err == ""
    help_text = _subparsers(cli.build_parser())["plan"].format_help()
    assert "--n-users" in help_text and "--users" not in help_text.replace("--n-users", "")
    with pytest.raises(SystemExit) as exc:  # argparse's own check of a required option
        cli.main(["plan", "--n-items", "3000", "--metric", "ndcg@10", "--target-rel-error", "0.1"])
    assert exc.value.code == 2 and "--n-users" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # the 0.1 spelling is gone
        cli.main(["plan", "--n-items", "3000", "--users", "400", "--metric", "ndcg@10", "--target-rel-error", "0.1"])


def test_estimate_test_rating(tmp_path, capsys):
    rating = tmp_path / "x.test.rating"
    negative = tmp_path / "x.test.negative"
    scores = tmp_path / "scores.txt"
    rating.write_text("0\t5\n1\t7\n")
    negative.write_text("(0,5)\t1\t2\t3\n(1,7)\t1\t2\t3\n")
    scores.write_text("0 5 0.9\n0 1 0.1\n0 2 0.95\n0 3 0.2\n1 7 0.5\n1 1 0.6\n1 2 0.7\n1 3 0.8\n")
    common = ["--scores", str(scores), "--n-items", "50", "--metric", "recall@10", "--method", "none"]
    assert cli.main(["estimate", "--test-rating", str(rating), "--test-negative", str(negative)] + common) == 0
    new = capsys.readouterr()
    assert "2 sampled ranks" in new.out
    # sampled ranks 2 and 4 among m = 3 negatives: the plain sampled recall@10 of both is 1
    row = next(line.split() for line in new.out.splitlines() if line.startswith("recall@10"))
    assert row[1] == "none" and float(row[2]) == 1.0
    help_text = _subparsers(cli.build_parser())["estimate"].format_help()
    assert "--test-rating" in help_text and "--ncf-rating" not in help_text
