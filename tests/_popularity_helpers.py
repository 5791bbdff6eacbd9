"""Shared data of the popularity tests: a small factor model with a popularity design."""

from __future__ import annotations

from typing import Any

import numpy as np
import scipy.sparse as sp
import torch

from reco_sampled_plugin.design import SamplingDesign


def factor_world(m: int = 40) -> tuple[Any, Any, np.ndarray, np.ndarray, SamplingDesign]:
    """(train, test, user factors, item factors, design): 150 users x 250 items, random interactions (test items
    outside each user's training row), Gaussian factors of rank 8, and m popularity-sampled negatives with weights
    1 + the items' counts over both phases."""
    rng = np.random.default_rng(0)
    users, items = 150, 250
    train = sp.random(users, items, density=0.05, random_state=1, format="csr")
    train.data[:] = 1
    test = sp.random(users, items, density=0.02, random_state=2, format="csr")
    test.data[:] = 1
    test = (test - test.multiply(train)).tocsr()
    test.eliminate_zeros()
    a, b = rng.normal(size=(users, 8)), rng.normal(size=(items, 8))
    counts = torch.tensor(np.asarray(train.sum(0)).ravel() + np.asarray(test.sum(0)).ravel() + 1.0)
    return train, test, a, b, SamplingDesign(m, popularity=counts)
