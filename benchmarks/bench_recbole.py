"""RecBole's evaluation of BPR (full mode) with and without the plugin's metrics: ml-100k, or a synthetic catalogue.

Usage::

    python benchmarks/bench_recbole.py [--repeats 15] [--epochs 1] [--m 100]          # ml-100k
    python benchmarks/bench_recbole.py --synthetic [--users 20000] [--items 50000]     # synthetic, per family

**ml-100k** (default): trains BPR once, then times ``Trainer.evaluate`` on the validation split (943 users,
1,683 items) for RecBole's Recall/NDCG/MRR@10 alone and with the plugin's metrics added (exact ranks up to the
top-10, simulated uniform sampling with m items per held-out item, corrected and mapped estimates). The first
plugin evaluation builds the correction tables (cached afterwards); it is reported separately.
``--by-reference`` adds a third configuration: the plugin with CPU batches held by reference until the
evaluation ends (the path other devices take) instead of copied into its reused buffers as they arrive.

**--synthetic**: the overhead where evaluation costs something. A RecBole atomic ``.inter`` file is
written into a temporary directory: ``--users`` users (20,000) x ``--items`` items (50,000), each user with
10 + Poisson(``--per-user`` - 10) item draws (mean 50) from a Zipf popularity law p(i) ~ i^-``--zipf`` (0.8)
over a random permutation of the item ids, duplicates within a user dropped (numpy ``default_rng(--seed)``,
seed 0). RecBole loads it with its defaults (random 80/10/10 split per user, full-sort evaluation, ``--users-per-batch``
users per evaluation batch: 256 by default; RecBole's default eval_batch_size gives one user per batch at this
size, where its own per-batch costs, e.g. its collector's growing ``torch.cat``, dominate). BPR is
trained ``--epochs`` epochs (0 by default: evaluation is what is timed; the scores of an untrained BPR are as
costly to rank), then the validation split is evaluated ``--repeats`` times (3) per configuration, interleaved:
RecBole's Recall/NDCG/MRR@10 alone, then with each family of the plugin's metrics added (``Exact*``,
``Corrected*``, ``RankDist*``, ``Mapped*``, and all four), ``rsp_m`` = ``--m``. Each configuration is
evaluated once before timing (correction tables, compiled counting kernels). ``--profile`` prints the
cProfile of one evaluation with all four families instead.

**--example**: the shipped example as users meet it (examples/recbole/bpr_ml100k.yaml: its metrics and ``rsp_*``
keys, BPR trained ``--epochs`` epochs (1), ml-100k split 80/10/10 per user: every user's training items are
excluded, so the validation users have hundreds of distinct candidate counts n). Each run is a fresh process
(nothing cached): the first ``Trainer.evaluate`` and a second one are timed, with RecBole's Recall/NDCG/MRR@10
alone and with the example's metrics; ``--repeats`` (3) runs of each, alternating. The goal: the
first evaluation adds at most 25% or 0.5 s (whichever is larger) to RecBole's own.

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

RECBOLE_METRICS = ["Recall", "NDCG", "MRR"]
#: the plugin's metric families as the synthetic mode adds them to RecBole's metrics
FAMILY_METRICS = {
    "Exact*": ["ExactRecall", "ExactNDCG", "ExactMRR"],
    "Corrected*": ["CorrectedRecall", "CorrectedNDCG"],
    "RankDist*": ["RankDistRecall", "RankDistNDCG"],
    "Mapped*": ["MappedRecall", "MappedHit"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=None, help="timed evaluations per configuration (15; synthetic: 3)")
    parser.add_argument("--epochs", type=int, default=None, help="BPR training epochs (1; synthetic: 0)")
    parser.add_argument("--m", type=int, default=100, help="rsp_m in full mode (0: no simulated sampling)")
    parser.add_argument("--eval-batch-size", type=int, default=None, help="RecBole's eval_batch_size (ml-100k: 4096, its "
                        "default; full sort puts max(1, eval_batch_size // items) users in a batch)")
    parser.add_argument("--users-per-batch", type=int, default=256, help="synthetic, without --eval-batch-size: "
                        "eval_batch_size = this x (items + 1)")
    parser.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    parser.add_argument("--mode", default="full", help="RecBole's evaluation mode: full (default) or uniN / popN (e.g. uni100)")
    parser.add_argument("--plugin-metrics", default="CorrectedRecall,CorrectedNDCG,MappedHit",
                        help="ml-100k: comma-separated plugin metrics added to RecBole's Recall, NDCG, MRR")
    parser.add_argument("--without-replacement", action="store_true", help="simulated sampling without replacement (rsp_replacement: false)")
    parser.add_argument("--by-reference", action="store_true", help="also time the plugin holding CPU batches by reference")
    parser.add_argument("--synthetic", action="store_true", help="a synthetic catalogue instead of ml-100k, one configuration per family")
    parser.add_argument("--users", type=int, default=20_000)
    parser.add_argument("--items", type=int, default=50_000)
    parser.add_argument("--per-user", type=int, default=50, help="mean item draws per user (synthetic)")
    parser.add_argument("--zipf", type=float, default=0.8, help="popularity exponent of the synthetic item draws")
    parser.add_argument("--seed", type=int, default=0, help="seed of the synthetic interactions")
    parser.add_argument("--families", default="Exact*,Corrected*,RankDist*,Mapped*,all",
                        help="synthetic: the configurations timed besides RecBole's own metrics")
    parser.add_argument("--profile", action="store_true", help="synthetic: cProfile one evaluation with every family instead")
    parser.add_argument("--example", action="store_true", help="the shipped example's config, first evaluation in fresh processes")
    parser.add_argument("--example-once", choices=("plain", "plugin"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.example_once:
        example_once(args.example_once, args.epochs if args.epochs is not None else 1)
        return
    if args.example:
        example(args.repeats or 3, args.epochs if args.epochs is not None else 1)
        return
    repeats = args.repeats if args.repeats is not None else (3 if args.synthetic else 15)
    eval_batch_size = args.eval_batch_size or (args.users_per_batch * (args.items + 1) if args.synthetic else 4096)
    epochs = args.epochs if args.epochs is not None else (0 if args.synthetic else 1)

    from reco_sampled_plugin.adapters import _recbole_ranks as ranks
    import reco_sampled_plugin.adapters.recbole  # noqa: F401  (registers the plugin)

    time_the_plugin()

    import torch
    from recbole.trainer import Trainer

    if args.threads:
        torch.set_num_threads(args.threads)

    if args.synthetic:
        workdir = tempfile.mkdtemp(prefix="bench_recbole_")
        stats = synthetic_inter(os.path.join(workdir, "data"), args.users, args.items, args.per_user, args.zipf, args.seed)
        config, valid, model = trained_bpr(epochs, eval_batch_size, args.mode, dataset="rsp_synthetic",
                                           data_path=os.path.join(workdir, "data"), workdir=workdir)
        plugin_keys = {"rsp_m": args.m or None, "rsp_replacement": not args.without_replacement}
        trainers = {"RecBole metrics only": Trainer(config(metrics=RECBOLE_METRICS), model)}
        for family in [f for f in args.families.split(",") if f]:
            extra = sum(FAMILY_METRICS.values(), []) if family == "all" else FAMILY_METRICS[family]
            keys = plugin_keys if family != "Exact*" else {}
            trainers[f"+ {family}"] = Trainer(config(metrics=RECBOLE_METRICS + extra, **keys), model)
        staged = {name: True for name in trainers}
        header = (f"synthetic: {stats}, eval users {valid._dataset.user_num - 1}, items {valid._dataset.item_num - 1}, "
                  f"users per batch {valid.step}")
        if args.profile:
            profile(trainers[list(trainers)[-1]], valid)
            return
    else:
        recbole_metrics = RECBOLE_METRICS
        plugin_metrics = recbole_metrics + [m for m in args.plugin_metrics.split(",") if m]
        config, valid, model = trained_bpr(epochs, eval_batch_size, args.mode)
        cfg_plain = config(metrics=recbole_metrics)
        cfg_plugin = config(metrics=plugin_metrics, rsp_m=args.m if args.mode == "full" and args.m else None,
                            rsp_replacement=not args.without_replacement)
        trainers = {"RecBole metrics only": Trainer(cfg_plain, model), "with the plugin's metrics": Trainer(cfg_plugin, model)}
        staged = {name: True for name in trainers}
        if args.by_reference:
            trainers["plugin, batches held by reference"] = trainers["with the plugin's metrics"]
            staged["plugin, batches held by reference"] = False
        header = "ml-100k"

    cold = {}
    for name, trainer in trainers.items():  # first evaluations: correction tables, compiled kernels
        if name == "RecBole metrics only" and not args.synthetic:
            continue
        t0 = time.perf_counter()
        trainer.evaluate(valid, load_best_model=False)
        cold[name] = time.perf_counter() - t0
        if not args.synthetic:
            break
    times: dict[str, list[float]] = {name: [] for name in trainers}
    cpu: dict[str, list[float]] = {name: [] for name in trainers}
    own: dict[str, list[float]] = {name: [] for name in trainers}
    for _ in range(repeats):  # interleaved, so load on the machine hits every configuration alike
        for name, trainer in trainers.items():
            ranks._STAGE_ON_CPU = staged[name]
            # each evaluation counts into new histograms, which keep no fit from the last one: refitted, as after an
            # epoch of training
            PLUGIN_CPU[0] = 0.0
            c0, t0 = time.thread_time(), time.perf_counter()
            trainer.evaluate(valid, load_best_model=False)
            times[name].append(time.perf_counter() - t0)
            cpu[name].append(time.thread_time() - c0)
            own[name].append(PLUGIN_CPU[0])
    ranks._STAGE_ON_CPU = True
    med = {name: statistics.median(v) for name, v in times.items()}
    best = {name: min(v) for name, v in times.items()}
    print(f"{header}; torch {torch.__version__}, threads {torch.get_num_threads()}, repeats {repeats}, mode {args.mode}, "
          f"m = {args.m}, eval_batch_size {eval_batch_size}, epochs {epochs}, load average {os.getloadavg()[0]:.1f}")
    print("| configuration | median (ms) | best (ms) | overhead, median of paired ratios |")
    print("|---|---|---|---|")
    base_name = next(iter(trainers))
    for name in trainers:
        paired = statistics.median(p / b for b, p in zip(times[base_name], times[name]))  # drift hits both alike
        print(f"| {name} | {1e3 * med[name]:.1f} | {1e3 * best[name]:.1f} | {100 * (paired - 1):+.1f}% |")
    for plug_name in list(trainers)[1:]:
        added = statistics.median(p - b for b, p in zip(times[base_name], times[plug_name]))
        print(f"{plug_name}: overhead median {100 * (med[plug_name] / med[base_name] - 1):+.1f}%, "
              f"best {100 * (best[plug_name] / best[base_name] - 1):+.1f}% ({1e3 * added:+.1f} ms)")
    if args.threads == 1:  # the calling thread does all the work: its CPU time is robust to a loaded machine
        base_cpu = statistics.median(cpu[base_name])
        print("CPU time of the evaluating thread (--threads 1; the plugin's own part: its collector hooks and metrics):")
        print("| configuration | evaluation CPU (ms) | plugin's part (ms) | plugin's part / RecBole-only evaluation |")
        print("|---|---|---|---|")
        for name in trainers:
            part = statistics.median(own[name])
            print(f"| {name} | {1e3 * statistics.median(cpu[name]):.0f} | {1e3 * part:.0f} | {100 * part / base_cpu:+.1f}% |")
    for name, seconds in cold.items():
        print(f"first evaluation, {name} (correction tables, compiled kernels): {1e3 * seconds:.0f} ms")


EXAMPLE = os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "examples", "recbole", "bpr_ml100k.yaml")


def example_once(kind: str, epochs: int) -> None:
    """One fresh process: train BPR with the example's config, time the first and a second evaluation (JSON)."""
    import json

    import recbole
    import yaml
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.trainer import Trainer
    from recbole.utils import get_model, init_seed

    import reco_sampled_plugin.adapters.recbole  # noqa: F401  (registers the plugin)

    with open(EXAMPLE) as f:
        cfg_file = yaml.safe_load(f)
    extra = {"data_path": os.path.join(os.path.dirname(recbole.__file__), "dataset_example"), "epochs": epochs,
             "show_progress": False}
    if kind == "plain":  # RecBole's own metrics only, no rsp_* keys
        cfg_file = {k: v for k, v in cfg_file.items() if not k.startswith("rsp_")}
        cfg_file.update(metrics=RECBOLE_METRICS, valid_metric="Recall@10")
    os.chdir(tempfile.mkdtemp(prefix="bench_recbole_"))
    config = Config(model=cfg_file.pop("model"), dataset=cfg_file.pop("dataset"), config_dict={**cfg_file, **extra})
    init_seed(config["seed"], True)
    train, valid, _ = data_preparation(config, create_dataset(config))
    model = get_model(config["model"])(config, train._dataset)
    trainer = Trainer(config, model)
    if epochs > 0:
        trainer.fit(train, None, saved=False, show_progress=False)
    out = {}
    for label in ("first", "second"):
        t0 = time.perf_counter()
        result = trainer.evaluate(valid, load_best_model=False)
        out[label] = time.perf_counter() - t0
    out["keys"] = len(result)
    print(json.dumps(out))


