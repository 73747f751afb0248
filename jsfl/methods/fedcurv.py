"""FedCurv: Shoham et al., "Overcoming Forgetting in Federated Learning on
Non-IID Data", NeurIPS 2019 workshop (docs/methods-sequential.md); a parallel baseline of SFedKD.

FedAvg whose client s minimises

  ``CE + lambda * sum_{j != s} sum_p F_{j,p} (w_p - w_{j,p})^2``

where ``w_j`` is client j's trained model from the previous round and
``F_j`` its diagonal Fisher information there (the previous round's other
participants; round 1 has none).  As in the paper the penalty is computed
from three server-side sums, ``U = sum_j F_j``, ``V = sum_j F_j w_j`` and
``W = sum_j F_j w_j^2`` (minus the client's own term when it took part in the
previous round): ``lambda * (U w^2 - 2 V w + W)``, so a client step costs two
model-sized products, whatever the number of other clients.

:func:`jsfl.engine.fisher.diag_fisher` (shared with CWC) estimates the
diagonal Fisher of one client's data at a model over one epoch of its
batches (``fisher = "batch"`` or ``"sample"``).

Departures: docs/methods-sequential.md leaves lambda open; the default lambda = 1.0 is not
tuned.  The penalty carries no 1/2 (FedCurv's Eq. 6, unlike EWC's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jsfl.core.clients import map_clients
from jsfl.core.method import Method, whole_model
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast
from jsfl.engine import parallel
from jsfl.engine.fisher import FISHER_MODES, diag_fisher, first_epoch, tree_dot, tree_zeros
from jsfl.options import option, option_set

State = parallel.State


# lam < 0 would reward moving away from the other clients' important weights.
@option_set
class FedCurvOptions:
  lam: float = option(1.0, "FedCurv penalty coefficient lambda (0 = FedAvg)",
                      range="[0, inf)", batchable=True)
  fisher: str = option("batch", "diagonal Fisher estimator", choices=FISHER_MODES)


# ---------------------------------------------------------------- FedCurv
def init(setup: Setup, key) -> State:
  params, stats = setup.model.init(key)
  n = setup.clients_per_round
  zeros = broadcast(tree_zeros(params), n)
  extra = {"clients": jnp.full((n,), -1, jnp.int32), "F": zeros, "Fw": zeros,
           "Fw2": jnp.zeros((n,), jnp.float32)}
  return State(params, stats, jnp.zeros((), jnp.int32), extra)


def penalty_sums(extra, client_id):
  """``(U, V, W)`` over the previous round's participants other than
  ``client_id``."""
  other = (extra["clients"] != client_id).astype(jnp.float32)
  u = jax.tree.map(lambda a: jnp.tensordot(other, a, axes=1), extra["F"])
  v = jax.tree.map(lambda a: jnp.tensordot(other, a, axes=1), extra["Fw"])
  return u, v, jnp.dot(other, extra["Fw2"])


def curv_penalty(params, u, v, w, lam):
  """``lam * sum_p (U w^2 - 2 V w) + lam * W`` = lam sum_j F_j (w - w_j)^2."""
  sq = jax.tree.map(jnp.square, params)
  return lam * (tree_dot(u, sq) - 2.0 * tree_dot(v, params) + w)


def client_context(state: State, plan):
  """Every participant's ``(U, V, W)`` without its own previous term."""
  return jax.vmap(lambda c: penalty_sums(state.extra, c))(plan.clients)


def client_term(plan, p, batch, client):
  u, v, w = client.ctx
  return curv_penalty(p, u, v, w, plan.options.lam)


def next_extra(setup: Setup):
  """The participants' Fisher at their trained models, for the next round."""
  def extra(state, plan, params, stats, data):
    idx, mask = first_epoch(setup, plan.idx, plan.mask)
    f = map_clients(lambda p, s, i, m: diag_fisher(setup, data, p, s, i, m,
                                                   setup.options.fisher),
                    setup.client_exec, params, stats, jnp.swapaxes(idx, 0, 1),
                    jnp.swapaxes(mask, 0, 1))
    fw = jax.tree.map(jnp.multiply, f, params)
    fw2 = jax.vmap(lambda a, b: tree_dot(a, jax.tree.map(jnp.square, b)))(f, params)
    return {"clients": plan.clients, "F": f, "Fw": fw, "Fw2": fw2}
  return extra


def build(setup: Setup) -> parallel.ParallelRounds:
  """FedCurv for a run: the parallel round with the curvature penalty."""
  return parallel.ParallelRounds(setup, parallel.ParallelAlgorithm(
      client_term=client_term, client_context=client_context,
      next_extra=next_extra(setup)), init)


def round(setup: Setup, state: State, data, key):
  """One FedCurv round (:func:`build`)."""
  return build(setup).round(state, data, key)


output_model = whole_model


def communication(setup: Setup, samples: int):
  """Per participant: model + U + V (+ the scalar sum of F w^2) down, model
  + F + F*w (+ its F w^2) up; U, V, F, F*w one value per parameter."""
  b = setup.clients_per_round * (parallel.model_bytes(setup)
                                 + 2 * parallel.params_bytes(setup) + 4)
  return b, b


METHOD = Method(build, output_model, communication,
                options=FedCurvOptions)
