"""Batch schedules, processing orders, communication, and the seed axis."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import compiled_rounds

from jsfl import config as config_lib
from jsfl.core import batching
from jsfl.core.optim import round_lr
from jsfl.core.plan import sample_clients
from jsfl.core.setup import Setup
from jsfl.engine.orders import processing_orders
from jsfl.methods import sfl
from jsfl.models import get_model


def test_epoch_batches_cover_each_client_once():
  table = jnp.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9], [8, 0, 0, 0, 0]], jnp.int32)
  sizes = jnp.array([3, 5, 1])
  idx, mask = batching.epoch_batches(jax.random.key(0), table, sizes, 2)
  chex.assert_shape(idx, (3, 3, 2))
  idx, mask = np.asarray(idx), np.asarray(mask)
  for c, want in enumerate([[5, 6, 7], [1, 2, 3, 4, 9], [8]]):
    got = idx[:, c][mask[:, c]]
    assert sorted(got.tolist()) == want
  assert mask.sum(axis=(0, 2)).tolist() == [3, 5, 1]
  # ragged last batch: client 0 has one sample in its second batch, none in its third
  assert mask[:, 0].sum(1).tolist() == [2, 1, 0]


def test_drop_last_leaves_out_a_fresh_remainder_every_epoch():
  table = jnp.array([[5, 6, 7, 0, 0], [1, 2, 3, 4, 9], [8, 0, 0, 0, 0]], jnp.int32)
  sizes = jnp.array([3, 5, 1])
  idx, mask = batching.round_batches(jax.random.key(0), table, sizes, 2, 8, drop_last=True)
  idx, mask = np.asarray(idx).reshape(8, 3, 3, 2), np.asarray(mask).reshape(8, 3, 3, 2)
  # full batches only: 1, 2 and 0 of them; the smallest client has no batch
  assert mask.sum(axis=(1, 3)).tolist() == [[2, 4, 0]] * 8
  assert mask.all(axis=3)[mask.any(axis=3)].all()
  kept = [frozenset(idx[e, :, 1][mask[e, :, 1]].tolist()) for e in range(8)]
  assert all(k < {1, 2, 3, 4, 9} for k in kept) and len(set(kept)) > 1


def test_epochs_are_reshuffled():
  table = jnp.arange(40, dtype=jnp.int32)[None]
  idx, mask = batching.round_batches(jax.random.key(1), table, jnp.array([40]), 8, 2)
  first, second = np.asarray(idx[:5, 0]).ravel(), np.asarray(idx[5:, 0]).ravel()
  assert sorted(first) == sorted(second) == list(range(40))
  assert not np.array_equal(first, second)


@pytest.mark.parametrize("drop_last", [False, True])
def test_unshuffled_batches_follow_the_rows_every_epoch(drop_last):
  """method.shuffle = false (the Hydra authors' Flower loaders): each
  client's batches in its row's order, the same every epoch; the last
  partial batch kept, or under drop_last the same remainder left out."""
  table = jnp.array([[7, 5, 6, 0, 0], [9, 1, 4, 3, 2], [8, 0, 0, 0, 0]], jnp.int32)
  sizes = jnp.array([3, 5, 1])
  idx, mask = batching.round_batches(jax.random.key(0), table, sizes, 2, 3,
                                     drop_last=drop_last, shuffle=False)
  idx, mask = np.asarray(idx).reshape(3, 3, 3, 2), np.asarray(mask).reshape(3, 3, 3, 2)
  for c, row in enumerate([[7, 5, 6], [9, 1, 4, 3, 2], [8]]):
    want = row[:len(row) // 2 * 2] if drop_last else row
    for e in range(3):
      assert idx[e, :, c][mask[e, :, c]].tolist() == want
  assert mask[0, :, 0].sum(1).tolist() == ([2, 0, 0] if drop_last else [2, 1, 0])


def _orders(order, steps=4):
  clients = jnp.array([0, 2, 3, 5, 7], jnp.int32)
  dominant = jnp.array([1, 0, 2, 0, 1, 2, 0, 1], jnp.int32)   # K = 8, L = 3
  rank = jnp.array([2, 0, 1], jnp.int32)                        # cycle: label 1, 2, 0
  o = processing_orders(order, jax.random.key(0), steps, clients, dominant, rank)
  return np.asarray(clients)[np.asarray(o)], np.asarray(dominant)


def test_cyclic_order_groups_clients_by_label_cycle():
  rows, dom = _orders("cyclic")
  want = [0, 7, 2, 5, 3]          # label 1: clients 0, 7; label 2: 2, 5; label 0: 3
  for row in rows:
    assert row.tolist() == want
  assert [dom[c] for c in want] == [1, 1, 2, 2, 0]


def test_cyclic_reverse_alternates_direction():
  rows, _ = _orders("cyclic_reverse")
  assert rows[0].tolist() == [0, 7, 2, 5, 3]
  assert rows[1].tolist() == [3, 5, 2, 7, 0]
  assert rows[2].tolist() == rows[0].tolist()


def test_fixed_and_random_orders():
  rows, _ = _orders("fixed")
  assert all(r.tolist() == [0, 2, 3, 5, 7] for r in rows)
  rows, _ = _orders("random", steps=6)
  assert all(sorted(r.tolist()) == [0, 2, 3, 5, 7] for r in rows)
  assert len({tuple(r) for r in rows}) > 1
  with pytest.raises(ValueError, match="order='spiral'"):
    _orders("spiral")


def test_sample_clients_is_a_sorted_subset():
  c = np.asarray(sample_clients(jax.random.key(3), 20, 5))
  assert len(set(c.tolist())) == 5 and (np.diff(c) > 0).all() and c.max() < 20


def test_split_communication_by_hand():
  model = get_model("small_cnn", (8, 8, 1), 4, norm="none", width=4, hidden=8)
  setup = Setup(model=model, num_clients=3, clients_per_round=3, max_size=10, cut=2)
  # part-1 = conv1 (3*3*1*4 + 4) + conv2 (3*3*4*8 + 8) = 40 + 296 floats
  p1 = (40 + 296) * 4
  act = 2 * 2 * 8 * 4          # an 8x8 input pooled twice -> 2x2x8 floats
  up, down = sfl.communication(setup, samples=25)
  assert up == 3 * p1 + 25 * (act + 4)
  assert down == 3 * p1 + 25 * act


def test_every_round_returns_its_bytes():
  """METHOD.round's metrics carry bytes up/down: communication of the
  round's samples, or the round's own count (MultiSFL's replay traffic)."""
  from conftest import make_fed_data

  from jsfl.methods import multisfl
  data = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))
  model = get_model("small_cnn", (8, 8, 1), 4, norm="none", width=4, hidden=8)
  setup = Setup(model=model, num_clients=4, clients_per_round=3,
                     max_size=data.table.shape[1], batch_size=4, cut=2)
  key = jax.random.key(0)
  # inits jitted: run eagerly, each random draw would compile alone
  state, m = jax.jit(lambda s, k: sfl.METHOD.round(setup, s, data, k))(
      jax.jit(lambda k: sfl.init(setup, k))(key), key)
  up, down = sfl.communication(setup, int(m["samples"]))
  np.testing.assert_allclose([m["bytes_up"], m["bytes_down"]], [up, down], rtol=1e-7)
  setup = setup.replace(options=multisfl.METHOD.options())
  start = jax.jit(lambda k: multisfl.init(setup, k))(key)
  _, own = jax.jit(lambda s, k: multisfl.round(setup, s, data, k))(start, key)
  _, m = jax.jit(lambda s, k: multisfl.METHOD.round(setup, s, data, k))(start, key)
  assert float(m["bytes_up"]) == float(own["bytes_up"])
  assert float(m["bytes_up"]) > multisfl.communication(setup, int(m["samples"]))[0]


