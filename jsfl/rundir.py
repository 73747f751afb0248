"""The run directory: a contract users and tools rely on (docs/run-directory.md).

::

  RUN_DIR/
    config.json     fully resolved config + versions, device kind, setup
    partition.json  per seed: per-client label counts, sizes, dominant labels
    metrics.jsonl   one line per evaluated round and seed (appended, flushed)
    summary.json    Hydra summary over seeds (rewritten atomically)
    checkpoints/    the last 2 checkpoints, <round>/ (jsfl.checkpoint; orbax)

Every write that replaces a file goes through a temporary file and
``os.replace`` so a killed run never leaves a half-written JSON file.
"""

from __future__ import annotations

import json
import math
import os
import time

import numpy as np


def _clean(obj):
  """JSON-safe: numpy to Python, NaN/inf to None."""
  if isinstance(obj, dict):
    return {str(k): _clean(v) for k, v in obj.items()}
  if isinstance(obj, (list, tuple)):
    return [_clean(v) for v in obj]
  if isinstance(obj, np.ndarray) or hasattr(obj, "__array__"):
    return _clean(np.asarray(obj).tolist())
  if isinstance(obj, (np.floating, float)):
    f = float(obj)
    return f if math.isfinite(f) else None
  if isinstance(obj, (np.integer,)):
    return int(obj)
  if isinstance(obj, np.bool_):
    return bool(obj)
  return obj


def write_json_atomic(path: str, obj) -> None:
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    json.dump(_clean(obj), f, indent=1)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)


def new_run_dir(out_dir: str, name: str, exact: str = "") -> str:
  """Creates and returns a fresh run directory (never reuses a full one)."""
  if exact:
    if os.path.isdir(exact) and os.listdir(exact):
      raise FileExistsError(f"run.dir={exact!r} exists and is not empty")
    os.makedirs(exact, exist_ok=True)
    return exact
  stamp = time.strftime("%Y%m%d-%H%M%S")
  base = os.path.join(out_dir, f"{name}-{stamp}")
  path, i = base, 1
  while os.path.exists(path):
    path, i = f"{base}-{i}", i + 1
  os.makedirs(path)
  return path


class MetricsWriter:
  """Appends one JSON line per record and flushes it to disk at once."""

  def __init__(self, path: str):
    self._f = open(path, "a", buffering=1)  # noqa: SIM115 (open for the whole run)

  def write(self, record: dict) -> None:
    self._f.write(json.dumps(_clean(record)) + "\n")
    self._f.flush()
    os.fsync(self._f.fileno())

  def close(self) -> None:
    self._f.close()


def read_metrics(path: str) -> list[dict]:
  with open(path) as f:
    return [json.loads(line) for line in f if line.strip()]


def _records_upto(path: str, last_round: int) -> tuple[list[dict], list[str]]:
  """Records of rounds <= ``last_round`` and their lines; unparsable lines
  (a killed run's half-written last line) are skipped; no file is empty."""
  kept, lines = [], []
  if os.path.exists(path):
    with open(path) as f:
      for line in f:
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          continue
        if isinstance(rec, dict) and rec.get("round", 0) <= last_round:
          kept.append(rec)
          lines.append(line if line.endswith("\n") else line + "\n")
  return kept, lines


def read_metrics_upto(path: str, last_round: int) -> list[dict]:
  """The records of rounds <= ``last_round``, read only (what a non-writing
  process of a multi-host resume needs)."""
  return _records_upto(path, last_round)[0]


class NullWriter:
  """A :class:`MetricsWriter` that writes nothing (processes other than 0)."""

  def write(self, record: dict) -> None:
    del record

  def close(self) -> None:
    pass


def truncate_metrics(path: str, last_round: int) -> list[dict]:
  """Keeps the records of rounds <= ``last_round`` (what a resumed run
  continues from) and returns them; rewritten atomically.

  Lines that do not parse (the half-written last line of a killed run) are
  dropped with the later rounds.  A missing file counts as empty.
  """
  kept, lines = _records_upto(path, last_round)
  tmp = f"{path}.tmp{os.getpid()}"
  with open(tmp, "w") as f:
    f.writelines(lines)
    f.flush()
    os.fsync(f.fileno())
  os.replace(tmp, path)
  return kept
