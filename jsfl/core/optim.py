"""The optimiser (SGD as the papers' PyTorch code runs it, by default) and the
round's learning rate."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax

# --------------------------------------------------------------- optimiser
OPTIMIZERS = ("sgd", "adam")
# Which portions optim.weight_decay moves (Hydra App. H.5, Fig. 19): every
# one, or only the server's part-2 (the clients' part-1 steps undecayed).
WEIGHT_DECAY_SCOPES = ("all", "part2")


def make_optimizer(momentum: float = 0.0, weight_decay: float = 0.0, name: str = "sgd",
                   decay: bool = True):
  """``optim.name`` as an optax chain with an injected learning rate, so a
  round can set its decayed value (:func:`round_lr`) without recompiling.

  ``sgd``: SGD as in PyTorch (what the papers' code runs): weight decay
  added to the gradient before momentum.  ``adam``: Adam (``momentum`` is
  its b1 when > 0), the weight decay added to the gradient first as well
  (PyTorch's ``Adam(weight_decay=...)``, not AdamW).

  ``decay=False``: the same chain with its weight decay at 0 (it adds
  ``0 * w``, so a step is exactly the undecayed one): the optimiser of the
  portions ``optim.weight_decay_scope = "part2"`` leaves undecayed.  Its
  state has the decayed chain's structure, so a state either one built
  steps with both.
  """
  if name not in OPTIMIZERS:
    raise ValueError(f"optim.name={name!r}; allowed: {', '.join(OPTIMIZERS)}")

  def chain(learning_rate):
    if name == "sgd":
      tx = optax.sgd(learning_rate, momentum=momentum or None)
    else:
      tx = optax.adam(learning_rate, b1=momentum or 0.9)
    if weight_decay:
      tx = optax.chain(optax.add_decayed_weights(weight_decay if decay else 0.0), tx)
    return tx
  return optax.inject_hyperparams(chain)(learning_rate=0.0)


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
