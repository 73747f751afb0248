"""Evaluation metrics of SPEC 1.4: accuracy per label, PG, BW, per position.

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


def per_label_accuracy(pred: jax.Array, labels: jax.Array, num_classes: int,
                       mask: jax.Array | None = None
                       ) -> tuple[jax.Array, jax.Array]:
  """Per-label top-1 accuracy ``A_l`` in percent (SPEC 1.4).

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


def performance_gap(acc: jax.Array, present: jax.Array | None = None
                    ) -> jax.Array:
  """``PG = max_l A_l - mean_l A_l`` over present labels, percentage points.

  SPEC 1.4: Hydra's Eq. 2 as printed is identically 0; this is the
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


def backward_transfer(history, present=None) -> float | None:
  """``BW = mean_l max_{r<R} (A_l^r - A_l^R)``, percentage points.

  Hydra Eq. 1 (from Lee et al. 2022) over the rounds evaluated so far, the
  last row being round R.  Positive values measure forgetting (a label was
  better at some earlier round than now); the value may be negative when every
  label is at its best now, and is not clipped.

  Args:
    history: ``(R_eval, L)`` per-label accuracy in percent, one row per
      evaluated round, oldest first.
    present: optional ``(L,)`` bool; only these labels enter the mean (labels
      absent from the test set have accuracy 0 throughout and would pull BW
      towards 0).

  Returns:
    BW as a float, or None with fewer than two evaluated rounds.
  """
  h = np.asarray(history, np.float64)
  if h.ndim != 2:
    raise ValueError(f"history shape {h.shape}; allowed: (R_eval, L)")
  if h.shape[0] < 2:
    return None
  drop = np.max(h[:-1] - h[-1], axis=0)
  if present is not None:
    present = np.asarray(present, bool)
    if present.shape != drop.shape:
      raise ValueError(f"present shape {present.shape}; allowed: "
                       f"{drop.shape}")
    if not present.any():
      return None
    drop = drop[present]
  return float(np.mean(drop))


def per_position_accuracy(acc: jax.Array, label_order) -> jax.Array:
  """Accuracy of the label served at each position of the cyclic order.

  With dominant-label partitions and the cyclic processing order (SPEC 1.2),
  the clients served at position k of the label cycle are those whose
  dominant label is ``label_order[k]``, so position k's accuracy is that
  label's accuracy (SPEC 1.4; Hydra Fig. 6).

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
  acc = np.asarray(acc, np.float32) if on_host else jnp.asarray(acc,
                                                                jnp.float32)
  if acc.ndim != 1:
    raise ValueError(f"acc shape {acc.shape}; allowed: (L,)")
  if not isinstance(label_order, jax.core.Tracer):
    order = np.asarray(label_order)
    if order.shape != acc.shape or not np.issubdtype(order.dtype, np.integer) \
        or not np.array_equal(np.sort(order), np.arange(acc.shape[0])):
      raise ValueError(f"label_order={order.tolist()!r}; allowed: a "
                       f"permutation of 0..{acc.shape[0] - 1}")
  if on_host:
    return acc[np.asarray(label_order)]
  return acc[jnp.asarray(label_order)]


def summarize(records: Iterable[dict], keys: Sequence[str] = (
    "accuracy", "loss", "pg", "bw"), last: int = 5, ddof: int = 0
              ) -> dict[str, dict | None]:
  """Hydra's summary figures: per seed, then across seeds (SPEC 1.4).

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


# What every round returns; round_record adds the other metrics a method logs.
BASE_METRICS = ("loss", "samples", "clients", "bytes_up", "bytes_down", "finite")


def round_record(cfg, exp, state, m, e, i, r, history, wall, traffic) -> dict:
  """Seed ``i``'s ``metrics.jsonl`` record of round ``r`` (0-based): the
  evaluation ``e``, the round's metrics ``m``, and the metrics built from
  the seed's per-label ``history`` (appended to here)."""
  setup, slot = exp.setup, exp.slots[i]
  s, o = slot.seed, slot.cfg["optim"]  # the slot's own lr
  pla = np.asarray(e["per_label_accuracy"][i])
  present = np.asarray(e["present"][i])
  history.append(pla)
  up, down, cum_up, cum_down = traffic
  rec = {
      "round": r + 1, "seed": s, "method": cfg["method"]["name"],
      "accuracy": float(e["accuracy"][i]), "loss": float(e["loss"][i]),
      "per_label_accuracy": pla,
      "pg": float(performance_gap(pla, present)),
      "bw": backward_transfer(np.stack(history), present),
      "train_loss": float(m["loss"][i]),
      "bytes_up": up, "bytes_down": down,
      "bytes_up_total": cum_up, "bytes_down_total": cum_down,
      "samples": int(m["samples"][i]), "wall_s": wall,
      "lr": float(max(o["lr"] * o["lr_decay"] ** r, o["lr_min"])),
      "clients": m["clients"][i],
  }
  if slot.cell is not None:  # one of several cells of a program
    rec["cell"] = slot.cell
  rec.update({k: v[i] for k, v in m.items() if k not in BASE_METRICS})
  if setup.order in ("cyclic", "cyclic_reverse") and exp.method.label_rank is not None:
    label_order = np.argsort(np.asarray(exp.method.label_rank(state)[i]))
    rec["label_order"] = label_order
    rec["per_position_accuracy"] = per_position_accuracy(pla, label_order)
  return rec
