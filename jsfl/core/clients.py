"""Running one function for every participant of a round in one program."""

from __future__ import annotations

from collections.abc import Callable

import jax
import jax.numpy as jnp
from jax import lax

from jsfl.core import sharding

CLIENT_EXECS = ("vmap", "map", "unroll")


def map_clients(fn: Callable, how: str, *args):
  """Applies ``fn`` to each slice of ``args`` along their leading client axis.

  ``vmap`` batches all clients into one program (fastest on GPU and for dense
  layers); ``map`` is a rolled sequential loop (``lax.map``), ``unroll`` a
  Python-unrolled loop inside the same jit, which XLA:CPU may run faster for
  convolutions with the ``xla`` lowering (measured in ``benchmarks/results/``).  All three compute
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
