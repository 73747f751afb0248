"""Scanning a round's batch steps (or segments) and skipping the empty ones;
the models a watched round records after each of its steps."""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from jax import lax


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


def live_first(mask):
  """The step order that puts the live steps of ``(T, ..., B)`` batch masks
  first, each column in its own order (stable), the empty ones last: a
  client's empty steps are no-ops, so a loop over this order may end after
  the last live one.  ``(T, ...)`` indices into the step axis."""
  return jnp.argsort(~jnp.any(mask, axis=-1), axis=0, stable=True)


def live_steps(*masks):
  """``(T,)`` whether each step of ``(T, ...)`` masks has any real sample."""
  out = None
  for m in masks:
    s = jnp.any(m.reshape(m.shape[0], -1), axis=1)
    out = s if out is None else out | s
  return out


class StepModels(NamedTuple):
  """The models of a watched round (``run.step_confusion``) after each of its
  first ``S`` steps.  A split round's step is a run of consecutive server
  visits of participants with one dominant label (a client's turn of
  ``batches_per_turn`` batches; under the paper's phi, the phi clients of a
  label), the last one ending with the round
  (:func:`jsfl.engine.split.watched_round`); a sequential round's is one
  client's training (:meth:`jsfl.engine.sequential.SequentialRounds.watched_round`)."""

  models: Any           # (S, ...) the model after step s (zeros past ``num_steps``)
  labels: jax.Array     # (S,) the dominant label step s served (-1 past ``num_steps``)
  num_steps: jax.Array  # steps recorded, at most S
