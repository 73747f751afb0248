"""The server's processing orders: the label cycle and the order of every
batch step."""

from __future__ import annotations

import jax
import jax.numpy as jnp

ORDERS = ("random", "cyclic", "cyclic_reverse", "fixed")
# What a cyclic order cycles through: the labels (a client at its dominant
# label's place) or the clients themselves (the Hydra authors' code).
CYCLES = ("label", "client")


# --------------------------------------------------------- processing order
def label_rank(key, num_classes: int):
  """The cyclic order's label sequence, drawn once per run: rank of each label."""
  perm = jax.random.permutation(key, num_classes)
  return jnp.argsort(perm).astype(jnp.int32)


def run_cycle(setup, key):
  """The run's cycle, drawn once: the rank of each label (``cycle =
  "label"``), or of each client (``"client"``)."""
  if setup.cycle not in CYCLES:
    raise ValueError(f"method.cycle={setup.cycle!r}; allowed: {CYCLES}")
  return label_rank(key, setup.num_clients if setup.cycle == "client" else setup.num_classes)


def cycle_places(setup, dominant):
  """``(K,)`` each client's entry in the run's cycle: its dominant label, or
  under ``cycle = "client"`` the client itself (what :func:`processing_orders`
  takes as ``dominant``)."""
  if setup.cycle == "client":
    return jnp.arange(jnp.shape(dominant)[0], dtype=jnp.int32)
  return dominant


def processing_orders(order: str, key, num_steps: int, clients, dominant,
                      rank):
  """Server processing order of every batch step of a round
  (docs/methods-splitfed.md#processing-order, the ``steps`` rule).

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
