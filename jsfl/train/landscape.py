"""The loss landscape of a finished run (``jsfl landscape``, docs/analysis.md).

The filter-normalised 2-D slice of Li, Xu, Taylor, Studer and Goldstein,
"Visualizing the Loss Landscape of Neural Nets" (NeurIPS 2018), that
KoReA-SFL draws in its Fig. 4: around the run's final model ``w`` (the
model the run evaluates, :func:`final_model`), two random directions
``d1``, ``d2`` and the loss ``L(w + a d1 + b d2)`` on a grid of
``(a, b)`` in ``[-span, span]^2``.

* **Directions**: Gaussian, drawn from :func:`direction_key`,
  ``fold_in(key(seed), DIRECTION_TAG)``
  (the same draw for every run of one architecture and seed, so the runs of
  a comparison are cut along the same random directions before
  normalisation), then filter-normalised (:func:`filter_normalize`): every
  output filter of every kernel (the last axis of a convolution's
  ``(kh, kw, in, out)`` or a dense ``(in, out)`` kernel) is scaled to the
  norm of the weights' filter; biases and BatchNorm's scale and offset (the
  parameters of one or no axis) are held fixed (direction zero), as Li et
  al. do.  BatchNorm's running statistics are the model's own.
* **Evaluation**: eval mode (running statistics), the mean cross-entropy
  and top-1 accuracy over a fixed subset of ``samples`` training (or test)
  samples, drawn without replacement by ``numpy.random.default_rng(seed)``
  (all of them with ``samples = 0``), in the run's evaluation chunks.  The
  whole grid is one jitted program: ``lax.map`` over the grid points,
  ``points_per_step`` of them vmapped at a time (:func:`grid_values`).  The
  trained model itself is evaluated in the same program (``center``), so it
  is there even when the grid has no point at ``(0, 0)`` (an even size);
  the directions are drawn in it too.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import TYPE_CHECKING

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax

from jsfl import checkpoint, rundir
from jsfl import config as config_lib
from jsfl.errors import CheckpointError, UserError
from jsfl.train.evaluate import chunk_test_set, evaluate

if TYPE_CHECKING:
  from jsfl.train.experiment import Experiment

GRID = 21          # points per axis (Li et al. draw 51; 21 x 21 is a few minutes on a GPU)
SPAN = 1.0         # the grid is [-SPAN, SPAN]^2, in units of the normalised directions
DATA = "train"     # Li et al. plot the training loss
DATAS = ("train", "test")
SAMPLES = 2000     # a fixed subset; 0 = every sample of the split
DIRECTION_TAG = 0x4C53  # folded into key(seed): directions apart from the run's own draws
SUBDIR = "landscape"


class LandscapeError(UserError):
  """A run, seed or option the landscape cannot be drawn for."""


@dataclasses.dataclass(frozen=True)
class Options:
  """What ``jsfl landscape`` takes (defaults: the module's constants)."""

  seed: int | None = None   # one of the run's seeds; None: its first
  grid: int = GRID
  span: float = SPAN
  data: str = DATA
  samples: int = SAMPLES
  points_per_step: int = 0  # grid points vmapped at a time; 0: 1 on the CPU, 8 elsewhere


def default_points_per_step(backend: str | None = None) -> int:
  """Grid points evaluated side by side: one on the CPU (a vmapped
  convolution over stacked weights is a slow grouped one there), eight on
  an accelerator."""
  backend = backend or jax.default_backend()
  return 1 if backend == "cpu" else 8


# Every point is an evaluation of the model: 501^2 is some 250k of them, far
# past any figure's resolution (KoReA's Fig. 4 reads at a few dozen a side).
MAX_GRID = 501


def path_for(run_dir: str, seed: int, ext: str = "json") -> str:
  """``RUN_DIR/landscape/landscape-seed<S>.<ext>``."""
  return os.path.join(run_dir, SUBDIR, f"landscape-seed{seed}.{ext}")


def check_options(opts: Options) -> None:
  """Raises :class:`LandscapeError` for an option out of range (before any
  file is read)."""
  if not isinstance(opts.grid, int) or not 3 <= opts.grid <= MAX_GRID:
    raise LandscapeError(f"--grid={opts.grid}; allowed: an int in [3, {MAX_GRID}] "
                         "(points per axis)")
  if not (isinstance(opts.span, (int, float)) and np.isfinite(opts.span) and opts.span > 0):
    raise LandscapeError(f"--span={opts.span}; allowed: a number > 0")
  if opts.data not in DATAS:
    raise LandscapeError(f"--data={opts.data!r}; allowed: {', '.join(DATAS)}")
  if not isinstance(opts.samples, int) or opts.samples < 0:
    raise LandscapeError(f"--samples={opts.samples}; allowed: an int >= 1, or 0 for "
                         "every sample")
  if opts.points_per_step < 0:
    raise LandscapeError(f"points_per_step={opts.points_per_step}; allowed: an int >= 1, "
                         "or 0 for the backend's default")


def check_run(run_dir: str, seed: int | None) -> tuple[dict, int]:
  """The run's config and the seed to draw, checked without loading data.

  Raises:
    LandscapeError: no run directory, a program of several sweep cells, a
      method whose output is no single model, a seed not of the run, or no
      checkpoint.
  """
  from jsfl.train.lifecycle import read_run_config
  if not os.path.isdir(run_dir):
    raise LandscapeError(f"RUN_DIR={run_dir!r} does not exist; allowed: a run directory "
                         "that jsfl run wrote")
  try:
    cfg, cells = read_run_config(run_dir, progress=False)
  except config_lib.ConfigError as e:
    raise LandscapeError(str(e)) from None
  if cells is not None:
    raise LandscapeError(
        f"{run_dir!r} is a program of several sweep cells; allowed: the run of one config "
        "(jsfl run, or a cell jsfl sweep --per-cell trained as its own program)")
  from jsfl.methods.catalog import get_method
  c = config_lib.typed(cfg)
  if get_method(c.method.name).predict is not None:
    raise LandscapeError(
        f"method {c.method.name!r} outputs no single model (its prediction is a maximum "
        "over several models' logits); allowed: a run of a method that evaluates one model")
  seeds = list(range(c.run.seed, c.run.seed + c.run.seeds))
  if seed is None:
    seed = seeds[0]
  if seed not in seeds:
    raise LandscapeError(f"--seed={seed}: not a seed of {run_dir!r}; allowed: "
                         + ", ".join(map(str, seeds)))
  if checkpoint.latest_round(os.path.join(run_dir, "checkpoints")) is None:
    raise LandscapeError(
        f"{run_dir!r} has no checkpoint ({os.path.join(run_dir, 'checkpoints')} is missing "
        "or empty; a sweep cell trained as a slot of a program of several cells keeps "
        "none); allowed: a run directory with checkpoints/ (jsfl run, or jsfl sweep "
        "--per-cell)")
  rundir.check_parent(os.path.join(run_dir, SUBDIR, "x"), "RUN_DIR", LandscapeError)
  return cfg, seed


@dataclasses.dataclass
class Final:
  """A run's final model, as its evaluation sees it."""

  exp: Experiment    # the run's data, model and setup
  seed: int
  round: int         # the checkpoint's round
  params: tuple      # the whole model: part-1 and part-2 concatenated
  stats: tuple


def final_model(run_dir: str, cfg: dict, seed: int) -> Final:
  """The model the run evaluates after its newest checkpoint, for ``seed``:
  ``Method.output_model`` of that slot's state (split methods: the
  aggregated part-1 followed by the server's part-2; MultiSFL: the master
  model of KoReA-SFL's Step 11, the branch mean,
  docs/methods-multisfl.md#how-jsfl-runs-it)."""
  from jsfl.train.experiment import prepare
  from jsfl.train.programs import build_programs, make_seed_keys
  try:
    exp = prepare(cfg)
  except config_lib.ConfigError as e:
    raise LandscapeError(f"{run_dir}/config.json: {e}") from None
  init = build_programs(exp)[0]
  # The state's layout, traced but not compiled: what the restore fills.
  template = jax.tree.map(_zeros, jax.eval_shape(init, make_seed_keys(exp.seeds)))
  got = checkpoint.restore_newest(os.path.join(run_dir, "checkpoints"), template, exp.seeds)
  if got is None:  # removed since check_run looked
    raise CheckpointError(f"{run_dir!r} has no checkpoint; allowed: a run directory "
                          "with checkpoints/")
  round_, state = got
  i = exp.seeds.index(seed)
  params, stats = jax.jit(lambda st: exp.method.output_model(
      exp.setup, jax.tree.map(lambda a: a[i], st)))(state)
  return Final(exp, seed, round_, params, stats)


def _zeros(leaf: jax.ShapeDtypeStruct) -> jax.Array:
  """A placeholder array of ``leaf``'s shape and type on the default device
  (a PRNG key leaf: keys of zero data)."""
  if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
    data = jax.eval_shape(jax.random.key_data, leaf)
    return jax.random.wrap_key_data(jax.device_put(np.zeros(data.shape, data.dtype)))
  return jax.device_put(np.zeros(leaf.shape, leaf.dtype))


def filter_normalize(direction, weights):
  """``direction`` with every filter scaled to its weights' filter norm.

  A leaf of two or more axes is a kernel whose last axis holds its output
  filters (jsfl's convolutions are ``(kh, kw, in, out)``, dense layers
  ``(in, out)``): ``d[..., j] * |w[..., j]| / |d[..., j]|``.  A leaf of one
  axis or none (a bias, BatchNorm's scale and offset) gets a zero
  direction, as Li et al. hold them fixed.
  """
  def one(d, w):
    if d.ndim <= 1:
      return jnp.zeros_like(d)
    axes = tuple(range(d.ndim - 1))
    dn = jnp.sqrt(jnp.sum(jnp.square(d), axes, keepdims=True))
    wn = jnp.sqrt(jnp.sum(jnp.square(w), axes, keepdims=True))
    return d * (wn / (dn + 1e-10))  # Li et al.'s 1e-10: a zero filter stays zero
  return jax.tree.map(one, direction, weights)


def gaussian(key, like):
  """A standard normal pytree shaped like ``like``: one draw of every
  element, in tree order, cut into the leaves (one random-bits call
  compiles far faster than one per leaf)."""
  leaves, treedef = jax.tree.flatten(like)
  sizes = [int(np.prod(x.shape)) for x in leaves]
  flat = jax.random.normal(key, (sum(sizes),), jnp.float32)
  ends = np.cumsum(sizes)
  return jax.tree.unflatten(treedef, [
      flat[e - n:e].reshape(x.shape).astype(x.dtype)
      for x, n, e in zip(leaves, sizes, ends, strict=True)])


def direction_key(seed: int) -> jax.Array:
  """The key the directions of ``seed`` are drawn from, apart from every key
  the run itself drew from ``key(seed)``."""
  return jax.random.fold_in(jax.random.key(seed), DIRECTION_TAG)


def directions(key: jax.Array, params):
  """The two filter-normalised Gaussian directions around ``params`` (traceable)."""
  k1, k2 = jax.random.split(key)
  return (filter_normalize(gaussian(k1, params), params),
          filter_normalize(gaussian(k2, params), params))


def axes(grid: int, span: float) -> np.ndarray:
  """The grid's coordinates on either axis (``0`` among them when ``grid``
  is odd)."""
  return np.linspace(-span, span, grid)


def grid_values(model, params, stats, d1, d2, points, data, mean, std, num_classes: int,
                points_per_step: int = 1):
  """Loss and accuracy at ``params + a d1 + b d2`` for every ``(a, b)``.

  Args:
    model: the StagedModel.
    params, stats: the model (eval mode: running statistics).
    d1, d2: directions shaped like ``params``.
    points: ``(P, 2)`` of ``(a, b)``.
    data: :func:`~jsfl.train.evaluate.chunk_test_set` of the samples.
    mean, std: input normalisation.
    num_classes: L.
    points_per_step: points vmapped at a time (``lax.map``'s batch size).

  Returns:
    ``(loss, accuracy)``, each ``(P,)`` (accuracy in %).
  """
  def at(ab):
    a, b = ab[0], ab[1]
    p = jax.tree.map(lambda w, u, v: w + a * u + b * v, params, d1, d2)
    e = evaluate(model, p, stats, data, mean, std, num_classes)
    return e["loss"], e["accuracy"]
  return lax.map(at, points, batch_size=points_per_step if points_per_step > 1 else None)


def subset(x, y, samples: int, seed: int):
  """The fixed subset: ``samples`` of them drawn without replacement by
  ``default_rng(seed)``, in their order in the split; all for 0."""
  n = len(y)
  if samples == 0 or samples >= n:
    return x, y
  idx = np.sort(np.random.default_rng(seed).choice(n, samples, replace=False))
  return x[idx], y[idx]


def compute(final: Final, opts: Options) -> dict:
  """The landscape of ``final`` as the JSON object :func:`write` stores."""
  exp = final.exp
  ds = exp.dataset
  x, y = (ds.x_train, ds.y_train) if opts.data == "train" else (ds.x_test, ds.y_test)
  x, y = subset(np.asarray(x), np.asarray(y), opts.samples, final.seed)
  conf = exp.config
  data = jax.tree.map(jnp.asarray, chunk_test_set(x, y, conf.exec.eval_batch))
  coords = axes(opts.grid, opts.span)
  b, a = np.meshgrid(coords, coords, indexing="ij")  # row i: y = coords[i]
  points = np.concatenate([np.stack([a.ravel(), b.ravel()], 1), [[0.0, 0.0]]])
  setup = exp.setup
  step = opts.points_per_step or default_points_per_step()

  def program(params, stats, key, pts, dat, mean, std):
    d1, d2 = directions(key, params)
    return grid_values(setup.model, params, stats, d1, d2, pts, dat, mean, std,
                       setup.num_classes, step)
  t0 = time.perf_counter()
  loss, acc = jax.device_get(jax.jit(program)(
      final.params, final.stats, direction_key(final.seed), jnp.asarray(points, jnp.float32),
      data, exp.data.mean, exp.data.std))
  wall = time.perf_counter() - t0
  g = opts.grid
  c = conf
  return {
      "seed": final.seed, "round": final.round, "rounds": c.run.rounds,
      "method": c.method.name, "model": c.model.name, "dataset": c.dataset.name,
      "options": {"grid": g, "span": float(opts.span), "data": opts.data,
                  "samples": int(len(y)), "samples_asked": opts.samples,
                  "points_per_step": step},
      "x": coords, "y": coords,
      "loss": np.asarray(loss[:-1]).reshape(g, g), "accuracy": np.asarray(acc[:-1]).reshape(g, g),
      "center": {"loss": float(loss[-1]), "accuracy": float(acc[-1])},
      "directions": ("Gaussian from fold_in(key(seed), DIRECTION_TAG), filter-normalised "
                     "(Li et al. 2018); biases and BatchNorm parameters fixed"),
      "layout": "loss[i][j] and accuracy[i][j] at alpha = x[j] (direction 1), "
                "beta = y[i] (direction 2)",
      "wall_s": wall,
  }


def write(run_dir: str, result: dict) -> str:
  """``RUN_DIR/landscape/landscape-seed<S>.json``, atomically."""
  path = path_for(run_dir, result["seed"])
  os.makedirs(os.path.dirname(path), exist_ok=True)
  rundir.write_json_atomic(path, result)
  return path


def landscape(run_dir: str, opts: Options = Options()) -> tuple[str, dict]:
  """Checks, computes and writes the landscape of a run; returns the JSON
  file's path and its object.

  Raises:
    LandscapeError, CheckpointError: a bad run, seed or option; nothing
      is written.
  """
  check_options(opts)
  cfg, seed = check_run(run_dir, opts.seed)
  final = final_model(run_dir, cfg, seed)
  result = compute(final, opts)
  return write(run_dir, result), result
