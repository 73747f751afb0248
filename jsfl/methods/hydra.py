"""Hydra: SFL with a shared part-2a and G aggregated heads.

Paper: "Data Heterogeneity and Forgotten Labels in Split Federated Learning",
AAAI 2026 (Sec. 4, Algorithm 2, Appendix A); docs/methods-hydra.md.

The model is split in three: part-1 at the clients (as in SFL), part-2a at
the server, shared and updated sequentially in the round's processing order,
and G heads (part-2b) stored as one stacked pytree with a leading G axis.
Every client belongs to one group: by default (``grouping = "table"``) the
group of its dominant label in the label -> group table
(``group_by_table``); with ``grouping = "client"`` the authors' code's
assignment, by client id: client k trains head k (G = K heads,
``run_hydra.py``) or, with G < L, the head of row k of the table
(``test_hydra_heads.py``); with ``grouping = "algorithm2"`` the paper's
balanced assignment (``group_clients``, the corrected Algorithm 2).  The
first two agree on the authors' dominant-label split, where client k's
dominant label is k; off it (Dirichlet, sharding, IID) ``table`` shares a
head among clients of one dominant label and leaves others untrained.  In a
server step the client's batch goes through part-2a and the head of its
group, and only part-2a and that head are updated (the head is gathered
from the stack by index and scattered back; no Python indexing by client).
At round end part-1 copies are averaged (sample-weighted, or uniformly under
``method.aggregation = "uniform"`` as in the authors' code) and the G
heads are averaged uniformly and copied back into every head, so the output
model is part-1 + part-2a + the averaged head.

Departures and decisions:

* The grouping is computed from the per-client label counts that every seed's
  partition provides (``data.counts``) inside the round, as array ops; it
  is deterministic, so it is the same every round (the paper computes it once
  at the start).  ``artifacts`` writes it to ``groups.json``.
* With partial participation a group may have no client in a round; its head
  then still equals last round's average and is included in the uniform mean
  (docs/methods-hydra.md says "averaged uniformly").
* Each head keeps its own optimiser state across rounds, as part-2a does
  (docs/setting.md#optimisation: only client optimiser state is rebuilt per round); with the
  paper's plain SGD this has no effect.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from jsfl.core.loss import masked_cross_entropy
from jsfl.core.method import Method, label_rank_of, split_communication
from jsfl.core.optim import with_lr
from jsfl.core.plan import RoundPlan, plan_round
from jsfl.core.portion import Portion, kept
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast, put_rows, take_rows
from jsfl.engine import split
from jsfl.engine.orders import run_cycle
from jsfl.options import option, option_set

# Superclass tables: label -> group.  CIFAR-10 labels are airplane,
# automobile, bird, cat, deer, dog, frog, horse, ship, truck (Hydra App. H).
SUPERCLASSES: dict[tuple[str, int], tuple[int, ...]] = {
    # The authors' code (test_hydra_heads.py, ``teams_5`` / ``teams_2``), keyed
    # there by client id = dominant label: {airplane, bird}, {automobile,
    # truck}, {ship}, {cat, dog, horse}, {deer, frog}; animals / the rest.
    ("authors", 5): (0, 1, 0, 3, 4, 3, 4, 3, 2, 1),
    ("authors", 2): (1, 1, 0, 0, 0, 0, 0, 0, 1, 1),
    # The paper's tables (App. H): land vehicles, sky, water, domestic animals,
    # wild animals
    ("cifar10", 5): (1, 0, 1, 3, 4, 3, 4, 4, 2, 0),
    # animals, non-animals
    ("cifar10", 2): (1, 1, 0, 0, 0, 0, 0, 0, 1, 1),
    # jsfl's own semantic grouping of Fashion-MNIST (T-shirt, trouser,
    # pullover, dress, coat, sandal, shirt, sneaker, bag, ankle boot):
    # tops, trousers+dresses, coats, footwear, bags
    ("fashion_mnist", 5): (0, 1, 0, 1, 2, 3, 0, 3, 4, 3),
    # clothing, footwear+bags
    ("fashion_mnist", 2): (0, 0, 0, 0, 0, 1, 0, 1, 1, 1),
}

# CIFAR-100 as its release defines it (Krizhevsky 2009; the python version's
# ``meta``): the 100 fine labels in their index order (alphabetical) and the
# 20 superclasses, index order, each with its 5 fine labels.  The G = 20
# table maps every fine label to its superclass: the release's
# ``coarse_labels`` of each image (Hydra App. H.6, Table 9: "20 superclasses
# as in Ramasesh et al.").
CIFAR100_FINE = (
    "apple", "aquarium_fish", "baby", "bear", "beaver", "bed", "bee", "beetle",
    "bicycle", "bottle", "bowl", "boy", "bridge", "bus", "butterfly", "camel", "can",
    "castle", "caterpillar", "cattle", "chair", "chimpanzee", "clock", "cloud",
    "cockroach", "couch", "crab", "crocodile", "cup", "dinosaur", "dolphin", "elephant",
    "flatfish", "forest", "fox", "girl", "hamster", "house", "kangaroo", "keyboard",
    "lamp", "lawn_mower", "leopard", "lion", "lizard", "lobster", "man", "maple_tree",
    "motorcycle", "mountain", "mouse", "mushroom", "oak_tree", "orange", "orchid",
    "otter", "palm_tree", "pear", "pickup_truck", "pine_tree", "plain", "plate", "poppy",
    "porcupine", "possum", "rabbit", "raccoon", "ray", "road", "rocket", "rose", "sea",
    "seal", "shark", "shrew", "skunk", "skyscraper", "snail", "snake", "spider",
    "squirrel", "streetcar", "sunflower", "sweet_pepper", "table", "tank", "telephone",
    "television", "tiger", "tractor", "train", "trout", "tulip", "turtle", "wardrobe",
    "whale", "willow_tree", "wolf", "woman", "worm")
CIFAR100_SUPERCLASSES = (
    ("aquatic_mammals", ("beaver", "dolphin", "otter", "seal", "whale")),
    ("fish", ("aquarium_fish", "flatfish", "ray", "shark", "trout")),
    ("flowers", ("orchid", "poppy", "rose", "sunflower", "tulip")),
    ("food_containers", ("bottle", "bowl", "can", "cup", "plate")),
    ("fruit_and_vegetables", ("apple", "mushroom", "orange", "pear", "sweet_pepper")),
    ("household_electrical_devices", ("clock", "keyboard", "lamp", "telephone",
                                      "television")),
    ("household_furniture", ("bed", "chair", "couch", "table", "wardrobe")),
    ("insects", ("bee", "beetle", "butterfly", "caterpillar", "cockroach")),
    ("large_carnivores", ("bear", "leopard", "lion", "tiger", "wolf")),
    ("large_man-made_outdoor_things", ("bridge", "castle", "house", "road", "skyscraper")),
    ("large_natural_outdoor_scenes", ("cloud", "forest", "mountain", "plain", "sea")),
    ("large_omnivores_and_herbivores", ("camel", "cattle", "chimpanzee", "elephant",
                                        "kangaroo")),
    ("medium_mammals", ("fox", "porcupine", "possum", "raccoon", "skunk")),
    ("non-insect_invertebrates", ("crab", "lobster", "snail", "spider", "worm")),
    ("people", ("baby", "boy", "girl", "man", "woman")),
    ("reptiles", ("crocodile", "dinosaur", "lizard", "snake", "turtle")),
    ("small_mammals", ("hamster", "mouse", "rabbit", "shrew", "squirrel")),
    ("trees", ("maple_tree", "oak_tree", "palm_tree", "pine_tree", "willow_tree")),
    ("vehicles_1", ("bicycle", "bus", "motorcycle", "pickup_truck", "train")),
    ("vehicles_2", ("lawn_mower", "rocket", "streetcar", "tank", "tractor")),
)
SUPERCLASSES[("cifar100", 20)] = tuple(
    next(g for g, (_, fine) in enumerate(CIFAR100_SUPERCLASSES) if name in fine)
    for name in CIFAR100_FINE)


# ------------------------------------------------------------------- Hydra
SUPERCLASS_NAMES = ("authors", "consecutive", "cifar10", "fashion_mnist", "cifar100")


GROUPINGS = ("table", "algorithm2", "client")


# Ranges hold the sentinels (groups 0, head_cut -1) and a generous upper
# bound; Hydra's ``validate`` checks them against the model and the dataset.
@option_set
class HydraOptions:
  groups: int = option(0, "number of heads G (0 = number of labels L; under "
                       "grouping = client the number of clients K)",
                       range="[0, 1000000]")
  head_cut: int = option(-1, "first stage of the heads (-1 = the model's default or the "
                         "`head` preset)", range="[-1, 10000]")
  head: str = option("", "named head length of the model (MobileNetV1: 'small' = last "
                     "2 stages, 'large' = from stage 20)")
  superclasses: str = option("authors", "label -> group table when G < L: authors = the "
                             "authors' code's tables (G = 5 or 2, 10 labels), cifar10 = the "
                             "paper's CIFAR-10 tables, fashion_mnist, cifar100 = CIFAR-100's "
                             "20 superclasses (G = 20, 100 fine labels), consecutive (any "
                             "L, G)", choices=SUPERCLASS_NAMES)
  grouping: str = option("table", "which head a client trains: table = the head of its "
                         "dominant label's group, client = by client id as the "
                         "authors' code (client k: head k, G = K; with G < L row k of "
                         "the table, K = L), algorithm2 = the paper's balanced "
                         "assignment on the label counts",
                         choices=GROUPINGS)


def superclass_table(name: str, num_classes: int, groups: int) -> np.ndarray:
  """The ``(L,)`` label -> group table.

  Args:
    name: ``"consecutive"`` (label l -> floor(l * G / L), for any dataset),
      ``"authors"`` (the authors' code's tables for 10 labels, whatever the
      dataset) or a dataset with semantic tables (``"cifar10"``,
      ``"fashion_mnist"``: G in {2, 5}; ``"cifar100"``: G = 20 over the 100
      fine labels), or G = L for the identity.
    num_classes: L.
    groups: G, 1 <= G <= L.

  Returns:
    int32 array mapping every label to its group.
  """
  if not 1 <= groups <= num_classes:
    raise ValueError(f"groups={groups!r}; allowed: an int in [1, {num_classes}] "
                     "(at most one head per label)")
  if groups == num_classes:
    return np.arange(num_classes, dtype=np.int32)
  if groups == 1:
    return np.zeros(num_classes, np.int32)
  if name == "consecutive":
    return (np.arange(num_classes) * groups // num_classes).astype(np.int32)
  if ((name, groups) not in SUPERCLASSES
      or len(SUPERCLASSES[(name, groups)]) != num_classes):
    have = sorted(g for n, g in SUPERCLASSES if n == name)
    width = {len(t) for (n, _), t in SUPERCLASSES.items() if n == name}
    raise ValueError(f"superclasses={name!r} with groups={groups}, L={num_classes}; "
                     f"allowed: groups in {have} with L = {'/'.join(map(str, width))}, "
                     "or superclasses='consecutive'")
  return np.asarray(SUPERCLASSES[(name, groups)], np.int32)


def group_clients(rho, table, groups: int):
  """Hydra's grouping (docs/methods-hydra.md, the corrected Algorithm 2) as array ops.

  Repeatedly, for g = 0..G-1, the unassigned client with the most samples of
  group g's labels joins group g (ties: lowest client id), until every client
  is assigned; step t of the K steps serves group ``t mod G``.

  Args:
    rho: ``(K, L)`` label counts per client.
    table: ``(L,)`` label -> group.
    groups: G.

  Returns:
    ``(K,)`` int32 group of every client.
  """
  rho = jnp.asarray(rho)
  rho_g = rho.astype(jnp.int32) @ jax.nn.one_hot(table, groups, dtype=jnp.int32)
  K = rho.shape[0]

  def assign(t, carry):
    group, free = carry
    g = t % groups
    c = jnp.argmax(jnp.where(free, rho_g[:, g], -1))  # first max: lowest id
    return group.at[c].set(g), free.at[c].set(False)

  group, _ = lax.fori_loop(0, K, assign, (jnp.zeros(K, jnp.int32),
                                          jnp.ones(K, bool)))
  return group


def group_by_table(counts, table):
  """The authors' grouping: each client joins the group of its dominant label
  (its most frequent one, ties to the lowest label) in ``table``.

  Returns:
    ``(K,)`` int32 group of every client.
  """
  return jnp.asarray(table)[jnp.argmax(jnp.asarray(counts), axis=1)].astype(jnp.int32)


def num_groups(setup: Setup) -> int:
  opts = setup.options
  if opts.grouping == "client":
    return opts.groups or setup.num_clients
  return opts.groups or setup.num_classes


def own_heads(setup: Setup) -> bool:
  """Whether every client trains a head of its own (``grouping = "client"``
  with G = K): the authors' ``run_hydra.py``, no label -> group table."""
  return setup.options.grouping == "client" and num_groups(setup) == setup.num_clients


