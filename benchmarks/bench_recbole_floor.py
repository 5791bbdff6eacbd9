"""Where the RecBole adapter's overhead goes in full mode, step by step, against what each step must cost.

Usage: ``python benchmarks/bench_recbole_floor.py [--repeats 100] [--eval-batch-size 4096]``

Part 1, inside RecBole's loop. BPR on ml-100k is trained once; ``Trainer.evaluate`` (full mode, RecBole's
Recall/NDCG/MRR only) is timed with the per-batch hook the plugin installs replaced, in turn, by: nothing;
one copy of the batch's scores into a reused buffer (what any design that ranks after the loop must keep);
that copy and ``positive_u``; and ``positive_i``; and the rows' user ids; the plugin's own staging
(``_Staging.add``, the same four copies with its checks). Evaluations alternate; each variant is reported
as the median of its paired differences from "nothing". No ranking happens here: this is the price of
keeping each batch's data.

Part 2, when the evaluation ends. The plugin's steps are timed alone on one evaluation's gathered batches
(every positive of the validation split): exact counts (one compiled pass over every positive's row), the
other positives' counts, the binomial draws of the simulated sampled ranks (m = 100), the whole
per-positive table, and the three estimated metrics of ``bench_recbole.py`` with their side-by-side values.
Timed alone, with warm caches; after RecBole's loop they cost more (compare ``bench_recbole.py``).
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np


def _median_ms(fn, repeats: int) -> float:
    fn()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--eval-batch-size", type=int, default=4096, help="RecBole's eval_batch_size (4096: its default)")
    args = parser.parse_args()

    import torch
    from bench_recbole import trained_bpr
    from recbole.evaluator.collector import DataStruct
    from recbole.trainer import Trainer

    import reco_sampled_plugin.adapters.recbole as rb
    from reco_sampled_plugin.adapters import _recbole_metrics as metrics
    from reco_sampled_plugin.adapters import _recbole_ranks as ranks

    config, valid, model = trained_bpr(1, args.eval_batch_size)
    plain = Trainer(config(metrics=["Recall", "NDCG", "MRR"]), model)
    plugin_metrics = ["CorrectedRecall", "CorrectedNDCG", "MappedHit"]
    plugin_config = config(metrics=["Recall", "NDCG", "MRR", *plugin_metrics], rsp_m=100)
    plugin = Trainer(plugin_config, model)

    # ---- part 1: per-batch hooks that keep a batch's data, without ranking
    state = {"scores": np.empty(1 << 23, np.float32), "pu": np.empty(1 << 20, np.int64), "pi": np.empty(1 << 20, np.int64),
             "uid": np.empty(1 << 16, np.int64), "p": 0, "q": 0, "r": 0}
    uid_field = plain.config["USER_ID_FIELD"]

    def keep(scores, interaction, positive_u, positive_i, parts: int) -> None:
        a = scores.numpy()
        p = state["p"]
        state["scores"][p : p + a.size] = a.reshape(-1)
        state["p"] = p + a.size
        if parts >= 1:
            q = state["q"]
            u = positive_u.numpy()
            state["pu"][q : q + u.shape[0]] = u
            if parts >= 2:
                state["pi"][q : q + u.shape[0]] = positive_i.numpy()
            state["q"] = q + u.shape[0]
        if parts >= 3:
            r = state["r"]
            state["uid"][r : r + a.shape[0]] = interaction.interaction[uid_field].numpy()
            state["r"] = r + a.shape[0]

    stage = ranks._Staging()

    def staging(collector, scores, interaction, positive_u, positive_i) -> None:
        if stage.nrows == 0:
            stage.open(scores, scores.numpy(), uid_field)
        stage.add(scores, interaction, positive_u, positive_i)

    hooks = {
        "nothing": lambda *a: None,
        "copy the scores": lambda c, s, i, u, p: keep(s, i, u, p, 0),
        "+ positive_u": lambda c, s, i, u, p: keep(s, i, u, p, 1),
        "+ positive_i": lambda c, s, i, u, p: keep(s, i, u, p, 2),
        "+ user ids": lambda c, s, i, u, p: keep(s, i, u, p, 3),
        "the plugin's staging": staging,
    }
    real_hook = rb.collect_batch
    times: dict[str, list[float]] = {name: [] for name in hooks}
    try:
        for rep in range(args.repeats + 3):  # 3 warm-up rounds
            for name, hook in hooks.items():
                rb.collect_batch = hook
                state["p"] = state["q"] = state["r"] = 0
                stage.nrows = 0
                t0 = time.perf_counter()
                plain.evaluate(valid, load_best_model=False)
                if rep >= 3:
                    times[name].append(time.perf_counter() - t0)
    finally:
        rb.collect_batch = real_hook
    base = times["nothing"]
    print(f"torch {torch.__version__}, threads {torch.get_num_threads()}, repeats {args.repeats}, eval_batch_size {args.eval_batch_size}")
    print(f"RecBole's evaluation (Recall/NDCG/MRR, per-batch hook doing nothing): median {1e3 * statistics.median(base):.1f} ms")
    print("| per-batch hook | added to the evaluation (ms, median of paired differences) |")
    print("|---|---|")
    for name in list(hooks)[1:]:
        print(f"| {name} | {1e3 * statistics.median(t - b for t, b in zip(times[name], base)):+.2f} |")

    # ---- part 2: the end-of-evaluation steps, alone, on one evaluation's gathered batches
    captured = {}
    process_full = ranks._process_full

    def capture(collector, scores, pos_u, pos_i, uids):
        captured.update(collector=collector, args=(scores.clone(), pos_u.clone(), pos_i.clone(), uids.clone()))
        return process_full(collector, scores, pos_u, pos_i, uids)

    ranks._process_full = capture
    try:
        plugin.evaluate(valid, load_best_model=False)
    finally:
        ranks._process_full = process_full
    collector = captured["collector"]
    scores, pos_u, pos_i, uids = captured["args"]
    counts = torch.bincount(pos_u, minlength=scores.shape[0])
    s_pos = scores[pos_u, pos_i]
    ge, _, n_full = ranks._full_counts(scores, pos_u, s_pos, "pessimistic")
    other_ge, _ = ranks._other_positive_counts(pos_u, s_pos, counts)
    n_irr = (n_full - counts + 1)[pos_u]
    generator = torch.Generator().manual_seed(0)
    collector._rsp_settings_now = ranks._settings(plugin_config)

    def whole_table():
        collector._rsp_user_offset = 0
        process_full(collector, scores, pos_u, pos_i, uids)
        return collector.__dict__.pop("_rsp_tables")[0]

    table = whole_table()
    metric_objects = [metrics._METRIC_CLASSES[name.lower()](plugin_config) for name in plugin_metrics]

    def estimated_metrics():
        struct = DataStruct()
        struct.set(ranks.PLUGIN_KEY, table.clone())  # a fresh table: nothing cached from the last round (its
        # histogram, and the fits kept on it, are new)
        for metric in metric_objects:
            metric.calculate_metric(struct)

    steps = {
        "exact counts (compiled, one pass per positive's row)": lambda: ranks._full_counts(scores, pos_u, s_pos, "pessimistic"),
        "other positives' counts": lambda: ranks._other_positive_counts(pos_u, s_pos, counts),
        "binomial draws (m = 100)": lambda: ranks._binomial_sampled(ge - 1 - other_ge, ge - other_ge, n_irr - 1, 100, "pessimistic", generator),
        "whole per-positive table (the three above included)": whole_table,
        f"estimated metrics ({', '.join(plugin_metrics)}, side by side)": estimated_metrics,
    }
    print(f"\n{pos_u.shape[0]} positives of {scores.shape[0]} users, {scores.shape[1]} items; each step alone:")
    print("| step when the evaluation ends | median (ms) |")
    print("|---|---|")
    for name, fn in steps.items():
        print(f"| {name} | {_median_ms(fn, args.repeats):.2f} |")


if __name__ == "__main__":
    main()
