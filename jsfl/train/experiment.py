"""From a checked config to an :class:`Experiment`: data, model, partitions,
setup and per-slot values, every option validated before anything is written."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from jsfl import config as config_lib
from jsfl import config_types
from jsfl import slots as slots_lib
from jsfl.core import sharding
from jsfl.core.data import RoundData, hyper_of
from jsfl.core.setup import Setup
from jsfl.data import load_dataset
from jsfl.engine import sequential, split
from jsfl.methods.catalog import get_method
from jsfl.models import get_model, layers
from jsfl.models.base import model_factory
from jsfl.partitions import (
    dominant_labels,
    index_table,
    label_counts,
    make_partition,
    train_split,
)
from jsfl.train import compile_cache
from jsfl.train.programs import default_client_exec, default_client_pass, default_seed_exec


@dataclasses.dataclass
class Slot:
  """One run of a program (:mod:`jsfl.slots`): its seed, its cell's config
  (batchable values and partition options), and the cell's name when the
  program trains several cells."""

  seed: int
  cfg: dict
  cell: str | None = None


@dataclasses.dataclass
class Experiment:
  """Everything a run needs, built (and validated) before anything is written."""

  cfg: dict
  setup: Setup                # the program's (its first cell's) values
  method: Any
  dataset: Any
  slots: list[Slot]
  partitions: list[dict]      # per slot: seed, counts, sizes, dominant (and cell)
  data: RoundData             # device arrays; the slot fields have a leading slot axis
  seed_exec: str = "vmap"     # exec.seed_exec resolved for this backend

  @functools.cached_property
  def config(self) -> config_types.Config:
    """The program's config, typed (``cfg`` is the dict it was resolved to)."""
    return config_lib.typed(self.cfg)

  @property
  def seeds(self) -> list[int]:
    """Per slot its seed (a seed repeats across the cells of a program)."""
    return [s.seed for s in self.slots]

  @property
  def cell_configs(self) -> list[tuple[str, dict]]:
    """``(name, config)`` of the cells of a program in slot order; empty for
    a single-config run."""
    return list({s.cell: (s.cell, s.cfg) for s in self.slots if s.cell is not None}.values())

  def cell_setup(self, cfg: dict) -> Setup:
    """A cell's own setup (its batchable values) on this program's model."""
    return make_setup(cfg, self.setup.model, self.setup.cut, self.setup.max_size)


def options_error(section: str, err: Exception, cell: str | None = None
                  ) -> config_lib.ConfigError:
  """A model, data, partition or method option the owner rejected, as the
  config error the CLI reports (``cell``: the cell of a program of several)."""
  e = config_lib.ConfigError(f"[{section}] {err}")
  e.cell = cell
  return e


def prepare(cfg: dict, cells: list[tuple[str, dict]] | None = None) -> Experiment:
  """Loads data, builds the model, partitions per slot, checks every option.

  Args:
    cfg: the resolved config (with ``cells``: the program's static part).
    cells: ``(name, resolved config)`` of every cell trained as slots of
      this one program (:mod:`jsfl.slots`): each brings its seeds, batchable
      values and partition options; None: ``cfg``'s seeds are the slots.

  Raises:
    ConfigError: for any invalid option (nothing has been written yet).
    ValueError: cells whose static parts differ (a caller's bug).
  """
  conf = config_lib.typed(cfg)
  # before anything compiles: JAX fixes whether a process uses the cache then
  compile_cache.enable(conf.exec.compile_cache)
  cell_list: list[tuple[str | None, dict]] = ([(None, cfg)] if cells is None
                                              else list(cells))
  for name, c in cell_list:
    diff = slots_lib.differences(cfg, c)
    if diff:
      raise ValueError(f"cell {name!r} cannot be a slot of this program: it differs "
                       f"in {', '.join(diff)}")
  try:
    dataset = load_dataset(conf.dataset.name, data_dir=conf.dataset.data_dir or None,
                           download=conf.dataset.download, **conf.dataset.extra)
  except (ValueError, TypeError) as e:
    raise options_error("dataset", e) from None
  model, cut = build_model(cfg, dataset.input_shape, dataset.num_classes)
  method = get_method(conf.method.name)

  K = conf.partition.num_clients
  run_slots = [Slot(s, c, name) for name, c in cell_list
               for s in range(c["run"]["seed"], c["run"]["seed"] + c["run"]["seeds"])]
  parts_per_slot: list[dict[str, Any]] = []
  tables: list[np.ndarray] = []
  for slot in run_slots:
    part = config_lib.typed(slot.cfg).partition
    try:
      # partition.seed >= 0 draws one split for every seed, as the Hydra
      # authors' code does; -1 keeps a draw per seed.
      draw = part.seed if part.seed >= 0 else slot.seed
      parts = make_partition(part.name, dataset.y_train, K, seed=draw,
                             num_classes=dataset.num_classes,
                             client_ids=dataset.client_ids,
                             **part.extra)
      parts = train_split(parts, part.train_size, part.train_split_seed)
    except (ValueError, TypeError) as e:
      raise options_error("partition", e, slot.cell) from None
    counts = label_counts(parts, dataset.y_train, dataset.num_classes)
    table, _, sizes = index_table(parts)
    parts_per_slot.append({"seed": slot.seed, **({"cell": slot.cell} if slot.cell else {}),
                           "label_counts": counts, "sizes": sizes,
                           "dominant": dominant_labels(counts)})
    tables.append(table)
  max_n = max(t.shape[1] for t in tables)
  table = np.stack([np.pad(t, ((0, 0), (0, max_n - t.shape[1]))) for t in tables])
  setup = make_setup(cfg, model, cut, max_n)
  try:
    mesh = sharding.mesh_shape(conf.exec.mesh, jax.device_count(), len(run_slots),
                               setup.clients_per_round)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  check_split_options(conf, setup, method, mesh)
  cell_setups = {name: make_setup(c, model, cut, max_n) for name, c in cell_list}
  if method.validate is not None:  # method checks needing the model or sizes
    for name, s in cell_setups.items():  # each cell's own values (p_min <= p0, ...)
      try:
        method.validate(s)
      except ValueError as e:
        raise options_error("method", e, name) from None
  hypers = [hyper_of(cell_setups[slot.cell]) for slot in run_slots]
  mean, std = input_normalisation(conf.dataset, dataset)
  data = RoundData(
      x=jnp.asarray(dataset.x_train), y=jnp.asarray(dataset.y_train),
      mean=jnp.asarray(mean), std=jnp.asarray(std),
      table=jnp.asarray(table),
      sizes=jnp.asarray(np.stack([p["sizes"] for p in parts_per_slot])),
      dominant=jnp.asarray(np.stack([p["dominant"] for p in parts_per_slot]).astype(np.int32)),
      counts=jnp.asarray(np.stack([p["label_counts"] for p in parts_per_slot])
                         .astype(np.int32)),
      hyper=jax.tree.map(lambda *v: jnp.asarray(v, jnp.float32), *hypers))
  seed_exec = default_seed_exec() if conf.exec.seed_exec == "auto" else conf.exec.seed_exec
  return Experiment(cfg, setup, method, dataset, run_slots, parts_per_slot, data, seed_exec)


