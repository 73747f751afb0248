"""Hydra: grouping against Algorithm 2 written as loops, rounds against a
per-client Python loop of the same math, heads isolation, run directory."""

import dataclasses
import functools
import itertools
import json

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import load_script, make_fed_data
from loop_reference import (
  TOL,
  RefServer,
  make_setup,
  ref_avg,
  ref_sfl,
  ref_sgd,
  ref_split,
  ref_split_events,
  run_rounds,
  tiny_model,
  zeros_like,
)

from jsfl import cli, data, plots
from jsfl.core.data import gather
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.optim import make_optimizer, with_lr
from jsfl.core.portion import Portion
from jsfl.data.tfds_source import CIFAR100_COARSE
from jsfl.methods import hydra, sfl
from jsfl.methods.hydra import HydraOptions
from jsfl.rundir import read_metrics
from jsfl.statistics import backward_transfer, step_class_accuracy
from jsfl.train.evaluate import chunk_test_set, confusion


# ---------------------------------------------------------------- grouping
def ref_grouping(rho, table, G):
  """The paper's Algorithm 2 with its indices corrected, literally
  (docs/methods-hydra.md, ``grouping = "algorithm2"``)."""
  rho_g = np.zeros((rho.shape[0], G), np.int64)
  for label, g in enumerate(table):
    rho_g[:, g] += rho[:, label]
  Q, group = list(range(rho.shape[0])), {}
  while Q:
    for g in range(G):
      if not Q:
        break
      best = max(Q, key=lambda c: (rho_g[c, g], -c))  # ties: lowest id
      group[best] = g
      Q.remove(best)
  return np.array([group[c] for c in range(rho.shape[0])])


def ref_table_grouping(rho, table):
  """The authors' grouping: client -> the group of its most frequent label."""
  return np.array([table[int(np.argmax(r))] for r in rho])


def ref_client_grouping(K, table=None):
  """The authors' code's assignment: by client id (``run_hydra.py``'s head a
  client; ``test_hydra_heads.py``'s ``teams[G][client]``)."""
  return np.array([k if table is None else table[k] for k in range(K)])


def test_client_grouping_is_by_id_where_table_grouping_is_by_label():
  """Off the dominant-label split two clients can share a dominant label:
  ``table`` then puts them on one head and leaves a head without a client;
  ``client`` gives each its own head (G = K), or row k of the table."""
  rho = np.array([[9, 1, 0, 0], [8, 0, 2, 0], [0, 7, 0, 1], [0, 0, 6, 5]])
  setup = lambda **o: make_setup(tiny_model(), make_fed_data([4, 4, 4, 4]),
                                 options=HydraOptions(**o))
  table = setup(grouping="table")
  assert hydra.groups_of(table, rho).tolist() == [0, 0, 1, 2]
  own = setup(grouping="client")
  assert hydra.num_groups(own) == 4 and hydra.own_heads(own)
  assert hydra.groups_of(own, rho).tolist() == ref_client_grouping(4).tolist()
  six = make_setup(tiny_model(), make_fed_data([4] * 6), options=HydraOptions(grouping="client"))
  assert hydra.num_groups(six) == 6  # a head a client, not a head a label
  g2 = setup(grouping="client", groups=2, superclasses="consecutive")
  want = ref_client_grouping(4, hydra.superclass_table("consecutive", 4, 2))
  assert hydra.groups_of(g2, rho).tolist() == want.tolist() == [0, 0, 1, 1]
  bad = make_setup(tiny_model(), make_fed_data([4] * 6),
                   options=HydraOptions(grouping="client", groups=2,
                                        superclasses="consecutive"))
  with pytest.raises(ValueError, match="grouping='client' with method.groups=2, 6 clients "
                                       "and 4 labels; allowed: groups = 0 or 6"):
    hydra.validate(bad)


def test_authors_tables_are_their_client_tables():
  """``superclasses="authors"`` is test_hydra_heads.py's ``teams_5`` /
  ``teams_2`` (client id -> head, client i dominant in label i), as labels."""
  teams_5 = {0: 0, 1: 1, 2: 0, 3: 3, 4: 4, 5: 3, 6: 4, 7: 3, 8: 2, 9: 1}
  teams_2 = {0: 1, 1: 1, 2: 0, 3: 0, 4: 0, 5: 0, 6: 0, 7: 0, 8: 1, 9: 1}
  for G, teams in ((5, teams_5), (2, teams_2)):
    table = hydra.superclass_table("authors", 10, G)
    rho = np.eye(10, dtype=np.int32) * 50 + 3  # client c dominant in label c
    got = np.asarray(hydra.group_by_table(rho, table))
    assert got.tolist() == [teams[c] for c in range(10)]


@pytest.mark.parametrize("seed", range(3))
def test_table_grouping_equals_loop(seed):
  rng = np.random.default_rng(seed)
  rho = rng.integers(0, 20, (12, 10))
  for name, G in (("authors", 5), ("cifar10", 2), ("consecutive", 3)):
    table = hydra.superclass_table(name, 10, G)
    np.testing.assert_array_equal(hydra.group_by_table(rho, table),
                                  ref_table_grouping(rho, table))


