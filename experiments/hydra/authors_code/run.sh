#!/usr/bin/env bash
# Runs the Hydra authors' scripts (an adapted clone, adapt.py) on the
# cross-check cells, one run after another.  Each run appends one JSON line
# per round to LOG_DIR/<model>/<cell>_seed<S>.jsonl (jsfl_glue.record) and
# its console output goes to the matching .out.  A run whose log already
# holds ROUNDS rounds is skipped; an unfinished one starts again from round 1
# (their code has no checkpoints), so the script can be stopped and rerun.
#
# Usage: bash run.sh LOG_DIR
# Env:   CLONE  the adapted clone (default /work/authors/Hydra)
#        PY     its python (default /work/authors/venv/bin/python)
#        MODEL  small_cnn (default: 15 rounds) or mobilenet (width 0.5, 10 rounds)
#        ROUNDS rounds per run (the model's default above)
#        SEEDS  seeds ("0 1 2 3 4")     CELLS  cells (default: all, in the order below)
#        CELL_MAJOR=1  every seed of a cell before the next cell (default: seed
#               after seed, so a stopped queue leaves every cell short)
#        THREADS torch threads (1)
#        DEVICE their --device (cpu; cuda on a GPU: training there, their
#               evaluation stays on the CPU as their scripts do it)
#        FMNIST_DIR  Fashion-MNIST's IDX files (fmnist_idx.py; default
#               /usr/share/datasets/fashion-mnist)
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: bash run.sh LOG_DIR" >&2; exit 2; }
model=${MODEL:-small_cnn}
case $model in
  small_cnn) cut=2 head=3 rounds=${ROUNDS:-15} extra=() ;;
  mobilenet) cut=4 head=26 rounds=${ROUNDS:-10} extra=(--width 0.5) ;;
  *) echo "run.sh: MODEL=$model; allowed: small_cnn, mobilenet" >&2; exit 2 ;;
esac
clone=${CLONE:-/work/authors/Hydra}
py=${PY:-/work/authors/venv/bin/python}
[[ -f "$clone/.jsfl_adapted" ]] || { echo "run.sh: $clone is not adapted (run adapt.py)" >&2; exit 2; }
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1} PYTHONUNBUFFERED=1

# jsfl's fmnist.toml / fmnist_mobilenet.toml setting: 10 clients, their 80%
# dominant-label split (--partition_method dl --alpha 4) of jsfl's stratified
# 6,000-image subset, batch 64, SGD lr 0.05 x 0.993 per round (floor 0.005),
# no momentum, 1 local epoch; on DEVICE (cpu unless set).
common=(--model_name "$model" --dataset_type fashion-mnist --num_clients 10
        --partition_method dl --alpha 4 --batch_size 64 --training_lr 0.05
        --decay_rate 0.993 --min_lr 0.005 --epoch "$rounds" --device "${DEVICE:-cpu}"
        --train_subset 6000 --threads "${THREADS:-1}" "${extra[@]}")

# cell -> script and its options (phi: the batches of one client the server
# takes in a row in cyclic order; random ignores it)
declare -A CELL=(
  [sfl_cyclic]="run_sfl.py --policy cyclic --phi 1 --cut $cut"
  [sfl_random]="run_sfl.py --policy random --phi 1 --cut $cut"
  [hydra_cyclic]="run_hydra.py --policy cyclic --phi 1 --cut_a $cut --cut_b $head"
  [hydra_random]="run_hydra.py --policy random --phi 1 --cut_a $cut --cut_b $head"
  [sfl_cyclic_phi10]="run_sfl.py --policy cyclic --phi 10 --cut $cut"
  [hydra_cyclic_phi10]="run_hydra.py --policy cyclic --phi 10 --cut_a $cut --cut_b $head"
  [hydra_cyclic_phi10_g5]="test_hydra_heads.py --policy cyclic --phi 10 --num_heads 5 --cut_a $cut --cut_b $head"
  [hydra_cyclic_phi10_g2]="test_hydra_heads.py --policy cyclic --phi 10 --num_heads 2 --cut_a $cut --cut_b $head"
  [splitfedv1]="run_fl.py"
  [splitfedv3]="run_sflv3.py --cut $cut"
  [multihead]="run_multihead.py --cut $head"
  [mergesfl]="run_mergesfl.py --cut $cut"
)
ORDER="sfl_cyclic hydra_cyclic sfl_random hydra_random sfl_cyclic_phi10 hydra_cyclic_phi10
       hydra_cyclic_phi10_g5 hydra_cyclic_phi10_g2 splitfedv1 splitfedv3 multihead mergesfl"

done_rounds() {  # rounds in a log (0 if none)
  [[ -s "$1" ]] || { echo 0; return; }
  "$py" -c 'import json, sys
print(len({json.loads(l)["round"] for l in open(sys.argv[1]) if l.strip()}))' "$1"
}

runs=()  # "seed cell" pairs: seed after seed, or with CELL_MAJOR=1 cell after cell
for cell in ${CELLS:-$ORDER}; do
  [[ -n "${CELL[$cell]:-}" ]] || { echo "run.sh: cell $cell; allowed: $ORDER" >&2; exit 2; }
done
if [[ ${CELL_MAJOR:-0} == 1 ]]; then
  for cell in ${CELLS:-$ORDER}; do for seed in ${SEEDS:-0 1 2 3 4}; do runs+=("$seed $cell"); done; done
else
  for seed in ${SEEDS:-0 1 2 3 4}; do for cell in ${CELLS:-$ORDER}; do runs+=("$seed $cell"); done; done
fi
mkdir -p "$1/$model"  # only once every option is known good
logs=$(cd "$1/$model" && pwd)
failed=0
cd "$clone"
for run in "${runs[@]}"; do
  read -r seed cell <<< "$run"
  name="${cell}_seed${seed}"
  log="$logs/$name.jsonl"
  if [[ $(done_rounds "$log") -ge $rounds ]]; then
    echo "== $model $name: $rounds rounds done, skipped"
    continue
  fi
  rm -f "$log"
  echo "== $model $name: started $(date -Is)"
  # shellcheck disable=SC2086  # the cell's options are words
  JSFL_CELL=$cell "$py" ${CELL[$cell]} "${common[@]}" --seed "$seed" --round_log "$log" \
    > "$logs/$name.out" 2>&1
  rc=$?
  got=$(done_rounds "$log")
  if [[ $got -ge $rounds ]]; then
    echo "== $model $name: finished $(date -Is) ($got rounds)"
  else
    echo "== $model $name: FAILED (exit $rc, $got of $rounds rounds; see $logs/$name.out)" >&2
    failed=1
  fi
done
exit $failed
