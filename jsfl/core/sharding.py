"""Device meshes for seed-batched rounds: one program over many devices and hosts.

A run's arrays have two axes worth spreading over devices: the leading seed
axis of every state leaf, per-seed data leaf and metric (seeds never talk to
each other, so splitting them costs no communication), and inside a round the
stacked client / branch axis of the client portions (``map_clients``).  The
mesh names them ``("seeds", "clients")``.  Rounds are compiled with sharded
``jit`` (GSPMD): inputs are placed with :class:`NamedSharding`, the seed
``vmap`` carries ``spmd_axis_name="seeds"``, and :func:`constrain_clients`
marks the client axis inside the round.  This is the maintained successor of
``pmap``; nothing here uses it.

Multi-host: after ``jax.distributed.initialize()`` ``jax.devices()`` lists every
process's devices, the mesh spans them, and :func:`put` builds global arrays
from the (identical, deterministic) host copy each process holds with
``jax.make_array_from_callback``.  Outputs the host reads (metrics,
evaluation) are replicated so every process can fetch them.
"""

from __future__ import annotations

import contextlib
import math

import jax
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

AXES = ("seeds", "clients")

_ACTIVE: list[Mesh | None] = []


def parse_mesh_spec(spec: str) -> dict[str, int] | None:
  """``"auto"`` -> None; ``"seeds=4,clients=2"`` -> {"seeds": 4, "clients": 2}.

  Raises:
    ValueError: an unknown axis, a size that is not a positive int, or bad syntax.
  """
  spec = spec.strip()
  if spec == "auto":
    return None
  sizes = {}
  for part in spec.split(","):
    name, sep, value = part.partition("=")
    name = name.strip()
    if not sep or name not in AXES:
      raise ValueError(f"exec.mesh={spec!r}: bad entry {part.strip()!r}; allowed: "
                       f"'auto' or 'seeds=S,clients=C' (axes {', '.join(AXES)})")
    try:
      size = int(value)
    except ValueError:
      size = 0
    if size < 1:
      raise ValueError(f"exec.mesh={spec!r}: {name}={value.strip()!r}; allowed: an int >= 1")
    sizes[name] = size
  return sizes


def mesh_shape(spec: str, num_devices: int, num_seeds: int,
               clients_per_round: int) -> tuple[int, int]:
  """The ``(seeds, clients)`` mesh shape of a run.

  ``auto`` gives the seed axis as many devices as divide the seed count (free
  parallelism), then the client axis as many of the remaining devices as
  divide the participants; devices that divide neither stay idle rather than
  padding the arrays.  An explicit spec is checked against the devices and
  the array sizes it must divide.

  Raises:
    ValueError: naming the bad size and what is allowed.
  """
  sizes = parse_mesh_spec(spec)
  if sizes is None:
    s = math.gcd(num_devices, num_seeds)
    c = math.gcd(num_devices // s, clients_per_round)
    return s, c
  s, c = sizes.get("seeds", 1), sizes.get("clients", 1)
  if s * c > num_devices:
    raise ValueError(f"exec.mesh={spec!r} needs {s * c} devices, {num_devices} "
                     f"available; allowed: seeds * clients <= {num_devices}")
  if num_seeds % s:
    raise ValueError(f"exec.mesh={spec!r}: seeds={s} does not divide run.seeds="
                     f"{num_seeds}; allowed: a divisor of run.seeds")
  if clients_per_round % c:
    raise ValueError(f"exec.mesh={spec!r}: clients={c} does not divide the "
                     f"{clients_per_round} clients (branches) per round; allowed: a divisor")
  return s, c


def make_mesh(shape: tuple[int, int], devices=None) -> Mesh:
  """A ``("seeds", "clients")`` mesh over the first ``seeds * clients`` devices."""
  devices = jax.devices() if devices is None else devices
  s, c = shape
  return Mesh(np.asarray(devices[:s * c]).reshape(s, c), AXES)


def is_trivial(mesh: Mesh | None) -> bool:
  return mesh is None or mesh.size == 1


def seed_sharding(mesh: Mesh) -> NamedSharding:
  """Leading axis over the mesh's seed axis, the rest replicated."""
  return NamedSharding(mesh, P("seeds"))


def replicated(mesh: Mesh) -> NamedSharding:
  return NamedSharding(mesh, P())


def put(tree, sharding: NamedSharding):
  """Global arrays of ``tree`` laid out by ``sharding``, on one host or many.

  Every process must hold the same host values (jsfl's data, partitions and
  keys are deterministic functions of the config); each contributes only the
  shards of its own devices.  Typed PRNG keys travel as their key data.
  """
  def one(a):
    if jax.dtypes.issubdtype(getattr(a, "dtype", None), jax.dtypes.prng_key):
      impl = jax.random.key_impl(a)
      return jax.random.wrap_key_data(one(jax.random.key_data(a)), impl=impl)
    host = np.asarray(a)
    return jax.make_array_from_callback(host.shape, sharding, lambda i: host[i])
  return jax.tree.map(one, tree)


@contextlib.contextmanager
def active(mesh: Mesh | None):
  """Makes ``mesh`` the one :func:`constrain_clients` lays client axes on
  while a round is traced."""
  _ACTIVE.append(mesh)
  try:
    yield mesh
  finally:
    _ACTIVE.pop()


def current() -> Mesh | None:
  return _ACTIVE[-1] if _ACTIVE else None


def constrain_clients(tree):
  """Lays the leading (client / branch) axis of ``tree`` on the mesh's client
  axis; a no-op without an active mesh, with one client device, or where the
  axis does not divide evenly (GSPMD would pad every step)."""
  mesh = current()
  if mesh is None or mesh.shape["clients"] == 1:
    return tree
  c = mesh.shape["clients"]
  spec = NamedSharding(mesh, P("clients"))

  def one(a):
    if getattr(a, "ndim", 0) == 0 or a.shape[0] % c:
      return a
    return lax.with_sharding_constraint(a, spec)
  return jax.tree.map(one, tree)

