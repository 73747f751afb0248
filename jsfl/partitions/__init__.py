"""Seeded data partitions over K clients (docs/setting.md#partitions).

A partition maps a label vector to K disjoint per-client index arrays (int64,
each sorted ascending, but for the ``flower_*`` and ``distribution``
partitions, which keep the order Flower hands a client its samples in).
Methods and their options, with defaults:

* ``iid``: shuffle and split into K near-equal parts.
* ``dirichlet(alpha=0.5, min_size=10, self_balancing=False,
  cap_rule="reached")``: per-class ``Dir(alpha * 1_K)`` split, resampled
  until every client has ``min_size``; self-balancing closes a client at
  N/K as the MultiSFL authors' code (``cap_rule="exceeded"``: above N/K).
* ``dominant_label(p=0.8, phi=None)``: Hydra's p%-DL on K = L * phi clients;
  label l is dominant at clients ``l*phi .. l*phi + phi - 1``.
* ``sharding(p=0.8, labels_per_client=2, phi=None)``: Hydra's custom sharding;
  client c is dominant in labels ``c//phi .. c//phi + labels_per_client - 1``
  (mod L).
* ``exdir(classes_per_client=2, alpha=0.5, min_size=10)``: Li & Lyu's
  ExDir(C_cls, alpha), redrawn until every client has ``min_size``.
* ``labelwise(p=0.8)``: p%-DL as the Hydra authors' code draws it (client
  ``l mod K`` dominant in label l, shares rounded per label, a few samples
  unheld), reproducing their index sets exactly; ``dominant_clients=2``
  their CIFAR-10 sharding (clients ``l`` and ``l - 1`` hold p / 2 each).
* ``distribution(dominant=0.5, other=0.03, labels_per_client=None,
  preassigned=20)``: Flower's ``DistributionPartitioner`` as the Hydra
  authors' code draws CIFAR-100's superclass split (each label's samples cut
  in dataset order by a weight matrix, client p taking piece p of each
  label it visits), reproducing Flower's index sets and orders.
* ``flower_dirichlet(alpha=0.5, min_size=0, self_balancing=False)``:
  Flower's ``DirichletPartitioner`` as the Hydra authors' code draws its
  CIFAR-10 Dirichlet splits (each class cut in dataset order by one
  ``Dir(alpha)`` draw), reproducing Flower's index sets and orders.
* ``flower_shard(shards_per_client=1)``: Flower's ``ShardPartitioner`` as
  the Hydra authors' code draws Tiny-ImageNet's "sharding" (shards of
  consecutive samples in stored order, permuted), reproducing Flower's
  index sets and orders.
* ``flower_iid``: Flower's ``IidPartitioner`` as the Hydra authors' code
  draws its IID rows: K contiguous pieces of the (shuffled) set.
* ``natural(group=False)``: the dataset's own client ids (pass
  ``client_ids``); with ``group`` and fewer clients than ids, each client
  holds a group of ids.

The four Flower partitions also take ``shuffle_seed=42``: the training set
is shuffled first, as Flower's ``FederatedDataset`` does before any
partitioner sees it (-1: the stored order).

All randomness comes from ``np.random.default_rng(seed)`` (``labelwise``:
Python's ``random.Random(seed)``, as the code it reproduces; ``distribution``
draws from it as Flower does), so a (method,
options, labels, K, seed) tuple always gives the same partition.  Impossible
requests raise ValueError instead of being silently adjusted.

:func:`train_split` keeps part of every client's set, as the Hydra authors'
Flower paths do with Hugging Face's ``train_test_split``.
"""

from __future__ import annotations

import math
import numbers

import numpy as np

# Modules, not their same-named functions, so that ``jsfl.partitions.exdir``
# etc. stay importable as modules.
from jsfl.partitions import dirichlet as _dirichlet
from jsfl.partitions import distribution as _distribution
from jsfl.partitions import dominant_label as _dominant_label
from jsfl.partitions import exdir as _exdir
from jsfl.partitions import flower_dirichlet as _flower_dirichlet
from jsfl.partitions import flower_shard as _flower_shard
from jsfl.partitions import iid as _iid
from jsfl.partitions import labelwise as _labelwise
from jsfl.partitions import natural as _natural

__all__ = [
    "PARTITIONS",
    "dominant_labels",
    "index_table",
    "label_counts",
    "make_partition",
    "train_split",
]

