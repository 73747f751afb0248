"""SplitFed-family baselines (docs/methods-splitfed.md): SplitFedV3, SplitNN,
MultiHead, MergeSFL.

Each vectorised round is compared with a plain per-client Python loop of the
same math (the style of ``test_methods_equivalence``: per-client jitted
pieces, Python control flow, hand-written SGD), over several rounds with
partial participation, unequal clients, BatchNorm, momentum and weight decay.
Cross-checks that do not share the references' code guard them: with one
client SplitNN and MergeSFL must equal SFL; the max-logit inference rules are
checked against per-candidate logits on cases with several winners; the
heads (and part-1 copies) of non-participants must not move.
"""

import dataclasses

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import make_fed_data
from loop_reference import (
  TOL,
  make_setup,
  ref_avg,
  ref_bwd,
  ref_fwd,
  ref_grad,
  ref_sgd,
  schedule,
  tiny_model,
  zeros_like,
)

from jsfl import config, train
from jsfl.core.data import gather, training_data
from jsfl.core.method import activation_size, portion_bytes
from jsfl.engine.orders import processing_orders
from jsfl.methods import (
  mergesfl,
  multihead,
  sfl,
  splitfedv3,
  splitnn,
)
from jsfl.methods.mergesfl import MergeSFLOptions
from jsfl.methods.multihead import MultiHeadOptions
from jsfl.rundir import read_metrics

# Compiling a round program costs seconds on the shared 2-core CPU, so the
# tests share a few setups and reuse each method's jitted round.
SIZES = [13, 7, 20, 5]
DATA = make_fed_data(SIZES, dominant=np.array([2, 0, 1, 0], np.int32))
# partial participation, unequal clients, BatchNorm, momentum, weight decay
PARTIAL = make_setup(tiny_model(), DATA, clients_per_round=3)
DATA1 = make_fed_data([17])
# one client, two local epochs
ONE = make_setup(tiny_model(), DATA1, local_epochs=2)
_ROUNDS = {}


def round_fn(mod, setup, data):
  """The jitted round of ``mod`` for ``setup``, compiled once per file."""
  key = (mod.__name__, id(setup), id(data))
  if key not in _ROUNDS:
    _ROUNDS[key] = jax.jit(lambda s, k: mod.round(setup, s, data, k))
  return _ROUNDS[key]


def run_rounds(mod, setup, data, key, rounds):
  return run_from(mod, setup, data, key, rounds, mod.init(setup, key))


def run_from(mod, setup, data, key, rounds, state):
  """Runs ``rounds`` rounds from ``state``; returns the state and losses."""
  rnd = round_fn(mod, setup, data)
  losses = []
  for r in range(rounds):
    state, m = rnd(state, jax.random.fold_in(key, r))
    losses.append(float(m["loss"]))
  return state, losses


def rows(stacked, i):
  return jax.tree.map(lambda a: a[i], stacked)


def ref_split_client(setup, data, p1, s1, p2, s2, b1, b2, idx, mask, lr):
  """One client's split steps over its batch steps (empty ones skipped)."""
  model, lsum = setup.model, 0.0
  for t in range(idx.shape[0]):
    if not mask[t].any():
      continue
    x, y = gather(data, idx[t])
    act, ns1 = ref_fwd(model, p1, s1, x, mask[t])
    l, ns2, g2, ga = ref_grad(model, p2, s2, act, y, mask[t], setup.cut)
    g1 = ref_bwd(model, p1, s1, x, mask[t], ga)
    p1, b1 = ref_sgd(p1, g1, b1, lr, setup)
    p2, b2 = ref_sgd(p2, g2, b2, lr, setup)
    s1, s2 = ns1, ns2
    lsum += float(l) * mask[t].sum()
  return p1, s1, p2, s2, b1, b2, lsum


# -------------------------------------------------------------- SplitFedV3
def ref_splitfedv3(setup, data, key, rounds):
  st = splitfedv3.init(setup, key)
  K = setup.num_clients
  p1 = [rows(st.part1, k) for k in range(K)]
  s1 = [rows(st.part1_stats, k) for k in range(K)]
  part2, stats2 = st.part2, st.part2_stats
  losses = []
  for r in range(rounds):
    _, clients, _, idx, mask, lr = schedule(setup, data, jax.random.fold_in(key, r), r)
    outs, lsum = [], 0.0
    for i, c in enumerate(np.asarray(clients)):
      a, b, p2, s2, _, _, ls = ref_split_client(
          setup, data, p1[c], s1[c], part2, stats2, zeros_like(p1[c]),
          zeros_like(part2), idx[:, i], mask[:, i], lr)
      p1[c], s1[c] = a, b
      outs.append((p2, s2))
      lsum += ls
    uniform = np.ones(len(outs))
    part2 = ref_avg([o[0] for o in outs], uniform)
    stats2 = ref_avg([o[1] for o in outs], uniform)
    losses.append(lsum / mask.sum())
  return (p1, s1, part2, stats2), losses


