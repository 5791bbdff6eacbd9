"""The difference estimator's predictions (``_design_based._posterior_means``): the binomial likelihood read at the
observed sampled ranks alone (large tables) gives the posterior means of the whole table."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from reco_sampled_plugin import SampledRanks, SamplingDesign
from reco_sampled_plugin import _design_based as db
from reco_sampled_plugin.adaptive import adaptive_sampled_ranks_from_exact
from reco_sampled_plugin.metric_names import parse_metric


@pytest.mark.parametrize("metric", ["ndcg@10", "hit@10"])
def test_observed_columns_equal_the_dense_table(monkeypatch, metric):
    rng = np.random.default_rng(3)
    n, users = 3000, 400
    exact = torch.from_numpy(np.minimum(n, np.floor(np.exp(rng.uniform(0, np.log(n), users)))).astype(np.int64))
    nt = torch.full((users,), n)
    design = SamplingDesign(20, adaptive_max=640)
    drawn = adaptive_sampled_ranks_from_exact(exact, nt, design, generator=torch.Generator().manual_seed(1))
    sampled = SampledRanks.from_arrays(drawn.ranks, nt, drawn.n_samples, design)
    spec = parse_metric(metric)
    monkeypatch.setattr(db, "_DENSE_ELEMENTS", 1 << 62)  # every group's whole table
    dense, dense2 = db._posterior_means(spec, *_fit_inputs(spec, sampled), second=True)
    monkeypatch.setattr(db, "_DENSE_ELEMENTS", 0)  # every group at its observed columns
    columns, columns2 = db._posterior_means(spec, *_fit_inputs(spec, sampled), second=True)
    assert np.allclose(columns, dense, rtol=1e-9, atol=1e-14) and np.allclose(columns2, dense2, rtol=1e-9, atol=1e-14)
    assert len(np.unique(drawn.n_samples)) > 3 and dense.std() > 0


def _fit_inputs(spec, sampled):
    fit, _, law = db.model_fit(spec, sampled.histogram(exact=False).without_empty_groups())
    valid = sampled.ranks > 0
    return (fit, sampled.candidates().numpy()[valid.numpy()], sampled.n_samples[valid].numpy(),
            sampled.ranks[valid].numpy(), law)
