"""Tables and learning curves of the sequential-FL runs, next to SFedKD's figures.

Usage: python experiments/sequential/collect_sequential.py RUNS_DIR --out PREFIX

Reads every run directory under RUNS_DIR (``config.json``, ``summary.json``,
``metrics.jsonl``; runs are named by ``run.name`` as in run_sequential.sh) and
writes PREFIX.md (Table 1, the teacher-number ablation, greedy vs random
selection), PREFIX.json (every figure, per-seed values and the median
accuracy of every evaluated round) and PREFIX_curves.png (median test
accuracy over seeds per round, min-max band) when matplotlib is installed.

Figures are Hydra's summary (SPEC 1.4): per seed the median accuracy of the
last 5 evaluated rounds, then median +- std over seeds.  The paper's numbers
(SFedKD Table 1, Fashion-MNIST; mean +- std of its runs at 1000 rounds) are
printed next to ours; the ablations' paper figures are on CIFAR-10 only, so
none are shown for them.
"""

from __future__ import annotations

import argparse
import json
import os

import numpy as np

from jsfl.rundir import read_metrics, write_json_atomic

METHODS = ("fedavg", "fedprox", "fedcurv", "fedntd", "fedseq", "cwc", "sfedkd")
LABELS = {"fedavg": "FedAvg", "fedprox": "FedProx", "fedcurv": "FedCurv",
          "fedntd": "FedNTD", "fedseq": "FedSeq", "cwc": "CWC", "sfedkd": "SFedKD"}
# SFedKD Table 1, Fashion-MNIST (LeNet-5, 1000 rounds): mean, std.
PAPER = {
    "0.5": {"fedavg": (76.00, 2.37), "fedprox": (76.13, 2.16), "fedcurv": (75.73, 2.25),
            "fedntd": (76.18, 3.05), "fedseq": (81.81, 1.37), "cwc": (81.85, 1.38),
            "sfedkd": (83.66, 1.42)},
    "10.0": {"fedavg": (82.91, 0.71), "fedprox": (82.89, 0.78), "fedcurv": (82.95, 0.83),
             "fedntd": (82.62, 0.86), "fedseq": (82.56, 0.53), "cwc": (82.94, 0.37),
             "sfedkd": (83.42, 1.12)},
}


def describe(run_dir: str) -> dict:
  with open(os.path.join(run_dir, "config.json")) as f:
    cfg = json.load(f)
  with open(os.path.join(run_dir, "summary.json")) as f:
    summ = json.load(f)
  recs = read_metrics(os.path.join(run_dir, "metrics.jsonl"))
  c = cfg["config"]
  by_round: dict[int, list] = {}
  for r in recs:
    by_round.setdefault(r["round"], []).append(r["accuracy"])
  seeds = summ["seeds"]
  return {
      "run": os.path.basename(run_dir.rstrip("/")), "name": c["run"]["name"],
      "method": c["method"]["name"], "alpha": str(float(c["partition"]["alpha"])),
      "num_teachers": c["method"].get("num_teachers"),
      "selection": c["method"].get("selection"), "mu": c["method"].get("mu"),
      "rounds": c["run"]["rounds"], "seeds": seeds,
      "train_subset": c["dataset"].get("train_subset"),
      "accuracy": summ["accuracy"],
      "rounds_axis": sorted(by_round),
      "median_by_round": [float(np.median(by_round[k])) for k in sorted(by_round)],
      "min_by_round": [float(np.min(by_round[k])) for k in sorted(by_round)],
      "max_by_round": [float(np.max(by_round[k])) for k in sorted(by_round)],
      # Records exist for evaluated rounds only: report the median round.
      "round_wall_s": float(np.median([r["wall_s"] for r in recs if r["seed"] == seeds[0]])),
      "device": cfg["device"],
  }


def fmt(e) -> str:
  return "-" if not e else f"{e['median']:.2f} +- {e['std']:.2f}"


def find(runs, name):
  return next((r for r in runs if r["name"] == name), None)


