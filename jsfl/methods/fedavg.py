"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017 (SPEC 2, "FL / FedAvg").

Each participating client trains the whole model for ``local_epochs`` epochs
from the global model; the server takes the sample-weighted mean.  Clients are
stacked on a leading axis and trained in one program (``map_clients``); batch
steps are a ``lax.scan``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.engine import batching, common
from jsfl.methods.base import (
  Setup,
  fresh_opt_states,
  map_clients,
  plan_round,
  portion_bytes,
  round_metrics,
)


@struct.dataclass
class State:
  params: tuple
  stats: tuple
  round: jax.Array


def init(setup: Setup, key) -> State:
  params, stats = setup.model.init(key)
  return State(params, stats, jnp.zeros((), jnp.int32))


def local_step(setup: Setup, tx, data, params, stats, opt_state, idx, mask):
  """One SGD step of one client on its batch; skipped if the batch is empty."""
  x, y = batching.gather(data, idx)
  active = jnp.any(mask)

  def loss_fn(p):
    logits, new_stats = setup.model.apply(p, stats, x, train=True, mask=mask)
    return common.masked_cross_entropy(logits, y, mask), new_stats

  (loss, new_stats), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
  params, opt_state = common.sgd_update(tx, params, grads, opt_state, active)
  stats = common.gate(active, new_stats, stats)
  return params, stats, opt_state, loss * jnp.sum(mask)


def round(setup: Setup, state: State, data, key):
  """One FedAvg round.

  Args:
    setup: static run description.
    state: global model and round counter.
    data: device data (see ``jsfl.methods.base``).
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)`` with metrics ``loss`` (mean train loss), ``samples``
    (samples processed) and ``clients`` (participants).
  """
  plan = plan_round(setup, data, key, state.round)
  tx, n = plan.tx, setup.clients_per_round
  params = common.broadcast(state.params, n)
  stats = common.broadcast(state.stats, n)
  opt = fresh_opt_states(plan, params)

  def step(carry, batch):
    params, stats, opt = carry
    b_idx, b_mask = batch
    params, stats, opt, lsum = map_clients(
        lambda p, s, o, i, m: local_step(setup, tx, data, p, s, o, i, m),
        setup.client_exec, params, stats, opt, b_idx, b_mask)
    return (params, stats, opt), jnp.sum(lsum)

  (params, stats, _), lsums = common.scan_live(
      step, (params, stats, opt), (plan.idx, plan.mask),
      common.live_steps(plan.mask))
  new = State(common.weighted_mean(params, plan.sizes),
              common.weighted_mean(stats, plan.sizes), state.round + 1)
  return new, round_metrics(plan, lsums)


def output_model(setup: Setup, state: State):
  return state.params, state.stats


def communication(setup: Setup, samples: int):
  """Whole model (with BN statistics) down and up per participant."""
  b = portion_bytes(setup.model, 0, setup.model.num_stages)
  return setup.clients_per_round * b, setup.clients_per_round * b
