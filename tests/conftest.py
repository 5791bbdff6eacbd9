import os

import pytest
import torch
from hypothesis import settings

# hypothesis profiles: ``fast`` (default: derandomised, so make test is reproducible) and ``long`` for a deep fuzzing
# run (``pytest tests/test_fuzz.py --hypothesis-profile long``); tests that set max_examples keep theirs
settings.register_profile("fast", max_examples=40, deadline=None, derandomize=True)
settings.register_profile("long", max_examples=2000, deadline=None)
settings.load_profile("fast")

# Small inputs stay on the eager counting path; tests that exercise the compiled kernel say so.
os.environ.setdefault("RECO_SAMPLED_BACKEND", "auto")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(12345)
