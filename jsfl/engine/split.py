"""The split round: one engine for every split-learning method.

A round of split learning has the same skeleton in every method of the
family: the round's participants and batches are drawn (``plan_round``);
then, per batch step, every participant's client portion (part-1) runs
forward in one program, the server turns the cut-layer activations into
activation gradients, and every participant runs part-1 backward and steps
its optimiser; at the end the trained client portions are aggregated.  What
differs between methods is a handful of hooks:

* the **server rule** ``serve(server, acts, y, mask, order) -> (server,
  g_acts, loss_sum)``: one sequential server portion (:func:`sequential`,
  SFL), a merged batch (:func:`merged`, MergeSFL), a server copy per client
  (:func:`parallel`, SplitFedV1/V3); its ``server`` carry is any pytree
  (SFL's part-2, Hydra's part-2a and stacked heads, ...);
* the **server loss** (:func:`server_update`'s ``loss``: cross-entropy by
  default, FedNTD's distillation loss, label smoothing, ...);
* the clients' **start** portions (broadcast global part-1 by default;
  FedMut's mutated copies, SplitFedV3's own per-client copies);
* the **aggregation** of the trained client portions (sample-weighted mean
  by default; FedExp's extrapolation; none for per-client portions).

Every optimiser step is gated on the batch mask through :class:`Portion`, so
a participant without data at a step (or a server serving an empty batch)
leaves parameters, BatchNorm statistics and optimiser state untouched.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jsfl.core import batching
from jsfl.core.clients import map_clients
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.plan import plan_round, round_metrics
from jsfl.core.portion import Portion, fresh_stack
from jsfl.core.trees import broadcast, weighted_mean
from jsfl.engine import schedule
from jsfl.engine.steps import scan_live


# ----------------------------------------------------------- server losses
def cross_entropy(logits, y, mask):
  """The default server loss: ``(mean cross-entropy, reported loss, extra)``."""
  ce = masked_cross_entropy(logits, y, mask)
  return ce, ce, jnp.zeros((), jnp.float32)


def server_grads(setup, params, stats, act, y, mask, loss=cross_entropy):
  """A server portion's loss on one batch of activations and its gradients.

  Returns:
    ``(reported, extra, new stats, grad w.r.t. params, grad w.r.t. act)``;
    ``loss`` as for :func:`server_update`.
  """
  def objective(p, a):
    logits, ns = setup.model.apply(p, stats, a, start=setup.cut, train=True, mask=mask)
    obj, reported, extra = loss(logits, y, mask)
    return obj, (ns, reported, extra)

  (_, (ns, reported, extra)), (g_p, g_a) = jax.value_and_grad(
      objective, argnums=(0, 1), has_aux=True)(params, act)
  return reported, extra, ns, g_p, g_a


def server_update(setup, tx, server: Portion, act, y, mask, loss=cross_entropy):
  """One update of a single server portion on one batch of activations.

  Args:
    setup: static run description (model and cut).
    tx: the optimiser.
    server: the server portion (stages ``[cut, end)``).
    act, y, mask: the cut-layer activations, labels and mask.
    loss: ``(logits, y, mask) -> (objective, reported, extra)``: the
      objective is differentiated; ``reported`` (the loss metric) and
      ``extra`` (a second per-sample quantity, e.g. a regulariser) are
      accumulated as sums over samples.

  Returns:
    ``(server, gradient w.r.t. act, reported sum, extra sum)``; a no-op on
    an empty batch.
  """
  reported, extra, ns, g_p, g_a = server_grads(setup, server.params, server.stats, act,
                                               y, mask, loss)
  count = jnp.sum(mask)
  return server.step(tx, g_p, ns, jnp.any(mask)), g_a, reported * count, extra * count


# -------------------------------------------------------------- server rules
def skip_idle(one: Callable) -> Callable:
  """``one`` run only when its batch mask has a sample (``lax.cond``).

  A server step on an empty batch changes nothing, so the idle side returns
  the carry, a zero activation gradient and a zero loss.  Where the cond is
  a real branch (a rolled scan, looped clients) the padded steps of small
  clients cost nothing; under vmap it is a select with the same values.
  """
  def run(srv, act, y, m, k):
    idle = lambda: (srv, jnp.zeros_like(act), jnp.zeros((), jnp.float32))
    return lax.cond(jnp.any(m), lambda: one(srv, act, y, m, k), idle)
  return run


def sequential(one: Callable, unroll: int = 1) -> Callable:
  """One server carry updated participant after participant in ``order``.

  ``one(server, act, y, mask, k) -> (server, g_act, loss_sum)`` serves
  participant ``k``; the activation gradients come back in participant order.
  """
  def serve(server, acts, y, mask, order):
    def visit(srv, k):
      srv, g_a, lsum = skip_idle(one)(srv, acts[k], y[k], mask[k], k)
      return srv, (g_a, lsum)

    server, (g_ordered, lsums) = lax.scan(visit, server, order, unroll=unroll)
    return server, jnp.zeros_like(g_ordered).at[order].set(g_ordered), jnp.sum(lsums)
  return serve


def merged(one: Callable, per_client_mean: bool = False) -> Callable:
  """The participants' batches as one server batch (one update a step).

  ``per_client_mean``: each participant gets the gradient of its own batch's
  mean loss (the merged mean's gradient times ``merged samples / its
  samples``), as the Hydra authors' MergeSFL sends it; else its share of the
  merged mean's gradient.
  """
  def serve(server, acts, y, mask, order):
    flat = lambda a: a.reshape((-1,) + a.shape[2:])
    server, g, lsum = one(server, flat(acts), flat(y), flat(mask), None)
    g = g.reshape(acts.shape)
    if per_client_mean:
      own = jnp.sum(mask, axis=1).astype(g.dtype)
      scale = jnp.sum(own) / jnp.maximum(own, 1.0)
      g = g * scale.reshape((-1,) + (1,) * (g.ndim - 1))
    return server, g, lsum
  return serve


class PerParticipant(NamedTuple):
  """A server rule with a server carry per participant (leading axis n),
  served side by side (SplitFedV1/V3's part-2 copies, MultiSFL's branches).

  The participants are independent within a step, so the split round runs
  each one's whole step in one piece (:func:`participant_steps`): part-1
  forward, ``one``, part-1 backward and both updates, and with looped
  clients skips the piece outright for a participant without a batch.

  ``one(server_k, act, y, mask, inputs_k) -> (server_k, g_act, loss_sum)``
  serves participant k; ``inputs`` is a pytree with a leading participant
  axis whose slices reach ``one`` (None: the participant's position).
  ``client_grads(server_k, g1_k, active) -> server_k`` lets the server carry
  see the participant's part-1 gradient (MultiSFL's gradient signal).
  """

  one: Callable
  inputs: Any = None
  client_grads: Callable | None = None


def parallel(one: Callable, inputs=None, client_grads: Callable | None = None
             ) -> PerParticipant:
  """A server carry per participant, served side by side (see
  :class:`PerParticipant`)."""
  return PerParticipant(one, inputs, client_grads)


# ---------------------------------------------------------------- the round
class Step(NamedTuple):
  """One batch step's inputs, for server rules that need more than the
  activations (FedNTD's teacher sees the raw inputs; MultiSFL's replay reads
  its per-step shares and the client portions)."""

  x: jax.Array      # (n, B, ...) normalised inputs
  y: jax.Array      # (n, B) labels
  idx: jax.Array    # (n, B) sample indices
  mask: jax.Array   # (n, B)
  extra: Any = None     # this step's slice of ``split_round``'s ``step_inputs``
  clients: Any = None   # the client portions before the step (a Portion)


def participant_steps(setup, tx, clients: Portion, server, step: Step,
                      rule: PerParticipant):
  """One batch step under a :class:`PerParticipant` rule: every participant's
  forward, server update, backward and gated client step in one piece,
  mapped over the participants (``client_exec``); with looped clients a
  participant without a batch skips its piece (``lax.cond``), which is what
  makes the padded steps of small Dirichlet clients free on the CPU.

  Returns:
    ``(clients, server, loss_sum)``.
  """
  n = step.mask.shape[0]
  inputs = jnp.arange(n) if rule.inputs is None else rule.inputs

  def piece(client: Portion, srv, x, y, m, k):
    active = jnp.any(m)
    act, vjp_fn, ns = jax.vjp(
        lambda p: setup.model.apply(p, client.stats, x, train=True, mask=m),
        client.params, has_aux=True)
    srv, g_a, lsum = rule.one(srv, act, y, m, k)
    (g1,) = vjp_fn(g_a)
    if rule.client_grads is not None:
      srv = rule.client_grads(srv, g1, active)
    return client.step(tx, g1, ns, active), srv, lsum

  def piece_or_idle(client, srv, x, y, m, k):
    if setup.client_exec == "vmap":
      return piece(client, srv, x, y, m, k)
    idle = lambda: (client, srv, jnp.zeros((), jnp.float32))
    return lax.cond(jnp.any(m), lambda: piece(client, srv, x, y, m, k), idle)

  clients, server, lsums = map_clients(piece_or_idle, setup.client_exec, clients, server,
                                       step.x, step.y, step.mask, inputs)
  return clients, server, jnp.sum(lsums)


def batch_step(setup, tx, clients: Portion, server, step: Step, order, serve):
  """One batch step: part-1 forward of all clients, the server rule, part-1
  backward and a gated step of every client that had a batch
  (:func:`participant_steps` for a :class:`PerParticipant` rule).

  Returns:
    ``(clients, server, loss_sum)``.
  """
  if isinstance(serve, PerParticipant):
    return participant_steps(setup, tx, clients, server, step, serve)
  has = jnp.any(step.mask, axis=1)

  def part1(pp, s, xx, m):
    run = lambda: setup.model.apply(pp, s, xx, train=True, mask=m)
    if setup.client_exec == "vmap":
      return run()
    # Looped clients: a client without a batch skips its forward (and so its
    # backward); its output is discarded by the gated step.
    act = jax.eval_shape(run)[0]
    return lax.cond(jnp.any(m), run, lambda: (jnp.zeros(act.shape, act.dtype), s))

  forward = lambda p: map_clients(part1, setup.client_exec, p, clients.stats, step.x,
                                  step.mask)
  acts, vjp_fn, new_stats = jax.vjp(forward, clients.params, has_aux=True)
  server, g_acts, lsum = serve(server, acts, step.y, step.mask, order)
  (g1,) = vjp_fn(g_acts)
  clients = jax.vmap(lambda c, g, s, a: c.step(tx, g, s, a))(clients, g1, new_stats, has)
  return clients, server, lsum


class SplitRound(NamedTuple):
  """A split round's outcome, before the method writes its next state."""

  plan: Any              # RoundPlan
  orders: jax.Array      # (S, n) processing order of every segment (schedule.py)
  clients: Portion       # (n, ...) trained client portions
  part1: Any             # aggregated part-1 params (None: not aggregated)
  part1_stats: Any
  server: Any            # the server carry after the round
  loss_sums: jax.Array   # (S,)


