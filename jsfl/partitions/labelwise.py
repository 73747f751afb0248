"""The dominant-label split as the Hydra authors' code draws it (docs/setting.md#partitions).

Hydra's public code (and MergeSFL's, where its partitioner comes from) does
not split a label evenly among clients: it fixes a (labels x clients) matrix
of fractions, label l at fraction p on client ``l mod K`` and ``(1 - p) /
(K - 1)`` on every other client, and cuts each label's shuffled samples at
cumulative offsets ``round(fraction * n_l)`` in client order.  Rounding
leaves a few samples of a label unheld (600 a label at p = 0.8 on 10 clients:
480 + 9 x 13 = 597, three unused) and gives every client the same size.

The shuffles are Python's ``random.Random(seed).shuffle`` of each label's
ascending indices, one generator for all labels in label order, so with the
same labels and seed this returns exactly the authors' client index sets
(their code draws with seed 2020 for every run: ``partition.seed = 2020``).
That is why this family takes the seed itself rather than a NumPy generator.

With two dominant clients a label (their CIFAR-10 sharding) this leads label
l at clients ``l mod K`` and ``l - 1 mod K``; their code compares the client
with the label itself (``get_data.py:462``), so with more than 10 labels
their labels 10 and up have no dominant client.  At L = K = 10, their only
use, the two are the same.
"""

from __future__ import annotations

import random

import numpy as np

from jsfl.partitions.iid import class_indices, split_by_owner


def labelwise(labels: np.ndarray, num_clients: int, num_classes: int, seed: int, *,
              p: float = 0.8, dominant_clients: int = 1) -> list[np.ndarray]:
  """p%-DL as the Hydra authors' code draws it: client ``l mod K`` holds a
  fraction p of label l, every other client ``(1 - p) / (K - 1)`` of it.
  ``dominant_clients = 2`` is their CIFAR-10 "sharding" (``get_data.py``,
  ``data_pattern == -1``): clients ``l`` and ``l - 1`` (mod K) hold ``p / 2``
  of label l each, every other client ``(1 - p) / (K - 1)``, so a client
  leads in two labels and 2.2% of a label is unheld at p = 0.8, K = 10
  (their code takes the clients mod 10: the same at their K = 10).

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K >= 2.
    num_classes: L >= 1.
    seed: the seed of Python's ``random.Random`` that shuffles the labels.
    p: the dominant clients' share of their label, in (0, 1].
    dominant_clients: 1 (p%-DL) or 2 (their sharding).

  Returns:
    K disjoint int64 index arrays, each sorted ascending; the samples that
    rounding leaves at the end of a label belong to no client.

  Raises:
    ValueError: p outside (0, 1], K < 2 or another ``dominant_clients``.
  """
  if not 0.0 < p <= 1.0:
    raise ValueError(f"labelwise.p={p}; allowed: a float in (0, 1]")
  if dominant_clients not in (1, 2):
    raise ValueError(f"labelwise.dominant_clients={dominant_clients!r}; allowed: 1 (p%-DL) "
                     "or 2 (the Hydra authors' sharding)")
  if num_clients < 2:
    raise ValueError(f"labelwise: num_clients={num_clients}; allowed: >= 2 (the "
                     f"non-dominant share is divided by num_clients - 1)")
  # The same float operations as their fraction matrix, so round(share * n_l)
  # lands on the same integers (0.2 / 9 * 600 = 13.33; a half rounds to even
  # in both).
  other = (1 - p) / (num_clients - 1)
  lead = p / 2 if dominant_clients == 2 else p  # their non_iid_ratio / 2
  rng = random.Random(seed)
  owner = np.full(len(labels), -1, dtype=np.int64)
  for lab, idx in enumerate(class_indices(labels, num_classes)):
    order = idx.tolist()
    rng.shuffle(order)  # one generator, the labels in turn: their draw order
    begin = 0
    for client in range(num_clients):
      leads = (client == lab % num_clients
               or (dominant_clients == 2 and (client + 1) % num_clients == lab % num_clients))
      share = lead if leads else other
      # Python slicing: offsets past the label's end just give fewer samples.
      end = begin + int(round(share * len(order)))
      owner[order[begin:end]] = client
      begin = end
  return split_by_owner(owner, num_clients)