def test_lr_schedule_has_a_floor():
  lr = [float(round_lr(0.05, 0.5, 0.01, jnp.int32(r))) for r in range(5)]
  np.testing.assert_allclose(lr, [0.05, 0.025, 0.0125, 0.01, 0.01])


def test_lr_decay_can_start_later():
  """The Hydra authors' FL baseline: ``if epoch > 1`` decays from round 2 on."""
  lr = [float(round_lr(0.05, 0.5, 0.0, jnp.int32(r), start=2)) for r in range(4)]
  np.testing.assert_allclose(lr, [0.05, 0.05, 0.025, 0.0125])


# ------------------------------------------------------------- seed axis
SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=240", "dataset.test_size=80", "model.width=4", "model.hidden=8",
       "model.norm=batch", "partition.num_clients=4", "partition.name=dirichlet",
       "partition.alpha=1.0", "method.batch_size=16", "method.clients_per_round=3"]


def train_runs(overrides, rounds=2):
  state, metrics = compiled_rounds(config_lib.load_config(None, SYN + overrides), rounds)
  return state, np.stack([np.asarray(m["loss"]) for m in metrics], 1)


@pytest.mark.parametrize("method, seed_exec", [("sfl", "vmap"), ("sfl", "map"),
                                               ("fedavg", "vmap")])
