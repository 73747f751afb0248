"""Every vectorised round equals a plain per-client Python loop of the same math.

The references (tests/loop_reference.py) use Python loops over rounds, batch steps, clients and the
server's processing order, eager per-client ``jax.vjp`` calls, and a
hand-written PyTorch-style SGD (weight decay added to the gradient, then
momentum) instead of optax, so a mistake in stacking, masking, gathering,
ordering, gating or optimiser state shows up as a mismatch.
"""


import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_fed_data
from loop_reference import (
  TOL,
  make_setup,
  ref_authors_queue,
  ref_fedavg,
  ref_sfl,
  run_rounds,
  tiny_model,
)

from jsfl.core.plan import plan_round
from jsfl.methods import fedavg, sfl, splitfedv1


@pytest.mark.parametrize("client_exec", ["vmap", "map", "unroll"])
def test_fedavg_equals_loop(client_exec):
  data = make_fed_data([13, 7, 20, 5])
  setup = make_setup(tiny_model(), data, client_exec=client_exec,
                     clients_per_round=3)
  key = jax.random.key(3)
  state, losses = run_rounds(fedavg, setup, data, key, 2)
  (p, s), ref_losses = ref_fedavg(setup, data, key, 2)
  chex.assert_trees_all_close(state.params, p, **TOL)
  chex.assert_trees_all_close(state.stats, s, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)


def test_fedavg_drop_last_lr_decay_start_equals_loop():
  """Dropped last batches and a later lr decay reach the loop through the
  same plan: the loop sees only full batches and the delayed rates."""
  data = make_fed_data([13, 7, 20, 5])
  setup = make_setup(tiny_model(), data, drop_last=True, lr_decay_start=2,
                     client_exec="unroll")
  key = jax.random.key(9)
  state, losses = run_rounds(fedavg, setup, data, key, 3)
  (p, s), ref_losses = ref_fedavg(setup, data, key, 3)
  chex.assert_trees_all_close(state.params, p, **TOL)
  chex.assert_trees_all_close(state.stats, s, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  plan = plan_round(setup, data, jax.random.key(0), jnp.int32(1))
  assert float(plan.lr) == pytest.approx(setup.lr)
  # the rate every loop here takes from the plan: lr 0.1 x 0.9 a round from
  # the start round on, floored at 0.05 (rounds 0-based)
  def rates(s):
    return [float(plan_round(s, data, jax.random.key(0), jnp.int32(r)).lr)
            for r in (0, 1, 2, 6, 8)]
  assert rates(setup) == pytest.approx([0.1, 0.1, 0.09, 0.1 * 0.9 ** 5, 0.05])
  assert rates(setup.replace(lr_decay_start=1)) == pytest.approx(
      [0.1, 0.09, 0.081, 0.1 * 0.9 ** 6, 0.05])
  assert (np.asarray(plan.mask).sum(axis=2) % setup.batch_size == 0).all()


@pytest.mark.parametrize("mod", [fedavg, sfl], ids=["fedavg", "sfl"])
def test_a_round_of_empty_participants_keeps_the_model(mod):
  """Participants that all hold no data (a partition with min_size = 0)
  train nothing; the sample-weighted mean of their unchanged copies is the
  model they started from, not the zero tree that zero weights would give."""
  data = make_fed_data([0, 0, 9])
  setup = make_setup(tiny_model(), data, clients_per_round=2, client_exec="unroll")
  key = next(k for k in (jax.random.key(i) for i in range(50))
             if np.asarray(plan_round(setup, data, k, jnp.int32(0)).clients).tolist() == [0, 1])
  state = mod.init(setup, key)
  new, m = jax.jit(lambda s, k: mod.round(setup, s, data, k))(state, key)
  assert float(m["samples"]) == 0
  chex.assert_trees_all_equal(new.params if mod is fedavg else new.part1 + new.part2,
                              state.params if mod is fedavg else state.part1 + state.part2)
  assert any(float(jnp.abs(a).max()) > 0 for a in jax.tree.leaves(
      new.params if mod is fedavg else new.part1))


def unequal_participants(setup, data, key, rounds):
  """Guard: every round's participants hold different sample counts, so
  uniform and sample weights give different means."""
  for r in range(rounds):
    plan = plan_round(setup, data, jax.random.fold_in(key, r), jnp.int32(r))
    assert len(set(np.asarray(plan.sizes).tolist())) > 1


def assert_rounds_equal_loop(mod, setup, data, key, rounds=2):
  """FedAvg's or SFL's rounds against their loop reference; the losses."""
  state, losses = run_rounds(mod, setup, data, key, rounds)
  if mod is fedavg:
    (p, s), ref_losses = ref_fedavg(setup, data, key, rounds)
    chex.assert_trees_all_close(state.params, p, **TOL)
    chex.assert_trees_all_close(state.stats, s, **TOL)
  else:
    (p1, s1, p2, _), ref_losses, _ = ref_sfl(setup, data, key, rounds)
    chex.assert_trees_all_close(state.part1, p1, **TOL)
    chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
    chex.assert_trees_all_close(state.part2, p2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  return losses


@pytest.mark.parametrize("mod", [fedavg, sfl], ids=["fedavg", "sfl"])
def test_uniform_aggregation_equals_loop(mod):
  """``method.aggregation = "uniform"`` (the Hydra authors' scripts): one
  weight a client in the round-end mean, through the parallel engine's
  average and the split engine's ``client_final``; the loops weigh from
  the data, not from the plan."""
  data = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))
  setup = make_setup(tiny_model(), data, clients_per_round=3, aggregation="uniform")
  key = jax.random.key(21)
  unequal_participants(setup, data, key, 2)
  assert_rounds_equal_loop(mod, setup, data, key)


