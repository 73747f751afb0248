"""CWC, cyclical weight consolidation: Song et al., "Cyclical Weight
Consolidation: Towards Solving Catastrophic Forgetting in Serial Federated
Learning" (2024); the SFL baseline of SFedKD (Table 1).  Reconstructed as in
docs/methods-sequential.md.

FedSeq (``jsfl.methods.fedseq``) with an EWC-style penalty: client m of the
sequence minimises

  ``CE + lambda/2 * sum_p C_p (w_p - w_prev_p)^2``

where ``w_prev`` is the model it received (client m-1's output) and ``C`` is a
consolidation (importance) matrix that accumulates along the client
sequence: after client m trains, its diagonal Fisher at its trained model on
its data (``jsfl.engine.fisher.diag_fisher``, one epoch) is added to C.  At
every round start C is multiplied by ``sigma`` so old clients' importance
decays cyclically.  Defaults lambda = 1.0, sigma = 0.5 (docs/methods-sequential.md).

Departures: docs/methods-sequential.md fixes neither the Fisher estimator nor its data; the
default is squared mini-batch gradients over one epoch of the client's
batches, eval-mode forward (``fisher = "sample"`` gives the per-sample
empirical Fisher).  The logged ``reg_loss`` is the mean penalty.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from jsfl.core.method import Method, label_rank_of, whole_model
from jsfl.core.setup import Setup
from jsfl.engine import parallel, sequential
from jsfl.engine.fisher import FISHER_MODES, diag_fisher, tree_dot
from jsfl.options import option, option_set


# lam < 0 would reward moving away from the consolidated weights; sigma > 1
# would grow old importance every round instead of decaying it.
@option_set
class CWCOptions:
  lam: float = option(1.0, "consolidation penalty coefficient lambda (0 = FedSeq)",
                      range="[0, inf)", batchable=True)
  sigma: float = option(0.5, "decay of the importance matrix at each round start "
                        "(0 = forget, 1 = keep)", range="[0, 1]", batchable=True)
  fisher: str = option("batch", "diagonal Fisher estimator", choices=FISHER_MODES)


@struct.dataclass
class State:
  params: tuple
  stats: tuple
  importance: tuple      # C, shaped like params
  label_rank: jax.Array
  round: jax.Array


def init(setup: Setup, key) -> State:
  base = sequential.init_state(setup, key)
  return State(base.params, base.stats, jax.tree.map(jnp.zeros_like, base.params),
               base.label_rank, base.round)


def consolidation_penalty(params, anchor, importance, lam):
  """``lam/2 * sum_p C_p (w_p - anchor_p)^2``."""
  d2 = jax.tree.map(lambda p, a: jnp.square(p - a), params, anchor)
  return 0.5 * lam * tree_dot(importance, d2)


def client_term(plan, p, batch, client):
  """The consolidation penalty around the client's start, weighted by the
  importance carried along the sequence."""
  return consolidation_penalty(p, client.start, client.carry, plan.options.lam)


def start_carry(state: State, plan):
  """The importance matrix decayed by sigma at the round's start."""
  return jax.tree.map(lambda c: plan.options.sigma * c, state.importance)


def plan_with_data(setup: Setup, state: State, data, key):
  """FedSeq's plan with the round's data as its context: the Fisher of a
  finished client is taken over its batches."""
  return sequential.plan_at_round(setup, state, data, key)._replace(context=data)


def client_done(setup: Setup):
  """Adds the finished client's Fisher (its first epoch) to the carry."""
  def done(plan, p, s, idx, mask, client):
    nb = idx.shape[0] // setup.local_epochs
    f = diag_fisher(setup, plan.context, p, s, idx[:nb], mask[:nb], setup.options.fisher)
    return jax.tree.map(jnp.add, client.carry, f)
  return done


def finish(setup: Setup, state: State, out: sequential.SequenceRound):
  new = State(out.params, out.stats, out.carry, state.label_rank, state.round + 1)
  return new, sequential.sequence_metrics(out.plan, out.seq, out.sums)


def build(setup: Setup) -> sequential.SequentialRounds:
  """CWC for a run: FedSeq with the consolidation penalty and the
  importance carried along the sequence (metrics add ``reg_loss``)."""
  alg = sequential.SequentialAlgorithm(
      plan=plan_with_data, client_term=client_term, start_carry=start_carry,
      client_done=client_done(setup))
  return sequential.SequentialRounds(setup, alg, init, finish)


def round(setup: Setup, state: State, data, key):
  """One CWC round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = whole_model


def communication(setup: Setup, samples: int):
  """Model and importance matrix (one value per parameter) down and up per
  participant."""
  b = setup.clients_per_round * (parallel.model_bytes(setup) + parallel.params_bytes(setup))
  return b, b


METHOD = Method(build, output_model, communication, label_rank=label_rank_of,
                options=CWCOptions)
