#!/usr/bin/env python3
"""Learning curves of jsfl and of the authors' code, side by side, per method.

Usage: python experiments/multisfl/authors_code/curves.py AUTHORS_JSON RUN_DIR... --out PNG
         [--rounds 50]

AUTHORS_JSON is what ``parse.py`` writes (the authors' runs, round by round);
each RUN_DIR a jsfl run directory (``metrics.jsonl``, ``config.json``) of
the same setting.  Methods are matched by jsfl's name (``config.json``'s
``method.name``; a MultiSFL run with ``method.replay`` other than
``adaptive`` is an ablation and has no counterpart in their code, so it is
skipped).  One panel per method: the median test accuracy over seeds per
round, with a band from the lowest to the highest seed, jsfl against
theirs; for MultiSFL one more panel, the sampling proportion p_r per round
(the same statistics).  Beside the PNG (``--out``) goes a JSON with the
plotted medians and the seeds each side has, so the figure's numbers can be
read without the image.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

ORDER = ("multisfl", "splitfedv1", "fedavg")
TITLES = {"multisfl": "MultiSFL", "splitfedv1": "SplitFedV1 (their SFL)", "fedavg": "FedAvg"}


def _series(rows_by_seed: dict[int, list[dict]], key: str) -> dict:
  """Per round the median, lowest and highest value over the seeds that have it."""
  per_round: dict[int, list[float]] = {}
  for rows in rows_by_seed.values():
    for r in rows:
      v = r.get(key)
      if v is not None:
        per_round.setdefault(int(r["round"]), []).append(float(v))
  rounds = sorted(per_round)
  return {"round": rounds,
          "median": [statistics.median(per_round[t]) for t in rounds],
          "low": [min(per_round[t]) for t in rounds],
          "high": [max(per_round[t]) for t in rounds],
          "seeds": sorted(rows_by_seed)}


def load_authors(path: str, rounds: int) -> dict[str, dict[int, list[dict]]]:
  """Their finished runs (``rounds`` rounds), by method and seed."""
  with open(path) as f:
    runs = json.load(f)["runs"]
  out: dict[str, dict[int, list[dict]]] = {}
  for run in runs:
    if run["final"]["rounds_done"] < rounds:
      print(f"{path}: {run['method']} seed {run['seed']} has {run['final']['rounds_done']} of "
            f"{rounds} rounds; left out", file=sys.stderr)
      continue
    out.setdefault(run["method"], {})[int(run["seed"])] = run["rounds"]
  return out


def load_jsfl(run_dir: str) -> tuple[str, dict[int, list[dict]]] | None:
  from jsfl import reading
  run = reading.load_run(run_dir)
  for problem in run.problems:
    print(problem, file=sys.stderr)
  method = run.config.get("method", {})
  name = method.get("name")
  if name == "multisfl" and method.get("replay", "adaptive") != "adaptive":
    return None
  rows: dict[int, list[dict]] = {}
  for r in run.records:
    rows.setdefault(int(r["seed"]), []).append(r)
  return name, rows


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("authors_json")
  ap.add_argument("run_dirs", nargs="+")
  ap.add_argument("--out", required=True, help="PNG path; the JSON goes beside it")
  ap.add_argument("--rounds", type=int, default=50,
                  help="the authors' runs with fewer rounds (unfinished) are left out")
  args = ap.parse_args(argv)

  theirs = load_authors(args.authors_json, args.rounds)
  ours: dict[str, dict[int, list[dict]]] = {}
  for d in args.run_dirs:
    got = load_jsfl(d)
    if got is not None:
      ours[got[0]] = got[1]
  methods = [m for m in ORDER if m in ours and m in theirs]
  if not methods:
    print(f"no method is in both {args.authors_json} and the run directories", file=sys.stderr)
    return 2
  panels = [(m, "accuracy") for m in methods]
  if "multisfl" in methods:
    panels.append(("multisfl", "p"))

  from jsfl import plots
  fig = plots.require_matplotlib()(figsize=(4.0 * len(panels), 4.0), dpi=100, layout="constrained")
  axes = fig.subplots(1, len(panels), squeeze=False)[0]
  data: dict = {}
  for ax, (m, key) in zip(axes, panels):
    for who, runs, color in (("jsfl", ours[m], "tab:blue"), ("authors' code", theirs[m],
                                                              "tab:orange")):
      s = _series(runs, key)
      data.setdefault(f"{m}.{key}", {})[who] = s
      ax.plot(s["round"], s["median"], color=color,
              label=f"{who} ({len(s['seeds'])} seeds)")
      ax.fill_between(s["round"], s["low"], s["high"], color=color, alpha=0.2, linewidth=0)
    ax.set_title(TITLES[m] + (": sampling proportion p_r" if key == "p" else ""), fontsize=10)
    ax.set_xlabel("round")
    ax.set_ylabel("p_r" if key == "p" else "test accuracy (%)")
    if key == "accuracy":
      ax.set_ylim(40, 90)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="lower right" if key == "accuracy" else "best")
  fig.suptitle("Fashion-MNIST, Dirichlet 0.1, E = 5: median over seeds, band lowest to "
               "highest seed", fontsize=10)
  os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
  fig.savefig(args.out)
  with open(os.path.splitext(args.out)[0] + ".json", "w") as f:
    json.dump(data, f, indent=1)
  for m in methods:
    a, b = data[f"{m}.accuracy"]["jsfl"], data[f"{m}.accuracy"]["authors' code"]
    print(f"{m:11s} round {a['round'][-1]}: jsfl {a['median'][-1]:.2f} ({len(a['seeds'])} seeds), "
          f"authors' code {b['median'][-1]:.2f} ({len(b['seeds'])} seeds)")
  print(args.out)
  return 0


if __name__ == "__main__":
  sys.exit(main())
