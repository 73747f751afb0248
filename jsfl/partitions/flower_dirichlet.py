"""Flower's Dirichlet partition, as the Hydra authors' code draws its
CIFAR-10 Dirichlet splits (docs/setting.md#partitions).

Flower Datasets' ``DirichletPartitioner`` (flwr-datasets 0.6), which the
authors call with ``min_partition_size = 0`` and Flower's seed 42, differs
from jsfl's ``dirichlet`` in how it draws, not in what it draws from: each
class's samples, in dataset order (not shuffled), are cut into K
consecutive pieces by proportions ``Dir(alpha 1_K)`` drawn from one
``np.random.default_rng(seed)``, classes ascending, piece k to client k;
with ``self_balancing`` a client already holding more than N / K samples
gets no share of the later classes (the others' proportions rescaled);
while some client holds fewer than ``min_size`` samples the whole draw is
repeated from the same generator.  Each client's indices then come in
Flower's order: its pieces class by class, shuffled by the same generator
(:func:`jsfl.partitions.iid.flower_order`), the order the authors' clients
read their data in.  The index sets and orders are Flower's when the labels
are in the order of the dataset Flower read.
"""

from __future__ import annotations

import numpy as np

from jsfl.partitions.iid import class_indices, flower_order

# Flower gives up after its eleventh draw; so does this (a split past it is
# one Flower never returns).
MAX_DRAWS = 11


def flower_dirichlet(labels: np.ndarray, num_clients: int, num_classes: int,
                     rng: np.random.Generator, *, alpha: float = 0.5, min_size: int = 0,
                     self_balancing: bool = False) -> list[np.ndarray]:
  """Flower's ``DirichletPartitioner`` over K clients.

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K.
    num_classes: L (classes without samples are skipped, as Flower sees
      only the classes present).
    rng: ``np.random.default_rng(seed)`` (Flower's default seed: 42).
    alpha: the concentration, > 0.
    min_size: the fewest samples a client may hold (the authors: 0).
    self_balancing: Flower's option of that name.

  Returns:
    K disjoint int64 index arrays in Flower's order, covering every sample.

  Raises:
    ValueError: alpha <= 0 or not finite, min_size < 0, or none of
      :data:`MAX_DRAWS` draws meets ``min_size`` (Flower raises then too).
  """
  if not (np.isfinite(alpha) and alpha > 0):
    raise ValueError(f"flower_dirichlet.alpha={alpha}; allowed: a float > 0")
  if min_size < 0:
    raise ValueError(f"flower_dirichlet.min_size={min_size}; allowed: an int >= 0")
  K = num_clients
  by_class = [ix for ix in class_indices(labels, num_classes) if len(ix)]
  share = len(labels) / K
  concentration = np.full(K, float(alpha))
  for _ in range(MAX_DRAWS):
    pieces: list[list[np.ndarray]] = [[] for _ in range(K)]
    held = np.zeros(K, dtype=np.int64)
    for ix in by_class:
      props = rng.dirichlet(concentration)
      if self_balancing:  # before this class: who is past an even share
        props = np.where(held > share, 0.0, props)
        # Python's left-to-right sum, as Flower's: numpy's pairwise sum can
        # differ in the last bit and move a cut by a sample
        props = props / sum(props.tolist())
      # Flower's float steps: cumulative fractions times the class size,
      # truncated, the last cut dropped
      cuts = (np.cumsum(props) * len(ix)).astype(int)[:-1]
      for k, piece in enumerate(np.split(ix, cuts)):
        pieces[k].append(piece)
        held[k] += len(piece)
    if held.min() >= min_size:
      return flower_order(pieces, rng)
  raise ValueError(f"flower_dirichlet: no draw of {MAX_DRAWS} gives every client "
                   f"min_size={min_size} samples at alpha={alpha}; allowed: a smaller "
                   "min_size or a larger alpha")
