"""Checkpoints of a run (orbax-checkpoint): what ``jsfl run --resume`` needs.

A checkpoint is ``RUN_DIR/checkpoints/<R>/``, written after round ``R`` (the
number of rounds completed); the last two are kept.  It holds:

* ``state``: the method state after round ``R``, every leaf with its leading
  seed axis, as a flat list of arrays in the state's tree order (typed PRNG
  key leaves as their raw key data, which orbax can store); the state's tree
  structure comes from the template the run builds with ``init``, so no
  container type (flax dataclass, optax state, empty tuples) has to survive
  orbax's tree handling.
* ``host`` (JSON): ``round`` (= R), ``seeds``, ``paths`` (each leaf's tree
  path, checked on restore), and the loop's host-side accumulators
  ``cum_up`` / ``cum_down`` (cumulative bytes per seed, exact: JSON writes
  floats with ``repr``).

Why this suffices to continue bit-identically:

* every PRNG key of a run is a pure function of the config: the per-seed keys
  are ``key(seed)`` (``jsfl.train.programs.make_seed_keys``) and round ``r``'s key is
  ``fold_in(seed_key, r)`` (``jsfl.train.programs.round_keys``), so nothing random is
  carried between rounds outside the state;
* the partitions, the synthetic data and ``train_subset`` draw from numpy
  Generators seeded from the config inside ``jsfl.train.experiment.prepare``, which resume
  runs again; no stateful generator (numpy, ``random``) lives on the loop's
  path;
* whatever a method carries from round to round (optimiser state, label
  cycle, MultiSFL's score vectors and sampling proportion, SFedKD's previous
  sequence, the round counter) is a leaf of the state;
* the loop's other host state, the per-seed per-label accuracy history (for
  BW) and the records (for ``summary.json``), is rebuilt from the
  ``metrics.jsonl`` records up to round ``R``, which are written before the
  checkpoint of their round.

Writes are atomic: orbax writes into ``<R>.orbax-checkpoint-tmp-*`` and
renames it to ``<R>`` only when complete (local file systems; a commit file
on GCS); a killed write leaves only the temporary directory, which is never
listed as a step (orbax usually removes it when the next
:class:`Checkpointer` opens the directory; a later save of that round works
either way).  Saves are synchronous: the next round donates the state's
buffers, so a save must be done with them before it starts.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import shutil
import sys
import tempfile
import time
from typing import IO

import jax
import numpy as np

from jsfl.errors import CheckpointError

MAX_TO_KEEP = 2


def _is_key(x) -> bool:
  return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def _storable(leaf):
  return jax.random.key_data(leaf) if _is_key(leaf) else leaf


def _abstract(leaf):
  """What orbax restores ``leaf`` as: shape, dtype and the run's sharding."""
  leaf = _storable(leaf)
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)


def _paths(tree) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _leaf_names(n: int) -> list[str]:
  return [f"{i:05d}" for i in range(n)]


def _reason(err: BaseException) -> str:
  """A short one-line reason for an error raised deep inside orbax."""
  text = " ".join(str(err).split()) or type(err).__name__
  return text if len(text) <= 160 else text[:157] + "..."


_FAULT_ERRNOS = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
                 errno.EROFS: "read-only file system", errno.EACCES: "permission denied",
                 errno.EPERM: "operation not permitted"}


def environment_fault(err: BaseException | None) -> str | None:
  """The reason if ``err`` (or an error it wraps) is the disk's or the
  permissions' fault rather than a bug; orbax and tensorstore wrap OSErrors
  in their own types, so the chain and the messages are searched."""
  seen: set[int] = set()
  while err is not None and id(err) not in seen:
    seen.add(id(err))
    if isinstance(err, OSError) and err.errno in _FAULT_ERRNOS:
      return _FAULT_ERRNOS[err.errno]
    text = str(err).lower()
    for reason in _FAULT_ERRNOS.values():
      if reason in text:
        return reason
    err = err.__cause__ or err.__context__
  return None


