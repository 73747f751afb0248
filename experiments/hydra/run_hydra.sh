#!/usr/bin/env bash
# Hydra experiments on Fashion-MNIST (README.md here): every cell runs its
# seeds (run.seeds in fmnist.toml, 5) through the seed axis in one program.
#
# Usage: bash experiments/hydra/run_hydra.sh [BLOCK...]
#   required  SFL vs SFL+Hydra, 80%-DL phi=1, cyclic and random   (done-when)
#   table4    Hydra with G = 5 and 2 heads (superclasses), cyclic and random
#   table3    SplitFedV1, SplitFedV3, MultiHead, MergeSFL, SplitNN, 80%-DL random
#   table1    60%-DL phi=1, 80%-DL phi=5 / phi=10, cyclic_reverse (SFL and Hydra;
#             the phi=10 cyclic cells are shared with phi10)
#   phi10     SFL and Hydra, 80%-DL phi=10 (100 clients), cyclic and random
#   iid       SFL and Hydra on IID data (the reference row of the paper's tables)
#   all       every block above
# ORDERS (default "cyclic random") selects the orders of required and table4;
# PHI (default 1; the paper's Table 4 uses phi=10) the scale of table4.
# Env: OUT (runs/hydra), ROUNDS / SEEDS / SUBSET to override fmnist.toml,
# CONFIG (another base config, e.g. experiments/hydra/cifar10_mobilenet.toml),
# CUT (model.cut) and HEAD_CUT (first head stage of Hydra and MultiHead).
# A cell that fails is reported and the others still run.
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-runs/hydra}
jsfl=${JSFL:-.venv/bin/jsfl}
config=${CONFIG:-experiments/hydra/fmnist.toml}
extra=()
[[ -n "${ROUNDS:-}" ]] && extra+=("run.rounds=$ROUNDS")
[[ -n "${SEEDS:-}" ]] && extra+=("run.seeds=$SEEDS")
[[ -n "${SUBSET:-}" ]] && extra+=("dataset.train_subset=$SUBSET")
[[ -n "${CUT:-}" ]] && extra+=("model.cut=$CUT")

# cell NAME METHOD P PHI ORDER [key=value...]   (P = iid: an IID partition)
cell() {
  local name=$1 method=$2 p=$3 phi=$4 order=$5; shift 5
  # A cell is done when its run finished (summary.json is rewritten at every
  # evaluation, so a killed cell has one too): the marker is written after.
  if [[ -f "$out/$name.done" ]]; then
    echo "skip $name (done)"; return; fi
  echo "== $name"
  local heads=()
  [[ -n "${HEAD_CUT:-}" && ( $method == hydra || $method == multihead ) ]] \
    && heads=("method.head_cut=$HEAD_CUT")
  local part=(partition.p="$p" partition.phi="$phi")
  [[ $p == iid ]] && part=()
  $jsfl run "$config" method.name="$method" "${part[@]}" \
    partition.num_clients=$((10 * phi)) method.order="$order" run.name="$name" \
    run.out_dir="$out" "${extra[@]}" "${heads[@]}" "$@" --quiet \
    && touch "$out/$name.done" || echo "FAILED $name"
}

required() {
  for order in ${ORDERS:-cyclic random}; do
    cell "sfl_dl80_phi1_$order" sfl 0.8 1 $order
    cell "hydra_dl80_phi1_$order" hydra 0.8 1 $order
  done
}
table4() {
  local sc=${SUPERCLASSES:-fashion_mnist} phi=${PHI:-1}
  for order in ${ORDERS:-cyclic random}; do
    for g in 5 2; do
      cell "hydra_G${g}_dl80_phi${phi}_$order" hydra 0.8 "$phi" $order method.groups=$g \
        method.superclasses="$sc"
    done
  done
}
table3() {
  for m in splitfedv1 splitfedv3 multihead mergesfl splitnn; do
    cell "${m}_dl80_phi1_random" $m 0.8 1 random
  done
}
table1() {
  for m in sfl hydra; do
    cell "${m}_dl60_phi1_cyclic" $m 0.6 1 cyclic
    cell "${m}_dl60_phi1_random" $m 0.6 1 random
    cell "${m}_dl80_phi1_cyclic_reverse" $m 0.8 1 cyclic_reverse
    cell "${m}_dl80_phi5_cyclic" $m 0.8 5 cyclic
    cell "${m}_dl80_phi5_random" $m 0.8 5 random
    cell "${m}_dl80_phi10_cyclic" $m 0.8 10 cyclic
  done
}

phi10() {
  for order in cyclic random; do
    for m in sfl hydra; do cell "${m}_dl80_phi10_$order" $m 0.8 10 $order; done
  done
}
iid() {
  local config=${IID_CONFIG:-experiments/hydra/fmnist_iid.toml}  # seen by cell
  for m in sfl hydra; do
    cell "${m}_iid_random" $m iid 1 random; done
}

blocks=("$@")
[[ ${#blocks[@]} -eq 0 ]] && blocks=(required)
[[ ${blocks[0]} == all ]] && blocks=(required table4 table3 table1 iid)
for b in "${blocks[@]}"; do $b; done
results=${RESULTS:-experiments/hydra/results/$(basename "$out")}
.venv/bin/python experiments/collect.py "$out" --out "$results"
