"""The parallel round: FedAvg and every method that is FedAvg with hooks.

FedAvg (McMahan et al., "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017): every participant trains the whole
model from the global one for ``local_epochs`` epochs and the server takes the
sample-weighted mean (``method.aggregation = "uniform"``: one weight a
client).  FedProx, FedCurv and FedNTD (the parallel baselines of SFedKD's
paper) are the same round whose clients minimise ``CE + term``: a
method is a :class:`ParallelAlgorithm`, built once per run, whose hooks
receive what they read:

* ``client_term(plan, params, batch, client) -> scalar``: the extra loss
  term of one client on one batch (batch-mean, like the cross-entropy),
  differentiated with it (:class:`Batch`, :class:`Client`);
* ``client_context(state, plan) -> pytree``: per-client context with a
  leading client axis (e.g. FedCurv's Fisher sums without the client's own
  term), the ``ctx`` of each :class:`Client`;
* ``next_extra(state, plan, params, stats, data) -> extra``: the method
  state carried to the next round (``State.extra``), computed from the
  clients' trained models.

With no hooks the round is FedAvg (``jsfl.methods.fedavg``).
:func:`client_training` (one client's local epochs), :class:`Batch` and
:class:`Client` are shared with the sequential engine
(:mod:`jsfl.engine.sequential`).

Loop order (``exec.client_exec``), the same values either way since clients
are independent within a round:

* ``vmap``: batch steps outer (a ``lax.scan`` that stops after the round's
  last step with data), the participants vmapped inside each step; on an
  accelerator this fills the device with all clients at once;
* ``map`` / ``unroll``: clients outer (a rolled ``lax.map`` or an unrolled
  loop), each client looping (``lax.fori_loop``) over only its live batch
  steps, taken live-first, so the empty padded ones are never run; on a
  CPU, under skewed partitions, a small client's padded steps then cost
  nothing (the measurement behind the CPU
  default is in ``benchmarks/README.md``, ``multisfl_vs_authors.py``).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jsfl.core.clients import map_clients
from jsfl.core.data import gather, training_data
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.method import portion_bytes, whole_model
from jsfl.core.optim import with_lr
from jsfl.core.plan import RoundPlan, fresh_opt_states, plan_round, round_metrics
from jsfl.core.portion import Portion
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast, weighted_mean
from jsfl.engine.steps import live_first, live_steps, scan_live


@struct.dataclass
class State:
  """Global model, round counter and the method's own state (``extra``)."""

  params: tuple
  stats: tuple
  round: jax.Array
  extra: Any = ()


class Batch(NamedTuple):
  """One client batch as a loss term sees it."""

  x: jax.Array        # (B, H, W, C) normalised inputs
  y: jax.Array        # (B,) labels
  mask: jax.Array     # (B,) valid samples
  logits: jax.Array   # (B, L) the training model's logits on x
  idx: jax.Array      # (B,) the samples' indices into the train set


class Client(NamedTuple):
  """What a loss term may depend on besides the parameters and the batch."""

  start: Any          # the params the client started from (the global model)
  start_stats: Any    # and their BatchNorm statistics
  ctx: Any = None     # this client's slice of the method's context
  carry: Any = None   # a sequential method's carry along the client sequence


def zero_aux(p, batch: Batch, client: Client):
  """No loss term (a bound term's form: ``(params, batch, client)``)."""
  del p, batch, client
  return jnp.zeros((), jnp.float32)


class ClientTerm(Protocol):
  def __call__(self, plan: RoundPlan, params: Any, batch: Batch,
               client: Client) -> jax.Array: ...


class ClientContext(Protocol):
  def __call__(self, state: Any, plan: RoundPlan) -> Any: ...


class NextExtra(Protocol):
  def __call__(self, state: Any, plan: RoundPlan, params: Any, stats: Any,
               data: Any) -> Any: ...


def no_term(plan: RoundPlan, params: Any, batch: Batch, client: Client) -> jax.Array:
  """FedAvg's loss term: none."""
  del plan
  return zero_aux(params, batch, client)


def bound(term: ClientTerm, plan: RoundPlan):
  """``term`` for one round: ``(params, batch, client) -> scalar``."""
  if term is no_term:
    return zero_aux
  return lambda p, batch, client: term(plan, p, batch, client)


def client_loss(setup: Setup, params, stats, x, y, mask, aux, client: Client | None, idx):
  """Cross-entropy plus the method's term on one batch, training mode.

  Args:
    setup: static run description.
    params, stats: the client's model.
    x, y, mask: the batch (``mask`` marks valid samples).
    idx: the batch's sample indices (for terms that cache per-sample values).
    aux: the loss term (``zero_aux`` for none).
    client: see :class:`Client`.

  Returns:
    ``(total, (new_stats, ce, extra))``; ``ce`` and ``extra`` are batch means.
  """
  logits, new_stats = setup.model.apply(params, stats, x, train=True, mask=mask)
  ce = masked_cross_entropy(logits, y, mask)
  extra = aux(params, Batch(x, y, mask, logits, idx), client)
  return ce + extra, (new_stats, ce, extra)


