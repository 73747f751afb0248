"""Is a cell's gap between jsfl and the authors' code more than the seeds'
spread?  A permutation test on the per-seed figures.

Per seed both sides' statistic is the median accuracy of the last 5 rounds
(``jsfl report``'s, and ``parse.py``'s for their runs).  For each cell found
on both sides: the seeds of each, the median over seeds of each, their
difference, and the two-sided permutation p-value of that difference (the
seeds of both sides pooled and relabelled at random, 20,000 draws): a small
p says the two codes' seed distributions differ; a large one that the gap
is what two draws of this many seeds give.

    python3 experiments/hydra/authors_code/seed_test.py \
        --jsfl experiments/hydra/results/authors_mobilenet/collected/report_seeds.csv \
        --authors experiments/hydra/authors_code/results/mobilenet{,_seeds5_9,_phi10_seeds5_9,_sfl_seeds10_19,_sfl_random_seeds20_29,_sfl_random_seeds30_39}.json \
        --out experiments/hydra/authors_code/results/mobilenet_seed_test.json
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics

import numpy as np

KEYS = ("method.name", "method.order", "method.batches_per_turn", "method.groups")


# what a report leaves out of its columns when every row shares it
DEFAULTS = {"method.batches_per_turn": "1"}


def _key(cfg: dict) -> tuple[str, ...]:
  """A cell's identity from its config values (``-`` / ``""`` / 0 groups alike)."""
  out = []
  for k in KEYS:
    v = str(cfg.get(k, DEFAULTS.get(k, ""))).strip()
    out.append("" if v in ("-", "0", "None") else v)
  return tuple(out)


def jsfl_seeds(paths) -> dict[tuple, dict[int, float]]:
  """Per cell, per seed, jsfl's figure (``report_seeds.csv`` rows)."""
  cells: dict[tuple, dict[int, float]] = {}
  for p in paths:
    with open(p) as f:
      for row in csv.DictReader(f):
        cells.setdefault(_key(row), {})[int(row["seed"])] = float(row["accuracy"])
  return cells


def authors_seeds(paths) -> dict[tuple, dict[int, float]]:
  """Per cell, per seed, their run's figure (``parse.py``'s ``final``)."""
  cells: dict[tuple, dict[int, float]] = {}
  for p in paths:
    with open(p) as f:
      d = json.load(f)
    config = {name: _key(c["config"]) for name, c in d["cells"].items()}
    for run in d["runs"]:
      if run["cell"] in config:
        cells.setdefault(config[run["cell"]], {})[int(run["seed"])] = run["final"]["accuracy"]
  return cells


def permutation_p(a, b, draws: int = 20000, seed: int = 0) -> float:
  a, b = np.asarray(a, float), np.asarray(b, float)
  observed = abs(np.median(a) - np.median(b))
  pooled = np.concatenate([a, b])
  rng = np.random.default_rng(seed)
  hits = 0
  for _ in range(draws):
    p = rng.permutation(pooled)
    hits += abs(np.median(p[:len(a)]) - np.median(p[len(a):])) >= observed - 1e-12
  return (hits + 1) / (draws + 1)


def main(argv=None) -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--jsfl", nargs="+", required=True, help="report_seeds.csv files")
  ap.add_argument("--authors", nargs="+", required=True, help="parse.py --out files")
  ap.add_argument("--out")
  args = ap.parse_args(argv)
  ours, theirs = jsfl_seeds(args.jsfl), authors_seeds(args.authors)
  rows = []
  for key in ours:
    # a field their cell leaves empty (a baseline's order) matches any of jsfl's
    match = [key] if key in theirs else [
        k for k in theirs if all(t in ("", o) for t, o in zip(k, key, strict=True))]
    if len(match) != 1:
      continue
    a, b = ours[key], theirs[match[0]]
    ma, mb = statistics.median(a.values()), statistics.median(b.values())
    row = {"cell": dict(zip(KEYS, key, strict=True)), "jsfl_seeds": sorted(a),
           "authors_seeds": sorted(b), "jsfl": ma, "authors": mb, "gap": ma - mb,
           "p": permutation_p(list(a.values()), list(b.values()))}
    rows.append(row)
    name = ", ".join(v for v in key if v)
    print(f"{name:32s} seeds {len(a):2d}/{len(b):2d}  jsfl {ma:6.2f}  authors {mb:6.2f}  "
          f"gap {ma - mb:+6.2f}  p {row['p']:.3f}")
  if args.out:
    with open(args.out, "w") as f:
      json.dump(rows, f, indent=1)
      f.write("\n")


if __name__ == "__main__":
  main()
