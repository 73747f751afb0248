"""How a method's many models make one prediction: the shared readouts of
methods whose output is not one staged model (SplitFedV3's per-client
part-1 copies, MultiHead's per-client heads)."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax


def max_logit_select(logits_fn: Callable, stacked, x):
  """Per sample, the logits of the candidate with the largest max-logit.

  Args:
    logits_fn: ``(candidate, x) -> (N, L)`` logits of one candidate.
    stacked: the candidates, a pytree with a leading candidate axis.
    x: the (normalised) inputs.

  Returns:
    ``(N, L)`` logits; ties go to the lowest candidate index.
  """
  first = logits_fn(jax.tree.map(lambda a: a[0], stacked), x)
  rest = jax.tree.map(lambda a: a[1:], stacked)

  def pick(best, cand):
    logits = logits_fn(cand, x)
    better = jnp.max(logits, -1) > jnp.max(best, -1)
    return jnp.where(better[:, None], logits, best), None

  best, _ = lax.scan(pick, first, rest)
  return best
