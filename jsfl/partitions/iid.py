"""IID partition, plus the index helpers every partition shares (docs/setting.md#partitions).

Every partition in this package builds an *owner vector* (the client id of each
sample, -1 for a sample no client holds) and turns it into per-client index
arrays with :func:`split_by_owner`, so all of them return the same canonical
form: disjoint int64 arrays, each sorted ascending.  Sorting throws away the
draw order on purpose: the data pipeline reshuffles every epoch, and a sorted
index list makes partitions comparable across code paths.
"""

from __future__ import annotations

import numpy as np


def even_sizes(n: int, parts: int) -> np.ndarray:
  """Sizes of ``np.array_split`` of ``n`` items into ``parts`` pieces.

  Args:
    n: number of items (>= 0).
    parts: number of pieces (>= 1).

  Returns:
    (parts,) int64 sizes, the first ``n % parts`` one larger than the rest.
  """
  sizes = np.full(parts, n // parts, dtype=np.int64)
  sizes[: n % parts] += 1
  return sizes


def class_indices(labels: np.ndarray, num_classes: int) -> list[np.ndarray]:
  """Indices of each class, ascending (one argsort instead of L scans).

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_classes: L.

  Returns:
    L int64 arrays; array l holds ``np.flatnonzero(labels == l)``.
  """
  order = np.argsort(labels, kind="stable").astype(np.int64)
  counts = np.bincount(labels, minlength=num_classes)
  return np.split(order, np.cumsum(counts)[:-1])


def split_by_owner(owner: np.ndarray, num_clients: int) -> list[np.ndarray]:
  """Per-client index arrays from a per-sample owner vector.

  Args:
    owner: (N,) int client id of each sample in ``[0, num_clients)``, or -1
      for a sample that no client holds.
    num_clients: K.

  Returns:
    K int64 arrays; array c holds the indices i with ``owner[i] == c``,
    ascending.
  """
  owner = np.asarray(owner)
  held = np.flatnonzero(owner >= 0)
  # A stable sort of the held (ascending) indices by owner keeps each client's
  # indices ascending without a per-client sort.
  order = held[np.argsort(owner[held], kind="stable")].astype(np.int64)
  sizes = np.bincount(owner[held], minlength=num_clients)
  return np.split(order, np.cumsum(sizes)[:-1])


def iid(labels: np.ndarray, num_clients: int,
        rng: np.random.Generator) -> list[np.ndarray]:
  """Shuffle all samples and split them into K near-equal parts.

  Args:
    labels: (N,) labels (only their number matters).
    num_clients: K, at most N.
    rng: the partition's random generator.

  Returns:
    K disjoint int64 index arrays covering all N samples; sizes differ by at
    most one.
  """
  n = len(labels)
  owner = np.empty(n, dtype=np.int64)
  owner[rng.permutation(n)] = np.repeat(
      np.arange(num_clients), even_sizes(n, num_clients))
  return split_by_owner(owner, num_clients)