def test_splitfedv3_equals_loop():
  key = jax.random.key(7)
  state, losses = run_rounds(splitfedv3, PARTIAL, DATA, key, 2)
  (p1, s1, p2, s2), ref_losses = ref_splitfedv3(PARTIAL, DATA, key, 2)
  for k in range(PARTIAL.num_clients):
    chex.assert_trees_all_close(rows(state.part1, k), p1[k], **TOL)
    chex.assert_trees_all_close(rows(state.part1_stats, k), s1[k], **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  # the copies really differ (no accidental aggregation of part-1)
  leaf = jax.tree.leaves(state.part1)[0]
  assert float(jnp.abs(leaf[0] - leaf[1]).max()) > 1e-4


def test_splitfedv3_predict_picks_the_most_confident_client():
  model = PARTIAL.model
  state = splitfedv3.init(PARTIAL, jax.random.key(9))
  # Hand-made: every client gets an independently initialised part-1, so the
  # most confident client changes from sample to sample.
  inits = [model.init(jax.random.key(100 + k))[0][:PARTIAL.cut]
           for k in range(PARTIAL.num_clients)]
  state = state.replace(part1=jax.tree.map(lambda *xs: jnp.stack(xs), *inits))
  x = gather(DATA, jnp.arange(40))[0]
  got = jax.jit(lambda s, xx: splitfedv3.predict(PARTIAL, s, xx))(state, x)
  per_client = np.stack([
      np.asarray(model.logits(rows(state.part1, k) + state.part2,
                              rows(state.part1_stats, k) + state.part2_stats, x))
      for k in range(PARTIAL.num_clients)])
  winner = per_client.max(-1).argmax(0)
  assert len(set(winner.tolist())) >= 2, "hand-made case must have several winners"
  np.testing.assert_allclose(np.asarray(got), per_client[winner, np.arange(40)], **TOL)


def test_max_logit_select_ties_go_to_the_lowest_index():
  cands = jnp.array([[[1.0, 3.0], [0.0, 0.0]],
                     [[3.0, 2.0], [5.0, -1.0]],
                     [[0.0, 3.0], [5.0, 4.0]]])  # (candidate, sample, class)
  got = splitfedv3.max_logit_select(lambda c, _: c, cands, None)
  np.testing.assert_array_equal(np.asarray(got), [[1.0, 3.0], [5.0, -1.0]])


# ----------------------------------------------------------------- SplitNN
def ref_splitnn(setup, data, key, rounds):
  st = splitnn.init(setup, key)
  p1, s1, p2, s2 = st.part1, st.part1_stats, st.part2, st.part2_stats
  b2 = zeros_like(p2)
  losses, visits = [], []
  for r in range(rounds):
    order_key, clients, _, idx, mask, lr = schedule(
        setup, data, jax.random.fold_in(key, r), r)
    clients = np.asarray(clients)
    if setup.order == "random":
      # drawn as the permutation of SFL's first random batch step
      order = np.asarray(processing_orders(
          "random", order_key, 1, clients, data.dominant, st.label_rank)[0])
    else:
      order = np.argsort(clients)
    visits.append(clients[order])
    lsum = 0.0
    for i in order:
      p1, s1, p2, s2, _, b2, ls = ref_split_client(
          setup, data, p1, s1, p2, s2, zeros_like(p1), b2, idx[:, i], mask[:, i], lr)
      lsum += ls
    losses.append(lsum / mask.sum())
  return (p1, s1, p2, s2), losses, visits


def test_splitnn_equals_loop():
  key = jax.random.key(11)
  state = splitnn.init(PARTIAL, key)
  rnd = round_fn(splitnn, PARTIAL, DATA)
  losses, visits = [], []
  for r in range(3):
    state, m = rnd(state, jax.random.fold_in(key, r))
    losses.append(float(m["loss"]))
    visits.append(np.asarray(m["clients"]))
  (p1, s1, p2, s2), ref_losses, ref_visits = ref_splitnn(PARTIAL, DATA, key, 3)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  np.testing.assert_array_equal(visits, ref_visits)
  assert any(np.any(np.diff(v) < 0) for v in visits), "random order never shuffled"


def test_splitnn_visiting_orders():
  st = splitnn.init(PARTIAL, jax.random.key(0))
  clients = jnp.array([0, 2, 3], jnp.int32)

  def order(name, r):
    setup = PARTIAL.replace(order=name)
    pos = splitnn.visiting_order(setup, jax.random.key(r), clients,
                                 DATA.dominant, st.label_rank, jnp.int32(r))
    return np.asarray(clients)[np.asarray(pos)]

  np.testing.assert_array_equal(order("fixed", 0), [0, 2, 3])
  draws = {tuple(order("random", r)) for r in range(8)}
  assert len(draws) > 1 and all(sorted(d) == [0, 2, 3] for d in draws)
  cyc = [order("cyclic_reverse", r) for r in range(3)]
  rank = np.asarray(st.label_rank)[np.asarray(DATA.dominant)[cyc[0]]]
  assert np.all(np.diff(rank) >= 0)  # grouped by the run's label cycle
  np.testing.assert_array_equal(cyc[1], cyc[0][::-1])
  np.testing.assert_array_equal(cyc[2], cyc[0])
  np.testing.assert_array_equal(order("cyclic", 1), cyc[0])


# --------------------------------------------------------------- MultiHead
def ref_multihead(setup, data, key, rounds):
  model, h = setup.model, multihead.head_cut(setup)
  st = multihead.init(setup, key)
  body, body_s = st.body, st.body_stats
  heads = [rows(st.heads, k) for k in range(setup.num_clients)]
  heads_s = [rows(st.heads_stats, k) for k in range(setup.num_clients)]
  losses = []
  for r in range(rounds):
    rkey = jax.random.fold_in(key, r)
    _, clients, weights, idx, mask, lr = schedule(setup, data, rkey, r)
    rdata = training_data(setup, data, rkey)
    outs, lsum = [], 0.0
    for i, c in enumerate(np.asarray(clients)):
      p, s = body + heads[c], body_s + heads_s[c]
      buf = zeros_like(p)
      for t in range(idx.shape[0]):
        if not mask[t, i].any():
          continue
        x, y = gather(rdata, idx[t, i])
        l, ns, g, _ = ref_grad(model, p, s, x, y, mask[t, i])
        p, buf = ref_sgd(p, g, buf, lr, setup)
        s = ns
        lsum += float(l) * mask[t, i].sum()
      heads[c], heads_s[c] = p[h:], s[h:]
      outs.append((p[:h], s[:h]))
    body = ref_avg([o[0] for o in outs], weights)
    body_s = ref_avg([o[1] for o in outs], weights)
    losses.append(lsum / mask.sum())
  return (body, body_s, heads, heads_s), losses


# head = stages [1, 4): conv2 (with BatchNorm) and both dense layers
MH = PARTIAL.replace(options=MultiHeadOptions(head_cut=1))
MH_DEFAULT = PARTIAL.replace(options=MultiHeadOptions())


def test_multihead_head_cut_option():
  assert multihead.head_cut(MH_DEFAULT) == PARTIAL.model.default_head_cut == 3
  assert multihead.head_cut(MH) == 1
  with pytest.raises(ValueError, match="method.head_cut"):
    multihead.head_cut(PARTIAL.replace(options=MultiHeadOptions(head_cut=4)))


@pytest.mark.parametrize("aggregation,augment", [("samples", "none"),
                                                 ("uniform", "crop_flip")])
def test_multihead_equals_loop(aggregation, augment):
  setup = MH.replace(aggregation=aggregation, augment=augment)
  key = jax.random.key(13)
  state, losses = run_rounds(multihead, setup, DATA, key, 2)
  (body, body_s, heads, heads_s), ref_losses = ref_multihead(setup, DATA, key, 2)
  chex.assert_trees_all_close(state.body, body, **TOL)
  chex.assert_trees_all_close(state.body_stats, body_s, **TOL)
  for k in range(MH.num_clients):
    chex.assert_trees_all_close(rows(state.heads, k), heads[k], **TOL)
    chex.assert_trees_all_close(rows(state.heads_stats, k), heads_s[k], **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)


def max_diff(a, b):
  return max(float(jnp.abs(x - y).max()) for x, y in
             zip(jax.tree.leaves(a), jax.tree.leaves(b)))


def test_multihead_keeps_heads_of_non_participants():
  key = jax.random.key(14)
  s0 = multihead.init(MH, key)
  s1, m = round_fn(multihead, MH, DATA)(s0, key)
  part = set(np.asarray(m["clients"]).tolist())
  assert len(part) == 3
  for k in range(MH.num_clients):
    moved = max_diff(rows(s1.heads, k), rows(s0.heads, k)) > 1e-5
    stats_moved = max_diff(rows(s1.heads_stats, k), rows(s0.heads_stats, k)) > 1e-5
    assert moved == stats_moved == (k in part), k
  assert max_diff(s1.body, s0.body) > 1e-5


def test_multihead_predict_picks_the_most_confident_head():
  model, h = PARTIAL.model, multihead.head_cut(MH_DEFAULT)
  state = multihead.init(MH_DEFAULT, jax.random.key(15))
  # He-normal heads: PyTorch-style ones are too alike to give several winners.
  drawn = dataclasses.replace(model, init_scheme="he_lecun")
  inits = [drawn.init(jax.random.key(200 + k))[0][h:]
           for k in range(PARTIAL.num_clients)]
  state = state.replace(heads=jax.tree.map(lambda *xs: jnp.stack(xs), *inits))
  x = gather(DATA, jnp.arange(40))[0]
  got = np.asarray(jax.jit(lambda s, xx: multihead.predict(MH_DEFAULT, s, xx))(state, x))
  per = np.stack([np.asarray(model.logits(state.body + inits[k],
                                          state.body_stats + rows(state.heads_stats, k), x))
                  for k in range(PARTIAL.num_clients)])
  winner = per.max(-1).argmax(0)
  assert len(set(winner.tolist())) >= 2, "hand-made case must have several winners"
  np.testing.assert_allclose(got, per[winner, np.arange(40)], **TOL)


# ---------------------------------------------------------------- MergeSFL
def ref_mergesfl(setup, data, key, rounds):
  """MergeSFL in loops.  Options as the Hydra authors' run_mergesfl.py:
  ``grad_scale="client_mean"`` multiplies a client's slice of the merged
  gradient by (merged samples / its samples); ``part1_copies = C``: client c
  trains copy ``j mod C`` on its j-th batch of the round and copy C - 1 is
  what gets averaged."""
  model, cut = setup.model, setup.cut
  opts = dataclasses.asdict(setup.options)
  copies = opts.get("part1_copies", 10)
  per_client = opts.get("grad_scale", "client_mean") == "client_mean"
  st = mergesfl.init(setup, key)
  part1, stats1 = st.part1, st.part1_stats
  part2, stats2, b2 = st.part2, st.part2_stats, zeros_like(st.part2)
  losses = []
  for r in range(rounds):
    _, clients, weights, idx, mask, lr = schedule(setup, data, jax.random.fold_in(key, r), r)
    n = len(clients)
    p1 = [[part1] * copies for _ in range(n)]
    s1 = [[stats1] * copies for _ in range(n)]
    b1 = [[zeros_like(part1)] * copies for _ in range(n)]
    served = [0] * n
    lsum = 0.0
    for t in range(idx.shape[0]):
      xs, ys, acts, ns1, k = [], [], [], [], []
      for c in range(n):
        k.append(served[c] % copies)
        x, y = gather(data, idx[t, c])
        a, s = ref_fwd(model, p1[c][k[c]], s1[c][k[c]], x, mask[t, c])
        xs.append(x), ys.append(y), acts.append(a), ns1.append(s)
      if not mask[t].any():
        continue
      l, ns2, g2, ga = ref_grad(model, part2, stats2, jnp.concatenate(acts),
                                jnp.concatenate(ys), mask[t].reshape(-1), cut)
      part2, b2 = ref_sgd(part2, g2, b2, lr, setup)
      stats2 = ns2
      lsum += float(l) * mask[t].sum()
      B = idx.shape[-1]
      for c in range(n):
        if not mask[t, c].any():
          continue
        g = ga[c * B:(c + 1) * B]
        if per_client:
          g = g * (mask[t].sum() / mask[t, c].sum())
        g1 = ref_bwd(model, p1[c][k[c]], s1[c][k[c]], xs[c], mask[t, c], g)
        p1[c][k[c]], b1[c][k[c]] = ref_sgd(p1[c][k[c]], g1, b1[c][k[c]], lr, setup)
        s1[c][k[c]] = ns1[c]
        served[c] += 1
    part1 = ref_avg([p[-1] for p in p1], weights)
    stats1 = ref_avg([s[-1] for s in s1], weights)
    losses.append(lsum / mask.sum())
  return (part1, stats1, part2, stats2), losses


MERGE_CASES = {  # (grad_scale, part1_copies, local_epochs, aggregation)
    "paper": ("merged", 1, 1, "samples"), "client_mean": ("client_mean", 1, 1, "samples"),
    "authors": ("client_mean", 3, 2, "uniform")}  # run_mergesfl.py averages uniformly


@pytest.mark.parametrize("case", sorted(MERGE_CASES))
def test_mergesfl_equals_loop(case):
  scale, copies, epochs, aggregation = MERGE_CASES[case]
  setup = PARTIAL.replace(local_epochs=epochs, aggregation=aggregation,
                          options=MergeSFLOptions(grad_scale=scale, part1_copies=copies))
  key = jax.random.key(16)
  state, losses = run_rounds(mergesfl, setup, DATA, key, 2)
  (p1, s1, p2, s2), ref_losses = ref_mergesfl(setup, DATA, key, 2)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)


