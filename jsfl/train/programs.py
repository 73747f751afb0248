"""The jitted programs of a run: init, round and evaluation over the slot axis.

Every program maps one slot's function over the leading slot axis
(``exec.seed_exec``: ``vmap``, or ``map``, a rolled ``lax.map``), so a run of
many seeds (or a sweep's program of many cells) is one compiled program per
function.  The programs close over the run's :meth:`Setup.static`; each
slot's batchable values travel in its ``RoundData.hyper``.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from jsfl.core import sharding
from jsfl.core.data import SHARED_FIELDS, SLOT_FIELDS, RoundData
from jsfl.core.method import CountingBytes
from jsfl.engine.sequential import SequentialRounds
from jsfl.train.evaluate import confusion, evaluate, evaluate_logits

UNROLL_MAX_CLIENTS = 32  # beyond this an unrolled client loop makes compiling slow


def default_client_exec(clients_per_round: int, backend: str | None = None) -> str:
  """The client loop ``exec.client_exec = "auto"`` resolves to.

  On the CPU clients run one after another: XLA:CPU runs a vmapped
  convolution over stacked client weights as a slow grouped convolution, and
  a looped client can skip the padded steps of a small one.  Up to
  :data:`UNROLL_MAX_CLIENTS` the loop is unrolled, past that a rolled
  ``lax.map`` (an unrolled loop's compile time grows with its clients).
  Accelerators get vmap, the batched form they are built for.  The CPU's
  choice is measured (``benchmarks/results/``, ``benchmarks/README.md``);
  the accelerators' has no A/B committed yet.
  """
  backend = backend or jax.default_backend()
  if backend != "cpu":
    return "vmap"
  return "unroll" if clients_per_round <= UNROLL_MAX_CLIENTS else "map"


def default_client_pass(backend: str | None = None) -> str:
  """Where ``exec.client_pass = "auto"`` runs a sequential server's
  participants' part-1: inside the server's visit of each on every backend.
  The batched form holds every participant's activations through a segment
  (on a GPU the peak of a seed-batched round: 31.8 GiB at 32 seeds of
  MobileNetV1, 10 clients); the per-visit form holds one participant's.
  ``backend`` is accepted for symmetry with the other defaults."""
  del backend
  return "per_visit"


def default_seed_exec(backend: str | None = None) -> str:
  """The slot loop ``exec.seed_exec = "auto"`` resolves to: a rolled loop on
  the CPU (with no spare cores, batching slots only enlarges every matmul's
  working set), vmap on accelerators.  Measured in ``benchmarks/results/``."""
  backend = backend or jax.default_backend()
  return "map" if backend == "cpu" else "vmap"


def seed_program(fn, how: str, seed_args: int, spmd_axis_name: str | None = None):
  """Runs ``fn`` for every slot in one program.

  The first ``seed_args`` positional arguments carry a leading slot axis,
  the rest are shared.  ``vmap`` batches the slots; ``map`` is a rolled
  loop, cheaper where batching turns per-slot convolutions into grouped
  ones.  ``spmd_axis_name`` names the mesh axis the slots lie on, so
  sharding constraints inside ``fn`` (the client axis) keep it sharded.
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


def split_data(data: RoundData):
  """``(slot fields, shared fields)`` of a program's data: the first carry the
  slot axis, the second are the training set every slot reads."""
  return (tuple(getattr(data, k) for k in SLOT_FIELDS),
          tuple(getattr(data, k) for k in SHARED_FIELDS))


def round_data(slot, shared) -> RoundData:
  """One slot's :class:`RoundData` from :func:`split_data`'s halves."""
  return RoundData(**dict(zip(SHARED_FIELDS, shared, strict=True)),
                   **dict(zip(SLOT_FIELDS, slot, strict=True)))


def build_programs(exp, mesh=None):
  """The jitted init, round and eval programs over the slot axis.

  Args:
    exp: the prepared :class:`~jsfl.train.experiment.Experiment`.
    mesh: a ``("seeds", "clients")`` device mesh (:mod:`jsfl.core.sharding`);
      None or a one-device mesh compiles for the default device.  With more
      devices, programs take and return slot-sharded state and data, shared
      data replicated, and the round's metrics and evaluations replicated so
      every host can read them.

  Returns:
    ``(init(keys), round(state, slot, keys, shared), eval(state, test, mean,
    std))``.
  """
  setup, method = exp.setup.static(), exp.method
  how = exp.seed_exec
  sharded = not sharding.is_trivial(mesh)
  if sharded and mesh.shape["seeds"] > 1:
    how = "vmap"  # a rolled loop over a sharded axis would gather it

  algorithm = method.rounds(setup)  # built once for the run's programs

  def round_one(state, slot, key, shared):
    state, m = algorithm.round(state, round_data(slot, shared), key)
    return state, {**m, "finite": all_finite(state, m["loss"])}

  def init_one(key):
    return algorithm.init(key)

  def eval_one(state, test, mean, std):
    if method.predict is not None:  # outputs that are not one staged model
      return evaluate_logits(lambda x: method.predict(setup, state, x), test,
                             mean, std, setup.num_classes)
    params, stats = method.output_model(setup, state)
    return evaluate(setup.model, params, stats, test, mean, std, setup.num_classes)

  if not sharded:
    return (jax.jit(seed_program(init_one, how, 1)),
            jax.jit(seed_program(round_one, how, 3), donate_argnums=(0,)),
            jax.jit(seed_program(eval_one, how, 1)))
  ss, rep = sharding.seed_sharding(mesh), sharding.replicated(mesh)
  spmd = "seeds" if how == "vmap" else None
  init = jax.jit(seed_program(init_one, how, 1, spmd), in_shardings=(ss,), out_shardings=ss)
  rnd = jax.jit(seed_program(round_one, how, 3, spmd), donate_argnums=(0,),
                in_shardings=(ss, ss, ss, rep), out_shardings=(ss, rep))
  ev = jax.jit(seed_program(eval_one, how, 1, spmd),
               in_shardings=(ss, rep, rep, rep), out_shardings=rep)

  def traced_under_mesh(fn):
    # constrain_clients reads the active mesh while the round is traced.
    def call(*args):
      with sharding.active(mesh):
        return fn(*args)
    return call
  return tuple(map(traced_under_mesh, (init, rnd, ev)))


def build_step_program(exp):
  """The round program of ``run.step_confusion``: the run's round (the
  same state and metrics) that also returns, per slot, the test-set
  confusion matrix after each of the round's first ``run.step_confusion_steps``
  steps (``jsfl.engine.split.SplitRounds.watched_round``; a sequential
  method's steps are its clients,
  ``jsfl.engine.sequential.SequentialRounds.watched_round``): ``confusion``
  ``(S, L, L)`` (zeros past ``count``), ``labels`` ``(S,)`` the dominant label
  each step served, ``count``.  The step models are held through the round
  and evaluated after it by a ``lax.map`` over the steps.  Called as
  ``(state, slot, keys, shared, test)``; one device (the experiment checks).
  """
  setup, method = exp.setup.static(), exp.method
  algorithm = method.build(setup)
  counting = CountingBytes(algorithm, setup, method.communication)
  steps = exp.config.run.step_confusion_steps or (
      setup.clients_per_round if isinstance(algorithm, SequentialRounds)
      else setup.num_classes)

  def one(state, slot, key, shared, test):
    state, m, sm = algorithm.watched_round(state, round_data(slot, shared), key,
                                           method.output_model, steps)
    m = counting.counted(m)
    _, _, mean, std = shared
    conf = lax.map(lambda ps: confusion(setup.model, ps[0], ps[1], test, mean, std,
                                        setup.num_classes), sm.models)
    return (state, {**m, "finite": all_finite(state, m["loss"])},
            {"confusion": conf, "labels": sm.labels, "count": sm.num_steps})

  return jax.jit(seed_program(one, exp.seed_exec, 3), donate_argnums=(0,))


def all_finite(*trees) -> jax.Array:
  """Whether every float in ``trees`` is finite: one reduction per round that
  lets the loop stop a diverged slot instead of logging NaN as a result."""
  leaves = [x for x in jax.tree.leaves(trees)
            if jnp.issubdtype(jnp.result_type(x), jnp.inexact)]
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in leaves]))


