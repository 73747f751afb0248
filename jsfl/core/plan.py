"""A round's random decisions: participants, their batches, the learning rate."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax

from jsfl.core import batching
from jsfl.core.data import hyper, round_options
from jsfl.core.optim import round_lr, with_lr
from jsfl.core.setup import Setup


# ------------------------------------------------------------ participation
def sample_clients(key, num_clients: int, n: int):
  """``n`` distinct client ids, ascending (all of them when n == K)."""
  if n == num_clients:
    return jnp.arange(num_clients, dtype=jnp.int32)
  chosen = jax.random.choice(key, num_clients, (n,), replace=False)
  return jnp.sort(chosen).astype(jnp.int32)


class RoundPlan(NamedTuple):
  """A round's random decisions and optimiser, shared by every method."""

  clients: jax.Array    # (n,) participating client ids, ascending
  sizes: jax.Array      # (n,) their sample counts
  weights: jax.Array    # (n,) their weights in a round-end mean (aggregation_weights)
  idx: jax.Array        # (T, n, B) sample indices of every batch step
  mask: jax.Array       # (T, n, B) which of them exist
  order_key: jax.Array  # for the processing order of sequential methods
  tx: optax.GradientTransformation
  lr: jax.Array         # this round's decayed learning rate
  options: Any = None   # the method's option set as this round sees it
                        # (jsfl.core.data.round_options: batchable values traced)
  context: Any = None   # what a method's planner derives from the round's
                        # data for its hooks (Hydra: each participant's head)


def aggregation_weights(setup: Setup, sizes):
  """The participants' weights in a round-end mean of their portions
  (``method.aggregation``): their sample counts (FedAvg's), or one each (the
  Hydra authors' scripts), unnormalised."""
  if setup.aggregation == "uniform":
    return jnp.ones(sizes.shape, jnp.float32)
  return sizes.astype(jnp.float32)


def plan_round(setup: Setup, data, key, round_idx) -> RoundPlan:
  """Samples participants, shuffles their batches, and sets the round's lr."""
  k_part, k_batch, k_order = jax.random.split(key, 3)
  clients = sample_clients(k_part, setup.num_clients,
                                  setup.clients_per_round)
  sizes = data.sizes[clients]
  idx, mask = batching.round_batches(k_batch, data.table[clients], sizes,
                                     setup.batch_size, setup.local_epochs, clients,
                                     drop_last=setup.drop_last, shuffle=setup.shuffle)
  tx = setup.tx
  hp = hyper(setup, data)
  lr = round_lr(hp.lr, hp.lr_decay, hp.lr_min, round_idx, setup.lr_decay_start)
  return RoundPlan(clients, sizes, aggregation_weights(setup, sizes), idx, mask, k_order,
                   tx, lr, round_options(setup, data))


def fresh_opt_states(plan: RoundPlan, stacked_params):
  """Per-client optimiser states, rebuilt every round (docs/setting.md#optimisation)."""
  return jax.vmap(lambda p: with_lr(plan.tx.init(p), plan.lr))(stacked_params)


def round_metrics(plan: RoundPlan, loss_sums, clients=None) -> dict:
  """Mean train loss, samples processed, and the logged client order."""
  samples = jnp.sum(plan.mask)
  return {"loss": jnp.sum(loss_sums) / jnp.maximum(samples, 1),
          "samples": samples,
          "clients": plan.clients if clients is None else clients}