def test_one_client_splitnn_and_mergesfl_equal_sfl():
  """With one client SplitNN (visit = round), MergeSFL (merged batch = the
  client's batch) and SFL are the same algorithm, optimiser states included:
  the server's persists, the client's lives one round."""
  key = jax.random.key(17)
  ref, l_ref = run_rounds(sfl, ONE, DATA1, key, 2)
  one_copy = ONE.replace(options=MergeSFLOptions(part1_copies=1))
  for mod, setup in ((splitnn, ONE), (mergesfl, one_copy)):
    a, la = run_rounds(mod, setup, DATA1, key, 2)
    chex.assert_trees_all_close(a.part1 + a.part2, ref.part1 + ref.part2, **TOL)
    chex.assert_trees_all_close(a.part1_stats + a.part2_stats,
                                ref.part1_stats + ref.part2_stats, **TOL)
    chex.assert_trees_all_close(a.server_opt, ref.server_opt, **TOL)
    np.testing.assert_allclose(la, l_ref, **TOL)


# ------------------------------------------- whole runs (train.run) and bytes
@pytest.mark.parametrize("name, extra", [
    ("splitfedv3", []), ("splitnn", ["method.order=fixed"]),
    ("multihead", ["method.head_cut=2"]), ("mergesfl", [])])