def example(repeats: int, epochs: int) -> None:
    import json
    import subprocess
    import sys

    runs: dict[str, list[dict]] = {"plain": [], "plugin": []}
    for _ in range(repeats):
        for kind in runs:
            out = subprocess.run([sys.executable, os.path.abspath(__file__), "--example-once", kind, "--epochs", str(epochs)],
                                 check=True, capture_output=True, text=True).stdout
            runs[kind].append(json.loads(out.strip().splitlines()[-1]))
    med = {k: {lab: statistics.median(r[lab] for r in v) for lab in ("first", "second")} for k, v in runs.items()}
    print(f"shipped example (examples/recbole/bpr_ml100k.yaml), BPR {epochs} epoch(s), fresh process per run, medians of "
          f"{repeats}; load average {os.getloadavg()[0]:.1f}")
    print("| evaluation | RecBole's metrics only (ms) | the example's metrics (ms) | added |")
    print("|---|---|---|---|")
    for lab in ("first", "second"):
        p, q = med["plain"][lab], med["plugin"][lab]
        print(f"| {lab} | {p * 1e3:.0f} | {q * 1e3:.0f} | {(q - p) * 1e3:+.0f} ms ({(q / p - 1) * 100:+.0f}%) |")
    print(f"result keys: {runs['plain'][0]['keys']} vs {runs['plugin'][0]['keys']}; goal for the first evaluation: "
          f"at most +max(25%, 0.5 s)")


