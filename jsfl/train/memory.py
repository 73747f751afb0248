"""How many slots of a program fit on a device: an estimate from shapes."""

from __future__ import annotations

import os

import jax
import jax.numpy as jnp
import numpy as np

from jsfl.core.data import SHARED_FIELDS

MEMORY_SHARE = 0.5  # of the device's memory a sweep's program may plan to fill


def tree_bytes(tree) -> int:
  return int(sum(np.prod(a.shape) * np.dtype(a.dtype).itemsize
                 for a in jax.tree.leaves(tree) if hasattr(a, "dtype")
                 and not jax.dtypes.issubdtype(a.dtype, jax.dtypes.prng_key)))


def memory_estimate(exp) -> dict:
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
  params, stats = setup.model.shapes()
  x = jax.ShapeDtypeStruct((setup.batch_size, *setup.model.input_shape), jnp.float32)
  acts = 0
  for k in range(setup.model.num_stages):
    x, _ = jax.eval_shape(lambda p, s, a, k=k: setup.model.apply(
        p, s, a, start=k, train=True), params[k:k + 1], stats[k:k + 1], x)
    acts += tree_bytes(x)
  side_by_side = setup.clients_per_round if setup.client_exec == "vmap" else 1
  vmapped = exp.seed_exec == "vmap"
  per_slot = (3 * tree_bytes(state) + tree_bytes(exp.data.table[0])
              + (2 * acts * side_by_side if vmapped else 0))
  shared = tree_bytes([getattr(exp.data, k) for k in SHARED_FIELDS])
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


def fitting_slots(exp) -> int:
  """How many slots of ``exp``'s program fit in :data:`MEMORY_SHARE` of the
  device's memory (:func:`memory_estimate`), at least 1."""
  m = memory_estimate(exp)
  room = MEMORY_SHARE * m["device"] * jax.device_count() - m["shared"]
  return max(1, int(room // max(m["per_slot"], 1)))


def memory_text(exp) -> str:
  m = memory_estimate(exp)
  gib = 2.0 ** 30
  return (f"~{m['per_slot'] / gib:.2f} GiB a slot + {m['shared'] / gib:.2f} GiB shared, "
          f"{MEMORY_SHARE:.0%} of {m['device'] / gib:.1f} GiB a device")