@pytest.mark.parametrize("mod", [fedavg, sfl], ids=["fedavg", "sfl"])
def test_crop_flip_rounds_equal_loop(mod):
  """``dataset.augment = "crop_flip"``: every batch a round gathers, in the
  parallel and the split engine, is the round's crop and flip of its
  samples (jsfl.core.data.training_data), as the loops gather them."""
  from jsfl.core.data import gather, training_data
  data = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))
  setup = make_setup(tiny_model(), data, clients_per_round=3, augment="crop_flip",
                     local_epochs=2)
  key = jax.random.key(23)
  raw, _ = gather(data, jnp.arange(40))
  seen, _ = gather(training_data(setup, data, key), jnp.arange(40))
  assert not np.allclose(raw, seen)  # guard: the rounds see other images
  losses = assert_rounds_equal_loop(mod, setup, data, key)
  _, plain_losses = run_rounds(mod, setup.replace(augment="none"), data, key, 2)
  assert not np.allclose(plain_losses, losses)


@pytest.mark.parametrize("client_exec,aggregation", [
    ("vmap", "samples"), ("unroll", "samples"), ("vmap", "uniform")])
def test_splitfedv1_equals_fedavg(client_exec, aggregation):
  data = make_fed_data([13, 7, 20, 5])
  setup = make_setup(tiny_model(), data, local_epochs=2, client_exec=client_exec,
                     aggregation=aggregation)
  key = jax.random.key(4)
  s_v1, l_v1 = run_rounds(splitfedv1, setup, data, key, 2)
  s_fa, l_fa = run_rounds(fedavg, setup, data, key, 2)
  chex.assert_trees_all_close(s_v1.part1 + s_v1.part2, s_fa.params, **TOL)
  chex.assert_trees_all_close(s_v1.part1_stats + s_v1.part2_stats, s_fa.stats, **TOL)
  np.testing.assert_allclose(l_v1, l_fa, **TOL)
















def test_clipped_steps_equal_loop():
  """``optim.clip_norm`` clips the tree one optimiser state steps: a whole
  model in FedAvg, and in SFL the client's part-1 and the server's part-2
  each by its own norm (the loop clips each party's gradient apart)."""
  data = make_fed_data([13, 7, 20, 5])
  setup = make_setup(tiny_model(), data, clients_per_round=3, clip_norm=0.05)
  key = jax.random.key(6)
  state, losses = run_rounds(fedavg, setup, data, key, 2)
  (p, s), ref_losses = ref_fedavg(setup, data, key, 2)
  chex.assert_trees_all_close(state.params, p, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  state, losses = run_rounds(sfl, setup, data, key, 2)
  (p1, s1, p2, s2), ref_losses, _ = ref_sfl(setup, data, key, 2)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  free, _ = run_rounds(sfl, setup.replace(clip_norm=0.0), data, key, 2)
  for a, b in ((free.part1, p1), (free.part2, p2)):  # the bound was reached
    assert not np.allclose(jax.tree.leaves(a)[0], jax.tree.leaves(b)[0], atol=1e-4)


@pytest.mark.parametrize("order", ["random", "cyclic", "cyclic_reverse", "fixed"])
def test_sfl_equals_loop(order):
  data = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))
  setup = make_setup(tiny_model(), data, order=order, clients_per_round=3)
  key = jax.random.key(5)
  state, losses = run_rounds(sfl, setup, data, key, 2)
  (p1, s1, p2, s2), ref_losses, _ = ref_sfl(setup, data, key, 2)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)


@pytest.mark.parametrize("order,per_turn,client_exec", [
    ("random", 1, "vmap"), ("random", 1, "unroll"), ("cyclic", 1, "vmap"),
    ("cyclic", 3, "unroll"), ("cyclic_reverse", 1, "vmap"), ("cyclic_reverse", 2, "vmap"),
    ("fixed", 2, "vmap")])