def input_normalisation(section: config_types.DatasetSection, dataset):
  """The per-channel ``(mean, std)`` inputs are normalised by: the
  training set's own, or ``dataset.mean`` / ``dataset.std`` (a paper's
  constants), which come together, one value a channel."""
  if not section.mean and not section.std:
    return dataset.mean, dataset.std
  C = len(dataset.mean)
  if len(section.mean) != C or len(section.std) != C:
    raise config_lib.ConfigError(
        f"dataset.mean={section.mean!r}, dataset.std={section.std!r}; allowed: both "
        f"[] or both of length {C} (a value a channel of {dataset.name}'s images)")
  return (np.asarray(section.mean, np.float32), np.asarray(section.std, np.float32))


def check_split_options(conf: config_types.Config, setup: Setup, method, mesh) -> None:
  """The options that need a method on the split (or sequential) round:
  ``optim.weight_decay_scope = "part2"`` (a part-2 apart from the clients'
  part-1, :class:`jsfl.engine.split.SplitRounds`) and ``run.step_confusion``
  (its steps are the split server's label-cycle visits or a sequential
  round's clients; one device).

  Raises:
    ConfigError: naming the option and what allows it.
  """
  rounds = method.build(setup)
  on_split = isinstance(rounds, split.SplitRounds)
  name = conf.method.name
  if conf.optim.weight_decay_scope != "all" and not on_split:
    raise config_lib.ConfigError(
        f"optim.weight_decay_scope={conf.optim.weight_decay_scope!r} with "
        f"method.name={name!r}; allowed: 'all', or a split method with a server-side "
        "part-2 (sfl and its variants, hydra, mergesfl, splitfedv1/v3, multisfl)")
  if conf.run.step_confusion:
    on_sequence = isinstance(rounds, sequential.SequentialRounds)
    if not (on_sequence or on_split and split.watchable(rounds.algorithm)):
      raise config_lib.ConfigError(
          f"run.step_confusion=true with method.name={name!r}; allowed: a sequential "
          "method (fedseq, sfedkd, cwc) or a split method whose sequential server "
          "serves the label cycle (sfl and its variants but sfl_fedexp, hydra)")
    order = conf.method.order
    if on_split and order not in ("cyclic", "cyclic_reverse"):
      raise config_lib.ConfigError(
          f"run.step_confusion=true with method.order={order!r} on {name!r}; allowed: a "
          "cyclic order (cyclic, cyclic_reverse), whose steps serve one dominant label "
          "each (a sequential method's steps are its clients, in any order)")
    if mesh != (1, 1):
      raise config_lib.ConfigError(
          f"run.step_confusion=true on a mesh of {mesh[0]} x {mesh[1]} devices; "
          "allowed: one device (exec.mesh = \"seeds=1,clients=1\")")