def test_seed_axis_equals_separate_runs(method, seed_exec):
  common_ = [f"method.name={method}", f"exec.seed_exec={seed_exec}"]
  together, losses = train_runs(common_ + ["run.seeds=3", "run.seed=10"])
  for i, s in [(0, 10), (2, 12)]:
    alone, l_alone = train_runs(common_ + ["run.seeds=1", f"run.seed={s}"])
    chex.assert_trees_all_close(jax.tree.map(lambda a, i=i: a[i], together),
                                jax.tree.map(lambda a: a[0], alone), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(losses[i], l_alone[0], rtol=1e-5, atol=1e-6)
  # different seeds really differ (init, partition, sampling)
  assert not np.allclose(losses[0], losses[1])


def test_same_seed_is_bitwise_reproducible():
  a, la = train_runs(["run.seeds=2"])
  b, lb = train_runs(["run.seeds=2"])
  chex.assert_trees_all_equal(a, b)
  np.testing.assert_array_equal(la, lb)


ALGORITHM_CLASSES = ("jsfl.engine.split.SplitAlgorithm", "jsfl.engine.parallel.ParallelAlgorithm",
                     "jsfl.engine.sequential.SequentialAlgorithm")


@pytest.mark.parametrize("name", sorted(__import__("jsfl.methods.catalog",
                                                   fromlist=["METHODS"]).METHODS))
def test_every_method_builds_its_algorithm_once_per_run(name, monkeypatch):
  """A run builds its method's algorithm once (``Method.rounds``): tracing
  two rounds constructs no engine algorithm and calls ``build`` no more;
  the hooks read the state as an argument instead of closing over it."""
  import dataclasses
  import importlib

  from conftest import make_fed_data
  from loop_reference import make_setup, tiny_model

  from jsfl.methods.catalog import get_method
  made = []
  for path in ALGORITHM_CLASSES:
    mod, cls_name = path.rsplit(".", 1)
    cls = getattr(importlib.import_module(mod), cls_name)
    def counted(self, *a, _init=cls.__init__, **k):
      made.append(type(self).__name__)
      _init(self, *a, **k)
    monkeypatch.setattr(cls, "__init__", counted)
  method = get_method(name)
  builds = []

  def build(setup):
    builds.append(setup)
    return method.build(setup)

  counting = dataclasses.replace(method, build=build)
  data = make_fed_data([6, 4, 5, 7], dominant=np.arange(4, dtype=np.int32) % 4)
  opts = method.options(num_teachers=2) if name == "sfedkd" else method.options()
  setup = make_setup(tiny_model(), data, clients_per_round=3, order="cyclic", options=opts)
  alg = counting.rounds(setup)
  built = list(made)
  assert built or name in ("multihead", "splitnn"), "the counter sees the engine algorithms"
  key = jax.random.key(0)
  state = alg.init(key)
  jax.make_jaxpr(lambda s, k: alg.round(alg.round(s, data, k)[0], data,
                                        jax.random.fold_in(k, 1)))(state, key)
  assert len(builds) == 1
  assert made == built, f"{name} built {made[len(built):]} while tracing rounds"


def test_masked_cross_entropy_is_torchs_mean_over_the_samples_that_exist():
  """The loss every loop reference shares with the rounds, against float64
  numpy: the mean of -log softmax[label] over the valid samples of a ragged
  batch (PyTorch's mean reduction on the short last batch), 0 for none."""
  from jsfl.core.loss import masked_cross_entropy
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(6, 5)).astype(np.float32) * 3
  labels = rng.integers(0, 5, 6)
  mask = np.array([1, 1, 0, 1, 0, 0], bool)
  z = logits.astype(np.float64)
  nll = np.log(np.exp(z).sum(1)) - z[np.arange(6), labels]
  got = float(masked_cross_entropy(jnp.asarray(logits), jnp.asarray(labels), jnp.asarray(mask)))
  assert got == pytest.approx(nll[mask].mean(), rel=1e-6)
  assert got != pytest.approx(nll[mask].sum() / 6, rel=1e-3)  # not over the padded size
  assert float(masked_cross_entropy(jnp.asarray(logits), jnp.asarray(labels),
                                    jnp.zeros(6, bool))) == 0.0


def test_every_method_round_augments_what_it_gathers(monkeypatch):
  """dataset.augment reaches every method's round: each registered method's
  round, traced (not compiled) under ``augment = "crop_flip"``, gathers
  through the round's augmentation (jsfl.core.data.training_data), so a
  method with a round of its own cannot skip it unnoticed."""
  from conftest import make_fed_data

  from jsfl.core import data as data_mod
  from jsfl.methods.catalog import METHODS, get_method
  calls = []
  real = data_mod.apply
  monkeypatch.setattr(data_mod, "apply", lambda aug, idx, x: calls.append(1) or real(aug, idx, x))
  data = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))
  model = get_model("small_cnn", (8, 8, 1), 4, norm="none", width=4, hidden=8)
  base = Setup(model=model, num_clients=4, clients_per_round=3,
               max_size=data.table.shape[1], batch_size=4, cut=2, augment="crop_flip")
  key = jax.random.key(0)
  options = {"sfedkd": {"num_teachers": 2}}
  missed = []
  for name in sorted(METHODS):
    method = get_method(name)
    setup = base.replace(options=method.options(**options.get(name, {})))
    state = jax.eval_shape(lambda k, setup=setup, method=method: method.init(setup, k), key)
    calls.clear()
    jax.eval_shape(lambda s, k, setup=setup, method=method: method.round(setup, s, data, k),
                   state, key)
    if not calls:
      missed.append(name)
  assert not missed, f"rounds that gather without dataset.augment: {missed}"