def check_matches(host: dict, template, seeds, where: str) -> None:
  """Raises :class:`CheckpointError` if the checkpoint record ``host`` is not
  of the state the run's config builds (``template``) or of its seeds."""
  if host.get("seeds") != [int(s) for s in seeds]:
    raise CheckpointError(
        f"checkpoint {where} is of seeds {host.get('seeds')}, the run's config.json "
        f"has {list(seeds)} (run.seed / run.seeds edited?); allowed: the config the "
        "run was started with")
  paths = _paths(template)
  if host.get("paths") != paths:
    theirs = host.get("paths") or []
    first = next((i for i, (a, b) in enumerate(zip(theirs, paths, strict=False)) if a != b),
                 min(len(theirs), len(paths)))
    raise CheckpointError(
        f"checkpoint {where} holds another state structure than the run's config.json "
        "builds "
        f"({len(theirs)} leaves vs {len(paths)}, first difference at leaf {first}; "
        "method or model edited?); allowed: the config the run was started with")
  leaves = [_storable(x) for x in jax.tree.leaves(template)]
  for i, (path, x) in enumerate(zip(paths, leaves, strict=True)):
    shape = (host.get("shapes") or [None] * len(leaves))[i]
    dtype = (host.get("dtypes") or [None] * len(leaves))[i]
    if shape is not None and list(shape) != list(x.shape):
      raise CheckpointError(
          f"checkpoint {where}: state{path} has shape {tuple(shape)}, the run's "
          f"config.json builds {tuple(x.shape)} (model, clients or seeds edited?); "
          "allowed: the config the run was started with")
    if dtype is not None and dtype != str(x.dtype):
      raise CheckpointError(
          f"checkpoint {where}: state{path} is {dtype}, the run's config.json builds "
          f"{x.dtype}; allowed: the config the run was started with")


ECHO = "RuntimeError: Event loop is closed"


def _without_echoes(text: str) -> str:
  """``text`` less the traceback blocks that end in :data:`ECHO`: what
  tensorstore's callbacks print when a checkpoint write failed and orbax has
  closed its event loop (one per pending write; noise after the real error)."""
  out, block = [], None
  for line in text.splitlines(keepends=True):
    if block is None and line.startswith("Traceback (most recent call last)"):
      block = [line]
    elif block is not None:
      block.append(line)
      if line.strip() and not line[0].isspace():  # the exception line ends the block
        if line.strip() != ECHO:
          out += block
        block = None
    else:
      out.append(line)
  return "".join(out + (block or []))


class _Held:
  """What :func:`_stderr_held` caught: the open capture while it runs, its
  text after."""
  file: IO[bytes]
  text = ""


@contextlib.contextmanager
def _stderr_held(logger_names: tuple[str, ...]):
  """File descriptor 2 into a temporary file and ``logger_names`` silenced
  while the body runs (orbax logs through absl; tensorstore writes to fd 2
  past ``sys.stderr``); both restored after, the captured text left in the
  yielded :class:`_Held` for the caller to replay or drop."""
  loggers = [logging.getLogger(n) for n in logger_names]
  levels = [lg.level for lg in loggers]
  for lg in loggers:
    lg.setLevel(logging.CRITICAL)
  sys.stderr.flush()
  saved = os.dup(2)
  held = _Held()
  held.file = tempfile.TemporaryFile()  # noqa: SIM115 (closed below)
  os.dup2(held.file.fileno(), 2)
  try:
    yield held
  finally:
    sys.stderr.flush()
    os.dup2(saved, 2)
    os.close(saved)
    for lg, level in zip(loggers, levels, strict=True):
      lg.setLevel(level)
    held.file.seek(0)
    held.text = held.file.read().decode("utf-8", "replace")
    held.file.close()


def _replay(text: str) -> None:
  if text:
    sys.stderr.write(text)
    sys.stderr.flush()


@contextlib.contextmanager
def _quiet_writer_threads():
  """Holds back the noise of a failed checkpoint write: orbax's writer threads
  log every failed write with its traceback (absl, ERROR), and tensorstore's
  callbacks print echoes straight to file descriptor 2, past ``sys.stderr``.
  Both say what the save's own exception says.  File descriptor 2 goes to a
  temporary file while the checkpoint is written and is replayed after it,
  less those echoes; after a failure the remaining writes are given a moment
  to fail, so their echoes land in the file too."""
  held = _Held()
  try:
    with _stderr_held(("absl",)) as held:
      try:
        yield
      except BaseException:
        logging.getLogger("asyncio").setLevel(logging.CRITICAL)  # "never retrieved" tasks
        _wait_until_quiet(held.file)
        raise
  finally:
    _replay(_without_echoes(held.text))


