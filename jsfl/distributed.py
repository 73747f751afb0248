"""Multi-host runs: ``jax.distributed.initialize`` and who writes.

Every process runs the same program (SPMD): the same config, data,
partitions and keys, each feeding only its own devices' shards of the global
arrays (:func:`jsfl.core.sharding.put`), so the mesh of
:mod:`jsfl.core.sharding` spans all hosts' devices with no other change.
Process 0 alone writes the run directory; checkpoints are written by all
processes together (orbax coordinates them) into process 0's directory,
whose path is broadcast, so the directory must be on a filesystem every host
sees.

Arguments come from flags (``jsfl run --distributed --coordinator HOST:PORT
--num-processes N --process-id I``), else from ``JSFL_COORDINATOR`` /
``JSFL_NUM_PROCESSES`` / ``JSFL_PROCESS_ID``, else JAX detects the cluster
(Slurm, Open MPI, Kubernetes/GKE, Cloud TPU) itself.  See docs/multihost.md.
"""

from __future__ import annotations

import os

import jax
import numpy as np

_PATH_BYTES = 4096


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None) -> None:
  """Joins this process to the run's cluster (call before any other jax use).

  Args:
    coordinator: ``host:port`` of process 0's coordination service.
    num_processes: processes in the run.
    process_id: this process's rank in ``[0, num_processes)``.
    Each falls back to its ``JSFL_*`` environment variable, then to JAX's
    cluster auto-detection.

  Raises:
    ValueError: a process id outside ``[0, num_processes)``.
  """
  env = os.environ.get
  coordinator = coordinator or env("JSFL_COORDINATOR") or None
  if num_processes is None and (n := env("JSFL_NUM_PROCESSES")):
    num_processes = _env_int("JSFL_NUM_PROCESSES", n)
  if process_id is None and (p := env("JSFL_PROCESS_ID")):
    process_id = _env_int("JSFL_PROCESS_ID", p)
  if coordinator is not None:
    host, sep, port = coordinator.rpartition(":")
    if not (sep and host and port.isdigit() and 0 < int(port) < 65536):
      raise ValueError(f"--coordinator={coordinator!r} (or $JSFL_COORDINATOR); allowed: "
                       "HOST:PORT with a port in [1, 65535], e.g. node0:1234")
  if num_processes is not None and num_processes < 1:
    raise ValueError(f"--num-processes={num_processes}; allowed: an int >= 1")
  if num_processes is not None and process_id is not None and not (
      0 <= process_id < num_processes):
    raise ValueError(f"--process-id={process_id}; allowed: 0 <= id < "
                     f"--num-processes={num_processes}")
  try:
    jax.distributed.initialize(coordinator_address=coordinator,
                               num_processes=num_processes, process_id=process_id)
  except ValueError as e:  # JAX found no cluster to take the missing ones from
    why = str(e).rstrip(".")
    raise ValueError(f"jax.distributed.initialize: {why}; allowed: --coordinator HOST:PORT, "
                     "--num-processes N and --process-id I (or their $JSFL_* variables), "
                     "or a cluster JAX detects (Slurm, Open MPI, Kubernetes, Cloud TPU)"
                     ) from None


def _env_int(name: str, value: str) -> int:
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"${name}={value!r}; allowed: an int") from None


def is_writer() -> bool:
  """Whether this process writes files (process 0, or the only process)."""
  return jax.process_index() == 0


def broadcast_path(path: str | None) -> str:
  """Process 0's ``path`` on every process (a no-op with one process)."""
  if jax.process_count() == 1:
    assert path is not None, "a single process is the writer and names the path"
    return path
  from jax.experimental import multihost_utils
  buf = np.zeros(_PATH_BYTES, np.uint8)
  if is_writer():
    assert path is not None, "process 0 names the path"
    raw = path.encode()
    if len(raw) > _PATH_BYTES:
      raise ValueError(f"run directory path longer than {_PATH_BYTES} bytes: {path!r}")
    buf[:len(raw)] = np.frombuffer(raw, np.uint8)
  out = np.asarray(multihost_utils.broadcast_one_to_all(buf))
  return bytes(out[out != 0].tolist()).decode()
