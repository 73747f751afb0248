"""The sequential round: FedSeq and every method that is FedSeq with hooks.

Sequential FL (Li & Lyu, "Convergence Analysis of Sequential Federated
Learning on Heterogeneous Data", NeurIPS 2023; docs/methods-sequential.md):
each round puts its n participants in a sequence; client m starts from
client m-1's model and runs ``local_epochs`` epochs of SGD on its data; the
last client's model is the global model.  The round is one program: a
``lax.scan`` over the sequence with a nested loop over that client's live
batch steps (:func:`jsfl.engine.parallel.client_training`, which steps over
none of the empty ones its padded schedule holds).

A method is a :class:`SequentialAlgorithm`, built once per run, whose hooks
receive what they read:

* ``plan(setup, state, data, key)``: the round's plan (default FedSeq's:
  :func:`jsfl.core.plan.plan_round` at ``state.round``); a planner may put
  what it derives for the other hooks in ``RoundPlan.context`` (SFedKD's
  teachers);
* ``client_term(plan, params, batch, client) -> scalar``: the loss term of
  one client on one batch (:class:`~jsfl.engine.parallel.Batch`,
  :class:`~jsfl.engine.parallel.Client`);
* ``client_context(state, plan, seq)``: per-client context, leading axis in
  sequence order (``Client.ctx``);
* ``start_carry(state, plan)`` and ``client_done(plan, params, stats, idx,
  mask, client) -> carry``: a carry threaded along the sequence
  (``Client.carry``), updated once a client has finished (CWC's
  importance);
* ``keep_models``: also return every client's trained model (SFedKD's
  teachers of the next round).

:class:`SequentialRounds` runs it with the method's state and the state a
round leaves.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jsfl.core.data import training_data
from jsfl.core.plan import RoundPlan, plan_round, round_metrics
from jsfl.core.setup import Setup
from jsfl.engine import parallel
from jsfl.engine.orders import cycle_places, processing_orders, run_cycle
from jsfl.engine.parallel import Client, ClientTerm, bound, no_term
from jsfl.engine.steps import StepModels


@struct.dataclass
class State:
  """FedSeq's state: the global model, the run's label cycle (cyclic
  orders) and the round counter."""

  params: tuple
  stats: tuple
  label_rank: jax.Array
  round: jax.Array


def init_state(setup: Setup, key) -> State:
  k_model, k_rank = jax.random.split(key)
  params, stats = setup.model.init(k_model)
  return State(params, stats, run_cycle(setup, k_rank),
               jnp.zeros((), jnp.int32))


def sequence_order(setup: Setup, plan: RoundPlan, data, label_rank):
  """Positions into ``plan.clients`` in training order, ``(n,)`` int32:
  ``random`` a fresh permutation every round, ``fixed`` ascending ids,
  ``cyclic`` / ``cyclic_reverse`` by dominant label in the run's label cycle
  (or in the run's client cycle, ``method.cycle``;
  docs/methods-splitfed.md#processing-order; one pass a round makes both
  the same order)."""
  return processing_orders(setup.order, plan.order_key, 1, plan.clients,
                           cycle_places(setup, data.dominant), label_rank)[0]


def train_sequence(setup: Setup, plan, data, params, stats, seq, *,
                   aux=parallel.zero_aux, ctx=None, carry=None, client_done=None,
                   keep_models: bool = False):
  """Trains the participants one after another, each from the last's model.

  Args:
    setup: static run description.
    plan: the round's plan.
    data: device data.
    params, stats: the model the first client receives.
    seq: ``(n,)`` positions into ``plan.clients``, the training order.
    aux: the round's loss term ``aux(p, batch, client)``
      (:func:`jsfl.engine.parallel.bound`).
    ctx: per-client context, leading axis in *sequence* order, or None.
    carry: a pytree threaded along the sequence (``Client.carry``).
    client_done: ``(params, stats, idx, mask, client) -> carry``, run once a
      client has finished, or None.
    keep_models: also return every client's trained ``(params, stats)``
      stacked in sequence order.

  Returns:
    ``(params, stats, carry, models, sums)``: the last client's model, the
    final carry, the stacked models (None unless ``keep_models``) and
    ``[ce, extra]`` loss sums of the round.
  """
  idx = jnp.swapaxes(plan.idx[:, seq], 0, 1)    # (n, T, B) in sequence order
  mask = jnp.swapaxes(plan.mask[:, seq], 0, 1)

  def body(c, xs):
    p, s, car = c
    i, m, cx = xs
    client = Client(p, s, cx, car)
    p, s, sums = parallel.client_training(setup, plan, data, p, s, i, m, aux, client)
    if client_done is not None:
      car = client_done(p, s, i, m, client)
    return (p, s, car), (sums, (p, s) if keep_models else None)

  (params, stats, carry), (sums, models) = lax.scan(
      body, (params, stats, carry), (idx, mask, ctx))
  return params, stats, carry, models, jnp.sum(sums, axis=0)


def sequence_metrics(plan, seq, sums) -> dict:
  """Mean CE (``loss``), mean extra term (``reg_loss``), samples, and the
  client sequence (``clients``, in training order)."""
  m = round_metrics(plan, sums[0], plan.clients[seq])
  m["reg_loss"] = sums[1] / jnp.maximum(m["samples"], 1)
  return m


class Planner(Protocol):
  def __call__(self, setup, state: Any, data, key: jax.Array) -> RoundPlan: ...


class ClientContext(Protocol):
  def __call__(self, state: Any, plan: RoundPlan, seq: jax.Array) -> Any: ...


class StartCarry(Protocol):
  def __call__(self, state: Any, plan: RoundPlan) -> Any: ...


class ClientDone(Protocol):
  def __call__(self, plan: RoundPlan, params: Any, stats: Any, idx: jax.Array,
               mask: jax.Array, client: Client) -> Any: ...


def plan_at_round(setup, state, data, key) -> RoundPlan:
  """The default planner: :func:`jsfl.core.plan.plan_round` at ``state.round``."""
  return plan_round(setup, data, key, state.round)


@dataclasses.dataclass(frozen=True)
class SequentialAlgorithm:
  """A sequential method's round: FedSeq's with the hooks of the module
  docstring, built once per run."""

  plan: Planner = plan_at_round
  client_term: ClientTerm = no_term
  client_context: ClientContext | None = None
  start_carry: StartCarry | None = None
  client_done: ClientDone | None = None
  keep_models: bool = False


class SequenceRound(NamedTuple):
  """A sequential round's outcome, before the method writes its next state."""

  plan: RoundPlan
  seq: jax.Array      # (n,) the training order (positions into plan.clients)
  params: Any         # the last client's model
  stats: Any
  carry: Any
  models: Any         # every client's model in sequence order, or None
  sums: jax.Array     # [ce, extra] loss sums
  context: Any = None  # what client_context gave the clients


