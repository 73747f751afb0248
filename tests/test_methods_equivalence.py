"""Every vectorised round equals a plain per-client Python loop of the same math.

The references below use Python loops over rounds, batch steps, clients and the
server's processing order, eager per-client ``jax.vjp`` calls, and a
hand-written PyTorch-style SGD (weight decay added to the gradient, then
momentum) instead of optax, so a mistake in stacking, masking, gathering,
ordering, gating or optimiser state shows up as a mismatch.
"""

import functools

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_fed_data

from jsfl.core import batching
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.plan import plan_round
from jsfl.core.setup import Setup
from jsfl.engine.orders import processing_orders
from jsfl.methods import fedavg, sfl, splitfedv1
from jsfl.models import get_model

TOL = {"rtol": 1e-5, "atol": 1e-5}


def tiny_model(norm="batch"):
  return get_model("small_cnn", (8, 8, 1), 4, norm=norm, width=4, hidden=8)


def make_setup(model, data, **kw):
  sizes = np.asarray(data["sizes"])
  args = {"model": model, "num_clients": len(sizes), "clients_per_round": len(sizes),
              "max_size": int(sizes.max()), "batch_size": 4, "local_epochs": 1,
              "cut": 2, "order": "random", "order_rule": "steps",
              "lr": 0.1, "lr_decay": 0.9, "lr_min": 0.05,
              "momentum": 0.5, "weight_decay": 1e-3, "client_exec": "vmap"}
  args.update(kw)
  return Setup(**args)


# ------------------------------------------------------------ reference bits
# The per-client pieces are jitted one by one (a loop of jitted calls, the
# papers' way of running) only to keep the test fast; all control flow stays
# in Python.
@functools.partial(jax.jit, static_argnums=(4, 5))
def _ref_sgd(p, g, buf, lr, wd, mom):
  g = jax.tree.map(lambda g_, p_: g_ + wd * p_, g, p)
  if mom:
    buf = jax.tree.map(lambda b, g_: mom * b + g_, buf, g)
    g = buf
  return jax.tree.map(lambda p_, g_: p_ - lr * g_, p, g), buf


def ref_sgd(p, g, buf, lr, setup):
  return _ref_sgd(p, g, buf, lr, setup.weight_decay, setup.momentum)


@functools.partial(jax.jit, static_argnums=(0, 6))
def ref_grad(model, p, s, x, y, m, start=0):
  """Loss, new BN stats, grads w.r.t. params and w.r.t. the input."""
  (l, ns), (gp, gx) = jax.value_and_grad(
      lambda p_, x_: loss_fn(model, p_, s, x_, y, m, start),
      argnums=(0, 1), has_aux=True)(p, x)
  return l, ns, gp, gx


@functools.partial(jax.jit, static_argnums=(0,))
def ref_fwd(model, p, s, x, m):
  return model.apply(p, s, x, train=True, mask=m)


@functools.partial(jax.jit, static_argnums=(0,))
def ref_bwd(model, p, s, x, m, g):
  _, vjp = jax.vjp(lambda p_: model.apply(p_, s, x, train=True, mask=m)[0], p)
  return vjp(g)[0]


def zeros_like(t):
  return jax.tree.map(jnp.zeros_like, t)


def ref_avg(trees, weights):
  w = np.asarray(weights, np.float64)
  w = w / w.sum()
  return jax.tree.map(lambda *xs: sum(float(wi) * x for wi, x in zip(w, xs)), *trees)


def schedule(setup, data, key, round_idx):
  """The round's random decisions, drawn exactly as the methods draw them."""
  plan = plan_round(setup, data, key, jnp.int32(round_idx))
  return (plan.order_key, plan.clients, np.asarray(plan.sizes), np.asarray(plan.idx),
          np.asarray(plan.mask), float(plan.lr))


def loss_fn(model, p, s, x, y, m, start=0):
  logits, ns = model.apply(p, s, x, start=start, train=True, mask=m)
  return masked_cross_entropy(logits, y, m), ns


def run_rounds(mod, setup, data, key, rounds):
  state = mod.init(setup, key)
  rnd = jax.jit(lambda s, k: mod.round(setup, s, data, k))
  losses = []
  for r in range(rounds):
    state, m = rnd(state, jax.random.fold_in(key, r))
    losses.append(float(m["loss"]))
  return state, losses


# ------------------------------------------------------------------ FedAvg
def ref_fedavg(setup, data, key, rounds):
  model = setup.model
  params, stats = fedavg.init(setup, key).params, fedavg.init(setup, key).stats
  losses = []
  for r in range(rounds):
    _, clients, sizes, idx, mask, lr = schedule(
        setup, data, jax.random.fold_in(key, r), r)
    outs, lsum = [], 0.0
    for c in range(len(clients)):
      p, s, buf = params, stats, zeros_like(params)
      for t in range(idx.shape[0]):
        if not mask[t, c].any():
          continue
        x, y = batching.gather(data, idx[t, c])
        l, ns, g, _ = ref_grad(model, p, s, x, y, mask[t, c])
        p, buf = ref_sgd(p, g, buf, lr, setup)
        s = ns
        lsum += float(l) * mask[t, c].sum()
      outs.append((p, s))
    params = ref_avg([o[0] for o in outs], sizes)
    stats = ref_avg([o[1] for o in outs], sizes)
    losses.append(lsum / mask.sum())
  return (params, stats), losses


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
  assert (np.asarray(plan.mask).sum(axis=2) % setup.batch_size == 0).all()


