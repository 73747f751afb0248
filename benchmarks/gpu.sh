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
#          throughput scaling sweep (default: all, in that order; run them one call
#          each where a call is time-limited; fill first: it sets the GPU defaults)
#   --smoke: the same scripts at toy sizes on any backend (the test suite runs
#          it on the CPU); vs_torch is skipped where torch is not installed.
# Env: OUT (benchmarks/results/gpu-<host>-<date>), PYTHON (python), LIMIT (540 s a part),
#      DEADLINE (fill, seed_kernels: no cell started after it; 400 s).
set -euo pipefail
cd "$(dirname "$0")/.."
smoke=0
if [[ ${1:-} == --smoke ]]; then smoke=1; shift; fi
parts=("$@")
[[ ${#parts[@]} -gt 0 ]] || parts=(fill seed_kernels vs_torch_mobilenet vs_torch_mobilenet_multisfl
                                   vs_torch_resnet18 throughput scaling sweep)
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

for p in "${parts[@]}"; do
  case $p in
    vs_torch_mobilenet) vs_torch "$p" mobilenet_v1 --methods sfl hydra ;;
    vs_torch_mobilenet_multisfl) vs_torch "$p" mobilenet_v1 --methods multisfl --central ;;
    vs_torch_resnet18) vs_torch "$p" resnet18 --methods sfl hydra --central ;;
    throughput)  # jsfl against per-client loops and the centralised step
      if ((smoke)); then
        part throughput throughput.py --width 0.125 --clients 2 --seeds 1 --repeats 1
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
        part fill fill.py --smoke
      else  # ~30-60 s a cell on an H100/H200 (compilation most of it); the most
        # telling cells first, none started after DEADLINE (default 400 s)
        part fill fill.py --deadline "${DEADLINE:-400}" --cell-timeout 180
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
    *) echo "unknown part '$p'; allowed: fill seed_kernels vs_torch_mobilenet" \
            "vs_torch_mobilenet_multisfl vs_torch_resnet18 throughput scaling sweep" >&2
       exit 2 ;;
  esac
done
echo "results in $out"
