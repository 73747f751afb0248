"""The diagonal Fisher information of a client's data at a model: the
importance estimate FedCurv (parallel) and CWC (sequential) both penalise
with, and the tree products they need.

:func:`diag_fisher` estimates it over one epoch of the client's batches,
eval-mode forward:

* ``"batch"`` (default): mean over batches of the squared mini-batch
  gradient of the cross-entropy (what common FedCurv/EWC code computes; one
  backward pass per batch);
* ``"sample"``: the empirical Fisher, mean over samples of squared
  per-sample gradients (vmapped; a few times dearer).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jsfl.core.data import gather
from jsfl.core.loss import masked_cross_entropy
from jsfl.core.setup import Setup

FISHER_MODES = ("batch", "sample")


def tree_zeros(tree):
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
                    lambda: (tree_zeros(params), jnp.zeros((), jnp.float32)))
    return (jax.tree.map(jnp.add, tot, f), cnt + c), None

  (tot, cnt), _ = lax.scan(step, (tree_zeros(params), jnp.zeros((), jnp.float32)),
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
