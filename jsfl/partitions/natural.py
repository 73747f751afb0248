"""Natural partition: a dataset's own client ids, e.g. writers (docs/setting.md#partitions).

With K equal to the number of distinct ids every id is one client.  With fewer
clients than ids, K ids are drawn without replacement (seeded), as LEAF-style
experiments subsample writers; the other ids' samples are then held by no
client.  Clients are ordered by their id.  With ``group=True`` and fewer
clients than ids, every id is held instead: the ids are shuffled (seeded) and
dealt into K groups of near-equal numbers of ids, a group a client (FEMNIST's
3,500 writers over tens of clients).
"""

from __future__ import annotations

import numpy as np

from jsfl.partitions.iid import split_by_owner


def natural(labels: np.ndarray, num_clients: int, rng: np.random.Generator,
            *, client_ids: np.ndarray | None = None, group: bool = False
            ) -> list[np.ndarray]:
  """One client per natural client id (or per group of ids).

  Args:
    labels: (N,) labels (only their number matters).
    num_clients: K, at most the number of distinct ids.
    rng: the partition's random generator (used only when K < #ids).
    client_ids: (N,) the dataset's client id of every sample (any sortable
      dtype).
    group: with K below the number of ids, deal every id into one of K
      groups instead of drawing K ids.

  Returns:
    K disjoint int64 index arrays, client c holding every sample of the c-th
    smallest chosen id (``group``: of the ids of group c).

  Raises:
    ValueError: client_ids missing, of the wrong shape, or with fewer distinct
      ids than num_clients.
  """
  if client_ids is None:
    raise ValueError(
        "natural partition: this dataset has no natural client ids "
        "(client_ids=None); allowed: a dataset that provides per-sample client "
        "ids (e.g. FEMNIST writers), or another partition (iid, dirichlet, "
        "dominant_label, sharding, exdir)")
  client_ids = np.asarray(client_ids)
  if client_ids.shape != (len(labels),):
    raise ValueError(
        f"natural.client_ids has shape {client_ids.shape}; allowed: "
        f"({len(labels)},), one id per sample")
  ids, inverse = np.unique(client_ids, return_inverse=True)
  inverse = inverse.reshape(-1)
  if num_clients > len(ids):
    raise ValueError(
        f"natural: num_clients={num_clients} but the dataset has only "
        f"{len(ids)} distinct client ids; allowed: num_clients <= {len(ids)}")
  if num_clients == len(ids):
    return split_by_owner(inverse, num_clients)
  if group:
    # id k of a shuffled order goes to group k mod K: group sizes differ by <= 1
    client_of_id = np.empty(len(ids), dtype=np.int64)
    client_of_id[rng.permutation(len(ids))] = np.arange(len(ids)) % num_clients
    return split_by_owner(client_of_id[inverse], num_clients)
  chosen = np.sort(rng.choice(len(ids), size=num_clients, replace=False))
  client_of_id = np.full(len(ids), -1, dtype=np.int64)
  client_of_id[chosen] = np.arange(num_clients)
  return split_by_owner(client_of_id[inverse], num_clients)