# name -> {option: (type, default)}; configs are validated against this.
PARTITIONS: dict[str, dict[str, tuple[type, object]]] = {
    "iid": {},
    "dirichlet": {
        "alpha": (float, 0.5),
        "min_size": (int, 10),
        "self_balancing": (bool, False),
        "cap_rule": (str, "reached"),
    },
    "dominant_label": {"p": (float, 0.8), "phi": (int, None)},
    "sharding": {
        "p": (float, 0.8),
        "labels_per_client": (int, 2),
        "phi": (int, None),
    },
    "exdir": {"classes_per_client": (int, 2), "alpha": (float, 0.5), "min_size": (int, 10)},
    "labelwise": {"p": (float, 0.8), "dominant_clients": (int, 1)},
    "distribution": {
        "dominant": (float, 0.5),
        "other": (float, 0.03),
        "labels_per_client": (int, None),
        "preassigned": (int, 20),
        "shuffle_seed": (int, 42),
    },
    "flower_dirichlet": {
        "alpha": (float, 0.5),
        "min_size": (int, 0),
        "self_balancing": (bool, False),
        "shuffle_seed": (int, 42),
    },
    "flower_shard": {"shards_per_client": (int, 1), "shuffle_seed": (int, 42)},
    "flower_iid": {"shuffle_seed": (int, 42)},
    "natural": {"group": (bool, False)},
}


# Flower Datasets' partitioners, which the data pass through FederatedDataset.
FLOWER = ("distribution", "flower_dirichlet", "flower_shard", "flower_iid")

_TYPE_NAMES = {int: "an int", float: "a float", bool: "true/false", str: "a string"}


def _check_option(name: str, key: str, typ: type, value):
  """``value`` converted to ``typ``, or ValueError naming what is allowed.

  Only the type is checked here; each method checks the range it needs
  (non-finite floats included) and names it.
  """
  if value is None:
    if PARTITIONS[name][key][1] is None:
      return None
    raise ValueError(f"{name}.{key}=None; allowed: {_TYPE_NAMES[typ]}")
  # bool is an int subclass, but True as a count or rate is a config mistake.
  is_bool = isinstance(value, (bool, np.bool_))
  if typ is bool:
    ok = is_bool
  elif typ is str:
    ok = isinstance(value, str)
  elif typ is int:
    ok = isinstance(value, numbers.Integral) and not is_bool
  else:
    ok = isinstance(value, numbers.Real) and not is_bool
  if not ok:
    raise ValueError(
        f"{name}.{key}={value!r} ({type(value).__name__}); allowed: "
        f"{_TYPE_NAMES[typ]}")
  return typ(value)


def _check_labels(labels, num_classes: int | None) -> tuple[np.ndarray, int]:
  """Labels as int64 and L, checked to lie in ``[0, L)``."""
  labels = np.asarray(labels)
  if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
    raise ValueError(
        f"labels has shape {labels.shape} and dtype {labels.dtype}; allowed: "
        f"a 1-D integer array")
  labels = labels.astype(np.int64)
  if labels.size and labels.min() < 0:
    raise ValueError(
        f"labels contain {labels.min()}; allowed: labels >= 0")
  if num_classes is None:
    num_classes = int(labels.max()) + 1 if labels.size else 0
  elif (not isinstance(num_classes, numbers.Integral) or
        isinstance(num_classes, (bool, np.bool_)) or num_classes < 1):
    raise ValueError(f"num_classes={num_classes!r}; allowed: an int >= 1")
  if labels.size and labels.max() >= num_classes:
    raise ValueError(
        f"labels contain {labels.max()} but num_classes={num_classes}; "
        f"allowed: labels in [0, {num_classes})")
  return labels, int(num_classes)


