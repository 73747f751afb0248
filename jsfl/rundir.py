"""The run directory: a contract users and tools rely on (docs/run-directory.md).

::

  RUN_DIR/
    config.json     fully resolved config + versions, device kind, setup
    partition.json  per seed: per-client label counts, sizes, dominant labels
    metrics.jsonl   one line per evaluated round and seed (appended, flushed)
    summary.json    Hydra summary over seeds (rewritten atomically)
    sessions.jsonl  one line per session that trained it: first round, code
    checkpoints/    the last 2 checkpoints, <round>/ (jsfl.checkpoint; orbax)
    .lock           while a process writes the run (RunLock), its pid

Every write that replaces a file goes through a temporary file and
``os.replace`` so a killed run never leaves a half-written JSON file.
"""

from __future__ import annotations

import fcntl
import json
import math
import os
import re
import shutil
import statistics
import time

import numpy as np

from jsfl.errors import RunDirError, os_error_line


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


def replace_atomic(path: str, write, mode: str = "w") -> None:
  """``write(f)`` into a temporary file beside ``path``, then rename it over
  ``path``; on any failure (a full disk) the temporary file is removed and
  ``path`` stays as it was."""
  tmp = f"{path}.tmp{os.getpid()}"
  try:
    with open(tmp, mode) as f:
      write(f)
      f.flush()
      os.fsync(f.fileno())
    os.replace(tmp, path)
  except BaseException:
    try:
      os.remove(tmp)
    except OSError:
      pass
    raise


def write_json_atomic(path: str, obj) -> None:
  replace_atomic(path, lambda f: json.dump(_clean(obj), f, indent=1))


def write_npz_atomic(path: str, arrays: dict) -> None:
  """``arrays`` as an uncompressed ``.npz`` at ``path``, replaced atomically."""
  replace_atomic(path, lambda f: np.savez(f, **arrays), "wb")


def glob_class(path: str) -> str | None:
  """The part of ``path`` that a glob pattern reads as a character class
  (``[...]`` within one name), or None.  orbax finds the pieces of a
  checkpoint by globbing under its directory: below such a name the pieces
  are never merged and the checkpoints never restore."""
  for part in os.path.abspath(path).split(os.sep):
    m = re.search(r"\[.+\]", part)
    if m:
      return m.group(0)
  return None


def check_globless(path: str, key: str, error=RunDirError) -> None:
  """Raises ``error`` naming ``key=path`` if checkpoints under ``path``
  would not restore (:func:`glob_class`)."""
  bad = glob_class(path)
  if bad is not None:
    raise error(f"{key}={path!r}: {bad!r} in a directory name would be read as a glob "
                "pattern by the checkpoint writer (orbax) and no checkpoint could be "
                "restored; allowed: a path without '[...]' (rename the directory)")


def check_target(out_dir: str, name: str, exact: str = "") -> None:
  """Raises :class:`RunDirError` if a new run could not be created where the
  config says (checked before any data is loaded; :func:`new_run_dir`
  checks again when it creates the directory)."""
  check_globless(exact or os.path.join(out_dir, name or "run"),
                 "run.dir" if exact else "run.out_dir/run.name")
  if exact:
    if os.path.isdir(exact):
      if listing(exact):
        raise RunDirError(f"run.dir={exact!r} exists and is not empty; allowed: a new or "
                          "empty directory (continue a run with jsfl run --resume DIR)")
    elif os.path.lexists(exact):
      raise RunDirError(f"run.dir={exact!r} exists and is not a directory; allowed: a "
                        "new or empty directory")
    check_parent(exact, "run.dir")
    return
  if not name or any(sep in name for sep in (os.sep, os.altsep) if sep) or name in (".", ".."):
    raise RunDirError(f"run.name={name!r} is not a directory name; allowed: a non-empty "
                      "name without '/' (the run directory is run.out_dir/NAME-TIMESTAMP; "
                      "run.out_dir names the parent)")
  if os.path.lexists(out_dir) and not os.path.isdir(out_dir):
    raise RunDirError(f"run.out_dir={out_dir!r} exists and is not a directory; allowed: "
                      "a directory (created if missing)")
  check_parent(out_dir, "run.out_dir")


