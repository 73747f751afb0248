#!/usr/bin/env bash
# The authors'-setting cells of MultiSFL Table 1 and the ablation on
# Fashion-MNIST (fmnist_authors.toml: full 60k, Dirichlet 0.1 self-balancing,
# E = 5 for every method, 5 seeds, 50 rounds), one after another, in the order
# that decides the comparison first.  Each cell is checkpointed every 5 rounds
# and rerunning this script continues every unfinished cell with
# `jsfl run --resume` (a finished one prints so and is skipped), so it can be
# stopped at any time and started again, in a later session too.
#
# Usage: bash experiments/multisfl/run_authors.sh [CELL...]
#   cells: multisfl splitfedv1 fedavg conf1 conf2 sfl (default: all, in this order)
# Env: OUT (runs/authors), SEEDS (5), ROUNDS (50), ALPHA (0.1).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-runs/authors}
jsfl=${JSFL:-.venv/bin/jsfl}
py=${PYTHON:-.venv/bin/python}
config=experiments/multisfl/fmnist_authors.toml
alpha=${ALPHA:-0.1}
common=("partition.alpha=$alpha" "run.seeds=${SEEDS:-5}" "run.rounds=${ROUNDS:-50}")

# cell NAME [key=value...]: start it, or continue it from its newest checkpoint
cell() {
  local name=$1 dir="$out/fmnist_$1_E5_dir$alpha"; shift
  echo "== $name ($dir)"
  if [[ -f "$dir/config.json" ]]; then
    $jsfl run --resume "$dir" --quiet
  else
    $jsfl run "$config" "${common[@]}" "$@" run.dir="$dir" --quiet
  fi
}

# The mean sampling proportion p_r over the rounds and seeds of the MultiSFL
# cell: Conf2 replays at this fixed proportion (KoReA-SFL Table 2).
mean_p() {
  $py -c 'import json, sys
ps = [json.loads(l)["p"] for l in open(sys.argv[1]) if l.strip()]
print(f"{sum(ps) / len(ps):.6f}")' "$out/fmnist_multisfl_E5_dir$alpha/metrics.jsonl"
}

run_cell() {
  case $1 in
    multisfl) cell multisfl method.name=multisfl ;;
    splitfedv1) cell splitfedv1 method.name=splitfedv1 ;;
    fedavg) cell fedavg method.name=fedavg optim.weight_decay=0 ;;  # their FedAvg: no decay
    conf1) cell conf1 method.name=multisfl method.replay=off ;;
    conf2) cell conf2 method.name=multisfl method.replay=fixed method.p0="$(mean_p)" ;;
    sfl) cell sfl method.name=sfl ;;
    *) echo "unknown cell '$1'; allowed: multisfl splitfedv1 fedavg conf1 conf2 sfl" >&2; exit 2 ;;
  esac
}

cells=("$@")
[[ ${#cells[@]} -gt 0 ]] || cells=(multisfl splitfedv1 fedavg conf1 conf2 sfl)
for c in "${cells[@]}"; do run_cell "$c"; done
