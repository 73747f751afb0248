"""The persistent XLA compilation cache (``exec.compile_cache``).

Compiled programs are keyed by XLA on the program, the devices and the
versions; a second start of the same config, a ``--resume`` and every
program of a sweep that another run compiled before skip compilation and
load the executable from disk (the measured times: ``benchmarks/README.md``,
"compile_cache.py").

Where: ``exec.compile_cache`` = ``auto`` takes ``$JSFL_COMPILE_CACHE`` if set,
else JAX's own ``$JAX_COMPILATION_CACHE_DIR`` (a cache the user already
keeps, e.g. on a cluster's shared disk), else ``$XDG_CACHE_HOME/jsfl/xla``
(``~/.cache/jsfl/xla``); ``off`` (or ``$JSFL_COMPILE_CACHE`` set to ``off``)
disables it; any other value is the directory.  JAX's own variables for the
cache's size and smallest program
(``JAX_COMPILATION_CACHE_MAX_SIZE``, ``JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS``)
are left as the user set them.

Size and sharing: the directory holds at most :data:`MAX_BYTES`, the least
recently used programs evicted first, and every read and write of an entry
holds the directory's file lock, so concurrent runs sharing it (a sweep's
jobs, a cluster's processes on one home directory) never read an entry
another is still writing.
"""

from __future__ import annotations

import os
import sys

import jax

from jsfl import rundir

# Programs that compile faster than this are not worth a disk entry; the
# rounds, evaluations and initialisations of a run all take longer.
MIN_COMPILE_S = 0.2
# A few hundred programs of the model zoo; beyond it the oldest go.  Any
# bound turns on JAX's locked reads and writes, which need ``filelock``.
MAX_BYTES = 8 << 30


def _has_filelock() -> bool:
  """An install without ``filelock`` (``pip install --no-deps``) keeps JAX's
  unbounded, unlocked cache rather than failing its first compilation."""
  try:
    import filelock  # noqa: F401
  except ImportError:
    return False
  return True


def cache_dir(setting: str = "auto") -> str | None:
  """The directory ``setting`` names, or None when the cache is off."""
  if setting == "auto":
    setting = (os.environ.get("JSFL_COMPILE_CACHE")
               or os.environ.get("JAX_COMPILATION_CACHE_DIR") or "auto")
  if setting == "off":
    return None
  if setting == "auto" or not setting:
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(root, "jsfl", "xla")
  return os.path.abspath(os.path.expanduser(setting))


_WARNED: set[str] = set()  # a sweep prepares a program per cell: one warning


def unusable(path: str) -> str | None:
  """Why ``path`` cannot hold the cache (None: it can), without creating
  anything: JAX makes the directory at its first compilation, so a run
  rejected before it compiles leaves no directory behind."""
  if os.path.lexists(path):
    if not os.path.isdir(path):
      return "it is not a directory"
    return None if os.access(path, os.W_OK | os.X_OK) else "it is not writable"
  return rundir.unmakeable(path)


def enable(setting: str = "auto") -> str | None:
  """Points JAX's persistent cache at ``cache_dir(setting)`` (None: off).

  JAX decides once per process, at its first compilation, whether the cache
  is used; a process that already compiled with another setting keeps it.
  A directory that cannot be made or written costs a one-line warning on
  stderr and runs without the cache, never the run.
  """
  path = cache_dir(setting)
  current = jax.config.jax_compilation_cache_dir  # type: ignore[attr-defined]
  if path == current or (path is None and not current):
    return path
  if path is not None:
    why = unusable(path)
    if why is not None:
      if path in _WARNED:
        return None
      _WARNED.add(path)
      print(f"jsfl: warning: compile cache {path!r} unusable ({why}); compiling "
            "without it (exec.compile_cache: a writable directory, auto or off)",
            file=sys.stderr, flush=True)
      return None
  jax.config.update("jax_compilation_cache_dir", path)
  if "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS" not in os.environ:
    jax.config.update("jax_persistent_cache_min_compile_time_secs", MIN_COMPILE_S)
  if "JAX_COMPILATION_CACHE_MAX_SIZE" not in os.environ:
    jax.config.update("jax_compilation_cache_max_size", MAX_BYTES if _has_filelock() else -1)
  return path