def existing_ancestor(path: str) -> str:
  """The nearest path at or above ``path`` (made absolute) that exists."""
  p = os.path.abspath(path)
  while not os.path.lexists(p):
    p = os.path.dirname(p)
  return p


def unmakeable(path: str) -> str | None:
  """Why files could not be written at ``path`` (an existing directory that
  is not writable; or, for a path still to be made, its nearest existing
  ancestor is not a directory, or not writable), or None; creates nothing."""
  target = os.path.abspath(path)
  if not os.path.isdir(target):
    target = existing_ancestor(os.path.dirname(target))
    if not os.path.isdir(target):
      return f"{target!r} is not a directory"
  if not os.access(target, os.W_OK | os.X_OK):
    return f"{target!r} is not writable"
  return None


def check_parent(path: str, key: str, error=RunDirError) -> None:
  """The nearest existing ancestor of ``path`` must be a writable directory
  (so ``path`` can be made); raises ``error`` naming ``key=path`` otherwise."""
  why = unmakeable(path)
  if why is not None:
    allowed = ("a writable directory, or a path to make under one" if why.endswith("writable")
               else "a path under a directory")
    raise error(f"{key}={path!r}: {why}; allowed: {allowed}")


def listing(path: str) -> list[str]:
  """What a run directory holds, less a writer's lock file."""
  return [f for f in os.listdir(path) if f != RunLock.NAME]


def _makedirs(path: str, created: list[str]) -> None:
  """``os.makedirs`` that appends every directory it made to ``created``
  (outermost first), so a failed start can remove exactly those."""
  missing = []
  p = os.path.abspath(path)
  while not os.path.lexists(p):
    missing.append(p)
    p = os.path.dirname(p)
  for d in reversed(missing):
    try:
      os.mkdir(d)
    except FileExistsError:
      continue  # made by a concurrent process: not ours to remove
    created.append(d)


def new_run_dir(out_dir: str, name: str, exact: str = "",
                created: list[str] | None = None) -> str:
  """Creates and returns a fresh run directory (never reuses a full one).

  Args:
    out_dir, name: the directory is ``out_dir/name-YYYYmmdd-HHMMSS[-i]``.
    exact: this directory instead (``run.dir``); it may exist if empty.
    created: if given, every directory made here is appended to it.

  Raises:
    RunDirError: the directory exists and is not empty, or a path component
      is not a directory, or it cannot be created.
  """
  created = [] if created is None else created
  ours = len(created)
  check_target(out_dir, name, exact)
  try:
    if exact:
      _makedirs(exact, created)
      return exact
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = os.path.join(out_dir, f"{name}-{stamp}")
    _makedirs(out_dir, created)
    path, i = base, 1
    while True:
      try:
        os.mkdir(path)  # atomic: two runs started in one second get two directories
        break
      except FileExistsError:
        path, i = f"{base}-{i}", i + 1
    created.append(os.path.abspath(path))
    return path
  except OSError as e:
    for d in reversed(created[ours:]):  # innermost first; only what this call made
      try:
        os.rmdir(d)
      except OSError:
        pass
    del created[ours:]
    raise RunDirError(os_error_line(e, "cannot create the run directory")) from None


def remove_new(run_dir: str, created: list[str]) -> None:
  """Removes a run directory that a failed start left with nothing of value,
  and the parents made for it (only those ``created`` lists, only if empty)."""
  if os.path.abspath(run_dir) in created:
    shutil.rmtree(run_dir, ignore_errors=True)
  else:  # an empty run.dir the user made: leave it empty, as it was
    for f in listing(run_dir):
      p = os.path.join(run_dir, f)
      if os.path.isdir(p):
        shutil.rmtree(p, ignore_errors=True)
      else:
        os.remove(p)
  for d in reversed(created):
    try:
      os.rmdir(d)
    except OSError:
      pass