PLUGIN_CPU = [0.0]  # CPU seconds of the evaluating thread inside the plugin's hooks and metrics (timed())


def timed(fn):
    """``fn`` adding the calling thread's CPU time to PLUGIN_CPU (not nested: the hooks do not call each other)."""
    def wrapper(*args, **kwargs):
        c0 = time.thread_time()
        try:
            return fn(*args, **kwargs)
        finally:
            PLUGIN_CPU[0] += time.thread_time() - c0

    return wrapper


def time_the_plugin() -> None:
    """Wrap the plugin's collector hooks (as the RecBole adapter calls them) and metric computation."""
    from reco_sampled_plugin.adapters import _recbole_metrics as metrics
    from reco_sampled_plugin.adapters import recbole as rb

    rb.collect_batch, rb.finish_collection = timed(rb.collect_batch), timed(rb.finish_collection)
    metrics._Metric.calculate_metric = timed(metrics._Metric.calculate_metric)


def synthetic_inter(data_path: str, users: int, items: int, per_user: int, zipf: float, seed: int) -> str:
    """Write ``<data_path>/rsp_synthetic/rsp_synthetic.inter`` (RecBole's atomic format): user u draws
    10 + Poisson(per_user - 10) items from p(i) ~ rank(i)^-zipf (item ids a random permutation of the
    popularity ranks), duplicates dropped. Returns a one-line description."""
    import numpy as np

    rng = np.random.default_rng(seed)
    draws = 10 + rng.poisson(max(per_user - 10, 0), users)
    pop = np.arange(1, items + 1, dtype=np.float64) ** -zipf
    item_of_rank = rng.permutation(items)
    user = np.repeat(np.arange(users, dtype=np.int64), draws)
    item = item_of_rank[rng.choice(items, size=user.shape[0], p=pop / pop.sum())]
    pairs = np.unique(user * items + item)
    user, item = pairs // items, pairs % items
    folder = os.path.join(data_path, "rsp_synthetic")
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, "rsp_synthetic.inter"), "w") as f:
        f.write("user_id:token\titem_id:token\n")
        np.savetxt(f, np.column_stack([user, item]), fmt="%d", delimiter="\t")
    return (f"{users:,} users x {items:,} items (zipf {zipf}, seed {seed}), {pairs.shape[0]:,} interactions "
            f"({pairs.shape[0] / users:.1f} per user), {np.unique(item).shape[0]:,} items used")