def test_grouping_hand_case():
  rho = np.array([[5, 0, 1], [0, 9, 0], [5, 1, 0], [0, 0, 3], [2, 2, 2]])
  # g0 takes client 0 (tie with 2, lowest id), g1 client 1, g2 client 3,
  # then g0 client 2 and g1 client 4.
  np.testing.assert_array_equal(hydra.group_clients(rho, jnp.arange(3), 3),
                                [0, 1, 0, 2, 1])


@pytest.mark.parametrize("K,L,G,seed", [(10, 10, 10, 0), (20, 10, 10, 1),
                                        (13, 10, 5, 2), (7, 10, 2, 3), (3, 4, 4, 4)])
def test_grouping_equals_algorithm_2(K, L, G, seed):
  rng = np.random.default_rng(seed)
  rho = rng.integers(0, 6, (K, L))  # small counts: many ties
  table = hydra.superclass_table("consecutive", L, G)
  got = np.asarray(hydra.group_clients(rho, jnp.asarray(table), G))
  np.testing.assert_array_equal(got, ref_grouping(rho, table, G))
  # balanced: group sizes differ by at most one (factor-ii)
  sizes = np.bincount(got, minlength=G)
  assert sizes.max() - sizes.min() <= 1


def test_grouping_of_dominant_label_clients_follows_the_label():
  phi, L = 3, 4
  rho = np.full((phi * L, L), 2)
  for c in range(phi * L):
    rho[c, c % L] = 50
  got = np.asarray(hydra.group_clients(rho, jnp.arange(L), L))
  np.testing.assert_array_equal(got, np.arange(phi * L) % L)


def test_superclass_tables():
  t5 = hydra.superclass_table("cifar10", 10, 5)
  # automobile & truck together, cat & dog together, ship alone
  assert t5[1] == t5[9] and t5[3] == t5[5] and np.sum(t5 == t5[8]) == 1
  t2 = hydra.superclass_table("cifar10", 10, 2)
  assert set(t2[[0, 1, 8, 9]]) == {1} and set(t2[2:8]) == {0}
  np.testing.assert_array_equal(hydra.superclass_table("consecutive", 10, 5),
                                [0, 0, 1, 1, 2, 2, 3, 3, 4, 4])
  np.testing.assert_array_equal(hydra.superclass_table("cifar10", 10, 10), np.arange(10))
  for name, G in itertools.product(("cifar10", "fashion_mnist"), (2, 5)):
    assert sorted(set(hydra.superclass_table(name, 10, G))) == list(range(G))
  with pytest.raises(ValueError, match="groups=11"):
    hydra.superclass_table("consecutive", 10, 11)
  with pytest.raises(ValueError, match="allowed: groups in"):
    hydra.superclass_table("cifar10", 10, 3)


# -------------------------------------------------------- loop reference
@functools.partial(jax.jit, static_argnums=(0, 1, 2))
def ref_hydra_grad(model, cut, hc, p2a, s2a, head, hs, act, y, m):
  def f(p2a, head, a):
    z, ns2a = model.apply(p2a, s2a, a, start=cut, train=True, mask=m)
    logits, nsh = model.apply(head, hs, z, start=hc, train=True, mask=m)
    return masked_cross_entropy(logits, y, m), (ns2a, nsh)
  (loss, (ns2a, nsh)), grads = jax.value_and_grad(
      f, argnums=(0, 1, 2), has_aux=True)(p2a, head, act)
  return loss, ns2a, nsh, grads


def take(tree, g):
  return jax.tree.map(lambda a: a[g], tree)


class HydraRefServer(RefServer):
  """Hydra's server in loops: part-2a, then the head of the client's group;
  the heads averaged at round end."""

  def __init__(self, setup, st, group):
    self.setup, self.group = setup, group
    self.p2a, self.s2a, self.b2a = st.part2a, st.part2a_stats, zeros_like(st.part2a)
    G = hydra.num_groups(setup)
    self.heads = [take(st.heads, g) for g in range(G)]
    self.hstats = [take(st.heads_stats, g) for g in range(G)]
    self.hbuf = [zeros_like(self.heads[0]) for _ in range(G)]

  def serve(self, act, y, m, lr, client, x):
    setup, g = self.setup, self.group[client]
    loss, ns2a, nsh, (g2a, gh, ga) = ref_hydra_grad(
        setup.model, setup.cut, hydra.head_cut(setup), self.p2a, self.s2a, self.heads[g],
        self.hstats[g], act, y, m)
    self.p2a, self.b2a = ref_sgd(self.p2a, g2a, self.b2a, lr, setup)
    self.heads[g], self.hbuf[g] = ref_sgd(self.heads[g], gh, self.hbuf[g], lr, setup)
    self.s2a, self.hstats[g] = ns2a, nsh
    return loss, ga

  def end_round(self):
    G = len(self.heads)
    mean_head, mean_hstats = ref_avg(self.heads, np.ones(G)), ref_avg(self.hstats, np.ones(G))
    self.heads, self.hstats = [mean_head] * G, [mean_hstats] * G


