#!/usr/bin/env python3
"""Turns the per-round logs of the Hydra authors' runs into jsfl's statistics.

Usage: python3 parse.py LOG_DIR [--model small_cnn] [--rounds N] [--out FILE]
                       [--csv FILE] [--seeds 0-4] [--cells CELL ...]
       python3 parse.py --from-json A.json B.json ... [--csv FILE] [...]

Reads ``LOG_DIR/<model>/<cell>_seed<S>.jsonl`` (``jsfl_glue.record``, one file
per run, see ``run.sh``) and writes one JSON object (stdout or ``--out``):

  {"runs": [{"cell", "seed", "rounds": [{"round", "accuracy", "pg", "bw",
             "train_s", ...}], "final": {...}}, ...],
   "cells": {cell: {"config": {...}, "seeds": [...], "accuracy": {"median",
             "std"}, "pg": ..., "bw": ..., "per_position": [...]}}}

* ``accuracy`` (% of the 10k test set) and ``pg`` (percentage points) as
  their code computes them; ``bw`` is jsfl's backward transfer (their
  ``bw_score`` raises on the values it is given, see ``adapt.py``): at round
  r, the mean over labels of the largest drop from an earlier round to r.
* ``final`` per run, as ``jsfl report`` summarises a seed: the median of the
  last 5 rounds of accuracy, PG and BW, and for cyclic orders the per-position
  accuracy (label at position k of their client cycle; client i is dominant in
  label i); ``samples_per_s`` (samples / training seconds, evaluation left
  out) and ``samples_per_cpu_s``; ``s_per_round`` with evaluation.
* ``cells``: per cell the seeds' figures, their median and population std
  (jsfl report's statistic), and ``config``: the jsfl config fields of the
  matching cell of ``../authors.toml``.
* ``--csv``: the reference CSV ``jsfl report --reference`` reads: those
  fields, ``reference`` (median accuracy) and ``reference_std``.

``--from-json``: instead of LOG_DIR, the runs of earlier outputs of this
script (draws of other seeds, say) pooled, a later file's (cell, seed)
winning: the cells then hold every seed of every file, as one parse of all
their logs would.

Runs with fewer than ``--rounds`` rounds (default: the longest run's) are
left out, as are seeds outside ``--seeds`` (a range ``A-B`` or a list
``0,3,5``; default all) and cells outside ``--cells`` (default all).
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import statistics
import sys

# cell of run.sh -> the jsfl config fields of the same cell (../authors.toml);
# an empty value matches any (the field does not apply).
CELLS = {
    "sfl_cyclic": ("sfl", "cyclic", 1, ""),
    "hydra_cyclic": ("hydra", "cyclic", 1, 0),
    "sfl_random": ("sfl", "random", 1, ""),
    "hydra_random": ("hydra", "random", 1, 0),
    "sfl_cyclic_phi10": ("sfl", "cyclic", 10, ""),
    "hydra_cyclic_phi10": ("hydra", "cyclic", 10, 0),
    "hydra_cyclic_phi10_g5": ("hydra", "cyclic", 10, 5),
    "hydra_cyclic_phi10_g2": ("hydra", "cyclic", 10, 2),
    "splitfedv1": ("splitfedv1", "", "", ""),
    "splitfedv3": ("splitfedv3", "", "", ""),
    "multihead": ("multihead", "", "", ""),
    "mergesfl": ("mergesfl", "", "", ""),
}
FIELDS = ("method.name", "method.order", "method.batches_per_turn", "method.groups")
LAST = 5


def backward_transfer(history):
  """jsfl's BW over ``history`` (rounds x labels, %), None before round 2."""
  if len(history) < 2:
    return None
  last = history[-1]
  drops = [max(h[lab] - last[lab] for h in history[:-1]) for lab in range(len(last))]
  return sum(drops) / len(drops)