def head_cut(setup: Setup) -> int:
  """The first head stage from ``head_cut`` / ``head`` / the model default."""
  cut = setup.options.head_cut
  preset = setup.options.head
  presets = dict(setup.model.head_cuts)
  if cut != -1 and preset:
    raise ValueError(f"method.head_cut={cut} and method.head={preset!r}; "
                     "allowed: at most one of them")
  if preset:
    if preset not in presets:
      raise ValueError(f"method.head={preset!r} for model {setup.model.name!r}; "
                       f"allowed: {sorted(presets) or 'none (use head_cut)'}")
    return presets[preset]
  return setup.model.default_head_cut if cut == -1 else cut


def validate(setup: Setup) -> None:
  """Raises ValueError for an impossible head cut or grouping."""
  hc = head_cut(setup)
  setup.model.check_cut(hc, "method.head_cut", low=setup.cut + 1)
  if own_heads(setup):
    return
  superclass_table(setup.options.superclasses, setup.num_classes,
                   num_groups(setup))
  if setup.options.grouping == "client" and setup.num_clients != setup.num_classes:
    raise ValueError(
        f"method.grouping='client' with method.groups={num_groups(setup)}, "
        f"{setup.num_clients} clients and {setup.num_classes} labels; allowed: "
        f"groups = 0 or {setup.num_clients} (a head a client), or as many clients "
        "as labels (client k the head of label k's group)")


