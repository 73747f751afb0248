#!/usr/bin/env python3
"""Turns the per-round logs of the authors' runs into JSON.

Usage: python3 parse.py LOG_DIR [--out FILE] [--csv FILE] [--rounds N]

Reads every ``*.jsonl`` in LOG_DIR (written by ``round_log.py`` inside the
adapted clone, one file per run, see ``run.sh``) and prints (or writes to
FILE) one JSON object:

  {"runs": [{"method", "algorithm", "seed", "rounds": [{"round", "accuracy",
             "p" (MultiSFL), "wall_s", "samples", "helper_samples", ...}],
             "final": {...}}, ...],
   "summary": {method: {...}}, "init": "torch" | "he_lecun" | null}

* ``method`` is jsfl's name for what the authors' algorithm computes:
  ``MultiSFL`` -> ``multisfl``, ``SFL`` (their Training_SFL.py: every client
  trains copies of both global portions, both averaged) -> ``splitfedv1``,
  ``FL`` (their Training_FL.py) -> ``fedavg``.
* ``accuracy`` is in %, on the 10k test set, as in jsfl's metrics.jsonl.
* ``wall_s`` is the round's training and aggregation time without the
  evaluation (the span jsfl's ``wall_s`` covers); ``eval_s`` and
  ``round_s`` are there too, and ``cpu_s``, the process's CPU seconds over
  ``wall_s`` (logs written after it was added).  ``samples`` counts the client's own samples
  through part-1 over all local epochs (jsfl's ``samples``);
  ``helper_samples`` MultiSFL's replayed helper samples (jsfl's
  ``replay_samples``).
* ``final``: ``rounds_done``; ``median_last5`` (jsfl's headline figure: the
  median accuracy of the last 5 rounds); ``best_ma10`` (the authors'
  figure: the best 10-round moving average, the first rounds' shorter
  windows included, as their ``max_avg`` and jsfl's ``best_moving_average``);
  ``last``; ``samples_per_s`` (sum of samples / sum of wall_s) and
  ``samples_per_s_incl_helpers``; ``median_round_samples_per_s`` (the median
  of the rounds' samples / wall_s: a round stretched by a pause or a busy
  machine moves it little); ``samples_per_cpu_s`` (samples / CPU seconds, in
  logs that have ``cpu_s``); ``mean_wall_s``; for MultiSFL ``mean_p``.
* ``summary``: per method, the seeds' figures and their medians.
* ``init``: the small CNN's initialisation the runs used (``run.sh`` writes
  it to ``LOG_DIR/init``; null for a directory without that file).
* ``--csv``: the reference CSV ``jsfl report --reference`` reads
  (``method.name, method.replay, reference, reference_std``): per method the
  median over seeds of ``median_last5`` and its population std.
"""

from __future__ import annotations

import argparse
import glob
import json
import math
import os
import statistics
import sys

METHODS = {"MultiSFL": "multisfl", "SFL": "splitfedv1", "FL": "fedavg"}
ROUND_KEYS = ("round", "accuracy", "p", "p_next", "wall_s", "cpu_s", "samples", "helper_samples",
              "replay_requested", "replay_pool", "eval_s", "round_s", "loss")


def best_moving_average(values, window=10):
  best = -math.inf
  for i in range(len(values)):
    w = values[max(0, i + 1 - window):i + 1]
    best = max(best, sum(w) / len(w))
  return best


def read_run(path: str) -> dict:
  recs = {}
  with open(path) as f:
    for line in f:
      if line.strip():
        r = json.loads(line)
        recs[r["round"]] = r  # a rerun's later line wins
  if not recs:
    raise ValueError(f"{path}: no records")
  rows = []
  for n in sorted(recs):
    r = dict(recs[n])
    r["wall_s"] = r.pop("train_s")
    if "train_cpu_s" in r:
      r["cpu_s"] = r.pop("train_cpu_s")
    rows.append({k: r[k] for k in ROUND_KEYS if k in r})
  first = recs[min(recs)]
  return {"method": METHODS.get(first["algorithm"], first["algorithm"]),
          "algorithm": first["algorithm"], "seed": first["seed"],
          "log": os.path.basename(path), "rounds": rows}


