"""SFL = SplitFedV2: Thapa et al., "SplitFed: When Federated Learning Meets
Split Learning", AAAI 2022; the sequential-server form studied by Hydra
("Data Heterogeneity and Forgotten Labels in Split Federated Learning",
AAAI 2026, Sec. 2 and Algorithm 1).  docs/methods-splitfed.md and 1.2.

Each participating client holds a copy of part-1; ONE server part-2 is updated
sequentially: the split round (``jsfl.engine.split``) with the
:func:`~jsfl.engine.split.sequential` server rule over this step's processing
order (random / cyclic / cyclic_reverse / fixed), one SGD step per client
batch.  The other sequential-server methods (Hydra, the SFL forms of FedNTD,
FedExp and FedMut) reuse :func:`server`, :func:`serve` and :func:`finish`.

At round end the part-1 copies (and their BatchNorm statistics) are averaged
sample-weighted.  Clients without a batch at a step are masked out of the
scan (the server skips them) and their part-1 is left unchanged; partial
participation samples ``clients_per_round`` of ``K`` clients per round.

Departure from the PyTorch reference: none in the math.  The server optimiser
state (momentum) persists across rounds, the clients' is rebuilt every round
(docs/setting.md#optimisation).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.method import Method, label_rank_of, split_communication
from jsfl.core.optim import make_optimizer
from jsfl.core.portion import kept
from jsfl.core.setup import Setup
from jsfl.engine import split
from jsfl.engine.orders import label_rank


@struct.dataclass
class State:
  part1: tuple          # global client portion (params)
  part1_stats: tuple
  part2: tuple          # the server portion
  part2_stats: tuple
  server_opt: object
  label_rank: jax.Array  # the run's label cycle (cyclic orders)
  round: jax.Array


def init(setup: Setup, key) -> State:
  k_model, k_rank = jax.random.split(key)
  params, stats = setup.model.init(k_model)
  c = setup.cut
  tx = make_optimizer(setup.momentum, setup.weight_decay)
  return State(params[:c], stats[:c], params[c:], stats[c:], tx.init(params[c:]),
               label_rank(k_rank, setup.num_classes),
               jnp.zeros((), jnp.int32))


def server(state):
  """The round's server carry: part-2 with its persisting optimiser state."""
  return lambda plan: kept(state.server_opt, plan.lr, state.part2,
                                 state.part2_stats)


def serve(setup: Setup, loss=split.cross_entropy):
  """SFL's server rule: part-2 updated client after client with ``loss``."""
  def make(plan, step):
    def one(srv, act, y, mask, k):
      srv, g_a, lsum, _ = split.server_update(setup, plan.tx, srv, act, y, mask, loss)
      return srv, g_a, lsum
    return split.SequentialServer(one, setup.server_unroll)
  return make


def algorithm(setup: Setup, state, loss=split.cross_entropy) -> split.SplitAlgorithm:
  """SFL's round hooks: part-2 with its persisting optimiser, served
  participant after participant with ``loss``."""
  return split.SplitAlgorithm(server_init=server(state), server_rule=serve(setup, loss))


def finish(state, out: split.SplitRound, **extra_state):
  """The next SFL-shaped state and the split family's metrics."""
  srv = out.server
  new = state.replace(part1=out.part1, part1_stats=out.part1_stats,
                      part2=srv.params, part2_stats=srv.stats, server_opt=srv.opt,
                      round=state.round + 1, **extra_state)
  return new, split.metrics(out)


def round(setup: Setup, state: State, data, key):
  """One SFL round.

  Args:
    setup: static run description (``setup.order`` picks the processing order).
    state: see :class:`State`.
    data: the round's ``RoundData``.
    key: this round's PRNG key.

  Returns:
    ``(state, metrics)``; metrics: ``loss``, ``samples``, ``clients``
    (participants in the first batch step's processing order).
  """
  out = split.run_round(algorithm(setup, state), setup, state, data, key,
                        label_rank=state.label_rank)
  return finish(state, out)


def output_model(setup: Setup, state: State):
  return state.part1 + state.part2, state.part1_stats + state.part2_stats


communication = split_communication


METHOD = Method(init, round, output_model, communication, label_rank=label_rank_of)