@contextlib.contextmanager
def _quiet_restore(broken: list):
  """Keeps the noise of a checkpoint that does not restore off the terminal:
  orbax logs the failure through absl (ERROR, with tracebacks) and
  tensorstore prints its own errors to file descriptor 2, past
  ``sys.stderr``; jsfl's own line (:meth:`Checkpointer.restore`) says what
  they say.  File descriptor 2 goes to a temporary file during the restore;
  when a checkpoint failed (``broken`` not empty) the capture is dropped,
  otherwise it is replayed."""
  held = _Held()
  try:
    with _stderr_held(("absl", "orbax", "asyncio")) as held:
      try:
        yield
      finally:
        if broken:
          _wait_until_quiet(held.file)
  finally:
    if not broken:
      _replay(held.text)


def _wait_until_quiet(capture, settle: float = 0.2, limit: float = 2.0) -> None:
  """Until ``capture`` stopped growing for ``settle`` seconds (at most ``limit``)."""
  start = last_change = time.monotonic()
  size = os.fstat(capture.fileno()).st_size
  while time.monotonic() - start < limit:
    time.sleep(0.02)
    now = os.fstat(capture.fileno()).st_size
    if now != size:
      size, last_change = now, time.monotonic()
    elif time.monotonic() - last_change >= settle:
      return


def _free_space_fault(directory: str, leaves) -> str | None:
  """Whether the disk visibly lacks room for a checkpoint of ``leaves`` (with
  a margin for orbax's metadata): cheaper and quieter than a failed write."""
  need = 2 * sum(int(x.nbytes) for x in leaves) + (1 << 20)
  try:
    free = shutil.disk_usage(directory).free
  except OSError:
    return None
  if free < need:
    return f"no space left on device ({free:,} bytes free, about {need:,} needed)"
  return None


def _unmerged(directory: str, round_: int) -> str | None:
  """What a saved step lacks when orbax skipped merging its per-process
  pieces into one index (it finds them by a glob under the directory, which
  a ``[...]`` in the path defeats, logging only a warning), or None."""
  if jax.process_index() != 0:
    return None
  state = os.path.join(directory, str(round_), "state")
  if (os.path.isdir(os.path.join(state, "ocdbt.process_0"))
      and not os.path.exists(os.path.join(state, "manifest.ocdbt"))):
    return "no state/manifest.ocdbt"
  return None


def _manager(directory: str, create: bool):
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(
      max_to_keep=MAX_TO_KEEP, create=create, cleanup_tmp_directories=create,
      enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def latest_round(directory: str) -> int | None:
  """The round of the newest complete checkpoint in ``directory``, or None."""
  if not os.path.isdir(directory):
    return None
  mngr = _manager(directory, create=False)
  try:
    return mngr.latest_step()
  finally:
    mngr.close()


def read(directory: str, round_: int | None = None) -> tuple[dict, list[np.ndarray]]:
  """One checkpoint as saved, without the run's state template (inspection,
  tests).

  Args:
    directory: ``RUN_DIR/checkpoints``.
    round_: the checkpoint's round; None for the newest.

  Returns:
    ``(host, leaves)``: the JSON record (module docstring) and the state's
    leaves in tree order as numpy arrays (PRNG keys as their key data).

  Raises:
    FileNotFoundError: no such checkpoint.
  """
  import orbax.checkpoint as ocp
  mngr = _manager(directory, create=False) if os.path.isdir(directory) else None
  try:
    step = round_ if round_ is not None or mngr is None else mngr.latest_step()
    if mngr is None or step is None or step not in mngr.all_steps():
      raise FileNotFoundError(f"no checkpoint of round {step} in {directory}")
    got = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), host=ocp.args.JsonRestore()))
  finally:
    if mngr is not None:
      mngr.close()
  names = _leaf_names(len(got["host"]["paths"]))
  return got["host"], [np.asarray(got["state"][n]) for n in names]


