"""RecBole's evaluation of BPR on ml-100k (full mode) with and without the plugin's metrics.

Usage: ``python benchmarks/bench_recbole.py [--repeats 15] [--epochs 1] [--m 100]``

Trains BPR once, then times ``Trainer.evaluate`` on the validation split (943 users, 1,683 items) for
RecBole's Recall/NDCG/MRR@10 alone and with the plugin's metrics added (exact ranks up to the top-10,
simulated uniform sampling with m items per held-out item, corrected and mapped estimates). The first
plugin evaluation builds the correction tables (cached afterwards); it is reported separately.
``--by-reference`` adds a third configuration: the plugin with CPU batches held by reference until the
evaluation ends (the path other devices take) instead of copied into its reused buffers as they arrive.
Fitted rank distributions (RankDist* metrics) are cleared before every evaluation: the same model evaluated
again would reuse its fit, a model in training changes every epoch. Correction tables stay cached (they
depend on n and m only). Run from any directory: RecBole's log/ and saved/ folders go to a temporary
directory.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--m", type=int, default=100, help="rsp_m in full mode (0: no simulated sampling)")
    parser.add_argument("--eval-batch-size", type=int, default=4096, help="RecBole's eval_batch_size (4096: its default, 2 users per batch)")
    parser.add_argument("--mode", default="full", help="RecBole's evaluation mode: full (default) or uniN / popN (e.g. uni100)")
    parser.add_argument("--plugin-metrics", default="CorrectedRecall,CorrectedNDCG,MappedHit",
                        help="comma-separated plugin metrics added to RecBole's Recall, NDCG, MRR")
    parser.add_argument("--without-replacement", action="store_true", help="simulated sampling without replacement (rsp_replacement: false)")
    parser.add_argument("--by-reference", action="store_true", help="also time the plugin holding CPU batches by reference")
    args = parser.parse_args()

    from reco_sampled_plugin import estimators
    from reco_sampled_plugin.adapters import _recbole_ranks as ranks
    import reco_sampled_plugin.adapters.recbole  # noqa: F401  (registers the plugin)

    import torch
    from recbole.trainer import Trainer

    recbole_metrics = ["Recall", "NDCG", "MRR"]
    plugin_metrics = recbole_metrics + [m for m in args.plugin_metrics.split(",") if m]
    config, valid, model = trained_bpr(args.epochs, args.eval_batch_size, args.mode)
    cfg_plain = config(metrics=recbole_metrics)
    cfg_plugin = config(metrics=plugin_metrics, rsp_m=args.m if args.mode == "full" and args.m else None,
                        rsp_replacement=not args.without_replacement)
    trainers = {"RecBole metrics only": Trainer(cfg_plain, model), "with the plugin's metrics": Trainer(cfg_plugin, model)}
    staged = {name: True for name in trainers}
    if args.by_reference:
        trainers["plugin, batches held by reference"] = trainers["with the plugin's metrics"]
        staged["plugin, batches held by reference"] = False

    t0 = time.perf_counter()
    trainers["with the plugin's metrics"].evaluate(valid, load_best_model=False)
    cold = time.perf_counter() - t0
    times: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(args.repeats):  # interleaved, so load on the machine hits both alike
        for name, trainer in trainers.items():
            ranks._STAGE_ON_CPU = staged[name]
            estimators._FITS.clear()  # a trained model changes every epoch: rank distributions are refitted
            t0 = time.perf_counter()
            trainer.evaluate(valid, load_best_model=False)
            times[name].append(time.perf_counter() - t0)
    med = {name: statistics.median(v) for name, v in times.items()}
    best = {name: min(v) for name, v in times.items()}
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, repeats {args.repeats}, mode {args.mode}, m = {args.m}, "
          f"eval_batch_size {args.eval_batch_size}, load average {os.getloadavg()[0]:.1f}")
    print("| configuration | median (ms) | best (ms) |")
    print("|---|---|---|")
    for name in trainers:
        print(f"| {name} | {1e3 * med[name]:.1f} | {1e3 * best[name]:.1f} |")
    base_name = next(iter(trainers))
    for plug_name in list(trainers)[1:]:
        paired = statistics.median(p / b for b, p in zip(times[base_name], times[plug_name]))  # drift hits both alike
        added = statistics.median(p - b for b, p in zip(times[base_name], times[plug_name]))
        print(f"{plug_name}: overhead median {100 * (med[plug_name] / med[base_name] - 1):+.1f}%, "
              f"best {100 * (best[plug_name] / best[base_name] - 1):+.1f}%, median of the {args.repeats} paired ratios {100 * (paired - 1):+.1f}% "
              f"({1e3 * added:+.1f} ms)")
    print(f"first plugin evaluation (builds the correction tables): {1e3 * cold:.0f} ms")


def trained_bpr(epochs: int, eval_batch_size: int, mode: str = "full"):
    """BPR trained on ml-100k (the copy in RecBole's wheel), in a temporary working directory: a function
    that builds a RecBole ``Config`` from extra keys, the validation dataloader, and the model."""
    import recbole
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.trainer import Trainer
    from recbole.utils import get_model, init_seed

    base = {
        "data_path": os.path.join(os.path.dirname(recbole.__file__), "dataset_example"),
        "device": "cpu", "use_gpu": False, "show_progress": False, "epochs": epochs,
        "embedding_size": 64, "learning_rate": 0.01, "topk": [10], "valid_metric": "Recall@10",
        "eval_batch_size": eval_batch_size, "eval_args": {"mode": mode},
    }
    os.chdir(tempfile.mkdtemp(prefix="bench_recbole_"))

    def config(**extra):
        return Config(model="BPR", dataset="ml-100k", config_dict={**base, **extra})

    cfg = config(metrics=["Recall"])
    init_seed(cfg["seed"], True)
    train, valid, _ = data_preparation(cfg, create_dataset(cfg))
    model = get_model("BPR")(cfg, train._dataset)
    Trainer(cfg, model).fit(train, None, saved=False, show_progress=False)
    return config, valid, model


if __name__ == "__main__":
    main()
