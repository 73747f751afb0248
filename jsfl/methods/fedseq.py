"""FedSeq: sequential FL (Li & Lyu, "Convergence Analysis of Sequential
Federated Learning on Heterogeneous Data", NeurIPS 2023), the SFL baseline of
SFedKD (Xu et al., "SFedKD: Sequential Federated Learning with
Discrepancy-Aware Multi-Teacher Knowledge Distillation", Sec. 3.1); docs/methods-sequential.md.

Each round samples n clients without replacement and puts them in a sequence;
client m starts from client m-1's model and runs ``local_epochs`` epochs of
SGD on its data; the last client's model is the global model.  There is no
aggregation.

The round is the sequential engine's (:mod:`jsfl.engine.sequential`) with no
hooks: one jitted program, a ``lax.scan`` over the client sequence with a
nested ``lax.fori_loop`` over that client's live batch steps (its padded
empty steps are never run).  SFedKD and CWC
are the same round with hooks.

Sequence order (``method.order``): ``random`` (default) a fresh random
permutation of the participants every round; ``fixed`` ascending ids;
``cyclic`` / ``cyclic_reverse`` group clients by dominant label in the run's
label cycle (docs/methods-splitfed.md#processing-order; with one pass per round
both are the same order).

Departures: the client optimiser state (momentum) is rebuilt for every
client (each client is a separate party; docs/setting.md#optimisation).  The logged train loss is
the mean cross-entropy over all samples the sequence processed.
"""

from __future__ import annotations

from jsfl.core.method import Method, label_rank_of, whole_model
from jsfl.core.setup import Setup
from jsfl.engine import sequential

State = sequential.State
init = sequential.init_state
communication = sequential.communication


def build(setup: Setup) -> sequential.SequentialRounds:
  """FedSeq for a run: the sequential round with no hooks."""
  return sequential.SequentialRounds(setup, sequential.SequentialAlgorithm())


def round(setup: Setup, state: State, data, key):
  """One FedSeq round.

  Returns:
    ``(state, metrics)``; metrics ``loss``, ``reg_loss`` (0), ``samples`` and
    ``clients`` (the sequence, in training order).
  """
  return build(setup).round(state, data, key)


output_model = whole_model


METHOD = Method(build, output_model, communication, label_rank=label_rank_of)
