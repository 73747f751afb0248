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


def clip_grad_norm(max_norm: float) -> optax.GradientTransformation:
  """Scales the gradient by ``min(1, max_norm / (||g|| + 1e-6))``, ``||g||``
  the 2-norm over every leaf: PyTorch's ``clip_grad_norm_`` before
  ``optimizer.step()``, as FedSeq's authors' code runs it (``--clip``).
  The 1e-6 is PyTorch's; a gradient under the bound passes unchanged, so
  its step is the unclipped one bit for bit."""
  def update(updates, state, params=None):
    del params
    norm = optax.tree.norm(updates)
    scale = max_norm / (norm + 1e-6)
    # Under the bound the gradient itself goes on, not g * 1: a product the
    # compiler can fuse with the weight decay's add into one multiply-add
    # rounds differently from the unclipped program's, so the run would
    # drift from the unclipped one though no step was clipped.
    return jax.tree.map(lambda g: jnp.where(scale < 1.0, (g * scale).astype(g.dtype), g),
                        updates), state
  return optax.GradientTransformation(lambda params: optax.EmptyState(), update)


def make_optimizer(momentum: float = 0.0, weight_decay: float = 0.0, name: str = "sgd",
                   decay: bool = True, clip_norm: float = 0.0):
  """``optim.name`` as an optax chain with an injected learning rate, so a
  round can set its decayed value (:func:`round_lr`) without recompiling.

  ``sgd``: SGD as in PyTorch (what the papers' code runs): weight decay
  added to the gradient before momentum.  ``adam``: Adam (``momentum`` is
  its b1 when > 0), the weight decay added to the gradient first as well
  (PyTorch's ``Adam(weight_decay=...)``, not AdamW).

  ``clip_norm > 0`` clips the gradient's 2-norm first
  (:func:`clip_grad_norm`), before the weight decay is added, as PyTorch's
  ``clip_grad_norm_`` does ahead of ``step()``.  The norm is over the tree
  one optimiser state steps: a whole model in parallel and sequential FL,
  one party's portion in split learning (each party clips its own, as a
  ``clip_grad_norm_`` per party's optimiser would).

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
    if clip_norm:
      tx = optax.chain(clip_grad_norm(clip_norm), tx)
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
