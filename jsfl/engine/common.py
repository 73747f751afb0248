"""Losses, optimisers, aggregation, participation and processing orders."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax
from jax import lax

ORDERS = ("random", "cyclic", "cyclic_reverse", "fixed")


# --------------------------------------------------------------------- loss
def masked_cross_entropy(logits, labels, mask):
  """Mean cross-entropy over the valid samples of a batch (0 if none).

  Matches PyTorch's mean reduction on a ragged last batch: the mean is over
  the samples that exist, not over the padded batch size.
  """
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  m = mask.astype(ce.dtype)
  return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)


# --------------------------------------------------------------- optimiser
def make_optimizer(momentum: float = 0.0, weight_decay: float = 0.0):
  """SGD as in PyTorch: weight decay added to the gradient before momentum.

  The learning rate is an injected hyperparameter so a round can set its
  decayed value (:func:`round_lr`) without recompiling.
  """
  def sgd(learning_rate):
    tx = optax.sgd(learning_rate, momentum=momentum or None)
    if weight_decay:
      tx = optax.chain(optax.add_decayed_weights(weight_decay), tx)
    return tx
  return optax.inject_hyperparams(sgd)(learning_rate=0.0)


def with_lr(opt_state, lr):
  """Returns ``opt_state`` with its injected learning rate set to ``lr``."""
  hp = dict(opt_state.hyperparams)
  hp["learning_rate"] = jnp.asarray(lr, jnp.float32)
  return opt_state._replace(hyperparams=hp)


def round_lr(base_lr, decay, floor, round_idx, start: int = 1):
  """``max(lr * decay**max(r - start + 1, 0), floor)``: Hydra's per-round decay
  with a floor, first applied in round ``start`` (the authors' FL baseline
  starts a round later than their split methods: ``start = 2``)."""
  steps = jnp.maximum(round_idx.astype(jnp.float32) - (start - 1), 0.0)
  return jnp.maximum(base_lr * decay ** steps, floor)


def gate(active, new, old):
  """``new`` where ``active`` else ``old``, leafwise."""
  return jax.tree.map(lambda a, b: jnp.where(active, a, b), new, old)


# -------------------------------------------------------------- aggregation
def weighted_mean(stacked, weights):
  """Weighted mean over the leading (client) axis of a stacked pytree."""
  w = weights.astype(jnp.float32)
  w = w / jnp.maximum(jnp.sum(w), 1e-12)
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


# ------------------------------------------------------------ participation
def sample_clients(key, num_clients: int, n: int):
  """``n`` distinct client ids, ascending (all of them when n == K)."""
  if n == num_clients:
    return jnp.arange(num_clients, dtype=jnp.int32)
  chosen = jax.random.choice(key, num_clients, (n,), replace=False)
  return jnp.sort(chosen).astype(jnp.int32)


# --------------------------------------------------------- processing order
def label_rank(key, num_classes: int):
  """The cyclic order's label sequence, drawn once per run: rank of each label."""
  perm = jax.random.permutation(key, num_classes)
  return jnp.argsort(perm).astype(jnp.int32)


def processing_orders(order: str, key, num_steps: int, clients, dominant,
                      rank):
  """Server processing order of every batch step of a round (SPEC 1.2).

  Args:
    order: one of ``ORDERS``.
    key: PRNG key (used by ``random``).
    num_steps: batch steps in the round.
    clients: ``(n,)`` participating client ids.
    dominant: ``(K,)`` dominant label of every client.
    rank: ``(L,)`` position of each label in the run's label cycle.

  Returns:
    ``(num_steps, n)`` int32 positions into ``clients``: row t lists the
    participants in the order the server processes their batch t.
  """
  n = clients.shape[0]
  if order == "random":
    # Step t's permutation depends on (key, t) only, not on the step count.
    u = jax.vmap(lambda t: jax.random.uniform(jax.random.fold_in(key, t), (n,)))(
        jnp.arange(num_steps))
    return jnp.argsort(u, axis=1).astype(jnp.int32)
  if order == "fixed":
    base = jnp.argsort(clients)
    return jnp.broadcast_to(base, (num_steps, n)).astype(jnp.int32)
  if order in ("cyclic", "cyclic_reverse"):
    # Clients of a label are consecutive (by id) and labels follow the cycle.
    k = jnp.max(clients) + 1
    base = jnp.argsort(rank[dominant[clients]] * k + clients).astype(jnp.int32)
    rows = jnp.broadcast_to(base, (num_steps, n))
    if order == "cyclic":
      return rows
    flip = (jnp.arange(num_steps) % 2 == 1)[:, None]
    return jnp.where(flip, rows[:, ::-1], rows)
  raise ValueError(f"order={order!r}; allowed: {ORDERS}")


# ------------------------------------------------------------ batch steps
def scan_live(f, init, xs, live):
  """``lax.scan(f, init, xs)`` that stops after the last live step.

  A round's step axis is sized for the widest client of the whole partition,
  but a round's participants are usually narrower (under Dirichlet 0.1 the
  widest client holds several times the median), so most trailing steps are
  all-padding no-ops.  This runs steps ``0 .. last live`` in a ``while_loop``
  whose bound is read from the data; under the seed ``vmap`` it runs to the
  largest bound of the seeds, with finished seeds' carries held by select.

  Args:
    f: ``(carry, x) -> (carry, y)``; must leave ``carry`` unchanged on a step
      that is not live (every method gates its updates on the batch mask).
    init: the initial carry.
    xs: pytree of arrays with a leading step axis ``T``.
    live: ``(T,)`` bool, whether step t has any real sample.

  Returns:
    ``(carry, ys)`` as ``lax.scan`` returns them; ``ys`` is zero at the
    steps that were skipped.
  """
  num_steps = live.shape[0]
  stop = jnp.max(jnp.where(live, jnp.arange(1, num_steps + 1), 0))
  x0 = jax.tree.map(lambda a: a[0], xs)
  y_shape = jax.eval_shape(lambda c, x: f(c, x)[1], init, x0)
  ys0 = jax.tree.map(lambda s: jnp.zeros((num_steps,) + s.shape, s.dtype), y_shape)

  def body(t, carry_ys):
    carry, ys = carry_ys
    x = jax.tree.map(lambda a: lax.dynamic_index_in_dim(a, t, keepdims=False), xs)
    carry, y = f(carry, x)
    return carry, jax.tree.map(lambda b, v: b.at[t].set(v), ys, y)

  return lax.fori_loop(0, stop, body, (init, ys0))


def live_steps(*masks):
  """``(T,)`` whether each step of ``(T, ...)`` masks has any real sample."""
  out = None
  for m in masks:
    s = jnp.any(m.reshape(m.shape[0], -1), axis=1)
    out = s if out is None else out | s
  return out