class RunLock:
  """One writer per run directory: an exclusive ``flock`` on ``RUN_DIR/.lock``.

  The lock is the kernel's, so a killed holder (even by SIGKILL) frees it at
  once; the file holds the holder's pid for the refusal message and is
  removed on release.  A second ``jsfl run`` into the same ``run.dir`` or a
  second ``jsfl run --resume`` of the same run is refused, not interleaved.
  """

  NAME = ".lock"

  def __init__(self, run_dir: str):
    self.path = os.path.join(run_dir, self.NAME)
    self.run_dir = run_dir
    self._fd: int | None = None

  def acquire(self) -> RunLock:
    while True:
      fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
      try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
      except BlockingIOError:
        os.close(fd)
        raise RunDirError(
            f"run directory {self.run_dir!r} is in use by process {self.holder()} "
            "(a jsfl run or --resume); allowed: one writer at a time: wait for it "
            "to end or stop it") from None
      # The previous holder may have removed the file between our open and
      # our flock: then we hold a lock on an orphan, so try again.
      try:
        same = os.stat(self.path).st_ino == os.fstat(fd).st_ino
      except FileNotFoundError:
        same = False
      if same:
        break
      os.close(fd)
    os.ftruncate(fd, 0)
    os.write(fd, f"{os.getpid()}\n".encode())
    self._fd = fd
    return self

  def holder(self) -> str:
    try:
      with open(self.path) as f:
        pid = f.read().strip()
    except OSError:
      pid = ""
    return pid or "(unknown pid)"

  def release(self) -> None:
    if self._fd is None:
      return
    try:
      os.unlink(self.path)
    except FileNotFoundError:
      pass
    os.close(self._fd)  # closing drops the flock
    self._fd = None


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


SESSIONS = "sessions.jsonl"  # one line per session that trained the run


def append_jsonl(path: str, record: dict) -> None:
  """Appends one JSON line to ``path`` and flushes it to disk."""
  with open(path, "a") as f:
    f.write(json.dumps(_clean(record)) + "\n")
    f.flush()
    os.fsync(f.fileno())


def read_jsonl(path: str) -> list[dict]:
  """The whole lines of a small JSON-lines file, [] when it does not exist
  (a killed writer's half line is skipped)."""
  out = []
  try:
    with open(path) as f:
      for line in f:
        try:
          out.append(json.loads(line))
        except json.JSONDecodeError:
          continue
  except FileNotFoundError:
    return []
  return out


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
  replace_atomic(path, lambda f: f.writelines(lines))
  return kept


def duration_text(seconds: float) -> str:
  """``45s``, ``12m05s``, ``3h07m``, ``2d04h``: two units at the most."""
  s = max(0, round(seconds))
  if s < 60:
    return f"{s}s"
  if s < 3600:
    return f"{s // 60}m{s % 60:02d}s"
  if s < 86400:
    return f"{s // 3600}h{s % 3600 // 60:02d}m"
  return f"{s // 86400}d{s % 86400 // 3600:02d}h"


def checkpointed_round(run_dir: str) -> int | None:
  """The newest round under ``run_dir/checkpoints/`` (its numbered folders;
  read without orbax, so the planner stays free of JAX), or None."""
  try:
    names = os.listdir(os.path.join(run_dir, "checkpoints"))
  except OSError:
    return None
  rounds = [int(n) for n in names if n.isdigit()]
  return max(rounds) if rounds else None


def round_seconds(run_dir: str) -> float | None:
  """The median training wall time of the run's evaluated rounds, from
  ``metrics.jsonl`` (one figure a round; a process's first round, which
  compiles, is outnumbered), or None without two such rounds."""
  walls: dict[int, float] = {}
  try:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
      for line in f:
        try:
          rec = json.loads(line)
          walls.setdefault(int(rec["round"]), float(rec["wall_s"]))
        except (ValueError, KeyError, TypeError):
          continue  # a damaged line: jsfl report names it
  except OSError:
    return None
  return statistics.median(walls.values()) if len(walls) >= 2 else None
