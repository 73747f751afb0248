"""A trainable slice of the model with its optimiser state."""

from __future__ import annotations

from typing import Any

import optax
from flax import struct

from jsfl.core.optim import gate, with_lr
from jsfl.core.plan import fresh_opt_states


@struct.dataclass
class Portion:
  """A trainable slice of the model: parameters, BatchNorm statistics and
  the optimiser state that moves them.  Leaves may carry leading axes (a
  stack of client copies, of heads)."""

  params: Any
  stats: Any
  opt: Any

  def step(self, tx, grads, stats, active) -> Portion:
    """One optimiser step and the forward pass's new statistics, both kept
    only where ``active``: momentum and weight decay must not move a portion
    on a step that had no data for it."""
    updates, opt = tx.update(grads, self.opt, self.params)
    new = Portion(optax.apply_updates(self.params, updates), stats, opt)
    return gate(active, new, self)


def fresh(tx, lr, params, stats) -> Portion:
  """A portion with a new optimiser state at learning rate ``lr``."""
  return Portion(params, stats, with_lr(tx.init(params), lr))


def fresh_stack(plan, params, stats) -> Portion:
  """Stacked portions, each with its own new optimiser state at the round's
  learning rate (a client's optimiser lives one round, docs/setting.md#optimisation)."""
  return Portion(params, stats, fresh_opt_states(plan, params))


def kept(opt, lr, params, stats) -> Portion:
  """A portion whose optimiser state persists across rounds (a server's)."""
  return Portion(params, stats, with_lr(opt, lr))
