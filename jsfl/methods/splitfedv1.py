"""SplitFedV1: Thapa et al., "SplitFed: When Federated Learning Meets Split
Learning", AAAI 2022 (docs/methods-splitfed.md).

Per participating client a copy of part-1 (at the client) and a copy of part-2
(at the server), trained in parallel on that client's data with the cut-layer
exchange of split learning; both averaged sample-weighted at round end
(uniformly under ``method.aggregation = "uniform"``).  The
math equals FedAvg's (tested); the split is kept so communication and any
per-portion option stay honest.  All clients are one program
(``map_clients``); the server copies live one round, like their optimiser
state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.method import Method, split_communication, staged_model
from jsfl.core.setup import Setup
from jsfl.engine import split


@struct.dataclass
class State:
  part1: tuple
  part1_stats: tuple
  part2: tuple
  part2_stats: tuple
  round: jax.Array


def init(setup: Setup, key) -> State:
  params, stats = setup.model.init(key)
  c = setup.cut
  return State(params[:c], stats[:c], params[c:], stats[c:],
               jnp.zeros((), jnp.int32))


def finish(setup: Setup, state: State, out: split.SplitRound):
  part2, stats2 = split.averaged(out.server, out.plan)
  new = State(out.part1, out.part1_stats, part2, stats2, state.round + 1)
  return new, split.metrics(out)


def build(setup: Setup) -> split.SplitRounds:
  """SplitFedV1 for a run: a part-2 copy per participant, both portions
  averaged (``method.aggregation``); metrics ``loss``, ``samples`` and ``clients``
  (the split family's; no ``reg_loss``, which FedAvg's round logs as 0)."""
  alg = split.SplitAlgorithm(server_init=split.part2_copies,
                             server_rule=split.own_part2(setup), schedule=split.batch_steps)
  return split.SplitRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One SplitFedV1 round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = staged_model


communication = split_communication


METHOD = Method(build, output_model, communication)