def groups_of(setup: Setup, counts):
  """Every client's group from the ``(K, L)`` label counts, by the ``grouping``
  option."""
  opts = setup.options
  K = jnp.shape(counts)[0]
  if own_heads(setup):
    return jnp.arange(K, dtype=jnp.int32)
  table = superclass_table(opts.superclasses, setup.num_classes, num_groups(setup))
  if opts.grouping == "client":  # K = L: the table's row of the client's id
    return jnp.asarray(table)[jnp.arange(K)]
  if opts.grouping == "table":
    return group_by_table(counts, table)
  return group_clients(counts, jnp.asarray(table), num_groups(setup))


@struct.dataclass
class State:
  part1: tuple
  part1_stats: tuple
  part2a: tuple
  part2a_stats: tuple
  part2a_opt: object
  heads: tuple          # every leaf has a leading G axis
  heads_stats: tuple
  heads_opt: object
  label_rank: jax.Array
  round: jax.Array


def init(setup: Setup, key) -> State:
  validate(setup)
  k_model, k_rank = jax.random.split(key)
  params, stats = setup.model.init(k_model)
  c, h, G = setup.cut, head_cut(setup), num_groups(setup)
  tx = setup.tx
  # All heads start from the same weights, as the averaged head they become.
  heads = broadcast(params[h:], G)
  return State(params[:c], stats[:c], params[c:h], stats[c:h], tx.init(params[c:h]),
               heads, broadcast(stats[h:], G), jax.vmap(tx.init)(heads),
               run_cycle(setup, k_rank),
               jnp.zeros((), jnp.int32))


