"""Offline evaluation on Ray Data: the same numbers as one process (docs/guides/scale.md).

A Ray Dataset of evaluation rows (user, held-out items, training items to exclude) is ranked by 2 actors, each with
its own scorer built once by a factory; the driver adds the blocks' states as they stream in and estimates.
The same rows ranked in one process (``rank_block`` on every row at once) give the same estimates bit for bit.

Run: ``python examples/ray_at_scale.py`` (needs the ``ray`` extra: ``pip install "ray[data]>=2.44"``).
"""

import numpy as np
import pyarrow as pa
import ray
import torch

from reco_sampled_plugin import SamplingDesign
from reco_sampled_plugin.adapters.ray import Columns, Engine, Evaluation, batch_tensors, evaluate_dataset, rank_block

N_USERS, N_ITEMS, DIM = 2_000, 1_000, 16


class TwoTowerScorer:
    """A scorer factory: called once per actor with its device (``cuda`` when Ray gave the actor a GPU)."""

    def __init__(self, seed: int = 0) -> None:
        g = torch.Generator().manual_seed(seed)
        self.users = torch.randn(N_USERS, DIM, generator=g)
        self.items = torch.randn(N_ITEMS, DIM, generator=g) + torch.linspace(-1, 1, N_ITEMS).unsqueeze(1)

    def __call__(self, device: torch.device):
        users, items = self.users.to(device), self.items.to(device)

        @torch.no_grad()
        def scorer(u: torch.Tensor, i: torch.Tensor) -> torch.Tensor:  # (B,), (B, L) -> (B, L): the pairs only
            return (users[u].unsqueeze(1) * items[i]).sum(-1)

        return scorer


def evaluation_rows(seed: int = 1) -> pa.Table:
    """One row per user: 1-3 held-out items and 5-40 training items (list columns: Arrow's CSR form)."""
    rng = np.random.default_rng(seed)
    held, train = [], []
    for _ in range(N_USERS):
        drawn = rng.choice(N_ITEMS, size=int(rng.integers(6, 44)), replace=False)
        k = int(rng.integers(1, 4))
        held.append(drawn[:k])
        train.append(drawn[k:])
    return pa.table({"user": np.arange(N_USERS), "items": pa.array(held, pa.list_(pa.int64())),
                     "exclude": pa.array(train, pa.list_(pa.int64()))})


def main() -> None:
    started = not ray.is_initialized()
    if started:
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    rows = evaluation_rows()
    design = SamplingDesign(50, adaptive_max=400)  # adaptive: positives still first draw more, up to 400
    dataset = ray.data.from_arrow(rows).repartition(8)
    result = evaluate_dataset(dataset, TwoTowerScorer(), N_ITEMS, design, seed=42,
                              engine=Engine(workers=2, num_cpus=0.5, batch_size=256, progress=False))
    cpu = torch.device("cpu")
    one = Evaluation(rank_block(TwoTowerScorer()(cpu), *batch_tensors(rows, Columns(), N_ITEMS, cpu), N_ITEMS,
                                design, seed=42), design)
    for metric in ("ndcg@10", "recall@10"):
        est = result.estimate(metric)
        lo, hi = est.interval()
        same = (est.value, est.stderr) == (one.estimate(metric).value, one.estimate(metric).stderr)
        print(f"{metric:10s} {est.value:.5f} [{lo:.5f}, {hi:.5f}]  same as one process: {same}")
    cost = result.cost
    print(f"users {result.state.users}, pairs scored {cost.pairs} ({100 * cost.share_of_full:.1f}% of full ranking's "
          f"{cost.full_pairs}), {cost.calls} scorer calls; driver state {result.state.nbytes()} bytes")
    if started:
        ray.shutdown()


if __name__ == "__main__":
    main()
