"""Every script in examples/ runs (smoke level) and prints what it promises."""

import runpy
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def test_core_quickstart(capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["core_quickstart.py"])
    runpy.run_path(str(EXAMPLES / "core_quickstart.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "recall@10" in out and "expected sampled" in out and "ROC_AUC" in out


def test_intervals_at_scale_example(capsys, monkeypatch):
    """The honest interval holds the exact value for both recommenders and metrics, and is wider than the
    sampling interval (ml-latest-small, m = 100: K = 10 is inside the first sampled bin)."""
    monkeypatch.setattr(sys, "argv", ["intervals_at_scale.py"])
    runpy.run_path(str(EXAMPLES / "intervals_at_scale.py"), run_name="__main__")
    rows = [ln for ln in capsys.readouterr().out.splitlines() if "top_unresolved" in ln]
    assert len(rows) == 4
    for row in rows:
        exact = float(row.split()[2])
        (s_lo, s_hi), (lo, hi) = (tuple(float(x) for x in part.split("]")[0].split(",")) for part in row.split("[")[1:3])
        assert lo <= exact <= hi and lo <= max(s_lo, 0.0) and hi >= s_hi and hi - lo > s_hi - max(s_lo, 0.0)  # clipped at 0


def test_adaptive_at_scale_example(capsys, monkeypatch):
    """The plan recommends the adaptive design; adaptive sampling from the scores lands closer to the exact value
    than fixed m = 100 with a narrower interval that still holds it, and reports its cost (ml-latest-small)."""
    monkeypatch.setattr(sys, "argv", ["adaptive_at_scale.py"])
    runpy.run_path(str(EXAMPLES / "adaptive_at_scale.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "Recommendation: adaptive 100->3200" in out
    rows = [ln.split() for ln in out.splitlines() if ln.startswith(("Popularity", "iALS")) and "[" in ln]
    assert len(rows) == 8
    for fixed, adaptive in zip(rows[0::2], rows[1::2]):
        assert fixed[4] == "100" and adaptive[4] == "100->3200"
        exact, f_est, a_est = float(fixed[5]), float(fixed[6]), float(adaptive[6])
        assert float(adaptive[5]) == exact and abs(a_est - exact) < abs(f_est - exact)
        f_lo, f_hi = float(fixed[7].strip("[,")), float(fixed[8].strip("]"))
        a_lo, a_hi = float(adaptive[7].strip("[,")), float(adaptive[8].strip("]"))
        assert a_lo <= exact <= a_hi and a_hi - a_lo < f_hi - f_lo
        assert 100 < float(adaptive[9]) < 3200 and 0 < float(adaptive[10]) < 0.2


def test_popularity_sampled_example(capsys, monkeypatch):
    """Popularity-sampled m = 100 on ml-latest-small: every corrected value is closer to the exact one than the
    uncorrected popularity-sampled metric, and its interval holds the exact value (hh for AUC, pl_fit otherwise)."""
    monkeypatch.setattr(sys, "argv", ["popularity_sampled.py"])
    runpy.run_path(str(EXAMPLES / "popularity_sampled.py"), run_name="__main__")
    rows = [ln.split() for ln in capsys.readouterr().out.splitlines() if ln.startswith(("Popularity", "ItemKNN"))]
    assert len(rows) == 6
    for row in rows:
        lo, hi = float(row[2].strip("[,")), float(row[3].strip("]"))
        value, plain, exact = float(row[4]), float(row[6]), float(row[7])
        assert abs(value - exact) < abs(plain - exact) and lo <= exact <= hi, row
        assert row[5] == ("hh" if row[1] == "auc" else "pl_fit")


@pytest.mark.slow
def test_recbole_example(capsys, monkeypatch, tmp_path):
    monkeypatch.setattr(sys, "argv", ["run_bpr_ml100k.py", "--workdir", str(tmp_path)])
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(EXAMPLES / "recbole" / "run_bpr_ml100k.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "correctedrecall@10/auto" in out and "exact target" in out


def test_recbole_cli_help_and_bad_override(capsys):
    from reco_sampled_plugin.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["recbole", "--help"])
    assert exit_info.value.code == 0
    assert "reco-sampled recbole" in capsys.readouterr().out
    assert main(["recbole", "--model", "BPR", "epochs"]) == 2
    assert "--key=value" in capsys.readouterr().err


def test_cli_example(tmp_path):
    """examples/cli/estimate_from_ranks.sh with this interpreter and its console script on PATH: the
    corrected estimates land near the exact values the script prints, the plain sampled ones do not."""
    import os
    import re
    import shutil
    import subprocess

    bindir = Path(sys.executable).parent
    assert shutil.which("reco-sampled", path=str(bindir)), "the reco-sampled console script is not installed"
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}", "PYTHON": sys.executable}
    proc = subprocess.run(["bash", str(EXAMPLES / "cli" / "estimate_from_ranks.sh"), str(tmp_path)],
                          capture_output=True, text=True, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    exact = dict(re.findall(r"(recall@10|ndcg@10) ([0-9.]+)", out.splitlines()[0]))
    # metric method estimate [lo, hi] flags (the 95% interval leads, no standard error by default)
    found = re.findall(r"^(\S+@10)\s+([\w:]+)\s+([0-9.]+)\s+\[([0-9.]+), ([0-9.]+)\]", out, re.M)
    # the default estimator prints as auto:<what it ran> (auto:mes where K = 10 lies below the resolution)
    rows = {(m, meth.split(":")[0]): (float(v), (float(lo), float(hi))) for m, meth, v, lo, hi in found}
    # the defaults: the plain sampled metric and auto (bv only where asked for: its table below)
    assert {meth.split(":")[0] for _, meth, *_ in found} == {"none", "auto"} and any(meth.startswith("auto:") for _, meth, *_ in found)
    for metric in ("recall@10", "ndcg@10"):
        truth = float(exact[metric])
        none, _ = rows[(metric, "none")]
        assert none > 1.5 * truth  # the sampled metric overstates the full-catalogue one
        value, _ = rows[(metric, "auto")]
        assert abs(value - truth) < abs(none - truth) / 3, (metric, value, truth)
        default, (lo, hi) = rows[(metric, "auto")]
        assert lo <= truth <= hi  # the default estimator's honest interval holds the exact value
        assert abs(default - truth) < 0.1 * truth + 3 * (hi - lo) / (2 * 1.96)
    assert len((tmp_path / "bv_table.csv").read_text().splitlines()) == 102