def ref_hydra(setup, data, key, rounds):
  """Hydra with loops over rounds, steps, clients (in order) and heads."""
  G = hydra.num_groups(setup)
  st = hydra.init(setup, key)
  opts = dataclasses.asdict(setup.options)
  table = (None if G > setup.num_classes else
           hydra.superclass_table(opts.get("superclasses", "authors"), setup.num_classes, G))
  rho = np.asarray(data.counts)
  if opts.get("grouping") == "client":
    group = ref_client_grouping(rho.shape[0], None if G == rho.shape[0] else table)
  else:
    group = (ref_grouping(rho, table, G) if opts.get("grouping") == "algorithm2"
             else ref_table_grouping(rho, table))
  server = HydraRefServer(setup, st, group)
  (part1, stats1), losses, _ = ref_split(setup, data, key, rounds, st.part1,
                                         st.part1_stats, server, st.label_rank)
  return (part1, stats1, server.p2a, server.s2a, server.heads[0], server.hstats[0]), losses


CASES = {
    # K = G: one client per head (seed 48: the four clients' most frequent
    # labels are 0, 2, 1, 3, so every head has its client); partial
    # participation
    "cyclic": {"sizes": [13, 7, 20, 5], "order": "cyclic", "n": 3, "opts": {}, "seed": 48},
    "random-G2": {"sizes": [13, 7, 20, 5, 9, 11], "order": "random", "n": 4,
                  "opts": {"groups": 2, "superclasses": "consecutive"}},
    "random-G2-algorithm2": {"sizes": [13, 7, 20, 5, 9, 11], "order": "random", "n": 4,
                             "opts": {"groups": 2, "superclasses": "consecutive",
                                      "grouping": "algorithm2"}},
    "reverse": {"sizes": [13, 7, 20, 5, 9, 11], "order": "cyclic_reverse", "n": 6,
                "opts": {}},
    # part-2a = a BatchNorm conv stage, heads = both dense stages
    "fixed-cut1": {"sizes": [13, 7, 20, 5], "order": "fixed", "n": 4,
                   "opts": {"head_cut": 2}, "cut": 1},
    # the authors' code's heads: one a client (G = K = 6 > L = 4: clients 4
    # and 5 share clients 0 and 1's dominant labels), their uniform mean;
    # partial participation, so some heads sit a round out
    "random-client": {"sizes": [13, 7, 20, 5, 9, 11], "order": "random", "n": 4,
                      "opts": {"grouping": "client"},
                      "setup": {"order_rule": "authors", "aggregation": "uniform"}},
    # the authors' cyclic order too: one random order of the 6 clients for
    # the run (clients 0 and 4 share a dominant label), turns of 2 batches
    "cyclic-client-cycle": {"sizes": [13, 7, 20, 5, 9, 11], "order": "cyclic", "n": 6,
                            "opts": {"grouping": "client"},
                            "setup": {"order_rule": "authors", "cycle": "client",
                                      "batches_per_turn": 2, "aggregation": "uniform"}},
    # test_hydra_heads.py's teams: client k on row k of the table (K = L)
    "cyclic-client-G2": {"sizes": [13, 7, 20, 5], "order": "cyclic", "n": 4,
                         "opts": {"groups": 2, "superclasses": "consecutive",
                                  "grouping": "client"}},
    # the authors' server queue: random picks per server step, turns of 2;
    # their uniform mean of part-1
    "random-authors-G2": {"sizes": [13, 7, 20, 5, 9, 11], "order": "random", "n": 5,
                          "opts": {"groups": 2, "superclasses": "consecutive"},
                          "setup": {"order_rule": "authors", "aggregation": "uniform"}},
    "cyclic-authors-turns": {"sizes": [13, 7, 20, 5, 9, 11], "order": "cyclic", "n": 6,
                             "opts": {}, "setup": {"order_rule": "authors",
                                                   "batches_per_turn": 2}},
    # L2 on part-2 only (Hydra App. H.5): part-2a and the heads decayed,
    # the clients' part-1 not
    "random-G2-decay-part2": {"sizes": [13, 7, 20, 5, 9, 11], "order": "random", "n": 4,
                              "opts": {"groups": 2, "superclasses": "consecutive"},
                              "setup": {"weight_decay": 0.05,
                                        "weight_decay_scope": "part2"}},
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_hydra_equals_loop(case):
  c = CASES[case]
  K = len(c["sizes"])
  data = make_fed_data(c["sizes"], dominant=np.arange(K, dtype=np.int32) % 4,
                       seed=c.get("seed", 0))
  setup = make_setup(tiny_model(), data, order=c["order"], clients_per_round=c["n"],
                     cut=c.get("cut", 2), options=HydraOptions(**c["opts"]),
                     **c.get("setup", {}))
  key = jax.random.key(11)
  if case == "cyclic":  # the guard: each of the four heads has a client
    assert sorted(np.asarray(data.counts).argmax(1).tolist()) == [0, 1, 2, 3]
  state, losses = run_rounds(hydra, setup, data, key, 2)
  (p1, s1, p2a, s2a, head, hs), ref_losses = ref_hydra(setup, data, key, 2)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2a, p2a, **TOL)
  chex.assert_trees_all_close(state.part2a_stats, s2a, **TOL)
  for g in range(hydra.num_groups(setup)):  # every head holds the average
    chex.assert_trees_all_close(take(state.heads, g), head, **TOL)
    chex.assert_trees_all_close(take(state.heads_stats, g), hs, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)


