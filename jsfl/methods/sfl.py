"""SFL = SplitFedV2: Thapa et al., "SplitFed: When Federated Learning Meets
Split Learning", AAAI 2022; the sequential-server form studied by Hydra
("Data Heterogeneity and Forgotten Labels in Split Federated Learning",
AAAI 2026, Sec. 2 and Algorithm 1).  SPEC 2 and 1.2.

Each participating client holds a copy of part-1; ONE server part-2 is updated
sequentially.  Per batch step:

1. all clients' part-1 forward in one program (``map_clients``, vmap by
   default), differentiated with a single ``jax.vjp``;
2. the server part-2 as a ``lax.scan`` over this step's processing order
   (random / cyclic / cyclic_reverse / fixed), one SGD step per client batch,
   returning the cut-layer gradient of each;
3. all clients' part-1 backward through the stored vjp and one SGD step each.

At round end the part-1 copies (and their BatchNorm statistics) are averaged
sample-weighted.  Clients without a batch at a step are masked out of the
scan (the server skips them) and their part-1 is left unchanged; partial
participation samples ``clients_per_round`` of ``K`` clients per round.

Departure from the PyTorch reference: none in the math.  The server optimiser
state (momentum) persists across rounds, the clients' is rebuilt every round
(SPEC 1.3).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jsfl.engine import batching, common
from jsfl.methods.base import (
  Setup,
  fresh_opt_states,
  map_clients,
  plan_round,
  round_metrics,
  split_communication,
)


@struct.dataclass
class State:
  part1: tuple          # global client portion (params)
  part1_stats: tuple
  part2: tuple          # the server portion
  part2_stats: tuple
  server_opt: object
  label_rank: jax.Array  # the run's label cycle (cyclic orders)
  round: jax.Array


def init(setup: Setup, key) -> State:
  k_model, k_rank = jax.random.split(key)
  params, stats = setup.model.init(k_model)
  c = setup.cut
  tx = common.make_optimizer(setup.momentum, setup.weight_decay)
  return State(params[:c], stats[:c], params[c:], stats[c:], tx.init(params[c:]),
               common.label_rank(k_rank, setup.num_classes),
               jnp.zeros((), jnp.int32))


def server_grads(setup: Setup, part2, stats2, act, y, mask):
  """Server portion's loss on one client batch and its two gradients.

  Returns:
    ``(loss, new_stats2, grad w.r.t. part2, grad w.r.t. act)``; the last is
    the cut-layer gradient the client receives.
  """
  def loss_fn(p, a):
    logits, ns = setup.model.apply(p, stats2, a, start=setup.cut, train=True,
                                   mask=mask)
    return common.masked_cross_entropy(logits, y, mask), ns

  (loss, ns), (g_p, g_a) = jax.value_and_grad(
      loss_fn, argnums=(0, 1), has_aux=True)(part2, act)
  return loss, ns, g_p, g_a


def server_step(setup: Setup, tx, part2, stats2, opt, act, y, mask):
  """One sequential server update on one client's cut-layer activations.

  Returns the updated server portion and the gradient of the batch's mean
  loss w.r.t. ``act`` (what the client receives); a no-op on an empty batch.
  """
  active = jnp.any(mask)
  loss, ns, g_p, g_a = server_grads(setup, part2, stats2, act, y, mask)
  part2, opt = common.sgd_update(tx, part2, g_p, opt, active)
  stats2 = common.gate(active, ns, stats2)
  return part2, stats2, opt, g_a, loss * jnp.sum(mask)


def client_forward(setup: Setup, part1, stats1, x, mask):
  """Stacked clients' part-1 forward; returns activations and new stats."""
  return map_clients(
      lambda p, s, xx, m: setup.model.apply(p, s, xx, train=True, mask=m),
      setup.client_exec, part1, stats1, x, mask)


