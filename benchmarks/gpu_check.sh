#!/usr/bin/env bash
# The device check for a session lent a GPU (docs/gpu.md): the suite's CUDA parametrisations, then the benchmarks
# that have a CUDA mode. Each step is bounded by `timeout` so that one slow step cannot eat the others' time; the
# bounds add up to 545 s, inside one device command's 600 s (an H200, 2026-12-04: 84 / 22 / 28 / 24 / 25 / 33 / 28 /
# 31 s per step, 311 s with the start).
#
#   OUT=/tmp/gpu bash benchmarks/gpu_check.sh            # python3 = a Python with CUDA torch and the test extras
#
# Output: $OUT/env.txt, tests_cuda.txt, input_forms.txt, sampled_draws.txt, lightning_scale.txt, exact_metrics.txt
# and exact_compiled.txt (each with a profile of four replayed batches), call_overhead.txt.
# RecBole (its evaluator is a peer, four test modules import it) is not on a bare CUDA image: carry its wheel and the
# few it imports (`pip download --no-deps -d .whl recbole==1.2.1 colorlog==4.7.2 texttable thop`), install them with
# `pip install --no-deps --target /tmp/site .whl/*.whl` and set EXTRA_PYTHONPATH=/tmp/site.
set -u
OUT=${OUT:-/tmp/gpu_check}
PY=${PY:-python3}
mkdir -p "$OUT"
export PYTHONPATH="$PWD${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}" PYTHONDONTWRITEBYTECODE=1
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout "$limit" "$@" >>"$OUT/$name.txt" 2>&1; echo "[$name: rc $? in $((SECONDS - t0)) s] $*" | tee -a "$OUT/$name.txt"; }
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc
  $PY -c "import torch, numpy, scipy; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'numpy', numpy.__version__, 'scipy', scipy.__version__)"
} >"$OUT/env.txt" 2>&1
cat "$OUT/env.txt"
# every test parametrised on the cuda device (the `device` fixture), the CUDA-only tests included
step tests_cuda "${T_TESTS:-120}" $PY -m pytest -q -n "${WORKERS:-8}" -k cuda -p no:cacheprovider \
  --continue-on-collection-errors -W ignore::DeprecationWarning tests
tail -5 "$OUT/tests_cuda.txt"
step input_forms "${T_FORMS:-50}" $PY benchmarks/bench_input_forms.py --device cuda --batches 256,1024,4096 --repeats 5
for te in 16777216 268435456; do  # the accelerator tile (2^26 scores by default) against 2^24 and 2^28
  step input_forms 40 $PY benchmarks/bench_input_forms.py --device cuda --batches 1024,4096 --repeats 5 --tile-elements $te
done
step sampled_draws "${T_DRAWS:-45}" $PY benchmarks/bench_sampled_draws.py --device cuda --batches 256,1024,4096 --repeats 5
step lightning_scale "${T_LIGHTNING:-75}" $PY benchmarks/bench_lightning.py --scale --accelerator gpu --repeats 3
# this project against its peers on the same batches (RecBole's full-sort evaluator, torchmetrics' retrieval metrics;
# either left out when not installed), as shares of the score matmul
step exact_metrics "${T_EXACT:-70}" $PY benchmarks/bench_exact_metrics.py --device cuda --profile 4
# the same with the compiled counting kernels (auto stays eager on an accelerator below 2^42 comparisons)
step exact_compiled "${T_COMPILED:-60}" $PY benchmarks/bench_exact_metrics.py --device cuda --backend compiled \
  --users 8192 --skip-recbole --torchmetrics-users 0 --profile 4
# what each hot call costs beyond its work (operators, kernels, device time; replayed calls after two)
step call_overhead "${T_OVERHEAD:-45}" $PY benchmarks/bench_call_overhead.py --device cuda --batches 256,1024,4096
