"""Knowledge replay: score vectors (Eq. 2), priorities and quotas (Eqs.
3-4), knowledge extraction from assistants (Algorithm 1 lines 12-17) and the
replay list's shares of the main batches
(docs/methods-multisfl.md#knowledge-request).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def update_scores(num, den, counts, gamma):
  """Eq. 2 as a recurrence: ``num <- gamma num + L_i[r]``, ``den <- gamma den + 1``.

  Args:
    num: ``(..., L)`` decayed label-count sums.
    den: decayed weight sum (scalar or broadcastable).
    counts: ``(..., L)`` this round's label counts ``L_i[r]``.
    gamma: decay in (0, 1).

  Returns:
    ``(num, den, sv)`` with ``sv = num / den`` the score vectors.
  """
  num = gamma * num + counts.astype(jnp.float32)
  den = gamma * den + 1.0
  return num, den, num / den


def update_scores_authors(sv, w, counts, gamma):
  """The authors' score recursion: ``w <- gamma w + 1``,
  ``sv <- (gamma sv + L_i[r]) / w`` on the already normalised ``sv``.

  Unlike Eq. 2 it decays the previous score twice (once by gamma, once
  through the normalisation), so the previous round's weight relative to the
  current one is ``gamma / w`` of the previous round: gamma, then
  gamma / (1 + gamma), tending to gamma (1 - gamma) (1/3 and 0.25 at gamma
  0.5) where Eq. 2 keeps gamma.

  Returns:
    ``(sv, w, sv)``: the state's ``(score_num, score_den)`` hold ``sv`` and
    ``w`` under this rule, and the score vectors.
  """
  w = gamma * w + 1.0
  sv = (gamma * sv + counts.astype(jnp.float32)) / w
  return sv, w, sv


def priorities(sv):
  """Eq. 3: ``prior_c = max(0, mean(sv) - sv[c])`` along the last axis."""
  return jnp.maximum(0.0, jnp.mean(sv, axis=-1, keepdims=True) - sv)


def quotas(sv, size, p, min_request=0, rounding="spec"):
  """Eq. 4: ``q_c = floor(|D_i| p prior_c / sum_c prior_c)``; 0 if all priors are 0.

  With ``min_request = m > 0`` the total ``|D_i| p`` becomes ``max(m, |D_i| p)``
  (the floor the authors' code puts under a branch's request, there ``m = L``;
  docs/methods-multisfl.md#knowledge-request has none, ``m = 0``).

  Args:
    sv: ``(L,)`` score vector.
    size: the main client's sample count ``|D_i|``.
    p: the round's sampling proportion.
    min_request: smallest total request ``m`` (static int).
    rounding: ``"spec"`` floors ``total * share_c``; ``"authors"`` floors the
      total first (``max(m, int(|D_i| p))``), then ``total * share_c``.

  Returns:
    ``(L,)`` int32 samples requested per class.
  """
  prior = priorities(sv)
  total = jnp.sum(prior)
  share = jnp.where(total > 0, prior / jnp.where(total > 0, total, 1.0), 0.0)
  request = size.astype(jnp.float32) * p
  if rounding == "authors":  # int(|D_i| p) first, then each class's share of it
    request = jnp.floor(request)
  if min_request:
    request = jnp.maximum(request, jnp.float32(min_request))
  return jnp.floor(request * share).astype(jnp.int32)


def assistant_takes(key, holdings, active, quota):
  """Knowledge extraction of one branch: who contributes how many of each class.

  The clients that may assist are visited in a random order; each gives
  ``min(outstanding quota, its holdings)`` of every class (Algorithm 1 lines
  12-17), so a class's quota is filled exactly when they hold enough of it,
  and never exceeded.

  Args:
    key: PRNG key of the branch.
    holdings: ``(K, L)`` int label counts of every client.
    active: ``(K,)`` bool, the clients that never assist this branch (this
      round's main clients, or only the branch's own: ``assistants``).
    quota: ``(L,)`` int requested samples per class.

  Returns:
    ``(K, L)`` int32 samples of class l taken from client k.
  """
  K = holdings.shape[0]
  order = jnp.argsort(jnp.where(active, 2.0, jax.random.uniform(key, (K,))))
  avail = jnp.where(active[:, None], 0, holdings).astype(jnp.int32)[order]
  before = jnp.cumsum(avail, axis=0) - avail
  take = jnp.clip(quota[None, :].astype(jnp.int32) - before, 0, avail)
  return jnp.zeros_like(take).at[order].set(take)


def _groups(table, sizes, y, num_classes: int):
  """Group ``k*L + l`` of every table entry (``K*L`` for padding)."""
  K, M = table.shape
  owner = jnp.arange(K * M) // M
  valid = jnp.arange(K * M) % M < sizes[owner]
  return jnp.where(valid, owner * num_classes + y[table.reshape(-1)], K * num_classes)


def client_holdings(table, sizes, y, num_classes: int):
  """``(K, L)`` int32 label counts of every client, from its index table."""
  K = table.shape[0]
  group = _groups(table, sizes, y, num_classes)
  counts = jnp.bincount(group, length=K * num_classes + 1)[:-1]
  return counts.astype(jnp.int32).reshape(K, num_classes)


def class_pool(key, table, sizes, y, num_classes: int):
  """Every client's samples grouped by (client, class), randomly ordered.

  Args:
    key: PRNG key (the order within each group).
    table: ``(K, M)`` client index table (padded).
    sizes: ``(K,)`` valid entries per row.
    y: train labels.
    num_classes: L.

  Returns:
    ``(pool, start)``: ``pool`` ``(K*M,)`` sample indices sorted by group
    ``k*L + l`` (padding last), randomly within a group; ``start`` ``(K*L,)``
    the first position of every group (group sizes are
    :func:`client_holdings`).
  """
  group = _groups(table, sizes, y, num_classes)
  # Per-row draws keyed by client id: a client's order never depends on the
  # table's padded width, which is the widest client of all batched seeds.
  K, M = table.shape
  u = jax.vmap(lambda c: jax.random.uniform(jax.random.fold_in(key, c), (M,)))(
      jnp.arange(K))
  order = jnp.lexsort((u.reshape(-1), group))
  holdings = jnp.bincount(group, length=table.shape[0] * num_classes + 1)[:-1]
  start = (jnp.cumsum(holdings) - holdings).astype(jnp.int32)
  return table.reshape(-1)[order], start


def replay_slots(key, take, pool, start, holdings, cap: int):
  """The replay list of one branch: sample indices of ``take``, shuffled.

  Group (k, l) contributes ``take[k, l]`` consecutive entries of its randomly
  ordered pool group starting at a random offset (wrapping), so the samples
  are a uniform draw without replacement from client k's class-l data.

  Args:
    key: PRNG key of the branch.
    take: ``(K, L)`` from :func:`assistant_takes`.
    pool, start: from :func:`class_pool`.
    holdings: ``(K, L)`` from :func:`client_holdings`.
    cap: static list length (``replay_sizes``).

  Returns:
    ``(idx, valid)`` of shape ``(cap,)``: sample indices, valid ones first in
    random order.
  """
  k_off, k_shuf = jax.random.split(key)
  t, h = take.reshape(-1), holdings.reshape(-1)
  ends = jnp.cumsum(t)
  s = jnp.arange(cap)
  g = jnp.minimum(jnp.searchsorted(ends, s, side="right"), t.size - 1)
  j = s - (ends[g] - t[g])
  off = jnp.floor(jax.random.uniform(k_off, h.shape) * h).astype(jnp.int32)
  hg = jnp.maximum(h[g], 1)
  idx = pool[start[g] + (off[g] + j) % hg]
  valid = s < ends[-1]
  o = jnp.argsort(jnp.where(valid, jax.random.uniform(k_shuf, (cap,)), 2.0))
  return idx[o], valid[o]


def main_batches(size, batch_size: int, drop_last: bool):
  """The main client's batches in an epoch: ``ceil(size / B)``, or with
  ``drop_last`` (its partial batch left out) ``floor(size / B)``."""
  return size // batch_size if drop_last else (size + batch_size - 1) // batch_size


def step_shares(idx, valid, size, batch_size: int, steps: int, per_step: int,
                drop_last: bool = False):
  """Spreads a replay list over the main client's batches of one epoch.

  Batch b of ``nb`` (:func:`main_batches`) gets slots
  ``[floor(b Q / nb), floor((b+1) Q / nb))`` of the ``Q`` valid ones; a
  client without a batch (``drop_last``, fewer than B samples) gets none.

  Returns:
    ``(idx, mask)`` of shape ``(steps, per_step)``.
  """
  q = jnp.sum(valid).astype(jnp.int32)
  nb = main_batches(size, batch_size, drop_last)
  div = jnp.maximum(nb, 1)
  b = jnp.arange(steps)[:, None]
  pos = (b * q) // div + jnp.arange(per_step)[None, :]
  mask = (pos < ((b + 1) * q) // div) & (b < nb)
  return idx[jnp.minimum(pos, idx.shape[0] - 1)], mask


def authors_shares(key, idx, valid, size, batch_size: int, epochs: int, steps: int,
                   per_step: int, drop_last: bool = False):
  """The authors' helper batches of one branch, every step of the round.

  Their helper loader has batches of ``h = ceil(Q / nb)`` (``Q`` replay
  samples, ``nb = ceil(size / B)`` main batches); main batch b of an epoch
  gets the b-th batch of a fresh shuffle of the list, so the first
  ``ceil(Q / h)`` batches get one (the last maybe shorter) and a sample can
  come twice in an epoch or not at all.

  Returns:
    ``(idx, mask)`` of shape ``(epochs * steps, per_step)``; with
  ``drop_last`` the main batches are :func:`main_batches`'s.
  """
  q = jnp.sum(valid).astype(jnp.int32)
  nb = main_batches(size, batch_size, drop_last)
  div = jnp.maximum(nb, 1)
  h = jnp.maximum((q + div - 1) // div, 1)
  j = jnp.arange(per_step)

  def one(k, t):
    b = t % steps
    order = jnp.argsort(jnp.where(valid, jax.random.uniform(k, valid.shape), 2.0))
    pos = b * h + j
    mask = (j < h) & (pos < q) & (b < nb)
    return idx[order][jnp.minimum(pos, idx.shape[0] - 1)], mask
  T = epochs * steps
  return jax.vmap(one)(jax.random.split(key, T), jnp.arange(T))