def read_run(path):
  recs = {}
  with open(path) as f:
    for line in f:
      if line.strip():
        r = json.loads(line)
        recs[r["round"]] = r  # a restarted run's later lines win
  rounds, history = [], []
  for k in sorted(recs):
    r = recs[k]
    history.append(r["per_label"])
    rounds.append({"round": k, "accuracy": r["accuracy"], "pg": r["pg"],
                   "bw": backward_transfer(history), "per_label": r["per_label"],
                   "label_order": r.get("label_order"), "samples": r["samples"],
                   "train_s": r["train_s"], "train_cpu_s": r["train_cpu_s"],
                   "eval_s": r["eval_s"]})
  return rounds


def median_last(rounds, key):
  vals = [r[key] for r in rounds[-LAST:] if r[key] is not None]
  return statistics.median(vals) if vals else None


def final(rounds):
  out = {"rounds_done": len(rounds), "accuracy": median_last(rounds, "accuracy"),
         "pg": median_last(rounds, "pg"), "bw": median_last(rounds, "bw"),
         "last": rounds[-1]["accuracy"]}
  order = rounds[-1]["label_order"]
  if order:
    per = [[r["per_label"][lab] for lab in order] for r in rounds[-LAST:]]
    out["per_position"] = [statistics.median(col) for col in zip(*per)]
  samples = sum(r["samples"] for r in rounds)
  out["samples_per_s"] = samples / sum(r["train_s"] for r in rounds)
  out["samples_per_cpu_s"] = samples / sum(r["train_cpu_s"] for r in rounds)
  out["s_per_round"] = statistics.median(r["train_s"] + r["eval_s"] for r in rounds)
  out["train_s_per_round"] = statistics.median(r["train_s"] for r in rounds)
  return out


def spread(values):
  values = [v for v in values if v is not None]
  if not values:
    return None
  return {"median": statistics.median(values), "std": statistics.pstdev(values)}


def seed_set(text):
  """``"0-4"`` or ``"0,3,5"`` -> a set of ints (None: ``text`` is empty)."""
  if not text:
    return None
  if re.fullmatch(r"\d+-\d+", text):
    a, b = map(int, text.split("-"))
    return set(range(a, b + 1))
  if re.fullmatch(r"\d+(,\d+)*", text):
    return {int(t) for t in text.split(",")}
  raise ValueError(f"--seeds {text!r}; allowed: a range A-B or a list 0,3,5")


def seed_text(seeds):
  """``[0, 1, 2, 5]`` -> ``0-2, 5``."""
  out, start = [], None
  for i, s in enumerate(seeds):
    if start is None:
      start = s
    if i + 1 == len(seeds) or seeds[i + 1] != s + 1:
      out.append(str(start) if start == s else f"{start}-{s}")
      start = None
  return ", ".join(out)


def parse(log_dir, model, rounds=None, seeds=None, cells=None):
  runs = []
  for path in sorted(glob.glob(os.path.join(log_dir, model, "*_seed*.jsonl"))):
    m = re.fullmatch(r"(.+)_seed(\d+)\.jsonl", os.path.basename(path))
    if not m or (seeds is not None and int(m.group(2)) not in seeds) or (
        cells and m.group(1) not in cells):
      continue
    rs = read_run(path)
    if rs:
      runs.append({"cell": m.group(1), "seed": int(m.group(2)), "rounds": rs})
  return summarize(runs, model, rounds)


def pool(paths, rounds=None, seeds=None, cells=None):
  """:func:`parse`'s result over the runs of earlier results (JSON files)."""
  runs, model = {}, None
  for p in paths:
    with open(p) as f:
      d = json.load(f)
    if model not in (None, d["model"]):
      raise ValueError(f"--from-json {p}: model {d['model']!r}, the others' {model!r}")
    model = d["model"]
    for r in d["runs"]:
      if (seeds is None or r["seed"] in seeds) and (not cells or r["cell"] in cells):
        runs[(r["cell"], r["seed"])] = {k: r[k] for k in ("cell", "seed", "rounds")}
  return summarize(sorted(runs.values(), key=lambda r: (r["cell"], r["seed"])), model,
                   rounds)