def final_figures(run: dict) -> dict:
  rows = run["rounds"]
  acc = [r["accuracy"] for r in rows]
  wall = sum(r["wall_s"] for r in rows)
  samples = sum(r["samples"] for r in rows)
  helpers = sum(r.get("helper_samples", 0) for r in rows)
  out = {"rounds_done": rows[-1]["round"], "median_last5": statistics.median(acc[-5:]),
         "best_ma10": best_moving_average(acc, 10), "last": acc[-1],
         "mean_wall_s": wall / len(rows),
         "samples_per_s": samples / wall if wall else None,
         "samples_per_s_incl_helpers": (samples + helpers) / wall if wall else None,
         "median_round_samples_per_s": statistics.median(
             r["samples"] / r["wall_s"] for r in rows if r["wall_s"] > 0)}
  if all("cpu_s" in r for r in rows):
    cpu = sum(r["cpu_s"] for r in rows)
    out["samples_per_cpu_s"] = samples / cpu if cpu else None
  if any("p" in r for r in rows):
    ps = [r["p"] for r in rows if "p" in r]
    out["mean_p"] = sum(ps) / len(ps)
    out["max_p"] = max(ps)
  return out


REPLAY = {"multisfl": "adaptive"}  # their --MR 1 --DB 1: jsfl's method.replay


def reference_csv(summary, init) -> str:
  lines = ["# The authors' code (github.com/CodeFree-xzk/MultiSFL, authors_code/ here) run on the same setting"
           + (f", small CNN initialisation {init!r}" if init else "") + ":",
           "# per seed the median accuracy of the last 5 rounds, then the median (and population std) over",
           "# seeds; seeds " + ", ".join(f"{m} {s['seeds']}" for m, s in sorted(summary.items())) + ".",
           "method.name,method.replay,reference,reference_std"]
  for m in sorted(summary, key=lambda m: (m != "multisfl", m)):
    s = summary[m]
    lines.append(f"{m},{REPLAY.get(m, '')},{s['median_last5_median']:.2f},"
                 f"{statistics.pstdev(s['median_last5']):.2f}")
  return "\n".join(lines) + "\n"


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("log_dir")
  ap.add_argument("--out", help="write the JSON here instead of stdout")
  ap.add_argument("--csv", help="also write the reference CSV for jsfl report --reference")
  ap.add_argument("--rounds", type=int, default=0,
                  help="only runs with at least this many rounds enter the summary")
  a = ap.parse_args(argv)
  paths = sorted(glob.glob(os.path.join(a.log_dir, "*.jsonl")))
  if not paths:
    print(f"parse.py: no *.jsonl in {a.log_dir}", file=sys.stderr)
    return 1
  runs = []
  for p in paths:
    run = read_run(p)
    run["final"] = final_figures(run)
    runs.append(run)
  runs.sort(key=lambda r: (r["method"], r["seed"]))
  summary = {}
  for run in runs:
    if run["final"]["rounds_done"] < a.rounds:
      continue
    s = summary.setdefault(run["method"], {"seeds": [], "median_last5": [], "best_ma10": [],
                                           "samples_per_s": [], "mean_wall_s": []})
    s["seeds"].append(run["seed"])
    for k in ("median_last5", "best_ma10", "samples_per_s", "mean_wall_s"):
      s[k].append(run["final"][k])
  for s in summary.values():
    for k in ("median_last5", "best_ma10", "samples_per_s", "mean_wall_s"):
      s[k + "_median"] = statistics.median(s[k])
  init_file = os.path.join(a.log_dir, "init")
  init = open(init_file).read().strip() if os.path.exists(init_file) else None
  text = json.dumps({"runs": runs, "summary": summary, "init": init}, indent=1)
  if a.out:
    with open(a.out, "w") as f:
      f.write(text + "\n")
  else:
    print(text)
  if a.csv:
    with open(a.csv, "w") as f:
      f.write(reference_csv(summary, init))
  for m, s in summary.items():
    print(f"{m:11s} seeds {s['seeds']}: median of last 5 {s['median_last5_median']:.2f}, "
          f"best MA10 {s['best_ma10_median']:.2f}, {s['samples_per_s_median']:.0f} samples/s, "
          f"{s['mean_wall_s_median']:.1f} s/round (median over seeds)", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