def server_step(setup: Setup, tx, server, act, y, mask, g):
  """One sequential server update: part-2a, then head ``g``.

  Args:
    server: ``(part2a, heads)``: :class:`~jsfl.engine.split.Portion` s, the
      heads stacked on a leading G axis.

  Only part-2a and head ``g`` (parameters, BN statistics, optimiser state)
  change; an empty batch changes nothing.

  Returns:
    ``(server, gradient w.r.t. act, loss sum)``.
  """
  part2a, heads = server
  hc = head_cut(setup)
  head = take_rows(heads, g)

  def loss_fn(p2a, ph, a):
    z, ns2a = setup.model.apply(p2a, part2a.stats, a, start=setup.cut, train=True,
                                mask=mask)
    logits, nsh = setup.model.apply(ph, head.stats, z, start=hc, train=True, mask=mask)
    return masked_cross_entropy(logits, y, mask), (ns2a, nsh)

  (loss, (ns2a, nsh)), (g2a, gh, g_a) = jax.value_and_grad(
      loss_fn, argnums=(0, 1, 2), has_aux=True)(part2a.params, head.params, act)
  active = jnp.any(mask)
  part2a = part2a.step(tx, g2a, ns2a, active)
  head = head.step(tx, gh, nsh, active)
  return (part2a, put_rows(heads, g, head)), g_a, loss * jnp.sum(mask)