def summarize(runs, model, rounds=None):
  """The runs cut to ``rounds`` (default: the longest's), each with its
  ``final``, and every cell's figures over its seeds."""
  want = rounds or max((len(r["rounds"]) for r in runs), default=0)
  runs = [r for r in runs if len(r["rounds"]) >= want]
  for r in runs:
    r["rounds"] = r["rounds"][:want]
    r["final"] = final(r["rounds"])
  cells = {}
  for cell in CELLS:
    mine = sorted((r for r in runs if r["cell"] == cell), key=lambda r: r["seed"])
    if not mine:
      continue
    c = {"config": dict(zip(FIELDS, CELLS[cell])), "seeds": [r["seed"] for r in mine],
         "rounds": want}
    for key in ("accuracy", "pg", "bw", "samples_per_s", "samples_per_cpu_s",
                "s_per_round", "train_s_per_round"):
      c[key] = spread([r["final"][key] for r in mine])
    if all("per_position" in r["final"] for r in mine):
      c["per_position"] = [statistics.median(col) for col in
                           zip(*(r["final"]["per_position"] for r in mine))]
    cells[cell] = c
  return {"model": model, "runs": runs, "cells": cells}


def reference_csv(res, notes):
  lines = [f"# {n}" for n in notes]
  lines.append(",".join(FIELDS + ("reference", "reference_std")))
  for c in res["cells"].values():
    acc = c["accuracy"]
    lines.append(",".join(str(c["config"][f]) for f in FIELDS)
                 + f",{acc['median']:.2f},{acc['std']:.2f}")
  return "\n".join(lines) + "\n"


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("log_dir", nargs="?")
  ap.add_argument("--from-json", nargs="+", default=None, metavar="JSON",
                  help="pool the runs of these earlier outputs instead of reading LOG_DIR")
  ap.add_argument("--model", default="small_cnn", choices=("small_cnn", "mobilenet"))
  ap.add_argument("--rounds", type=int, default=None)
  ap.add_argument("--out", default=None)
  ap.add_argument("--csv", default=None)
  ap.add_argument("--seeds", default="", help="A-B or a,b,c (default: every seed found)")
  ap.add_argument("--cells", nargs="+", choices=sorted(CELLS), default=None)
  args = ap.parse_args(argv)
  try:
    seeds = seed_set(args.seeds)
  except ValueError as e:
    print(f"parse.py: {e}", file=sys.stderr)
    return 2
  if (args.log_dir is None) == (args.from_json is None):
    print("parse.py: give LOG_DIR or --from-json, not both", file=sys.stderr)
    return 2
  if args.from_json:
    try:
      res = pool(args.from_json, args.rounds, seeds, args.cells)
    except (OSError, ValueError, KeyError) as e:
      print(f"parse.py: {e}", file=sys.stderr)
      return 2
    args.model = res["model"]
  else:
    res = parse(args.log_dir, args.model, args.rounds, seeds, args.cells)
  if not res["cells"]:
    print(f"parse.py: no finished run under {args.log_dir or args.from_json}/{args.model}",
          file=sys.stderr)
    return 2
  text = json.dumps(res, indent=1)
  if args.out:
    with open(args.out, "w") as f:
      f.write(text + "\n")
  else:
    print(text)
  if args.csv:
    seeds = sorted({s for c in res["cells"].values() for s in c["seeds"]})
    over = f"seeds {', '.join(map(str, seeds))}."
    if any(c["seeds"] != seeds for c in res["cells"].values()):  # pooled draws
      over = "each cell's seeds: " + "; ".join(
        f"{cell} {seed_text(c['seeds'])}" for cell, c in res["cells"].items()) + "."
    notes = [f"The Hydra authors' code (authors_code/, {args.model}) on the same setting: per "
             f"seed the median accuracy of the last {LAST} of {next(iter(res['cells'].values()))['rounds']} "
             f"rounds, then the median (and population std) over {over}"]
    with open(args.csv, "w") as f:
      f.write(reference_csv(res, notes))
  for cell, c in res["cells"].items():
    print(f"{cell:24s} seeds {len(c['seeds'])}  acc {c['accuracy']['median']:6.2f} +- "
          f"{c['accuracy']['std']:.2f}  PG {c['pg']['median']:6.2f}  BW "
          f"{(c['bw'] or {}).get('median', float('nan')):6.2f}  "
          f"{c['samples_per_s']['median']:7.0f} samples/s", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
