#!/usr/bin/env bash
# The reco-sampled command line on a file of sampled ranks (one line per held-out item: rank,n_candidates).
#
#   bash examples/cli/estimate_from_ranks.sh [OUTDIR]
#
# 1. writes OUTDIR/ranks.csv: 2,000 held-out items of a synthetic recommender, each ranked against
#    m = 100 sampled irrelevant items among n = 1,000..2,000 candidates (what an NCF-style evaluation logs);
# 2. `reco-sampled estimate` turns them into corrected Recall@10 / NDCG@10 with their 95% intervals
#    (--stderr adds the standard error, sampling noise only);
# 3. `reco-sampled table` prints the bv correction table used for one n.
set -euo pipefail
OUT="${1:-$(mktemp -d)}"
mkdir -p "$OUT"
PYTHON="${PYTHON:-python}"

"$PYTHON" - "$OUT/ranks.csv" <<'PY'
import sys
import numpy as np
from reco_sampled_plugin.simulate import draw_sampled_ranks

rng = np.random.default_rng(0)
n = rng.integers(1000, 2001, size=2000)                                       # candidates per item
exact = np.clip(np.ceil(rng.beta(0.4, 4.0, size=2000) * n).astype(int), 1, n)  # exact ranks
sampled = draw_sampled_ranks(exact, n, 100, repeats=1, seed=1)[0]             # ranks among m = 100 samples
with open(sys.argv[1], "w") as fh:
    fh.writelines(f"{int(r)},{int(k)}\n" for r, k in zip(sampled, n))
ndcg = np.where(exact <= 10, 1.0 / np.log2(exact + 1.0), 0.0).mean()
print(f"exact values of these items: recall@10 {np.mean(exact <= 10):.4f}, ndcg@10 {ndcg:.4f}")
PY

reco-sampled estimate "$OUT/ranks.csv" -m 100 --metric recall@10 --metric ndcg@10
reco-sampled table recall@10 --n-items 1500 -m 100 --method bv --gamma 0.1 --out "$OUT/bv_table.csv"
echo "bv table for n = 1500, m = 100: $OUT/bv_table.csv ($(wc -l < "$OUT/bv_table.csv") lines)"
