"""The papers' statistic over seeds, on host records (numpy only).

Per seed, the median of the last evaluated rounds (docs/setting.md#metrics, Hydra's
figure) or the best moving average (the MultiSFL authors' figure); then the
median and the population standard deviation over seeds.  Reports, plots,
sweeps and ``jsfl.metrics.summarize`` all compute it here.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np


def _series_by_seed(records: Iterable[dict], key: str) -> dict[Any, list[float]]:
  """Per seed the values of ``key`` in round order; missing, None, non-numeric
  and non-finite values are skipped."""
  by_seed: dict[Any, list[tuple[Any, float]]] = {}
  for rec in records:
    v = rec.get(key)
    if v is None or isinstance(v, bool) or not isinstance(
        v, (int, float, np.integer, np.floating)):
      continue
    if not math.isfinite(float(v)):  # a hand-edited Infinity, as NaN
      continue
    by_seed.setdefault(rec["seed"], []).append((rec["round"], float(v)))
  return {s: [v for _, v in sorted(rv, key=lambda t: t[0])] for s, rv in by_seed.items()}


def check_last(last) -> None:
  """Refuses a ``last`` below 1: ``last = 0`` would slice ``v[-0:]``, every round."""
  if not isinstance(last, int) or isinstance(last, bool) or last < 1:
    raise ValueError(f"last={last!r}; allowed: an int >= 1")


def per_seed_figures(records: Iterable[dict], key: str, last: int = 5) -> dict[Any, float]:
  """Per seed, the median of ``key`` over its last ``last`` evaluated rounds.

  Rounds whose value is missing, None or NaN are skipped (BW has none at the
  first evaluation), so "last 5" means the last 5 rounds that have a value.

  Args:
    records: dicts with ``seed``, ``round`` and the metric.
    key: the metric, e.g. ``"accuracy"``.
    last: how many of the last evaluated rounds each seed contributes.

  Returns:
    ``{seed: figure}`` for every seed with at least one value.

  Raises:
    ValueError: for a ``last`` below 1.
  """
  check_last(last)
  return {s: float(np.median(v[-last:])) for s, v in _series_by_seed(records, key).items()}


def best_moving_average(values: Sequence[float], window: int = 10) -> tuple[float, float]:
  """The figure the MultiSFL authors report for a run: over the rounds, the
  largest mean of the trailing ``window`` values (the first rounds' shorter
  windows count), and the population std of that window.

  Args:
    values: one value per evaluated round, in round order.
    window: the moving-average length.

  Returns:
    ``(best mean, std of its window)``.
  """
  best, best_std = -math.inf, math.nan
  for i in range(len(values)):
    w = np.asarray(values[max(0, i + 1 - window):i + 1], float)
    if w.mean() > best:  # strictly greater: an equal later window does not replace it
      best, best_std = float(w.mean()), float(w.std())
  return best, best_std


def best_ma_figures(records: Iterable[dict], window: int = 10) -> dict[Any, float]:
  """Per seed the best ``window``-round moving average of its accuracy
  (:func:`best_moving_average`; rounds without a value skipped)."""
  return {s: best_moving_average(v, window)[0]
          for s, v in _series_by_seed(records, "accuracy").items()}


def across_seeds(per_seed: dict[Any, float], ddof: int = 0) -> dict | None:
  """Median and std over seeds of per-seed figures; None when there are none."""
  if not per_seed:
    return None
  seeds = sorted(per_seed)
  values = [per_seed[s] for s in seeds]
  return {"median": float(np.median(values)),
          "std": float(np.std(values, ddof=ddof)) if len(values) > ddof else float("nan"),
          "per_seed": values, "seeds": seeds}


def summarize(records: Sequence[dict], keys: Sequence[str] = ("accuracy", "loss", "pg", "bw"),
              last: int = 5, ddof: int = 0) -> dict[str, dict | None]:
  """:func:`jsfl.metrics.summarize` without jax: the papers' summary figures.

  Args:
    records: one dict per evaluated round and seed (``seed``, ``round``, metrics).
    keys: the metrics to summarise.
    last: how many of the last evaluated rounds each seed contributes.
    ddof: delta degrees of freedom of the std across seeds.

  Returns:
    ``{key: {"median", "std", "per_seed", "seeds"}}``; None for a key without
    values.

  Raises:
    ValueError: for a bad ``last``, a record without seed/round, or a seed and
      round that appear twice.
  """
  check_last(last)
  seen = set()
  for i, rec in enumerate(records):
    if "seed" not in rec or "round" not in rec:
      raise ValueError(f"record {i} has keys {sorted(rec)}; allowed: dicts "
                       "with 'seed' and 'round'")
    ident = (rec["seed"], rec["round"])
    if ident in seen:
      raise ValueError(f"record {i}: seed={ident[0]!r} round={ident[1]!r} "
                       "appears twice; allowed: one record per seed and round")
    seen.add(ident)
  return {k: across_seeds(per_seed_figures(records, k, last), ddof) for k in keys}


def predicts_one_class(per_label) -> bool:
  """Whether a per-label accuracy row (percent) is that of a model giving
  (nearly) every test sample the same label: at least 99 on one label, at
  most 1 on every other (a handful of samples may land elsewhere; a label
  without test samples reads 0)."""
  a = np.asarray(per_label, np.float64)
  if a.ndim != 1 or a.size < 2 or not np.isfinite(a).all():
    return False
  top = int(np.argmax(a))
  return bool(a[top] >= 99.0 and np.all(np.delete(a, top) <= 1.0))


def collapsed_seeds(records: Iterable[dict]) -> dict[Any, int]:
  """``{seed: round}`` of the seeds whose model predicts one class
  (:func:`predicts_one_class`) at every evaluation from ``round`` to their
  last: a collapse the seed has not recovered from.  Such a seed's training
  loss stays finite, so it is not a diverged seed and its records stay in
  the figures; a report names it beside them.  Records without
  ``per_label_accuracy`` are left out."""
  by_seed: dict[Any, list[tuple[Any, bool]]] = {}
  for rec in records:
    pla = rec.get("per_label_accuracy")
    if isinstance(pla, list):
      by_seed.setdefault(rec["seed"], []).append((rec["round"], predicts_one_class(pla)))
  out = {}
  for seed, rows in by_seed.items():
    since = None
    for r, one in sorted(rows, key=lambda t: t[0]):
      since = (r if since is None else since) if one else None
    if since is not None:
      out[seed] = since
  return out


def class_accuracy(confusion: np.ndarray) -> np.ndarray:
  """Per-class accuracy in percent from confusion matrices ``(..., L, L)``
  (row = true label): the diagonal over the row sums, ``(..., L)``; a class
  with no test sample counts as 0."""
  c = np.asarray(confusion, float)
  return 100.0 * np.diagonal(c, axis1=-2, axis2=-1) / np.maximum(c.sum(-1), 1.0)


def step_class_accuracy(confusion: np.ndarray, steps: np.ndarray, slot: int) -> np.ndarray:
  """``(steps, L)`` per-class accuracy of one slot's recorded steps, the
  recorded rounds one after another, from ``confusion_steps.npz``'s
  ``confusion`` ``(rounds, slots, S, L, L)`` and ``steps`` ``(rounds, slots)``
  (the rows :func:`backward_transfer` takes as the forgetting measure)."""
  return np.concatenate([class_accuracy(confusion[r, slot, :int(steps[r, slot])])
                         for r in range(confusion.shape[0])])


def backward_transfer(history, present=None) -> float | None:
  """``BW = mean_l max_{r<R} (A_l^r - A_l^R)``, percentage points.

  Hydra Eq. 1 (from Lee et al. 2022) over the rounds evaluated so far, the
  last row being round R.  With the rows the steps of a training sequence it
  is the forgetting measure of Chaudhry et al. ("Riemannian Walk for
  Incremental Learning", ECCV 2018) with each label as a task (SFedKD Fig.
  1(d); :func:`class_accuracy` gives the rows from confusion matrices).
  Positive values measure forgetting (a label was better at some earlier
  round than now); the value may be negative when every label is at its
  best now, and is not clipped.

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