def test_server_step_touches_only_the_clients_head():
  data = make_fed_data([13, 7, 20, 5])
  setup = make_setup(tiny_model(), data, cut=1, options=HydraOptions(head_cut=2))
  st = hydra.init(setup, jax.random.key(0))
  # make the heads different so a wrong index would show
  heads = jax.tree.map(lambda a: a + jnp.arange(a.shape[0]).reshape(
      (-1,) + (1,) * (a.ndim - 1)).astype(a.dtype), st.heads)
  tx = make_optimizer()
  opt2a = with_lr(st.part2a_opt, 0.1)
  hopt = jax.vmap(lambda o: with_lr(o, 0.1))(st.heads_opt)
  x, y = gather(data, jnp.arange(4))
  mask = jnp.ones(4, bool)
  act, _ = setup.model.apply(st.part1, st.part1_stats,
                             x, train=True, mask=mask)
  server = (Portion(st.part2a, st.part2a_stats, opt2a),
            Portion(heads, st.heads_stats, hopt))
  step = jax.jit(lambda s, a, m: hydra.server_step(setup, tx, s, a, y, m, 2))
  out, g_a, _ = step(server, act, mask)
  for g in range(4):
    same = all(bool(jnp.array_equal(a[g], b[g])) for a, b in
               zip(jax.tree.leaves(out[1].params), jax.tree.leaves(heads)))
    assert same == (g != 2), g
  assert not all(bool(jnp.array_equal(a, b)) for a, b in
                 zip(jax.tree.leaves(out[0].params), jax.tree.leaves(st.part2a)))
  assert float(jnp.abs(g_a).sum()) > 0
  # an empty batch changes nothing
  out0, _, lsum = step(server, act, jnp.zeros(4, bool))
  chex.assert_trees_all_equal(out0, server)
  assert float(lsum) == 0


def test_hydra_with_one_head_is_sfl():
  """G = 1: part-2a + the single head is SFL's part-2, update for update."""
  data = make_fed_data([13, 7, 20, 5])
  key = jax.random.key(2)
  setup = make_setup(tiny_model(), data, clients_per_round=3,
                     options=HydraOptions(groups=1))
  h, hl = run_rounds(hydra, setup, data, key, 2)
  s, sl = run_rounds(sfl, make_setup(tiny_model(), data, clients_per_round=3),
                     data, key, 2)
  # both draw the model from the same key split
  chex.assert_trees_all_close(h.part1, s.part1, **TOL)
  chex.assert_trees_all_close(h.part2a + take(h.heads, 0), s.part2, **TOL)
  np.testing.assert_allclose(hl, sl, **TOL)


def test_heads_differ_from_sfl_when_groups_differ():
  """Guards the equivalence test: G heads are not just SFL."""
  data = make_fed_data([13, 7, 20, 5])
  key = jax.random.key(2)
  h, _ = run_rounds(hydra, make_setup(tiny_model(), data, options=hydra.METHOD.options()),
                    data, key, 1)
  s, _ = run_rounds(sfl, make_setup(tiny_model(), data), data, key, 1)
  diff = max(float(jnp.abs(a - b).max()) for a, b in
             zip(jax.tree.leaves(h.part2a + take(h.heads, 0)), jax.tree.leaves(s.part2)))
  assert diff > 1e-4


SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=400", "dataset.test_size=100", "model.width=4",
       "model.hidden=16", "exec.progress=false"]


@pytest.mark.parametrize("grouping", ["table", "algorithm2"])
def test_hydra_run_directory(tmp_path, grouping):
  out = tmp_path / "r"
  code = cli.main(["run", *SYN, f"run.dir={out}", "run.rounds=2", "run.seeds=2",
                   "partition.num_clients=8", "partition.name=dominant_label",
                   "partition.p=0.8", "method.name=hydra", "method.order=cyclic",
                   "method.groups=2", "method.superclasses=consecutive",
                   f"method.grouping={grouping}"])
  assert code == 0
  groups = json.loads((out / "groups.json").read_text())
  assert groups["num_groups"] == 2 and groups["label_group"] == [0, 0, 1, 1]
  part = json.loads((out / "partition.json").read_text())
  for seed, p in zip(groups["seeds"], part["seeds"]):
    rho, table = np.array(p["label_counts"]), np.array([0, 0, 1, 1])
    want = (ref_grouping(rho, table, 2) if grouping == "algorithm2"
            else ref_table_grouping(rho, table))
    assert seed["client_group"] == want.tolist()
    members = [c for g in seed["groups"] for c in g["clients"]]
    assert sorted(members) == list(range(8))
  recs = read_metrics(f"{out}/metrics.jsonl")
  assert len(recs) == 4
  for r in recs:
    assert np.isfinite(r["accuracy"]) and len(r["per_position_accuracy"]) == 4
    assert sum(r["head_batches"]) > 0 and len(r["head_batches"]) == 2