def run_mesh(exp):
  """The run's device mesh (``exec.mesh``), or None on a single device."""
  shape = sharding.mesh_shape(exp.config.exec.mesh, jax.device_count(),
                              len(exp.seeds), exp.setup.clients_per_round)
  return None if shape == (1, 1) else sharding.make_mesh(shape)


def place(mesh, seed_keys, slot, shared, test):
  """Slot-axis arrays onto the mesh's seed axis, the rest replicated; as is
  without a mesh."""
  if sharding.is_trivial(mesh):
    return seed_keys, slot, shared, test
  ss, rep = sharding.seed_sharding(mesh), sharding.replicated(mesh)
  return (sharding.put(seed_keys, ss), sharding.put(slot, ss),
          sharding.put(shared, rep), sharding.put(test, rep))


def commit(state, mesh):
  """``state`` committed to its device, as a restored checkpoint's arrays
  are: jit lowers committed and uncommitted inputs to different programs,
  so a new run and its resume share one round program (and its entry in the
  compilation cache) only if both start from committed arrays.  A mesh's
  arrays are committed already (:func:`place`)."""
  if not sharding.is_trivial(mesh):
    return state
  return jax.device_put(state, jax.local_devices()[0])


def make_seed_keys(seeds):
  """One PRNG key per slot (seed s -> key(s)), stacked on the slot axis."""
  return jax.random.wrap_key_data(
      jnp.stack([jax.random.key_data(jax.random.key(s)) for s in seeds]))


def round_keys(seed_keys, r: int):
  """Round ``r``'s key of every slot."""
  return jax.vmap(lambda k: jax.random.fold_in(k, r))(seed_keys)