def test_sfl_authors_rule_equals_loop(order, per_turn, client_exec):
  """The authors' server queue (random picks per server step, turns of
  ``batches_per_turn`` batches) against the event-by-event loop: unequal
  clients, two local epochs, partial participation."""
  data = make_fed_data([13, 7, 20, 5, 9], dominant=np.array([2, 0, 1, 0, 3], np.int32))
  setup = make_setup(tiny_model(), data, order=order, order_rule="authors",
                     batches_per_turn=per_turn, clients_per_round=4, local_epochs=2,
                     client_exec=client_exec)
  key = jax.random.key(15)
  state, losses = run_rounds(sfl, setup, data, key, 2)
  (p1, s1, p2, s2), ref_losses, _ = ref_sfl(setup, data, key, 2)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)


@pytest.mark.parametrize("order", ["random", "cyclic", "cyclic_reverse", "fixed"])
@pytest.mark.parametrize("per_turn", [1, 2, 5])
def test_queue_sequence_equals_authors_loop(order, per_turn):
  from jsfl.engine import schedule as sched
  rng = np.random.default_rng(per_turn)
  key = jax.random.key(7)
  for trial in range(4):
    batches = rng.integers(0, 6, 6)
    first = rng.permutation(6)
    seq = np.asarray(sched.queue_sequence(order, key, jnp.asarray(batches),
                                          jnp.asarray(first), per_turn, 40))

    def pick(k, size):
      return int(jax.random.randint(jax.random.fold_in(key, k), (), 0, size))

    ref = ref_authors_queue(order, batches, first, per_turn, pick)
    assert list(seq[:len(ref)]) == ref, (trial, batches, first)
    assert (seq[len(ref):] == -1).all()


def test_segments_replay_the_sequence():
  """Reading the segments in order (each in its serving order) gives back the
  sequence, every participant's batches in step order, none twice."""
  from jsfl.engine import schedule as sched
  rng = np.random.default_rng(0)
  live = rng.random((5, 4)) < 0.7
  seq = [int(c) for c in rng.permutation(np.repeat(np.arange(4), live.sum(0)))]
  src, order = (np.asarray(a) for a in sched.segments(
      jnp.asarray(seq + [-1] * 3, jnp.int32), jnp.asarray(live)))
  replay, steps_seen = [], {c: [] for c in range(4)}
  for s in range(src.shape[0]):
    for c in order[s]:
      if src[s, c] >= 0:
        replay.append(int(c))
        steps_seen[int(c)].append(int(src[s, c]))
  assert replay == seq
  for c in range(4):
    assert steps_seen[c] == list(np.flatnonzero(live[:, c]))


@pytest.mark.parametrize("client_exec", ["map", "unroll"])
def test_sfl_client_exec_strategies_agree(client_exec):
  data = make_fed_data([13, 7, 20, 5])
  key = jax.random.key(6)
  a, la = run_rounds(sfl, make_setup(tiny_model(), data), data, key, 1)
  b, lb = run_rounds(sfl, make_setup(tiny_model(), data, client_exec=client_exec),
                     data, key, 1)
  chex.assert_trees_all_close(a.part1 + a.part2, b.part1 + b.part2, **TOL)
  np.testing.assert_allclose(la, lb, **TOL)


def test_authors_random_order_is_not_the_steps_one():
  """Guards the authors'-rule test: per-server-step picks are another order
  than a permutation per batch step."""
  data = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))
  key = jax.random.key(5)
  a, _ = run_rounds(sfl, make_setup(tiny_model(), data), data, key, 1)
  b, _ = run_rounds(sfl, make_setup(tiny_model(), data, order_rule="authors"), data, key, 1)
  diff = max(float(jnp.abs(x - y).max()) for x, y in
             zip(jax.tree.leaves(a.part2), jax.tree.leaves(b.part2)))
  assert diff > 1e-4


def test_sfl_order_actually_matters():
  """Guards the equivalence test: a different order gives a different model."""
  data = make_fed_data([13, 7, 20, 5], dominant=np.array([2, 0, 1, 0], np.int32))
  key = jax.random.key(5)
  a, _ = run_rounds(sfl, make_setup(tiny_model(), data, order="fixed"), data, key, 1)
  b, _ = run_rounds(sfl, make_setup(tiny_model(), data, order="cyclic"), data, key, 1)
  diff = max(float(jnp.abs(x - y).max()) for x, y in
             zip(jax.tree.leaves(a.part2), jax.tree.leaves(b.part2)))
  assert diff > 1e-4


def test_default_client_exec_per_backend():
  from jsfl.train.programs import UNROLL_MAX_CLIENTS, default_client_exec
  assert default_client_exec(10, "cpu") == "unroll"
  assert default_client_exec(UNROLL_MAX_CLIENTS, "cpu") == "unroll"
  assert default_client_exec(UNROLL_MAX_CLIENTS + 1, "cpu") == "map"
  assert default_client_exec(10, "gpu") == "vmap"
