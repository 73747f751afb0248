"""IID partition, plus the index helpers every partition shares (docs/setting.md#partitions).

Most partitions in this package build an *owner vector* (the client id of each
sample, -1 for a sample no client holds) and turn it into per-client index
arrays with :func:`split_by_owner`, so they return the same canonical form:
disjoint int64 arrays, each sorted ascending.  Sorting throws away the draw
order on purpose: the data pipeline reshuffles every epoch, and a sorted
index list makes partitions comparable across code paths.  The Flower
Datasets partitions (``flower_iid``, ``flower_dirichlet``, ``flower_shard``,
``distribution``) keep the order Flower hands a client its samples in
(:func:`flower_order`), because the Hydra authors' loaders read them in that
order (``method.shuffle = false``).
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


def flower_order(pieces: list[list[np.ndarray]], rng: np.random.Generator) -> list[np.ndarray]:
  """Each client's indices in the order a Flower Datasets partitioner hands
  them out: its pieces concatenated in the order they were given to it,
  then shuffled in place, clients in id order, by the partitioner's own
  generator (its default ``shuffle = True``).  Flower shuffles a Python
  list and jsfl an int64 array: numpy's ``Generator.shuffle`` draws the same
  swaps for both.

  Args:
    pieces: per client, its index pieces in the order Flower extends its list.
    rng: the generator the partitioner drew from, in the state its draws left.

  Returns:
    K int64 arrays.
  """
  out = []
  for client in pieces:
    ix = (np.concatenate(client).astype(np.int64) if client
          else np.zeros(0, np.int64))
    rng.shuffle(ix)
    out.append(ix)
  return out


def flower_iid(labels: np.ndarray, num_clients: int) -> list[np.ndarray]:
  """Flower Datasets' ``IidPartitioner``, the Hydra authors' IID split on
  their Flower paths (CIFAR-10, CIFAR-100, Tiny-ImageNet): client k holds
  the k-th of K contiguous pieces of the rows as given
  (``Dataset.shard(K, k, contiguous=True)``, the first ``N mod K`` one sample
  larger), in that order; no randomness here (``make_partition`` shuffles
  the rows first, as Flower's ``FederatedDataset`` does).

  Args:
    labels: (N,) labels (only their number matters).
    num_clients: K, at most N.

  Returns:
    K int64 arrays of consecutive indices, covering every sample.
  """
  return np.split(np.arange(len(labels), dtype=np.int64),
                  np.cumsum(even_sizes(len(labels), num_clients))[:-1])


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
