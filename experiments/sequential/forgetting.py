"""The forgetting of a sequential run along its client sequence (SFedKD Fig. 1).

Usage: python experiments/sequential/forgetting.py SWEEP_DIR [--out JSON]

For every cell directory under SWEEP_DIR that holds ``confusion_steps.npz``
(``run.step_confusion``), per seed: the per-class test accuracy after each
recorded step, the recorded rounds one after another
(``jsfl.statistics.step_class_accuracy``); its forgetting measure over the whole
sequence (BW with the steps as rows, ``jsfl.statistics.backward_transfer``:
per class the best accuracy at an earlier step minus the last step's,
averaged); and its fluctuation, the mean absolute change of a class's
accuracy from one step to the next (what Fig. 1 (a) and (b) show).  Prints
median +- std over seeds per cell and writes them, with every seed's
figures and the cell's partition, as JSON (default SWEEP_DIR/forgetting.json).
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import numpy as np

from jsfl import rundir, statistics


def seed_figures(path: str) -> dict:
  """``{seed: {"forgetting", "fluctuation", "final_accuracy", "steps"}}`` of
  one run directory's ``confusion_steps.npz``."""
  with np.load(os.path.join(path, "confusion_steps.npz")) as d:
    conf, steps, seeds = d["confusion"], d["steps"], d["seed"]
  out = {}
  for i, seed in enumerate(seeds.tolist()):
    acc = statistics.step_class_accuracy(conf, steps, i)
    final = conf[-1, i, steps[-1, i] - 1]
    out[int(seed)] = {"forgetting": statistics.backward_transfer(acc),
                      "fluctuation": float(np.abs(np.diff(acc, axis=0)).mean()),
                      "final_accuracy": float(100 * np.trace(final) / final.sum()),
                      "steps": int(len(acc))}
  return out


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("sweep_dir")
  ap.add_argument("--out", default=None, help="JSON (default SWEEP_DIR/forgetting.json)")
  args = ap.parse_args(argv)
  if not os.path.isdir(args.sweep_dir):
    print(f"forgetting.py: {args.sweep_dir!r} is not a directory; allowed: a sweep "
          "directory of runs with run.step_confusion", file=sys.stderr)
    return 2
  cells = sorted(c for c in os.listdir(args.sweep_dir) if not c.startswith(".")
                 and os.path.isfile(os.path.join(args.sweep_dir, c, "confusion_steps.npz")))
  if not cells:
    print(f"forgetting.py: no cell with confusion_steps.npz under {args.sweep_dir!r}; "
          "allowed: a sweep directory of runs with run.step_confusion", file=sys.stderr)
    return 2
  result = {}
  print(f"{'cell':32} {'seeds':>5} {'steps':>5} {'forgetting (pp)':>17} "
        f"{'fluctuation (pp)':>17} {'final acc (%)':>15}")
  for cell in cells:
    path = os.path.join(args.sweep_dir, cell)
    per_seed = seed_figures(path)
    with open(os.path.join(path, "config.json")) as f:
      partition = json.load(f)["config"]["partition"]
    row = {k: statistics.across_seeds({s: v[k] for s, v in per_seed.items()})
           for k in ("forgetting", "fluctuation", "final_accuracy")}
    result[cell] = {"partition": partition, "per_seed": per_seed, **row}
    steps = next(iter(per_seed.values()))["steps"]
    print(f"{cell:32} {len(per_seed):>5} {steps:>5} "
          + " ".join(f"{row[k]['median']:9.2f} +- {row[k]['std']:4.2f}"
                     for k in ("forgetting", "fluctuation", "final_accuracy")))
  out = args.out or os.path.join(args.sweep_dir, "forgetting.json")
  rundir.write_json_atomic(out, result)
  print(f"wrote {out}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
