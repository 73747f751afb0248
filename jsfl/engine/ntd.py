"""FedNTD's not-true distillation (Lee et al., "Preservation of the Global
Knowledge by Not-True Distillation in Federated Learning", NeurIPS 2022;
docs/methods-sequential.md): its loss and option set, shared by the parallel
FedNTD (``jsfl.methods.fedntd``) and its SFL form
(``jsfl.methods.sfl_fedntd``), where the logits come out of the server
portion.  :func:`ntd_loss` is a pure function of two logit arrays."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from jsfl.options import option, option_set

_NEG = -1e9  # a finite "minus infinity": keeps 0 * log 0 terms free of NaN


# beta < 0 would push the local model away from the global one; tau divides
# the logits (tau = 0 is a division by zero).
@option_set
class FedNTDOptions:
  beta: float = option(1.0, "weight of the not-true distillation term (0 = FedAvg)",
                       range="[0, inf)", batchable=True)
  tau: float = option(1.0, "distillation temperature", range="(0, inf)", batchable=True)


def not_true_log_softmax(logits, labels, tau):
  """Log-softmax over the not-true classes; the true class gets ``_NEG``.

  Args:
    logits: ``(B, L)``.
    labels: ``(B,)`` true classes.
    tau: temperature.

  Returns:
    ``(B, L)`` log-probabilities over the L-1 not-true classes (the true
    class's entry is a huge negative number, its probability 0).
  """
  true = jax.nn.one_hot(labels, logits.shape[-1], dtype=bool)
  return jax.nn.log_softmax(jnp.where(true, _NEG, logits / tau), axis=-1)


def ntd_loss(local_logits, global_logits, labels, mask, tau=1.0):
  """FedNTD's not-true distillation loss, mean over the valid samples.

  Args:
    local_logits: ``(B, L)`` logits of the model being trained.
    global_logits: ``(B, L)`` logits of the global (teacher) model; no
      gradient flows into them.
    labels: ``(B,)`` true classes.
    mask: ``(B,)`` valid samples.
    tau: temperature.

  Returns:
    ``tau^2 * mean_i KL(q~_global_i || q~_local_i)`` (0 for an empty batch).
  """
  true = jax.nn.one_hot(labels, local_logits.shape[-1], dtype=bool)
  log_q_l = not_true_log_softmax(local_logits, labels, tau)
  log_q_g = not_true_log_softmax(jax.lax.stop_gradient(global_logits), labels, tau)
  kl = jnp.sum(jnp.where(true, 0.0, jnp.exp(log_q_g) * (log_q_g - log_q_l)), axis=-1)
  m = mask.astype(kl.dtype)
  return tau ** 2 * jnp.sum(kl * m) / jnp.maximum(jnp.sum(m), 1.0)
