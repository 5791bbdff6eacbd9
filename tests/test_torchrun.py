"""examples/torchrun/evaluate_sharded.py under ``torchrun --standalone``: 2 processes (gloo, CPU) give the same
results as 1 process (the script as one torchrun process runs it, a gloo group of one rank, here called in the
test's own process: no launcher and no second interpreter to start). Sampled metrics exactly (negatives keyed by
user id: the same histogram whatever the sharding), exact metrics to float rounding (sums added in another order)."""

from __future__ import annotations

import json
import math
import os
import runpy
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

SCRIPT = Path(__file__).resolve().parents[1] / "examples" / "torchrun" / "evaluate_sharded.py"
# small enough for a test (the example's defaults are 2,000 x 5,000); eager counting: no compile per process
ARGS = ["--users", "300", "--items", "1500", "--batch-size", "64"]

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="needs gloo")


def _run(tmp_path: Path, nproc: int, *extra: str) -> dict:
    out = tmp_path / f"results_{nproc}{'_'.join(extra)}.json"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(nproc), "--standalone",
           str(SCRIPT), *ARGS, *extra, "--device", "cpu", "--backend", "gloo", "--out", str(out)]
    env = {**os.environ, "RECO_SAMPLED_BACKEND": "eager", "OMP_NUM_THREADS": "1"}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=180, env=env, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text())


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _run_here(tmp_path: Path, monkeypatch) -> dict:
    """The script's run as one torchrun process would make it (a gloo group of one rank: the environment torchrun
    sets), in this process with the eager counting path and one torch thread (as the torchrun runs), its JSON read
    back as theirs is: no launcher and no second interpreter."""
    import torch

    from reco_sampled_plugin import counting

    out = tmp_path / "results_here.json"
    for name, value in {"WORLD_SIZE": "1", "RANK": "0", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                        "MASTER_PORT": str(_free_port())}.items():
        monkeypatch.setenv(name, value)
    before, threads = counting.get_backend(), torch.get_num_threads()
    counting.set_backend("eager")
    torch.set_num_threads(1)
    try:
        runpy.run_path(str(SCRIPT), run_name="evaluate_sharded")["main"](
            [*ARGS, "--device", "cpu", "--backend", "gloo", "--out", str(out)])
    finally:
        counting.set_backend(before)
        torch.set_num_threads(threads)
    assert not dist.is_initialized()  # the script destroyed its group
    return json.loads(out.read_text())


def test_two_processes_equal_one(tmp_path, monkeypatch):
    one = _run_here(tmp_path, monkeypatch)
    two = _run(tmp_path, 2, "--shard", "blocks")  # contiguous blocks (the default is strided)
    assert one["world_size"] == 1 and two["world_size"] == 2
    assert two["users_on_rank0"] == 150 and one["relevant_items"] == two["relevant_items"] == 300 * 3
    assert one["histogram_groups"] == two["histogram_groups"]
    assert set(one["results"]) == set(two["results"]) and len(one["results"]) == 4 * 4
    for key, a in one["results"].items():
        b = two["results"][key]
        assert a["n"] == b["n"], key
        if key.endswith("/exact"):  # the same sums, added in another order
            assert b["value"] == pytest.approx(a["value"], rel=1e-12, abs=1e-15), key
            assert b["stderr"] == pytest.approx(a["stderr"], rel=1e-9), key
        else:  # the same keyed draws, the same histogram: the same numbers, bit for bit
            assert b["value"] == a["value"] and b["stderr"] == a["stderr"], key
        assert math.isfinite(a["value"]) and 0 <= a["value"] <= 1, key
