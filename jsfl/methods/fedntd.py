"""FedNTD: Lee et al., "Preservation of the Global Knowledge by Not-True
Distillation in Federated Learning", NeurIPS 2022 (docs/methods-sequential.md); a parallel
baseline of SFedKD (Table 1).

Clients minimise ``CE + beta * tau^2 * KL(q~_global || q~_local)`` where
``q~`` is the softmax at temperature tau over the not-true classes (the
sample's label removed) and the global model is the round's frozen starting
model in eval mode.  Defaults beta = 1, tau = 1 (docs/methods-sequential.md).

:func:`~jsfl.engine.ntd.ntd_loss` is a pure function of two logit arrays, so
the split (SFL) form of FedNTD, where the logits come out of the server
portion, reuses it unchanged.

The ``tau^2`` factor is the authors' code's (their ``NTD_Loss``), not in
the paper's equation; it is 1 at the default tau = 1.
"""

from __future__ import annotations

from jsfl.core.method import Method, whole_model
from jsfl.core.setup import Setup
from jsfl.engine import parallel
from jsfl.engine.ntd import FedNTDOptions, ntd_loss

__all__ = ["METHOD", "FedNTDOptions", "State", "init", "ntd_loss", "output_model",
           "round"]

State = parallel.State

def init(setup: Setup, key) -> State:
  return parallel.init_state(setup, key)


def client_term(setup: Setup):
  """FedNTD's loss term: the global model is ``client.start`` run in eval
  mode on the batch."""
  def term(plan, p, batch, client):
    o = plan.options
    g = setup.model.apply(client.start, client.start_stats, batch.x, train=False)[0]
    return o.beta * ntd_loss(batch.logits, g, batch.y, batch.mask, o.tau)
  return term


def build(setup: Setup) -> parallel.ParallelRounds:
  """FedNTD for a run: the parallel round with the not-true distillation."""
  return parallel.ParallelRounds(setup, parallel.ParallelAlgorithm(client_term(setup)), init)


def round(setup: Setup, state: State, data, key):
  """One FedNTD round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = whole_model


communication = parallel.communication


METHOD = Method(build, output_model, communication,
                options=FedNTDOptions)
