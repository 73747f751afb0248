"""Pytrees stacked on a leading axis (clients, heads, branches): means, rows,
copies."""

from __future__ import annotations

import jax
import jax.numpy as jnp


# -------------------------------------------------------------- aggregation
def weighted_mean(stacked, weights):
  """Weighted mean over the leading (client) axis of a stacked pytree; the
  plain mean when every weight is 0 (a round whose participants all hold no
  data: their copies are the unchanged start, which the mean keeps, where
  zero weights would zero the model)."""
  w = weights.astype(jnp.float32)
  total = jnp.sum(w)
  w = jnp.where(total > 0, w / jnp.where(total > 0, total, 1.0), 1.0 / w.shape[0])
  return jax.tree.map(lambda a: jnp.tensordot(w, a, axes=1).astype(a.dtype),
                      stacked)


def take_rows(stacked, rows):
  """Rows ``rows`` (an index or an index array) of a pytree stacked on axis 0."""
  return jax.tree.map(lambda a: a[rows], stacked)


def put_rows(stacked, rows, values):
  """``stacked`` with ``rows`` replaced by ``values`` (distinct indices)."""
  return jax.tree.map(lambda a, v: a.at[rows].set(v), stacked, values)


def broadcast(tree, n: int):
  """``n`` stacked copies of ``tree`` (a leading client axis)."""
  return jax.tree.map(lambda a: jnp.broadcast_to(a, (n,) + a.shape), tree)
