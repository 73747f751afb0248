#!/usr/bin/env bash
# The step trace (trace_jsfl.py, trace_authors.py, trace_compare.py): SFL on
# MobileNetV1 x0.5 in both codes from the same weights, batches and order.
#  1. the first server steps at the setting's lr 0.05, float64 and float32
#     -> results/trace_mobilenet.json
#  2. at lr 0.001 (floor 0.0001), where the steps are not chaotic: the first
#     server steps and two whole rounds of one batch a client (aggregation,
#     next round, lr decay), float64 -> results/trace_mobilenet_lr0.001.json
#  3. whole rounds of several batches a client, float64 at lr 0.001: the
#     random order (the authors' per-step picks among clients with batches
#     left), one round of 8 batches a client -> results/trace_mobilenet_random.json;
#     the cyclic order with all 9 batches, against jsfl itself from a start
#     1e-11 away -> results/trace_mobilenet_9batches.json
# Usage (repository root): bash experiments/hydra/authors_code/trace.sh [WORK_DIR]
# (~25 min on 2 cores).  Env: PY (jsfl's python, default .venv/bin/python),
# TORCH_PY (the authors' venv's, default /work/authors/venv/bin/python),
# CLONE (their adapted clone).
set -euo pipefail
here=experiments/hydra/authors_code
work=${1:-/tmp/jsfl_trace}
py=${PY:-.venv/bin/python}
tpy=${TORCH_PY:-/work/authors/venv/bin/python}
mkdir -p "$work"
export OMP_NUM_THREADS=1
authors() { "$tpy" $here/trace_authors.py "$@" | grep '^trace_authors'; }

"$py" $here/trace_jsfl.py "$work/jsfl64.npz" --x64
"$py" $here/trace_jsfl.py "$work/jsfl32.npz" --like "$work/jsfl64.npz"
authors "$work/jsfl64.npz" "$work/authors64.npz" --f64
authors "$work/jsfl64.npz" "$work/authors32.npz"
"$py" $here/trace_compare.py $here/results/trace_mobilenet.json \
  authors64="$work/authors64.npz" jsfl64="$work/jsfl64.npz" \
  authors32="$work/authors32.npz" jsfl32="$work/jsfl32.npz"

slow=(--lr 0.001 --lr-min 0.0001)
"$py" $here/trace_jsfl.py "$work/jsfl64_slow.npz" --x64 --rounds 2 "${slow[@]}"
authors "$work/jsfl64_slow.npz" "$work/authors64_slow_steps.npz" --f64 "${slow[@]}"
authors "$work/jsfl64_slow.npz" "$work/authors64_slow_rounds.npz" --f64 --rounds "${slow[@]}"
"$py" $here/trace_compare.py $here/results/trace_mobilenet_lr0.001.json \
  authors64="$work/authors64_slow_steps.npz" jsfl64="$work/jsfl64_slow.npz" \
  authors64_rounds="$work/authors64_slow_rounds.npz"
"$py" $here/trace_compare.py $here/results/trace_mobilenet_lr0.001_rounds.json \
  authors64_rounds="$work/authors64_slow_rounds.npz" jsfl64="$work/jsfl64_slow.npz"

"$py" $here/trace_jsfl.py "$work/jsfl64_random.npz" --x64 --order random --rounds 1 --batches 8 "${slow[@]}"
authors "$work/jsfl64_random.npz" "$work/authors64_random.npz" --f64 --rounds "${slow[@]}"
"$py" $here/trace_compare.py $here/results/trace_mobilenet_random.json \
  authors64_rounds="$work/authors64_random.npz" jsfl64="$work/jsfl64_random.npz"
"$py" $here/trace_jsfl.py "$work/jsfl64_9.npz" --x64 --rounds 1 --batches 9 --steps 1 "${slow[@]}"
"$py" $here/trace_jsfl.py "$work/jsfl64_9_perturbed.npz" --x64 --rounds 1 --batches 9 --steps 1 \
  --perturb 1e-11 "${slow[@]}"
authors "$work/jsfl64_9.npz" "$work/authors64_9.npz" --f64 --rounds "${slow[@]}"
"$py" $here/trace_compare.py $here/results/trace_mobilenet_9batches.json \
  jsfl64="$work/jsfl64_9.npz" authors64_rounds="$work/authors64_9.npz" \
  jsfl64_perturbed="$work/jsfl64_9_perturbed.npz"
