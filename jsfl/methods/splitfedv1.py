"""SplitFedV1: Thapa et al., "SplitFed: When Federated Learning Meets Split
Learning", AAAI 2022 (docs/methods-splitfed.md).

Per participating client a copy of part-1 (at the client) and a copy of part-2
(at the server), trained in parallel on that client's data with the cut-layer
exchange of split learning; both averaged sample-weighted at round end.  The
math equals FedAvg's (tested); the split is kept so communication and any
per-portion option stay honest.  All clients are one program
(``map_clients``); the server copies live one round, like their optimiser
state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.method import Method, split_communication
from jsfl.core.portion import fresh_stack
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast
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


def server(state, n: int):
  """Every participant's copy of part-2, each with a fresh optimiser."""
  return lambda plan: fresh_stack(plan, broadcast(state.part2, n),
                                        broadcast(state.part2_stats, n))


def serve(setup: Setup):
  """SplitFedV1's server rule: each participant trains its own part-2 copy."""
  def make(plan, step):
    def one(srv, act, y, mask, _):
      srv, g_a, lsum, _ = split.server_update(setup, plan.tx, srv, act, y, mask)
      return srv, g_a, lsum
    return split.per_client(one)
  return make


def round(setup: Setup, state: State, data, key):
  """One SplitFedV1 round; same signature and metrics as ``fedavg.round``."""
  alg = split.SplitAlgorithm(server_init=server(state, setup.clients_per_round),
                             server_rule=serve(setup))
  out = split.run_round(alg, setup, state, data, key)
  part2, stats2 = split.sample_weighted(out.server, out.plan)
  new = State(out.part1, out.part1_stats, part2, stats2, state.round + 1)
  return new, split.metrics(out)


def output_model(setup: Setup, state: State):
  return state.part1 + state.part2, state.part1_stats + state.part2_stats


communication = split_communication


METHOD = Method(init, round, output_model, communication)
