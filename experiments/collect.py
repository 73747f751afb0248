"""Collects run directories into one results table (markdown + JSON).

Usage: python experiments/collect.py RUNS_DIR [RUNS_DIR...] --out PREFIX

Writes PREFIX.md and PREFIX.json: per run the Hydra summary (median of the
last 5 evaluated rounds per seed, median +- std over seeds) of accuracy, PG and
BW, the best median accuracy, the first round whose median accuracy over seeds
reached 85%, wall time, and the machine it ran on.
"""

from __future__ import annotations

import argparse
import json
import os
import platform

import numpy as np

from jsfl.rundir import read_metrics, write_json_atomic


def describe(run_dir: str) -> dict:
  cfg = json.load(open(os.path.join(run_dir, "config.json")))
  summ = json.load(open(os.path.join(run_dir, "summary.json")))
  recs = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
  c = cfg["config"]
  by_round: dict[int, list] = {}
  for r in recs:
    by_round.setdefault(r["round"], []).append(r["accuracy"])
  med = {k: float(np.median(v)) for k, v in sorted(by_round.items())}
  first85 = next((k for k, v in med.items() if v >= 85.0), None)
  # Per-position accuracy (cyclic orders): median over the last 5 evaluated
  # rounds and the seeds, position 1 = first label group served in a step.
  pos = [r["per_position_accuracy"] for r in recs if r.get("per_position_accuracy")]
  last = sorted(by_round)[-5:]
  pos_last = [r["per_position_accuracy"] for r in recs
              if r.get("per_position_accuracy") and r["round"] in last]
  per_position = (np.median(np.array(pos_last), axis=0).round(2).tolist()
                  if pos else None)
  part = dict(c["partition"])
  pdesc = part.pop("name") + "".join(f" {k}={v}" for k, v in part.items() if k != "num_clients")
  return {
      "run": os.path.basename(run_dir.rstrip("/")), "method": method_label(c["method"]),
      "order": c["method"]["order"], "partition": pdesc, "dataset": c["dataset"]["name"],
      "model": c["model"]["name"], "clients": c["partition"]["num_clients"],
      "rounds": c["run"]["rounds"], "seeds": summ["seeds"],
      "accuracy": summ["accuracy"], "pg": summ["pg"], "bw": summ["bw"],
      "best_median_accuracy": max(med.values()), "first_round_median_ge_85": first85,
      "median_accuracy_by_round": med, "per_position_accuracy": per_position,
      "cut": cfg["resolved"]["cut"],
      "wall_s": float(sum(r["wall_s"] for r in recs if r["seed"] == summ["seeds"][0])),
      "device": cfg["device"], "versions": cfg["versions"],
  }


def method_label(m: dict) -> str:
  """The method name plus its method-specific options that are not default."""
  from jsfl.config import method_options
  options = method_options(m["name"])
  shown = [f"{k}={m[k]}" for k, opt in options.items() if k in m and m[k] != opt.default]
  return m["name"] + (f" ({', '.join(shown)})" if shown else "")


def fmt(e):
  if not e or e.get("median") is None:
    return "-"
  return f"{e['median']:.2f} +- {e['std']:.2f}"


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("dirs", nargs="+")
  ap.add_argument("--out", required=True)
  a = ap.parse_args()
  runs = []
  for d in a.dirs:
    subs = [os.path.join(d, s) for s in sorted(os.listdir(d))]
    for s in ([d] if os.path.exists(os.path.join(d, "summary.json")) else subs):
      if os.path.exists(os.path.join(s, "summary.json")):
        runs.append(describe(s))
  lines = ["| method | partition | order | cut | seeds | accuracy (%) | PG (pp) | BW (pp) | best median acc | first round >= 85% | wall (s) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in runs:
    lines.append(f"| {r['method']} | {r['partition']} | {r['order']} | {r['cut']} | {len(r['seeds'])} | "
                 f"{fmt(r['accuracy'])} | {fmt(r['pg'])} | {fmt(r['bw'])} | "
                 f"{r['best_median_accuracy']:.2f} | {r['first_round_median_ge_85'] or '-'} | "
                 f"{r['wall_s']:.0f} |")
  machine = {"platform": platform.platform(), "processor": platform.machine(),
             "cpus": os.cpu_count(), "device": runs[0]["device"] if runs else None}
  pp = [r for r in runs if r["per_position_accuracy"]]
  if pp:
    lines += ["", "Per-position accuracy (%), cyclic order, median over the last 5 evaluated "
              "rounds and seeds; position 1 is served first in every batch step:", "",
              "| run | " + " | ".join(str(i + 1) for i in range(len(pp[0]["per_position_accuracy"])))
              + " |", "| --- |" + " --- |" * len(pp[0]["per_position_accuracy"])]
    for r in pp:
      lines.append(f"| {r['run']} | " + " | ".join(f"{v:.1f}" for v in r["per_position_accuracy"])
                   + " |")
  text = "\n".join(lines)
  print(text)
  os.makedirs(os.path.dirname(a.out) or ".", exist_ok=True)
  with open(a.out + ".md", "w") as f:
    f.write(f"Machine: {machine}\n\nSummary: median of the last 5 evaluated rounds per seed, "
            f"then median +- std over seeds.\n\n{text}\n")
  write_json_atomic(a.out + ".json", {"machine": machine, "runs": runs})


if __name__ == "__main__":
  main()
