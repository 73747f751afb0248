"""SplitFedV1: Thapa et al., "SplitFed: When Federated Learning Meets Split
Learning", AAAI 2022 (SPEC 2).

Per participating client a copy of part-1 (at the client) and a copy of part-2
(at the server), trained in parallel on that client's data with the cut-layer
exchange of split learning; both averaged sample-weighted at round end.  The
math equals FedAvg's (tested); the split is kept so communication and any
per-portion option stay honest.  All clients are one program
(``map_clients``); the server copies live one round, like their optimiser
state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.engine import batching, common
from jsfl.methods import sfl
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
  part1: tuple
  part1_stats: tuple
  part2: tuple
  part2_stats: tuple
  round: jax.Array


def init(setup: Setup, key) -> State:
  params, stats = setup.model.init(key)
  c = setup.cut
  return State(params[:c], stats[:c], params[c:], stats[c:],
               jnp.zeros((), jnp.int32))


def split_step(setup: Setup, tx, data, p1, s1, o1, p2, s2, o2, idx, mask):
  """One client's split step: part-1 forward, server part-2 copy forward and
  backward, cut-layer gradient back, part-1 backward; both copies updated."""
  x, y = batching.gather(data, idx)
  active = jnp.any(mask)
  act, vjp_fn, ns1 = jax.vjp(
      lambda p: setup.model.apply(p, s1, x, train=True, mask=mask), p1,
      has_aux=True)

  loss, ns2, g2, g_a = sfl.server_grads(setup, p2, s2, act, y, mask)
  (g1,) = vjp_fn(g_a)
  p1, o1 = common.sgd_update(tx, p1, g1, o1, active)
  p2, o2 = common.sgd_update(tx, p2, g2, o2, active)
  s1 = common.gate(active, ns1, s1)
  s2 = common.gate(active, ns2, s2)
  return p1, s1, o1, p2, s2, o2, loss * jnp.sum(mask)


def round(setup: Setup, state: State, data, key):
  """One SplitFedV1 round; same signature and metrics as ``fedavg.round``."""
  plan = plan_round(setup, data, key, state.round)
  n = setup.clients_per_round
  p1, s1 = common.broadcast(state.part1, n), common.broadcast(state.part1_stats, n)
  p2, s2 = common.broadcast(state.part2, n), common.broadcast(state.part2_stats, n)
  carry = (p1, s1, fresh_opt_states(plan, p1), p2, s2, fresh_opt_states(plan, p2))

  def step(carry, batch):
    out = map_clients(
        lambda *a: split_step(setup, plan.tx, data, *a), setup.client_exec,
        *carry, *batch)
    return out[:6], jnp.sum(out[6])

  (p1, s1, _, p2, s2, _), lsums = common.scan_live(
      step, carry, (plan.idx, plan.mask), common.live_steps(plan.mask))
  avg = lambda t: common.weighted_mean(t, plan.sizes)
  new = State(avg(p1), avg(s1), avg(p2), avg(s2), state.round + 1)
  return new, round_metrics(plan, lsums)


def output_model(setup: Setup, state: State):
  return state.part1 + state.part2, state.part1_stats + state.part2_stats


communication = split_communication
