#!/usr/bin/env bash
# MultiSFL (KoReA-SFL) experiments (SPEC 4, 5): every cell runs its seeds
# (run.seeds in the config, 3) through the seed axis in one program.
#
# Usage: bash experiments/multisfl/run_multisfl.sh [BLOCK...]
#   table1    FedAvg, SFL, SFL-FedMut, SFL-FedNTD, SFL-FedExp, MultiSFL under
#             Dirichlet beta = 0.1 / 0.3 / 0.5 and IID  (MultiSFL Table 1)
#   ablation  Conf1 (no replay) and Conf2 (replay at a fixed proportion equal
#             to the mean p_r of the MultiSFL cell, read from its
#             metrics.jsonl; run table1 first) per partition (KoReA-SFL Table 2)
#   required  the cells of the issue's check, first: MultiSFL, SFL,
#             SplitFedV1 (the paper's "SFL", see README), FedAvg, Conf1,
#             Conf2 per partition (then table1 fills in the rest)
#   core      MultiSFL, SFL, FedAvg and Conf1 per partition (the rows that
#             decide the comparison, before the SFL forms and Conf2)
#   all       table1 and ablation
# Env: OUT (runs/multisfl), ROUNDS / SEEDS / SUBSET to override the config,
# MIN_SIZE (Dirichlet's partition.min_size; 5 lets Dirichlet 0.1 split a 12k subset
# over 100 clients), CONFIG (default experiments/multisfl/fmnist.toml; the cifar*_*.toml files
# hold the papers' models), PARTS (default "0.1 0.3 0.5 iid"), RESULTS (where
# collect.py writes PREFIX.md/.json; default experiments/multisfl/results/<config>).
set -euo pipefail
cd "$(dirname "$0")/../.."
out=${OUT:-runs/multisfl}
jsfl=${JSFL:-.venv/bin/jsfl}
py=${PYTHON:-.venv/bin/python}
config=${CONFIG:-experiments/multisfl/fmnist.toml}
parts=${PARTS:-"0.1 0.3 0.5 iid"}
tag=$(basename "$config" .toml)
extra=()
[[ -n "${ROUNDS:-}" ]] && extra+=("run.rounds=$ROUNDS")
[[ -n "${SEEDS:-}" ]] && extra+=("run.seeds=$SEEDS")
[[ -n "${SUBSET:-}" ]] && extra+=("dataset.train_subset=$SUBSET")

# partition arguments of a partition tag: "iid" or a Dirichlet beta
part_args() {
  if [[ $1 == iid ]]; then echo "partition.name=iid"
  else echo "partition.name=dirichlet partition.alpha=$1${MIN_SIZE:+ partition.min_size=$MIN_SIZE}"; fi
}
part_name() { [[ $1 == iid ]] && echo iid || echo "dir$1"; }

# cell NAME METHOD PART [key=value...]
cell() {
  local name=$1 method=$2 part=$3; shift 3
  # A cell is done when its run finished (summary.json is rewritten at every
  # evaluation, so a killed cell has one too): the marker is written after.
  if [[ -f "$out/$name.done" ]]; then
    echo "skip $name (done)"; return; fi
  echo "== $name"
  # shellcheck disable=SC2046
  $jsfl run "$config" method.name="$method" $(part_args "$part") run.name="$name" \
    run.out_dir="$out" "${extra[@]}" "$@" --quiet && touch "$out/$name.done"
}

table1() {
  for part in $parts; do
    for m in fedavg sfl sfl_fedmut sfl_fedntd sfl_fedexp multisfl; do
      cell "${tag}_${m}_$(part_name "$part")" "$m" "$part"
    done
  done
}

# The mean sampling proportion p_r over the rounds and seeds of a MultiSFL
# cell (Conf2 "has the same overall feature sampling proportion").
mean_p() {
  local dir
  dir=$(ls -d "$out/$1"-* 2>/dev/null | tail -n 1)
  [[ -n "$dir" && -f "$dir/metrics.jsonl" ]] || { echo "missing $1: run table1 first" >&2; exit 1; }
  $py -c 'import json, sys
ps = [json.loads(l)["p"] for l in open(sys.argv[1]) if l.strip()]
print(f"{sum(ps) / len(ps):.6f}")' "$dir/metrics.jsonl"
}

ablation() {
  for part in $parts; do
    local pn p
    pn=$(part_name "$part")
    cell "${tag}_conf1_$pn" multisfl "$part" method.replay=off
    p=$(mean_p "${tag}_multisfl_$pn")
    cell "${tag}_conf2_$pn" multisfl "$part" method.replay=fixed method.p0="$p"
  done
}

core() {
  for part in $parts; do
    local pn
    pn=$(part_name "$part")
    for m in multisfl sfl fedavg; do cell "${tag}_${m}_$pn" "$m" "$part"; done
    cell "${tag}_conf1_$pn" multisfl "$part" method.replay=off
  done
}

required() {
  for part in $parts; do
    local pn p
    pn=$(part_name "$part")
    for m in multisfl sfl splitfedv1 fedavg; do cell "${tag}_${m}_$pn" "$m" "$part"; done
    cell "${tag}_conf1_$pn" multisfl "$part" method.replay=off
    p=$(mean_p "${tag}_multisfl_$pn")
    cell "${tag}_conf2_$pn" multisfl "$part" method.replay=fixed method.p0="$p"
  done
}

blocks=("$@")
[[ ${#blocks[@]} -eq 0 ]] && blocks=(table1)
[[ ${blocks[0]} == all ]] && blocks=(table1 ablation)
for b in "${blocks[@]}"; do $b; done
$py experiments/collect.py "$out" --out "${RESULTS:-experiments/multisfl/results/$tag}"
