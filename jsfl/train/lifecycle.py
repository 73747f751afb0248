"""A run's life around the round loop: its files at the start, signals that
stop it after a round, divergence, and resuming it from a checkpoint."""

from __future__ import annotations

import functools
import hashlib
import json
import os
import signal
import sys
import threading
import time
import uuid

import jax
import numpy as np

from jsfl import __version__, checkpoint, reading, rundir
from jsfl import config as config_lib
from jsfl.errors import Diverged
from jsfl.models import layers
from jsfl.train.evaluate import eval_chunk
from jsfl.train.records import slot_name

CELL_ARTIFACTS = "cells"  # a program of several cells: <run dir>/cells/<cell>/<file>


def versions() -> dict:
  import flax
  import optax
  return {"jsfl": __version__, "jsfl_source": source_digest(), "jax": jax.__version__,
          "flax": flax.__version__, "optax": optax.__version__,
          "python": sys.version.split()[0]}


@functools.cache
def source_digest() -> str:
  """12 hex digits of SHA-256 over jsfl's Python sources (relative paths and
  bytes, in path order): a version number stays while the code under it
  changes, and a change as small as a multiply fused with an add sends a
  run's seeds on other trajectories, so a run's records are bit for bit
  those of the code that wrote them, and this names that code."""
  root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
  h = hashlib.sha256()
  for d, _, files in sorted(os.walk(root)):
    for name in sorted(f for f in files if f.endswith(".py")):
      path = os.path.join(d, name)
      h.update(os.path.relpath(path, root).encode() + b"\0")
      with open(path, "rb") as f:
        h.update(f.read() + b"\0")
  return h.hexdigest()[:12]


def note_session(out: str, first_round: int, resumed: bool) -> str | None:
  """Appends a line for this process's training of the run (a session: a
  start or a resume) to ``out/sessions.jsonl``: the round it trains first,
  1-based, its versions with ``jsfl_source``, its device and time.  Returns
  a note when a resumed run continues on other code than the session that
  wrote the round before (or its start, in ``config.json``), whose records
  it then extends with records that code would not have written; None
  otherwise, and for a run whose earlier code is unrecorded."""
  now = versions()
  before = None
  path = os.path.join(out, rundir.SESSIONS)
  if resumed:
    # the session that wrote round first_round - 1: a later line is one that
    # was killed before its first checkpoint, whose records this one replaces
    lines = [x for x in rundir.read_jsonl(path) if x.get("from_round", 0) < first_round]
    if lines:
      before = lines[-1]
    else:  # a run from before sessions.jsonl: its start's code, if recorded
      with open(os.path.join(out, "config.json")) as f:
        before = {"from_round": 1, "versions": json.load(f).get("versions", {})}
  rundir.append_jsonl(path, {"from_round": first_round, "versions": now,
                             "device": device_kind(),
                             "time": time.strftime("%Y-%m-%dT%H:%M:%S%z")})
  if before is None or first_round == 1:  # round 1 again: every record is this code's
    return None
  was = (before.get("versions") or {}).get("jsfl_source")
  if was is None or was == now["jsfl_source"]:
    return None
  return (f"jsfl: note: resuming at round {first_round} on other jsfl code than the "
          f"session from round {before.get('from_round')} ran (source {was} -> "
          f"{now['jsfl_source']}): the records from here on are not those that code "
          f"would write bit for bit ({rundir.SESSIONS} lists each session's code)")


def device_kind() -> str:
  d = jax.devices()[0]
  return f"{d.platform}:{getattr(d, 'device_kind', '?')} x{jax.device_count()}"


