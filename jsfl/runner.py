"""One short train loop (big_vision style): config -> run directory.

The loop over rounds is the only Python loop: each round is one call of a
jitted program that runs every seed (``seed_exec``: vmap or a rolled
``lax.map``), every client and every batch step of the round.  Evaluation
is one more jitted program over the whole test set for all seeds.
"""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import sys
import threading
import time
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsfl import __version__, checkpoint, distributed, metrics, rundir, slots
from jsfl import config as config_lib
from jsfl.core import sharding
from jsfl.core.method import get_method
from jsfl.core.setup import Setup
from jsfl.data import load_dataset
from jsfl.errors import Diverged, RunDirError
from jsfl.evaluate import chunk_test_set, evaluate, evaluate_logits
from jsfl.methods.registry import METHODS
from jsfl.models import get_model, layers
from jsfl.partitions import dominant_labels, index_table, label_counts, make_partition

SHARED_KEYS = ("x", "y", "mean", "std")
SEED_KEYS = ("table", "sizes", "dominant", "counts", "hyper")
# Metrics every round returns; any other key a method returns is a logged
# decision (e.g. Hydra's groups, SFedKD's teachers) written per record as is.


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
  setup: Setup
  method: Any
  dataset: Any
  slots: list[Slot]
  partitions: list[dict]      # per slot: seed, counts, sizes, dominant (and cell)
  data: dict                  # device arrays; SEED_KEYS have a leading slot axis

  @property
  def seeds(self) -> list[int]:
    """Per slot its seed (a seed repeats across the cells of a program)."""
    return [s.seed for s in self.slots]

  @property
  def cell_configs(self) -> list[tuple[str, dict]]:
    """``(name, config)`` of the cells of a program in slot order; empty for
    a single-config run."""
    return list({s.cell: (s.cell, s.cfg) for s in self.slots if s.cell is not None}.values())


def _options_error(section: str, err: Exception, cell: str | None = None
                   ) -> config_lib.ConfigError:
  e = config_lib.ConfigError(f"[{section}] {err}")
  e.cell = cell  # the cell of a program of several whose option it is
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
  ds_cfg, x_cfg = cfg["dataset"], cfg["exec"]
  cells = [(None, cfg)] if cells is None else list(cells)
  for name, c in cells:
    diff = slots.differences(cfg, c)
    if diff:
      raise ValueError(f"cell {name!r} cannot be a slot of this program: it differs "
                       f"in {', '.join(diff)}")
  try:
    dataset = load_dataset(ds_cfg["name"], data_dir=ds_cfg["data_dir"] or None,
                           download=ds_cfg["download"],
                           **config_lib.extra_options(cfg, "dataset"))
  except (ValueError, TypeError) as e:
    raise _options_error("dataset", e) from None
  model, cut = build_model(cfg, dataset.input_shape, dataset.num_classes)
  method = get_method(cfg["method"]["name"])

  K = cfg["partition"]["num_clients"]
  run_slots = [Slot(s, c, name) for name, c in cells
               for s in range(c["run"]["seed"], c["run"]["seed"] + c["run"]["seeds"])]
  parts_per_slot, tables = [], []
  for slot in run_slots:
    p_cfg = slot.cfg["partition"]
    try:
      parts = make_partition(p_cfg["name"], dataset.y_train, K, seed=slot.seed,
                             num_classes=dataset.num_classes,
                             client_ids=dataset.client_ids,
                             **config_lib.extra_options(slot.cfg, "partition"))
    except (ValueError, TypeError) as e:
      raise _options_error("partition", e, slot.cell) from None
    counts = label_counts(parts, dataset.y_train, dataset.num_classes)
    table, _, sizes = index_table(parts)
    parts_per_slot.append({"seed": slot.seed, **({"cell": slot.cell} if slot.cell else {}),
                           "label_counts": counts, "sizes": sizes,
                           "dominant": dominant_labels(counts)})
    tables.append(table)
  max_n = max(t.shape[1] for t in tables)
  tables = np.stack([np.pad(t, ((0, 0), (0, max_n - t.shape[1]))) for t in tables])
  setup = make_setup(cfg, model, cut, max_n)
  try:
    sharding.mesh_shape(x_cfg["mesh"], jax.device_count(), len(run_slots),
                        setup.clients_per_round)
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  if method.validate is not None:  # method checks needing the model or sizes
    for name, c in cells:  # each cell's own values (p_min <= p0, ...)
      try:
        method.validate(make_setup(c, model, cut, max_n))
      except ValueError as e:
        raise _options_error("method", e, name) from None
  hyper = [slots.hyper_values(slot.cfg) for slot in run_slots]
  data = {"x": jnp.asarray(dataset.x_train), "y": jnp.asarray(dataset.y_train),
          "mean": jnp.asarray(dataset.mean), "std": jnp.asarray(dataset.std),
          "table": jnp.asarray(tables),
          "sizes": jnp.asarray(np.stack([p["sizes"] for p in parts_per_slot])),
          "dominant": jnp.asarray(np.stack([p["dominant"] for p in parts_per_slot])
                                  .astype(np.int32)),
          "counts": jnp.asarray(np.stack([p["label_counts"] for p in parts_per_slot])
                                .astype(np.int32)),
          "hyper": {k: jnp.asarray([h[k] for h in hyper], jnp.float32) for k in hyper[0]}}
  return Experiment(cfg, setup, method, dataset, run_slots, parts_per_slot, data)