def sample_weighted(clients: Portion, plan):
  """The sample-weighted mean of the trained client portions (FedAvg's)."""
  return (weighted_mean(clients.params, plan.sizes),
          weighted_mean(clients.stats, plan.sizes))


def uniform(clients: Portion, plan):
  """The plain mean of the trained client portions."""
  w = jnp.ones_like(plan.sizes, jnp.float32)
  return weighted_mean(clients.params, w), weighted_mean(clients.stats, w)


def split_round(setup, state, data, key, *, server: Callable, serve: Callable,
                starts: Callable | None = None,
                aggregate: Callable | None = sample_weighted,
                label_rank=None, plan=None, step_inputs=None,
                copies: int = 1) -> SplitRound:
  """One round of a split method.

  Args:
    setup: static run description.
    state: the method's state; ``round`` is read, and ``part1`` /
      ``part1_stats`` when ``starts`` is None.
    data: device data.
    key: the round's PRNG key.
    server: ``plan -> server carry`` at the start of the round.
    serve: ``(plan, step) -> server rule`` of a batch step: from
      :func:`sequential` or :func:`merged`, or any function of their
      signature ``(server, acts, y, mask, order) -> (server, g_acts,
      loss_sum)``; or a :class:`PerParticipant` from :func:`parallel`.
    starts: ``plan -> Portion`` of the participants' starting client
      portions (leading axis n); None broadcasts the global part-1 with
      fresh optimiser states.
    aggregate: ``(clients, plan) -> (part1, part1_stats)``; None leaves the
      trained portions unaggregated (``SplitRound.clients`` holds them).
    label_rank: the run's label cycle: the server's schedule follows
      ``setup.order`` under ``setup.order_rule`` (:mod:`jsfl.engine.schedule`);
      None serves participants batch step by batch step in ascending id
      order (servers that are not sequential).
    plan: the round's ``RoundPlan`` when the method draws it itself
      (MultiSFL assigns participants to branches); None draws it from
      ``key``.
    copies: part-1 copies per participant, used round robin over its
      batches (its j-th batch of the round trains copy ``j mod copies``; all
      start from the same portion); ``SplitRound.clients`` then has a copy
      axis after the participant axis (MergeSFL in the Hydra authors' code).
    step_inputs: a pytree with a leading batch-step axis; each step's slice
      reaches the server rule as ``Step.extra`` (MultiSFL's replay shares;
      only with ``label_rank=None``, where segments are batch steps).

  Returns:
    :class:`SplitRound`.
  """
  if plan is None:
    plan = plan_round(setup, data, key, state.round)
  n, num_steps = setup.clients_per_round, plan.idx.shape[0]
  if label_rank is None:
    sched = schedule.steps(jnp.broadcast_to(jnp.arange(n, dtype=jnp.int32),
                                            (num_steps, n)))
  else:
    if step_inputs is not None:
      raise ValueError("step_inputs need the batch-step schedule (label_rank=None)")
    sched = schedule.round_schedule(setup, plan.order_key, plan.mask, plan.clients,
                                    data["dominant"], label_rank)
  if starts is None:
    clients = fresh_stack(plan, broadcast(state.part1, n),
                          broadcast(state.part1_stats, n))
  else:
    clients = starts(plan)

  who = jnp.arange(n)
  has = jnp.any(plan.mask, axis=2)  # (T, n)
  if copies > 1:
    clients = jax.tree.map(
        lambda a: jnp.broadcast_to(a[:, None], (n, copies) + a.shape[1:]), clients)
    nth = jnp.cumsum(has, axis=0) - 1  # a step's batch is the participant's nth
    copy = nth[jnp.maximum(sched.src, 0), who] % copies
  else:
    copy = jnp.zeros_like(sched.src)

  def one_step(carry, segment):
    src, order, k, extra = segment
    idx = plan.idx[jnp.maximum(src, 0), who]
    mask = plan.mask[jnp.maximum(src, 0), who] & (src >= 0)[:, None]
    x, y = batching.gather(data, idx)
    stack, srv = carry
    current = stack if copies == 1 else jax.tree.map(lambda a: a[who, k], stack)
    step = Step(x, y, idx, mask, extra, current)
    current, srv, lsum = batch_step(setup, plan.tx, current, srv, step, order,
                                    serve(plan, step))
    if copies > 1:
      current = jax.tree.map(lambda a, v: a.at[who, k].set(v), stack, current)
    return (current, srv), lsum

  live = jnp.any(has[jnp.maximum(sched.src, 0), who] & (sched.src >= 0), axis=1)
  (clients, srv), lsums = scan_live(
      one_step, (clients, server(plan)), (sched.src, sched.order, copy, step_inputs), live)
  part1, stats1 = aggregate(clients, plan) if aggregate else (None, None)
  return SplitRound(plan, sched.order, clients, part1, stats1, srv, lsums)


def metrics(out: SplitRound) -> dict:
  """The split family's metrics: mean loss, samples, and the participants in
  the first batch step's processing order."""
  return round_metrics(out.plan, out.loss_sums, out.plan.clients[out.orders[0]])
