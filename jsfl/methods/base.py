"""What every method shares: the static setup, client execution, the registry.

A method is a value, :class:`Method` (FedJAX-style ``init`` + ``apply``, here
``round``), defined as ``METHOD`` in its module and registered by name in
``jsfl.methods.registry``.  Its round is built on one of the two engines:
``jsfl.engine.parallel`` (FedAvg and its loss-term variants) or
``jsfl.engine.split`` (the split family).

``data`` is a dict of device arrays: ``x`` (uint8 train images), ``y``,
``mean``, ``std`` (shared by seeds) and ``table`` / ``sizes`` / ``dominant``
(one client index table per seed).
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax import lax

from jsfl.engine import batching, common, sharding
from jsfl.methods.registry import METHODS
from jsfl.models.base import StagedModel

CLIENT_EXECS = ("vmap", "map", "unroll")


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


def map_clients(fn: Callable, how: str, *args):
  """Applies ``fn`` to each slice of ``args`` along their leading client axis.

  ``vmap`` batches all clients into one program (fastest on GPU and for dense
  layers); ``map`` is a rolled sequential loop (``lax.map``), ``unroll`` a
  Python-unrolled loop inside the same jit, which XLA:CPU may run faster for
  convolutions with the ``xla`` lowering (see PERF-NOTES).  All three compute
  the same values.
  """
  if how == "vmap":
    # Under a device mesh the client axis is laid on the mesh's client axis.
    return sharding.constrain_clients(jax.vmap(fn)(*sharding.constrain_clients(args)))
  if how == "map":
    return lax.map(lambda a: fn(*a), args)
  if how == "unroll":
    n = jax.tree.leaves(args)[0].shape[0]
    outs = [fn(*jax.tree.map(lambda a, i=i: a[i], args)) for i in range(n)]
    return jax.tree.map(lambda *xs: jnp.stack(xs), *outs)
  raise ValueError(f"client_exec={how!r}; allowed: {CLIENT_EXECS}")


class RoundPlan(NamedTuple):
  """A round's random decisions and optimiser, shared by every method."""

  clients: jax.Array    # (n,) participating client ids, ascending
  sizes: jax.Array      # (n,) their sample counts (aggregation weights)
  idx: jax.Array        # (T, n, B) sample indices of every batch step
  mask: jax.Array       # (T, n, B) which of them exist
  order_key: jax.Array  # for the processing order of sequential methods
  tx: optax.GradientTransformation
  lr: jax.Array         # this round's decayed learning rate


def plan_round(setup: Setup, data, key, round_idx) -> RoundPlan:
  """Samples participants, shuffles their batches, and sets the round's lr."""
  k_part, k_batch, k_order = jax.random.split(key, 3)
  clients = common.sample_clients(k_part, setup.num_clients,
                                  setup.clients_per_round)
  sizes = data["sizes"][clients]
  idx, mask = batching.round_batches(k_batch, data["table"][clients], sizes,
                                     setup.batch_size, setup.local_epochs, clients,
                                     drop_last=setup.drop_last)
  tx = common.make_optimizer(setup.momentum, setup.weight_decay)
  lr = common.round_lr(setup.lr, setup.lr_decay, setup.lr_min, round_idx,
                       setup.lr_decay_start)
  return RoundPlan(clients, sizes, idx, mask, k_order, tx, lr)


def fresh_opt_states(plan: RoundPlan, stacked_params):
  """Per-client optimiser states, rebuilt every round (SPEC 1.3)."""
  return jax.vmap(lambda p: common.with_lr(plan.tx.init(p), plan.lr))(stacked_params)


def round_metrics(plan: RoundPlan, loss_sums, clients=None) -> dict:
  """Mean train loss, samples processed, and the logged client order."""
  samples = jnp.sum(plan.mask)
  return {"loss": jnp.sum(loss_sums) / jnp.maximum(samples, 1),
          "samples": samples,
          "clients": plan.clients if clients is None else clients}




@dataclasses.dataclass(frozen=True, eq=False)
class Method:
  """A method as a value (the ``METHOD`` of its module, registered by name in
  ``jsfl.methods.registry`` with its option set).

  * ``init(setup, key) -> state``: a pytree;
  * ``round(setup, state, data, key) -> (state, metrics)``: one round, pure
    and jittable; the runner maps it over the seed axis and jits it once.
    ``METHOD.round``'s metrics always hold the round's ``bytes_up`` /
    ``bytes_down``: the round's own count when it returns one (MultiSFL's
    replay traffic), else ``communication`` of its ``samples``;
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
  * ``label_rank(state) -> (L,)``: the run's label cycle, for methods with
    cyclic processing orders (per-position accuracy).
  """

  init: Callable
  round: Callable
  output_model: Callable
  communication: Callable
  predict: Callable | None = None
  validate: Callable | None = None
  artifacts: Callable | None = None
  label_rank: Callable | None = None

  def __post_init__(self):
    object.__setattr__(self, "round", _counting_bytes(self.round, self.communication))


def _counting_bytes(round_fn: Callable, communication: Callable) -> Callable:
  """``round_fn`` whose metrics carry the round's bytes up and down (float32:
  a long round's traffic exceeds int32)."""
  def round_with_bytes(setup, state, data, key):
    state, metrics = round_fn(setup, state, data, key)
    if "bytes_up" not in metrics:
      up, down = communication(setup, metrics["samples"].astype(jnp.float32))
      metrics = {**metrics, "bytes_up": jnp.asarray(up, jnp.float32),
                 "bytes_down": jnp.asarray(down, jnp.float32)}
    return state, metrics
  return round_with_bytes


def label_rank_of(state):
  """``state.label_rank``: the ``Method.label_rank`` of states that hold one."""
  return state.label_rank


def get_method(name: str) -> Method:
  """The method registered under ``name``."""
  if name not in METHODS:
    raise ValueError(f"method={name!r}; allowed: {', '.join(sorted(METHODS))}")
  return importlib.import_module(METHODS[name].module).METHOD


LABEL_BYTES = 4  # labels travel as int32


def portion_bytes(model: StagedModel, start: int, stop: int) -> int:
  """Bytes of stages ``[start, stop)``: parameters plus BatchNorm statistics."""
  params, stats = jax.eval_shape(model.init, jax.random.key(0))
  leaves = jax.tree.leaves((params[start:stop], stats[start:stop]))
  return int(sum(a.size * a.dtype.itemsize for a in leaves))


def activation_size(model: StagedModel, cut: int) -> int:
  """Elements of one sample's cut-layer activation."""
  params, stats = jax.eval_shape(model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((1,) + tuple(model.input_shape), jnp.float32)
  out = jax.eval_shape(
      lambda p, s, x: model.apply(p, s, x, train=False)[0],
      params[:cut], stats[:cut], x)
  return int(out.size)


def split_communication(setup: Setup, samples: int):
  """Per round: part-1 down and up per participant, plus per processed sample
  the cut-layer activation and label up and the activation gradient down."""
  act = activation_size(setup.model, setup.cut) * 4
  p1 = portion_bytes(setup.model, 0, setup.cut)
  n = setup.clients_per_round
  return (n * p1 + samples * (act + LABEL_BYTES), n * p1 + samples * act)