def with_hyper(setup: Setup, hyper: dict) -> Setup:
  """``setup`` with one slot's batchable values (``section.key`` -> traced
  scalar, :func:`jsfl.slots.hyper_values`) in place of its constants."""
  optim = {k.split(".", 1)[1]: v for k, v in hyper.items() if k.startswith("optim.")}
  own = {k.split(".", 1)[1]: v for k, v in hyper.items() if k.startswith("method.")}
  options = setup.options
  if own:
    options = dataclasses.replace(options, **own)
  return setup.replace(**optim, options=options)


def build_model(cfg: dict, input_shape, num_classes: int):
  """The config's model for inputs of ``input_shape`` and its cut
  (``model.cut = -1`` resolved to the model's default).

  Raises:
    ConfigError: for a model option the model does not take or allow.
  """
  m_cfg = cfg["model"]
  model_opts = config_lib.extra_options(cfg, "model")
  if m_cfg["norm"]:
    model_opts["norm"] = m_cfg["norm"]
  model_opts["conv_impl"] = (layers.default_conv_impl() if m_cfg["conv_impl"] == "auto"
                             else m_cfg["conv_impl"])
  model_opts["depthwise_impl"] = (layers.default_depthwise_impl()
                                  if m_cfg["depthwise_impl"] == "auto"
                                  else m_cfg["depthwise_impl"])
  try:
    model = get_model(m_cfg["name"], input_shape, num_classes, init=m_cfg["init"],
                      **model_opts)
  except TypeError as e:
    raise config_lib.ConfigError(_model_options_error(m_cfg["name"], model_opts, e)) from None
  except ValueError as e:
    raise _options_error("model", e) from None
  cut = model.default_cut if m_cfg["cut"] == -1 else m_cfg["cut"]
  try:
    model.check_cut(cut, "model.cut")
  except ValueError as e:
    raise config_lib.ConfigError(str(e)) from None
  return model, cut


def make_setup(cfg: dict, model, cut: int, max_size: int) -> Setup:
  """The run's static :class:`Setup` from a checked config: the method and
  optimiser keys, the method's option set, ``exec.client_exec = auto``
  resolved for this backend.  ``max_size`` is the widest client row of the
  index table."""
  me_cfg, o_cfg, x_cfg = cfg["method"], cfg["optim"], cfg["exec"]
  K = cfg["partition"]["num_clients"]
  n = me_cfg["clients_per_round"] or K
  method_opts = config_lib.extra_options(cfg, "method")
  return Setup(
      model=model, num_clients=K, clients_per_round=n, max_size=max_size,
      batch_size=me_cfg["batch_size"], local_epochs=me_cfg["local_epochs"],
      cut=cut, order=me_cfg["order"], order_rule=me_cfg["order_rule"],
      batches_per_turn=me_cfg["batches_per_turn"], drop_last=me_cfg["drop_last"],
      lr=o_cfg["lr"], lr_decay=o_cfg["lr_decay"], lr_min=o_cfg["lr_min"],
      lr_decay_start=o_cfg["lr_decay_start"], momentum=o_cfg["momentum"],
      weight_decay=o_cfg["weight_decay"],
      client_exec=(default_client_exec(n) if x_cfg["client_exec"] == "auto"
                   else x_cfg["client_exec"]),
      server_unroll=x_cfg["server_unroll"],
      options=METHODS[me_cfg["name"]].options(**method_opts))


def setup_from(raw: dict, input_shape, num_classes: int, max_size: int) -> Setup:
  """The :class:`Setup` of a config table (defaults filled in and checked)
  for data of ``input_shape`` and ``num_classes`` without loading a dataset:
  what benchmarks on synthetic workloads run."""
  cfg = config_lib.resolve(raw)
  model, cut = build_model(cfg, input_shape, num_classes)
  return make_setup(cfg, model, cut, max_size)


def _model_options_error(name: str, given: dict, err: Exception) -> str:
  """A model option the factory does not take, with the ones it does."""
  import inspect

  from jsfl.models.base import _REGISTRY as MODELS
  try:
    params = inspect.signature(MODELS[name]).parameters
  except (KeyError, TypeError, ValueError):
    return f"[model] {err}"
  fixed = {"input_shape", "num_classes"}
  known = sorted(k for k, p in params.items() if k not in fixed
                 and p.kind in (p.KEYWORD_ONLY, p.POSITIONAL_OR_KEYWORD))
  bad = [k for k in given if k not in params]
  if not bad or any(p.kind == p.VAR_KEYWORD for p in params.values()):
    return f"[model] {err}"
  return (f"unknown config key 'model.{bad[0]}' for model {name!r}; allowed: "
          + ", ".join(sorted(set(known) | {"name", "cut", "norm", "conv_impl",
                                            "depthwise_impl"})))


def seed_program(fn, how: str, seed_args: int, spmd_axis_name: str | None = None):
  """Runs ``fn`` for every seed in one program.

  The first ``seed_args`` positional arguments carry a leading seed axis, the
  rest are shared.  ``vmap`` batches the seeds; ``map`` is a rolled loop,
  cheaper where batching turns per-seed convolutions into grouped ones.
  ``spmd_axis_name`` names the mesh axis the seeds lie on, so sharding
  constraints inside ``fn`` (the client axis) keep the seed axis sharded.
  """
  if how == "vmap":
    def vmapped(*args):
      axes = (0,) * seed_args + (None,) * (len(args) - seed_args)
      return jax.vmap(fn, in_axes=axes, spmd_axis_name=spmd_axis_name)(*args)
    return vmapped
  if how == "map":
    def mapped(*args):
      per_seed, shared = args[:seed_args], args[seed_args:]
      return lax.map(lambda a: fn(*a, *shared), per_seed)
    return mapped
  raise ValueError(f"seed_exec={how!r}; allowed: 'vmap', 'map'")


