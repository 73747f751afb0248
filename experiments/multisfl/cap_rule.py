"""How far the self-balancing Dirichlet's two cap rules move a split.

Usage: python experiments/multisfl/cap_rule.py [--clients 100] [--alphas 0.1,0.5]
  [--seeds 100] [--out DIR]

``partition.cap_rule = "reached"`` closes a client at N/K samples and gives
a cut's rounding remainder to the last client, as the MultiSFL authors'
``separate_data`` does; ``"exceeded"`` (the rule of every committed MultiSFL
run, written before the option) closes it only above N/K and gives the
remainder to the last client with a share (docs/setting.md#partitions).
For each alpha and seed this draws both from the same generator on
Fashion-MNIST's training labels and counts the seeds whose splits differ
and the samples that change client (half the summed absolute difference of
the label-count tables); a seed where one rule met ``min_size`` on another
draw than the other has unrelated splits, counted apart (more than a tenth of
the samples moved). Prints one line per alpha and writes them with the
machine to ``OUT/cap_rule-<stamp>.json`` (default
``experiments/multisfl/results/cap_rule/``).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time

import numpy as np

from jsfl import partitions
from jsfl.data import load_dataset

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results", "cap_rule")


def moved(labels: np.ndarray, clients: int, alpha: float, seed: int) -> int:
  """Samples that change client between the two rules' splits of one seed."""
  counts = [partitions.label_counts(partitions.make_partition(
      "dirichlet", labels, clients, seed=seed, num_classes=10, alpha=alpha,
      self_balancing=True, cap_rule=rule), labels, 10) for rule in ("reached", "exceeded")]
  return int(np.abs(counts[0] - counts[1]).sum()) // 2


def main():
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--clients", type=int, default=100)
  ap.add_argument("--alphas", default="0.1,0.5")
  ap.add_argument("--seeds", type=int, default=100)
  ap.add_argument("--out", default=OUT)
  args = ap.parse_args()
  labels = load_dataset("fashion_mnist").y_train
  rows = []
  for alpha in (float(a) for a in args.alphas.split(",")):
    per_seed = [moved(labels, args.clients, alpha, s) for s in range(args.seeds)]
    differ = [m for m in per_seed if m]
    # one rule's first draw kept, the other's redrawn for min_size: unrelated splits
    redrawn = [m for m in differ if m > len(labels) // 10]
    near = [m for m in differ if m <= len(labels) // 10]
    row = {"alpha": alpha, "clients": args.clients, "seeds": args.seeds,
           "seeds_differing": len(differ), "seeds_redrawn": len(redrawn),
           "moved_median": float(np.median(near)) if near else 0.0,
           "moved_max": max(near, default=0), "samples": len(labels),
           "moved_per_seed": per_seed}
    rows.append(row)
    print(f"alpha {alpha}: {len(differ)} of {args.seeds} seeds differ, {len(redrawn)} of "
          f"them redrawn (more than a tenth of the samples moved); in the others "
          f"median {row['moved_median']:g}, max {row['moved_max']} of {len(labels)} "
          "samples change client")
  os.makedirs(args.out, exist_ok=True)
  path = os.path.join(args.out, f"cap_rule-{time.strftime('%Y%m%d-%H%M%S')}.json")
  res = {"rows": rows, "command": "python experiments/multisfl/cap_rule.py "
         f"--clients {args.clients} --alphas {args.alphas} --seeds {args.seeds}",
         "machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                     "python": platform.python_version(), "numpy": np.__version__}}
  with open(path + ".tmp", "w") as f:
    json.dump(res, f, indent=1)
  os.replace(path + ".tmp", path)
  print(path)


if __name__ == "__main__":
  main()
