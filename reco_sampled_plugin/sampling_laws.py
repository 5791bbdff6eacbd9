"""Sampling laws P(r~ | r) and expected sampled metrics (Krichene & Rendle, section 4.3-4.4, eq. 15-19).

A relevant item at exact rank ``r`` among ``n`` candidates is ranked against ``m`` items drawn
from the ``n - 1`` irrelevant ones; ``r - 1`` of those score higher. The sampled rank is
``r~ = 1 + j`` where ``j`` counts the drawn items that score higher:

* ``"binomial"`` (uniform, with replacement): j ~ Binomial(m, (r - 1) / (n - 1));
* ``"hypergeometric"`` (uniform, without replacement): j ~ Hypergeometric(population n - 1,
  successes r - 1, draws m).

Everything is computed in log space in float64 and stays finite for n up to 1e8 and m up to 1e4.
The hypergeometric law uses the ratio recurrence pmf(j+1)/pmf(j) in log space (no lgamma of
numbers near 1e8, whose rounding would cost about 1e-7 relative accuracy).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch

from ._checks import MAX_ELEMENTS, MAX_SAMPLES, check_rank_values, check_ranks_in_range, check_size, check_sizes
from .metric_names import MetricSpec, parse_metric
from .metrics import metric_from_float_ranks

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = ["SAMPLING_LAWS", "log_sampled_rank_pmf", "sampled_rank_pmf", "expected_sampled"]

SAMPLING_LAWS = ("binomial", "hypergeometric")  # the names of ``SamplingDesign.law`` for uniform draws
# elements of the (ranks x (m + 1)) work matrix per chunk
_CHUNK_ELEMENTS = 1 << 22


# largest table of P(r~ | r) that log_sampled_rank_pmf returns (elements): the package's one bound, 2^27 float64
_MAX_PMF_ELEMENTS = MAX_ELEMENTS


def check_law(sampling: str) -> str:
    """``sampling`` if it names a uniform law of :data:`SAMPLING_LAWS` (spelled as ``SamplingDesign.law``), else a
    ValueError naming ``sampling``."""
    if not isinstance(sampling, str) or sampling not in SAMPLING_LAWS:
        raise ValueError(f"sampling: unknown law {sampling!r}; use 'binomial' (with replacement) or 'hypergeometric'")
    return str(sampling)  # a str subclass (numpy.str_) as the plain name


def _log_pmf_binomial(r: torch.Tensor, n: torch.Tensor, m: int) -> torch.Tensor:
    j = torch.arange(m + 1, dtype=torch.float64, device=r.device)
    p = ((r - 1) / (n - 1)).unsqueeze(-1)
    log_binom = torch.lgamma(torch.tensor(m + 1.0, dtype=torch.float64, device=r.device)) - torch.lgamma(j + 1) - torch.lgamma(m - j + 1)
    logp = log_binom + torch.special.xlogy(j, p) + torch.special.xlog1py(m - j, -p)
    # renormalise: removes the rounding of lgamma(m + 1), shared by every j (about 1e-12 at m = 1e4)
    return logp - torch.logsumexp(logp, dim=-1, keepdim=True)


def _log_pmf_hypergeometric(r: torch.Tensor, n: torch.Tensor, m: int) -> torch.Tensor:
    big_n = (n - 1).unsqueeze(-1)  # population: the irrelevant candidates
    succ = (r - 1).unsqueeze(-1)  # irrelevant candidates that score higher
    j = torch.arange(m + 1, dtype=torch.float64, device=r.device)
    lo = torch.clamp(m - (big_n - succ), min=0)
    hi = torch.minimum(succ, torch.tensor(float(m), dtype=torch.float64, device=r.device))
    # log pmf(j+1) - log pmf(j) for j = 0..m-1, valid where lo <= j < hi
    jj = j[:-1]
    step_ok = (jj >= lo) & (jj < hi)
    num = (succ - jj) * (m - jj)
    den = (jj + 1) * (big_n - succ - m + jj + 1)
    safe_num = torch.where(step_ok, num, torch.ones_like(num))
    safe_den = torch.where(step_ok, den, torch.ones_like(den))
    steps = torch.log(safe_num) - torch.log(safe_den)
    unnorm = torch.cat([torch.zeros_like(steps[..., :1]), torch.cumsum(steps, dim=-1)], dim=-1)
    inside = (j >= lo) & (j <= hi)
    unnorm = torch.where(inside, unnorm, torch.full_like(unnorm, -torch.inf))
    return unnorm - torch.logsumexp(unnorm, dim=-1, keepdim=True)


def _prepare(ranks: Any, n_items: Any, n_samples: Any, sampling: str) -> tuple[torch.Tensor, torch.Tensor, int, str]:
    law = check_law(sampling)
    m = check_size(n_samples, "n_samples", 1, MAX_SAMPLES)  # every law's support has m + 1 entries per rank
    r = check_rank_values(ranks, "ranks")
    # n >= 2: the relevant item and one irrelevant item
    n = check_sizes(n_items, "n_items", 2, like=r, device=r.device)
    n = torch.as_tensor(n, dtype=torch.float64, device=r.device)
    r, n = torch.broadcast_tensors(r.to(torch.float64), n)
    check_ranks_in_range(r, n)
    if law == "hypergeometric":
        if n.numel() and m > float((n - 1).min()):
            raise ValueError(
                f"n_samples: m = {m} draws without replacement need at least m irrelevant candidates, "
                f"but some instance has only n_items - 1 = {int((n - 1).min())}"
            )
        if bool((r != torch.round(r)).any()):
            raise ValueError("ranks: the hypergeometric law needs whole-number ranks (ties='average' gives halves)")
    return r, n, m, law


def _log_pmf_unchecked(r: torch.Tensor, n: torch.Tensor, m: int, law: str) -> torch.Tensor:
    if law == "binomial":
        return _log_pmf_binomial(r, n, m)
    return _log_pmf_hypergeometric(r, n, m)


def log_sampled_rank_pmf(ranks: TensorLike, n_items: int | TensorLike, n_samples: int, sampling: str = "binomial") -> torch.Tensor:
    """log P(r~ = i | r) for i = 1..m+1, shape ``ranks.shape + (m + 1,)`` (float64; -inf off the support).

    Args:
        ranks: exact 1-based ranks ``r`` (any shape).
        n_items: candidates ``n`` per instance (int or tensor broadcastable against ``ranks``).
        n_samples: ``m``, the number of sampled irrelevant items.
        sampling: ``"binomial"`` (with replacement) or ``"hypergeometric"`` (without).
    """
    r, n, m, law = _prepare(ranks, n_items, n_samples, sampling)
    if r.numel() * (m + 1) > _MAX_PMF_ELEMENTS:  # a user asked for the whole table: refuse before allocating it
        raise ValueError(
            f"n_samples: the table P(r~ | r) of {r.numel()} rank(s) x (m + 1 = {m + 1}) values exceeds 2^27 "
            "(1 GiB of float64); ask for fewer ranks at a time (expected_sampled computes its sums in chunks)"
        )
    return _log_pmf_unchecked(r, n, m, law)


def log_sampled_rank_pmf_unbounded(ranks: TensorLike, n_items: int | TensorLike, n_samples: int,
                                   sampling: str = "binomial") -> torch.Tensor:
    """:func:`log_sampled_rank_pmf` without the bound on the table's size, for the package's own callers (they size
    their chunks themselves)."""
    r, n, m, law = _prepare(ranks, n_items, n_samples, sampling)
    return _log_pmf_unchecked(r, n, m, law)


def sampled_rank_pmf(ranks: TensorLike, n_items: int | TensorLike, n_samples: int, sampling: str = "binomial") -> torch.Tensor:
    """P(r~ = i | r) for i = 1..m+1 (index 0 is r~ = 1); see :func:`log_sampled_rank_pmf`."""
    return log_sampled_rank_pmf(ranks, n_items, n_samples, sampling).exp()


def _expected_unique(spec: MetricSpec, r: torch.Tensor, n: torch.Tensor, m: int, law: str) -> torch.Tensor:
    """E[M_{m+1}(r~) | r] for flat float64 r, n, in chunks of bounded memory."""
    i = torch.arange(1, m + 2, dtype=torch.float64, device=r.device)
    sampled_metric = metric_from_float_ranks(spec, i, torch.tensor(float(m + 1), dtype=torch.float64, device=r.device))
    out = torch.empty_like(r)
    chunk = max(1, _CHUNK_ELEMENTS // (m + 1))
    for start in range(0, r.numel(), chunk):  # chunks bound memory; each chunk is vectorised
        sl = slice(start, start + chunk)
        out[sl] = _log_pmf_unchecked(r[sl], n[sl], m, law).exp() @ sampled_metric
    return out


def expected_sampled(
    metric: str | MetricSpec, ranks: TensorLike, n_items: int | TensorLike, n_samples: int, sampling: str = "binomial"
) -> torch.Tensor:
    """Expected sampled metric E[M(r~) | r] (eq. 16), for every exact rank in ``ranks``.

    The sampled metric applies M to r~ among ``m + 1`` candidates (so sampled AUC is
    (m + 1 - r~) / m). Vectorised over ranks of any shape; equal (r, n) pairs are computed once.

    Args:
        metric: metric name (``"recall@10"``, ``"ndcg"``, ``"auc"``...); a cut-off k must not exceed m + 1.
        ranks: exact 1-based ranks among ``n_items`` candidates.
        n_items: ``n`` per instance (int, or tensor broadcastable against ``ranks``).
        n_samples: ``m`` sampled irrelevant items per relevant item.
        sampling: ``"binomial"`` (with replacement, default) or ``"hypergeometric"``.

    Returns:
        float64 tensor shaped like the broadcast of ``ranks`` and ``n_items``.
    """
    spec = parse_metric(metric)
    r, n, m, law = _prepare(ranks, n_items, n_samples, sampling)
    if spec.k is not None and spec.k > m + 1:
        raise ValueError(f"metric: k = {spec.k} is larger than the sampled list (m + 1 = {m + 1})")
    pairs = torch.stack([r.reshape(-1), n.reshape(-1)], dim=1)
    if pairs.shape[0] == 0:
        return torch.empty_like(r)
    uniq, inverse = torch.unique(pairs, dim=0, return_inverse=True)
    values = _expected_unique(spec, uniq[:, 0].contiguous(), uniq[:, 1].contiguous(), m, law)
    return values[inverse].reshape(r.shape)
