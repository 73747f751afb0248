"""FedProx: Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020 (docs/methods-sequential.md); a parallel baseline of SFedKD (Table 1).

FedAvg whose clients minimise ``CE + mu/2 ||w - w_global||^2`` (mu = 0.01 by
default), through the shared parallel round (``jsfl.engine.parallel``).

Departures: none from docs/methods-sequential.md.  FedProx's variable local work (inexact
solvers, straggler epochs) is not modelled: every client runs
``local_epochs`` epochs, as in SFedKD's comparison.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jsfl.core.method import Method, whole_model
from jsfl.core.setup import Setup
from jsfl.engine import parallel
from jsfl.options import option, option_set

State = parallel.State


# mu < 0 would reward drifting from the global model (the loss is unbounded
# below); mu = 0 is FedAvg.
@option_set
class FedProxOptions:
  mu: float = option(0.01, "proximal coefficient mu (0 = FedAvg)", range="[0, inf)",
                     batchable=True)


def prox_term(params, anchor, mu):
  """``mu/2 ||params - anchor||^2`` over every parameter leaf."""
  sq = jax.tree.map(lambda p, a: jnp.sum((p - a) ** 2), params, anchor)
  return 0.5 * mu * sum(jax.tree.leaves(sq), jnp.zeros((), jnp.float32))


def init(setup: Setup, key) -> State:
  return parallel.init_state(setup, key)


def client_term(plan, p, batch, client):
  """FedProx's loss term: the proximal pull to the round's global model."""
  return prox_term(p, client.start, plan.options.mu)


def build(setup: Setup) -> parallel.ParallelRounds:
  """FedProx for a run: the parallel round with the proximal term."""
  return parallel.ParallelRounds(setup, parallel.ParallelAlgorithm(client_term), init)


def round(setup: Setup, state: State, data, key):
  """One FedProx round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = whole_model


communication = parallel.communication


METHOD = Method(build, output_model, communication,
                options=FedProxOptions)
