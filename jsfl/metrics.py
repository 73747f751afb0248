"""Evaluation metrics of docs/setting.md#metrics: accuracy per label, PG, BW, per position.

Units: every accuracy here -- global, per label, per position -- is in
percent (0-100), and the performance gap and backward transfer are in
percentage points.  The per-round metrics (:func:`per_label_accuracy`,
:func:`performance_gap`, :func:`per_position_accuracy`) are ``jnp`` functions
with fixed output shapes, so they run inside a jitted evaluation; the
across-round ones (:func:`backward_transfer`, :func:`summarize`) work on host
histories.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.typing import ArrayLike

# numpy only, so that plots and reports, which import no jax, share it
from jsfl.statistics import backward_transfer  # noqa: F401


def per_label_accuracy(pred: jax.Array, labels: jax.Array, num_classes: int,
                       mask: jax.Array | None = None
                       ) -> tuple[jax.Array, jax.Array]:
  """Per-label top-1 accuracy ``A_l`` in percent (docs/setting.md#metrics).

  Args:
    pred: ``(N,)`` predicted labels, or ``(N, L)`` logits (argmax is taken).
    labels: ``(N,)`` true labels in ``[0, num_classes)``.
    num_classes: L.
    mask: optional ``(N,)`` bool, the valid samples (a test set padded to a
      multiple of the evaluation batch keeps its shape fixed this way).
      Labels outside ``[0, num_classes)`` are ignored as well.

  Returns:
    ``(acc, present)``: float32 ``(L,)`` accuracy of each label in percent, 0
    where the label has no (valid) test sample, and bool ``(L,)`` whether it
    has one.
  """
  if not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
    raise ValueError(f"num_classes={num_classes!r}; allowed: an int >= 1")
  num_classes = int(num_classes)
  pred, labels = jnp.asarray(pred), jnp.asarray(labels)
  if pred.ndim == 2:
    pred = jnp.argmax(pred, axis=-1)
  if pred.ndim != 1 or labels.shape != pred.shape:
    raise ValueError(f"pred shape {pred.shape} vs labels shape {labels.shape};"
                     " allowed: (N,) or (N, L) predictions with (N,) labels")
  # Out-of-range labels (e.g. -1 padding) count nowhere: a negative index
  # would otherwise wrap around to the last label.
  valid = (labels >= 0) & (labels < num_classes)
  if mask is not None:
    valid &= jnp.asarray(mask).astype(bool)
  weight = valid.astype(jnp.float32)
  total = jnp.zeros(num_classes, jnp.float32).at[labels].add(weight)
  hits = jnp.zeros(num_classes, jnp.float32).at[labels].add(
      weight * (pred == labels))
  present = total > 0
  acc = jnp.where(present, 100.0 * hits / jnp.maximum(total, 1.0), 0.0)
  return acc, present


def performance_gap(acc: ArrayLike, present: ArrayLike | None = None
                    ) -> jax.Array:
  """``PG = max_l A_l - mean_l A_l`` over present labels, percentage points.

  docs/setting.md#metrics: Hydra's Eq. 2 as printed is identically 0; this is the
  non-negative form its code computes.

  Args:
    acc: ``(L,)`` per-label accuracy in percent.
    present: ``(L,)`` bool, labels with test samples (all when None).

  Returns:
    Scalar float32 PG; 0 when no label is present.
  """
  acc = jnp.asarray(acc, jnp.float32)
  present = (jnp.ones(acc.shape, bool) if present is None
             else jnp.asarray(present, bool))
  count = jnp.sum(present)
  best = jnp.max(jnp.where(present, acc, -jnp.inf))
  mean = jnp.sum(jnp.where(present, acc, 0.0)) / jnp.maximum(count, 1)
  return jnp.where(count > 0, best - mean, 0.0)




def per_position_accuracy(acc: ArrayLike, label_order) -> np.ndarray | jax.Array:
  """Accuracy of the label served at each position of the cyclic order.

  With dominant-label partitions and the cyclic processing order
  (docs/methods-splitfed.md#processing-order),
  the clients served at position k of the label cycle are those whose
  dominant label is ``label_order[k]``, so position k's accuracy is that
  label's accuracy (docs/setting.md#metrics; Hydra Fig. 6).

  Args:
    acc: ``(L,)`` per-label accuracy in percent.
    label_order: ``(L,)`` the cycle's labels, a permutation of ``0..L-1``;
      position k (0-based here, ``k + 1`` in the paper) serves
      ``label_order[k]``.

  Returns:
    float32 ``(L,)``: entry k is the accuracy of the label at position k; a
    numpy array when both inputs are host (numpy/list) values, so it can go
    straight into a metrics record, else a jax array.
  """
  on_host = not isinstance(acc, jax.Array) and \
      not isinstance(label_order, jax.Array)
  a: np.ndarray | jax.Array = (np.asarray(acc, np.float32) if on_host
                               else jnp.asarray(acc, jnp.float32))
  if a.ndim != 1:
    raise ValueError(f"acc shape {a.shape}; allowed: (L,)")
  if not isinstance(label_order, jax.core.Tracer):
    order = np.asarray(label_order)
    if order.shape != a.shape or not np.issubdtype(order.dtype, np.integer) \
        or not np.array_equal(np.sort(order), np.arange(a.shape[0])):
      raise ValueError(f"label_order={order.tolist()!r}; allowed: a "
                       f"permutation of 0..{a.shape[0] - 1}")
  if on_host:
    return a[np.asarray(label_order)]
  return a[jnp.asarray(label_order)]


def cycle_label_order(client_order, dominant, num_classes: int) -> np.ndarray:
  """The labels of a client cycle (``method.cycle = "client"``) in the order
  it serves them: each label at its first client's place, then the labels
  no client is dominant in, ascending, so the result is a permutation of
  ``0..L-1``.  Where every client has its own dominant label this is the
  dominant labels in client order, the Hydra authors' positions.

  Args:
    client_order: ``(K,)`` client ids in cycle order.
    dominant: ``(K,)`` each client's dominant label.
    num_classes: L.
  """
  labels = np.asarray(dominant)[np.asarray(client_order)].tolist()
  first = list(dict.fromkeys(int(label) for label in labels))
  served = set(first)
  return np.asarray(first + [c for c in range(num_classes) if c not in served], np.int64)


def summarize(records: Iterable[dict], keys: Sequence[str] = (
    "accuracy", "loss", "pg", "bw"), last: int = 5, ddof: int = 0
              ) -> dict[str, dict | None]:
  """Hydra's summary figures: per seed, then across seeds (docs/setting.md#metrics).

  For each key and seed, the median over the last ``last`` evaluated rounds
  that have a value (BW has none at the first evaluation); then the median
  and std of these per-seed figures across seeds.  The one implementation
  lives in :func:`jsfl.statistics.summarize` (numpy only, so reports and plots
  need no jax).

  Returns:
    ``{key: {"median", "std", "per_seed", "seeds"}}``; None for a key without
    values.
  """
  from jsfl.statistics import summarize as _summarize
  return _summarize(list(records), keys, last, ddof)
