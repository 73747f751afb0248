"""A MultiSFL round: decisions, the branches' split training with replay,
the proportion update and the master pull-back (steps 1-6 of
:mod:`jsfl.methods.multisfl`).
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jsfl.core.data import gather
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.method import (
  LABEL_BYTES,
  Method,
  activation_size,
  portion_bytes,
  split_communication,
)
from jsfl.core.optim import gate, with_lr
from jsfl.core.plan import RoundPlan, aggregation_weights, plan_round
from jsfl.core.portion import Portion, fresh_stack
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast
from jsfl.engine import split
from jsfl.methods.multisfl.options import MultiSFLOptions, options, replay_sizes, validate
from jsfl.methods.multisfl.proportion import (
  clp_proportion,
  fgn,
  next_proportion,
  push_signal,
  relative_proportion,
  signal,
  sq_norm,
  windowed_change,
)
from jsfl.methods.multisfl.replay import (
  assistant_takes,
  authors_shares,
  class_pool,
  client_holdings,
  quotas,
  replay_slots,
  step_shares,
  update_scores,
  update_scores_authors,
)


@struct.dataclass
class State:
  part1: tuple           # client portions wc_i, leading branch axis (n, ...)
  part1_stats: tuple
  part2: tuple           # server portions ws_i, leading branch axis
  part2_stats: tuple
  server_opt: object     # per-branch server optimiser states
  score_num: jax.Array   # (n, L) sum_j gamma^(r-j) L_i[j]
  score_den: jax.Array   # () sum_j gamma^(r-j)
  p: jax.Array           # () sampling proportion of the next round
  fgn_prev: jax.Array    # () FGN of the last round
  g_hist: jax.Array      # (W + 1,) gradient signal of the last W + 1 rounds, oldest
                         # first; zeros before round 0 (as the authors pad it)
  round: jax.Array


def init(setup: Setup, key) -> State:
  """n identical branches (one initial model copied), empty score history,
  ``p = p_0`` (0 with replay off).  Its options are checked host-side by
  ``validate`` (``Method.validate``, before anything is written): alpha,
  gamma and p_min may be traced per-slot values here."""
  params, stats = setup.model.init(key)
  c, n = setup.cut, setup.clients_per_round
  tx = setup.tx
  part2 = broadcast(params[c:], n)
  p0 = 0.0 if options(setup).replay == "off" else options(setup).p0
  return State(broadcast(params[:c], n), broadcast(stats[:c], n),
               part2, broadcast(stats[c:], n), jax.vmap(tx.init)(part2),
               jnp.zeros((n, setup.num_classes), jnp.float32),
               jnp.zeros((), jnp.float32), jnp.asarray(p0, jnp.float32),
               jnp.zeros((), jnp.float32),
               jnp.zeros((options(setup).clp_window + 1,), jnp.float32),
               jnp.zeros((), jnp.int32))


class Decisions(NamedTuple):
  """A round's random and data-dependent decisions, before any training."""

  clients: jax.Array     # (n,) main client of every branch
  sizes: jax.Array       # (n,) their sample counts
  idx: jax.Array         # (T, n, B) main batches of every step
  mask: jax.Array        # (T, n, B)
  counts: jax.Array      # (n, L) L_i[r]
  score_num: jax.Array   # (n, L) updated
  score_den: jax.Array   # () updated
  quota: jax.Array       # (n, L) requested per class
  take: jax.Array        # (n, K, L) taken from every assistant
  ridx: jax.Array        # (T, n, R) replay share of every step
  rmask: jax.Array       # (T, n, R)
  served: jax.Array      # (n, L) per class in the replay list (an epoch's batches draw from it)
  lr: jax.Array          # the round's learning rate


