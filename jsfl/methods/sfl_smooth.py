"""SFL with a label-smoothed server loss: the worked example of
``docs/extending.md``.

Label smoothing: Szegedy et al., "Rethinking the Inception Architecture for
Computer Vision", CVPR 2016, Sec. 7.  The server portion is trained on the
cross-entropy against ``(1 - eps) * onehot(y) + eps / L``; everything else is
SFL (:mod:`jsfl.engine.sfl_family`): one sequential server portion, client portions
averaged (``method.aggregation``).  ``eps = 0`` is SFL exactly (tested).  The logged
``loss`` is the smoothed objective.
"""

import jax
import jax.numpy as jnp
import optax

from jsfl.core.method import Method, label_rank_of, split_communication
from jsfl.engine import sfl_family
from jsfl.options import option, option_set

State, init, output_model = sfl_family.State, sfl_family.init, sfl_family.output_model
communication = split_communication


@option_set
class SmoothOptions:
  smoothing: float = option(0.1, "label smoothing eps", range="[0, 1)", batchable=True)


def smoothed_cross_entropy(eps: float, num_classes: int):
  """A server loss (see ``split.server_update``): masked mean smoothed CE."""
  def loss(logits, y, mask):
    target = optax.smooth_labels(jax.nn.one_hot(y, num_classes), eps)
    m = mask.astype(logits.dtype)
    ce = jnp.sum(optax.softmax_cross_entropy(logits, target) * m) / jnp.maximum(m.sum(), 1)
    return ce, ce, jnp.zeros(())
  return loss


def build(setup):
  """SFL whose server loss is smoothed by the round's ``smoothing``."""
  def round_loss(plan):
    return smoothed_cross_entropy(plan.options.smoothing, setup.num_classes)
  return sfl_family.rounds(setup, sfl_family.algorithm(setup, round_loss=round_loss))


def round(setup, state, data, key):
  return build(setup).round(state, data, key)


METHOD = Method(build, output_model, communication, label_rank=label_rank_of,
                options=SmoothOptions)