def write_run_files(cfg: dict, exp, out: str, mesh) -> None:
  """config.json, partition.json and method artifacts of a new run."""
  setup, method, seeds = exp.setup, exp.method, exp.seeds
  rundir.write_json_atomic(f"{out}/config.json", {
      # who the run is to its trackers, wherever its directory is resumed
      "run_id": uuid.uuid4().hex,
      "config": cfg, "versions": versions(), "device": device_kind(),
      "resolved": {"cut": setup.cut, "clients_per_round": setup.clients_per_round,
                   "model_stages": list(setup.model.stage_names),
                   "max_client_size": setup.max_size, "seeds": seeds,
                   "conv_impl": config_lib.typed(cfg).model.conv_impl,
                   "default_conv_impl": layers.default_conv_impl(),
                   "eval_batch": eval_chunk(config_lib.typed(cfg).exec.eval_batch),
                   "client_exec": setup.client_exec,
                   "seed_exec": exp.seed_exec,
                   "default_depthwise_impl": layers.default_depthwise_impl(),
                   "default_im2col_grad": layers.default_im2col_grad(),
                   "default_im2col_narrow": layers.default_im2col_narrow(),
                   "mesh": dict(mesh.shape) if mesh is not None else None,
                   "processes": jax.process_count()},
      # A program of several cells: each one's config, for resume and the split.
      **({"cells": [{"name": n, "config": c} for n, c in exp.cell_configs]}
         if exp.cell_configs else {})})
  rundir.write_json_atomic(f"{out}/partition.json", {"seeds": exp.partitions})
  if method.artifacts is None:  # e.g. Hydra's groups.json
    return
  if not exp.cell_configs:
    for fname, obj in method.artifacts(setup, exp.partitions).items():
      rundir.write_json_atomic(f"{out}/{fname}", obj)
    return
  for name, c in exp.cell_configs:  # each cell's own, from its own options
    parts = [p for p in exp.partitions if p.get("cell") == name]
    os.makedirs(f"{out}/{CELL_ARTIFACTS}/{name}", exist_ok=True)
    for fname, obj in method.artifacts(exp.cell_setup(c), parts).items():
      rundir.write_json_atomic(f"{out}/{CELL_ARTIFACTS}/{name}/{fname}", obj)


def holds_nothing(out: str) -> bool:
  """No record and no checkpoint yet: a failed start has nothing worth keeping."""
  ck = os.path.join(out, "checkpoints")
  has_ckpt = os.path.isdir(ck) and any(n.isdigit() for n in os.listdir(ck))
  metrics_path = os.path.join(out, "metrics.jsonl")
  has_records = os.path.exists(metrics_path) and os.path.getsize(metrics_path) > 0
  return not (has_ckpt or has_records)


def diverged_error(cfg: dict, out: str, diverged: dict, at: int, R: int) -> Diverged:
  """The error a run with diverged slots ends with (after its summary)."""
  which = ", ".join(f"seed {slot_name(*(k if isinstance(k, tuple) else (None, k)))} at "
                    f"round {r}" for k, r in diverged.items())
  o = cfg["optim"]
  ended = (f"the run stopped after round {at}" if at < R
           else f"the other seeds ran to round {R}")
  return Diverged(
      f"training diverged: {which} (non-finite loss or parameters, or a training loss above "
      f"run.divergence_loss={cfg['run']['divergence_loss']:g}; optim.lr={o['lr']!r}"
      f"{', momentum=' + repr(o['momentum']) if o['momentum'] else ''}); {ended}; those "
      f"seeds are marked in {out}/summary.json; allowed: a smaller optim.lr"
      f"{'' if o.get('clip_norm') else ', optim.clip_norm > 0'} or a stabler method option",
      diverged, out)


class Stopped(SystemExit):
  """A run ended early on a signal, after a checkpoint.

  The exit status is ``128 + signum`` (143 for SIGTERM, 130 for SIGINT), as
  for a process the signal had killed.
  """

  def __init__(self, signum: int, round_: int, run_dir: str):
    super().__init__(128 + signum)
    self.signum, self.round, self.run_dir = signum, round_, run_dir


class StopSignals:
  """Turns SIGTERM and SIGINT into a flag the loop reads after each round.

  Handlers are only installed from the main thread (Python allows no other);
  elsewhere the signals keep their handlers.  Repeated signals change
  nothing: a round cannot be interrupted from Python anyway (SIGKILL can; a
  resume then starts from the last periodic checkpoint).
  """

  SIGNALS = (signal.SIGTERM, signal.SIGINT)

  def __init__(self, signals=SIGNALS):
    self.signum = None
    self._previous = {}
    for sig in signals:
      self.watch(sig)

  def watch(self, sig) -> None:
    """Turns ``sig`` into the flag too (from the main thread; once)."""
    if threading.current_thread() is threading.main_thread() and sig not in self._previous:
      self._previous[sig] = signal.signal(sig, self._handle)

  def _handle(self, signum, frame):
    del frame
    self.signum = self.signum or signum

  def agree(self) -> None:
    """Multi-host: a signal any process got stops all of them after this
    round (one small allgather per round; nothing with one process)."""
    if jax.process_count() == 1:
      return
    from jax.experimental import multihost_utils
    got = np.asarray(multihost_utils.process_allgather(np.int32(self.signum or 0)))
    self.signum = int(got.max()) or None

  def restore(self) -> None:
    for sig, handler in self._previous.items():
      # None: a handler not installed from Python; the default is the closest.
      signal.signal(sig, signal.SIG_DFL if handler is None else handler)
    self._previous = {}