def decide(setup: Setup, state: State, data, key) -> Decisions:
  """Main clients, batches, scores, quotas and the replay of one round.

  Pure and jittable; the planner (:func:`plan`) calls it with the round's
  key (tests call it to replay the same decisions in a loop reference).
  """
  o = options(setup, data)
  k_plan, k_branch, k_pool, k_take, k_slots = jax.random.split(key, 5)
  plan = plan_round(setup, data, k_plan, state.round)
  n, K, L = setup.clients_per_round, setup.num_clients, setup.num_classes
  perm = jax.random.permutation(k_branch, n)
  clients, sizes = plan.clients[perm], plan.sizes[perm]
  idx, mask = plan.idx[:, perm], plan.mask[:, perm]
  holdings = client_holdings(data.table, data.sizes, data.y, L)
  counts = holdings[clients]
  update = update_scores_authors if o.score_update == "authors" else update_scores
  num, den, sv = update(state.score_num, state.score_den, counts, o.gamma)
  cap, per_step = replay_sizes(setup)
  T = idx.shape[0]
  if cap == 0:
    quota = jnp.zeros((n, L), jnp.int32)
    take = jnp.zeros((n, K, L), jnp.int32)
    ridx = jnp.zeros((T, n, 0), jnp.int32)
    rmask = jnp.zeros((T, n, 0), bool)
    return Decisions(clients, sizes, idx, mask, counts, num, den, quota, take,
                     ridx, rmask, jnp.zeros((n, L), jnp.int32), plan.lr)
  pool, start = class_pool(k_pool, data.table, data.sizes, data.y, L)
  quota = jax.vmap(lambda s, z: quotas(s, z, state.p, o.min_request,
                                      o.request_rounding))(sv, sizes)
  if o.assistants == "inactive":
    excluded = jnp.broadcast_to(jnp.zeros(K, bool).at[clients].set(True), (n, K))
  else:  # only the branch's own main client stays out
    excluded = jax.nn.one_hot(clients, K, dtype=bool)
  take = jax.vmap(lambda k, q, ex: assistant_takes(k, holdings, ex, q))(
      jax.random.split(k_take, n), quota, excluded)
  slots, valid = jax.vmap(lambda k, t: replay_slots(k, t, pool, start, holdings, cap))(
      jax.random.split(k_slots, n), take)
  t_ep = T // setup.local_epochs
  if o.replay_schedule == "authors":
    # A key of its own, folded from k_slots: the other draws stay as they were.
    sidx, smask = jax.vmap(lambda k, i, v, s: authors_shares(
        k, i, v, s, setup.batch_size, setup.local_epochs, t_ep, per_step,
        setup.drop_last))(
            jax.random.split(jax.random.fold_in(k_slots, 1), n), slots, valid, sizes)
    served = jnp.sum(jax.nn.one_hot(data.y[slots], L, dtype=jnp.int32)
                     * valid[..., None], axis=1)              # the replay list
    ridx, rmask = sidx.transpose(1, 0, 2), smask.transpose(1, 0, 2)
  else:
    sidx, smask = jax.vmap(
        lambda i, v, s: step_shares(i, v, s, setup.batch_size, t_ep, per_step,
                                    setup.drop_last))(
            slots, valid, sizes)                              # (n, t_ep, R)
    served = jnp.sum(jax.nn.one_hot(data.y[sidx], L, dtype=jnp.int32)
                     * smask[..., None], axis=(1, 2))
    # The same shares every epoch.
    ridx = jnp.tile(sidx.transpose(1, 0, 2), (setup.local_epochs, 1, 1))
    rmask = jnp.tile(smask.transpose(1, 0, 2), (setup.local_epochs, 1, 1))
  return Decisions(clients, sizes, idx, mask, counts, num, den, quota, take,
                   ridx, rmask, served, plan.lr)


class Branches(NamedTuple):
  """The server carry of a MultiSFL round (every leaf with a leading branch
  axis n)."""

  server: Portion  # the server portions ws_i
  gsum: tuple            # running sum of ws_i's loss gradients (FGN)
  sqsum: jax.Array       # (n,) running sum of 2|g_client|^2 + |g_server|^2 (the
                         # authors' signal counts the client portion twice: their
                         # running total is not reset between the two portions)
  replay_model: tuple    # (params, stats) the wc_i copy computing replay features