@pytest.mark.parametrize("client_exec", ["vmap", "unroll"])
def test_splitfedv1_equals_fedavg(client_exec):
  data = make_fed_data([13, 7, 20, 5])
  setup = make_setup(tiny_model(), data, local_epochs=2, client_exec=client_exec)
  key = jax.random.key(4)
  s_v1, l_v1 = run_rounds(splitfedv1, setup, data, key, 2)
  s_fa, l_fa = run_rounds(fedavg, setup, data, key, 2)
  chex.assert_trees_all_close(s_v1.part1 + s_v1.part2, s_fa.params, **TOL)
  chex.assert_trees_all_close(s_v1.part1_stats + s_v1.part2_stats, s_fa.stats, **TOL)
  np.testing.assert_allclose(l_v1, l_fa, **TOL)


# --------------------------------------------------------------------- SFL
class RefServer:
  """One server portion in a loop reference, updated in place by ``serve``.

  ``grad(part2, stats2, act, y, m) -> (loss, new stats, grad part2, grad
  act)`` is the server step's math; other ``grad`` functions or subclasses
  give the variants (another loss, Hydra's heads, ...).  ``begin_round``
  sees the round's global part-1 (a teacher may need it).
  """

  def __init__(self, setup, part2, stats2, grad=None):
    model, cut = setup.model, setup.cut
    self.setup, self.part2, self.stats2 = setup, part2, stats2
    self.buf = zeros_like(part2)
    self.grad = grad or (lambda p, s, a, y, m: ref_grad(model, p, s, a, y, m, cut))

  def begin_round(self, part1, stats1):
    pass

  def serve(self, act, y, m, lr, client, x):
    loss, ns2, g2, ga = self.grad(self.part2, self.stats2, act, y, m)
    self.part2, self.buf = ref_sgd(self.part2, g2, self.buf, lr, self.setup)
    self.stats2 = ns2
    return loss, ga

  def end_round(self):
    pass


def sample_weighted(part1, stats1, p1, s1, sizes):
  return ref_avg(p1, sizes), ref_avg(s1, sizes)


def ref_authors_queue(order, batches, first, per_turn, pick):
  """The Hydra authors' server loop (their run_sfl.py / run_hydra.py: a job
  buffer with one pending batch per client), transcribed with Python lists
  on participant positions.  ``pick(k, size)`` is random's k-th draw.

  Returns:
    The participants in serving order.
  """
  n = len(batches)
  left = [int(b) for b in batches]
  buffer = [int(c) for c in first if left[int(c)] > 0]
  count_f = order_ = next_index_order = 0
  seq = []
  while buffer:
    if order == "random":
      c = buffer.pop(pick(len(seq), len(buffer)))
    elif order == "cyclic_reverse":
      c = buffer.pop(-next_index_order)
    else:
      c = buffer.pop(0)
    seq.append(c)
    left[c] -= 1
    if left[c] == 0:  # the client's last batch: it leaves the buffer
      count_f = 0
      if order != "random":
        order_ = (order_ + 1) % n
      continue
    if order == "random":
      buffer.append(c)
    elif count_f < per_turn - 1:  # the same client again
      if order == "cyclic_reverse" and next_index_order == 1:
        buffer.append(c)
      else:
        buffer.insert(0, c)
      count_f += 1
    else:
      count_f = 0
      if order == "cyclic_reverse" and next_index_order == 1:
        buffer.insert(0, c)
      else:
        buffer.append(c)
      order_ = (order_ + 1) % n
      if order_ == 0 and order == "cyclic_reverse":
        next_index_order = 1 - next_index_order
  return seq


def authors_sequence(setup, order_key, mask, clients, dominant, label_rank):
  """The serving sequence of a round under ``order_rule="authors"``, by
  :func:`ref_authors_queue`, and each participant's live batch steps."""
  live = mask.any(axis=2)
  n = live.shape[1]
  if setup.order == "random":
    first = list(range(n))
  else:
    how = "fixed" if setup.order == "fixed" else "cyclic"
    first = np.asarray(processing_orders(how, order_key, 1, clients, dominant,
                                                label_rank))[0]

  def pick(k, size):
    return int(jax.random.randint(jax.random.fold_in(order_key, k), (), 0, size))

  seq = ref_authors_queue(setup.order, live.sum(0), first, setup.batches_per_turn, pick)
  return seq, [list(np.flatnonzero(live[:, c])) for c in range(n)]


