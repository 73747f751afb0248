"""Label-Dirichlet partition (Hsu et al. 2019; Flower's DirichletPartitioner).

For each class l, ``q ~ Dir(alpha * 1_K)`` and class l's shuffled indices are
split at ``floor(cumsum(q) * n_l)``.  The whole draw is repeated while some
client holds fewer than ``min_size`` samples, at most :data:`MAX_ATTEMPTS`
times (docs/setting.md#partitions).

With ``self_balancing`` a client that holds its even share N/K gets no share
of the later classes (docs/setting.md#partitions).  ``cap_rule`` says when a
client holds it and where a cut's rounding remainder goes:

* ``"reached"`` (the default): closed at ``size >= N/K``, the remainder to the
  last client, as the MultiSFL authors' ``separate_data``
  (``utils/dataset_utils.py``) computes it, float for float: given the same
  Dirichlet draws, the same counts.
* ``"exceeded"``: closed only above N/K (Flower's comparison), the remainder
  to the last client with a share; the rule of every self-balancing run
  whose stored config has no ``cap_rule`` (``jsfl.config.as_it_ran``).

The two differ where a client holds exactly N/K (one whole class at K = L)
or a capped last client would take the remainder.
"""

from __future__ import annotations

import numpy as np

from jsfl.partitions.iid import class_indices, split_by_owner

MAX_ATTEMPTS = 1000
CAP_RULES = ("reached", "exceeded")


def split_counts(q: np.ndarray, n: int) -> np.ndarray:
  """Sample counts of splitting n items at ``floor(cumsum(q) * n)``.

  Args:
    q: (K,) non-negative proportions summing to ~1.
    n: number of items.

  Returns:
    (K,) int64 counts summing to n, zero wherever q is 0; the rounding
    remainder goes to the last entry with q > 0 (Flower gives it to the last
    entry even when its q is 0, which would breach a self-balancing cap).
  """
  cuts = np.minimum(np.floor(np.cumsum(q) * n).astype(np.int64), n)
  positive = np.flatnonzero(q > 0)
  cuts[positive[-1] if positive.size else -1:] = n
  return np.diff(cuts, prepend=0)


def remainder_to_last(q: np.ndarray, n: int) -> np.ndarray:
  """Sample counts of cutting n items at ``floor(cumsum(q) * n)`` for the
  first K - 1 clients, the rest to client K whatever its q: the arithmetic
  of ``separate_data`` (its ``.astype(int)`` truncates, as floor does here
  for these non-negative values)."""
  cuts = np.minimum(np.floor(np.cumsum(q)[:-1] * n).astype(np.int64), n)
  return np.diff(np.concatenate([cuts, [n]]), prepend=0)


def dirichlet(labels: np.ndarray, num_clients: int, num_classes: int,
              rng: np.random.Generator, *, alpha: float = 0.5,
              min_size: int = 10,
              self_balancing: bool = False,
              cap_rule: str = "reached") -> list[np.ndarray]:
  """Label-Dirichlet partition with bounded resampling.

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K.
    num_classes: L.
    rng: the partition's random generator.
    alpha: Dirichlet concentration (> 0); smaller is more heterogeneous.
    min_size: every client must end with at least this many samples (>= 0).
    self_balancing: give probability 0 to clients already holding their
      share N/K when later classes are split.
    cap_rule: one of :data:`CAP_RULES` (module docstring); read only with
      ``self_balancing``.

  Returns:
    K disjoint int64 index arrays covering all N samples, each of size
    >= min_size.

  Raises:
    ValueError: alpha <= 0, min_size < 0, min_size * K > N, an unknown
      cap_rule, or no draw met min_size within MAX_ATTEMPTS attempts.
  """
  n = len(labels)
  if not (np.isfinite(alpha) and alpha > 0):
    raise ValueError(f"dirichlet.alpha={alpha}; allowed: a finite float > 0")
  if min_size < 0:
    raise ValueError(f"dirichlet.min_size={min_size}; allowed: an int >= 0")
  if cap_rule not in CAP_RULES:
    raise ValueError(f"dirichlet.cap_rule={cap_rule!r}; allowed: "
                     f"{', '.join(map(repr, CAP_RULES))}")
  if min_size * num_clients > n:
    raise ValueError(
        f"dirichlet.min_size={min_size} with num_clients={num_clients} needs "
        f"at least {min_size * num_clients} samples, got {n}; allowed: "
        f"min_size * num_clients <= number of samples")
  by_class = [rng.permutation(idx)
              for idx in class_indices(labels, num_classes)]
  cap = n / num_clients
  owner = np.empty(n, dtype=np.int64)
  conc = np.full(num_clients, float(alpha))
  smallest = 0
  for _ in range(MAX_ATTEMPTS):
    sizes = np.zeros(num_clients, dtype=np.int64)
    for idx in by_class:
      q = rng.dirichlet(conc)
      if self_balancing:
        open_ = sizes < cap if cap_rule == "reached" else sizes <= cap
        q = np.where(open_, q, 0.0)
        total = q.sum()
        # Sizes sum to < N while classes remain, so some client is always
        # open; a zero total can only be underflow of a tiny alpha.
        q = q / total if total > 0 else open_ / np.sum(open_)
      if self_balancing and cap_rule == "reached":
        counts = remainder_to_last(q, len(idx))
      else:
        counts = split_counts(q, len(idx))
      owner[idx] = np.repeat(np.arange(num_clients), counts)
      sizes += counts
    smallest = int(sizes.min())
    if smallest >= min_size:
      return split_by_owner(owner, num_clients)
  raise ValueError(
      f"dirichlet(alpha={alpha}, min_size={min_size}): no draw in "
      f"{MAX_ATTEMPTS} attempts gave all {num_clients} clients >= {min_size} "
      f"samples (smallest client in the last draw: {smallest}); use a larger "
      f"alpha, a smaller min_size or fewer clients")