def test_the_authors_heads_and_cycle_in_a_run_directory(tmp_path):
  """Hydra as the authors' code runs it on 8 clients over 4 labels: a head a
  client (``groups.json``: 8 groups, no label table) and one random order
  of the clients every round (``method.cycle = "client"``), whose
  ``label_order`` lists each label at its first client's place
  (``per_position_accuracy`` read through it)."""
  out = tmp_path / "r"
  code = cli.main(["run", *SYN, f"run.dir={out}", "run.rounds=2", "run.seeds=2",
                   "partition.num_clients=8", "partition.name=dominant_label",
                   "partition.p=0.8", "method.name=hydra", "method.order=cyclic",
                   "method.grouping=client", "method.cycle=client"])
  assert code == 0
  groups = json.loads((out / "groups.json").read_text())
  assert groups["num_groups"] == 8 and groups["label_group"] is None
  assert all(s["client_group"] == ref_client_grouping(8).tolist() for s in groups["seeds"])
  part = json.loads((out / "partition.json").read_text())
  dominant = {p["seed"]: np.argmax(np.array(p["label_counts"]), axis=1) for p in part["seeds"]}
  recs = read_metrics(f"{out}/metrics.jsonl")
  assert all(len(r["head_batches"]) == 8 and sum(r["head_batches"]) > 0 for r in recs)
  for seed in (0, 1):
    mine = [r for r in recs if r["seed"] == seed]
    assert mine[0]["clients"] == mine[1]["clients"] and sorted(mine[0]["clients"]) == list(range(8))
    labels = [int(dominant[seed][c]) for c in mine[0]["clients"]]
    want = list(dict.fromkeys(labels)) + [c for c in range(4) if c not in labels]
    for r in mine:
      assert r["label_order"] == want
      assert r["per_position_accuracy"] == [r["per_label_accuracy"][c] for c in want]


@pytest.mark.parametrize("args,says", [
    (["method.head_cut=1"], "method.head_cut=1"),
    (["method.grouping=client", "method.groups=2", "method.superclasses=consecutive",
      "partition.num_clients=8"],
     "method.grouping='client' with method.groups=2, 8 clients and 4 labels; allowed:")],
    ids=["head_cut", "client-groups"])
def test_bad_head_cut_is_a_config_error(tmp_path, capsys, args, says):
  code = cli.main(["run", *SYN, f"run.dir={tmp_path / 'r'}", "method.name=hydra", *args])
  assert code == 2
  assert says in capsys.readouterr().err
  assert not (tmp_path / "r").exists()


# --------------------------------------------- L2 on part-2 only (Fig. 19)
def test_part2_scope_decays_the_server_and_not_the_clients():
  """``weight_decay_scope = "part2"``: a client step equals the undecayed
  optimiser's step, a server step the decayed one's, momentum included."""
  data_ = make_fed_data([13, 7])
  setup = make_setup(tiny_model(), data_, momentum=0.9, weight_decay=0.1,
                     weight_decay_scope="part2")
  plain = make_optimizer(0.9, 0.0)
  decayed = make_optimizer(0.9, 0.1)
  assert setup.tx is not setup.client_tx
  params, _ = setup.model.init(jax.random.key(0))
  grads = [jax.tree.map(lambda a, i=i: jnp.sin(a * (i + 2.0)), params) for i in range(3)]

  def steps(tx, init_tx):
    p = Portion(params, None, with_lr(init_tx.init(params), 0.1))
    for g in grads:
      p = p.step(tx, g, None, jnp.bool_(True))
    return p.params

  # the client optimiser steps a state the decayed chain built (fresh_stack)
  chex.assert_trees_all_close(steps(setup.client_tx, setup.tx), steps(plain, plain), **TOL)
  chex.assert_trees_all_close(steps(setup.tx, setup.tx), steps(decayed, decayed), **TOL)
  diff = max(float(jnp.abs(a - b).max()) for a, b in
             zip(jax.tree.leaves(steps(plain, plain)), jax.tree.leaves(steps(decayed, decayed)),
                 strict=True))
  assert diff > 1e-4  # the decay shows
  all_ = make_setup(tiny_model(), data_)  # "all": the clients step with tx itself
  assert all_.client_tx is all_.tx