def restore_newest(directory: str, template, seeds):
  """The newest checkpoint in ``directory`` laid out like ``template``, read
  only: unlike :meth:`Checkpointer.restore` it creates, cleans and deletes
  nothing, and never falls back to an older checkpoint (a tool asking for a
  run's final model must not get another one silently).

  Args:
    directory: ``RUN_DIR/checkpoints``.
    template: a state of the run's method and config (``init``'s output):
      its tree structure, dtypes and shardings are restored into.
    seeds: the run's seeds; they must be the checkpoint's.

  Returns:
    ``(round, state)``, or None without a checkpoint.

  Raises:
    CheckpointError: the newest checkpoint is of another structure or seeds
      than the run's config builds, or does not restore.
  """
  if not os.path.isdir(directory):
    return None
  mngr = _manager(directory, create=False)
  try:
    step = mngr.latest_step()
    if step is None:
      return None
    leaves, treedef = jax.tree.flatten(template)
    abstract = dict(zip(_leaf_names(len(leaves)), map(_abstract, leaves), strict=True))
    broken: list[tuple[int, str]] = []
    with _quiet_restore(broken):
      found = _restore_step(mngr, f"{directory}/{step}", step, template, seeds, abstract,
                            len(leaves), broken)
  finally:
    mngr.close()
  if found is None:
    raise CheckpointError(f"checkpoint {directory}/{step} does not restore ({broken[0][1]}); "
                          "allowed: a run directory with an intact newest checkpoint")
  _, host, restored = found
  restored = [jax.random.wrap_key_data(x, impl=jax.random.key_impl(t)) if _is_key(t)
              else x for x, t in zip(restored, leaves, strict=True)]
  return int(host["round"]), jax.tree.unflatten(treedef, restored)


def _restore_step(mngr, where, step, template, seeds, abstract, n, broken):
  """``(step, host record, leaves)`` of checkpoint ``step``, or None (and
  the reason appended to ``broken``) if it does not restore."""
  import orbax.checkpoint as ocp
  try:
    host = mngr.restore(step, args=ocp.args.Composite(host=ocp.args.JsonRestore()))["host"]
    if not isinstance(host, dict) or "paths" not in host:
      raise ValueError("its host record is not a jsfl checkpoint record")
  except Exception as e:  # noqa: BLE001 - any unreadable checkpoint: the caller decides
    broken.append((step, _reason(e)))
    return None
  check_matches(host, template, seeds, where)
  try:
    got = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()))
    return step, host, [got["state"][name] for name in _leaf_names(n)]
  except Exception as e:  # noqa: BLE001 - as above
    broken.append((step, _reason(e)))
    return None


class _OrbaxLogs(logging.Filter):
  """Drops orbax's absl log lines (ERROR included): orbax logs the problems
  it then raises or steps around (a metadata file it cannot read, a failed
  write), and jsfl reports each of those itself, in one line."""

  def filter(self, record: logging.LogRecord) -> bool:
    return "orbax" not in record.pathname


class _OrbaxFutures(logging.Filter):
  """Drops asyncio's "exception was never retrieved" reports of orbax's
  reads and writes: when one array of a checkpoint fails, orbax raises the
  first error and leaves the others' futures unread, which asyncio reports
  when they are collected, long after jsfl said what failed."""

  def filter(self, record: logging.LogRecord) -> bool:
    text = record.getMessage()
    return not ("never retrieved" in text and ("tensorstore" in text or "orbax" in text))


_ORBAX_LOGS = _OrbaxLogs()
logging.getLogger("absl").addFilter(_ORBAX_LOGS)  # every orbax call here goes through it
logging.getLogger("asyncio").addFilter(_OrbaxFutures())


