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