@pytest.mark.parametrize("order", ["cyclic", "random"])
def test_sfl_part2_decay_equals_loop(order):
  """SFL with L2 on part-2 only, two rounds, against the loop whose clients
  step undecayed and whose server steps decayed; and not the same as
  decaying both (guard)."""
  data_ = make_fed_data([13, 7, 20, 5], dominant=np.arange(4, dtype=np.int32))
  key = jax.random.key(5)
  setup = make_setup(tiny_model(), data_, order=order, clients_per_round=3,
                     weight_decay=0.05, weight_decay_scope="part2")
  state, losses = run_rounds(sfl, setup, data_, key, 2)
  (p1, s1, p2, s2), ref_losses, _ = ref_sfl(setup, data_, key, 2)
  chex.assert_trees_all_close(state.part1, p1, **TOL)
  chex.assert_trees_all_close(state.part1_stats, s1, **TOL)
  chex.assert_trees_all_close(state.part2, p2, **TOL)
  chex.assert_trees_all_close(state.part2_stats, s2, **TOL)
  np.testing.assert_allclose(losses, ref_losses, **TOL)
  both, _ = run_rounds(sfl, setup.replace(weight_decay_scope="all"), data_, key, 2)
  diff = max(float(jnp.abs(a - b).max()) for a, b in
             zip(jax.tree.leaves(state.part1), jax.tree.leaves(both.part1), strict=True))
  assert diff > 10 * TOL["atol"]


def test_part2_scope_needs_a_split_method(tmp_path, capsys):
  code = cli.main(["run", *SYN, f"run.dir={tmp_path / 'r'}", "method.name=fedavg",
                   "optim.weight_decay=0.001", "optim.weight_decay_scope=part2"])
  assert code == 2
  assert "optim.weight_decay_scope='part2'" in capsys.readouterr().err
  assert not (tmp_path / "r").exists()


# ------------------------------------------ CIFAR-100 superclasses (Table 9)
def test_cifar100_superclasses_are_the_release_coarse_labels(tmp_path, monkeypatch):
  """``superclasses = "cifar100"``, G = 20: every fine label maps to its
  superclass in the CIFAR-100 release's list (written out below by name,
  apart from jsfl's tables); the reader's ``coarse_labels`` path agrees
  (the fixture's coarse labels come from the reader's table, so that part
  checks the plumbing, the list checks the table); 5 fine labels each."""
  from test_dataset_files import write_cifar
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  monkeypatch.setenv("JSFL_SYSTEM_DATA", str(tmp_path / "system"))
  write_cifar(tmp_path / "c100", "cifar100", n_train=20)
  path = str(tmp_path / "c100" / "cifar-100-python.tar.gz")
  fine = data.load_dataset("cifar100", path=path)
  coarse = data.load_dataset("cifar100", path=path, label_mode="coarse")
  y_fine = np.concatenate([fine.y_train, fine.y_test])
  y_coarse = np.concatenate([coarse.y_train, coarse.y_test])
  assert set(y_fine.tolist()) == set(range(100))
  table = hydra.superclass_table("cifar100", 100, 20)
  np.testing.assert_array_equal(table[y_fine], y_coarse)
  np.testing.assert_array_equal(np.bincount(table, minlength=20), [5] * 20)
  np.testing.assert_array_equal(table, CIFAR100_COARSE)  # the reader's own table
  names = dict(zip(hydra.CIFAR100_FINE, table, strict=True))
  sup = [n for n, _ in hydra.CIFAR100_SUPERCLASSES]
  assert sup[names["apple"]] == "fruit_and_vegetables" and sup[names["whale"]] == \
      "aquatic_mammals" and sup[names["tractor"]] == "vehicles_2"
  release = {  # superclass: its five classes, as the dataset's page lists them
      "aquatic_mammals": "beaver dolphin otter seal whale",
      "fish": "aquarium_fish flatfish ray shark trout",
      "flowers": "orchid poppy rose sunflower tulip",
      "food_containers": "bottle bowl can cup plate",
      "fruit_and_vegetables": "apple mushroom orange pear sweet_pepper",
      "household_electrical_devices": "clock keyboard lamp telephone television",
      "household_furniture": "bed chair couch table wardrobe",
      "insects": "bee beetle butterfly caterpillar cockroach",
      "large_carnivores": "bear leopard lion tiger wolf",
      "large_man-made_outdoor_things": "bridge castle house road skyscraper",
      "large_natural_outdoor_scenes": "cloud forest mountain plain sea",
      "large_omnivores_and_herbivores": "camel cattle chimpanzee elephant kangaroo",
      "medium_mammals": "fox porcupine possum raccoon skunk",
      "non-insect_invertebrates": "crab lobster snail spider worm",
      "people": "baby boy girl man woman",
      "reptiles": "crocodile dinosaur lizard snake turtle",
      "small_mammals": "hamster mouse rabbit shrew squirrel",
      "trees": "maple_tree oak_tree palm_tree pine_tree willow_tree",
      "vehicles_1": "bicycle bus motorcycle pickup_truck train",
      "vehicles_2": "lawn_mower rocket streetcar tank tractor"}
  # the release numbers both label sets in alphabetical order of their names
  assert list(hydra.CIFAR100_FINE) == sorted(w for v in release.values() for w in v.split())
  assert sup == sorted(release)
  want = [sorted(release).index(next(c for c, v in release.items() if f in v.split()))
          for f in hydra.CIFAR100_FINE]
  np.testing.assert_array_equal(table, want)
  with pytest.raises(ValueError, match="allowed: groups in \\[20\\] with L = 100"):
    hydra.superclass_table("cifar100", 100, 5)
  with pytest.raises(ValueError, match="L=10"):
    hydra.superclass_table("cifar100", 10, 5)