class Progress:
  """A one-line progress bar on stderr (plain lines when not a terminal),
  with the time left at this process's pace."""

  def __init__(self, total: int, enabled: bool, clock=time.monotonic):
    self.total, self.enabled, self.clock = total, enabled, clock
    self.tty = sys.stderr.isatty()
    self.since: tuple[int, float] | None = None
    self.shown = 0  # the length of the line on the terminal

  def left(self, r: int) -> str | None:
    """The time the remaining rounds take at the pace since this process's
    first round ended (its compilation left out), evaluations included;
    None until a round has been timed so."""
    now = self.clock()
    if self.since is None:
      self.since = (r, now)
    r0, t0 = self.since
    if r <= r0 or r >= self.total:
      return None
    return rundir.duration_text((now - t0) / (r - r0) * (self.total - r))

  def update(self, r: int, acc, sps: float, final: bool = False):
    if not self.enabled:
      return
    width = 24
    done = int(width * r / self.total)
    acc_s = "  -  " if acc is None else f"{acc:5.2f}%"
    left = self.left(r)
    line = (f"round {r:>4}/{self.total} [{'#' * done}{'.' * (width - done)}] "
            f"acc {acc_s} | {sps:,.0f} samples/s" + (f" | {left} left" if left else ""))
    if self.tty:  # padded over a longer line before it
      pad = " " * max(0, self.shown - len(line))
      self.shown = len(line)
      sys.stderr.write("\r" + line + pad + ("\n" if final else ""))
    elif acc is not None or final:
      sys.stderr.write(line + "\n")
    sys.stderr.flush()


def read_run_config(run_dir: str, progress: bool | None = None):
  """A run directory's ``(config, cells)`` as :func:`jsfl.train.run` takes
  them, each re-validated as a new config would be.

  Raises:
    ConfigError: ``run_dir`` is not a run directory, or its config is no
      longer valid.
  """
  path = os.path.join(run_dir, "config.json")
  try:
    with open(path) as f:
      written = json.load(f)
    stored = written["config"]
    if not isinstance(stored, dict) or not all(isinstance(v, dict) for v in stored.values()):
      raise TypeError
  except (OSError, ValueError, KeyError, TypeError, AttributeError):
    raise config_lib.ConfigError(
        f"{run_dir!r} is not a run directory: expected {path} with a 'config' "
        "key, as jsfl run writes") from None
  started_with = (written.get("resolved") or {}).get("client_exec")

  def again(stored: dict, where: str) -> dict:
    try:  # checked as a new config would be (it may have been edited)
      cfg = config_lib.resolve(config_lib.as_it_ran(stored))
    except config_lib.ConfigError as e:
      raise config_lib.ConfigError(f"{where}: {e}") from None
    if progress is not None:
      cfg["exec"]["progress"] = progress
    # A run continues with the client loop it started with, even where a later
    # jsfl measures another default for "auto": the values agree only to float
    # tolerance across loops, and a resumed run must equal an uninterrupted one.
    if config_lib.typed(cfg).exec.client_exec == "auto" and started_with in config_lib.SCHEMA[
        "exec"]["client_exec"].choices[1:]:  # type: ignore[index]
      cfg["exec"]["client_exec"] = started_with
    return cfg

  cfg = again(stored, path)
  cells = None
  if written.get("cells") is not None:  # a program of several cells (jsfl sweep)
    try:
      cells = [(c["name"], again(c["config"], f"{path}, cell {c['name']}"))
               for c in written["cells"]]
    except (KeyError, TypeError):
      raise config_lib.ConfigError(f"{path}: 'cells' is not a list of name and config "
                                   "tables, as jsfl sweep writes") from None
  return cfg, cells


def finished(run_dir: str, cfg: dict, cells) -> bool:
  """Whether the run in ``run_dir`` has trained all its rounds: its newest
  checkpoint is of the last round, or (runs written before checkpoints
  existed: no ``checkpoints/``) every seed has a record of the last round.

  A run makes ``checkpoints/`` when it starts and always saves its last
  round; records of the last round without that checkpoint are a run
  killed before it (or before its ``summary.json``): unfinished."""
  R = config_lib.typed(cfg).run.rounds
  where = os.path.join(run_dir, "checkpoints")
  done = checkpoint.latest_round(where)
  if done is not None or cells is not None or os.path.isdir(where):
    return (done or 0) >= R
  seeds = {config_lib.typed(cfg).run.seed + s for s in range(config_lib.typed(cfg).run.seeds)}
  try:
    with reading.open_text(reading.record_file(run_dir, "metrics.jsonl")) as f:
      last = set()
      for line in f:
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          continue
        if isinstance(rec, dict) and rec.get("round") == R:
          last.add(rec.get("seed"))
  except reading.READ_ERRORS:
    return False
  return seeds <= last
