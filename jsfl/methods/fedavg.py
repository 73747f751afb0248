"""FedAvg: McMahan et al., "Communication-Efficient Learning of Deep Networks
from Decentralized Data", AISTATS 2017 (docs/methods-splitfed.md, "FL / FedAvg").

Each participating client trains the whole model for ``local_epochs`` epochs
from the global model; the server takes the sample-weighted mean
(``method.aggregation = "uniform"``: the plain mean, as the Hydra authors' FL).  This is
the parallel round (``jsfl.engine.parallel``) with no hooks; FedProx,
FedCurv and FedNTD are the same round with a loss term.
"""

from __future__ import annotations

from jsfl.core.method import Method
from jsfl.core.setup import Setup
from jsfl.engine import parallel

State = parallel.State
init = parallel.init_state


def build(setup: Setup) -> parallel.ParallelRounds:
  """FedAvg for a run: the parallel round with no hooks."""
  return parallel.ParallelRounds(setup, parallel.ParallelAlgorithm(), init)


def round(setup: Setup, state: State, data, key):
  """One FedAvg round.

  Returns:
    ``(state, metrics)`` with metrics ``loss`` (mean train loss), ``samples``
    (samples processed), ``clients`` (participants) and ``reg_loss`` (0).
  """
  return build(setup).round(state, data, key)


output_model = parallel.output_model
communication = parallel.communication


METHOD = Method(build, output_model, communication)
