"""Where a whole ``jsfl run`` round goes: training, evaluation and the
host's records, from a JAX profiler trace of a few rounds.

``hydra_vs_authors.py`` found jsfl's later rounds of the Hydra cross-check
cells on an H200 to take 0.20 s of which 0.05 s trained (8 seeds, small
CNN): the rest is evaluation, the round's metrics coming back to the host
and the records written.  This runs the same cell as ``jsfl run``
(``experiments/hydra/fmnist.toml``, ``--model mobilenet``: MobileNetV1
x0.5) with ``run.profile`` over its last rounds, and reports per round: the
traced window (round, evaluation, records), the round program's own wall
time (the records' ``wall_s``), and ``trace_summary.py``'s reading of the
trace (the device's busy fraction of the window, kernels and device-to-host
copies a round, the busiest lanes and their costliest ops).

    python benchmarks/profile_run.py --seeds 8 --rounds 5 --profile 2
    python benchmarks/profile_run.py --model mobilenet --seeds 8
    python benchmarks/profile_run.py --smoke                    # toy sizes, any backend

Writes ``results/profile_run-<model>-<backend>-<host>-<time>.json`` and
keeps the trace beside it (same stem, ``.trace.json.gz``) where it is under
15 MiB.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile

import _results  # benchmarks/ is not a package: a sibling module
from hydra_vs_authors import CELLS, CONFIGS, ROOT
from trace_summary import load, summarize

# the vs_authors comparison's SFL cyclic cell of these models
MODELS = ("small_cnn", "mobilenet")
CELL = CELLS["sfl_cyclic"]
# a GPU lease returns files of at most 16 MiB: a larger trace is read, not kept
MAX_TRACE_BYTES = 15 * 2**20


def main():
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--model", choices=MODELS, default="small_cnn")
  ap.add_argument("--seeds", type=int, default=8)
  ap.add_argument("--rounds", type=int, default=5, help="rounds in all")
  ap.add_argument("--profile", type=int, default=2, help="the last N of them traced")
  ap.add_argument("--data-dir", default=None, help="dataset.data_dir (Fashion-MNIST)")
  ap.add_argument("--jsfl", default=f"{sys.executable} -m jsfl")
  ap.add_argument("--smoke", action="store_true", help="1 seed, 2 rounds, 640 samples")
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  extra = []
  if args.smoke:
    args.seeds, args.rounds, args.profile = 1, 2, 1
    extra = ["dataset.train_subset=640"]
  if not 1 <= args.profile < args.rounds:
    ap.error(f"--profile={args.profile}: allowed 1 to --rounds - 1 ({args.rounds - 1}); "
             "round 1 compiles")
  first = args.rounds - args.profile + 1
  data = [f"dataset.data_dir={args.data_dir}"] if args.data_dir else []
  with tempfile.TemporaryDirectory() as tmp:
    run_dir = os.path.join(tmp, "run")
    cmd = [*args.jsfl.split(), "run", CONFIGS[args.model], *CELL, *data, *extra,
           f"run.seeds={args.seeds}", f"run.rounds={args.rounds}", "run.checkpoint_every=0",
           f"run.profile=[{first},{args.rounds}]", f"run.dir={run_dir}", "--quiet"]
    print(" ".join(cmd), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True)
    (trace,) = glob.glob(f"{run_dir}/profile/plugins/profile/*/*.trace.json.gz")
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      recs = [json.loads(line) for line in f]
    with open(os.path.join(run_dir, "config.json")) as f:
      resolved = json.load(f).get("resolved", {})
    summary = summarize(load(trace), args.profile)
    walls = {r["round"]: r["wall_s"] for r in recs if r["round"] >= first}
    round_ms = 1e3 * sum(walls.values()) / len(walls)
    res = {"machine": _results.machine(), "model": args.model, "cell": CELL,
           "seeds": args.seeds, "rounds": args.rounds, "profiled_rounds": [first, args.rounds],
           "command": " ".join(cmd), "resolved": resolved,
           "round_program_ms": round(round_ms, 3),
           "outside_round_program_ms": round(summary["window_ms_per_round"] - round_ms, 3),
           "trace": summary}
    stem = _results.path(args.out, "profile_run", args.model, res["machine"]["backend"],
                         _results.host(), ext="")
    res["trace"]["bytes"] = os.path.getsize(trace)
    if res["trace"]["bytes"] <= MAX_TRACE_BYTES:
      shutil.copyfile(trace, stem + ".trace.json.gz")
      res["trace"]["file"] = os.path.basename(stem) + ".trace.json.gz"
  _results.write_json(stem + ".json", res)
  print(f"{args.model}, {args.seeds} seeds: a round {summary['window_ms_per_round']:,.1f} ms "
        f"traced, of which the round program {round_ms:,.1f} ms")
  for dev in summary["devices"]:
    print(f"  {dev['device']}: busy {dev.get('busy_fraction', 0):.0%}, "
          f"{dev['kernels_per_round']:,.0f} kernels, "
          f"{dev['device_to_host_copies_per_round']:,.0f} device-to-host copies a round")
  print(f"wrote {stem}.json")


if __name__ == "__main__":
  main()