def branch_server(setup: Setup, tx, data, carry, act, y, mask, share):
  """The server side of one split step of one branch with its replay share
  (Algorithm 1, lines 18-20).

  Args:
    setup, tx, data: as for every method.
    carry: the branch's :class:`Branches` slice.
    act, y, mask: ``(B, ...)`` the main client's cut-layer features, labels
      and mask.
    share: ``(ridx, rmask)``, ``(R,)`` this step's replay share.

  Returns:
    ``(carry, gradient w.r.t. act, loss sum)``; a no-op on an empty main
    batch.
  """
  server, (f1, fs1) = carry.server, carry.replay_model
  ridx, rmask = share
  active = jnp.any(mask)
  if ridx.shape[0]:
    xr, yr = gather(data, ridx)
    ract = lax.stop_gradient(setup.model.apply(f1, fs1, xr, train=True, mask=rmask)[0])
    m_all = jnp.concatenate([mask, rmask])
    if options(setup).server_forward == "separate":
      loss, ns2, g2, g_a = separate_server_grads(setup, server.params, server.stats, act, y,
                                                 mask, ract, yr, rmask)
    else:
      loss, _, ns2, g2, g_a = split.server_grads(
          setup, server.params, server.stats, jnp.concatenate([act, ract]),
          jnp.concatenate([y, yr]), m_all)
  else:
    m_all = mask
    loss, _, ns2, g2, g_a = split.server_grads(setup, server.params, server.stats, act, y,
                                               mask)
  carry = carry._replace(
      server=server.step(tx, g2, ns2, active),
      gsum=jax.tree.map(lambda a, g: a + jnp.where(active, g, 0.0), carry.gsum, g2),
      sqsum=carry.sqsum + jnp.where(active, sq_norm(g2), 0.0))
  count = jnp.where(active, jnp.sum(m_all), 0)
  return carry, g_a[:act.shape[0]], loss * count


class Context(NamedTuple):
  """What MultiSFL's planner hands its hooks: the round's decisions and the
  round's data (the replay gathers its samples from it)."""

  decisions: Decisions
  data: object


def plan(setup: Setup, state: State, data, key) -> RoundPlan:
  """The branches' plan: :func:`decide`'s main clients and batches (no
  processing order is drawn from it, the branches being served side by
  side), with the decisions in its context."""
  d = decide(setup, state, data, key)
  return RoundPlan(d.clients, d.sizes, aggregation_weights(setup, d.sizes), d.idx, d.mask, key,
                   setup.tx, d.lr,
                   options(setup, data), Context(d, data))


def server(state: State, plan: RoundPlan) -> Branches:
  """Every branch's server portion (its optimiser state kept or rebuilt,
  ``server_opt``), zero gradient sums and the replay model."""
  n = plan.clients.shape[0]
  server_opt = (state.server_opt if plan.options.server_opt == "keep"
                else jax.vmap(plan.tx.init)(state.part2))
  return Branches(
      Portion(state.part2, state.part2_stats,
              jax.vmap(lambda s: with_lr(s, plan.lr))(server_opt)),
      jax.tree.map(jnp.zeros_like, state.part2), jnp.zeros((n,), jnp.float32),
      (state.part1, state.part1_stats))


def branches_part1(state: State, plan: RoundPlan):
  """Every branch's own client portion, a fresh optimiser state each."""
  return fresh_stack(plan, state.part1, state.part1_stats)


def serve(setup: Setup) -> split.ServerRule:
  """MultiSFL's server rule: a server portion per branch
  (:class:`~jsfl.engine.split.PerClientServer`), each branch's step fed its
  main client's features and its replay share of the step (the plan's
  decisions); the replay model is refreshed from the branch's client
  portion at an epoch's first step (``replay_model = "epoch"``), and the
  branch's gradient signal adds its client portion's ``2|g_client|^2``."""
  refresh = options(setup).replay_model == "epoch"

  def rule(state, plan: RoundPlan, step: split.Step):
    d, data = plan.context
    t = step.position  # a batch step: the branches are not scheduled by an order
    t_ep = plan.idx.shape[0] // setup.local_epochs   # steps of one local epoch
    epoch_start = t % t_ep == 0
    ridx, rmask = d.ridx[t], d.rmask[t]

    def piece(setup, tx, client, br: Branches, x, y, mask, k):
      active = jnp.any(mask)
      if refresh:  # a fresh copy of wc_i every epoch
        br = br._replace(replay_model=jax.tree.map(
            lambda new, old: jnp.where(epoch_start, new, old),
            (client.params, client.stats), br.replay_model))
      act, vjp, ns = split.client_forward(setup, client, x, mask)
      # the branch's server portion steps with the server's optimiser, the
      # client portion with ``tx`` (setup.client_tx: optim.weight_decay_scope)
      br, g_a, lsum = branch_server(setup, plan.tx, data, br, act, y, mask,
                                    (ridx[k], rmask[k]))
      (g1,) = vjp(g_a)
      br = br._replace(sqsum=br.sqsum + jnp.where(active, 2.0 * sq_norm(g1), 0.0))
      return client.step(tx, g1, ns, active), br, lsum

    return split.PerClientServer(piece)
  return rule


