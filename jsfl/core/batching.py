"""Per-client batch schedules over device-resident data.

A client is a padded row of an index table into the (device-resident) train
set plus its size.  Each epoch every participating client draws its own
permutation of its valid positions (padding sorted to the end), so batch ``b``
of client ``c`` is ``perm[c, b*B:(b+1)*B]`` with a mask for positions beyond the
client's size: unequal clients and ragged last batches are masks, never Python
branches, and every array has a fixed shape.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def steps_per_epoch(max_size: int, batch_size: int) -> int:
  """Batch steps of one epoch of the largest client (static)."""
  return max(1, math.ceil(max_size / batch_size))


def epoch_batches(key, table, sizes, batch_size: int, client_ids=None,
                  drop_last: bool = False, shuffle: bool = True):
  """One epoch's batches for each client row of ``table``.

  A client's permutation depends only on ``(key, client id, position)``, never
  on the padded width, so padding a table wider (e.g. to the widest seed of a
  seed-batched run) leaves every client's batches unchanged.

  Args:
    key: PRNG key.
    table: ``(n, max_n)`` int32 sample indices (padded).
    sizes: ``(n,)`` valid entries per row.
    batch_size: B.
    client_ids: ``(n,)`` ids the rows belong to (default ``arange(n)``).
    drop_last: leave out each client's last partial batch (a different
      remainder every epoch, as PyTorch's ``DataLoader(shuffle=True,
      drop_last=True)``); a client smaller than B then has no batch.
    shuffle: False takes each client's samples in its row's order (the same
      batches every epoch, as ``DataLoader(shuffle=False)``; with
      ``drop_last`` the same remainder left out).

  Returns:
    ``(idx, mask)`` of shape ``(nb, n, B)``: sample indices and validity, with
    ``nb = ceil(max_n / B)`` batch steps.
  """
  n, max_n = table.shape
  nb = steps_per_epoch(max_n, batch_size)
  pos = jnp.arange(max_n)
  valid = pos[None, :] < sizes[:, None]
  if client_ids is None:
    client_ids = jnp.arange(n)
  if shuffle:
    u = jax.vmap(lambda c: jax.random.uniform(jax.random.fold_in(key, c), (max_n,)))(
        client_ids)
    perm = jnp.argsort(jnp.where(valid, u, 2.0), axis=1)
  else:  # a row's valid entries come first
    perm = jnp.broadcast_to(pos, (n, max_n))
  pad = nb * batch_size - max_n
  perm = jnp.pad(perm, ((0, 0), (0, pad)))
  idx = jnp.take_along_axis(table, jnp.minimum(perm, max_n - 1), axis=1)
  kept = (sizes // batch_size) * batch_size if drop_last else sizes
  mask = jnp.arange(nb * batch_size)[None, :] < kept[:, None]
  idx = idx.reshape(n, nb, batch_size).transpose(1, 0, 2)
  mask = mask.reshape(n, nb, batch_size).transpose(1, 0, 2)
  return idx, mask


def round_batches(key, table, sizes, batch_size: int, epochs: int,
                  client_ids=None, drop_last: bool = False, shuffle: bool = True):
  """``epochs`` freshly shuffled epochs (``shuffle``: or the same unshuffled
  one) concatenated: ``(E*nb, n, B)``."""
  if not shuffle:  # every epoch the same batches: one, repeated
    idx, mask = epoch_batches(key, table, sizes, batch_size, client_ids, drop_last, False)
    return jnp.tile(idx, (epochs, 1, 1)), jnp.tile(mask, (epochs, 1, 1))
  keys = jax.random.split(key, epochs)
  idx, mask = jax.vmap(
      lambda k: epoch_batches(k, table, sizes, batch_size, client_ids, drop_last,
                              shuffle))(keys)
  return (idx.reshape((-1,) + idx.shape[2:]), mask.reshape((-1,) + mask.shape[2:]))
