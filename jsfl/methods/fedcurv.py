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

:func:`diag_fisher` (shared with CWC) estimates the diagonal Fisher of one
client's data at a model over one epoch of its batches, eval-mode forward:

* ``fisher = "batch"`` (default): mean over batches of the squared
  mini-batch gradient of the cross-entropy (what common FedCurv/EWC code
  computes; one backward pass per batch);
* ``fisher = "sample"``: the empirical Fisher, mean over samples of squared
  per-sample gradients (vmapped; a few times dearer).

Departures: docs/methods-sequential.md leaves lambda open; the default lambda = 1.0 is not
tuned.  The penalty carries no 1/2 (FedCurv's Eq. 6, unlike EWC's).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jsfl.core.clients import map_clients
from jsfl.core.data import gather, round_options
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.method import Method
from jsfl.core.setup import Setup
from jsfl.core.trees import broadcast
from jsfl.engine import parallel
from jsfl.options import option, option_set

State = parallel.State


FISHER_MODES = ("batch", "sample")


# lam < 0 would reward moving away from the other clients' important weights.
@option_set
class FedCurvOptions:
  lam: float = option(1.0, "FedCurv penalty coefficient lambda (0 = FedAvg)",
                      range="[0, inf)", batchable=True)
  fisher: str = option("batch", "diagonal Fisher estimator", choices=FISHER_MODES)


# ----------------------------------------------------------------- Fisher
def _tree_zeros(tree):
  return jax.tree.map(jnp.zeros_like, tree)


def diag_fisher(setup: Setup, data, params, stats, idx, mask, mode: str = "batch"):
  """Diagonal Fisher of one client's data at ``params`` (eval-mode forward).

  Args:
    setup: static run description.
    data: device data.
    params, stats: the model.
    idx, mask: ``(T, B)`` the client's batches (one epoch); empty batches
      are skipped.
    mode: ``"batch"`` (squared mini-batch gradients, averaged over batches)
      or ``"sample"`` (squared per-sample gradients, averaged over samples).

  Returns:
    A pytree like ``params`` of non-negative importances (zeros if no data).
  """
  if mode not in FISHER_MODES:
    raise ValueError(f"fisher={mode!r}; allowed: {FISHER_MODES}")

  def ce(p, x, y, m):
    logits = setup.model.apply(p, stats, x, train=False)[0]
    return masked_cross_entropy(logits, y, m)

  def batch_fisher(i, m):
    x, y = gather(data, i)
    if mode == "batch":
      g = jax.grad(ce)(params, x, y, m)
      return jax.tree.map(jnp.square, g), jnp.ones((), jnp.float32)
    one = lambda xx, yy: jax.grad(ce)(params, xx[None], yy[None], jnp.ones((1,), bool))
    g = jax.vmap(one)(x, y)
    w = m.astype(jnp.float32)
    sq = jax.tree.map(lambda a: jnp.tensordot(w, jnp.square(a), axes=1), g)
    return sq, jnp.sum(w)

  def step(acc, batch):
    i, m = batch
    tot, cnt = acc
    # lax.cond: an empty padded batch costs nothing where the seed axis is a
    # rolled map (CPU default); under vmap it becomes a select, same values.
    f, c = lax.cond(jnp.any(m), lambda: batch_fisher(i, m),
                    lambda: (_tree_zeros(params), jnp.zeros((), jnp.float32)))
    return (jax.tree.map(jnp.add, tot, f), cnt + c), None

  (tot, cnt), _ = lax.scan(step, (_tree_zeros(params), jnp.zeros((), jnp.float32)),
                           (idx, mask))
  return jax.tree.map(lambda a: a / jnp.maximum(cnt, 1.0), tot)


def first_epoch(setup: Setup, idx, mask):
  """The first of ``local_epochs`` concatenated epochs of a batch table."""
  nb = idx.shape[0] // setup.local_epochs
  return idx[:nb], mask[:nb]


def tree_dot(a, b):
  """``sum_p a_p * b_p`` over every leaf."""
  leaves = jax.tree.leaves(jax.tree.map(lambda x, y: jnp.sum(x * y), a, b))
  return sum(leaves, jnp.zeros((), jnp.float32))


# ---------------------------------------------------------------- FedCurv
def init(setup: Setup, key) -> State:
  params, stats = setup.model.init(key)
  n = setup.clients_per_round
  zeros = broadcast(_tree_zeros(params), n)
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


def round(setup: Setup, state: State, data, key):
  """One FedCurv round (see ``parallel.parallel_round`` for the contract)."""
  o = round_options(setup, data)
  lam, mode = o.lam, o.fisher

  def ctx_fn(plan, st):
    return jax.vmap(lambda c: penalty_sums(st.extra, c))(plan.clients)

  def aux(p, batch, client):
    u, v, w = client.ctx
    return curv_penalty(p, u, v, w, lam)

  def after(plan, st, params, stats, data):
    idx, mask = first_epoch(setup, plan.idx, plan.mask)
    f = map_clients(lambda p, s, i, m: diag_fisher(setup, data, p, s, i, m, mode),
                    setup.client_exec, params, stats, jnp.swapaxes(idx, 0, 1),
                    jnp.swapaxes(mask, 0, 1))
    fw = jax.tree.map(jnp.multiply, f, params)
    fw2 = jax.vmap(lambda a, b: tree_dot(a, jax.tree.map(jnp.square, b)))(f, params)
    return {"clients": plan.clients, "F": f, "Fw": fw, "Fw2": fw2}

  return parallel.parallel_round(setup, state, data, key, aux=aux,
                                 ctx_fn=ctx_fn, after=after)


def output_model(setup: Setup, state: State):
  return state.params, state.stats


def communication(setup: Setup, samples: int):
  """Per participant: model + U + V down, model + F + F*w up (3 models each)."""
  b = 3 * setup.clients_per_round * parallel.model_bytes(setup)
  return b, b


METHOD = Method(init, round, output_model, communication,
                options=FedCurvOptions)