def separate_server_grads(setup: Setup, p2, s2, act, y, mask, ract, yr, rmask):
  """The server portion on the main features, then on the replay features
  (two BatchNorm batches; the statistics updated by both, in that order, the
  second only where the step has replay), and the cross-entropy over the
  concatenated logits, as the authors' code computes it.

  Returns:
    ``(loss, new_stats2, grad w.r.t. p2, grad w.r.t. act)``.
  """
  def loss_fn(p, a):
    logits, mid = setup.model.apply(p, s2, a, start=setup.cut, train=True, mask=mask)
    rlogits, out = setup.model.apply(p, mid, ract, start=setup.cut, train=True,
                                     mask=rmask)
    out = gate(jnp.any(rmask), out, mid)
    return masked_cross_entropy(
        jnp.concatenate([logits, rlogits]), jnp.concatenate([y, yr]),
        jnp.concatenate([mask, rmask])), out

  (loss, ns), (g_p, g_a) = jax.value_and_grad(
      loss_fn, argnums=(0, 1), has_aux=True)(p2, act)
  return loss, ns, g_p, g_a


def pull_back(stacked, alpha):
  """``w_i <- (w_i + alpha mean_j w_j) / (1 + alpha)`` over the leading axis."""
  return jax.tree.map(
      lambda a: ((a + alpha * jnp.mean(a, axis=0, keepdims=True)) / (1.0 + alpha)
                 ).astype(a.dtype), stacked)


def round_bytes(setup: Setup, main_samples, replay_samples, assistants):
  """Bytes ``(up, down)`` of a round (float32; docs/setting.md#metrics).

  Up: every main client's client portion, its activations and labels, and
  the replay features and labels.  Down: every main client's client portion
  and its activation gradients, and per assistant the branch's client
  portion and the per-class request (L int32).
  """
  act = activation_size(setup.model, setup.cut) * 4
  p1 = portion_bytes(setup.model, 0, setup.cut)
  n, L = setup.clients_per_round, setup.num_classes
  f = lambda v: jnp.asarray(v, jnp.float32)
  up = n * p1 + f(main_samples) * (act + LABEL_BYTES) + f(replay_samples) * (
      act + LABEL_BYTES)
  down = n * p1 + f(main_samples) * act + f(assistants) * (p1 + L * LABEL_BYTES)
  return up, down


