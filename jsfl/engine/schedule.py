"""The server's schedule of a round: which client batch it takes when.

A round's batches are drawn per batch step (``plan_round``: ``(T, n, B)``
sample indices, ``T`` steps of ``n`` participants).  Two rules turn them
into the sequence in which a sequential server takes them
([methods-splitfed.md, "Processing order"](../../docs/methods-splitfed.md#processing-order)):

* ``"steps"`` (the paper's text): batch step t serves every participant's
  batch t, in the step's processing order (:func:`processing_orders`:
  a fresh permutation per step for ``random``, the label cycle for
  ``cyclic``, ...).
* ``"authors"`` (the Hydra authors' code): the server keeps a queue with one
  pending batch per participant.  ``random`` takes a uniformly random entry
  at every server step (so a client can be served several times in a row);
  ``cyclic`` takes the head and, after ``batches_per_turn`` batches of the
  same client, moves it to the back; ``cyclic_reverse`` does the same from
  alternating ends of the queue, switching ends after every ``n`` turns.
  Each round starts from the label cycle (cyclic orders) or client order
  (random) with the turn counters at zero; a client leaves the queue after
  its last batch.  :func:`queue_sequence` is that loop.

Either way a round becomes a :class:`Schedule` of *segments*: in segment s
some distinct participants are served, in the order ``order[s]``, each with
its batch from step ``src[s, c]`` (-1: idle in s).  A participant's batches
appear in segment order and each segment is cut before a participant would
come twice, so running the segments one after another - all their clients'
part-1 forward, the server in order, all part-1 backward - computes exactly
what the sequential code computes: a client's next forward always follows
its own previous backward, and nothing else touches its part-1.  Under the
``"steps"`` rule the segments are the batch steps.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax

from jsfl.engine.orders import ORDERS, processing_orders

RULES = ("authors", "steps")


class Schedule(NamedTuple):
  src: jax.Array     # (S, n) batch step each participant uses in segment s; -1: idle
  order: jax.Array   # (S, n) participants in serving order (idle ones last)


def steps(orders) -> Schedule:
  """The batch-step schedule: segment t is batch step t in ``orders[t]``."""
  num_steps, n = orders.shape
  return Schedule(jnp.broadcast_to(jnp.arange(num_steps, dtype=jnp.int32)[:, None],
                                   (num_steps, n)), orders.astype(jnp.int32))


def queue_sequence(order: str, key, batches, first, per_turn: int, length: int):
  """The authors' server loop: which participant the server serves at each step.

  Args:
    order: ``"random"``, ``"cyclic"``, ``"cyclic_reverse"`` or ``"fixed"``
      (the cyclic loop over ``first``).
    key: PRNG key of ``random``'s picks (step k uses ``fold_in(key, k)``).
    batches: ``(n,)`` batches each participant has in the round.
    first: ``(n,)`` the queue at the round's start (participant positions).
    per_turn: batches of one participant served in a row in cyclic orders
      (the authors' ``phi``); ``random`` ignores it.
    length: static length of the result (at least ``sum(batches)``).

  Returns:
    ``(length,)`` int32 participant positions in serving order, -1 after the
    last batch.
  """
  if order not in ORDERS:
    raise ValueError(f"order={order!r}; allowed: {ORDERS}")
  n = batches.shape[0]
  pos = jnp.arange(n)
  has = batches[first] > 0
  # The starting queue: ``first`` without the participants that have no batch.
  queue = first[jnp.argsort(~has, stable=True)].astype(jnp.int32)
  reverse = order == "cyclic_reverse"

  def serve(carry, k):
    queue, size, left, in_turn, turns, backwards = carry
    live = size > 0
    if order == "random":
      i = jax.random.randint(jax.random.fold_in(key, k), (), 0, jnp.maximum(size, 1))
    elif reverse:
      i = jnp.where(backwards, size - 1, 0)
    else:
      i = jnp.zeros((), jnp.int32)
    c = queue[i]
    queue = jnp.where(pos < i, queue, jnp.roll(queue, -1))   # taken out
    left = left.at[c].add(-1)
    done = left[c] == 0
    if order == "random":
      front = jnp.zeros((), bool)
    else:
      more = in_turn < per_turn - 1                           # same client again
      front = jnp.where(backwards, ~more, more) if reverse else more
      in_turn = jnp.where(done | ~more, 0, in_turn + 1)
      turns = jnp.where(done | ~more, (turns + 1) % n, turns)
      if reverse:  # the end flips after n finished turns of clients that stay
        backwards = backwards ^ (~done & ~more & (turns == 0))
    back = queue.at[size - 1].set(c)
    ahead = jnp.concatenate([c[None], queue[:-1]])
    queue = jnp.where(done, queue, jnp.where(front, ahead, back))
    size = size - 1 + (~done).astype(jnp.int32)
    new = (queue, size, left, in_turn, turns, backwards)
    old = carry
    carry = jax.tree.map(lambda a, b: jnp.where(live, a, b), new, old)
    return carry, jnp.where(live, c, -1).astype(jnp.int32)

  init = (queue, jnp.sum(has).astype(jnp.int32), batches.astype(jnp.int32),
          jnp.zeros((), jnp.int32), jnp.zeros((), jnp.int32), jnp.zeros((), bool))
  _, seq = lax.scan(serve, init, jnp.arange(length))
  return seq


def segments(seq, live) -> Schedule:
  """Cuts a serving sequence into segments of distinct participants.

  Args:
    seq: ``(N,)`` participant positions, -1 for none (:func:`queue_sequence`).
    live: ``(T, n)`` whether participant c has a batch at step t; its j-th
      served batch is the j-th live step.

  Returns:
    :class:`Schedule` with ``S = N`` segments (the trailing ones idle).
  """
  num_steps, n = live.shape
  length = seq.shape[0]
  # Column c: participant c's live steps first, in step order.
  step_of = jnp.argsort(~live, axis=0, stable=True).astype(jnp.int32)

  def cut(carry, c):
    seg, seen, place, served = carry
    valid = c >= 0
    c = jnp.maximum(c, 0)
    again = valid & seen[c]
    seg = seg + again.astype(jnp.int32)
    seen = jnp.where(again, False, seen)
    place = jnp.where(again, 0, place)
    out = (jnp.where(valid, seg, length), place, c, served[c])
    seen = seen.at[c].set(seen[c] | valid)
    place = place + valid.astype(jnp.int32)
    served = served.at[c].add(valid.astype(jnp.int32))
    return (seg, seen, place, served), out

  init = (jnp.zeros((), jnp.int32), jnp.zeros(n, bool), jnp.zeros((), jnp.int32),
          jnp.zeros(n, jnp.int32))
  _, (seg, place, who, nth) = lax.scan(cut, init, seq)
  # Invalid entries carry segment index ``length``: dropped by the scatters.
  src = jnp.full((length, n), -1, jnp.int32).at[seg, who].set(
      step_of[jnp.minimum(nth, num_steps - 1), who], mode="drop")
  rank = jnp.broadcast_to(n + jnp.arange(n, dtype=jnp.int32), (length, n))
  rank = rank.at[seg, who].set(place, mode="drop")
  return Schedule(src, jnp.argsort(rank, axis=1).astype(jnp.int32))


def round_schedule(setup, key, mask, clients, dominant, rank) -> Schedule:
  """The round's schedule under ``setup.order_rule``.

  Args:
    setup: ``order``, ``order_rule`` and ``batches_per_turn``.
    key: the round's order key.
    mask: ``(T, n, B)`` the round's batch masks.
    clients: ``(n,)`` participating client ids.
    dominant: ``(K,)`` dominant label of every client.
    rank: ``(L,)`` the run's label cycle.
  """
  num_steps, n = mask.shape[:2]
  if setup.order_rule == "steps":
    return steps(processing_orders(setup.order, key, num_steps, clients, dominant,
                                          rank))
  if setup.order_rule != "authors":
    raise ValueError(f"order_rule={setup.order_rule!r}; allowed: {RULES}")
  live = jnp.any(mask, axis=2)
  return segments(authors_sequence(setup, key, live, clients, dominant, rank), live)


def authors_sequence(setup, key, live, clients, dominant, rank):
  """The round's serving sequence under ``order_rule = "authors"``
  (:func:`queue_sequence` from the round's starting queue).

  Args:
    setup: ``order`` and ``batches_per_turn``.
    key: the round's order key.
    live: ``(T, n)`` whether participant c has a batch at step t.
    clients, dominant, rank: as :func:`round_schedule`.

  Returns:
    ``(T * n,)`` participant positions, -1 after the last batch.
  """
  num_steps, n = live.shape
  cyclic = "cyclic" if setup.order in ("cyclic", "cyclic_reverse") else "fixed"
  first = (processing_orders(cyclic, key, 1, clients, dominant, rank)[0]
           if setup.order != "random" else jnp.arange(n, dtype=jnp.int32))
  return queue_sequence(setup.order, key, live.sum(0), first, setup.batches_per_turn,
                        num_steps * n)
