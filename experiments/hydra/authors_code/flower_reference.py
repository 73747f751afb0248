"""The client index sets Flower Datasets' partitioners draw with the Hydra
authors' settings, for jsfl's tests that its ``distribution`` and
``flower_dirichlet`` partitions are the same splits.

The authors' ``get_data.py`` sends CIFAR-100's superclass labels through
Flower's ``DistributionPartitioner`` (weights 0.5 on the diagonal, 0.03
elsewhere, 20 samples of each label pre-assigned, 20 labels a client) and
CIFAR-10's Dirichlet splits through its ``DirichletPartitioner``
(``min_partition_size = 0``) and Tiny-ImageNet's "sharding" through its
``ShardPartitioner`` (one shard a client), all at Flower's seed 42. This runs those
classes from an unpacked flwr-datasets wheel on label vectors standing in
for the data (the partitioners read only the label column; a small
stand-in replaces the ``datasets`` package, which they need only for its
type) and writes, per case, the per-client sizes, a SHA-256 of the
sorted index lists (the sets), one of the lists in the order Flower hands
them out (its shuffle included), and one of the lists each client trains on
in the authors' code: Hugging Face's ``train_test_split(train_size=0.8,
seed=42)`` of its partition (0.9 for the distribution cases, as for
CIFAR-100), run by the ``datasets`` package itself, to
``tests/data/flower_reference.json``; each case again under ``fds`` with the
rows first shuffled as ``FederatedDataset`` shuffles the dataset before any
partitioner sees it (``shuffle(seed=42)`` of a real ``datasets.Dataset``):

    pip download flwr-datasets==0.6.1 --no-deps -d /tmp/flwr
    unzip /tmp/flwr/flwr_datasets-0.6.1-py3-none-any.whl -d /tmp/flwr/src
    python -m venv /tmp/hf && /tmp/hf/bin/pip install datasets==2.19.0
    /tmp/hf/bin/python experiments/hydra/authors_code/flower_reference.py /tmp/flwr/src

Distribution cases: 20 superclasses of 2,500 samples in a shuffled order
(CIFAR-100's train split) on 20 clients; unequal label sizes on 20 clients
visiting 10 labels each (fewer columns than labels); 10 labels on 20 clients
visiting all 10 (more columns than labels).  Dirichlet cases: 10 unequal
classes on 10 clients at alpha 0.1 and 0.5 (min size 0, the authors'), and
at 0.3 with self-balancing and a min size that forces redraws, and with
self-balancing on 20 clients where the rescaling's summation order matters.  Shard
cases: class-by-class labels on 20 and 15 clients (one shard each, leaving
samples unheld), and shuffled labels with three shards a client.  IID
cases (``IidPartitioner``, which shards a real ``datasets.Dataset``):
1,000 samples on 10 clients and 1,003 on 7.
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import importlib
import json
import os
import sys
import types

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
OUT = os.path.join(ROOT, "tests", "data", "flower_reference.json")


class _Dataset:
  """What the partitioners read of a ``datasets.Dataset``: one column, and
  (``ShardPartitioner``) a sort by it, stable as Arrow's; ``select`` gives
  the rows' indices in the original order."""

  def __init__(self, labels, rows=None):
    self.labels = [int(v) for v in labels]
    self.rows = list(range(len(self.labels))) if rows is None else rows
    self.num_rows = len(self.labels)

  def __len__(self):
    return self.num_rows

  def unique(self, column):
    return sorted(set(self.labels))

  def __getitem__(self, column):
    return self.labels

  def sort(self, column):
    order = np.argsort(self.labels, kind="stable")
    return _Dataset([self.labels[i] for i in order], [self.rows[i] for i in order])

  def select(self, indices):
    return [self.rows[i] for i in indices]


def load_partitioners(src: str):
  """``DistributionPartitioner``, ``DirichletPartitioner`` and
  ``ShardPartitioner`` and ``IidPartitioner`` from the wheel's source, its package initialisers (which import the Hugging Face
  stack) left unrun."""
  sys.modules["datasets"] = types.SimpleNamespace(Dataset=_Dataset)
  for name in ("flwr_datasets", "flwr_datasets.common", "flwr_datasets.partitioner"):
    mod = types.ModuleType(name)
    mod.__path__ = [os.path.join(src, *name.split("."))]
    sys.modules[name] = mod
  part = "flwr_datasets.partitioner."
  return (importlib.import_module(part + "distribution_partitioner").DistributionPartitioner,
          importlib.import_module(part + "dirichlet_partitioner").DirichletPartitioner,
          importlib.import_module(part + "shard_partitioner").ShardPartitioner,
          importlib.import_module(part + "iid_partitioner").IidPartitioner)


def digest(parts, ordered: bool = False) -> str:
  """SHA-256 of the index lists: of their sets, or with ``ordered`` of the
  lists as given."""
  h = hashlib.sha256()
  for p in parts:
    h.update(np.asarray(p if ordered else sorted(p), dtype=np.int64).tobytes())
    h.update(b"|")
  return h.hexdigest()


def train_parts(hf_dataset, parts, train_size: float, seed: int = 42):
  """What each client trains on in the authors' code: the "train" side of
  ``Dataset.train_test_split(train_size, seed)`` of its partition, in its
  order (their loaders do not shuffle)."""
  return [hf_dataset.from_dict({"i": [int(i) for i in p]})
          .train_test_split(train_size=train_size, seed=seed)["train"]["i"]
          for p in parts]


