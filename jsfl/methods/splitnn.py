"""SplitNN: Vepakomma et al., "Split learning for health: Distributed deep
learning without sharing raw patient data", 2018 (vanilla split learning, the
sequential baseline of Hydra, AAAI 2026, Appendix B).  docs/methods-splitfed.md.

One model, part-1 at the clients and part-2 at the server.  The round's
participants are visited one after another (an outer ``lax.scan`` over the
visiting order); a visited client runs ``local_epochs`` epochs of split
steps on its own batches (an inner ``lax.scan`` over its padded batch steps,
empty ones masked out), updating part-1 and part-2, then hands part-1 on to
the next client.  A split step is the split engine's batch step with a
single participant (``jsfl.engine.split.segment_step``) and SFL's server rule.

Visiting order (``setup.order``, the server processing orders of
docs/methods-splitfed.md#processing-order at
the granularity of whole clients):

* ``random``: a fresh random permutation of the participants every round
  (drawn like one batch step of SFL's random order);
* ``fixed``: client-id order;
* ``cyclic``: clients grouped by dominant label in the run's label cycle;
* ``cyclic_reverse``: like ``cyclic``, reversed every other round.

Optimiser state (docs/setting.md#optimisation, decided here): the part-1 state is rebuilt at
every client visit (each client's optimiser lives for its visit, i.e. one
round, as in every other method; momentum is not handed on with the
weights); the server's part-2 state persists across visits and rounds, as
SFL's does, since it is one server optimising one part-2.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp
from jax import lax

from jsfl.core.data import gather, training_data
from jsfl.core.method import Method, label_rank_of, split_communication, staged_model
from jsfl.core.plan import plan_round, round_metrics
from jsfl.core.portion import fresh_stack
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast, take_rows
from jsfl.engine import sfl_family, split
from jsfl.engine.orders import cycle_places, processing_orders

# One part-1, one part-2 and the server optimiser state: exactly SFL's state.
State = sfl_family.State
init = sfl_family.init


def visiting_order(setup: Setup, order_key, clients, dominant, label_rank,
                   round_idx):
  """``(n,)`` positions into ``clients`` in the order they are visited."""
  base = "cyclic" if setup.order == "cyclic_reverse" else setup.order
  order = processing_orders(base, order_key, 1, clients, dominant,
                                   label_rank)[0]
  if setup.order == "cyclic_reverse":
    order = jnp.where(round_idx % 2 == 1, order[::-1], order)
  return order


def visit_round(setup: Setup, rule: split.ServerRule, state: State, data, key):
  """One SplitNN round: the split engine's batch step, one client at a time.

  Args:
    setup: static run description (``setup.order`` picks the visiting order).
    rule: SFL's server rule (:func:`jsfl.engine.sfl_family.serve`).
    state: see :class:`State`.
    data: the round's ``RoundData``.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``; metrics: ``loss``, ``samples``, ``clients``
    (participants in visiting order).
  """
  data = training_data(setup, data, key)
  plan = plan_round(setup, data, key, state.round)
  order = visiting_order(setup, plan.order_key, plan.clients,
                         cycle_places(setup, data.dominant), state.label_rank, state.round)
  # (n, T, 1, B): each client's batch steps, clients in visiting order, as a
  # participant axis of one.
  idx = jnp.swapaxes(plan.idx, 0, 1)[order][:, :, None]
  mask = jnp.swapaxes(plan.mask, 0, 1)[order][:, :, None]
  only = jnp.zeros((1,), jnp.int32)

  def step(carry, batch):
    i, m = batch
    x, y = gather(data, i)
    one = split.Step(x, y, i, m, only[0])
    client, srv, lsum = split.segment_step(setup, plan.tx, *carry, one, only,
                                           rule(state, plan, one))
    return (client, srv), lsum

  def visit(carry, client_batches):
    part1, stats1, srv = carry  # part-1 relayed from the previous client
    client = fresh_stack(plan, broadcast(part1, 1),
                               broadcast(stats1, 1))
    (client, srv), lsums = lax.scan(step, (client, srv), client_batches)
    return (*take_rows((client.params, client.stats), 0), srv), jnp.sum(lsums)

  (p1, s1, srv), lsums = lax.scan(
      visit, (state.part1, state.part1_stats, sfl_family.server(state, plan)), (idx, mask))
  new = dataclasses.replace(state, part1=p1, part1_stats=s1, part2=srv.params,
                            part2_stats=srv.stats, server_opt=srv.opt, round=state.round + 1)
  return new, round_metrics(plan, lsums, plan.clients[order])


@dataclasses.dataclass(frozen=True)
class Rounds:
  """SplitNN for one run: SFL's server rule, built once."""

  setup: Setup
  rule: split.ServerRule

  def init(self, key):
    return init(self.setup, key)

  def round(self, state, data, key):
    return visit_round(self.setup, self.rule, state, data, key)


def build(setup: Setup) -> Rounds:
  return Rounds(setup, sfl_family.serve(setup))


def round(setup: Setup, state: State, data, key):
  """One SplitNN round (:func:`visit_round`)."""
  return build(setup).round(state, data, key)


output_model = staged_model


communication = split_communication
"""Per round: part-1 handed to and from each participant (``n`` copies down
and up), plus per processed sample the activation and label up and its
gradient down (``split_communication``)."""


METHOD = Method(build, output_model, communication, label_rank=label_rank_of)