# ------------------------------- confusion after every step (Fig. 11)
def ref_step_models(setup, data_, key, ref_server, model_of):
  """A plain loop that replays one round's server visits (round 0, the
  authors' queue) and, whenever the served dominant label changes, and at
  the round's end, takes the model as it stands: the clients' part-1 copies
  averaged sample-weighted, the server's part as ``model_of(server)``."""
  state_models, labels, prev = [], [], [None]
  dominant = np.asarray(data_.dominant)

  def before(r, client, p1, s1, weights):
    lab = int(dominant[client])
    if prev[0] is not None and lab != prev[0]:
      part1, stats1 = ref_avg(p1, weights), ref_avg(s1, weights)
      state_models.append(model_of(part1, stats1, ref_server))
      labels.append(prev[0])
    prev[0] = lab

  return before, state_models, labels, prev


def _watch_case(method):
  """Six clients over four dominant labels (labels 0 and 1 held twice), the
  authors' cyclic queue in turns of two batches: steps of one or two turns."""
  data_ = make_fed_data([13, 7, 20, 5, 9, 11], dominant=np.arange(6, dtype=np.int32) % 4)
  kw = {"options": HydraOptions(groups=2, superclasses="consecutive")} if method is hydra \
      else {}
  return data_, make_setup(tiny_model(), data_, order="cyclic", order_rule="authors",
                           batches_per_turn=2, clients_per_round=6, **kw)


@pytest.mark.parametrize("method", [sfl, hydra], ids=["sfl", "hydra"])
def test_step_confusion_equals_loop(method):
  """The per-step models and confusion matrices of a watched round equal a
  loop that replays the round and evaluates after each step; the last step's
  matrix is the end-of-round model's; the watched round leaves the state the
  plain round leaves."""
  data_, setup = _watch_case(method)
  key = jax.random.key(3)
  st = method.init(setup, key)
  rounds = method.build(setup)
  test = jax.tree.map(jnp.asarray, chunk_test_set(np.asarray(data_.x[:40]),
                                                  np.asarray(data_.y[:40]), 16))

  def conf(params, stats):
    return confusion(setup.model, params, stats, test, data_.mean, data_.std, 4)

  rkey = jax.random.fold_in(key, 0)
  new, m, sm = jax.jit(lambda s, k: rounds.watched_round(
      s, data_, k, method.output_model, 30))(st, rkey)
  plain, pm = jax.jit(lambda s, k: rounds.round(s, data_, k))(st, rkey)
  chex.assert_trees_all_close(new, plain, **TOL)
  np.testing.assert_allclose(m["loss"], pm["loss"], **TOL)

  if method is hydra:
    G = hydra.num_groups(setup)
    table = hydra.superclass_table("consecutive", 4, G)
    server = HydraRefServer(setup, st, ref_table_grouping(np.asarray(data_.counts), table))

    def model_of(part1, stats1, srv):
      head = ref_avg(srv.heads, np.ones(G))
      hstats = ref_avg(srv.hstats, np.ones(G))
      return part1 + srv.p2a + head, stats1 + srv.s2a + hstats
  else:
    server = RefServer(setup, st.part2, st.part2_stats)

    def model_of(part1, stats1, srv):
      return part1 + srv.part2, stats1 + srv.stats2
  before, models, labels, prev = ref_step_models(setup, data_, key, server, model_of)
  (p1, s1), _, _ = ref_split_events(setup, data_, key, 1, st.part1, st.part1_stats, server,
                                    st.label_rank, before_visit=before)
  models.append(model_of(p1, s1, server))  # the last step ends with the round
  labels.append(prev[0])

  count = int(sm.num_steps)
  assert count == len(models) >= 4  # several steps (6 clients, 4 labels)
  np.testing.assert_array_equal(np.asarray(sm.labels[:count]), labels)
  assert np.all(np.asarray(sm.labels[count:]) == -1)
  for s_, (params, stats) in enumerate(models):
    got = jax.tree.map(lambda a, s_=s_: a[s_], sm.models)
    chex.assert_trees_all_close(got, (params, stats), **TOL)
    np.testing.assert_array_equal(conf(*got), conf(params, stats))
  # the last step's matrix is the end-of-round evaluation's
  last = jax.tree.map(lambda a: a[count - 1], sm.models)
  np.testing.assert_array_equal(conf(*last), conf(*method.output_model(setup, plain)))
  # the evaluation's accuracy agrees with the matrix
  from jsfl.train.evaluate import evaluate
  params, stats = method.output_model(setup, plain)
  e = evaluate(setup.model, params, stats, test, data_.mean, data_.std, 4)
  cm = np.asarray(conf(params, stats))
  np.testing.assert_allclose(float(e["accuracy"]), 100 * np.trace(cm) / cm.sum(), rtol=1e-6)


