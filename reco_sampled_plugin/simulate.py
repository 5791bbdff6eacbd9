"""Draw sampled ranks r~ given exact ranks r (Krichene & Rendle section 4.3): the Monte Carlo
counterpart of sampling_laws.py, for repeat-the-sampling experiments (Table 2 and Table 4)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from ._checks import MAX_SAMPLES, check_elements, check_generator, check_int, check_rank_values, check_sizes
from .sampling_laws import check_law

if TYPE_CHECKING:
    from ._types import TensorLike

__all__ = ["draw_sampled_ranks", "simulate_sampled_ranks"]

#: numpy's hypergeometric sampler takes populations below 10^9 (good and bad items each)
_MAX_HYPERGEOMETRIC = 10**9


def draw_hits(trials: Any, good: Any, total: Any, law: str, rng: np.random.Generator | torch.Generator,
              size: int | tuple[int, ...] | None = None) -> Any:
    """How many of ``trials`` uniform draws among ``total`` items hit the ``good`` ones: the one sampler of
    sampled ranks from exact counts (r~ - 1 = hits among the irrelevant items ranked at or above the positive).

    Binomial(trials, good / total) with replacement, Hypergeometric(good, total - good, trials) without.
    ``rng`` picks the stream: a ``numpy.random.Generator`` (numpy arrays, ``size`` as numpy's) or a
    ``torch.Generator`` (float64 tensors on its device; binomial only), so every caller keeps its draws.
    """
    if isinstance(rng, torch.Generator):
        if law != "binomial":
            raise NotImplementedError("draw_hits: torch generators draw the binomial law only")
        p = (good.to(torch.float64) / total.to(torch.float64).clamp(min=1.0)).clamp(0.0, 1.0)
        return torch.binomial(trials, p, generator=rng)
    if law == "binomial":
        return rng.binomial(trials, good / np.maximum(total, 1), size=size)
    if np.size(total) and np.max(total) >= _MAX_HYPERGEOMETRIC:
        raise ValueError(
            f"n_items: draws without replacement are simulated for n - 1 < 10^9 (numpy's hypergeometric sampler), "
            f"got n - 1 = {int(np.max(total))}; use sampling='binomial' (the laws differ by O(m / n) there)"
        )
    return rng.hypergeometric(good, total - good, trials, size=size)


def draw_sampled_ranks(
    exact_ranks: TensorLike, n_items: int | TensorLike, n_samples: int | TensorLike, sampling: str = "binomial",
    repeats: int = 1, seed: int | None = 0
) -> torch.Tensor:
    """Sampled ranks for ``repeats`` independent draws: int64 tensor (repeats, *shape), CPU.

    r~ - 1 ~ Binomial(m, (r-1)/(n-1)) (with replacement) or Hypergeometric(n-1, r-1, m) (without).
    ``n_items`` and ``n_samples`` are ints or per-instance counts broadcastable to the ranks
    (per-positive m serves adaptive sampling); ``seed`` fixes the draws.
    """
    law = check_law(sampling)
    reps = check_int(repeats, "repeats", minimum=1)
    r_t = check_rank_values(exact_ranks, "exact_ranks", whole=True).detach().cpu()
    n_t = check_sizes(n_items, "n_items", 2, like=r_t, like_name="exact_ranks", device=torch.device("cpu"))
    m_t = check_sizes(n_samples, "n_samples", 1, like=r_t, like_name="exact_ranks", device=torch.device("cpu"),
                      maximum=MAX_SAMPLES)
    r, n, m = np.broadcast_arrays(*(torch.as_tensor(x, dtype=torch.int64).numpy() for x in (r_t, n_t, m_t)))
    if r.size and (np.any(r < 1) or np.any(r > n)):
        raise ValueError("exact_ranks: values must lie in 1..n_items (1-based)")
    if r.size and np.any(n < 2):
        raise ValueError("n_items: need at least 2 candidates")
    if seed is not None:
        from ._options import check_seed

        seed = check_seed(seed, "seed")
    rng = np.random.default_rng(seed)
    size = (reps,) + r.shape
    check_elements(reps * r.size, "repeats", "the draws (repeats x ranks)")  # the result itself: before drawing
    if law != "binomial" and r.size and np.any(n - 1 < m):
        raise ValueError("n_samples: m draws without replacement need at least m irrelevant candidates (m < n_items)")
    j = draw_hits(m, r - 1, n - 1, law, rng, size=size)
    return torch.from_numpy(np.asarray(j, dtype=np.int64) + 1)


def simulate_sampled_ranks(
    exact_ranks: TensorLike, n_items: int | TensorLike, n_samples: int | TensorLike, sampling: str = "binomial",
    generator: torch.Generator | None = None
) -> torch.Tensor:
    """Draw sampled ranks r~ = 1 + j given exact ranks r (j from the sampling law), int64, on the
    ranks' device. ``n_items`` and ``n_samples`` may be per-positive tensors; ``generator`` seeds
    the draw (see :func:`reco_sampled_plugin.simulate.draw_sampled_ranks`)."""
    check_generator(generator)
    r = check_rank_values(exact_ranks, "exact_ranks", whole=True)
    seed = int(torch.randint(0, 2**31 - 1, (1,), generator=generator))
    return draw_sampled_ranks(r, n_items, n_samples, sampling, repeats=1, seed=seed)[0].to(r.device)