UNROLL_MAX_CLIENTS = 32  # beyond this an unrolled client loop makes compiling slow


def default_client_exec(clients_per_round: int, backend: str | None = None) -> str:
  """The measured-faster client loop per backend.

  On the 2-core CPU, Fashion-MNIST small CNN, 10 clients a round under
  Dirichlet 0.1 (self-balancing, E = 5), samples/s per seed with clients
  unrolled against vmapped: FedAvg 5,219 vs 1,703, SplitFedV1 4,714 vs
  1,688, MultiSFL 3,617 vs 1,158 (``benchmarks/multisfl_vs_authors.py``,
  ``benchmarks/results/multisfl_vs_authors-*.json``): looped clients skip
  the padded steps of small clients and avoid vmapped (grouped) convolutions.
  An unrolled loop grows the program with the client count, so past
  ``UNROLL_MAX_CLIENTS`` clients the CPU keeps vmap.  Accelerators get vmap,
  the batched form they are built for.
  """
  backend = backend or jax.default_backend()
  if backend == "cpu" and clients_per_round <= UNROLL_MAX_CLIENTS:
    return "unroll"
  return "vmap"


def default_seed_exec(backend: str | None = None) -> str:
  """The measured-faster seed strategy per backend.

  On the 2-core CPU an SFL round of MobileNetV1 (10 clients, 4 seeds) ran at
  155 samples/s with seeds as a rolled ``lax.map`` against 123 with vmap
  (benchmarks/results/seed-exec-*.json); with no spare cores, batching seeds
  only enlarges every matmul's working set.  Accelerators get vmap, the
  batched form they are built for; no accelerator measurement is recorded
  in ``benchmarks/results/`` yet.
  """
  backend = backend or jax.default_backend()
  return "map" if backend == "cpu" else "vmap"


def build_programs(exp: Experiment, mesh=None):
  """The jitted init, round and eval programs over the seed axis.

  Args:
    exp: the prepared experiment.
    mesh: a ``("seeds", "clients")`` device mesh (:mod:`jsfl.core.sharding`);
      None or a one-device mesh compiles for the default device.  With more
      devices, programs take and return seed-sharded state and data, shared
      data replicated, and the round's metrics and evaluations replicated so
      every host can read them.

  Returns:
    ``(init, round, eval)`` callables.
  """
  setup, method = exp.setup, exp.method
  how = exp.cfg["exec"]["seed_exec"]
  how = default_seed_exec() if how == "auto" else how
  sharded = not sharding.is_trivial(mesh)
  if sharded and mesh.shape["seeds"] > 1:
    how = "vmap"  # a rolled loop over a sharded axis would gather it

  def round_one(state, seed_data, key, shared):
    s = with_hyper(setup, seed_data["hyper"])
    data = {**shared, **{k: v for k, v in seed_data.items() if k != "hyper"}}
    state, m = method.round(s, state, data, key)
    return state, {**m, "finite": all_finite(state, m["loss"])}

  def init_one(key, hyper):
    return method.init(with_hyper(setup, hyper), key)

  def eval_one(state, hyper, test, mean, std):
    s = with_hyper(setup, hyper)
    if method.predict is not None:  # outputs that are not one staged model
      return evaluate_logits(lambda x: method.predict(s, state, x), test,
                             mean, std, s.num_classes)
    params, stats = method.output_model(s, state)
    return evaluate(s.model, params, stats, test, mean, std, s.num_classes)

  hyper = exp.data["hyper"]
  if not sharded:
    init = jax.jit(seed_program(init_one, how, 2))
    rnd = jax.jit(seed_program(round_one, how, 3), donate_argnums=(0,))
    ev = jax.jit(seed_program(eval_one, how, 2))
    return (lambda keys: init(keys, hyper), rnd,
            lambda state, *rest: ev(state, hyper, *rest))
  ss, rep = sharding.seed_sharding(mesh), sharding.replicated(mesh)
  hyper = sharding.put(hyper, ss)
  spmd = "seeds" if how == "vmap" else None
  init = jax.jit(seed_program(init_one, how, 2, spmd),
                 in_shardings=(ss, ss), out_shardings=ss)
  rnd = jax.jit(seed_program(round_one, how, 3, spmd), donate_argnums=(0,),
                in_shardings=(ss, ss, ss, rep), out_shardings=(ss, rep))
  ev = jax.jit(seed_program(eval_one, how, 2, spmd),
               in_shardings=(ss, ss, rep, rep, rep), out_shardings=rep)

  def traced_under_mesh(fn):
    # constrain_clients reads the active mesh while the round is traced.
    def call(*args):
      with sharding.active(mesh):
        return fn(*args)
    return call
  init, rnd, ev = map(traced_under_mesh, (init, rnd, ev))
  return (lambda keys: init(keys, hyper), rnd,
          lambda state, *rest: ev(state, hyper, *rest))


