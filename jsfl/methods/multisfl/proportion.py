"""The adaptive sampling proportion: FGN (Eq. 5) with the paper's rule (Eq.
6), and the authors' gradient signal with their critical-learning-period
(``--DB 1``) and relative (``--DB 2``) rules
(docs/methods-multisfl.md#adaptive-proportion).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def fgn(grad_sums, steps, lr):
  """Eq. 5: ``mean_i -lr ||g_i||^2`` with ``g_i = grad_sums_i / steps_i``.

  Args:
    grad_sums: pytree with a leading branch axis, the summed server-portion
      gradients of every branch.
    steps: ``(n,)`` server steps of every branch.
    lr: eta.
  """
  sq = sum(jnp.sum(a.reshape(a.shape[0], -1) ** 2, axis=1)
           for a in jax.tree.leaves(grad_sums))
  steps = jnp.maximum(steps, 1).astype(jnp.float32)
  return jnp.mean(-lr * sq / steps ** 2)


def next_proportion(p, fgn_now, fgn_prev, has_prev, p_min, p_max):
  """The paper's rule (docs/methods-multisfl.md#adaptive-proportion):
  ``clip(p (1 + (FGN(r) - FGN(r-1)) / |FGN(r-1)|), p_min, p_max)``.

  ``p`` is kept in the first round, when ``FGN(r-1) = 0``, or when the update
  is not finite.
  """
  denom = jnp.abs(fgn_prev)
  rel = (fgn_now - fgn_prev) / jnp.where(denom > 0, denom, 1.0)
  new = jnp.clip(p * (1.0 + rel), p_min, p_max)
  ok = has_prev & (denom > 0) & jnp.isfinite(new)
  return jnp.where(ok, new, p)


def push_signal(hist, g):
  """The signal history with this round's ``g`` appended (oldest dropped)."""
  return jnp.concatenate([hist[1:], jnp.reshape(g, (1,)).astype(hist.dtype)])


def windowed_change(hist):
  """The authors' CLP test on ``hist`` (W + 1 rounds, newest last): the
  relative change from the mean of the W rounds before the newest to the
  mean of the last W (old mean floored at 1e-7).  It is positive exactly
  when the newest signal exceeds the one W rounds earlier; the zeros padding
  the first W rounds make every early round a critical one."""
  old = jnp.maximum(jnp.mean(hist[:-1]), 1e-7)
  return (jnp.mean(hist[1:]) - old) / old


def clp_proportion(p, delta, p_min, p_threshold, p_step):
  """The authors' ``--DB 1`` rule: in a critical learning period (``delta >
  0``) p doubles up to ``p_threshold``, then grows by ``p_step`` a round;
  otherwise it halves, down to ``p_min``."""
  grow = jnp.where(p >= p_threshold, p + p_step, jnp.minimum(p_threshold, 2.0 * p))
  return jnp.where(delta > 0, grow, jnp.maximum(p_min, p / 2.0))


def relative_proportion(p, delta, round_, p_min, p_late_min):
  """The authors' ``--DB 2`` rule: ``p (1 + delta)``, floored at ``p_min``
  in rounds 1-10 and at ``p_late_min`` later; unchanged after round 0."""
  floor = jnp.where(round_ > 10, p_late_min, p_min)
  return jnp.where(round_ != 0, jnp.maximum(floor, p * (1.0 + delta)), p)


def signal(sq_sums, lr, local_epochs):
  """The authors' gradient signal of a round: per branch ``lr`` times the
  mean over epochs of the epoch's summed per-step ``2|g_c|^2 + |g_s|^2``,
  then the mean over branches."""
  return jnp.mean(lr * sq_sums / local_epochs)


def sq_norm(tree):
  return sum(jnp.sum(jnp.square(a)) for a in jax.tree.leaves(tree))