def plan(setup: Setup, state: State, data, key) -> RoundPlan:
  """SFL's round plan with every participant's head as its context."""
  p = plan_round(setup, data, key, state.round)
  return p._replace(context=groups_of(setup, data.counts)[p.clients])


def server(state: State, plan: RoundPlan):
  """part-2a with its persisting optimiser state and the stacked heads."""
  return (kept(state.part2a_opt, plan.lr, state.part2a, state.part2a_stats),
          Portion(state.heads, state.heads_stats,
                  jax.vmap(lambda o: with_lr(o, plan.lr))(state.heads_opt)))


def serve(setup: Setup) -> split.ServerRule:
  """Hydra's server rule: part-2a and the participant's head, participant
  after participant."""
  def rule(state, plan: RoundPlan, step):
    return split.SequentialServer(
        lambda srv, act, y, mask, k: server_step(setup, plan.tx, srv, act, y, mask,
                                                 plan.context[k]),
        setup.server_unroll)
  return rule


def finish(setup: Setup, state: State, out: split.SplitRound):
  """The next state (every head set to the heads' mean) and the metrics,
  with ``head_batches`` ``(G,)``: client batches each head was trained on."""
  part2a, heads = out.server
  mean = lambda t: jax.tree.map(lambda a: jnp.broadcast_to(a.mean(0), a.shape), t)
  has = jnp.any(out.plan.mask, axis=2)  # (T, n)
  head_batches = jnp.zeros(num_groups(setup), jnp.int32).at[out.plan.context].add(
      has.sum(0).astype(jnp.int32))
  new = dataclasses.replace(state, part1=out.part1, part1_stats=out.part1_stats,
                            part2a=part2a.params, part2a_stats=part2a.stats,
                            part2a_opt=part2a.opt, heads=mean(heads.params),
                            heads_stats=mean(heads.stats), heads_opt=heads.opt,
                            round=state.round + 1)
  metrics = split.metrics(out)
  metrics["head_batches"] = head_batches
  return new, metrics


def build(setup: Setup) -> split.SplitRounds:
  """Hydra for a run: the split round with Hydra's planner, server carry
  and rule in the run's label-cycle schedule.

  ``setup.order`` is the processing order of part-2a; the method options
  ``groups``, ``head_cut`` / ``head``, ``superclasses`` and ``grouping``
  place the heads.  A round's metrics: ``loss``, ``samples``, ``clients``
  (the serving order of the round's first segment) and ``head_batches``."""
  alg = split.SplitAlgorithm(server_init=server, server_rule=serve(setup),
                             schedule=split.label_cycle, plan=plan)
  return split.SplitRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One Hydra round (:func:`build`)."""
  return build(setup).round(state, data, key)


def output_model(setup: Setup, state: State):
  """part-1 + part-2a + the averaged head (every head holds it)."""
  return (state.part1 + state.part2a + take_rows(state.heads, 0),
          state.part1_stats + state.part2a_stats + take_rows(state.heads_stats, 0))


def artifacts(setup: Setup, partitions) -> dict:
  """``groups.json``: per seed, client -> group and each group's labels
  (none where every client has a head of its own: ``label_group`` null)."""
  table = (None if own_heads(setup) else
           superclass_table(setup.options.superclasses, setup.num_classes,
                            num_groups(setup)))
  seeds = []
  for p in partitions:
    group = np.asarray(groups_of(setup, np.asarray(p["label_counts"])))
    seeds.append({
        "seed": p["seed"],
        "client_group": group,
        "groups": [{"group": g,
                    "labels": [] if table is None else np.flatnonzero(table == g),
                    "clients": np.flatnonzero(group == g)}
                   for g in range(num_groups(setup))]})
  return {"groups.json": {"num_groups": num_groups(setup),
                          "head_cut": head_cut(setup),
                          "superclasses": setup.options.superclasses,
                          "grouping": setup.options.grouping,
                          "label_group": table, "seeds": seeds}}


communication = split_communication


METHOD = Method(build, output_model, communication, validate=validate,
                artifacts=artifacts, label_rank=label_rank_of,
                options=HydraOptions)