def make_partition(name: str, labels: np.ndarray, num_clients: int, seed: int,
                   num_classes: int | None = None, *,
                   client_ids: np.ndarray | None = None,
                   **options) -> list[np.ndarray]:
  """Partitions the samples with labels ``labels`` among K clients.

  Args:
    name: one of :data:`PARTITIONS`.
    labels: (N,) int labels in ``[0, num_classes)``.
    num_clients: K >= 1, at most N.
    seed: seed of ``np.random.default_rng`` (a non-negative int).
    num_classes: L; None takes ``max(labels) + 1``.
    client_ids: (N,) per-sample natural client ids; used by ``natural`` only
      (other methods ignore it, so a pipeline may always pass it).
    **options: the method's options, see :data:`PARTITIONS`; missing ones take
      their defaults.

  Returns:
    K disjoint int64 index arrays into ``labels``, each sorted ascending
    (``distribution`` and the ``flower_*`` partitions: in Flower's
    order).  All methods except ``natural`` with fewer clients than ids,
    ``labelwise`` (its rounding) and ``flower_shard`` (the samples past
    the last whole shard) cover every sample.

  Raises:
    ValueError: unknown name or option, an option of the wrong type, or an
      impossible request (see each method).
  """
  if name not in PARTITIONS:
    raise ValueError(
        f"partition={name!r}; allowed: {', '.join(sorted(PARTITIONS))}")
  allowed = PARTITIONS[name]
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise ValueError(
        f"unknown option(s) {', '.join(unknown)} for partition {name!r}; "
        f"allowed: {', '.join(sorted(allowed)) or 'none'}")
  opts = {key: _check_option(name, key, typ, options.get(key, default))
          for key, (typ, default) in allowed.items()}
  labels, num_classes = _check_labels(labels, num_classes)
  if (not isinstance(num_clients, numbers.Integral) or
      isinstance(num_clients, (bool, np.bool_)) or num_clients < 1):
    raise ValueError(f"num_clients={num_clients!r}; allowed: an int >= 1")
  num_clients = int(num_clients)
  if num_clients > len(labels):
    raise ValueError(
        f"num_clients={num_clients} but there are only {len(labels)} samples; "
        f"allowed: num_clients <= {len(labels)}")
  if (not isinstance(seed, numbers.Integral) or
      isinstance(seed, (bool, np.bool_)) or seed < 0):
    raise ValueError(f"seed={seed!r}; allowed: an int >= 0")
  if name in FLOWER:
    return _flower_shuffled(name, labels, num_clients, num_classes, int(seed), opts)
  return _draw(name, labels, num_clients, num_classes, int(seed), opts, client_ids)


def _flower_shuffled(name, labels, num_clients, num_classes, seed, opts):
  """A Flower partition of the training set as ``FederatedDataset`` hands it
  to the partitioner: shuffled first (its default ``shuffle=True``, the
  dataset's ``shuffle(seed)``: row r is sample ``permutation[r]`` of
  ``np.random.default_rng(shuffle_seed).permutation(N)``), the partitioner's
  rows mapped back to the samples, in its order; ``shuffle_seed = -1``
  partitions the stored order."""
  opts = dict(opts)
  shuffle_seed = opts.pop("shuffle_seed")
  if shuffle_seed < -1:
    raise ValueError(f"{name}.shuffle_seed={shuffle_seed}; allowed: -1 (no shuffle) or an "
                     "int >= 0 (Flower's default: 42)")
  if shuffle_seed == -1:
    return _draw(name, labels, num_clients, num_classes, seed, opts, None)
  perm = np.random.default_rng(shuffle_seed).permutation(len(labels))
  parts = _draw(name, labels[perm], num_clients, num_classes, seed, opts, None)
  return [perm[p].astype(np.int64) for p in parts]


def _draw(name, labels, num_clients, num_classes, seed, opts, client_ids):
  """Partition ``name`` of ``labels`` in the order given (checked inputs)."""
  if name == "labelwise":
    return _labelwise.labelwise(labels, num_clients, num_classes, int(seed), **opts)
  if name == "distribution":
    return _distribution.distribution(labels, num_clients, num_classes, int(seed), **opts)
  rng = np.random.default_rng(int(seed))
  if name == "iid":
    return _iid.iid(labels, num_clients, rng)
  if name == "flower_iid":
    return _iid.flower_iid(labels, num_clients)
  if name == "natural":
    return _natural.natural(labels, num_clients, rng, client_ids=client_ids, **opts)
  method = {"dirichlet": _dirichlet.dirichlet,
            "dominant_label": _dominant_label.dominant_label,
            "sharding": _dominant_label.sharding,
            "exdir": _exdir.exdir,
            "flower_dirichlet": _flower_dirichlet.flower_dirichlet,
            "flower_shard": _flower_shard.flower_shard}[name]
  return method(labels, num_clients, num_classes, rng, **opts)


