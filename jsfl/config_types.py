"""Typed sections of a resolved config, generated from
``jsfl.config.SCHEMA`` by ``python -m jsfl.config --write-types`` (a test
fails while it is stale; do not edit by hand).

:func:`jsfl.config.typed` builds a :class:`Config` from a resolved config
(the dict ``config.json`` stores); an open section's other keys (options
of the dataset, partition, model or method) are its ``extra``.
"""

from __future__ import annotations

import dataclasses
from typing import Any


@dataclasses.dataclass(frozen=True)
class RunSection:
  """``[run]`` (docs/config.md)."""

  name: str
  out_dir: str
  dir: str
  rounds: int
  eval_every: int
  seeds: int
  seed: int
  checkpoint_every: int
  on_divergence: str
  divergence_loss: float
  trackers: list[str]
  profile: list[int]
  step_confusion: bool
  step_confusion_rounds: list[int]
  step_confusion_steps: int


@dataclasses.dataclass(frozen=True)
class DatasetSection:
  """``[dataset]`` (docs/config.md)."""

  name: str
  data_dir: str
  download: bool
  augment: str
  mean: list[float]
  std: list[float]
  extra: dict[str, Any]  # the section's other keys


@dataclasses.dataclass(frozen=True)
class PartitionSection:
  """``[partition]`` (docs/config.md)."""

  name: str
  num_clients: int
  seed: int
  train_size: float
  train_split_seed: int
  extra: dict[str, Any]  # the section's other keys


@dataclasses.dataclass(frozen=True)
class ModelSection:
  """``[model]`` (docs/config.md)."""

  name: str
  cut: int
  norm: str
  init: str
  conv_impl: str
  eval_conv_impl: str
  depthwise_impl: str
  im2col_grad: str
  im2col_narrow: str
  padding: str
  extra: dict[str, Any]  # the section's other keys


@dataclasses.dataclass(frozen=True)
class MethodSection:
  """``[method]`` (docs/config.md)."""

  name: str
  order: str
  order_rule: str
  cycle: str
  batches_per_turn: int
  clients_per_round: int
  local_epochs: int
  batch_size: int
  drop_last: bool
  shuffle: bool
  aggregation: str
  extra: dict[str, Any]  # the section's other keys


@dataclasses.dataclass(frozen=True)
class OptimSection:
  """``[optim]`` (docs/config.md)."""

  name: str
  lr: float
  lr_decay: float
  lr_min: float
  lr_decay_start: int
  momentum: float
  weight_decay: float
  clip_norm: float
  weight_decay_scope: str


@dataclasses.dataclass(frozen=True)
class ExecSection:
  """``[exec]`` (docs/config.md)."""

  client_exec: str
  seed_exec: str
  client_pass: str
  precision: str
  server_unroll: int
  mesh: str
  eval_batch: int
  progress: bool
  compile_cache: str
  max_slots: int


@dataclasses.dataclass(frozen=True)
class Config:
  """A resolved config, section by section."""

  run: RunSection
  dataset: DatasetSection
  partition: PartitionSection
  model: ModelSection
  method: MethodSection
  optim: OptimSection
  exec: ExecSection


SECTIONS: dict[str, type] = {
    "run": RunSection,
    "dataset": DatasetSection,
    "partition": PartitionSection,
    "model": ModelSection,
    "method": MethodSection,
    "optim": OptimSection,
    "exec": ExecSection,
}
