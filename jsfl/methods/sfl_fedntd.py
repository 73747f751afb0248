"""FedNTD in its SFL form (SPEC 5, last paragraph): the SFL workflow whose
server loss is FedNTD's.

FedNTD: Lee et al., "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022.  The MultiSFL paper (Xia
et al., AAAI 2025, Sec. "Experimental Results") runs it, FedExp and FedMut
"in their SFL versions"; it publishes no details, so jsfl's SFL form is SFL
(``jsfl.methods.sfl``: client portions in parallel, ONE server portion
updated sequentially in the processing order, client portions averaged
sample-weighted) with FedNTD's loss at the server:
``CE + beta * tau^2 * KL(q~_global || q~_local)`` over the not-true classes
(:func:`jsfl.methods.fedntd.ntd_loss`, reused unchanged).  The teacher is
the round's starting global model (client portion + server portion, frozen,
eval mode) on the same client batch; its logits are computed once per batch
step for all participants.  The distillation gradient reaches the client
portions through the cut-layer gradient, like the cross-entropy's.

This module also holds :func:`split_round`, the SFL round with the three
hooks the SFL-form baselines need (server step, starting client portions,
and the stacked trained client portions returned before aggregation); the
other two (``sfl_fedexp``, ``sfl_fedmut``) import it.  With no hooks it is
``sfl.round`` step for step (tested).

Decisions and departures:

* Which SFL: SPEC 5 says "the SFL workflow", and SPEC 2's SFL is SplitFedV2,
  which is what these three modules build on.  The MultiSFL paper's own SFL
  baseline is the parallel one (its text: clients work with the main server
  "in parallel"; the authors' public code gives each selected client copies
  of both global portions and averages both), i.e. SplitFedV1, which equals
  FedAvg (tested).  Under that reading the SFL forms would equal the FL
  methods (``fedntd`` for FedNTD); ``experiments/multisfl`` reports both SFL
  rows.
* The teacher's cut-layer features are computed at the client with the
  frozen global client portion and uploaded next to the student's, so
  :func:`communication` counts one extra activation per sample up.
* Metrics: ``loss`` is the mean cross-entropy (as SFL's), ``reg_loss`` the
  mean ``beta * NTD`` term (as ``fedntd``'s).
* Defaults beta = 1, tau = 1 (SPEC 5); the ``tau^2`` factor of the authors'
  code is kept (see ``fedntd``).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp

from jsfl.engine import batching, common
from jsfl.methods import fedntd, sfl
from jsfl.methods.base import (
  RoundPlan,
  Setup,
  activation_size,
  fresh_opt_states,
  plan_round,
  round_metrics,
  split_communication,
)

OPTIONS = fedntd.OPTIONS

State = sfl.State
init = sfl.init
output_model = sfl.output_model


# ------------------------------------------------ the SFL round with hooks
class SplitRound(NamedTuple):
  """What :func:`split_round` returns: the round before part-1 aggregation."""

  plan: RoundPlan
  orders: jax.Array      # (T, n) processing order of every batch step
  part1: tuple           # (n, ...) trained client portions
  stats1: tuple
  part2: tuple           # the server portion after the round
  stats2: tuple
  server_opt: object
  loss_sums: jax.Array   # (T,) loss sums of the method's serve function
  extra_sum: jax.Array   # () the serve function's second accumulator


def default_serve(setup: Setup, tx):
  """SFL's server step on a server carry ``(part2, stats2, opt2, extra_sum)``."""
  def serve(srv, act, y, mask, k):
    p2, s2, o2, extra = srv
    p2, s2, o2, g_a, lsum = sfl.server_step(setup, tx, p2, s2, o2, act, y, mask)
    return (p2, s2, o2, extra), g_a, lsum
  return serve


