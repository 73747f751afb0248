"""Plain per-client Python loops of the methods' math: the references every
``*_equals_loop`` test compares a vectorised round with.

The references loop over rounds, batch steps (or the server queue's single
batches), clients and the server's processing order, with eager per-client
``jax.vjp`` calls and a hand-written PyTorch-style SGD (weight decay added to
the gradient, then momentum) instead of optax, so a mistake in stacking,
masking, gathering, ordering, gating or optimiser state shows up as a
mismatch.  The per-client pieces are jitted one by one (a loop of jitted
calls, the papers' way of running) only to keep the tests fast; all control
flow stays in Python.
"""


import functools

import jax
import jax.numpy as jnp
import numpy as np

from jsfl.core.data import gather, training_data
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.plan import plan_round
from jsfl.core.setup import Setup
from jsfl.engine.orders import processing_orders
from jsfl.methods import fedavg, sfl
from jsfl.models import get_model

TOL = {"rtol": 1e-5, "atol": 1e-5}


def tiny_model(norm="batch"):
  return get_model("small_cnn", (8, 8, 1), 4, norm=norm, width=4, hidden=8)


def make_setup(model, data, **kw):
  sizes = np.asarray(data.sizes)
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
@functools.partial(jax.jit, static_argnums=(4, 5, 6))
def _ref_sgd(p, g, buf, lr, wd, mom, clip=0.0):
  if clip:
    # torch.nn.utils.clip_grad_norm_: one 2-norm over the whole tree.
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g_)) for g_ in jax.tree.leaves(g)))
    g = jax.tree.map(lambda g_: g_ * jnp.minimum(1.0, clip / (norm + 1e-6)), g)
  g = jax.tree.map(lambda g_, p_: g_ + wd * p_, g, p)
  if mom:
    buf = jax.tree.map(lambda b, g_: mom * b + g_, buf, g)
    g = buf
  return jax.tree.map(lambda p_, g_: p_ - lr * g_, p, g), buf


def ref_sgd(p, g, buf, lr, setup):
  return _ref_sgd(p, g, buf, lr, setup.weight_decay, setup.momentum, setup.clip_norm)