MEMORY_SHARE = 0.5  # of the device's memory a sweep's program may plan to fill


def _tree_bytes(tree) -> int:
  return int(sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize
                 for a in jax.tree.leaves(tree) if hasattr(a, "dtype")
                 and not jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)))


def memory_estimate(exp: Experiment) -> dict:
  """Bytes a program of ``exp`` needs: ``shared`` (the dataset, once),
  ``per_slot`` (what every slot adds) and ``device`` (what one device has).

  A slot holds its state three times over (the state, its gradients or the
  clients' copies, the optimiser's), its index table, and, where slots are
  vmapped, the activations of a batch of every client trained side by side
  (every stage's output, kept for the backward pass, twice for the
  temporaries around it).  An estimate, not a measurement: it errs high.
  """
  setup = exp.setup
  state = jax.eval_shape(lambda k: exp.method.init(setup, k), jax.random.key(0))
  params, stats = jax.eval_shape(setup.model.init, jax.random.key(0))
  x = jax.ShapeDtypeStruct((setup.batch_size, *setup.model.input_shape), jnp.float32)
  acts = 0
  for k in range(setup.model.num_stages):
    x, _ = jax.eval_shape(lambda p, s, a, k=k: setup.model.apply(
        p, s, a, start=k, train=True), params[k:k + 1], stats[k:k + 1], x)
    acts += _tree_bytes(x)
  side_by_side = setup.clients_per_round if setup.client_exec == "vmap" else 1
  how = exp.cfg["exec"]["seed_exec"]
  vmapped = (default_seed_exec() if how == "auto" else how) == "vmap"
  per_slot = (3 * _tree_bytes(state) + _tree_bytes(exp.data["table"][0])
              + (2 * acts * side_by_side if vmapped else 0))
  shared = _tree_bytes({k: exp.data[k] for k in SHARED_KEYS})
  if not vmapped:  # one slot's activations at a time
    shared += 2 * acts * side_by_side
  return {"shared": shared, "per_slot": per_slot, "device": device_memory()}


def device_memory() -> int:
  """Bytes of memory of one device: the accelerator's allocator limit, or
  the host's physical memory for the CPU."""
  d = jax.devices()[0]
  stats = d.memory_stats() if hasattr(d, "memory_stats") else None
  if stats and stats.get("bytes_limit"):
    return int(stats["bytes_limit"])
  return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))


