"""Run BPR on MovieLens 100k with the plugin's metrics (offline: the data ships in RecBole's wheel).

    python examples/recbole/run_bpr_ml100k.py [--workdir DIR]

RecBole writes log/, log_tensorboard/ and saved/ under the working directory (default: a temporary one).
"""

from __future__ import annotations

import argparse
import os
import tempfile

from reco_sampled_plugin.adapters.recbole import run_recbole


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", default=None)
    args = parser.parse_args()
    here = os.path.dirname(os.path.abspath(__file__))
    import recbole

    data_path = os.path.join(os.path.dirname(recbole.__file__), "dataset_example")
    os.chdir(args.workdir or tempfile.mkdtemp(prefix="recbole_example_"))
    result = run_recbole(config_file_list=[os.path.join(here, "bpr_ml100k.yaml")], config_dict={"data_path": data_path})
    test = result["test_result"]
    print(f"{'key':32s} value")
    for key, value in test.items():
        print(f"{key:32s} {float(value):.4f}")
    print(f"\nRecBole Recall@10 (full): {float(test['recall@10']):.4f}; plugin, from {100} sampled items: "
          f"sampled {test['correctedrecall@10/sampled']:.4f}, corrected {test['correctedrecall@10/auto']:.4f} "
          f"(95% interval [{test['correctedrecall@10/auto_lo']:.4f}, {test['correctedrecall@10/auto_hi']:.4f}]), "
          f"exact target {test['correctedrecall@10/exact']:.4f}")


if __name__ == "__main__":
    main()
