#!/usr/bin/env bash
# The accelerator benchmarks in one command, one part per call so every call
# ends inside 9 minutes (an offline GPU machine whose image has jax with CUDA,
# flax, optax, orbax, chex and torch; the scripts import jsfl from this
# checkout, so no install is needed; offline, `pip install --no-deps
# --no-build-isolation -e .` installs it without fetching setuptools).  Results go to one folder, with a log
# per part and the machine in every JSON.
#
# Usage: bash benchmarks/gpu.sh [--smoke] [PART...]
#   parts: fill seed_kernels vs_torch_mobilenet vs_torch_mobilenet_multisfl vs_torch_resnet18
#          throughput scaling sweep vs_authors profile_run paper_run (default: all but
#          paper_run, in that order; run them one call each where a call is time-limited;
#          fill first: it sets the GPU defaults)
#   --smoke: the same scripts at toy sizes on any backend (the test suite runs
#          it on the CPU); vs_torch is skipped where torch is not installed, vs_authors
#          where torch or .gpu_carry (the authors' adapted clone, Fashion-MNIST) is not there.
# Env: OUT (benchmarks/results/gpu-<host>-<date>), PYTHON (python), LIMIT (540 s a part;
#      vs_authors: 470 s at most, in all), DEADLINE (fill, seed_kernels: no cell started
#      after it, 400 s; vs_authors: 300 s); fill: FILL_CELLS (MODEL:SEEDS:LOWERING words
#      instead of the whole grid), PROFILE (N: trace N more rounds of each cell);
#      vs_authors: PY (the authors' python, python3),
#      CLONE (.gpu_carry/Hydra), FMNIST_DIR (.gpu_carry/fmnist), NSEEDS (8: their
#      processes), JSFL_SEEDS (NSEEDS: jsfl's slots in its one program), CACHE (off:
#      jsfl compiles cold; warm: a one-round run fills its compilation cache first);
#      paper_run: PAPER_SWEEP (experiments/sequential/paper/table1_fashion_mnist.toml),
#      PAPER_SHARDS ("12/14 8/14": its --per-cell programs, SFedKD and FedSeq at
#      ExDir(2, 0.5)), PAPER_DATA (.gpu_carry/data: $JSFL_DATA, the full
#      Fashion-MNIST files in fashion_mnist/), DEADLINE (450 s), GRAPHS (1: XLA's
#      command buffers for loops and branches, as fill's graphs cells).
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=0
if [[ ${1:-} == --smoke ]]; then smoke=1; shift; fi
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(fill seed_kernels vs_torch_mobilenet vs_torch_mobilenet_multisfl
                                   vs_torch_resnet18 throughput scaling sweep vs_authors
                                   profile_run)
# The benchmarks import jsfl from this checkout whether or not it is installed.
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
py=${PYTHON:-python}
out=${OUT:-benchmarks/results/gpu-$(hostname)-$(date -u +%Y%m%d)}
limit=${LIMIT:-540}
mkdir -p "$out"

# part NAME SCRIPT ARGS...: one benchmark script, its log next to its JSON
part() {
  local name=$1 script=$2; shift 2
  echo "== $name: $script $*"
  timeout "$limit" "$py" "benchmarks/$script" "$@" --out "$out" 2>&1 | tee "$out/$name.log"
}

has_torch() { "$py" -c "import torch" 2>/dev/null; }

vs_torch() {  # vs_torch NAME MODEL [vs_torch.py args...]
  local name=$1 model=$2; shift 2
  if ! has_torch; then
    echo "== $name: skipped (torch is not installed)" | tee "$out/$name.log"
    return
  fi
  if ((smoke)); then
    part "$name" vs_torch.py --models "$model" --methods sfl --width 0.125 --clients 2 \
      --seeds 1 --repeats 1 --torch-threads 1
  else  # 10 clients x 1 and 8 seeds (100 clients x 8 seeds side by side would hold
    # ~90 GiB of MobileNetV1 part-1 activations, more than an 80 GiB card).  On an
    # H100 each method's pair of cells takes 2.5-3 minutes (mostly compilation and
    # worker start-up), so MultiSFL and the whole-model step are a part of their own.
    part "$name" vs_torch.py --models "$model" --clients 10 --seeds 1 8 --repeats 3 "$@"
  fi
}