def split_round(setup: Setup, state, data, key, *, starts=None,
                make_serve: Callable | None = None) -> SplitRound:
  """SFL's round (``sfl.round``) without the part-1 aggregation, with hooks.

  Args:
    setup: static run description.
    state: any state with SFL's fields (``part1``, ``part1_stats``,
      ``part2``, ``part2_stats``, ``server_opt``, ``label_rank``, ``round``).
    data: device data.
    key: the round's PRNG key (``plan_round`` gets it as in ``sfl.round``).
    starts: ``(n, ...)`` starting client portions of the participants;
      None broadcasts ``state.part1``.
    make_serve: ``(plan, x, idx, mask) -> serve`` building a batch step's
      server function (see ``sfl.split_batch_step``) over the server carry
      ``(part2, stats2, opt2, extra_sum)``; ``x`` is the step's normalised
      inputs ``(n, B, ...)``.  None is SFL's server step.

  Returns:
    :class:`SplitRound`.
  """
  plan = plan_round(setup, data, key, state.round)
  n = setup.clients_per_round
  orders = common.processing_orders(setup.order, plan.order_key, plan.idx.shape[0],
                                    plan.clients, data["dominant"], state.label_rank)
  part1 = common.broadcast(state.part1, n) if starts is None else starts
  stats1 = common.broadcast(state.part1_stats, n)
  server = (state.part2, state.part2_stats,
            common.with_lr(state.server_opt, plan.lr), jnp.zeros((), jnp.float32))

  def step(carry, batch):
    idx, mask, _ = batch
    if make_serve is None:
      serve = default_serve(setup, plan.tx)
    else:
      serve = make_serve(plan, batching.gather(data, idx)[0], idx, mask)
    return sfl.split_batch_step(setup, plan.tx, data, carry, batch, serve)

  carry = (part1, stats1, fresh_opt_states(plan, part1), server)
  (part1, stats1, _, (p2, s2, o2, extra)), lsums = common.scan_live(
      step, carry, (plan.idx, plan.mask, orders), common.live_steps(plan.mask))
  return SplitRound(plan, orders, part1, stats1, p2, s2, o2, lsums, extra)


def finish(state, out: SplitRound, part1, part1_stats, **extra_state):
  """The next state and SFL's metrics from an aggregated client portion."""
  new = state.replace(part1=part1, part1_stats=part1_stats, part2=out.part2,
                      part2_stats=out.stats2, server_opt=out.server_opt,
                      round=state.round + 1, **extra_state)
  return new, round_metrics(out.plan, out.loss_sums,
                            out.plan.clients[out.orders[0]])


def sample_weighted(out: SplitRound):
  """SFL's aggregation: the sample-weighted mean of parameters and stats."""
  return (common.weighted_mean(out.part1, out.plan.sizes),
          common.weighted_mean(out.stats1, out.plan.sizes))


# ------------------------------------------------------------------ FedNTD
def ntd_server_step(setup: Setup, tx, srv, act, y, mask, teacher_logits,
                    beta: float, tau: float):
  """One sequential server update with FedNTD's loss on one client batch.

  Args:
    setup, tx: run description and optimiser.
    srv: ``(part2, stats2, opt2, reg_sum)``.
    act, y, mask: the client's cut-layer activations, labels and mask.
    teacher_logits: ``(B, L)`` the frozen global model's logits on the batch.
    beta, tau: FedNTD's weight and temperature.

  Returns:
    ``(srv, gradient w.r.t. act, cross-entropy sum)``; an empty batch
    changes nothing.
  """
  p2, s2, o2, reg = srv
  active = jnp.any(mask)

  def loss_fn(p, a):
    logits, ns = setup.model.apply(p, s2, a, start=setup.cut, train=True, mask=mask)
    ce = common.masked_cross_entropy(logits, y, mask)
    r = beta * fedntd.ntd_loss(logits, teacher_logits, y, mask, tau)
    return ce + r, (ns, ce, r)

  (_, (ns, ce, r)), (g_p, g_a) = jax.value_and_grad(
      loss_fn, argnums=(0, 1), has_aux=True)(p2, act)
  p2, o2 = common.sgd_update(tx, p2, g_p, o2, active)
  s2 = common.gate(active, ns, s2)
  count = jnp.sum(mask)
  return (p2, s2, o2, reg + r * count), g_a, ce * count


def round(setup: Setup, state: State, data, key):
  """One SFL-form FedNTD round.

  Args:
    setup: static run description (method options ``beta``, ``tau``).
    state: SFL's state.
    data: device data.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``: SFL's metrics plus ``reg_loss`` (mean
    ``beta * NTD``).
  """
  beta = float(setup.option("beta", 1.0))
  tau = float(setup.option("tau", 1.0))
  teacher = (state.part1 + state.part2, state.part1_stats + state.part2_stats)

  def make_serve(plan, x, idx, mask):
    n, b = idx.shape
    t_logits = setup.model.apply(*teacher, x.reshape((n * b,) + x.shape[2:]),
                                 train=False)[0].reshape(n, b, -1)

    def serve(srv, act, y, m, k):
      return ntd_server_step(setup, plan.tx, srv, act, y, m, t_logits[k], beta, tau)
    return serve

  out = split_round(setup, state, data, key, make_serve=make_serve)
  new, metrics = finish(state, out, *sample_weighted(out))
  metrics["reg_loss"] = out.extra_sum / jnp.maximum(metrics["samples"], 1)
  return new, metrics


def communication(setup: Setup, samples: int):
  """SFL's bytes plus the teacher's cut-layer activation of every sample (up)."""
  up, down = split_communication(setup, samples)
  return up + samples * activation_size(setup.model, setup.cut) * 4, down
