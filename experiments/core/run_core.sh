#!/usr/bin/env bash
# Reproduces the core engine's acceptance figures (README of experiments/core).
# Usage: bash experiments/core/run_core.sh [OUT_DIR]   (default runs/core)
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${1:-runs/core}
jsfl=${JSFL:-.venv/bin/jsfl}
$jsfl run experiments/core/fmnist_iid.toml method.name=sfl run.name=sfl_iid run.out_dir=$out --quiet
$jsfl run experiments/core/fmnist_iid.toml method.name=fedavg run.name=fedavg_iid run.out_dir=$out --quiet
$jsfl run experiments/core/fmnist_dl80_cyclic.toml run.name=sfl_dl80_cyclic run.out_dir=$out --quiet
# Shallow cut (the Hydra paper's setting for intra-round forgetting): the
# server holds conv2 and both dense layers instead of only the dense layers.
$jsfl run experiments/core/fmnist_iid.toml model.cut=1 run.name=sfl_iid_cut1 run.out_dir=$out --quiet
$jsfl run experiments/core/fmnist_dl80_cyclic.toml model.cut=1 run.name=sfl_dl80_cyclic_cut1 run.out_dir=$out --quiet
.venv/bin/python experiments/collect.py $out --out experiments/core/results/core