# vs_authors: the Hydra authors' scripts as a user runs them (one process per
# seed, side by side on the card) against jsfl (the seeds as slots of one
# program) on the small-CNN and MobileNetV1 x0.5 cross-check cells, each at
# its own rounds (15, 10): seed-runs per hour (benchmarks/hydra_vs_authors.py).
# Their adapted clone and the Fashion-MNIST files come from .gpu_carry
# (benchmarks/README.md, "The authors' code on a GPU").
vs_authors() {
  local clone=${CLONE:-.gpu_carry/Hydra} data=${FMNIST_DIR:-.gpu_carry/fmnist}
  local apy=${PY:-python3} missing=() device=cpu model why
  [[ -f $clone/.jsfl_adapted ]] || missing+=("their adapted clone $clone")
  [[ -d $data ]] || missing+=("Fashion-MNIST $data")
  "$apy" -c "import torch" 2>/dev/null || missing+=("torch in $apy")
  if ((${#missing[@]})); then
    why=$(printf '%s, ' "${missing[@]}")
    if ((smoke)); then
      echo "== vs_authors: skipped (missing: ${why%, })" | tee "$out/vs_authors.log"
      return
    fi
    echo "vs_authors: missing: ${why%, }; carry .gpu_carry (benchmarks/README.md," \
         "\"The authors' code on a GPU\")" >&2
    exit 2
  fi
  # their --device: cuda where their torch sees a GPU
  "$apy" -c "import sys, torch; sys.exit(not torch.cuda.is_available())" 2>/dev/null && device=cuda
  local common=(--clone "$clone" --py "$apy" --data-dir "$data" --device "$device"
                --jsfl "$(printf %q "$py") -m jsfl" --repeats 1 --cache "${CACHE:-off}")
  if ((smoke)); then
    for model in small_cnn mobilenet; do
      part "vs_authors_$model" hydra_vs_authors.py "${common[@]}" --model "$model" \
        --cells sfl_cyclic --rounds 1 --procs 1 --seeds 1
    done
    return
  fi
  # N seeds: N of their processes (cores / N torch threads each) against N slots
  # (JSFL_SEEDS: another slot count; seed-runs per hour are rates, so the two
  # sides need not run as many seeds: their N processes fill the machine's cores,
  # jsfl's compiled round and start-up are shared by all of its slots).
  # Measured on the H200 (results/gpu-h200-20261127/): the small-CNN pair
  # took ~220 s (SFL cyclic ~110 s), MobileNetV1's SFL cyclic alone 239 s
  # (their 8 processes ~140 s, jsfl's cold compilation ~60 s of its ~70 s).
  # The part stops at 470 s; a cell is started only before its model's
  # deadline (small CNN DEADLINE / 5, MobileNetV1 DEADLINE, from the part's
  # start), so each model gets SFL cyclic (~350 s) and Hydra cyclic follows
  # only where a later DEADLINE leaves time.
  local t0=$SECONDS n=${NSEEDS:-8} deadline=${DEADLINE:-300} used
  local slots=${JSFL_SEEDS:-${NSEEDS:-8}}
  local budget=$((limit < 470 ? limit : 470)) threads=$(($(nproc) / n))
  local limit  # part's time limit, this model's share of the budget
  ((threads >= 1)) || threads=1
  local -A rounds=([small_cnn]=15 [mobilenet]=10)
  local -A until=([small_cnn]=$((deadline / 5)) [mobilenet]=$deadline)
  for model in small_cnn mobilenet; do
    used=$((SECONDS - t0))
    limit=$((budget - used))
    if ((used >= until[$model])); then
      echo "== vs_authors_$model: not started (${used} s into the part, past its deadline)" |
        tee "$out/vs_authors_$model.log"
      continue
    fi
    part "vs_authors_$model" hydra_vs_authors.py "${common[@]}" --model "$model" \
      --cells sfl_cyclic hydra_cyclic \
      --rounds "${rounds[$model]}" --procs "$n" --seeds "$slots" --threads "$threads" \
      --deadline "$((until[$model] - used))" || echo "== vs_authors_$model: exit $?"
  done
}

for p in "${parts[@]}"; do
  case $p in
    vs_torch_mobilenet) vs_torch "$p" mobilenet_v1 --methods sfl hydra ;;
    vs_torch_mobilenet_multisfl) vs_torch "$p" mobilenet_v1 --methods multisfl --central ;;
    vs_torch_resnet18) vs_torch "$p" resnet18 --methods sfl hydra --central ;;
    throughput)  # jsfl against per-client loops and the centralised step
      if ((smoke)); then
        part throughput throughput.py --model small_cnn --cut 2 --batch 8 --clients 2 --seeds 1 \
          --repeats 1
      else
        part throughput throughput.py --clients 10 100 --seeds 1 8 --repeats 3 --max-samples 12800
      fi ;;
    scaling)  # seeds 1..32 (and clients, devices) of one SFL program
      if ((smoke)); then
        part scaling scaling.py --model small_cnn --width 4 --batch 8 --clients 2 --seeds 1 2 \
          --seeds-clients 2 --curves clients seeds --repeats 1
      else
        # one device here: the devices curve would be simulated host devices
        part scaling scaling.py --curves seeds clients --seeds 1 2 4 8 16 32 --clients 10 100 \
          --repeats 3
      fi ;;
    fill)  # how far seeds fill the card: old and new lowerings, bfloat16 (benchmarks/fill.py)
      if ((smoke)); then
        part fill fill.py --smoke --profile 1
      else  # ~30-60 s a cell on an H100/H200 (compilation most of it); the most
        # telling cells first, none started after DEADLINE (default 400 s)
        # FILL_CELLS: "model:seeds:lowering ..." instead of the whole grid
        # shellcheck disable=SC2086  # the cells are words
        # PROFILE=N: trace N more rounds of each cell (fill.py --profile)
        part fill fill.py --deadline "${DEADLINE:-400}" --cell-timeout 180 \
          ${FILL_CELLS:+--cells $FILL_CELLS} ${PROFILE:+--profile $PROFILE}
      fi ;;
    seed_kernels)  # the server visit alone under each lowering (benchmarks/seed_kernels.py)
      if ((smoke)); then
        part seed_kernels seed_kernels.py --smoke
      else
        part seed_kernels seed_kernels.py --deadline "${DEADLINE:-400}"
      fi ;;
    sweep)  # 45 runs (3 lr x 3 Dirichlet alpha x 5 seeds) as slots vs one program per cell
      if ((smoke)); then
        part sweep sweep.py --lrs 0.01 0.1 --alphas 0.5 --seeds 1 --rounds 1 --clients 2 \
          --batch 8 --train-size 64 --test-size 32
      else
        part sweep sweep.py --rounds 5 --train-size 60000 --test-size 10000
      fi ;;
    vs_authors) vs_authors ;;  # the Hydra authors' scripts side by side against jsfl
    profile_run)  # a whole `jsfl run` round traced: training, evaluation, records
      if ((smoke)); then
        part profile_run profile_run.py --smoke
      else  # the vs_authors cells at JSFL_SEEDS (8) seeds; ~30-70 s each, compilation most
        data=()  # the carried Fashion-MNIST where there is one, else jsfl's default place
        [[ -d ${FMNIST_DIR:-.gpu_carry/fmnist} ]] && data=(--data-dir "${FMNIST_DIR:-.gpu_carry/fmnist}")
        for model in small_cnn mobilenet; do
          part "profile_run_$model" profile_run.py --model "$model" --seeds "${JSFL_SEEDS:-8}" \
            "${data[@]}"
        done
      fi ;;
    paper_run)  # a paper sweep's programs at the paper's scale, as far as the part gets
      paper_sweep=${PAPER_SWEEP:-experiments/sequential/paper/table1_fashion_mnist.toml}
      if ((smoke)); then
        part paper_run paper_run.py "$paper_sweep" --per-cell --shards 8/14 --smoke
      else  # 1000 rounds of 10 seeds a cell; the running program is stopped at
        # DEADLINE with a checkpoint, the records of every cell come back in one tar
        paper_data=${PAPER_DATA:-.gpu_carry/data}
        if [[ ! -d $paper_data/fashion_mnist ]]; then
          echo "paper_run: no $paper_data/fashion_mnist (the full Fashion-MNIST files);" \
               "carry .gpu_carry/data (benchmarks/README.md, \"A paper's run on a GPU\")" >&2
          exit 2
        fi
        # shellcheck disable=SC2086  # the shards are words
        part paper_run paper_run.py "$paper_sweep" \
          --per-cell --shards ${PAPER_SHARDS:-12/14 8/14} --deadline "${DEADLINE:-450}" \
          --data "$paper_data" --work runs/paper_run \
          ${GRAPHS:+--xla-flags=--xla_gpu_enable_command_buffer=+WHILE,+CONDITIONAL}
      fi ;;
    *) echo "unknown part '$p'; allowed: fill seed_kernels vs_torch_mobilenet" \
            "vs_torch_mobilenet_multisfl vs_torch_resnet18 throughput scaling sweep" \
            "vs_authors profile_run paper_run" >&2
       exit 2 ;;
  esac
done
echo "results in $out"