def split_batch_step(setup: Setup, tx, data, carry, batch, serve):
  """One batch step of a sequential-server split method (SFL, Hydra).

  Args:
    setup: static run description.
    tx: the optimiser.
    data: device data.
    carry: ``(part1, stats1, opt1, server)``: stacked client portions, their
      BN statistics and optimiser states, and the method's server pytree.
    batch: ``(idx, mask, order)`` of this step: ``(n, B)`` indices and mask
      and the ``(n,)`` processing order.
    serve: ``(server, act, y, mask, k) -> (server, g_act, loss_sum)``, one
      server update on participant ``k``'s activations.

  Returns:
    ``(carry, loss_sum)``.
  """
  part1, stats1, opt1, server = carry
  idx, mask, order = batch
  x, y = batching.gather(data, idx)
  has = jnp.any(mask, axis=1)

  acts, vjp_fn, new_stats1 = jax.vjp(
      lambda p: client_forward(setup, p, stats1, x, mask), part1, has_aux=True)

  def one(srv, k):
    srv, g_a, lsum = serve(srv, acts[k], y[k], mask[k], k)
    return srv, (g_a, lsum)

  server, (g_ordered, lsums) = lax.scan(one, server, order,
                                        unroll=setup.server_unroll)
  g_acts = jnp.zeros_like(g_ordered).at[order].set(g_ordered)
  (g1,) = vjp_fn(g_acts)
  part1, opt1 = jax.vmap(
      lambda p, g, o, a: common.sgd_update(tx, p, g, o, a))(part1, g1, opt1, has)
  stats1 = jax.vmap(common.gate)(has, new_stats1, stats1)
  return (part1, stats1, opt1, server), jnp.sum(lsums)


def batch_step(setup: Setup, tx, data, carry, batch):
  """One SFL batch step over all participants (steps 1-7 of Hydra Fig. 1).

  ``carry`` is ``(part1, stats1, opt1, part2, stats2, opt2)``.
  """
  def serve(srv, act, y, mask, k):
    part2, stats2, opt2, g_a, lsum = server_step(setup, tx, *srv, act, y, mask)
    return (part2, stats2, opt2), g_a, lsum

  (part1, stats1, opt1, server), lsum = split_batch_step(
      setup, tx, data, (*carry[:3], carry[3:]), batch, serve)
  return (part1, stats1, opt1, *server), lsum


def round(setup: Setup, state: State, data, key):
  """One SFL round.

  Args:
    setup: static run description (``setup.order`` picks the processing order).
    state: see :class:`State`.
    data: device data (see ``jsfl.methods.base``).
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``; metrics: ``loss``, ``samples``, ``clients``
    (participants in the first batch step's processing order).
  """
  plan = plan_round(setup, data, key, state.round)
  n = setup.clients_per_round
  orders = common.processing_orders(setup.order, plan.order_key, plan.idx.shape[0],
                                    plan.clients, data["dominant"], state.label_rank)
  part1 = common.broadcast(state.part1, n)
  stats1 = common.broadcast(state.part1_stats, n)
  opt2 = common.with_lr(state.server_opt, plan.lr)
  carry = (part1, stats1, fresh_opt_states(plan, part1), state.part2,
           state.part2_stats, opt2)
  carry, lsums = common.scan_live(
      lambda c, b: batch_step(setup, plan.tx, data, c, b), carry,
      (plan.idx, plan.mask, orders), common.live_steps(plan.mask))
  part1, stats1, _, part2, stats2, opt2 = carry
  new = state.replace(part1=common.weighted_mean(part1, plan.sizes),
                      part1_stats=common.weighted_mean(stats1, plan.sizes),
                      part2=part2, part2_stats=stats2, server_opt=opt2,
                      round=state.round + 1)
  return new, round_metrics(plan, lsums, plan.clients[orders[0]])


def output_model(setup: Setup, state: State):
  return state.part1 + state.part2, state.part1_stats + state.part2_stats


communication = split_communication