def local_step(setup: Setup, tx, data, params, stats, opt_state, idx, mask,
               aux=zero_aux, client: Client | None = None):
  """One SGD step of one client on its batch; skipped if the batch is empty.

  The gated form of a step (computes, then keeps the old values where the
  batch is empty), for callers that vmap clients per batch step.

  Returns:
    ``(params, stats, opt_state, sums)`` with ``sums = [ce, extra] * valid``
    (loss sums over the batch's valid samples).
  """
  x, y = gather(data, idx)
  active = jnp.any(mask)
  (_, (new_stats, ce, extra)), grads = jax.value_and_grad(
      lambda p: client_loss(setup, p, stats, x, y, mask, aux, client, idx),
      has_aux=True)(params)
  new = Portion(params, stats, opt_state).step(tx, grads, new_stats, active)
  params, stats, opt_state = new.params, new.stats, new.opt
  return params, stats, opt_state, jnp.stack([ce, extra]) * jnp.sum(mask)


def client_training(setup: Setup, plan, data, params, stats, idx, mask,
                    aux=zero_aux, client: Client | None = None):
  """One client's local epochs: its live batch steps among its ``T`` padded ones.

  Every epoch of a client smaller than the widest ends in empty batches
  (:func:`jsfl.core.batching.epoch_batches`), which are no-ops.  The loop
  takes the client's live steps in their order and stops after the last
  one, instead of stepping over the empty ones: under a vmap (seeds, or
  clients) a per-step ``lax.cond`` would run them all as selects, most of
  the work of a round over unequal clients (an ExDir(2, 0.5) client of
  Fashion-MNIST has a sixth of the widest one's steps on average).  Under a
  vmap the loop runs to the batch's longest client.  The optimiser state is
  fresh (docs/setting.md#optimisation).

  Args:
    setup: static run description.
    plan: the round's plan (optimiser, learning rate).
    data: device data.
    params, stats: the model the client receives.
    idx, mask: ``(T, B)`` its batches (``local_epochs`` epochs concatenated).
    aux: the round's loss term ``aux(p, batch, client)`` (:func:`bound`).
    client: what ``aux`` may use (see :class:`Client`).

  Returns:
    ``(params, stats, sums)`` with ``sums = [ce, extra]`` loss sums over the
    client's processed samples.
  """
  opt = with_lr(plan.tx.init(params), plan.lr)
  live = live_steps(mask)
  order = live_first(mask)

  def step(k, carry):
    (p, s, o), sums = carry
    t = order[k]
    i, m = idx[t], mask[t]
    x, y = gather(data, i)
    (_, (ns, ce, extra)), g = jax.value_and_grad(
        lambda q: client_loss(setup, q, s, x, y, m, aux, client, i), has_aux=True)(p)
    updates, o = plan.tx.update(g, o, p)
    p = jax.tree.map(jnp.add, p, updates)
    # each step's sums at its own row, so the round's sum adds what a scan
    # over all T steps would
    return (p, ns, o), sums.at[t].set(jnp.stack([ce, extra]) * jnp.sum(m))

  (params, stats, _), sums = lax.fori_loop(
      0, jnp.sum(live), step, ((params, stats, opt), jnp.zeros((idx.shape[0], 2), jnp.float32)))
  return params, stats, jnp.sum(sums, axis=0)


def _steps_outer(setup: Setup, plan, data, params, stats, aux=zero_aux,
                 ctx=None, start=None):
  """All participants' local training, batch steps outer, clients vmapped
  per step (``client_exec = "vmap"``); arguments as :func:`participants_training`."""
  if start is None:
    start = jax.tree.map(lambda a: a[0], (params, stats))
  opt = fresh_opt_states(plan, params)
  # Each client's live steps first, in their order (clients are independent
  # within a parallel round, so which of their steps share a vmapped step
  # changes nothing): the loop ends after the longest participant's live
  # steps, not after the last epoch of the widest one's schedule, where every
  # epoch of a smaller client ends in empty steps (client_training).
  order = live_first(plan.mask)[:, :, None]
  idx = jnp.take_along_axis(plan.idx, order, axis=0)
  mask = jnp.take_along_axis(plan.mask, order, axis=0)

  def step(carry, batch):
    p, s, o = carry
    i, m = batch
    p, s, o, sums = map_clients(
        lambda pp, ss, oo, ii, mm, c: local_step(setup, plan.tx, data, pp, ss, oo, ii, mm,
                                                 aux, Client(start[0], start[1], c)),
        setup.client_exec, p, s, o, i, m, ctx)
    return (p, s, o), jnp.sum(sums, axis=0)

  (params, stats, _), sums = scan_live(step, (params, stats, opt), (idx, mask), live_steps(mask))
  return params, stats, jnp.sum(sums, axis=0)


