"""XLA:CPU's compile-speed settings against a run's time: cold start and round.

A short cell on the CPU spends most of its time compiling (the Hydra cell's
first round, benchmarks/README.md), and XLA:CPU has two settings that trade
kernel quality for compile time: LLVM's optimisation level
(``--xla_backend_optimization_level``, default 3) and its fusion emitters
(``--xla_cpu_use_fusion_emitters``, default the MLIR ones). For each setting,
alternating, in fresh processes with the compilation cache off:

  cold    seconds from process start to the first ``metrics.jsonl`` record
          (imports, data, compiling the programs, round 1 and its evaluation);
  round   the median ``wall_s`` of rounds 2..R (the compiled round and its
          evaluation, what a long run is made of);
  acc     the last round's median accuracy over the seeds, as a check that
          the setting trains the same model.

  python benchmarks/xla_cpu_flags.py                          # both configs, 2 repeats
  taskset -c 0 python benchmarks/xla_cpu_flags.py --configs hydra_cnn --repeats 1

Writes ``benchmarks/results/xla_cpu_flags-<backend>-<host>-<time>.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile

import _results  # benchmarks/ is not a package: a sibling module (script dir on sys.path)
from compile_cache import CONFIGS, first_record_s

SETTINGS = {
    "default": "",
    "O1": "--xla_backend_optimization_level=1",
    "elemental": "--xla_cpu_use_fusion_emitters=false",
    "O1+elemental": "--xla_backend_optimization_level=1 --xla_cpu_use_fusion_emitters=false",
}


def measure(config, setting, rounds, scratch, repeat):
  run_dir = os.path.join(scratch, f"{config}-{setting}-{repeat}")
  cmd = [sys.executable, "-m", "jsfl", "run", *CONFIGS[config], "--quiet",
         "run.eval_every=1", f"run.rounds={rounds}", "run.checkpoint_every=0",
         f"run.dir={run_dir}"]
  env = {**os.environ, "JSFL_COMPILE_CACHE": "off",
         "XLA_FLAGS": " ".join(filter(None, (os.environ.get("XLA_FLAGS", ""),
                                             SETTINGS[setting])))}
  cold = first_record_s(cmd, run_dir, env)
  with open(os.path.join(run_dir, "metrics.jsonl")) as f:
    records = [json.loads(line) for line in f]
  walls = {r["round"]: r["wall_s"] for r in records}
  last = max(walls)
  return {"cold": cold, "round": statistics.median(w for k, w in walls.items() if k > 1),
          "acc": statistics.median(r["accuracy"] for r in records if r["round"] == last)}


def main():
  ap = argparse.ArgumentParser(description=__doc__,
                               formatter_class=argparse.RawDescriptionHelpFormatter)
  ap.add_argument("--configs", nargs="+", default=["hydra_cnn", "hydra_mobilenet"],
                  choices=list(CONFIGS))
  ap.add_argument("--settings", nargs="+", default=list(SETTINGS), choices=list(SETTINGS))
  ap.add_argument("--rounds", type=int, default=4)
  ap.add_argument("--repeats", type=int, default=2)
  ap.add_argument("--out", default=_results.DIR)
  args = ap.parse_args()
  machine = _results.machine(cpus_used=len(os.sched_getaffinity(0)))  # taskset
  print("#", machine)
  results = {}
  with tempfile.TemporaryDirectory() as scratch:
    for rep in range(args.repeats):
      for config in args.configs:
        for setting in args.settings:
          r = measure(config, setting, args.rounds, scratch, rep)
          results.setdefault(config, {}).setdefault(setting, []).append(r)
          print(f"{config} {setting} #{rep}: cold {r['cold']:.1f} s, round {r['round']:.2f} s,"
                f" acc {r['acc']:.2f}", flush=True)
  rows = {}
  print("| config | XLA:CPU setting | cold start (s) | round (s) | accuracy, last round |")
  print("| --- | --- | --- | --- | --- |")
  for config, by_setting in results.items():
    for setting, rs in by_setting.items():
      med = {k: statistics.median(r[k] for r in rs) for k in rs[0]}
      rows.setdefault(config, {})[setting] = {"median": med, "runs": rs,
                                              "xla_flags": SETTINGS[setting]}
      print(f"| {config} | {setting} | {med['cold']:.1f} | {med['round']:.2f} |"
            f" {med['acc']:.2f} |")
  path = _results.write_json(
      _results.path(args.out, "xla_cpu_flags", machine["backend"], _results.host(True)),
      {"benchmark": "xla_cpu_flags", "machine": machine, "repeats": args.repeats,
       "rounds": args.rounds, "configs": {c: CONFIGS[c] for c in args.configs},
       "what": "cold: seconds from process start to the first metrics.jsonl record, "
               "compilation cache off; round: median wall_s of rounds 2..R",
       "results": rows})
  print("wrote", path)


if __name__ == "__main__":
  main()