def run_round(alg: SequentialAlgorithm, setup: Setup, state, data, key) -> SequenceRound:
  """One round of a sequential method (the model sequence starts from
  ``state.params`` / ``state.stats``, the order reads ``state.label_rank``)."""
  data = training_data(setup, data, key)
  plan = alg.plan(setup, state, data, key)
  seq = sequence_order(setup, plan, data, state.label_rank)
  ctx = None if alg.client_context is None else alg.client_context(state, plan, seq)
  carry = None if alg.start_carry is None else alg.start_carry(state, plan)
  done = None
  if alg.client_done is not None:
    done = lambda p, s, i, m, client: alg.client_done(plan, p, s, i, m, client)
  params, stats, carry, models, sums = train_sequence(
      setup, plan, data, state.params, state.stats, seq, aux=bound(alg.client_term, plan),
      ctx=ctx, carry=carry, client_done=done, keep_models=alg.keep_models)
  return SequenceRound(plan, seq, params, stats, carry, models, sums, ctx)


def fedseq_finish(setup, state, out: SequenceRound):
  """FedSeq's next state: the last client's model; the sequence's metrics."""
  new = state.replace(params=out.params, stats=out.stats, round=state.round + 1)
  return new, sequence_metrics(out.plan, out.seq, out.sums)


@dataclasses.dataclass(frozen=True)
class SequentialRounds:
  """A sequential method for one run: its :class:`SequentialAlgorithm`, built
  once, the state it starts from and the state a round leaves
  (``finish(setup, state, out) -> (state, metrics)``)."""

  setup: Setup
  algorithm: SequentialAlgorithm
  start: Callable[[Setup, jax.Array], Any] = init_state
  finish: Callable[[Setup, Any, SequenceRound], tuple[Any, dict]] = fedseq_finish

  def init(self, key):
    return self.start(self.setup, key)

  def round(self, state, data, key):
    return self.finish(self.setup, state, run_round(self.algorithm, self.setup, state,
                                                    data, key))

  def watched_round(self, state, data, key, output_model: Callable, steps: int):
    """:meth:`round` that also returns the model after each of the round's
    first ``steps`` clients (``run.step_confusion``; a step is one client's
    training), as :class:`jsfl.engine.steps.StepModels`: ``models``
    ``(steps, ...)``, each
    ``output_model(setup, state)`` of the state the round would leave had
    it ended after that client (zeros past ``num_steps``); ``labels`` the
    dominant label of each step's client (-1 past ``num_steps``).  The
    sequence's models are the ones ``keep_models`` stacks, so the round
    itself is the plain round's."""
    alg = dataclasses.replace(self.algorithm, keep_models=True)
    out = run_round(alg, self.setup, state, data, key)
    new, metrics = self.finish(self.setup, state, out)
    n = out.seq.shape[0]
    count = min(n, steps)

    def after(m):
      p, s = jax.tree.map(lambda a: a[m], out.models)
      return output_model(self.setup, self.finish(self.setup, state,
                                                  out._replace(params=p, stats=s))[0])

    models = lax.map(after, jnp.arange(count))
    if count < steps:
      models = jax.tree.map(
          lambda a: jnp.concatenate([a, jnp.zeros((steps - count,) + a.shape[1:], a.dtype)]),
          models)
    labels = data.dominant[out.plan.clients[out.seq[:count]]].astype(jnp.int32)
    labels = jnp.concatenate([labels, jnp.full((steps - count,), -1, jnp.int32)])
    return new, metrics, StepModels(models, labels, jnp.asarray(count, jnp.int32))


def communication(setup: Setup, samples: int):
  """Each participant downloads the model from its predecessor (via the
  server) and uploads its trained model: one model each way per client."""
  b = setup.clients_per_round * parallel.model_bytes(setup)
  return b, b
