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


@pytest.mark.slow
def test_recbole_example(capsys, monkeypatch, tmp_path):
    pytest.importorskip("recbole")
    monkeypatch.setattr(sys, "argv", ["run_bpr_ml100k.py", "--workdir", str(tmp_path)])
    monkeypatch.chdir(tmp_path)
    runpy.run_path(str(EXAMPLES / "recbole" / "run_bpr_ml100k.py"), run_name="__main__")
    out = capsys.readouterr().out
    assert "correctedrecall@10" in out and "exact target" in out


def test_recbole_cli_help_and_bad_override(capsys):
    from reco_sampled_plugin.cli import main

    with pytest.raises(SystemExit) as exit_info:
        main(["recbole", "--help"])
    assert exit_info.value.code == 0
    assert "reco-sampled recbole" in capsys.readouterr().out
    assert main(["recbole", "--model", "BPR", "epochs"]) == 2
    assert "--key=value" in capsys.readouterr().err