def ref_client_sgd(p, g, buf, lr, setup):
  """A client's part-1 step: without weight decay under
  ``weight_decay_scope = "part2"`` (only the server's part-2 is decayed)."""
  wd = 0.0 if setup.weight_decay_scope == "part2" else setup.weight_decay
  return _ref_sgd(p, g, buf, lr, wd, setup.momentum, setup.clip_norm)


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
  """The round's random decisions, drawn exactly as the methods draw them,
  and the participants' weights in a round-end mean: their sample counts,
  or one each under ``aggregation = "uniform"`` (taken from the data here,
  not from the plan's own weights)."""
  plan = plan_round(setup, data, key, jnp.int32(round_idx))
  sizes = np.asarray(data.sizes)[np.asarray(plan.clients)]
  weights = np.ones(len(sizes)) if setup.aggregation == "uniform" else sizes
  return (plan.order_key, plan.clients, weights, np.asarray(plan.idx),
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
    rkey = jax.random.fold_in(key, r)
    _, clients, weights, idx, mask, lr = schedule(setup, data, rkey, r)
    rdata = training_data(setup, data, rkey)
    outs, lsum = [], 0.0
    for c in range(len(clients)):
      p, s, buf = params, stats, zeros_like(params)
      for t in range(idx.shape[0]):
        if not mask[t, c].any():
          continue
        x, y = gather(rdata, idx[t, c])
        l, ns, g, _ = ref_grad(model, p, s, x, y, mask[t, c])
        p, buf = ref_sgd(p, g, buf, lr, setup)
        s = ns
        lsum += float(l) * mask[t, c].sum()
      outs.append((p, s))
    params = ref_avg([o[0] for o in outs], weights)
    stats = ref_avg([o[1] for o in outs], weights)
    losses.append(lsum / mask.sum())
  return (params, stats), losses


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


def weighted_avg(part1, stats1, p1, s1, weights):
  return ref_avg(p1, weights), ref_avg(s1, weights)


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


def ref_client_cycle(clients, client_rank):
  """``method.cycle = "client"``: the participants' positions in the run's
  client cycle (``client_rank``: each client's place in it)."""
  rank = np.asarray(client_rank)
  return sorted(range(len(clients)), key=lambda c: rank[int(clients[c])])


def authors_sequence(setup, order_key, mask, clients, dominant, label_rank):
  """The serving sequence of a round under ``order_rule="authors"``, by
  :func:`ref_authors_queue`, and each participant's live batch steps."""
  live = mask.any(axis=2)
  n = live.shape[1]
  if setup.order == "random":
    first = list(range(n))
  elif setup.order != "fixed" and setup.cycle == "client":
    first = ref_client_cycle(np.asarray(clients), label_rank)
  else:
    how = "fixed" if setup.order == "fixed" else "cyclic"
    first = np.asarray(processing_orders(how, order_key, 1, clients, dominant,
                                                label_rank))[0]

  def pick(k, size):
    return int(jax.random.randint(jax.random.fold_in(order_key, k), (), 0, size))

  seq = ref_authors_queue(setup.order, live.sum(0), first, setup.batches_per_turn, pick)
  return seq, [list(np.flatnonzero(live[:, c])) for c in range(n)]


def ref_split_events(setup, data, key, rounds, part1, stats1, server, label_rank,
                     starts=None, aggregate=weighted_avg, before_visit=None):
  """:func:`ref_split` under ``order_rule="authors"``: the server takes the
  client batches one at a time in the queue's order, each client runs
  forward right before and backward right after its own server step.
  ``before_visit(r, client id, p1, s1, weights)`` (if given) sees the clients'
  part-1 copies before each server step (the server object is the caller's)."""
  model = setup.model
  losses, orders_seen = [], []
  for r in range(rounds):
    rkey = jax.random.fold_in(key, r)
    order_key, clients, weights, idx, mask, lr = schedule(setup, data, rkey, r)
    rdata = training_data(setup, data, rkey)
    seq, steps_of = authors_sequence(setup, order_key, mask, clients, data.dominant,
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
      if before_visit is not None:
        before_visit(r, int(clients[c]), p1, s1, weights)
      x, y = gather(rdata, idx[t, c])
      act, new_s1 = ref_fwd(model, p1[c], s1[c], x, mask[t, c])
      l, g_act = server.serve(act, y, mask[t, c], lr, clients[c], x)
      lsum += float(l) * mask[t, c].sum()
      g1 = ref_bwd(model, p1[c], s1[c], x, mask[t, c], g_act)
      p1[c], b1[c] = ref_client_sgd(p1[c], g1, b1[c], lr, setup)
      s1[c] = new_s1
    server.end_round()
    part1, stats1 = aggregate(part1, stats1, p1, s1, weights)
    losses.append(lsum / mask.sum())
  return (part1, stats1), losses, orders_seen


def ref_split(setup, data, key, rounds, part1, stats1, server, label_rank,
              starts=None, aggregate=weighted_avg):
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
    order_key, clients, weights, idx, mask, lr = schedule(setup, data, rkey, r)
    rdata = training_data(setup, data, rkey)
    places = (np.arange(len(data.dominant)) if setup.cycle == "client"
              else data.dominant)
    orders = np.asarray(processing_orders(
        setup.order, order_key, idx.shape[0], clients, places, label_rank))
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
        xs[c], ys[c] = gather(rdata, idx[t, c])
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
        p1[c], b1[c] = ref_client_sgd(p1[c], g1, b1[c], lr, setup)
        s1[c] = new_s1[c]
    server.end_round()
    part1, stats1 = aggregate(part1, stats1, p1, s1, weights)
    losses.append(lsum / mask.sum())
  return (part1, stats1), losses, orders_seen


def ref_sfl(setup, data, key, rounds, grad=None):
  """SFL with loops: clients forward, server in order, clients backward."""
  st = sfl.init(setup, key)
  server = RefServer(setup, st.part2, st.part2_stats, grad)
  (part1, stats1), losses, orders_seen = ref_split(
      setup, data, key, rounds, st.part1, st.part1_stats, server, st.label_rank)
  return (part1, stats1, server.part2, server.stats2), losses, orders_seen
