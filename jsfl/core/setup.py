"""The description of a run that every round closes over.

A :class:`Setup` holds a run's config values: shapes, counts, choices and the
method's option set.  Its *batchable* values (the learning-rate schedule's
``lr``, ``lr_decay``, ``lr_min`` and the option-set fields declared
``batchable``) may differ between the slots of one program, so a round never
reads them here: it reads its slot's values from ``data.hyper``
(:class:`jsfl.core.data.Hyper`, :func:`jsfl.core.data.hyper`).  The programs
close over :meth:`Setup.static`, in which those values are None, so a round
that reads one from the setup fails while it is traced instead of silently
using one slot's value for all.  Host-side code (validation, artifacts,
records) reads the setup of its own cell, whose values are all there.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from jsfl.core.optim import make_optimizer
from jsfl.models.base import StagedModel
from jsfl.options import NoOptions, options_of

# Where a sequential server's participants run part-1 (exec.client_pass):
# inside the server's visit of each, or side by side before the visits.
CLIENT_PASSES = ("per_visit", "batched")

# The weights of a round-end mean of the clients' portions (method.aggregation):
# each client's sample count (FedAvg's), or one per client (every Hydra
# authors' script averages so).
AGGREGATIONS = ("samples", "uniform")


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
  """A run's config values (see the module docstring for the batchable ones)."""

  model: StagedModel
  num_clients: int            # K
  clients_per_round: int      # n
  max_size: int               # widest client row of the index table
  batch_size: int = 64
  local_epochs: int = 1
  cut: int = 2
  order: str = "random"
  order_rule: str = "authors"  # engine.schedule.RULES
  batches_per_turn: int = 1   # cyclic orders under order_rule="authors"
  cycle: str = "label"        # what cyclic orders cycle through (engine.orders.CYCLES)
  drop_last: bool = False     # a client's last partial batch of an epoch is left out
  aggregation: str = "samples"  # round-end client weights (AGGREGATIONS)
  shuffle: bool = True        # False: a client's batches in its index order every epoch
  augment: str = "none"      # training-time augmentation (jsfl.data.augment.AUGMENTS)
  lr: float | None = 0.05     # batchable
  lr_decay: float | None = 1.0  # batchable
  lr_min: float | None = 0.0  # batchable
  lr_decay_start: int = 1     # first decayed round
  momentum: float = 0.0
  weight_decay: float = 0.0
  weight_decay_scope: str = "all"  # jsfl.core.optim.WEIGHT_DECAY_SCOPES
  optimizer: str = "sgd"      # optim.name (jsfl.core.optim.OPTIMIZERS)
  clip_norm: float = 0.0      # optim.clip_norm; 0 = no clipping
  client_exec: str = "vmap"
  client_pass: str = "per_visit"  # CLIENT_PASSES
  server_unroll: int = 1
  options: Any = NoOptions()  # the method's option set (jsfl.options.option_set)

  @property
  def num_classes(self) -> int:
    return self.model.num_classes

  @functools.cached_property
  def tx(self):
    """The run's optimiser (``optim.name``, momentum, weight decay, gradient
    clipping) as an optax chain, built once per setup; every portion steps
    with it."""
    return make_optimizer(self.momentum, self.weight_decay, self.optimizer,
                          clip_norm=self.clip_norm)

  @functools.cached_property
  def client_tx(self):
    """The optimiser of the clients' part-1 in a split round: :attr:`tx`,
    or with ``weight_decay_scope = "part2"`` the same chain without its
    weight decay (its state has ``tx``'s structure), so only the server's
    portions are decayed (Hydra App. H.5)."""
    if self.weight_decay_scope == "all":
      return self.tx
    return make_optimizer(self.momentum, self.weight_decay, self.optimizer, decay=False,
                          clip_norm=self.clip_norm)

  def replace(self, **kw) -> Setup:
    return dataclasses.replace(self, **kw)

  def static(self) -> Setup:
    """This setup without its batchable values (None): what a program of
    several slots closes over."""
    batchable = {k: None for k, o in options_of(type(self.options)).items() if o.batchable}
    return self.replace(lr=None, lr_decay=None, lr_min=None,
                        options=dataclasses.replace(self.options, **batchable))