def entry(hf_dataset, parts, train_size: float) -> dict:
  train = train_parts(hf_dataset, parts, train_size)
  return {"sizes": [len(p) for p in parts], "sha256": digest(parts),
          "sha256_order": digest(parts, ordered=True), "train_size": train_size,
          "train_sizes": [len(p) for p in train],
          "sha256_train": digest(train, ordered=True)}


def cases():
  rng = np.random.default_rng(7)
  cifar = rng.permutation(np.repeat(np.arange(20), 2500))
  sizes = 200 + 37 * np.arange(20)
  unequal = rng.permutation(np.repeat(np.arange(20), sizes))
  ten = rng.permutation(np.repeat(np.arange(10), 300))
  return [("superclasses", cifar, 20, 20, 20), ("unequal_half_the_labels", unequal, 20, 10, 5),
          ("ten_labels_twenty_columns", ten, 20, 10, 3)]


def dirichlet_cases():
  rng = np.random.default_rng(11)
  y = rng.permutation(np.repeat(np.arange(10), 150 + 20 * np.arange(10)))
  sums = np.repeat(np.arange(10), 100 + 20 * np.arange(10))  # K = 20: numpy's sum differs
  return [("alpha0.1", y, 10, 0.1, 0, False), ("alpha0.5", y, 10, 0.5, 0, False),
          ("alpha0.3_balanced_min40", y, 10, 0.3, 40, True),
          ("alpha0.3_balanced_k20", sums, 20, 0.3, 0, True)]


def shard_cases():
  """Labels stored class by class (Tiny-ImageNet's layout) and shuffled."""
  by_class = np.repeat(np.arange(20), 50)
  return [("one_shard_sorted", by_class, 20, 1), ("one_shard_sorted_k15", by_class, 15, 1),
          ("three_shards_shuffled", np.random.default_rng(3).permutation(by_class), 10, 3)]


def iid_cases():
  """(name, samples, clients): an even and an uneven split."""
  return [("even", 1000, 10), ("uneven", 1003, 7)]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("src", help="the unpacked flwr-datasets wheel (holds flwr_datasets/)")
  src = ap.parse_args().src
  import datasets  # the real package, before the partitioners' stand-in replaces it
  hf_dataset, hf_version = datasets.Dataset, datasets.__version__
  Partitioner, Dirichlet, Shard, Iid = load_partitioners(src)
  sys.modules["datasets"] = datasets  # the stand-in only had to satisfy their imports
  out = {"seed": 42, "dominant": 0.5, "other": 0.03, "flwr_datasets": "0.6.1",
         "datasets": hf_version, "cases": {}, "dirichlet": {}, "shard": {}, "iid": {}}
  def both(make, labels, train_size):
    """A partitioner's clients on the stand-in in stored order, and (under
    "fds") on a real Dataset shuffled as FederatedDataset shuffles it before
    any partitioner sees it (its default shuffle=True, seed 42)."""
    part = make()
    part.dataset = _Dataset(labels)
    parts = [part.load_partition(k) for k in range(part.num_partitions)]
    part = make()
    part._dataset = hf_dataset.from_dict(  # the setter checks against the stand-in
        {"label": [int(v) for v in labels], "i": list(range(len(labels)))}).shuffle(seed=42)
    fds = [part.load_partition(k)["i"] for k in range(part.num_partitions)]
    return {**entry(hf_dataset, parts, train_size), "fds": entry(hf_dataset, fds, train_size)}

  for name, labels, K, per, pre in cases():
    L = int(labels.max()) + 1
    C = per * K // L
    weights = np.full((L, C), 0.03)
    for lab in range(min(L, C)):
      weights[lab, lab] = 0.5
    make = functools.partial(Partitioner, distribution_array=weights, num_partitions=K,
                             num_unique_labels_per_partition=per, partition_by="label",
                             preassigned_num_samples_per_label=pre)
    out["cases"][name] = {"clients": K, "labels_per_client": per, "preassigned": pre,
                          **both(make, labels, 0.9)}
  for name, labels, K, alpha, min_size, balancing in dirichlet_cases():
    make = functools.partial(Dirichlet, num_partitions=K, partition_by="label", alpha=alpha,
                             min_partition_size=min_size, self_balancing=balancing, seed=42)
    out["dirichlet"][name] = {"clients": K, "alpha": alpha, "min_size": min_size,
                              "self_balancing": balancing, **both(make, labels, 0.8)}
  for name, labels, K, per in shard_cases():
    make = functools.partial(Shard, num_partitions=K, partition_by="label",
                             num_shards_per_partition=per, seed=42)
    out["shard"][name] = {"clients": K, "shards_per_client": per, **both(make, labels, 0.8)}
  for name, n, K in iid_cases():
    # IidPartitioner shards the dataset itself (contiguous pieces): a real
    # Dataset of the row numbers, in stored order and shuffled
    parts = {}
    for key, ds in (("stored", hf_dataset.from_dict({"i": list(range(n))})),
                    ("fds", hf_dataset.from_dict({"i": list(range(n))}).shuffle(seed=42))):
      part = Iid(num_partitions=K)
      part._dataset = ds  # its setter checks the type against the stand-in
      parts[key] = [part.load_partition(k)["i"] for k in range(K)]
    out["iid"][name] = {"samples": n, "clients": K, **entry(hf_dataset, parts["stored"], 0.8),
                        "fds": entry(hf_dataset, parts["fds"], 0.8)}
  with open(OUT, "w") as f:
    json.dump(out, f, indent=1)
    f.write("\n")
  print(f"wrote {OUT}")


if __name__ == "__main__":
  main()
