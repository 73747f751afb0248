"""The client index sets the Hydra authors' partitioner draws, for jsfl's test
that its ``labelwise`` partition is the same split.

Runs their ``LabelwisePartitioner`` and ``non_iid_partition`` (read from a
clone's ``get_data.py`` and executed alone: they need only NumPy and Python's
``random``, so no torch) on

* jsfl's stratified 6,000-image Fashion-MNIST subset at p = 0.8 and 0.6 on
  10 clients (the cross-check setting; the subset computed as
  ``jsfl_glue.train_subset`` computes it), and
* a synthetic label vector with unequal label sizes (``synthetic_labels``) on
  10 and 20 clients, where rounding runs past a label's end, and on 10
  clients under their CIFAR-10 sharding matrix (``sharding_matrix``, the
  loop their ``get_data.py`` runs for ``data_pattern == -1`` inline, so
  written out here), and under their IID shares (``data_pattern == 0``:
  1 / K of every label) on 10 and 20 clients,

with their seed 2020, and writes for each case the per-client sizes and a
SHA-256 of the sorted index lists to ``tests/data/labelwise_reference.json``.

    /work/authors/venv/bin/python \
        experiments/hydra/authors_code/partition_reference.py /work/authors/Hydra

(the venv of README step 2: the subset comes from `jsfl_glue`, which imports
torch; the Fashion-MNIST case needs the IDX files, see ``fmnist_idx.py``).
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import json
import os
import random
import sys

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
OUT = os.path.join(HERE, "..", "..", "..", "tests", "data", "labelwise_reference.json")


def synthetic_labels() -> np.ndarray:
  """Labels 0-9 with 37 + 13 l samples of label l, in a fixed shuffled order."""
  y = np.repeat(np.arange(10), 37 + 13 * np.arange(10))
  return np.random.default_rng(7).permutation(y).astype(np.int64)


def fingerprint(parts) -> dict:
  """Sizes and a SHA-256 of the sorted int64 index lists, client by client."""
  h = hashlib.sha256()
  sizes = []
  for p in parts:
    arr = np.sort(np.asarray(p, dtype=np.int64))
    sizes.append(int(arr.size))
    h.update(arr.tobytes())
    h.update(b"|")
  return {"sizes": sizes, "sha256": h.hexdigest()}


def their_functions(clone: str):
  """``LabelwisePartitioner`` and ``non_iid_partition`` from their file."""
  src = open(os.path.join(clone, "get_data.py")).read()
  keep = [node for node in ast.parse(src).body
          if getattr(node, "name", None) in ("LabelwisePartitioner", "non_iid_partition")]
  if len(keep) != 2:
    sys.exit(f"{clone}/get_data.py: LabelwisePartitioner / non_iid_partition not found")
  scope = {"np": np, "random": random}
  exec(compile(ast.Module(body=keep, type_ignores=[]), "get_data.py", "exec"), scope)
  return scope["LabelwisePartitioner"], scope["non_iid_partition"]


def sharding_matrix(ratio: float, classes: int, workers: int) -> np.ndarray:
  """Their sharding fractions (``get_data.py``, ``data_pattern == -1``):
  ``ratio / 2`` where ``c % 10 == l or (c + 1) % 10 == l``, else
  ``(1 - ratio) / (workers - 1)``."""
  sizes = np.zeros((classes, workers))
  for c in range(workers):
    for lab in range(classes):
      lead = c % 10 == lab or (c + 1) % 10 == lab
      sizes[lab][c] = ratio / 2 if lead else (1 - ratio) / (workers - 1)
  return sizes


class _Data:
  """What their partitioner reads of a torchvision dataset."""

  def __init__(self, y):
    self.targets = list(int(v) for v in y)
    self.classes = list(range(int(max(y)) + 1))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("clone", help="a clone of their repository (adapted or not)")
  ap.add_argument("--out", default=OUT)
  args = ap.parse_args()
  partitioner, sizes_matrix = their_functions(args.clone)

  def draw(y, k, p):
    part = partitioner(_Data(y), partition_sizes=sizes_matrix(p, 10, k), class_num=10)
    return fingerprint(part.partitions)

  cases = {}
  y = synthetic_labels()
  for k in (10, 20):
    cases[f"synthetic_k{k}_p0.8"] = {"labels": "synthetic", "clients": k, "p": 0.8,
                                     **draw(y, k, 0.8)}
  for k in (10, 20):  # their IID (--alpha 0, data_pattern == 0): 1 / K of every label
    part = partitioner(_Data(y), partition_sizes=np.ones((10, k)) / k, class_num=10)
    cases[f"synthetic_k{k}_iid"] = {"labels": "synthetic", "clients": k, "p": 1 / k,
                                    **fingerprint(part.partitions)}
  part = partitioner(_Data(y), partition_sizes=sharding_matrix(0.8, 10, 10), class_num=10)
  cases["synthetic_k10_sharding0.8"] = {"labels": "synthetic", "clients": 10, "p": 0.8,
                                        "dominant_clients": 2, **fingerprint(part.partitions)}
  sys.path.insert(0, os.path.join(HERE, "..", "..", "multisfl", "authors_code"))
  sys.path.insert(0, HERE)
  import fmnist_idx  # noqa: E402
  import jsfl_glue  # noqa: E402  (its train_subset: jsfl's 6k subset)
  _, y_all = fmnist_idx.load(train=True)
  y6k = y_all[jsfl_glue.train_subset(y_all, 6000)]
  for p in (0.8, 0.6):
    cases[f"fashion_mnist6k_k10_p{p}"] = {"labels": "fashion_mnist train_subset=6000",
                                          "clients": 10, "p": p, **draw(y6k, 10, p)}
  with open(args.out, "w") as f:
    json.dump({"seed": 2020, "source": "get_data.LabelwisePartitioner, "
               "Hydra_tackling-CF-in-SFL@6606c2a8", "cases": cases}, f, indent=1)
    f.write("\n")
  print(f"wrote {args.out}: {', '.join(cases)}")


if __name__ == "__main__":
  main()