def finish(setup: Setup, state: State, out: split.SplitRound):
  """Steps 5-6: the pull-back of every branch, the gradient signal and the
  next sampling proportion; the metrics listed in
  docs/methods-multisfl.md#logged-decisions."""
  o, d = out.plan.options, out.plan.context.decisions
  p1, s1 = out.clients.params, out.clients.stats
  p2, s2, opt2 = out.server.server.params, out.server.server.stats, out.server.server.opt
  gsum, sqsum = out.server.gsum, out.server.sqsum
  active = jnp.any(d.mask, axis=2)                             # (T, n)
  counts = jnp.where(active, jnp.sum(d.mask, axis=2) + jnp.sum(d.rmask, axis=2), 0)
  steps = jnp.sum(active, axis=0)                              # (n,)
  fgn_now = fgn(gsum, steps, d.lr)
  g_now = (signal(sqsum, d.lr, setup.local_epochs) if o.grad_signal == "authors"
           else -fgn_now)
  g_hist = push_signal(state.g_hist, g_now)
  delta = windowed_change(g_hist)
  if o.replay != "adaptive":
    p_next = state.p
  elif o.p_rule == "spec":
    p_next = next_proportion(state.p, fgn_now, state.fgn_prev, state.round > 0,
                             o.p_min, o.p_max)
  else:  # the authors' rules; p_max only bounds the static replay buffer
    p_next = (clp_proportion(state.p, delta, o.p_min, o.p_threshold, o.p_step)
              if o.p_rule == "clp" else
              relative_proportion(state.p, delta, state.round, o.p_min, o.p_late_min))
    p_next = jnp.minimum(p_next, o.p_max)
  new = dataclasses.replace(state,
      part1=pull_back(p1, o.alpha), part1_stats=pull_back(s1, o.alpha),
      part2=pull_back(p2, o.alpha), part2_stats=pull_back(s2, o.alpha),
      server_opt=opt2, score_num=d.score_num, score_den=d.score_den,
      p=p_next, fgn_prev=fgn_now, g_hist=g_hist, round=state.round + 1)
  samples = jnp.sum(d.mask)
  replay_samples = jnp.sum(d.rmask)
  assistants = jnp.sum(jnp.any(d.take > 0, axis=2), axis=1)   # (n,)
  if o.comm_accounting == "authors":
    up, down = authors_round_bytes(setup, samples, d.sizes, state.p, jnp.sum(assistants))
  else:
    up, down = round_bytes(setup, samples, jnp.sum(d.served), jnp.sum(assistants))
  metrics = {"loss": jnp.sum(out.loss_sums) / jnp.maximum(jnp.sum(counts), 1),
             "samples": samples, "clients": d.clients,
             "p": state.p, "p_next": p_next, "fgn": fgn_now, "grad_signal": g_now,
             "replay_requested": d.quota, "replay_served": d.served,
             "assistants": assistants, "replay_samples": replay_samples,
             "bytes_up": up, "bytes_down": down}
  return new, metrics


def build(setup: Setup) -> split.SplitRounds:
  """MultiSFL for a run (steps 1-6 of :mod:`jsfl.methods.multisfl`):
  ``clients_per_round`` = n branches; method options ``replay``, ``p0``,
  ``p_min``, ``p_max``, ``gamma``, ``alpha``."""
  alg = split.SplitAlgorithm(server_init=server, server_rule=serve(setup),
                             schedule=split.batch_steps, client_init=branches_part1,
                             client_final=None, plan=plan)
  return split.SplitRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One MultiSFL round (:func:`build`)."""
  return build(setup).round(state, data, key)


def authors_round_bytes(setup: Setup, main_samples, sizes, p, assistants):
  """Bytes ``(up, down)`` of a round as the authors' code counts its traffic:
  every branch's client portion down and up, the main features up and their
  gradients down for every sample of every epoch (no labels), per branch
  the requested ``max(m, int(|D_i| p))`` replay features up every epoch, and
  the client portion down to every assistant every epoch.  Their code adds
  it all into one total; here it is split as it travels."""
  o = options(setup)
  act = activation_size(setup.model, setup.cut) * 4
  p1 = portion_bytes(setup.model, 0, setup.cut)
  n, E = setup.clients_per_round, setup.local_epochs
  f = lambda v: jnp.asarray(v, jnp.float32)
  requested: jax.Array | float = 0.0
  if o.replay != "off":
    requested = jnp.sum(jnp.maximum(f(o.min_request),
                                    jnp.floor(sizes.astype(jnp.float32) * p)))
  up = n * p1 + f(main_samples) * act + requested * E * act
  down = n * p1 + f(main_samples) * act + f(assistants) * E * p1
  return up, down


def output_model(setup: Setup, state: State):
  """The master model: the branch mean (equal to the round's master, since the
  pull-back keeps the mean)."""
  mean = lambda t: jax.tree.map(lambda a: jnp.mean(a, axis=0), t)
  return (mean(state.part1) + mean(state.part2),
          mean(state.part1_stats) + mean(state.part2_stats))


def communication(setup: Setup, samples: int):
  """The replay-free bytes (SFL's); the round's metrics carry the full ones."""
  return split_communication(setup, samples)


METHOD = Method(build, output_model, communication, validate=validate,
                options=MultiSFLOptions)