def test_runs_through_the_runner(tmp_path, name, extra):
  cfg = config.load_config(None, [
      "dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]",
      "dataset.num_classes=4", "dataset.train_size=200", "dataset.test_size=50",
      "partition.num_clients=4", "model.width=4", "model.hidden=8",
      f"method.name={name}", "method.clients_per_round=3", "method.batch_size=16",
      "run.rounds=1", f"run.dir={tmp_path / name}", "exec.progress=false",
      "exec.eval_batch=25", *extra])
  out = train.run(cfg)
  recs = read_metrics(f"{out}/metrics.jsonl")
  assert [r["round"] for r in recs] == [1]
  for r in recs:
    assert np.isfinite(r["accuracy"]) and 0 <= r["accuracy"] <= 100
    assert np.isfinite(r["train_loss"]) and r["bytes_up"] > 0 and r["bytes_down"] > 0
    assert len(r["clients"]) == 3


def test_communication():
  model = PARTIAL.model
  act = activation_size(model, PARTIAL.cut) * 4
  p1 = portion_bytes(model, 0, PARTIAL.cut)
  body = portion_bytes(model, 0, model.default_head_cut)
  assert splitfedv3.communication(PARTIAL, 10) == (10 * (act + 4), 10 * act)
  for mod in (splitnn, mergesfl):
    assert mod.communication(PARTIAL, 10) == (3 * p1 + 10 * (act + 4), 3 * p1 + 10 * act)
  with_heads = PARTIAL.replace(options=multihead.METHOD.options())
  assert multihead.communication(with_heads, 10) == (3 * body, 3 * body)
  assert body < portion_bytes(model, 0, model.num_stages)
