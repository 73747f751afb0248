"""Hydra's dominant-label ("p%-DL") and custom sharding partitions (docs/setting.md#partitions).

Both are one scheme with ``n`` dominant labels per client (``n = 1`` for p%-DL,
``n = labels_per_client`` for sharding), on K = L * phi clients arranged in L
groups of phi consecutive client ids:

* group g = c // phi is dominant in labels ``g, g+1, ..., g+n-1 (mod L)``;
  for p%-DL this means label l is dominant at clients
  ``l*phi .. l*phi + phi - 1``;
* a fraction p of label l's samples is split evenly among the ``n * phi``
  clients dominant in l; the rest (1 - p) is split evenly among the other
  ``K - n * phi`` clients.

With balanced classes every client then holds ~N/K samples, a fraction p/n of
them from each of its dominant labels (Hydra appendix E.1 and E.3).
"""

from __future__ import annotations

import numpy as np

from jsfl.partitions.iid import class_indices, even_sizes, split_by_owner


def resolve_phi(num_clients: int, num_classes: int, phi: int | None,
                method: str) -> int:
  """The client scale phi with K = L * phi, checked against K.

  Args:
    num_clients: K.
    num_classes: L.
    phi: clients per dominant-label group, or None to derive it from K.
    method: partition name, for error messages.

  Returns:
    phi.

  Raises:
    ValueError: phi < 1, phi * L != K, or (phi None) K not a multiple of L.
  """
  if phi is None:
    if num_clients % num_classes:
      raise ValueError(
          f"{method}: num_clients={num_clients} is not a multiple of "
          f"num_classes={num_classes}; allowed: num_clients = num_classes * "
          f"phi (e.g. {num_classes}, {2 * num_classes}, ...)")
    return num_clients // num_classes
  if phi < 1:
    raise ValueError(f"{method}.phi={phi}; allowed: an int >= 1")
  if phi * num_classes != num_clients:
    raise ValueError(
        f"{method}.phi={phi} with num_classes={num_classes} needs "
        f"num_clients={phi * num_classes}, got num_clients={num_clients}; "
        f"allowed: phi * num_classes == num_clients")
  return phi


def _overlap(labels: np.ndarray, num_clients: int, num_classes: int,
             rng: np.random.Generator, *, p: float, phi: int | None,
             labels_per_client: int, method: str) -> list[np.ndarray]:
  """The shared scheme of the module docstring."""
  if not 0.0 < p <= 1.0:
    raise ValueError(f"{method}.p={p}; allowed: a float in (0, 1]")
  if num_classes < 2:
    raise ValueError(
        f"{method}: num_classes={num_classes}; allowed: >= 2 (the non-dominant "
        f"share needs other labels)")
  if not 1 <= labels_per_client < num_classes:
    raise ValueError(
        f"{method}.labels_per_client={labels_per_client}; allowed: an int in "
        f"[1, {num_classes - 1}] (fewer than num_classes={num_classes})")
  phi = resolve_phi(num_clients, num_classes, phi, method)
  n = labels_per_client
  owner = np.empty(len(labels), dtype=np.int64)
  clients = np.arange(num_clients)
  for lab, idx in enumerate(class_indices(labels, num_classes)):
    idx = rng.permutation(idx)
    groups = (lab - np.arange(n)) % num_classes
    dominant = (groups[:, None] * phi + np.arange(phi)).ravel()
    is_dominant = np.zeros(num_clients, dtype=bool)
    is_dominant[dominant] = True
    # Start the non-dominant clients right after label l's group so that
    # array_split's "+1" remainders rotate over clients instead of always
    # landing on client 0.
    order = np.roll(clients, -((lab + 1) * phi) % num_clients)
    others = order[~is_dominant[order]]
    n_dom = int(np.floor(p * len(idx) + 0.5))
    owner[idx[:n_dom]] = np.repeat(dominant, even_sizes(n_dom, len(dominant)))
    owner[idx[n_dom:]] = np.repeat(
        others, even_sizes(len(idx) - n_dom, len(others)))
  return split_by_owner(owner, num_clients)


def dominant_label(labels: np.ndarray, num_clients: int, num_classes: int,
                   rng: np.random.Generator, *, p: float = 0.8,
                   phi: int | None = None) -> list[np.ndarray]:
  """Hydra's p%-DL partition: one dominant label per client.

  Label l is dominant at clients ``l*phi .. l*phi + phi - 1`` (clients of the
  same dominant label have consecutive ids).

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K = num_classes * phi.
    num_classes: L >= 2.
    rng: the partition's random generator.
    p: fraction of each label's samples given to its dominant clients, in
      (0, 1].
    phi: clients per dominant label; None derives it as K / L.

  Returns:
    K disjoint int64 index arrays covering all N samples.

  Raises:
    ValueError: p outside (0, 1], L < 2, phi * L != K, or (phi None) K not a
      multiple of L.
  """
  return _overlap(labels, num_clients, num_classes, rng, p=p, phi=phi,
                  labels_per_client=1, method="dominant_label")


def sharding(labels: np.ndarray, num_clients: int, num_classes: int,
             rng: np.random.Generator, *, p: float = 0.8,
             labels_per_client: int = 2,
             phi: int | None = None) -> list[np.ndarray]:
  """Hydra's custom sharding: ``labels_per_client`` dominant labels per client.

  Client c (group g = c // phi) is dominant in labels ``g .. g +
  labels_per_client - 1 (mod L)``, each making up ~p / labels_per_client of
  its samples; the remaining (1 - p) of every label is spread evenly over the
  clients not dominant in it.

  Args:
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K = num_classes * phi.
    num_classes: L >= 2.
    rng: the partition's random generator.
    p: fraction of each label's samples given to its dominant clients, in
      (0, 1].
    labels_per_client: dominant labels per client, in [1, L - 1].
    phi: clients per group; None derives it as K / L.

  Returns:
    K disjoint int64 index arrays covering all N samples.

  Raises:
    ValueError: as :func:`dominant_label`, or labels_per_client outside
      [1, L - 1].
  """
  return _overlap(labels, num_clients, num_classes, rng, p=p, phi=phi,
                  labels_per_client=labels_per_client, method="sharding")
