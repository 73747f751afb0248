"""The training loss every split and parallel round starts from."""

from __future__ import annotations

import jax.numpy as jnp
import optax


# --------------------------------------------------------------------- loss
def masked_cross_entropy(logits, labels, mask):
  """Mean cross-entropy over the valid samples of a batch (0 if none).

  Matches PyTorch's mean reduction on a ragged last batch: the mean is over
  the samples that exist, not over the padded batch size.
  """
  ce = optax.softmax_cross_entropy_with_integer_labels(logits, labels)
  m = mask.astype(ce.dtype)
  return jnp.sum(ce * m) / jnp.maximum(jnp.sum(m), 1.0)
