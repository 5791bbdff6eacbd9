import os

import pytest
import torch
from hypothesis import settings

# hypothesis profiles: ``fast`` (default: derandomised, so make test is reproducible), ``long`` for a deep fuzzing
# run (``pytest tests/test_fuzz.py --hypothesis-profile long``) and ``quick`` for a developer's loop. Every count in
# the tests is written at the fast profile's scale and scaled to the loaded profile (tests/_profiles.py: examples).
settings.register_profile("fast", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.register_profile("quick", max_examples=8, deadline=None, derandomize=True)
settings.load_profile("fast")

# Small inputs stay on the eager counting path; tests that exercise the compiled kernel say so.
os.environ.setdefault("RECO_SAMPLED_BACKEND", "auto")


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    """A working directory of the module's own: RecBole writes log/, log_tensorboard/ and saved/ relative to it."""
    path = tmp_path_factory.mktemp("workdir")
    old = os.getcwd()
    os.chdir(path)
    yield path
    os.chdir(old)


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(12345)


# Devices every device-parametrised test runs on: the CPU always, CUDA when this machine has it (issue 19).
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


@pytest.fixture(params=DEVICES)
def device(request) -> torch.device:
    """Each available device in turn (``cpu``; ``cuda`` too on a GPU machine)."""
    return torch.device(request.param)


@pytest.fixture(params=["eager", "compiled"])
def backend(request):
    """Each counting backend in turn (``reco_sampled_plugin.counting.set_backend``), restored afterwards."""
    from reco_sampled_plugin import counting

    before = counting.get_backend()
    counting.set_backend(request.param)
    yield request.param
    counting.set_backend(before)
