"""MergeSFL: Liao et al., "MergeSFL: Split Federated Learning with Feature
Merging and Batch Size Regulation", ICDE 2024, simplified as in Hydra's
comparison (AAAI 2026, Sec. 5 / Table 3).  SPEC 2.

Every participant holds a copy of part-1 (trained in parallel); ONE server
part-2.  Per batch step:

1. all clients' part-1 forward in one program (``sfl.client_forward``),
   differentiated with a single ``jax.vjp``;
2. the server concatenates the activations (and labels and masks) of all
   clients into one batch and takes ONE part-2 step on the masked mean
   cross-entropy over the concatenation (BatchNorm sees the merged batch);
3. the cut-layer gradient of the merged loss is sliced back to the clients,
   which update their part-1 (clients without a batch are left unchanged).

At round end the part-1 copies are averaged sample-weighted.  The server
optimiser state persists across rounds like SFL's, the clients' lives one
round (SPEC 1.3).

Simplifications (Hydra's, stated by SPEC): no batch-size regulation (every
client uses ``batch_size``) and no feature-merging client selection; the
processing order plays no role.  A client receives the gradient of the
merged mean loss w.r.t. its activations, as a PyTorch server calling
``loss.backward()`` on the merged batch would send it, i.e. its own batch's
share of the merged loss, not the mean loss of its batch alone.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jsfl.engine import batching, common
from jsfl.methods import sfl
from jsfl.methods.base import (
  Setup,
  fresh_opt_states,
  plan_round,
  round_metrics,
  split_communication,
)

# SFL's state (label_rank unused: MergeSFL has no processing order) and
# init, so a seed starts both methods from one model.
State = sfl.State
init = sfl.init


def merge(a):
  """``(n, B, ...) -> (n*B, ...)``: the clients' batches as one batch."""
  return a.reshape((-1,) + a.shape[2:])


def batch_step(setup: Setup, tx, data, carry, batch):
  """One MergeSFL batch step: parallel part-1, one merged part-2 update."""
  part1, stats1, opt1, part2, stats2, opt2 = carry
  idx, mask = batch
  x, y = batching.gather(data, idx)
  has = jnp.any(mask, axis=1)

  acts, vjp_fn, new_stats1 = jax.vjp(
      lambda p: sfl.client_forward(setup, p, stats1, x, mask), part1, has_aux=True)
  part2, stats2, opt2, g_merged, lsum = sfl.server_step(
      setup, tx, part2, stats2, opt2, merge(acts), merge(y), merge(mask))
  (g1,) = vjp_fn(g_merged.reshape(acts.shape))
  part1, opt1 = jax.vmap(
      lambda p, g, o, a: common.sgd_update(tx, p, g, o, a))(part1, g1, opt1, has)
  stats1 = jax.vmap(common.gate)(has, new_stats1, stats1)
  return (part1, stats1, opt1, part2, stats2, opt2), lsum


def round(setup: Setup, state: State, data, key):
  """One MergeSFL round.

  Args:
    setup: static run description.
    state: see :class:`State`.
    data: device data (see ``jsfl.methods.base``).
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)`` with ``loss``, ``samples`` and ``clients``
    (participants, ascending).
  """
  plan = plan_round(setup, data, key, state.round)
  n = setup.clients_per_round
  part1 = common.broadcast(state.part1, n)
  stats1 = common.broadcast(state.part1_stats, n)
  carry = (part1, stats1, fresh_opt_states(plan, part1), state.part2,
           state.part2_stats, common.with_lr(state.server_opt, plan.lr))
  carry, lsums = common.scan_live(
      lambda c, b: batch_step(setup, plan.tx, data, c, b), carry,
      (plan.idx, plan.mask), common.live_steps(plan.mask))
  part1, stats1, _, part2, stats2, opt2 = carry
  new = state.replace(part1=common.weighted_mean(part1, plan.sizes),
                      part1_stats=common.weighted_mean(stats1, plan.sizes),
                      part2=part2, part2_stats=stats2, server_opt=opt2,
                      round=state.round + 1)
  return new, round_metrics(plan, lsums)


def output_model(setup: Setup, state: State):
  return state.part1 + state.part2, state.part1_stats + state.part2_stats


communication = split_communication
"""Per round: part-1 down and up per participant, plus per processed sample
the activation and label up and its gradient down, as SFL
(``base.split_communication``)."""