def _clients_outer(setup: Setup, plan, data, params, stats, aux=zero_aux,
                   ctx=None, start=None):
  """All participants' local training from their stacked starting models.

  Clients are the outer loop (``map_clients`` with ``setup.client_exec``)
  and each runs :func:`client_training` over its own batch steps; clients are
  independent within a parallel round, so this equals FedAvg's
  steps-outer / clients-inner order.  With ``client_exec = "map"`` the
  padded steps of small clients are skipped (on a 2-core CPU with ExDir
  client sizes this is ~4x faster than vmapping the clients per step).

  Args:
    setup: static run description.
    plan: the round's :class:`~jsfl.core.plan.RoundPlan`.
    data: device data.
    params, stats: stacked (leading client axis) starting models.
    aux: loss term (see module docstring).
    ctx: per-client context with a leading client axis, or None.
    start: ``(params, stats)`` of the global model the clients received
      (``Client.start``); None takes client 0's.

  Returns:
    ``(params, stats, sums)``: trained stacked models and ``[ce, extra]``
    loss sums over the round.
  """
  if start is None:
    start = jax.tree.map(lambda a: a[0], (params, stats))
  idx = jnp.swapaxes(plan.idx, 0, 1)    # (n, T, B)
  mask = jnp.swapaxes(plan.mask, 0, 1)

  def one(p, s, i, m, c):
    return client_training(setup, plan, data, p, s, i, m, aux,
                           Client(start[0], start[1], c))

  params, stats, sums = map_clients(one, setup.client_exec, params, stats, idx,
                                    mask, ctx)
  return params, stats, jnp.sum(sums, axis=0)


def participants_training(setup: Setup, plan, data, params, stats, aux=zero_aux, ctx=None,
                          start=None):
  """The participants' local training in the client loop ``client_exec``
  asks for: steps outer with the clients vmapped per step (``vmap``), or
  clients outer (``map`` / ``unroll``); the same values either way.

  Args:
    setup: static run description.
    plan: the round's :class:`~jsfl.core.plan.RoundPlan`.
    data: device data.
    params, stats: stacked (leading client axis) starting models.
    aux: the round's loss term (:func:`bound`).
    ctx: per-client context with a leading client axis, or None.
    start: ``(params, stats)`` of the global model the clients received
      (``Client.start``); None takes client 0's.

  Returns:
    ``(params, stats, sums)``: trained stacked models and ``[ce, extra]``
    loss sums over the round.
  """
  train = _steps_outer if setup.client_exec == "vmap" else _clients_outer
  return train(setup, plan, data, params, stats, aux, ctx, start)


@dataclasses.dataclass(frozen=True)
class ParallelAlgorithm:
  """A parallel method's round: FedAvg's with the hooks of the module
  docstring, built once per run."""

  client_term: ClientTerm = no_term
  client_context: ClientContext | None = None
  next_extra: NextExtra | None = None


def run_round(alg: ParallelAlgorithm, setup: Setup, state: State, data, key):
  """One FedAvg-style round with the method's hooks.

  Args:
    alg: the method's hooks.
    setup: static run description.
    state: :class:`State`.
    data: the round's ``RoundData``.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``: the clients' average model (``plan.weights``); metrics ``loss``
    (mean cross-entropy), ``reg_loss`` (mean extra term), ``samples``,
    ``clients``.
  """
  data = training_data(setup, data, key)
  plan = plan_round(setup, data, key, state.round)
  n = setup.clients_per_round
  params = broadcast(state.params, n)
  stats = broadcast(state.stats, n)
  ctx = None if alg.client_context is None else alg.client_context(state, plan)
  params, stats, sums = participants_training(setup, plan, data, params, stats,
                                              bound(alg.client_term, plan), ctx,
                                              (state.params, state.stats))
  extra = (state.extra if alg.next_extra is None
           else alg.next_extra(state, plan, params, stats, data))
  new = State(weighted_mean(params, plan.weights),
              weighted_mean(stats, plan.weights), state.round + 1, extra)
  metrics = round_metrics(plan, sums[0])
  metrics["reg_loss"] = sums[1] / jnp.maximum(metrics["samples"], 1)
  return new, metrics


@dataclasses.dataclass(frozen=True)
class ParallelRounds:
  """A parallel method for one run: its :class:`ParallelAlgorithm`, built
  once, and the state it starts from (``start(setup, key)``)."""

  setup: Setup
  algorithm: ParallelAlgorithm
  start: Callable[[Setup, jax.Array], State]

  def init(self, key):
    return self.start(self.setup, key)

  def round(self, state, data, key):
    return run_round(self.algorithm, self.setup, state, data, key)


def init_state(setup: Setup, key, extra=()) -> State:
  params, stats = setup.model.init(key)
  return State(params, stats, jnp.zeros((), jnp.int32), extra)


def model_bytes(setup: Setup) -> int:
  """Whole model with BatchNorm statistics, in bytes."""
  return portion_bytes(setup.model, 0, setup.model.num_stages)


def params_bytes(setup: Setup) -> int:
  """The model's parameters alone, in bytes: the size of a per-parameter
  tensor such as a Fisher diagonal (no BatchNorm statistics)."""
  return portion_bytes(setup.model, 0, setup.model.num_stages, stats=False)


output_model = whole_model


def communication(setup: Setup, samples: int):
  """Whole model (with BN statistics) down and up per participant."""
  b = setup.clients_per_round * model_bytes(setup)
  return b, b