def test_step_confusion_run_directory_and_plot(tmp_path):
  out = tmp_path / "r"
  code = cli.main(["run", *SYN, f"run.dir={out}", "run.rounds=2", "run.seeds=2",
                   "partition.num_clients=4", "partition.name=dominant_label",
                   "partition.p=0.8", "method.name=hydra", "method.order=cyclic",
                   "method.batches_per_turn=2", "run.step_confusion=true",
                   "run.step_confusion_rounds=[1, 2]"])
  assert code == 0
  with np.load(out / "confusion_steps.npz") as d:
    assert d["round"].tolist() == [1, 2] and d["seed"].tolist() == [0, 1]
    conf_, steps = d["confusion"], d["steps"]
    assert conf_.shape == (2, 2, 4, 4, 4) and np.all(steps == 4)  # S = L, 4 clients
    assert np.all(conf_.sum((-2, -1)) == 100)  # every test sample, every step
  recs = read_metrics(f"{out}/metrics.jsonl")
  last = [r for r in recs if r["round"] == 2]
  assert [r["seed"] for r in last] == [0, 1]
  for i, r in enumerate(last):  # the last step's matrix is the round's evaluation
    cm = conf_[1, i, 3]
    np.testing.assert_allclose(r["accuracy"], 100 * np.trace(cm) / cm.sum(), atol=1e-4)
  pytest.importorskip("matplotlib")
  pngs, _ = plots.plot_runs([str(out)], str(tmp_path / "plots"))
  assert str(tmp_path / "plots" / "confusion_steps_hydra.png") in pngs


def test_step_confusion_of_a_sequential_run(tmp_path):
  """FedSeq in a random order (SFedKD Fig. 1): one step per client of the
  round; the last client's matrix is the round's evaluation; the plot draws
  it."""
  out = tmp_path / "r"
  code = cli.main(["run", *SYN, f"run.dir={out}", "run.rounds=2", "run.seeds=2",
                   "partition.num_clients=4", "method.name=fedseq", "method.order=random",
                   "run.step_confusion=true"])
  assert code == 0
  with np.load(out / "confusion_steps.npz") as d:
    assert d["round"].tolist() == [2]
    conf_, steps, labels = d["confusion"], d["steps"], d["labels"]
  assert conf_.shape == (1, 2, 4, 4, 4) and np.all(steps == 4)  # S = the 4 clients
  assert np.all(conf_.sum((-2, -1)) == 100) and np.all(labels >= 0)
  last = [r for r in read_metrics(f"{out}/metrics.jsonl") if r["round"] == 2]
  assert [r["seed"] for r in last] == [0, 1]
  for i, r in enumerate(last):
    cm = conf_[0, i, 3]
    np.testing.assert_allclose(r["accuracy"], 100 * np.trace(cm) / cm.sum(), atol=1e-4)
  # experiments/sequential/forgetting.py reads it back: per seed BW over the
  # 4 steps of the class accuracies, the last step's accuracy the round's
  forgetting = load_script("experiments/sequential/forgetting.py")
  assert forgetting.main([str(tmp_path), "--out", str(tmp_path / "f.json")]) == 0
  got = json.load(open(tmp_path / "f.json"))["r"]
  assert forgetting.main([str(tmp_path / "none")]) == 2
  for i, r in enumerate(last):
    acc = 100.0 * np.diagonal(conf_[0, i], axis1=-2, axis2=-1) / conf_[0, i].sum(-1)
    fig = got["per_seed"][str(r["seed"])]
    np.testing.assert_allclose(fig["forgetting"], np.mean(acc[:-1].max(0) - acc[-1]),
                               atol=1e-9)
    np.testing.assert_allclose(fig["final_accuracy"], r["accuracy"], atol=1e-4)
    # the classwise plot's title: the same measure per seed, and its median
    with np.load(out / "confusion_steps.npz") as d:
      np.testing.assert_allclose(
          backward_transfer(step_class_accuracy(d["confusion"], d["steps"], i)),
          fig["forgetting"], atol=1e-9)
  pytest.importorskip("matplotlib")
  pngs, _ = plots.plot_runs([str(out)], str(tmp_path / "plots"))
  assert any("confusion_steps_" in p for p in pngs)
  assert any("classwise_steps_" in p for p in pngs)


@pytest.mark.parametrize("method,order,why", [
    ("sfl", "random", "run.step_confusion=true with method.order='random'"),
    ("sfl_fedexp", "cyclic", "run.step_confusion=true with method.name='sfl_fedexp'"),
    ("splitfedv1", "cyclic", "run.step_confusion=true with method.name='splitfedv1'"),
    ("fedavg", "cyclic", "run.step_confusion=true with method.name='fedavg'")])
def test_step_confusion_needs_a_watchable_round(tmp_path, capsys, method, order, why):
  """A sequential method, or a cyclic order on a split method whose
  sequential server serves the label cycle and whose participants' part-1
  copies are aggregated; refused before anything is written otherwise."""
  code = cli.main(["run", *SYN, f"run.dir={tmp_path / 'r'}", f"method.name={method}",
                   f"method.order={order}", "run.step_confusion=true"])
  assert code == 2
  assert why in capsys.readouterr().err
  assert not (tmp_path / "r").exists()
