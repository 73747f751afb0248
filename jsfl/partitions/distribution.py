"""Flower's distribution partition, as the Hydra authors' code draws its
CIFAR-100 superclass split (docs/setting.md#partitions).

For CIFAR-100's 20 superclasses the authors' code does not use its own
dominant-label split: it hands Flower Datasets' ``DistributionPartitioner``
(flwr-datasets 0.6) a (labels x columns) weight matrix, ``dominant`` where
the column is the label and ``other`` elsewhere, 20 samples of each label
given to every column first, and takes Flower's defaults otherwise (seed 42).
What that does, in order:

1. columns ``C = labels_per_client * K / L``; the weight rows are scaled to
   sum to 1;
2. label l's column sizes are ``floor(w[l, j] * (n_l - preassigned * C)) +
   preassigned``; its samples, in dataset order (not shuffled), are cut into
   C consecutive pieces of those sizes, and what the flooring leaves over
   joins one column drawn uniformly (one draw per label, labels ascending,
   from ``np.random.default_rng(seed)``);
3. client p visits the labels ``p, p + 1, ...`` (mod L), ``labels_per_client``
   of them, and takes the next piece of each it has not given out yet;
4. each client's pieces, in that order, are shuffled by the same generator
   (:func:`jsfl.partitions.iid.flower_order`): the order the authors'
   clients read their data in.

With the authors' values (0.5 / 0.03, 20 pre-assigned, K = L = 20, every
client visiting all 20 labels) client p holds piece p of every label, so its
dominant superclass is p with about 40% of its data, where the paper states
80%.  The pieces are the same index sets as Flower's when the labels are in
the same order as the dataset Flower read (the Hugging Face copy of the
release).
"""

from __future__ import annotations

import numpy as np

from jsfl.partitions.iid import class_indices, flower_order


def distribution(labels: np.ndarray, num_clients: int, num_classes: int, seed: int, *,
                 dominant: float = 0.5, other: float = 0.03,
                 labels_per_client: int | None = None,
                 preassigned: int = 20) -> list[np.ndarray]:
  """Flower's ``DistributionPartitioner`` (rescaled) with the diagonal
  weight matrix of the Hydra authors' code.

  Args:
    labels: (N,) int labels in ``[0, num_classes)``, every label present.
    num_clients: K, a multiple of L.
    num_classes: L.
    seed: the seed of ``np.random.default_rng`` that places each label's
      rounding remainder (Flower's default: 42).
    dominant, other: the weights of a label's own column and of the others
      (> 0; only their ratio matters).
    labels_per_client: labels each client visits (None: all L).
    preassigned: samples of each label every column gets first (>= 0).

  Returns:
    K disjoint int64 index arrays in Flower's order, covering every sample.

  Raises:
    ValueError: an option out of range, K not a multiple of L, a missing
      label, or a label too small for the pre-assigned samples.
  """
  L, K = num_classes, num_clients
  if not (np.isfinite(dominant) and dominant > 0):
    raise ValueError(f"distribution.dominant={dominant}; allowed: a float > 0")
  if not (np.isfinite(other) and other > 0):
    raise ValueError(f"distribution.other={other}; allowed: a float > 0")
  per = L if labels_per_client is None else labels_per_client
  if not 1 <= per <= L:
    raise ValueError(f"distribution.labels_per_client={per}; allowed: an int in [1, "
                     f"{L}] (the labels)")
  if preassigned < 0:
    raise ValueError(f"distribution.preassigned={preassigned}; allowed: an int >= 0")
  if K % L:
    raise ValueError(f"distribution: num_clients={K}; allowed: a multiple of the "
                     f"{L} labels")
  C = per * K // L
  by_label = class_indices(labels, L)
  sizes = np.array([len(ix) for ix in by_label], dtype=float)
  if (sizes == 0).any():
    raise ValueError(f"distribution: label {int(np.argmin(sizes))} has no sample; "
                     "allowed: every label present")
  # Flower's float operations, so the floors land on the same integers.
  weights = np.full((L, C), float(other))
  for lab in range(min(L, C)):
    weights[lab, lab] = dominant
  weights = weights / np.sum(weights, axis=-1, keepdims=True)
  spread = sizes - preassigned * C
  if (spread < C).any():
    lab = int(np.argmin(spread))
    raise ValueError(f"distribution.preassigned={preassigned}: label {lab} has "
                     f"{int(sizes[lab])} samples, fewer than {C} columns x "
                     f"({preassigned} + 1); allowed: a smaller preassigned")
  counts = np.floor(weights * spread[:, None]).astype(int) + preassigned
  rng = np.random.default_rng(seed)
  pieces = []
  for lab, ix in enumerate(by_label):
    cut = np.split(ix, np.cumsum(counts[lab]))  # C + 1 pieces, the last the rest
    rest = cut.pop()
    j = rng.integers(0, C)  # drawn even when the rest is empty, as Flower does
    cut[j] = np.append(cut[j], rest)
    pieces.append(cut)
  given: list[list[np.ndarray]] = [[] for _ in range(K)]
  taken = [0] * L
  for client in range(K):
    for lab in np.roll(np.arange(L), -client)[:per]:
      given[client].append(pieces[lab][taken[lab]])
      taken[lab] += 1
  return flower_order(given, rng)
