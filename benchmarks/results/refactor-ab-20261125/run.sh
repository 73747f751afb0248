#!/usr/bin/env bash
# Before / after the restructure (train and sweep packages, typed round data,
# the split algorithm value), interleaved old, new, old, new on one machine
# with nothing else running.  OLD and NEW are checkouts of the two commits;
# both run with the same interpreter.
#
#   OLD=/path/to/old-checkout NEW=/path/to/new-checkout bash run.sh
#
# SIDES picks the order (default old new old new); a run cut short goes on
# with the sides still missing.
set -euo pipefail
OUT=$(cd "$(dirname "$0")" && pwd)
PY=${PY:-python}
for side in ${SIDES:-old new old new}; do
    dir=$([ $side = old ] && echo "$OLD" || echo "$NEW")
    mkdir -p "$OUT/$side"
    (cd "$dir" && PYTHONPATH="$dir" $PY benchmarks/throughput.py --width 0.5 --clients 10 \
       --seeds 1 4 --repeats 3 --skip-loop --skip-central --out "$OUT/$side")
    (cd "$dir" && PYTHONPATH="$dir" $PY benchmarks/sweep.py --out "$OUT/$side")
done
