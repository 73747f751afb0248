"""JAX's GPU memory allocator as jsfl sets it, unless the user has.

JAX preallocates 75% of a GPU by default; with preallocation off it keeps
that 75% cap and grows a pool that fragments (docs.jax.dev, "GPU memory
allocation").  A seed-batched round wants one large arena: jsfl raises the
preallocated share to :data:`MEM_FRACTION` when none of JAX's allocator
variables is set.  The variables are read when the backend starts, so
:func:`configure` runs before the command's first JAX call.
"""

from __future__ import annotations

import os

ALLOCATOR_VARS = ("XLA_PYTHON_CLIENT_PREALLOCATE", "XLA_PYTHON_CLIENT_MEM_FRACTION",
                  "XLA_PYTHON_CLIENT_ALLOCATOR")
MEM_FRACTION = "0.92"  # leaves cuDNN / cuBLAS workspaces and the CUDA context room
_SET_BY_JSFL = "JSFL_SET_ALLOCATOR"


def configure() -> None:
  """Sets ``XLA_PYTHON_CLIENT_MEM_FRACTION`` to :data:`MEM_FRACTION` when
  the user set none of :data:`ALLOCATOR_VARS` (no effect on a CPU)."""
  if any(v in os.environ for v in ALLOCATOR_VARS):
    return
  os.environ["XLA_PYTHON_CLIENT_MEM_FRACTION"] = MEM_FRACTION
  os.environ[_SET_BY_JSFL] = "1"


def describe() -> str:
  """One line: the allocator settings in force and who set them."""
  given = {v: os.environ[v] for v in ALLOCATOR_VARS if v in os.environ}
  if not given:
    return "JAX's defaults (75% of each GPU preallocated)"
  text = ", ".join(f"{k}={v}" for k, v in given.items())
  if os.environ.get(_SET_BY_JSFL):
    return f"{text} (set by jsfl: one arena of {float(MEM_FRACTION):.0%} of each GPU)"
  return f"{text} (yours)"
