"""The static description of a run that every round closes over."""

from __future__ import annotations

import dataclasses

from jsfl.models.base import StagedModel


@dataclasses.dataclass(frozen=True, eq=False)
class Setup:
  """Static description of a run that a round function closes over."""

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
  drop_last: bool = False     # a client's last partial batch of an epoch is left out
  lr: float = 0.05
  lr_decay: float = 1.0
  lr_min: float = 0.0
  lr_decay_start: int = 1     # first decayed round
  momentum: float = 0.0
  weight_decay: float = 0.0
  client_exec: str = "vmap"
  server_unroll: int = 1
  options: object = ()        # the method's option set (or (key, value) pairs)

  @property
  def num_classes(self) -> int:
    return self.model.num_classes

  def replace(self, **kw) -> Setup:
    return dataclasses.replace(self, **kw)
