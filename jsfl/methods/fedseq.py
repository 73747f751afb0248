"""FedSeq: sequential FL (Li & Lyu, "Sharper Convergence Guarantees for
Federated Learning with Sequential Training", ICLR 2024), the SFL baseline of
SFedKD (Xu et al., "SFedKD: Sequential Federated Learning with
Discrepancy-Aware Multi-Teacher Knowledge Distillation", Sec. 3.1); docs/methods-sequential.md.

Each round samples n clients without replacement and puts them in a sequence;
client m starts from client m-1's model and runs ``local_epochs`` epochs of
SGD on its data; the last client's model is the global model.  There is no
aggregation.

The round is one jitted program: a ``lax.scan`` over the client sequence with
a nested ``lax.scan`` over that client's padded batch steps (the round's
``plan_round`` tables, masks for ragged and missing batches;
``parallel.train_client``, which skips empty steps with ``lax.cond``).

:func:`sequential_round` is the engine SFedKD and CWC reuse: a loss term
``aux(p, batch, client)`` (``jsfl.engine.parallel.Batch`` / ``Client``),
per-client context, a carry threaded along the sequence and updated by
``after`` once a client is done, and optionally every client's trained model
(SFedKD's teachers of the next round).

Sequence order (``method.order``): ``random`` (default) a fresh random
permutation of the participants every round; ``fixed`` ascending ids;
``cyclic`` / ``cyclic_reverse`` group clients by dominant label in the run's
label cycle (docs/methods-splitfed.md#processing-order; with one pass per round
both are the same order).

Departures: the client optimiser state (momentum) is rebuilt for every
client (each client is a separate party; docs/setting.md#optimisation).  The logged train loss is
the mean cross-entropy over all samples the sequence processed.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct
from jax import lax

from jsfl.core.method import Method, label_rank_of
from jsfl.core.plan import plan_round, round_metrics
from jsfl.core.setup import Setup
from jsfl.engine import parallel
from jsfl.engine.orders import label_rank, processing_orders
from jsfl.engine.parallel import Client, train_client, zero_aux


@struct.dataclass
class State:
  params: tuple
  stats: tuple
  label_rank: jax.Array  # the run's label cycle (cyclic orders)
  round: jax.Array


def init(setup: Setup, key) -> State:
  k_model, k_rank = jax.random.split(key)
  params, stats = setup.model.init(k_model)
  return State(params, stats, label_rank(k_rank, setup.num_classes),
               jnp.zeros((), jnp.int32))


def sequence_order(setup: Setup, plan, data, label_rank):
  """Positions into ``plan.clients`` in training order, ``(n,)`` int32."""
  return processing_orders(setup.order, plan.order_key, 1, plan.clients,
                                  data.dominant, label_rank)[0]


def sequential_round(setup: Setup, plan, data, params, stats, seq, *,
                     aux=zero_aux, ctx=None, carry=None, after=None,
                     keep_models: bool = False):
  """Trains the participants one after another, each from the last's model.

  Args:
    setup: static run description.
    plan: the round's plan.
    data: device data.
    params, stats: the model the first client receives.
    seq: ``(n,)`` positions into ``plan.clients``, the training order.
    aux: loss term ``aux(p, batch, client)``.
    ctx: per-client context, leading axis in *sequence* order, or None.
    carry: a pytree threaded along the sequence (``Client.carry``).
    after: ``after(params, stats, idx, mask, client) -> carry``, run once a
      client has finished (e.g. CWC's Fisher accumulation), or None.
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
    p, s, sums = train_client(setup, plan, data, p, s, i, m, aux, client)
    if after is not None:
      car = after(p, s, i, m, client)
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


def round(setup: Setup, state: State, data, key):
  """One FedSeq round.

  Args:
    setup: static run description.
    state: :class:`State`.
    data: the round's ``RoundData``.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``; metrics ``loss``, ``reg_loss`` (0), ``samples`` and
    ``clients`` (the sequence, in training order).
  """
  plan = plan_round(setup, data, key, state.round)
  seq = sequence_order(setup, plan, data, state.label_rank)
  params, stats, _, _, sums = sequential_round(setup, plan, data, state.params,
                                               state.stats, seq)
  new = State(params, stats, state.label_rank, state.round + 1)
  return new, sequence_metrics(plan, seq, sums)


def output_model(setup: Setup, state: State):
  return state.params, state.stats


def communication(setup: Setup, samples: int):
  """Each participant downloads the model from its predecessor (via the
  server) and uploads its trained model: one model each way per client."""
  b = setup.clients_per_round * parallel.model_bytes(setup)
  return b, b


METHOD = Method(init, round, output_model, communication, label_rank=label_rank_of)