def train_split(parts: list[np.ndarray], train_size: float, seed: int) -> list[np.ndarray]:
  """The part of every client's index array it trains on, as Hugging Face
  ``datasets``' ``Dataset.train_test_split(train_size=train_size, seed=seed)``
  keeps it: for a client of n samples, ``n_train = floor(train_size n)``,
  a permutation of its n positions from a fresh ``np.random.default_rng(seed)``
  (the same seed for every client), its first ``n - n_train`` entries the
  held-out part and the rest the training part, in that order.  The Hydra
  authors' Flower paths train each client on that part (0.8; 0.9 on
  CIFAR-100) in that order.  ``train_size = 1`` keeps every array as it is.
  A client whose training part would be empty (fewer than ``1 / train_size``
  samples, where ``datasets`` raises) holds nothing.

  Args:
    parts: K index arrays, in the order the client holds them.
    train_size: the kept fraction, in ``(0, 1]``.
    seed: the permutation's seed (the authors': 42), >= 0.

  Returns:
    K int64 arrays.
  """
  if not (isinstance(train_size, numbers.Real) and 0 < train_size <= 1):
    raise ValueError(f"train_size={train_size!r}; allowed: a float in (0, 1]")
  if train_size == 1:
    return [np.asarray(p, dtype=np.int64) for p in parts]
  out = []
  for p in parts:
    p = np.asarray(p, dtype=np.int64)
    n = len(p)
    n_train = math.floor(float(train_size) * n)  # Python's float product, as theirs
    perm = np.random.default_rng(seed).permutation(n)
    out.append(p[perm[n - n_train:]] if n_train else p[:0])
  return out


def label_counts(parts: list[np.ndarray], labels: np.ndarray,
                 num_classes: int) -> np.ndarray:
  """Samples of each class at each client, ``n_{c,l}``.

  Args:
    parts: K index arrays into ``labels``.
    labels: (N,) int labels in ``[0, num_classes)``.
    num_classes: L.

  Returns:
    (K, L) int64 counts.
  """
  labels, num_classes = _check_labels(labels, num_classes)
  sizes = np.array([len(p) for p in parts], dtype=np.int64)
  flat = (np.concatenate([np.asarray(p, dtype=np.int64) for p in parts])
          if parts else np.zeros(0, np.int64))
  client = np.repeat(np.arange(len(parts)), sizes)
  counts = np.bincount(client * num_classes + labels[flat],
                       minlength=len(parts) * num_classes)
  return counts.reshape(len(parts), num_classes).astype(np.int64)


def dominant_labels(counts: np.ndarray) -> np.ndarray:
  """Each client's most frequent label (ties go to the lowest label).

  Args:
    counts: (K, L) label counts, e.g. from :func:`label_counts`.

  Returns:
    (K,) int64 labels.
  """
  counts = np.asarray(counts)
  if counts.ndim != 2 or counts.shape[1] == 0:
    raise ValueError(
        f"counts has shape {counts.shape}; allowed: (K, L) with L >= 1")
  return np.argmax(counts, axis=1).astype(np.int64)


def index_table(
    parts: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """Packs ragged client index lists into one padded table for jitted code.

  Args:
    parts: K index arrays.

  Returns:
    ``(table, mask, sizes)``: table (K, max_n) int32 with client c's indices
    in ``table[c, :sizes[c]]`` and 0 after them; mask (K, max_n) bool, True
    on real entries; sizes (K,) int32.
  """
  if not len(parts):
    raise ValueError("parts is empty; allowed: a list of K >= 1 index arrays")
  sizes = np.array([len(p) for p in parts], dtype=np.int64)
  flat = np.concatenate([np.asarray(p, dtype=np.int64).reshape(-1)
                         for p in parts])
  if flat.size and (flat.min() < 0 or flat.max() > np.iinfo(np.int32).max):
    raise ValueError(
        f"indices span [{flat.min()}, {flat.max()}]; allowed: indices in "
        f"[0, 2**31 - 1] (int32 table)")
  max_n = int(sizes.max())
  mask = np.arange(max_n)[None, :] < sizes[:, None]
  table = np.zeros((len(parts), max_n), dtype=np.int32)
  # Row-major order of the mask's True entries is exactly the concatenation
  # order of the parts.
  table[mask] = flat
  return table, mask, sizes.astype(np.int32)