def ref_split_events(setup, data, key, rounds, part1, stats1, server, label_rank,
                     starts=None, aggregate=sample_weighted):
  """:func:`ref_split` under ``order_rule="authors"``: the server takes the
  client batches one at a time in the queue's order, each client runs
  forward right before and backward right after its own server step."""
  model = setup.model
  losses, orders_seen = [], []
  for r in range(rounds):
    rkey = jax.random.fold_in(key, r)
    order_key, clients, sizes, idx, mask, lr = schedule(setup, data, rkey, r)
    seq, steps_of = authors_sequence(setup, order_key, mask, clients, data["dominant"],
                                     label_rank)
    clients = np.asarray(clients)
    orders_seen.append(clients[seq])
    n = len(clients)
    server.begin_round(part1, stats1)
    p1 = [part1] * n if starts is None else starts(r, rkey, part1, n)
    s1 = [stats1] * n
    b1 = [zeros_like(part1)] * n
    served = [0] * n
    lsum = 0.0
    for c in seq:
      t = steps_of[c][served[c]]
      served[c] += 1
      x, y = batching.gather(data, idx[t, c])
      act, new_s1 = ref_fwd(model, p1[c], s1[c], x, mask[t, c])
      l, g_act = server.serve(act, y, mask[t, c], lr, clients[c], x)
      lsum += float(l) * mask[t, c].sum()
      g1 = ref_bwd(model, p1[c], s1[c], x, mask[t, c], g_act)
      p1[c], b1[c] = ref_sgd(p1[c], g1, b1[c], lr, setup)
      s1[c] = new_s1
    server.end_round()
    part1, stats1 = aggregate(part1, stats1, p1, s1, sizes)
    losses.append(lsum / mask.sum())
  return (part1, stats1), losses, orders_seen


def ref_split(setup, data, key, rounds, part1, stats1, server, label_rank,
              starts=None, aggregate=sample_weighted):
  """The split family's shared loop reference: per round and batch step,
  clients forward, ``server.serve`` per client in the processing order,
  clients backward; then ``aggregate`` the client portions (sample-weighted
  by default).  ``starts(r, round_key, part1, n)`` gives the clients'
  starting part-1 (default: the global one).  Under ``order_rule="authors"``
  it is :func:`ref_split_events`."""
  if setup.order_rule == "authors" and label_rank is not None:
    return ref_split_events(setup, data, key, rounds, part1, stats1, server, label_rank,
                            starts, aggregate)
  model = setup.model
  losses, orders_seen = [], []
  for r in range(rounds):
    rkey = jax.random.fold_in(key, r)
    order_key, clients, sizes, idx, mask, lr = schedule(setup, data, rkey, r)
    orders = np.asarray(processing_orders(
        setup.order, order_key, idx.shape[0], clients, data["dominant"], label_rank))
    clients = np.asarray(clients)
    orders_seen.append(clients[orders])
    n = len(clients)
    server.begin_round(part1, stats1)
    p1 = [part1] * n if starts is None else starts(r, rkey, part1, n)
    s1 = [stats1] * n
    b1 = [zeros_like(part1)] * n
    lsum = 0.0
    for t in range(idx.shape[0]):
      acts, xs, new_s1, ys = [None] * n, [None] * n, [None] * n, [None] * n
      for c in range(n):
        xs[c], ys[c] = batching.gather(data, idx[t, c])
        acts[c], new_s1[c] = ref_fwd(model, p1[c], s1[c], xs[c], mask[t, c])
      g_act = [None] * n
      for c in orders[t]:
        if not mask[t, c].any():
          continue
        l, g_act[c] = server.serve(acts[c], ys[c], mask[t, c], lr, clients[c], xs[c])
        lsum += float(l) * mask[t, c].sum()
      for c in range(n):
        if g_act[c] is None:
          continue
        g1 = ref_bwd(model, p1[c], s1[c], xs[c], mask[t, c], g_act[c])
        p1[c], b1[c] = ref_sgd(p1[c], g1, b1[c], lr, setup)
        s1[c] = new_s1[c]
    server.end_round()
    part1, stats1 = aggregate(part1, stats1, p1, s1, sizes)
    losses.append(lsum / mask.sum())
  return (part1, stats1), losses, orders_seen


def ref_sfl(setup, data, key, rounds, grad=None):
  """SFL with loops: clients forward, server in order, clients backward."""
  st = sfl.init(setup, key)
  server = RefServer(setup, st.part2, st.part2_stats, grad)
  (part1, stats1), losses, orders_seen = ref_split(
      setup, data, key, rounds, st.part1, st.part1_stats, server, st.label_rank)
  return (part1, stats1, server.part2, server.stats2), losses, orders_seen


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
  from jsfl import runner
  assert runner.default_client_exec(10, "cpu") == "unroll"
  assert runner.default_client_exec(runner.UNROLL_MAX_CLIENTS + 1, "cpu") == "vmap"
  assert runner.default_client_exec(10, "gpu") == "vmap"
