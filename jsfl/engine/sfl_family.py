"""What SFL and the methods built on it share: its state, its server carry
and rule, and the state a round leaves.

SFL (SplitFedV2) keeps one part-2 on the server, updated participant after
participant (:class:`~jsfl.engine.split.SequentialServer`), and the
participants' part-1 copies averaged at round end.  Its variants (a server
loss of their own, another aggregation, a mutation of the start models)
change one hook of the split round and keep the rest; SplitNN (its own
visit loop over the split engine's batch step) and MergeSFL (a merged
server and client hooks of its own) keep SFL's state, init or server rule.
What they share lives here, in the engine layer, instead of in ``jsfl.methods.sfl``
(no method module imports another).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.method import staged_model
from jsfl.core.portion import kept
from jsfl.core.setup import Setup
from jsfl.engine import split
from jsfl.engine.orders import run_cycle


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
  tx = setup.tx
  return State(params[:c], stats[:c], params[c:], stats[c:], tx.init(params[c:]),
               run_cycle(setup, k_rank),
               jnp.zeros((), jnp.int32))


def server(state: State, plan):
  """The round's server carry: part-2 with its persisting optimiser state."""
  return kept(state.server_opt, plan.lr, state.part2, state.part2_stats)


def serve(setup: Setup, loss=split.cross_entropy, round_loss=None) -> split.ServerRule:
  """SFL's server rule: part-2 updated client after client with ``loss``, or
  with ``round_loss(plan)`` where the loss reads the round's options (a
  batchable option is a traced value of the slot, ``plan.options``)."""
  def rule(state, plan, step):
    this_loss = loss if round_loss is None else round_loss(plan)

    def one(srv, act, y, mask, k):
      srv, g_a, lsum, _ = split.server_update(setup, plan.tx, srv, act, y, mask, this_loss)
      return srv, g_a, lsum
    return split.SequentialServer(one, setup.server_unroll)
  return rule


def algorithm(setup: Setup, loss=split.cross_entropy, round_loss=None,
              **hooks) -> split.SplitAlgorithm:
  """SFL's round hooks: part-2 with its persisting optimiser, served
  participant after participant with ``loss`` (or ``round_loss(plan)``) in
  the run's label-cycle schedule; ``hooks`` replace any other
  :class:`~jsfl.engine.split.SplitAlgorithm` field."""
  return split.SplitAlgorithm(server_init=server, server_rule=serve(setup, loss, round_loss),
                              schedule=split.label_cycle, **hooks)


def rounds(setup: Setup, alg: split.SplitAlgorithm, finish_fn=None) -> split.SplitRounds:
  """SFL-shaped rounds of ``alg``: SFL's start and, by default, its finish."""
  return split.SplitRounds(setup, alg, init,
                           finish_fn or (lambda setup, state, out: finish(state, out)))


def finish(state, out: split.SplitRound, **extra_state):
  """The next SFL-shaped state and the split family's metrics."""
  srv = out.server
  new = state.replace(part1=out.part1, part1_stats=out.part1_stats,
                      part2=srv.params, part2_stats=srv.stats, server_opt=srv.opt,
                      round=state.round + 1, **extra_state)
  return new, split.metrics(out)


output_model = staged_model