def tables(runs) -> list[str]:
  lines = ["## Table 1: Fashion-MNIST, LeNet-5 (ours vs SFedKD's Table 1)", "",
           "| method | ExDir(2, 0.5) ours | paper | ExDir(2, 10.0) ours | paper |",
           "| --- | --- | --- | --- | --- |"]
  for m in METHODS:
    row = [LABELS[m]]
    for a in ("0.5", "10.0"):
      r = find(runs, f"{m}_a{a}")
      p = PAPER[a][m]
      row += [fmt(r["accuracy"]) if r else "-", f"{p[0]:.2f} +- {p[1]:.2f}"]
    lines.append("| " + " | ".join(row) + " |")
  rounds = {a: sorted({r["rounds"] for r in runs if r["alpha"] == a}) for a in ("0.5", "10.0")}
  lines += ["", (f"Rounds: ExDir(2, 0.5) {rounds['0.5']}, ExDir(2, 10.0) "
                 f"{rounds['10.0']} (the paper: 1000)."), ""]
  lines += ["## Teacher number (Fig. 4's ablation, here on Fashion-MNIST ExDir(2, 0.5))", "",
            "| teachers M | selection | accuracy (%) |", "| --- | --- | --- |"]
  for m, name in ((0, "fedseq_a0.5"), (1, "sfedkd_m1_a0.5"), (3, "sfedkd_m3_a0.5"),
                  (5, "sfedkd_a0.5")):
    r = find(runs, name)
    lines.append(f"| {m} | {'- (FedSeq)' if m == 0 else 'greedy'} | "
                 f"{fmt(r['accuracy']) if r else '-'} |")
  lines += ["", ("## Greedy vs random teacher selection (Table 3's ablation, here on "
                 "Fashion-MNIST ExDir(2, 0.5))"), "",
            "| M | greedy (TS) | random | advantage (pp) |", "| --- | --- | --- | --- |"]
  for m, gname in ((3, "sfedkd_m3_a0.5"), (5, "sfedkd_a0.5")):
    g, rnd = find(runs, gname), find(runs, f"sfedkd_random_m{m}_a0.5")
    adv = (f"{g['accuracy']['median'] - rnd['accuracy']['median']:+.2f}"
           if g and rnd else "-")
    lines.append(f"| {m} | {fmt(g['accuracy']) if g else '-'} | "
                 f"{fmt(rnd['accuracy']) if rnd else '-'} | {adv} |")
  lines += ["", "## Runs", "", ("| run | method | rounds | seeds | train subset | "
                                 "accuracy (%) | per-seed | round wall (s, all seeds) |"),
            "| --- | --- | --- | --- | --- | --- | --- | --- |"]
  for r in runs:
    method = r["method"] + (f" (mu={r['mu']})" if r["mu"] is not None else "")
    per_seed = ", ".join(f"{v:.1f}" for v in r["accuracy"]["per_seed"])
    lines.append(f"| {r['run']} | {method} | {r['rounds']} | {len(r['seeds'])} | "
                 f"{r['train_subset'] or 'all'} | {fmt(r['accuracy'])} | {per_seed} | "
                 f"{r['round_wall_s']:.1f} |")
  return lines


def plot(runs, path) -> bool:
  try:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
  except ImportError:
    return False
  panels = [("ExDir(2, 0.5)", [f"{m}_a0.5" for m in METHODS]),
            ("ExDir(2, 10.0)", [f"{m}_a10.0" for m in METHODS]),
            ("SFedKD ablations, ExDir(2, 0.5)",
             ["fedseq_a0.5", "sfedkd_m1_a0.5", "sfedkd_m3_a0.5", "sfedkd_a0.5",
              "sfedkd_random_m3_a0.5", "sfedkd_random_m5_a0.5"])]
  fig, axes = plt.subplots(1, 3, figsize=(18, 5))
  for ax, (title, names) in zip(axes, panels):
    for name in names:
      r = find(runs, name)
      if not r:
        continue
      label = name.replace("_a0.5", "").replace("_a10.0", "")
      x = r["rounds_axis"]
      (line,) = ax.plot(x, r["median_by_round"], label=label,
                        ls="--" if "random" in name else "-")
      ax.fill_between(x, r["min_by_round"], r["max_by_round"], alpha=0.15,
                      color=line.get_color())
    ax.set_title(f"Fashion-MNIST {title}")
    ax.set_xlabel("round")
    ax.set_ylabel("test accuracy (%), median over seeds")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
      ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=110)
  return True


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("dirs", nargs="+")
  ap.add_argument("--out", required=True)
  a = ap.parse_args()
  runs = []
  for d in a.dirs:
    for s in sorted(os.listdir(d)):
      s = os.path.join(d, s)
      if os.path.exists(os.path.join(s, "summary.json")):
        runs.append(describe(s))
  lines = tables(runs)
  with open(a.out + ".md", "w") as f:
    f.write("\n".join(lines) + "\n")
  write_json_atomic(a.out + ".json", {"runs": runs, "paper_table1_fmnist": PAPER})
  if plot(runs, a.out + "_curves.png"):
    print(f"wrote {a.out}_curves.png")
  print("\n".join(lines))


if __name__ == "__main__":
  main()
