"""SplitFedV3: Thapa et al., "SplitFed: When Federated Learning Meets Split
Learning", AAAI 2022, in the form of Gawali et al. 2021 / Madaan et al. 2022
that Hydra compares against (Hydra, AAAI 2026, Appendix B).  docs/methods-splitfed.md.

Every client owns a part-1 that is never aggregated: the state holds all
``K`` copies stacked on a leading client axis; a round gathers the
participants' copies by client id and scatters them back, so the copies of
non-participants stay as they were.  The server gives every participant a copy
of the shared part-2, trained on that client's activations only (SplitFedV1's
server rule on the split engine, all clients in one program);
at round end the part-2 copies (and their BatchNorm statistics) are averaged
uniformly.

Inference (:func:`predict`): every client's part-1 followed by the shared
part-2; per sample the logits of the client whose largest logit is largest
win (Hydra follows Chen et al. 2023's "most confident head" rule, Eq. 5,
since the papers leave the choice of part-1 at inference open).  Ties go to
the lowest client id.

Decisions the paper leaves open:

* All ``K`` part-1 copies start from the same initial part-1 (the one model
  the server initialises), so a client that never took part predicts with
  the untrained part-1.
* Optimiser states (client part-1 and server part-2 copies) live one round,
  like SplitFedV1's; the part-2 copies themselves live one round too.
* The candidate clients at inference are looped over with a ``lax.scan``
  rather than vmapped: a vmap would hold ``K`` copies of every intermediate
  activation of an evaluation chunk at once (100 clients x 1,000 test images
  of MobileNetV1 cut-layer activations are GBs); the result is the same.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.method import LABEL_BYTES, Method, activation_size
from jsfl.core.portion import fresh_stack
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast, put_rows, take_rows, weighted_mean
from jsfl.engine import split
from jsfl.engine.outputs import max_logit_select


@struct.dataclass
class State:
  part1: tuple          # every client's part-1, leading axis K
  part1_stats: tuple    # their BatchNorm statistics, leading axis K
  part2: tuple          # the aggregated server portion
  part2_stats: tuple
  round: jax.Array


def init(setup: Setup, key) -> State:
  params, stats = setup.model.init(key)
  c, k = setup.cut, setup.num_clients
  return State(broadcast(params[:c], k), broadcast(stats[:c], k),
               params[c:], stats[c:],
               jnp.zeros((), jnp.int32))


def own_part1(state: State, plan):
  """Each participant starts from its own part-1 copy, a fresh optimiser."""
  return fresh_stack(plan, take_rows(state.part1, plan.clients),
                     take_rows(state.part1_stats, plan.clients))


def finish(setup: Setup, state: State, out: split.SplitRound):
  """The participants' part-1 copies put back, part-2 copies averaged
  uniformly."""
  clients = out.plan.clients
  part2, stats2 = split.uniform(out.server, out.plan)
  new = dataclasses.replace(state,
      part1=put_rows(state.part1, clients, out.clients.params),
      part1_stats=put_rows(state.part1_stats, clients, out.clients.stats),
      part2=part2, part2_stats=stats2, round=state.round + 1)
  return new, split.metrics(out)


def build(setup: Setup) -> split.SplitRounds:
  """SplitFedV3 for a run: SplitFedV1's server rule on the participants' own
  part-1 copies, which are put back instead of aggregated; metrics
  ``loss``, ``samples`` and ``clients`` (participants, ascending)."""
  alg = split.SplitAlgorithm(server_init=split.part2_copies,
                             server_rule=split.own_part2(setup), schedule=split.batch_steps,
                             client_init=own_part1, client_final=None)
  return split.SplitRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One SplitFedV3 round (:func:`build`)."""
  return build(setup).round(state, data, key)


def predict(setup: Setup, state: State, x):
  """Max-logit selection over every client's part-1 (see module docstring)."""
  def logits(client, xx):
    p1, s1 = client
    return setup.model.logits(p1 + state.part2, s1 + state.part2_stats, xx)

  return max_logit_select(logits, (state.part1, state.part1_stats), x)


def output_model(setup: Setup, state: State):
  """A single-model view: the uniform mean of the part-1 copies + part-2.

  Only for tools that need one staged model; a run's evaluation
  (:mod:`jsfl.train.evaluate`) goes through :func:`predict`, the method's
  actual output.
  """
  uniform = jnp.ones((setup.num_clients,), jnp.float32)
  return (weighted_mean(state.part1, uniform) + state.part2,
          weighted_mean(state.part1_stats, uniform) + state.part2_stats)


def communication(setup: Setup, samples: int):
  """Per processed sample the cut-layer activation and label up and its
  gradient down; no model portion travels (part-1 stays at its client and the
  part-2 copies at the server)."""
  act = activation_size(setup.model, setup.cut) * 4
  return samples * (act + LABEL_BYTES), samples * act


METHOD = Method(build, output_model, communication, predict=predict)