def build_model(cfg: dict, input_shape, num_classes: int):
  """The config's model for inputs of ``input_shape`` and its cut
  (``model.cut = -1`` resolved to the model's default).

  Raises:
    ConfigError: for a model option the model does not take or allow.
  """
  c = config_lib.typed(cfg)
  m = c.model
  model_opts = dict(m.extra)
  if m.norm:
    model_opts["norm"] = m.norm
  model_opts["conv_impl"] = layers.default_conv_impl() if m.conv_impl == "auto" else m.conv_impl
  model_opts["depthwise_impl"] = (layers.default_depthwise_impl()
                                  if m.depthwise_impl == "auto" else m.depthwise_impl)
  _check_model_option_types(m.name, m.extra)
  try:
    model = get_model(m.name, input_shape, num_classes, init=m.init,
                      eval_conv_impl=m.eval_conv_impl, im2col_grad=m.im2col_grad,
                      im2col_narrow=m.im2col_narrow,
                      padding=m.padding,
                      precision=c.exec.precision, **model_opts)
  except TypeError:
    unknown = _unknown_model_option(m.name, model_opts)
    if unknown is None:
      raise  # not the config's: a bug keeps its traceback
    raise config_lib.ConfigError(unknown) from None
  except ValueError as e:
    raise options_error("model", e) from None
  cut = model.default_cut if m.cut == -1 else m.cut
  try:
    model.check_cut(cut, "model.cut")
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  return model, cut


def make_setup(cfg: dict, model, cut: int, max_size: int) -> Setup:
  """The run's :class:`Setup` from a checked config: the method and optimiser
  keys, the method's option set, ``exec.client_exec = auto`` resolved for
  this backend.  ``max_size`` is the widest client row of the index table."""
  c = config_lib.typed(cfg)
  me, o, x = c.method, c.optim, c.exec
  K = c.partition.num_clients
  n = me.clients_per_round or K
  return Setup(
      model=model, num_clients=K, clients_per_round=n, max_size=max_size,
      batch_size=me.batch_size, local_epochs=me.local_epochs,
      cut=cut, order=me.order, order_rule=me.order_rule, cycle=me.cycle,
      batches_per_turn=me.batches_per_turn, drop_last=me.drop_last,
      aggregation=me.aggregation, shuffle=me.shuffle, augment=c.dataset.augment,
      lr=o.lr, lr_decay=o.lr_decay, lr_min=o.lr_min,
      lr_decay_start=o.lr_decay_start, momentum=o.momentum,
      weight_decay=o.weight_decay, weight_decay_scope=o.weight_decay_scope,
      optimizer=o.name, clip_norm=o.clip_norm,
      client_exec=default_client_exec(n) if x.client_exec == "auto" else x.client_exec,
      client_pass=default_client_pass() if x.client_pass == "auto" else x.client_pass,
      server_unroll=x.server_unroll,
      options=get_method(me.name).options(**me.extra))


def setup_from(raw: dict, input_shape, num_classes: int, max_size: int) -> Setup:
  """The :class:`Setup` of a config table (defaults filled in and checked)
  for data of ``input_shape`` and ``num_classes`` without loading a dataset:
  what benchmarks on synthetic workloads run."""
  cfg = config_lib.resolve(raw)
  model, cut = build_model(cfg, input_shape, num_classes)
  return make_setup(cfg, model, cut, max_size)


def _factory_params(name: str):
  """The registered model factory's parameters (its options), or None for a
  name or factory without a readable signature."""
  try:
    return inspect.signature(model_factory(name)).parameters
  except (KeyError, TypeError, ValueError):
    return None


def _check_model_option_types(name: str, given: dict) -> None:
  """A model option given in the config has the type of the factory's
  default for it (an int where a float is, too): so a wrong type is named
  here, not as an error from deep inside the model's code.

  Raises:
    ConfigError: naming the option, its value and the type allowed.
  """
  params = _factory_params(name)
  if params is None:
    return  # an unknown model name: get_model names it
  for key, value in given.items():
    p = params.get(key)
    if p is None or p.default is inspect.Parameter.empty or p.default is None:
      continue
    kind = type(p.default)
    ok = (isinstance(value, bool) if kind is bool else
          not isinstance(value, bool) and isinstance(value, (int, float) if kind is float
                                                     else kind))
    if not ok:
      what = {bool: "true or false", int: "an int", float: "a number",
              str: "a string"}.get(kind, kind.__name__)
      raise config_lib.ConfigError(
          f"model.{key}={value!r} ({type(value).__name__}); allowed: {what} "
          f"(model {name!r} defaults to {p.default!r})")


def _unknown_model_option(name: str, given: dict) -> str | None:
  """A model option the factory does not take, with the ones it does (None:
  every option given is one it takes)."""
  params = _factory_params(name)
  if params is None:
    return None
  fixed = {"input_shape", "num_classes"}
  known = sorted(k for k, p in params.items() if k not in fixed
                 and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
  bad = [k for k in given if k not in params]
  if not bad or any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return None
  return (f"unknown config key 'model.{bad[0]}' for model {name!r}; allowed: "
          + ", ".join(sorted(set(known) | {"name", "cut", "norm", "conv_impl",
                                            "eval_conv_impl", "depthwise_impl", "init",
                                            "im2col_grad", "im2col_narrow",
                                            "padding"})))
