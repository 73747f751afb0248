"""A method as a value, and what its rounds send over the network."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

import jax
import jax.numpy as jnp

from jsfl.core.setup import Setup
from jsfl.models.base import StagedModel
from jsfl.options import NoOptions


class Algorithm(Protocol):
  """What a method builds once per run (fedjax's ``FederatedAlgorithm``):
  ``init(key) -> state`` and ``round(state, data, key) -> (state, metrics)``,
  both pure and traceable; the run maps them over its slots and jits them."""

  def init(self, key: jax.Array) -> Any: ...

  def round(self, state: Any, data: Any, key: jax.Array) -> tuple[Any, dict]: ...


class Build(Protocol):
  def __call__(self, setup: Setup) -> Algorithm: ...


class OutputModel(Protocol):
  def __call__(self, setup: Setup, state: Any) -> tuple[Any, Any]: ...


class Communication(Protocol):
  def __call__(self, setup: Setup, samples: Any) -> tuple[Any, Any]: ...


class Predict(Protocol):
  def __call__(self, setup: Setup, state: Any, x: jax.Array) -> jax.Array: ...


class Validate(Protocol):
  def __call__(self, setup: Setup) -> None: ...


class Artifacts(Protocol):
  def __call__(self, setup: Setup, partitions: list[dict]) -> dict: ...


class LabelRank(Protocol):
  def __call__(self, state: Any) -> jax.Array: ...


@dataclasses.dataclass(frozen=True, eq=False)
class Method:
  """A method as a value: the ``METHOD`` of its module in ``jsfl/methods/``,
  known by the module's name (``jsfl.methods.catalog``).

  * ``build(setup) -> Algorithm``: the method's algorithm for a run, built
    once (:class:`Algorithm`); :mod:`jsfl.train.programs` maps its
    ``init`` and ``round`` over the slot axis and jits them once;
    :meth:`rounds` is it with the round's traffic
    in its metrics: ``bytes_up`` / ``bytes_down``, the round's own count
    when it returns one (MultiSFL's replay traffic), else
    ``communication`` of its ``samples``;
  * ``output_model(setup, state) -> (params, stats)``: the model evaluated;
  * ``communication(setup, samples) -> (bytes_up, bytes_down)`` of a round
    from its processed-sample count (a Python int, or a traced float32 inside
    the round);
  * ``predict(setup, state, x) -> logits``: for outputs that are not one
    staged model (SplitFedV3, MultiHead); None evaluates ``output_model``;
  * ``validate(setup)``: raises ValueError for an impossible option value
    that needs the model or the data sizes to see;
  * ``artifacts(setup, partitions) -> {file name: JSON object}``: extra
    files of the run directory (Hydra's ``groups.json``);
  * ``label_rank(state) -> (L,)``: the run's label cycle (``(K,)``, the
    client cycle, under ``method.cycle = "client"``), for methods with
    cyclic processing orders (per-position accuracy);
  * ``options``: the method's option set (:func:`jsfl.options.option_set`),
    its own ``[method]`` keys; a run's ``Setup.options`` is an instance.

  ``init(setup, key)`` and ``round(setup, state, data, key)`` build the
  algorithm on each call: conveniences for tools and tests, not for a run.
  """

  build: Build
  output_model: OutputModel
  communication: Communication
  predict: Predict | None = None
  validate: Validate | None = None
  artifacts: Artifacts | None = None
  label_rank: LabelRank | None = None
  options: type = NoOptions

  def rounds(self, setup: Setup) -> Algorithm:
    """The run's algorithm (built once), its round counting its traffic."""
    return CountingBytes(self.build(setup), setup, self.communication)

  def init(self, setup: Setup, key):
    return self.build(setup).init(key)

  def round(self, setup: Setup, state, data, key):
    return self.rounds(setup).round(state, data, key)


@dataclasses.dataclass(frozen=True)
class CountingBytes:
  """``algorithm`` whose round's metrics carry the round's bytes up and down
  (float32: a long round's traffic exceeds int32)."""

  algorithm: Algorithm
  setup: Setup
  communication: Communication

  def init(self, key):
    return self.algorithm.init(key)

  def round(self, state, data, key):
    state, metrics = self.algorithm.round(state, data, key)
    return state, self.counted(metrics)

  def counted(self, metrics: dict) -> dict:
    """A round's ``metrics`` with its traffic (its own count where it has one)."""
    if "bytes_up" not in metrics:
      up, down = self.communication(self.setup, metrics["samples"].astype(jnp.float32))
      metrics = {**metrics, "bytes_up": jnp.asarray(up, jnp.float32),
                 "bytes_down": jnp.asarray(down, jnp.float32)}
    return metrics


@dataclasses.dataclass(frozen=True)
class Functions:
  """An :class:`Algorithm` from a method's module-level
  ``init(setup, key)`` and ``round(setup, state, data, key)``: for methods
  whose round builds nothing and closes over the setup alone (MultiHead)."""

  setup: Setup
  init_fn: Callable
  round_fn: Callable

  def init(self, key):
    return self.init_fn(self.setup, key)

  def round(self, state, data, key):
    return self.round_fn(self.setup, state, data, key)


def label_rank_of(state):
  """``state.label_rank``: the ``Method.label_rank`` of states that hold one."""
  return state.label_rank


LABEL_BYTES = 4  # labels travel as int32


def portion_bytes(model: StagedModel, start: int, stop: int, stats: bool = True) -> int:
  """Bytes of stages ``[start, stop)``: parameters plus BatchNorm statistics
  (``stats=False``: the parameters alone, the size of a per-parameter tensor
  such as a Fisher diagonal)."""
  params, bn = model.shapes()
  leaves = jax.tree.leaves((params[start:stop], bn[start:stop] if stats else ()))
  return int(sum(a.size * a.dtype.itemsize for a in leaves))


def activation_size(model: StagedModel, cut: int) -> int:
  """Elements of one sample's cut-layer activation."""
  params, stats = model.shapes()
  x = jax.ShapeDtypeStruct((1,) + tuple(model.input_shape), jnp.float32)
  out = jax.eval_shape(
      lambda p, s, x: model.apply(p, s, x, train=False)[0],
      params[:cut], stats[:cut], x)
  return int(out.size)


def whole_model(setup: Setup, state):
  """The output of a method whose state holds one model (``params``,
  ``stats``): that model."""
  return state.params, state.stats


def staged_model(setup: Setup, state):
  """The output of a split method whose state holds one part-1 and one
  part-2: the two joined into the whole model."""
  return state.part1 + state.part2, state.part1_stats + state.part2_stats


def split_communication(setup: Setup, samples: int):
  """Per round: part-1 down and up per participant, plus per processed sample
  the cut-layer activation and label up and the activation gradient down."""
  act = activation_size(setup.model, setup.cut) * 4
  p1 = portion_bytes(setup.model, 0, setup.cut)
  n = setup.clients_per_round
  return (n * p1 + samples * (act + LABEL_BYTES), n * p1 + samples * act)
