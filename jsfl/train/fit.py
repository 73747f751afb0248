"""Fitting a run's programs to the device: XLA's memory analysis decides.

A run's slots are one vmapped program.  Before the first round the round
program is compiled for the run's slots and XLA's memory analysis of it
(arguments, outputs, temporaries; :func:`program_bytes`) is read against
the device's memory (:func:`jsfl.train.memory.device_memory`).  A program
that would not fit is compiled again for fewer slots, and the run calls it
on successive chunks of its slots each round (:class:`Chunked`): the same
per-slot computation, so the same results, in more calls.  Where one slot
alone does not fit the run stops before training with one line naming the
need and the device's memory.  ``exec.max_slots`` caps the chunk by hand.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from jsfl.core import sharding
from jsfl.errors import UserError
from jsfl.train import memory, programs

USABLE = 0.9  # of the device's memory a round program may plan to fill


class DoesNotFit(UserError):
  """One slot's round program needs more memory than the device has."""


def program_bytes(compiled) -> int | None:
  """Bytes a compiled program holds at its peak by XLA's memory analysis:
  arguments, outputs and temporaries, less the outputs that reuse donated
  arguments; None where the backend gives no analysis."""
  try:
    m = compiled.memory_analysis()
  except (NotImplementedError, AttributeError, RuntimeError):
    return None
  if m is None:
    return None
  return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes
             - getattr(m, "alias_size_in_bytes", 0))


def _take(tree, lo: int, n: int, size: int):
  """Slots ``lo .. lo + size`` of ``tree``'s leading axis of length ``n``;
  past ``n`` the first slots again (a full last chunk of one shape; the
  extra slots' results are dropped)."""
  def one(a):
    part = a[lo:min(lo + size, n)]
    if part.shape[0] < size:
      part = jnp.concatenate([part, a[:size - part.shape[0]]])
    return part
  return jax.tree.map(one, tree)


@dataclasses.dataclass(frozen=True)
class Chunked:
  """``fn`` called on chunks of ``size`` of the slot axis of its first
  ``slot_args`` arguments (the rest are shared); the outputs, every leaf
  with the slot axis leading, concatenated back to ``n`` slots."""

  fn: Callable
  n: int
  size: int
  slot_args: int

  def __call__(self, *args):
    per_slot, shared = args[:self.slot_args], args[self.slot_args:]
    outs = [self.fn(*_take(per_slot, lo, self.n, self.size), *shared)
            for lo in range(0, self.n, self.size)]
    return jax.tree.map(lambda *xs: jnp.concatenate(xs)[:self.n], *outs)


def compile_round(rnd, init, seed_keys, slot, shared, size: int):
  """``rnd`` compiled for the first ``size`` slots (abstract state)."""
  keys = _take(seed_keys, 0, seed_keys.shape[0], size)
  state = jax.eval_shape(init, keys)
  return rnd.lower(state, _take(slot, 0, seed_keys.shape[0], size),
                   programs.round_keys(keys, 0), shared).compile()


def slots_that_fit(need_1: int, need_2: int, limit: int) -> int:
  """The most slots whose round program fits ``USABLE * limit`` bytes, from
  its needs at one and two slots (linear in the slots: the shared data once,
  every slot its state, data and activations)."""
  per = max(need_2 - need_1, 1)
  return max(0, int((USABLE * limit - (need_1 - per)) // per))


def fit(exp, progs, seed_keys, slot, shared, mesh, limit: int | None = None,
        log: Callable[[str], Any] | None = None):
  """``(init, round, eval)`` that fit the device: the round compiled (so
  the first call does not compile again), chunked over the slots where all
  of them would not fit.

  Raises:
    DoesNotFit: one slot alone needs more than the device's memory.
  """
  init, rnd, ev = progs
  n = len(exp.seeds)
  if not sharding.is_trivial(mesh):  # each device holds its share of the slots
    return progs
  if not hasattr(rnd, "lower"):  # a round that is not one jitted program
    return progs
  limit = memory.device_memory() if limit is None else limit
  size = min(exp.config.exec.max_slots or n, n)
  while True:
    compiled = compile_round(rnd, init, seed_keys, slot, shared, size)
    need = program_bytes(compiled)
    if need is None or need <= USABLE * limit:
      break
    if size == 1:
      raise DoesNotFit(
          f"the round program of one slot needs {need / 2**30:.2f} GiB (XLA's memory "
          f"analysis) and the device has {limit / 2**30:.2f} GiB ({USABLE:.0%} usable); "
          "allowed: a program that fits (fewer clients per round, a smaller "
          "method.batch_size, exec.precision = \"bfloat16\", exec.client_pass = "
          "\"per_visit\", a smaller model)")
    size = max(1, min(size - 1, int(size * USABLE * limit / need)))
  if size == n:
    return init, compiled, ev
  if log is not None:
    why = ("exec.max_slots = " + str(exp.config.exec.max_slots)
           if size == exp.config.exec.max_slots else
           f"{n} slots need more than the device's {limit / 2**30:.1f} GiB in one program")
    log(f"jsfl: {why}: running the slots {size} at a time ({-(-n // size)} calls a round)")
  return (Chunked(init, n, size, 1), Chunked(compiled, n, size, 3),
          Chunked(ev, n, size, 1))
