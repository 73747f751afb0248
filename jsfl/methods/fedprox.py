"""FedProx: Li et al., "Federated Optimization in Heterogeneous Networks",
MLSys 2020 (SPEC 5); a parallel baseline of SFedKD (Table 1).

FedAvg whose clients minimise ``CE + mu/2 ||w - w_global||^2`` (mu = 0.01 by
default), through the shared parallel round (``jsfl.engine.parallel``).

Departures: none from SPEC 5.  FedProx's variable local work (inexact
solvers, straggler epochs) is not modelled: every client runs
``local_epochs`` epochs, as in SFedKD's comparison.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jsfl.core.method import Method
from jsfl.core.setup import Setup
from jsfl.engine import parallel
from jsfl.methods.registry import FedProxOptions

State = parallel.State


def prox_term(params, anchor, mu):
  """``mu/2 ||params - anchor||^2`` over every parameter leaf."""
  sq = jax.tree.map(lambda p, a: jnp.sum((p - a) ** 2), params, anchor)
  return 0.5 * mu * sum(jax.tree.leaves(sq), jnp.zeros((), jnp.float32))


def init(setup: Setup, key) -> State:
  return parallel.init_state(setup, key)


def make_aux(setup: Setup):
  """FedProx's loss term ``aux(p, batch, client)`` (``parallel`` contract)."""
  mu = FedProxOptions.of(setup).mu
  return lambda p, batch, client: prox_term(p, client.start, mu)


def round(setup: Setup, state: State, data, key):
  """One FedProx round (see ``parallel.parallel_round`` for the contract)."""
  return parallel.parallel_round(setup, state, data, key, aux=make_aux(setup))


def output_model(setup: Setup, state: State):
  return state.params, state.stats


communication = parallel.communication


METHOD = Method(init, round, output_model, communication)
