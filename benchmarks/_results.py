"""What a benchmark's result files are called and how they are written: one
spelling for every script of ``benchmarks/``.

A finished run writes ``OUT/<script>-<tag>-...-<YYYYmmdd-HHMMSS>.json``
(``OUT`` defaults to ``benchmarks/results/``); the tags are what tells two
runs of the script apart, in the order the script names them, usually the
backend and the host (``vs_torch-cpu-vm-20261124-011624.json``). A run that
writes row by row keeps ``OUT/<script>-partial.json`` until it finishes, so
one stopped by a time limit leaves what it measured.

``benchmarks/`` is not a package: a script imports this module as a sibling
(the script's folder is first on ``sys.path``). Only :func:`machine` imports
jax, when called, so a parent process that must not start a backend can name
its files too.
"""

from __future__ import annotations

import json
import os
import platform
import socket
import time

DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")
"""The default ``--out`` of every script: ``benchmarks/results/``."""


def host(short: bool = False) -> str:
  """The machine tag: the host name (``short``: up to its first dot)."""
  name = socket.gethostname()
  return name.split(".")[0] if short else name


def stamp() -> str:
  """The time tag, local time: ``YYYYmmdd-HHMMSS``."""
  return time.strftime("%Y%m%d-%H%M%S")


def path(out: str, script: str, *tags: object, ext: str = ".json",
         when: str | None = None) -> str:
  """``OUT/SCRIPT-TAG-...-STAMP<ext>``, creating ``out``. Empty tags (``""``,
  ``None``) are left out; ``ext=""`` gives the stem, for a JSON and a PNG
  of the same name; ``when`` replaces the current time."""
  os.makedirs(out, exist_ok=True)
  parts = [script, *(str(t) for t in tags if t not in ("", None)), when or stamp()]
  return os.path.join(out, "-".join(parts) + ext)


def partial_path(out: str, script: str) -> str:
  """``OUT/SCRIPT-partial.json``: the rows so far of an unfinished run."""
  return os.path.join(out, f"{script}-partial.json")


def write_json(file: str, obj: object) -> str:
  """Writes ``obj`` (indent 1) to ``file`` through a ``.tmp`` beside it, so a
  reader, or a run killed mid-write, never sees half a file; returns ``file``."""
  os.makedirs(os.path.dirname(file) or ".", exist_ok=True)
  with open(file + ".tmp", "w") as f:
    json.dump(obj, f, indent=1)
  os.replace(file + ".tmp", file)
  return file


def write_partial(out: str, script: str, res: dict) -> str:
  """Rewrites ``OUT/SCRIPT-partial.json`` with ``res`` marked ``partial``."""
  return write_json(partial_path(out, script), {**res, "partial": True})


def drop_partial(out: str, script: str) -> None:
  """Removes ``OUT/SCRIPT-partial.json`` (a finished run has its own file)."""
  p = partial_path(out, script)
  if os.path.exists(p):
    os.remove(p)


def machine(**extra: object) -> dict:
  """The ``machine`` record of a result file: host, platform, CPU model,
  CPUs (and those this process may use: a ``taskset`` run's), Python,
  backend, first device, device count and jax's version, then ``extra``.
  Starts jax's backend."""
  import sys

  import jax
  d = jax.devices()[0]
  usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  return {"host": host(), "platform": platform.platform(), "cpu": cpu_model(),
          "cpus": os.cpu_count(), "cpus_usable": usable, "python": sys.version.split()[0],
          "backend": jax.default_backend(), "device": getattr(d, "device_kind", str(d)),
          "devices": jax.device_count(), "jax": jax.__version__, **extra}


def cpu_model() -> str:
  """The CPU's name and family / model numbers (Linux's /proc/cpuinfo; else
  what Python knows): a VM's host CPU can change between runs while its
  hostname and kernel stay."""
  fields: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        k, _, v = line.partition(":")
        fields.setdefault(k.strip(), v.strip())
  except OSError:
    return platform.processor() or platform.machine()
  return (f"{fields.get('model name', '?')} (family {fields.get('cpu family', '?')}, "
          f"model {fields.get('model', '?')})")