def fitting_slots(exp: Experiment) -> int:
  """How many slots of ``exp``'s program fit in :data:`MEMORY_SHARE` of the
  device's memory (:func:`memory_estimate`), at least 1."""
  m = memory_estimate(exp)
  room = MEMORY_SHARE * m["device"] * jax.device_count() - m["shared"]
  return max(1, int(room // max(m["per_slot"], 1)))


def memory_text(exp: Experiment) -> str:
  m = memory_estimate(exp)
  gib = 2.0 ** 30
  return (f"~{m['per_slot'] / gib:.2f} GiB a slot + {m['shared'] / gib:.2f} GiB shared, "
          f"{MEMORY_SHARE:.0%} of {m['device'] / gib:.1f} GiB a device")


def all_finite(*trees) -> jax.Array:
  """Whether every float in ``trees`` is finite: one reduction per round that
  lets the runner stop a diverged seed instead of logging NaN as a result."""
  leaves = [x for x in jax.tree.leaves(trees)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def run_mesh(exp: Experiment):
  """The run's device mesh (``exec.mesh``), or None on a single device."""
  shape = sharding.mesh_shape(exp.cfg["exec"]["mesh"], jax.device_count(),
                              len(exp.seeds), exp.setup.clients_per_round)
  return None if shape == (1, 1) else sharding.make_mesh(shape)


def place(mesh, seed_keys, seed_data, shared, test):
  """Seed-axis arrays onto the mesh's seed axis, the rest replicated; as is
  without a mesh."""
  if sharding.is_trivial(mesh):
    return seed_keys, seed_data, shared, test
  ss, rep = sharding.seed_sharding(mesh), sharding.replicated(mesh)
  return (sharding.put(seed_keys, ss), sharding.put(seed_data, ss),
          sharding.put(shared, rep), sharding.put(test, rep))


def make_seed_keys(seeds):
  """One PRNG key per seed (seed s -> key(s)), stacked on the seed axis."""
  return jax.random.wrap_key_data(
      jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds]))


def round_keys(seed_keys, r: int):
  """Round ``r``'s key of every seed."""
  return jax.vmap(lambda k: jax.random.fold_in(k, r))(seed_keys)


def split_data(exp: Experiment):
  """(per-seed data, shared data) as the seed programs take them."""
  return ({k: exp.data[k] for k in SEED_KEYS}, {k: exp.data[k] for k in SHARED_KEYS})


def _device_kind() -> str:
  d = jax.devices()[0]
  return f"{d.platform}:{getattr(d, 'device_kind', '?')} x{jax.device_count()}"


def _versions() -> dict:
  import flax
  import optax
  return {"jsfl": __version__, "jax": jax.__version__, "flax": flax.__version__,
          "optax": optax.__version__, "python": sys.version.split()[0]}


class Progress:
  """A one-line progress bar on stderr (plain lines when not a terminal)."""

  def __init__(self, total: int, enabled: bool):
    self.total, self.enabled = total, enabled
    self.tty = sys.stderr.isatty()

  def update(self, r: int, acc, sps: float, final: bool = False):
    if not self.enabled:
      return
    width = 24
    done = int(width * r / self.total)
    acc_s = "  -  " if acc is None else f"{acc:5.2f}%"
    line = (f"round {r:>4}/{self.total} [{'#' * done}{'.' * (width - done)}] "
            f"acc {acc_s} | {sps:,.0f} samples/s")
    if self.tty:
      sys.stderr.write("\r" + line + ("\n" if final else ""))
    elif acc is not None or final:
      sys.stderr.write(line + "\n")
    sys.stderr.flush()


def _write_run_files(cfg: dict, exp: Experiment, out: str, mesh) -> None:
  """config.json, partition.json and method artifacts of a new run."""
  setup, method, seeds = exp.setup, exp.method, exp.seeds
  rundir.write_json_atomic(f"{out}/config.json", {
      "config": cfg, "versions": _versions(), "device": _device_kind(),
      "resolved": {"cut": setup.cut, "clients_per_round": setup.clients_per_round,
                   "model_stages": list(setup.model.stage_names),
                   "max_client_size": setup.max_size, "seeds": seeds,
                   "conv_impl": cfg["model"]["conv_impl"],
                   "default_conv_impl": layers.default_conv_impl(),
                   "client_exec": setup.client_exec,
                   "seed_exec": (default_seed_exec() if cfg["exec"]["seed_exec"] == "auto"
                                 else cfg["exec"]["seed_exec"]),
                   "default_depthwise_impl": layers.default_depthwise_impl(),
                   "mesh": dict(mesh.shape) if mesh is not None else None,
                   "processes": jax.process_count()},
      # A program of several cells: each one's config, for resume and the split.
      **({"cells": [{"name": n, "config": c} for n, c in exp.cell_configs]}
         if exp.cell_configs else {})})
  rundir.write_json_atomic(f"{out}/partition.json", {"seeds": exp.partitions})
  if method.artifacts is None:  # e.g. Hydra's groups.json
    return
  if not exp.cell_configs:
    for fname, obj in method.artifacts(setup, exp.partitions).items():
      rundir.write_json_atomic(f"{out}/{fname}", obj)
    return
  for name, c in exp.cell_configs:  # each cell's own, from its own options
    own = make_setup(c, setup.model, setup.cut, setup.max_size)
    parts = [p for p in exp.partitions if p.get("cell") == name]
    os.makedirs(f"{out}/{CELL_ARTIFACTS}/{name}", exist_ok=True)
    for fname, obj in method.artifacts(own, parts).items():
      rundir.write_json_atomic(f"{out}/{CELL_ARTIFACTS}/{name}/{fname}", obj)


CELL_ARTIFACTS = "cells"  # a program of several cells: <run dir>/cells/<cell>/<file>


def run(cfg: dict, exp: Experiment | None = None, *, resume: str | None = None,
        cells: list[tuple[str, dict]] | None = None) -> str:
  """Trains per ``cfg`` and returns the run directory (see :mod:`jsfl.rundir`).

  Checkpoints (:mod:`jsfl.checkpoint`) are written every
  ``run.checkpoint_every`` rounds and after the last.  SIGTERM and SIGINT
  (main thread only) end the run after the current round with a checkpoint
  and a line naming the resume command on stderr; the previous handlers are
  restored on the way out.  The run directory is locked (:class:`RunLock`)
  while the run writes it; a new run that fails before its first record or
  checkpoint leaves nothing behind.

  Args:
    cfg: the resolved config.
    exp: ``prepare(cfg)``, if already built.
    resume: an existing run directory of ``cfg`` to continue from its newest
      checkpoint that restores (round 0 without one) instead of a new one;
      use :func:`resume`, which also reads and re-validates the config.
    cells: ``(name, config)`` of cells to train as slots of one program
      (:func:`prepare`); its records carry their cell's name.

  Returns:
    The run directory.

  Raises:
    Stopped: after a SIGTERM / SIGINT (a ``SystemExit`` of 128 + signum).
    Diverged: a seed's loss or parameters became non-finite
      (``run.on_divergence``); the run directory is kept and its summary
      names the seeds.
    RunDirError, CheckpointError: the directory is taken or locked; no
      checkpoint restores or matches; a checkpoint could not be written.
  """
  exp = exp or prepare(cfg, cells)
  # Multi-host: process 0 alone writes files; the others learn its directory
  # (checkpoints are written by all of them into it).
  writes = distributed.is_writer()
  created: list[str] = []
  out = resume or (rundir.new_run_dir(cfg["run"]["out_dir"], cfg["run"]["name"],
                                      cfg["run"]["dir"], created) if writes else None)
  out = distributed.broadcast_path(out)
  lock = rundir.RunLock(out)
  try:
    if writes:
      lock.acquire()
      if not resume and rundir.listing(out):  # another run wrote it since we checked
        raise RunDirError(f"run.dir={out!r} was written by another process meanwhile; "
                          "allowed: a new or empty directory")
    try:
      _train(cfg, exp, out, resume, writes)
    except BaseException as e:
      if (writes and not resume and not isinstance(e, (Stopped, Diverged))
          and _holds_nothing(out)):
        rundir.remove_new(out, created)
      raise
  finally:
    lock.release()
  return out


def _holds_nothing(out: str) -> bool:
  """No record and no checkpoint yet: a failed start has nothing worth keeping."""
  ck = os.path.join(out, "checkpoints")
  has_ckpt = os.path.isdir(ck) and any(n.isdigit() for n in os.listdir(ck))
  metrics_path = os.path.join(out, "metrics.jsonl")
  has_records = os.path.exists(metrics_path) and os.path.getsize(metrics_path) > 0
  return not (has_ckpt or has_records)


def _train(cfg: dict, exp: Experiment, out: str, resume: str | None, writes: bool) -> None:
  """The loop of :func:`run` over rounds, in ``out`` (already locked)."""
  mesh = run_mesh(exp)
  seeds = exp.seeds
  if not resume and writes:  # a resumed run keeps the files of its start
    _write_run_files(cfg, exp, out, mesh)

  init, rnd, ev = build_programs(exp, mesh)
  seed_data, shared = split_data(exp)
  test = jax.tree.map(jnp.asarray, chunk_test_set(
      exp.dataset.x_test, exp.dataset.y_test, cfg["exec"]["eval_batch"]))
  seed_keys, seed_data, shared, test = place(
      mesh, make_seed_keys(seeds), seed_data, shared, test)
  state = init(seed_keys)
  R, every = cfg["run"]["rounds"], cfg["run"]["eval_every"]
  ckpt_every = cfg["run"]["checkpoint_every"]
  ckpt = checkpoint.Checkpointer(os.path.join(out, "checkpoints"))
  t = _Tally(exp)
  if resume:
    state = t.restore(cfg, out, ckpt, state, writes)
  writer = rundir.MetricsWriter(f"{out}/metrics.jsonl") if writes else rundir.NullWriter()
  bar = Progress(R, cfg["exec"]["progress"] and writes)
  stop = _StopSignals()
  try:
    for r in range(t.start, R):
      t0 = time.perf_counter()
      state, m = rnd(state, seed_data, round_keys(seed_keys, r), shared)
      m = jax.device_get(m)
      wall = time.perf_counter() - t0
      traffic = t.add_traffic(m)
      stopping = t.note_divergence(cfg, m, r, bar.enabled)
      acc = None
      if (r + 1) % every == 0 or r + 1 == R or stopping:
        e = jax.device_get(ev(state, test, shared["mean"], shared["std"]))
        acc = t.record(cfg, exp, state, m, e, r, wall, traffic, writer)
        if writes:
          rundir.write_json_atomic(f"{out}/summary.json",
                                   _summary(cfg, t.records, t.diverged_ids()))
      bar.update(r + 1, acc, float(np.sum(m["samples"])) / wall, final=r + 1 == R)
      stop.agree()  # every host stops after the same round
      if stopping:
        raise _diverged(cfg, out, t.diverged_ids(), r + 1, R)  # no checkpoint of a broken state
      if r + 1 == R or stop.signum or (ckpt_every and (r + 1) % ckpt_every == 0):
        ckpt.save(r + 1, state, seeds, t.cum_up, t.cum_down,
                  extra=t.host_record())
      if stop.signum and r + 1 < R:
        if bar.enabled and bar.tty:
          sys.stderr.write("\n")  # end the progress line
        if writes:
          print(f"jsfl: stopped after round {r + 1}; resume with: jsfl run --resume {out}",
                file=sys.stderr, flush=True)
        raise Stopped(stop.signum, r + 1, out)
  finally:
    writer.close()
    ckpt.close()
    stop.restore()
  if jax.process_count() > 1:  # job logs show that every host agrees
    print(f"jsfl: process {jax.process_index()}/{jax.process_count()} finished: "
          f"accuracy {np.round(np.asarray(t.last_acc, np.float64), 4).tolist()}",
          file=sys.stderr, flush=True)
  if t.diverged:
    raise _diverged(cfg, out, t.diverged_ids(), R, R)


class _Tally:
  """What the round loop accumulates across rounds (and restores on resume):
  the first round to run, cumulative bytes, the records written, per-slot
  per-label histories (for BW), and the slots that diverged (by index; a
  slot is named by its seed, and by its cell in a program of several)."""

  def __init__(self, exp: Experiment):
    self.seeds = exp.seeds
    self.ids = [(s.cell, s.seed) for s in exp.slots]
    self.several = any(c is not None for c, _ in self.ids)
    self.start, self.cum_up, self.cum_down, self.records = 0, 0, 0, []
    self.diverged: dict[int, int] = {}  # slot -> round its training stopped at
    self.history = [[] for _ in self.ids]
    self.last_acc = None

  def diverged_ids(self) -> dict:
    """``{seed: round}``, or ``{(cell, seed): round}`` in a program of
    several cells."""
    return {(self.ids[i] if self.several else self.ids[i][1]): r
            for i, r in sorted(self.diverged.items())}

  def host_record(self) -> dict:
    """The checkpoint's record of diverged slots (by seed when seeds name them)."""
    if self.several:
      return {"diverged_slots": {str(i): r for i, r in self.diverged.items()}}
    return {"diverged": {str(self.ids[i][1]): r for i, r in self.diverged.items()}}

  def restore(self, cfg, out, ckpt, state, writes):
    """The newest restorable checkpoint's state; the records up to it."""
    try:
      got = ckpt.restore(state, self.seeds, warn=_warn if writes else None)
    except BaseException:
      ckpt.close()
      raise
    if got is not None:
      self.start, state, self.cum_up, self.cum_down = got
      host = ckpt.restored_host
      if "diverged_slots" in host:
        self.diverged = {int(k): int(v) for k, v in host["diverged_slots"].items()}
      else:
        by_seed = {int(k): int(v) for k, v in (host.get("diverged") or {}).items()}
        self.diverged = {i: by_seed[s] for i, (_, s) in enumerate(self.ids) if s in by_seed}
    self.records = (_resume_records(cfg, out, self.start, self.diverged_ids()) if writes
                    else rundir.read_metrics_upto(f"{out}/metrics.jsonl", self.start))
    self.history = [[np.asarray([np.nan if v is None else v
                                 for v in rec["per_label_accuracy"]], np.float32)
                     for rec in self.records if _record_id(rec) == slot_id]
                    for slot_id in self.ids]
    return state

  def add_traffic(self, m):
    """Per slot (up, down, cumulative up, cumulative down) bytes of the round
    (every ``METHOD.round`` returns its own)."""
    ups, downs = tuple(map(float, m["bytes_up"])), tuple(map(float, m["bytes_down"]))
    self.cum_up += np.asarray(ups)
    self.cum_down += np.asarray(downs)
    return [(ups[i], downs[i], self.cum_up[i], self.cum_down[i])
            for i in range(len(self.ids))]

  def note_divergence(self, cfg, m, r, warn: bool) -> bool:
    """Marks slots whose round was not finite; True if the run must stop.

    A program of several cells stops only when every slot has diverged: one
    cell's divergence must not end the others' runs (the sweep applies each
    cell's ``run.on_divergence`` to its own records when it splits them).
    """
    newly = [i for i, ok in enumerate(np.asarray(m["finite"])) if not ok
             and i not in self.diverged]
    self.diverged.update({i: r + 1 for i in newly})
    if newly and warn:
      names = [_slot_name(*self.ids[i]) for i in newly]
      _warn(f"seed{'s' * (len(newly) > 1)} {', '.join(names)} diverged at "
            f"round {r + 1} (non-finite loss or parameters); "
            + ("stopping the run" if cfg["run"]["on_divergence"] == "stop_run"
               and not self.several else "its later rounds are not recorded"))
    every = len(self.diverged) == len(self.ids)
    return bool(self.diverged) and (every or (cfg["run"]["on_divergence"] == "stop_run"
                                              and not self.several))

  def record(self, cfg, exp, state, m, e, r, wall, traffic, writer):
    """Writes the evaluated round's records; the median accuracy of the live
    slots (None if none is left)."""
    for i in range(len(self.ids)):
      if i in self.diverged:
        continue
      rec = metrics.round_record(cfg, exp, state, m, e, i, r, self.history[i], wall,
                                 traffic[i])
      writer.write(rec)
      self.records.append(rec)
    self.last_acc = e["accuracy"]
    live = [i for i in range(len(self.ids)) if i not in self.diverged]
    return float(np.median(e["accuracy"][live])) if live else None


def _record_id(rec: dict):
  return rec.get("cell"), rec["seed"]


def _slot_name(cell, seed) -> str:
  return str(seed) if cell is None else f"{seed} of cell {cell}"


def _warn(msg: str) -> None:
  print(f"jsfl: warning: {msg}", file=sys.stderr, flush=True)


def _diverged(cfg: dict, out: str, diverged: dict, at: int, R: int) -> Diverged:
  which = ", ".join(f"seed {_slot_name(*(k if isinstance(k, tuple) else (None, k)))} at "
                    f"round {r}" for k, r in diverged.items())
  o = cfg["optim"]
  ended = (f"the run stopped after round {at}" if at < R
           else f"the other seeds ran to round {R}")
  return Diverged(
      f"training diverged: {which} (non-finite loss or parameters; optim.lr={o['lr']!r}"
      f"{', momentum=' + repr(o['momentum']) if o['momentum'] else ''}); {ended}; those "
      f"seeds are marked in {out}/summary.json; allowed: a smaller optim.lr or a "
      "stabler method option", diverged, out)


class Stopped(SystemExit):
  """:func:`run` ended early on a signal, after a checkpoint.

  The exit status is ``128 + signum`` (143 for SIGTERM, 130 for SIGINT), as
  for a process the signal had killed.
  """

  def __init__(self, signum: int, round_: int, run_dir: str):
    super().__init__(128 + signum)
    self.signum, self.round, self.run_dir = signum, round_, run_dir


class _StopSignals:
  """Turns SIGTERM and SIGINT into a flag the loop reads after each round.

  Handlers are only installed from the main thread (Python allows no other);
  elsewhere the signals keep their handlers.  Repeated signals change
  nothing: a round cannot be interrupted from Python anyway (SIGKILL can; a
  resume then starts from the last periodic checkpoint).
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self):
    self.signum = None
    self._previous = {}
    if threading.current_thread() is threading.main_thread():
      for sig in self.SIGNALS:
        self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    self.signum = self.signum or signum

  def agree(self) -> None:
    """Multi-host: a signal any process got stops all of them after this
    round (one small allgather per round; nothing with one process)."""
    if jax.process_count() == 1:
      return
    from jax.experimental import multihost_utils
    got = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
    self.signum = int(got.max()) or None

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      # None: a handler not installed from Python; the default is the closest.
      signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    self._previous = {}


def _resume_records(cfg: dict, out: str, done: int, diverged: dict) -> list[dict]:
  """The records of rounds <= ``done`` (metrics.jsonl truncated to them), with
  summary.json made to match."""
  records = rundir.truncate_metrics(f"{out}/metrics.jsonl", done)
  if records:
    rundir.write_json_atomic(f"{out}/summary.json", _summary(cfg, records, diverged))
  elif os.path.exists(f"{out}/summary.json"):
    os.remove(f"{out}/summary.json")
  return records


def resume(run_dir: str, *, progress: bool | None = None) -> str:
  """Continues the run in ``run_dir`` from its newest checkpoint.

  Reads the run's ``config.json``, prepares it again (deterministic), restores
  the newest checkpoint (see :mod:`jsfl.checkpoint` for what it holds and why
  that suffices), drops ``metrics.jsonl`` records of later rounds and trains
  the remaining rounds into the same directory; the result equals an
  uninterrupted run's bit for bit (except ``wall_s``) on the same machine
  and versions.  Without a checkpoint the run starts again from round 0.  A
  finished run is left as it is.

  Args:
    run_dir: a directory ``jsfl run`` wrote.
    progress: overrides ``exec.progress`` (None: the run's own setting).

  Returns:
    ``run_dir``.

  Raises:
    ConfigError: ``run_dir`` is not a run directory, or its config is no
      longer valid.
    Stopped: as :func:`run`.
  """
  path = os.path.join(run_dir, "config.json")
  try:
    with open(path) as f:
      written = json.load(f)
    stored = written["config"]
    if not isinstance(stored, dict) or not all(isinstance(v, dict) for v in stored.values()):
      raise TypeError
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    raise config_lib.ConfigError(
        f"{run_dir!r} is not a run directory: expected {path} with a 'config' "
        "key, as jsfl run writes") from None
  started_with = (written.get("resolved") or {}).get("client_exec")

  def again(stored: dict, where: str) -> dict:
    try:  # checked as a new config would be (it may have been edited)
      cfg = config_lib.resolve(stored)
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError(f"{where}: {e}") from None
    if progress is not None:
      cfg["exec"]["progress"] = progress
    # A run continues with the client loop it started with, even where a later
    # jsfl measures another default for "auto": the values agree only to float
    # tolerance across loops, and a resumed run must equal an uninterrupted one.
    if cfg["exec"]["client_exec"] == "auto" and started_with in config_lib.SCHEMA[
        "exec"]["client_exec"].choices[1:]:
      cfg["exec"]["client_exec"] = started_with
    return cfg

  cfg = again(stored, path)
  cells = None
  if written.get("cells") is not None:  # a program of several cells (jsfl sweep)
    try:
      cells = [(c["name"], again(c["config"], f"{path}, cell {c['name']}"))
               for c in written["cells"]]
    except (KeyError, TypeError):
      raise config_lib.ConfigError(f"{path}: 'cells' is not a list of name and config "
                                   "tables, as jsfl sweep writes") from None
  R = cfg["run"]["rounds"]
  done = checkpoint.latest_round(os.path.join(run_dir, "checkpoints"))
  if (done or 0) >= R or (done is None and cells is None
                          and _finished_without_checkpoints(run_dir, cfg)):
    print(f"jsfl: {run_dir} is finished ({R} of {R} rounds); nothing to resume",
          file=sys.stderr)
    return run_dir
  return run(cfg, resume=run_dir, cells=cells)


def _finished_without_checkpoints(run_dir: str, cfg: dict) -> bool:
  """Whether every seed has a record of the last round (runs written before
  checkpoints existed; restarting them would throw their results away)."""
  seeds = {cfg["run"]["seed"] + s for s in range(cfg["run"]["seeds"])}
  try:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      last = set()
      for line in f:
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          continue
        if isinstance(rec, dict) and rec.get("round") == cfg["run"]["rounds"]:
          last.add(rec.get("seed"))
  except OSError:
    return False
  return seeds <= last


EMPTY_FIGURE = {"median": None, "std": None, "per_seed": [], "seeds": []}


def _summary(cfg, records, diverged=None) -> dict:
  """summary.json: its documented shape whatever happened (a metric without
  values, e.g. BW after one evaluation, is an empty figure, not null); the
  figures leave out slots that diverged, which ``diverged`` names
  (``{seed: round}``, or ``{(cell, seed): round}`` for a program of cells)."""
  diverged = {(k if isinstance(k, tuple) else (None, k)): r
              for k, r in (diverged or {}).items()}
  live = [r for r in records if _record_id(r) not in diverged]

  def figures(recs):
    return {"seeds": sorted({r["seed"] for r in recs}),
            **{k: v if v is not None else dict(EMPTY_FIGURE)
               for k, v in metrics.summarize(recs).items()}}
  cells = list(dict.fromkeys(r["cell"] for r in records if "cell" in r))
  return {"method": cfg["method"]["name"],
          "rounds_evaluated": max((r["round"] for r in records), default=0),
          # A program of several cells: a summary per cell (pooling them would
          # mix learning rates and partitions).
          **({"cells": {c: figures([r for r in live if r.get("cell") == c]) for c in cells}}
             if cells else figures(live)),
          "diverged": [{"seed": s, "round": r, **({"cell": c} if c is not None else {})}
                       for (c, s), r in sorted(diverged.items(), key=_diverged_order)]}


def _diverged_order(item):
  (cell, seed), _ = item
  return (cell or "", seed)