def trained_bpr(epochs: int, eval_batch_size: int, mode: str = "full", dataset: str = "ml-100k",
                data_path: str | None = None, workdir: str | None = None):
    """BPR trained on ``dataset`` (default ml-100k, the copy in RecBole's wheel), in a temporary working
    directory: a function that builds a RecBole ``Config`` from extra keys, the validation dataloader, and
    the model."""
    import recbole
    from recbole.config import Config
    from recbole.data import create_dataset, data_preparation
    from recbole.trainer import Trainer
    from recbole.utils import get_model, init_seed

    base = {
        "data_path": data_path or os.path.join(os.path.dirname(recbole.__file__), "dataset_example"),
        "device": "cpu", "use_gpu": False, "show_progress": False, "epochs": epochs,
        "embedding_size": 64, "learning_rate": 0.01, "topk": [10], "valid_metric": "Recall@10",
        "eval_batch_size": eval_batch_size, "eval_args": {"mode": mode},
    }
    os.chdir(workdir or tempfile.mkdtemp(prefix="bench_recbole_"))

    def config(**extra):
        return Config(model="BPR", dataset=dataset, config_dict={**base, **extra})

    cfg = config(metrics=["Recall"])
    init_seed(cfg["seed"], True)
    train, valid, _ = data_preparation(cfg, create_dataset(cfg))
    model = get_model("BPR")(cfg, train._dataset)
    if epochs > 0:
        Trainer(cfg, model).fit(train, None, saved=False, show_progress=False)
    return config, valid, model


def profile(trainer, valid) -> None:
    """cProfile of one evaluation (after a first one: correction tables, compiled kernels; its histograms are new,
    so their rank distributions are fitted again)."""
    import cProfile
    import pstats

    trainer.evaluate(valid, load_best_model=False)
    prof = cProfile.Profile()
    prof.enable()
    trainer.evaluate(valid, load_best_model=False)
    prof.disable()
    pstats.Stats(prof).sort_stats("cumulative").print_stats(45)
    pstats.Stats(prof).sort_stats("tottime").print_stats(25)


if __name__ == "__main__":
    main()