class Checkpointer:
  """Saves and restores a run's checkpoints in one directory.

  Args:
    directory: ``RUN_DIR/checkpoints``; created if missing.
  """

  def __init__(self, directory: str):
    self.directory = directory
    self.restored_host: dict | None = None
    self._mngr = _manager(directory, create=True)

  def latest_round(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, round_: int, state, seeds, cum_up, cum_down, extra=None) -> None:
    """Writes the checkpoint of round ``round_`` (rounds completed) and waits
    for it; older checkpoints beyond the last two are deleted.

    Args:
      round_: rounds completed.
      state: the method state after that round (leading seed axis).
      seeds: the run's seeds (checked on restore).
      cum_up, cum_down: per-seed cumulative bytes (numpy arrays).
      extra: more JSON fields for the host record (e.g. diverged seeds).

    Raises:
      CheckpointError: the checkpoint could not be written for want of space
        or permission (the run's files stay as they were after the previous
        checkpoint; nothing half-written is ever restored).
    """
    import orbax.checkpoint as ocp
    leaves = [_storable(x) for x in jax.tree.leaves(state)]
    host = {"round": int(round_), "seeds": [int(s) for s in seeds],
            "paths": _paths(state),
            "shapes": [list(np.shape(x)) for x in leaves],
            "dtypes": [str(x.dtype) for x in leaves],
            "cum_up": np.asarray(cum_up).tolist(),
            "cum_down": np.asarray(cum_down).tolist(),
            **(extra or {})}
    fault = _free_space_fault(self.directory, leaves)
    try:
      if fault is not None:
        raise OSError(errno.ENOSPC, fault, self.directory)
      with _quiet_writer_threads():
        self._mngr.save(int(round_), force=True, args=ocp.args.Composite(
            state=ocp.args.StandardSave(dict(zip(_leaf_names(len(leaves)), leaves, strict=True))),
            host=ocp.args.JsonSave(host)))
        self._mngr.wait_until_finished()
      unmerged = _unmerged(self.directory, int(round_))
      if unmerged:
        raise CheckpointError(
            f"the checkpoint of round {round_} in {self.directory} was written without "
            f"its index ({unmerged}), so it could never be restored; allowed: a run "
            "directory whose path has no '[...]' in a name (orbax globs below it)")
    except CheckpointError:
      raise
    except Exception as e:
      fault = fault or environment_fault(e)
      if fault is None:
        raise
      raise CheckpointError(
          f"the checkpoint of round {round_} could not be written to {self.directory}: "
          f"{fault}; the run's files are intact up to the previous checkpoint; allowed: "
          "free the space (or fix the permission), then jsfl run --resume "
          f"{os.path.dirname(os.path.abspath(self.directory))}") from None

  def restore(self, template, seeds, warn=None):
    """The newest checkpoint that restores, laid out like ``template``.

    Each checkpoint's JSON record is read first and checked against the run
    (seeds, leaf paths, and shapes and dtypes where the record has them), so
    an edited ``config.json`` is refused before any array is read.  A
    checkpoint whose files do not restore (a damaged disk, a write cut off
    in a way the atomic rename did not catch) is skipped for the one before
    it, named through ``warn``, and deleted once an older one restored (the
    run writes that round again).

    Args:
      template: a state of the run's method and config (e.g. ``init``'s
        output): its tree structure, dtypes and shardings are restored into.
      seeds: the run's seeds; they must be the checkpoint's.
      warn: called with one line per checkpoint skipped.

    Returns:
      ``(round, state, cum_up, cum_down)``, or None without a checkpoint;
      the restored JSON record is left in ``self.restored_host``.

    Raises:
      CheckpointError: a checkpoint of another structure or seeds than the
        run's config builds, or none restores.
    """
    steps = sorted(self._mngr.all_steps(), reverse=True)
    if not steps:
      return None
    leaves, treedef = jax.tree.flatten(template)
    abstract = dict(zip(_leaf_names(len(leaves)), map(_abstract, leaves), strict=True))
    broken: list[tuple[int, str]] = []
    found = None
    with _quiet_restore(broken):
      for step in steps:
        found = self._restore_step(step, template, seeds, abstract, len(leaves), broken)
        if found is not None:
          break
    if found is not None:
      step, host, restored = found
      for bad, why in broken:
        if warn is not None:
          warn(f"checkpoint {self.directory}/{bad} does not restore ({why}); "
               f"resuming from checkpoint {step} instead")
        self._mngr.delete(bad)
      restored = [jax.random.wrap_key_data(x, impl=jax.random.key_impl(t)) if _is_key(t)
                  else x for x, t in zip(restored, leaves, strict=True)]
      # np.asarray keeps the saved element type: ints stay ints, floats floats.
      self.restored_host = host
      return (int(host["round"]), jax.tree.unflatten(treedef, restored),
              np.asarray(host["cum_up"]), np.asarray(host["cum_down"]))
    raise CheckpointError(
        f"no checkpoint in {self.directory} restores ("
        + "; ".join(f"{s}: {why}" for s, why in broken)
        + f"); allowed: an intact checkpoint, or remove {self.directory} to start "
        "the run again from round 0")

  def _restore_step(self, step, template, seeds, abstract, n, broken):
    return _restore_step(self._mngr, f"{self.directory}/{step}", step, template, seeds,
                         abstract, n, broken)

  def close(self) -> None:
    self._mngr.close()
