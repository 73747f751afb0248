"""MergeSFL: Liao et al., "MergeSFL: Split Federated Learning with Feature
Merging and Batch Size Regulation", ICDE 2024, simplified as in Hydra's
comparison (AAAI 2026, Sec. 5 / Table 3).  docs/methods-splitfed.md.

Every participant holds a copy of part-1 (trained in parallel); ONE server
part-2.  The split round (``jsfl.engine.split``) with the merged server rule;
per batch step:

1. all clients' part-1 forward in one program, differentiated with a single
   ``jax.vjp``;
2. the server concatenates the activations (and labels and masks) of all
   clients into one batch and takes ONE part-2 step on the masked mean
   cross-entropy over the concatenation (BatchNorm sees the merged batch);
3. the cut-layer gradient is sliced back to the clients, which update
   their part-1 (clients without a batch are left unchanged).

At round end the part-1 copies are averaged sample-weighted (uniformly under
``method.aggregation = "uniform"``, as ``run_mergesfl.py`` does).  Two options
follow the Hydra authors' ``run_mergesfl.py`` by default: ``grad_scale =
"client_mean"``, a client gets the gradient of its own batch's mean loss
(the merged gradient times the step's valid samples over the client's own,
n with full batches; ``"merged"``: its share of the merged mean
loss, what a server calling ``loss.backward()`` on the merged batch sends);
``part1_copies = 10``, each client's batches train 10 part-1 copies round
robin and only the last copy is averaged (``1``: one part-1 per client, the
paper's MergeSFL).  The server
optimiser state persists across rounds like SFL's, the clients' lives one
round (docs/setting.md#optimisation).

Simplifications (Hydra's comparison, docs/methods-splitfed.md): no batch-size regulation (every
client uses ``batch_size``) and no feature-merging client selection; the
processing order plays no role.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jsfl.core.method import Method, label_rank_of, split_communication, staged_model
from jsfl.core.portion import Portion
from jsfl.core.setup import Setup
from jsfl.engine import sfl_family, split
from jsfl.options import option, option_set

# SFL's state (label_rank unused: MergeSFL has no processing order) and
# init, so a seed starts both methods from one model.
State = sfl_family.State
init = sfl_family.init


MERGE_GRADS = ("client_mean", "merged")


@option_set
class MergeSFLOptions:
  grad_scale: str = option("client_mean", "cut-layer gradient a client gets back: "
                           "client_mean = that of its own batch's mean loss (the merged "
                           "gradient times the step's samples over the client's own; the "
                           "authors' code scales by the nominal batch sizes, the same "
                           "with full batches, and fails on a short one), merged = its "
                           "share of the merged batch's mean loss", choices=MERGE_GRADS)
  part1_copies: int = option(10, "part-1 copies per client, used round robin over its "
                             "batches, only the last one averaged at round end (the "
                             "authors' code, whose default is 10: with fewer than 10 "
                             "batches a round that copy never trains); 1 = one part-1 "
                             "per client", range="[1, 1000]")


def serve(setup: Setup) -> split.ServerRule:
  """MergeSFL's server rule: one part-2 update on the merged batch."""
  per_client = setup.options.grad_scale == "client_mean"

  def rule(state, plan, step):
    def one(srv, act, y, mask, _):
      srv, g_a, lsum, _ = split.server_update(setup, plan.tx, srv, act, y, mask)
      return srv, g_a, lsum
    return split.MergedServer(one, per_client)
  return rule


def copies_of_part1(copies: int):
  """Every participant's ``copies`` part-1 copies (axis 1), all from the
  global part-1, each with a fresh optimiser state."""
  def client_init(state, plan):
    one = split.global_part1(state, plan)
    return jax.tree.map(lambda a: jnp.broadcast_to(a[:, None], (a.shape[0], copies)
                                                   + a.shape[1:]), one)
  return client_init


def nth_copy(copies: int, plan, step):
  """Per participant, the copy its batch at this batch step trains: its
  j-th batch of the round trains copy ``j mod copies``."""
  has = jnp.any(plan.mask, axis=2)  # (T, n)
  nth = jnp.cumsum(has, axis=0) - 1
  return nth[step.position] % copies


def select_copy(copies: int):
  def select(clients, plan, step):
    who = jnp.arange(plan.clients.shape[0])
    return jax.tree.map(lambda a: a[who, nth_copy(copies, plan, step)], clients)
  return select


def place_copy(copies: int):
  def place(clients, current, plan, step):
    who = jnp.arange(plan.clients.shape[0])
    k = nth_copy(copies, plan, step)
    return jax.tree.map(lambda a, v: a.at[who, k].set(v), clients, current)
  return place


def last_copy_averaged(clients: Portion, plan):
  """The round's part-1: the participants' last copy, averaged as SFL's."""
  last = jax.tree.map(lambda a: a[:, -1], clients)
  return split.averaged(last, plan)


def build(setup: Setup) -> split.SplitRounds:
  """MergeSFL for a run: SFL's server carry updated once per batch step on
  the merged batch, ``part1_copies`` part-1 copies per participant used
  round robin (the last one averaged); metrics ``loss``, ``samples`` and
  ``clients`` (participants, ascending)."""
  copies = setup.options.part1_copies
  hooks = {}
  if copies > 1:
    hooks = dict(client_init=copies_of_part1(copies), client_select=select_copy(copies),
                 client_place=place_copy(copies), client_final=last_copy_averaged)
  alg = split.SplitAlgorithm(server_init=sfl_family.server, server_rule=serve(setup),
                             schedule=split.batch_steps, **hooks)
  return sfl_family.rounds(setup, alg)


def round(setup: Setup, state: State, data, key):
  """One MergeSFL round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = staged_model


communication = split_communication
"""Per round: part-1 down and up per participant, plus per processed sample
the activation and label up and its gradient down, as SFL
(``split_communication``)."""


METHOD = Method(build, output_model, communication, label_rank=label_rank_of,
                options=MergeSFLOptions)
