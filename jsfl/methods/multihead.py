"""MultiHead FL: Chen et al., "Flexibility and Privacy: A Multi-Head Federated
Continual Learning Framework for Dynamic Edge Environments", CANDAR 2023, as
adapted by Hydra (AAAI 2026, Appendix B) for its comparison.  docs/methods-splitfed.md.

FL (each participant trains the whole model for ``local_epochs`` epochs, the
parallel engine's local training, ``jsfl.engine.parallel.participants_training``)
with the model cut at ``head_cut``: the body,
stages ``[0, head_cut)``, is averaged at round end (``method.aggregation``); the head,
stages ``[head_cut, end)``, is kept per client.  The state holds all ``K``
heads stacked on a leading client axis; a round gathers the participants'
heads by client id and scatters them back, so non-participants' heads are
unchanged.

Inference (:func:`predict`, Hydra Eq. 5): the body, then every client's
head; per sample the logits of the head with the largest max-logit (ties: the
lowest client id).

Decisions the paper leaves open:

* ``head_cut`` (method option) defaults to the model's Hydra head cut
  (``model.default_head_cut``), the "heads = last layers" split Hydra uses.
* Heads belong to clients (Hydra's "per-client heads kept"), not to tasks as
  in Chen et al.'s continual-learning setting; all ``K`` start from the same
  initial head.
* The client optimiser state lives one round (docs/setting.md#optimisation), heads included.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.data import training_data
from jsfl.core.method import Functions, Method, portion_bytes
from jsfl.core.plan import plan_round, round_metrics
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast, put_rows, take_rows, weighted_mean
from jsfl.engine import parallel
from jsfl.engine.outputs import max_logit_select
from jsfl.options import option, option_set


# -1 is the sentinel; its ``validate`` checks the cut against the model's stages.
@option_set
class MultiHeadOptions:
  head_cut: int = option(-1, "first stage of the per-client heads; -1 = the model's "
                         "default_head_cut", range="[-1, 10000]")


@struct.dataclass
class State:
  body: tuple           # shared stages [0, head_cut)
  body_stats: tuple
  heads: tuple          # every client's stages [head_cut, end), leading axis K
  heads_stats: tuple
  round: jax.Array


def head_cut(setup: Setup) -> int:
  """The resolved, validated ``head_cut`` option."""
  h = setup.options.head_cut
  h = setup.model.default_head_cut if h == -1 else h
  return setup.model.check_cut(h, "method.head_cut")


def validate(setup: Setup) -> None:
  """Checks ``head_cut`` before anything is written (``Method.validate``)."""
  head_cut(setup)


def init(setup: Setup, key) -> State:
  params, stats = setup.model.init(key)
  h, k = head_cut(setup), setup.num_clients
  return State(params[:h], stats[:h], broadcast(params[h:], k),
               broadcast(stats[h:], k), jnp.zeros((), jnp.int32))


def round(setup: Setup, state: State, data, key):
  """One MultiHead round.

  Args:
    setup: static run description (option ``head_cut``).
    state: see :class:`State`.
    data: the round's ``RoundData``.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)`` with ``loss``, ``samples`` and ``clients``
    (participants, ascending).
  """
  data = training_data(setup, data, key)
  plan = plan_round(setup, data, key, state.round)
  n, h = setup.clients_per_round, head_cut(setup)
  params = (broadcast(state.body, n)
            + take_rows(state.heads, plan.clients))
  stats = (broadcast(state.body_stats, n)
           + take_rows(state.heads_stats, plan.clients))
  # a client's whole model trains locally, as in FedAvg; only the body is averaged
  params, stats, sums = parallel.participants_training(setup, plan, data, params, stats)
  new = dataclasses.replace(state,
      body=weighted_mean(params[:h], plan.weights),
      body_stats=weighted_mean(stats[:h], plan.weights),
      heads=put_rows(state.heads, plan.clients, params[h:]),
      heads_stats=put_rows(state.heads_stats, plan.clients, stats[h:]),
      round=state.round + 1)
  return new, round_metrics(plan, sums[0])


def predict(setup: Setup, state: State, x):
  """Body once, then max-logit selection over all ``K`` heads."""
  h = head_cut(setup)
  z = setup.model.apply(state.body, state.body_stats, x, train=False, inference=True)[0]

  def logits(head, zz):
    p, s = head
    return setup.model.apply(p, s, zz, start=h, train=False, inference=True)[0]

  return max_logit_select(logits, (state.heads, state.heads_stats), z)


def build(setup: Setup) -> Functions:
  """MultiHead for a run: its round closes over the setup alone."""
  return Functions(setup, init, round)


def output_model(setup: Setup, state: State):
  """A single-model view: the body with the uniform mean of the heads.

  Only for tools that need one staged model; a run's evaluation
  (:mod:`jsfl.train.evaluate`) goes through :func:`predict`, the method's
  actual output.
  """
  uniform = jnp.ones((setup.num_clients,), jnp.float32)
  return (state.body + weighted_mean(state.heads, uniform),
          state.body_stats + weighted_mean(state.heads_stats, uniform))


def communication(setup: Setup, samples: int):
  """The body (with BN statistics) down and up per participant; heads stay at
  their clients."""
  b = portion_bytes(setup.model, 0, head_cut(setup))
  return setup.clients_per_round * b, setup.clients_per_round * b


METHOD = Method(build, output_model, communication, predict=predict,
                validate=validate,
                options=MultiHeadOptions)
