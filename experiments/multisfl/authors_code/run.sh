#!/usr/bin/env bash
# Runs the MultiSFL authors' MultiSFL, SFL and FedAvg (their Training_FL.py)
# on Fashion-MNIST in jsfl's setting, one run after another, in an adapted
# clone (adapt.py).  Each run appends one JSON line per round to
# LOG_DIR/<Algorithm>_seed<S>.jsonl (round_log.py) and its console output
# goes to LOG_DIR/<Algorithm>_seed<S>.out.  A run whose log already holds
# ROUNDS rounds is skipped; an unfinished one is started again from round 1
# (their code has no checkpoints), so the script can be stopped and rerun.
#
# Usage: bash run.sh LOG_DIR
# Env:   CLONE   the adapted clone (default /work/authors/MultiSFL)
#        PY      its python (default /work/authors/venv/bin/python)
#        ROUNDS  rounds per run (50)       SEEDS   seeds ("0 1")
#        LOCAL_EP local epochs (5)         ALGOS   ("MultiSFL SFL FL")
#        THREADS torch threads (1)
#        INIT    the small CNN's initialisation, torch (PyTorch's layer defaults,
#                jsfl's default) or he_lecun (jsfl's model.init = "he_lecun");
#                recorded in LOG_DIR/init, and a LOG_DIR holding the other is refused
set -uo pipefail
[[ $# -eq 1 ]] || { echo "usage: bash run.sh LOG_DIR" >&2; exit 2; }
mkdir -p "$1"
logs=$(cd "$1" && pwd)
clone=${CLONE:-/work/authors/MultiSFL}
py=${PY:-/work/authors/venv/bin/python}
rounds=${ROUNDS:-50}
[[ -f "$clone/.jsfl_adapted" ]] || { echo "run.sh: $clone is not adapted (run adapt.py)" >&2; exit 2; }
init=${INIT:-torch}
case $init in torch|he_lecun) ;; *) echo "run.sh: INIT=$init is not one of torch, he_lecun" >&2; exit 2;; esac
if [[ -s "$logs/init" && $(cat "$logs/init") != "$init" ]]; then
  echo "run.sh: $logs holds runs with INIT=$(cat "$logs/init"), not $init (use another LOG_DIR)" >&2; exit 2
fi
echo "$init" > "$logs/init"
export SMALL_CNN_INIT=$init
export OMP_NUM_THREADS=${THREADS:-1} MKL_NUM_THREADS=${THREADS:-1} PYTHONUNBUFFERED=1

# The setting: 100 users, 10 per round, their Dirichlet split (beta 0.1,
# noniid_case 5 = separate_data), batch 50, SGD lr 0.01, momentum 0.5,
# weight decay 1e-4 (their FedAvg's optimiser ignores it), CPU (--gpu -1:
# their test_img calls .cuda() unless gpu is -1).
common=(--dataset fashion-mnist --num_channels 1 --num_classes 10 --model small_cnn
        --num_users 100 --frac 0.1 --iid 0 --noniid_case 5 --data_beta 0.1 --generate_data 1
        --local_ep "${LOCAL_EP:-5}" --local_bs 50 --lr 0.01 --momentum 0.5 --weight_decay 1e-4
        --optimizer sgd --epochs "$rounds" --gpu -1 --threads "${THREADS:-1}")

done_rounds() {  # rounds in a log (0 if none)
  [[ -s "$1" ]] || { echo 0; return; }
  "$py" -c 'import json, sys
print(len({json.loads(l)["round"] for l in open(sys.argv[1]) if l.strip()}))' "$1"
}

failed=0
cd "$clone"
for seed in ${SEEDS:-0 1}; do
  for algo in ${ALGOS:-MultiSFL SFL FL}; do
    name="${algo}_seed${seed}"
    log="$logs/$name.jsonl"
    if [[ $(done_rounds "$log") -ge $rounds ]]; then
      echo "== $name: $rounds rounds done, skipped"
      continue
    fi
    rm -f "$log"
    extra=()
    [[ $algo == MultiSFL ]] && extra=(--MR 1 --DB 1)
    echo "== $name: started $(date -Is)"
    "$py" main_fed.py --algorithm "$algo" "${extra[@]}" "${common[@]}" --seed "$seed" \
      --round_log "$log" > "$logs/$name.out" 2>&1
    rc=$?
    # Their loguru @logger.catch logs an exception and returns, so the exit
    # status can be 0 after a crash: the log's round count decides.
    got=$(done_rounds "$log")
    if [[ $got -ge $rounds ]]; then
      echo "== $name: finished $(date -Is) ($got rounds)"
    else
      echo "== $name: FAILED (exit $rc, $got of $rounds rounds; see $logs/$name.out)" >&2
      failed=1
    fi
  done
done
exit $failed
