"""Extended Dirichlet partition ExDir(C_cls, alpha) (Li & Lyu 2024; SFedKD).

Two stages (docs/setting.md#partitions):

1. Class sets: every client draws C_cls distinct classes; all K sets are
   redrawn until every class is held by at least
   ``max(C_cls * K // L // 5, 1)`` clients.
2. Split: for each class l in order, ``q ~ Dir(alpha * 1_K)``; clients not
   holding l, and holders already holding >= N/K samples, get 0; q is
   renormalised and l's shuffled indices are split at ``floor(cumsum(q) *
   n_l)`` over the remaining holders, the rounding remainder going to the last
   of them.  If every holder is capped, l is split evenly among all its holders
   (never NaN).  Stage 2 is repeated, with the class sets kept, until every
   client holds >= ``min_size`` samples (default :data:`MIN_CLIENT_SIZE`;
   HAM10000's small classes need less at 100 clients).

Both stages give up after :data:`MAX_ATTEMPTS` draws with a ValueError.

A client ends with samples of at most C_cls classes: fewer where its Dirichlet
share of a class floors to 0 samples, or where it reached the N/K cap before
one of its classes was split (classes are split in label order).
"""

from __future__ import annotations

import numpy as np

from jsfl.partitions.dirichlet import split_counts
from jsfl.partitions.iid import class_indices, split_by_owner

MAX_ATTEMPTS = 1000
MIN_CLIENT_SIZE = 10


def min_holders(num_clients: int, num_classes: int,
                classes_per_client: int) -> int:
  """Holders every class needs: ``max(C_cls * K // L // 5, 1)``.

  Args:
    num_clients: K.
    num_classes: L.
    classes_per_client: C_cls.

  Returns:
    The minimum number of clients that must hold each class.
  """
  return max(classes_per_client * num_clients // num_classes // 5, 1)


def class_sets(num_clients: int, num_classes: int, classes_per_client: int,
               rng: np.random.Generator) -> np.ndarray:
  """Stage 1: the classes each client may receive.

  Args:
    num_clients: K.
    num_classes: L.
    classes_per_client: C_cls in [1, L].
    rng: the partition's random generator.

  Returns:
    (K, L) bool; row c has exactly C_cls True entries, and every column at
    least :func:`min_holders` of them.

  Raises:
    ValueError: C_cls outside [1, L], C_cls * K < L (some class could have no
      holder), or no draw met the holder rule within MAX_ATTEMPTS attempts.
  """
  if not 1 <= classes_per_client <= num_classes:
    raise ValueError(
        f"exdir.classes_per_client={classes_per_client}; allowed: an int in "
        f"[1, num_classes={num_classes}]")
  need = min_holders(num_clients, num_classes, classes_per_client)
  if classes_per_client * num_clients < need * num_classes:
    raise ValueError(
        f"exdir.classes_per_client={classes_per_client} with num_clients="
        f"{num_clients} gives {classes_per_client * num_clients} class slots, "
        f"fewer than num_classes={num_classes}; allowed: classes_per_client * "
        f"num_clients >= num_classes")
  rows = np.arange(num_clients)[:, None]
  for _ in range(MAX_ATTEMPTS):
    # The first C_cls columns of a random permutation per row: one uniform
    # C_cls-subset per client, all clients at once.
    chosen = np.argsort(rng.random((num_clients, num_classes)), axis=1)
    held = np.zeros((num_clients, num_classes), dtype=bool)
    held[rows, chosen[:, :classes_per_client]] = True
    if held.sum(axis=0).min() >= need:
      return held
  raise ValueError(
      f"exdir: no class assignment in {MAX_ATTEMPTS} attempts had every class "
      f"held by >= {need} clients (classes_per_client={classes_per_client}, "
      f"num_clients={num_clients}, num_classes={num_classes}); use more "
      f"classes_per_client or more clients")


def class_shares(q: np.ndarray, holders: np.ndarray, sizes: np.ndarray,
                 cap: float) -> np.ndarray:
  """Stage-2 proportions of one class: q restricted to open holders.

  Args:
    q: (K,) a ``Dir(alpha * 1_K)`` draw.
    holders: (K,) bool, the clients holding the class.
    sizes: (K,) samples each client holds so far in this draw.
    cap: N / K; holders with ``sizes >= cap`` are closed.

  Returns:
    (K,) proportions summing to 1, zero outside the open holders; uniform over
    all holders when every holder is closed (never NaN).
  """
  open_ = holders & (sizes < cap)
  q = np.where(open_, q, 0.0)
  total = q.sum()
  if total > 0:
    return q / total
  # Also reached when a tiny alpha underflows every open share to 0.
  fallback = open_ if open_.any() else holders
  return fallback / fallback.sum()


def exdir(labels: np.ndarray, num_clients: int, num_classes: int,
          rng: np.random.Generator, *, classes_per_client: int = 2,
          alpha: float = 0.5, min_size: int = MIN_CLIENT_SIZE) -> list[np.ndarray]:
  """ExDir(C_cls, alpha) partition, see the module docstring.

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K.
    num_classes: L.
    rng: the partition's random generator.
    classes_per_client: C_cls, classes each client may receive, in [1, L].
    alpha: Dirichlet concentration (> 0).
    min_size: every client must end with at least this many samples (>= 0).

  Returns:
    K disjoint int64 index arrays covering all N samples, each of size >=
    min_size and with samples of at most C_cls classes.

  Raises:
    ValueError: alpha <= 0, min_size < 0, N < min_size * K, bad C_cls (see
      :func:`class_sets`), or no split met the size rule within MAX_ATTEMPTS
      attempts.
  """
  n = len(labels)
  if not (np.isfinite(alpha) and alpha > 0):
    raise ValueError(f"exdir.alpha={alpha}; allowed: a finite float > 0")
  if isinstance(min_size, bool) or not isinstance(min_size, (int, np.integer)) or min_size < 0:
    raise ValueError(f"exdir.min_size={min_size!r}; allowed: an int >= 0")
  if n < min_size * num_clients:
    raise ValueError(
        f"exdir: {n} samples cannot give num_clients={num_clients} clients "
        f">= min_size={min_size} samples each; allowed: num_clients <= "
        f"{n // max(min_size, 1)} or a smaller min_size")
  held = class_sets(num_clients, num_classes, classes_per_client, rng)
  by_class = [rng.permutation(idx)
              for idx in class_indices(labels, num_classes)]
  cap = n / num_clients
  owner = np.empty(n, dtype=np.int64)
  conc = np.full(num_clients, float(alpha))
  smallest = 0
  for _ in range(MAX_ATTEMPTS):
    sizes = np.zeros(num_clients, dtype=np.int64)
    for lab, idx in enumerate(by_class):
      q = class_shares(rng.dirichlet(conc), held[:, lab], sizes, cap)
      counts = split_counts(q, len(idx))
      owner[idx] = np.repeat(np.arange(num_clients), counts)
      sizes += counts
    smallest = int(sizes.min())
    if smallest >= min_size:
      return split_by_owner(owner, num_clients)
  raise ValueError(
      f"exdir(classes_per_client={classes_per_client}, alpha={alpha}): no "
      f"split in {MAX_ATTEMPTS} attempts gave all {num_clients} clients >= "
      f"min_size={min_size} samples (smallest client in the last draw: "
      f"{smallest}); allowed: a larger alpha, more classes_per_client, fewer "
      f"clients or a smaller min_size")
