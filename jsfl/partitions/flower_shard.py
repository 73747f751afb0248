"""Flower's shard partition, as the Hydra authors' code draws its
Tiny-ImageNet "sharding" split (docs/setting.md#partitions).

Flower Datasets' ``ShardPartitioner`` (flwr-datasets 0.6), called with
``num_shards_per_partition = 1`` and Flower's seed 42, sorts the samples
by label (stably), cuts them into shards of ``int(N / (K s))`` consecutive
samples (s shards a client), draws a permutation of the whole shards from
``np.random.default_rng(seed)`` and gives client k the k-th group of s of
them; what is left past the last whole shard, and shards beyond K s,
belong to no client.  With Tiny-ImageNet's 500 images a class on 200
clients one shard a client is one class a client, where the paper
describes two dominant labels.
"""

from __future__ import annotations

import numpy as np

from jsfl.partitions.iid import flower_order


def flower_shard(labels: np.ndarray, num_clients: int, num_classes: int,
                 rng: np.random.Generator, *, shards_per_client: int = 1) -> list[np.ndarray]:
  """Flower's ``ShardPartitioner`` with ``num_shards_per_partition``.

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K.
    num_classes: L (unused: the shards follow the sorted labels).
    rng: ``np.random.default_rng(seed)`` (Flower's default seed: 42).
    shards_per_client: s >= 1.

  Returns:
    K disjoint int64 index arrays in Flower's order: a client's shards in
    the order drawn, then shuffled by the same generator.

  Raises:
    ValueError: s < 1, or fewer than one sample a shard.
  """
  del num_classes
  if shards_per_client < 1:
    raise ValueError(f"flower_shard.shards_per_client={shards_per_client}; allowed: an "
                     "int >= 1")
  n, used = len(labels), num_clients * shards_per_client
  size = int(n / used)
  if size < 1:
    raise ValueError(f"flower_shard: {n} samples in {used} shards (num_clients x "
                     "shards_per_client); allowed: at most one shard a sample")
  by_label = np.argsort(labels, kind="stable")
  shards = rng.permutation(n // size)[:used]
  given: list[list[np.ndarray]] = [[] for _ in range(num_clients)]
  for k in range(num_clients):
    for shard in shards[k * shards_per_client:(k + 1) * shards_per_client]:
      given[k].append(by_label[int(shard) * size:min((int(shard) + 1) * size, n)])
  return flower_order(given, rng)
