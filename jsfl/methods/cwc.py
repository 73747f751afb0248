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
its data (``jsfl.methods.fedcurv.diag_fisher``, one epoch) is added to C.  At
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

from jsfl.core.data import round_options
from jsfl.core.method import Method, label_rank_of
from jsfl.core.plan import plan_round
from jsfl.core.setup import Setup
from jsfl.engine import parallel
from jsfl.methods import fedcurv, fedseq
from jsfl.methods.fedcurv import FISHER_MODES
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
  base = fedseq.init(setup, key)
  return State(base.params, base.stats, jax.tree.map(jnp.zeros_like, base.params),
               base.label_rank, base.round)


def consolidation_penalty(params, anchor, importance, lam):
  """``lam/2 * sum_p C_p (w_p - anchor_p)^2``."""
  d2 = jax.tree.map(lambda p, a: jnp.square(p - a), params, anchor)
  return 0.5 * lam * fedcurv.tree_dot(importance, d2)


def round(setup: Setup, state: State, data, key):
  """One CWC round (FedSeq's contract; metrics add ``reg_loss``)."""
  o = round_options(setup, data)
  lam, sigma, mode = o.lam, o.sigma, o.fisher
  plan = plan_round(setup, data, key, state.round)
  seq = fedseq.sequence_order(setup, plan, data, state.label_rank)

  def aux(p, batch, client):
    return consolidation_penalty(p, client.start, client.carry, lam)

  def after(p, s, idx, mask, client):
    nb = idx.shape[0] // setup.local_epochs
    f = fedcurv.diag_fisher(setup, data, p, s, idx[:nb], mask[:nb], mode)
    return jax.tree.map(jnp.add, client.carry, f)

  importance = jax.tree.map(lambda c: sigma * c, state.importance)
  params, stats, importance, _, sums = fedseq.sequential_round(
      setup, plan, data, state.params, state.stats, seq, aux=aux,
      carry=importance, after=after)
  new = State(params, stats, importance, state.label_rank, state.round + 1)
  return new, fedseq.sequence_metrics(plan, seq, sums)


def output_model(setup: Setup, state: State):
  return state.params, state.stats


def communication(setup: Setup, samples: int):
  """Model and importance matrix down and up per participant."""
  b = 2 * setup.clients_per_round * parallel.model_bytes(setup)
  return b, b


METHOD = Method(init, round, output_model, communication, label_rank=label_rank_of,
                options=CWCOptions)
