import os

import pytest
import torch

# Small inputs stay on the eager counting path; tests that exercise the compiled kernel say so.
os.environ.setdefault("RECO_SAMPLED_BACKEND", "auto")


@pytest.fixture
def gen():
    return torch.Generator().manual_seed(12345)
