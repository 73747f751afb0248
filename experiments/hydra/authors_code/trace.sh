#!/usr/bin/env bash
# The step trace (trace_jsfl.py, trace_authors.py, trace_compare.py): SFL's
# first server steps on MobileNetV1 x0.5 in both codes from the same weights,
# batches and order, in float64 and float32; writes
# experiments/hydra/authors_code/results/trace_mobilenet.json.
# Usage (repository root): bash experiments/hydra/authors_code/trace.sh [WORK_DIR]
# Env: PY (jsfl's python, default .venv/bin/python), TORCH_PY (the authors'
# venv's, default /work/authors/venv/bin/python), CLONE (their adapted clone).
set -euo pipefail
here=experiments/hydra/authors_code
work=${1:-/tmp/jsfl_trace}
py=${PY:-.venv/bin/python}
tpy=${TORCH_PY:-/work/authors/venv/bin/python}
mkdir -p "$work"
export OMP_NUM_THREADS=1
"$py" $here/trace_jsfl.py "$work/jsfl64.npz" --x64
"$py" $here/trace_jsfl.py "$work/jsfl32.npz" --like "$work/jsfl64.npz"
"$tpy" $here/trace_authors.py "$work/jsfl64.npz" "$work/authors64.npz" --f64 | grep '^trace_authors'
"$tpy" $here/trace_authors.py "$work/jsfl64.npz" "$work/authors32.npz" | grep '^trace_authors'
"$py" $here/trace_compare.py $here/results/trace_mobilenet.json \
  authors64="$work/authors64.npz" jsfl64="$work/jsfl64.npz" \
  authors32="$work/authors32.npz" jsfl32="$work/jsfl32.npz"
