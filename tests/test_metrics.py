"""Tests of jsfl.metrics against hand-computed values (docs/setting.md#metrics)."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jsfl import metrics


def _numpy_per_label(pred, labels, num_classes):
  acc = np.zeros(num_classes)
  present = np.zeros(num_classes, bool)
  for l in range(num_classes):
    sel = labels == l
    if sel.any():
      present[l] = True
      acc[l] = 100.0 * np.mean(pred[sel] == l)
  return acc, present


def test_per_label_accuracy_matches_numpy_with_an_absent_label():
  rng = np.random.default_rng(0)
  labels = rng.choice([0, 1, 2, 4], size=200)  # label 3 absent
  pred = np.where(rng.random(200) < 0.6, labels, rng.integers(0, 5, 200))
  acc, present = jax.jit(metrics.per_label_accuracy, static_argnums=2)(
      pred, labels, 5)
  want_acc, want_present = _numpy_per_label(pred, labels, 5)
  chex.assert_shape(acc, (5,))
  chex.assert_type(acc, jnp.float32)
  np.testing.assert_allclose(acc, want_acc, rtol=1e-6)
  np.testing.assert_array_equal(present, want_present)
  assert float(acc[3]) == 0.0 and not bool(present[3])


def test_per_label_accuracy_from_logits_with_mask_and_padding():
  labels = np.array([0, 0, 1, 1, 1, 2, -1, -1])
  pred = np.array([0, 1, 1, 1, 0, 2, 2, 2])
  logits = jax.nn.one_hot(pred, 3) * 5.0
  mask = np.array([1, 1, 1, 1, 0, 1, 1, 0], bool)  # drop sample 4
  acc, present = metrics.per_label_accuracy(logits, labels, 3, mask=mask)
  # label 0: 1/2, label 1: 2/2 (sample 4 masked), label 2: 1/1; -1 ignored.
  np.testing.assert_allclose(acc, [50.0, 100.0, 100.0])
  np.testing.assert_array_equal(present, [True, True, True])


def test_per_label_accuracy_rejects_bad_shapes():
  with pytest.raises(ValueError, match="pred shape"):
    metrics.per_label_accuracy(np.zeros(3, int), np.zeros(4, int), 2)
  with pytest.raises(ValueError, match="num_classes=0"):
    metrics.per_label_accuracy(np.zeros(3, int), np.zeros(3, int), 0)


def test_performance_gap_hand_computed():
  acc = np.array([90.0, 60.0, 30.0, 0.0])
  present = np.array([True, True, True, False])
  # max 90 - mean(90, 60, 30) = 30; the absent label does not count.
  assert float(jax.jit(metrics.performance_gap)(acc, present)) == \
      pytest.approx(30.0)
  # all present: 90 - 45 = 45
  assert float(metrics.performance_gap(acc)) == pytest.approx(45.0)
  assert float(metrics.performance_gap(np.full(4, 70.0))) == 0.0
  assert float(metrics.performance_gap(acc, np.zeros(4, bool))) == 0.0


def test_backward_transfer_forgetting():
  history = [[10.0, 10.0], [90.0, 80.0], [30.0, 20.0]]
  # label 0: max(10-30, 90-30) = 60; label 1: max(10-20, 80-20) = 60.
  assert metrics.backward_transfer(history) == pytest.approx(60.0)


def test_backward_transfer_mixed_and_negative():
  history = [[50.0, 20.0], [80.0, 40.0], [60.0, 70.0]]
  # label 0: max(-10, 20) = 20; label 1: max(-50, -30) = -30 -> mean -5.
  assert metrics.backward_transfer(history) == pytest.approx(-5.0)
  improving = [[10.0, 20.0], [30.0, 40.0], [50.0, 60.0]]
  # every label best now: max(-40, -20) = -20 for both; not clipped.
  assert metrics.backward_transfer(improving) == pytest.approx(-20.0)


def test_backward_transfer_present_mask_and_short_history():
  history = [[50.0, 0.0, 20.0], [80.0, 0.0, 40.0], [60.0, 0.0, 70.0]]
  assert metrics.backward_transfer(history, [True, False, True]) == \
      pytest.approx(-5.0)
  assert metrics.backward_transfer(history) == pytest.approx(-10.0 / 3)
  assert metrics.backward_transfer([[50.0, 20.0]]) is None
  assert metrics.backward_transfer(np.zeros((0, 2))) is None
  with pytest.raises(ValueError, match="history shape"):
    metrics.backward_transfer([1.0, 2.0])


def test_per_position_accuracy():
  acc = np.array([10.0, 20.0, 30.0, 40.0])
  order = np.array([2, 0, 3, 1])
  host = metrics.per_position_accuracy(acc, order)
  assert isinstance(host, np.ndarray) and host.dtype == np.float32
  np.testing.assert_allclose(host, [30.0, 10.0, 40.0, 20.0])
  traced = jax.jit(metrics.per_position_accuracy)(acc, order)
  assert isinstance(traced, jax.Array)
  np.testing.assert_allclose(traced, [30.0, 10.0, 40.0, 20.0])
  with pytest.raises(ValueError, match="permutation of 0..3"):
    metrics.per_position_accuracy(acc, [0, 0, 1, 2])
  with pytest.raises(ValueError, match="label_order"):
    metrics.per_position_accuracy(acc, [0, 1, 2])


def test_cycle_label_order():
  # one client a label: the dominant labels in client order
  assert metrics.cycle_label_order([2, 0, 3, 1], [3, 1, 0, 2], 4).tolist() == [0, 3, 2, 1]
  # shared dominant labels (clients 0 and 3: label 1) keep their first
  # place; labels nobody is dominant in (2, 4) come last, ascending
  got = metrics.cycle_label_order([3, 1, 0, 2], [1, 0, 3, 1], 5)
  assert got.tolist() == [1, 0, 3, 2, 4]
  np.testing.assert_allclose(metrics.per_position_accuracy(np.arange(5.0), got),
                             [1.0, 0.0, 3.0, 2.0, 4.0])


def _records():
  recs = []
  # seed 0: accuracy 10..70 over rounds 1..7 -> last 5 are 30..70 -> 50.
  # seed 1: accuracy 2 * that -> 100; seed 2: constant 40.
  for seed, scale, const in ((0, 1.0, None), (1, 2.0, None), (2, 0.0, 40.0)):
    for r in range(1, 8):
      acc = const if const is not None else scale * 10.0 * r
      recs.append({"seed": seed, "round": r, "accuracy": acc,
                   "loss": 1.0 / r, "pg": None if seed == 2 else float(r),
                   "bw": None if r == 1 else float(seed)})
  return recs[::-1]  # order must not matter


def test_summarize_hand_made_records():
  out = metrics.summarize(_records())
  acc = out["accuracy"]
  assert acc["seeds"] == [0, 1, 2]
  assert acc["per_seed"] == pytest.approx([50.0, 100.0, 40.0])
  assert acc["median"] == pytest.approx(50.0)
  assert acc["std"] == pytest.approx(np.std([50.0, 100.0, 40.0]))
  # loss: median of 1/3..1/7 = 1/5 for every seed.
  assert out["loss"]["per_seed"] == pytest.approx([0.2] * 3)
  assert out["loss"]["std"] == pytest.approx(0.0)
  # pg: seed 2 has no values and is skipped; median of 3..7 = 5.
  assert out["pg"]["seeds"] == [0, 1]
  assert out["pg"]["per_seed"] == pytest.approx([5.0, 5.0])
  assert out["bw"]["median"] == pytest.approx(1.0)


def test_summarize_last_none_and_errors():
  recs = [{"seed": 0, "round": r, "accuracy": float(r),
           "bw": None if r < 3 else float("nan") if r == 4 else 10.0 * r}
          for r in range(1, 6)]
  out = metrics.summarize(recs, keys=("accuracy", "bw", "pg"), last=2,
                          ddof=1)
  assert out["accuracy"]["per_seed"] == [4.5]
  assert np.isnan(out["accuracy"]["std"])  # one seed, ddof=1
  assert out["bw"]["per_seed"] == [40.0]  # rounds 3 and 5 (4 is NaN)
  assert out["pg"] is None
  with pytest.raises(ValueError, match="appears twice"):
    metrics.summarize(recs + recs[:1])
  with pytest.raises(ValueError, match="'seed' and 'round'"):
    metrics.summarize([{"round": 1, "accuracy": 1.0}])
  with pytest.raises(ValueError, match="last=0"):
    metrics.summarize(recs, last=0)


def test_class_accuracy_and_forgetting_of_a_step_sequence():
  """Per-class accuracy from confusion matrices (rows = true labels) and BW
  over a sequence of steps (the forgetting measure of SFedKD Fig. 1(d))."""
  from jsfl.statistics import class_accuracy
  conf = np.array([[[8, 2], [5, 5]],    # step 1: 80%, 50%
                   [[10, 0], [9, 1]],   # step 2: 100%, 10%
                   [[4, 6], [0, 0]]])   # step 3: 40%, no sample -> 0
  acc = class_accuracy(conf)
  np.testing.assert_allclose(acc, [[80, 50], [100, 10], [40, 0]])
  # label 0: best earlier 100 - 40 = 60; label 1: 50 - 0 = 50
  assert metrics.backward_transfer(acc) == pytest.approx(55.0)
