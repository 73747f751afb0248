"""Seed-runs per hour, jsfl against the authors' code, from
``hydra_vs_authors.py`` result files: one bar pair per model and cell, each
side's seed-runs per hour (medians over the file's repeats), the ratio
written above; a dashed line marks 2x the authors' figure.

    python benchmarks/plot_vs_authors.py \\
        benchmarks/results/hydra_vs_authors-small_cnn-vm-20261125-121340.json \\
        benchmarks/results/hydra_vs_authors-small_cnn-vm-20261125-122143.json \\
        benchmarks/results/hydra_vs_authors-mobilenet-vm-20261125-124158.json \\
        benchmarks/results/hydra_vs_authors-multisfl-vm-20261125-133408.json \\
        --out benchmarks/results/vs_authors-equal-cores-vm-20261125.png
"""

from __future__ import annotations

import argparse
import json
import statistics


def bars(paths: list[str]) -> list[tuple[str, float, float]]:
  """``(label, authors, jsfl)`` seed-runs per hour per model and cell."""
  out = []
  for path in paths:
    with open(path) as f:
      d = json.load(f)
    a = d["args"]
    for cell in a["cells"]:
      med = {side: statistics.median(r["seed_runs_per_hour"] for r in d["rows"]
                                     if r["cell"] == cell and r["side"] == side)
             for side in ("authors", "jsfl")}
      label = (f"{a['model']}\n{cell}\n{a.get('cache', 'off')} cache, "
               f"{a['procs']} procs / {a['seeds']} seeds")
      out.append((label, med["authors"], med["jsfl"]))
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("results", nargs="+")
  ap.add_argument("--out", required=True)
  args = ap.parse_args()
  import matplotlib
  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  rows = bars(args.results)
  fig, ax = plt.subplots(figsize=(1.9 * len(rows) + 1.5, 4.2))
  for i, (_, authors, jsfl) in enumerate(rows):
    ax.bar(i - 0.2, authors, 0.4, color="tab:gray", label="authors' code" if i == 0 else None)
    ax.bar(i + 0.2, jsfl, 0.4, color="tab:blue", label="jsfl" if i == 0 else None)
    ax.hlines(2 * authors, i - 0.4, i + 0.4, colors="k", linestyles="dashed",
              label="2x the authors'" if i == 0 else None)
    ax.text(i + 0.2, jsfl, f"{jsfl / authors:.2f}x", ha="center", va="bottom", fontsize=8)
  ax.set_xticks(range(len(rows)), [r[0] for r in rows], fontsize=7)
  ax.set_ylabel("seed-runs per hour (equal cores)")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(args.out, dpi=120)
  print(f"wrote {args.out}")


if __name__ == "__main__":
  main()
