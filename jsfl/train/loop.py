"""The train loop (big_vision style): config -> run directory.

The loop over rounds is the only Python loop: each round is one call of a
jitted program that runs every slot, client and batch step of the round
(:mod:`jsfl.train.programs`); evaluation is one more program over the test
set.  ``docs/run-directory.md`` describes what a run writes.
"""

from __future__ import annotations

import os
import signal
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from jsfl import checkpoint, distributed, reading, rundir
from jsfl import config as config_lib
from jsfl.errors import Diverged, RunDirError
from jsfl.train import fit, programs
from jsfl.train.evaluate import chunk_test_set
from jsfl.train.experiment import Experiment, prepare
from jsfl.train.lifecycle import (
  Progress,
  Stopped,
  StopSignals,
  diverged_error,
  finished,
  holds_nothing,
  note_session,
  read_run_config,
  write_run_files,
)
from jsfl.train.observe import Profile, make_trackers
from jsfl.train.programs import (
  commit,
  make_seed_keys,
  place,
  round_keys,
  run_mesh,
  split_data,
)
from jsfl.train.records import Tally, summary, write_step_confusion


def run(cfg: dict, exp: Experiment | None = None, *, resume: str | None = None,
        cells: list[tuple[str, dict]] | None = None) -> str:
  """Trains per ``cfg`` and returns the run directory.

  Checkpoints (:mod:`jsfl.checkpoint`) are written every
  ``run.checkpoint_every`` rounds and after the last.  SIGTERM and SIGINT
  (main thread only) end the run after the current round with a checkpoint
  and a line naming the resume command on stderr; one that comes while the
  run starts (data, compilation: a cluster's preemption) ends it before its
  first round, a new run leaving nothing behind.  The run directory is
  locked while the run writes it; a new run that fails before its first
  record or checkpoint leaves nothing behind.

  Args:
    cfg: the resolved config.
    exp: ``prepare(cfg)``, if already built.
    resume: an existing run directory of ``cfg`` to continue from its newest
      checkpoint that restores (round 0 without one) instead of a new one;
      use :func:`resume`, which also reads and re-validates the config.
    cells: ``(name, config)`` of cells to train as slots of one program
      (:func:`~jsfl.train.experiment.prepare`); its records carry their cell.

  Raises:
    Stopped: after a SIGTERM / SIGINT (a ``SystemExit`` of 128 + signum).
    Diverged: a slot's loss or parameters became non-finite
      (``run.on_divergence``); the run directory is kept and its summary
      names the slots.
    RunDirError, CheckpointError: the directory is taken or locked; no
      checkpoint restores or matches; a checkpoint could not be written.
  """
  # From here on SIGTERM is a flag the start checks before the first round
  # and the loop after every round (its default would kill the process
  # mid-start and leave a locked, half-written directory); SIGINT joins it
  # at the first round, Ctrl-C raising at once while the run starts.
  stop = StopSignals((signal.SIGTERM,))
  try:
    return _run(cfg, exp, resume, cells, stop)
  finally:
    stop.restore()


def _run(cfg: dict, exp: Experiment | None, resume: str | None,
         cells: list[tuple[str, dict]] | None, stop: StopSignals) -> str:
  exp = exp or prepare(cfg, cells)
  c = config_lib.typed(cfg)
  # Multi-host: process 0 alone writes files; the others learn its directory
  # (checkpoints are written by all of them into it).
  writes = distributed.is_writer()
  created: list[str] = []
  out = resume or (rundir.new_run_dir(c.run.out_dir, c.run.name, c.run.dir, created)
                   if writes else None)
  out = distributed.broadcast_path(out)
  lock = rundir.RunLock(out)
  try:
    if writes:
      lock.acquire()
      if not resume and rundir.listing(out):  # another run wrote it since we checked
        raise RunDirError(f"run.dir={out!r} was written by another process meanwhile; "
                          "allowed: a new or empty directory")
    try:
      train(cfg, exp, out, resume, writes, stop)
    except BaseException as e:
      started = isinstance(e, Diverged) or (isinstance(e, Stopped) and e.round > 0)
      if writes and not resume and not started and holds_nothing(out):
        rundir.remove_new(out, created)
      raise
  finally:
    lock.release()
  return out


def train(cfg: dict, exp: Experiment, out: str, resume: str | None, writes: bool,
          stop: StopSignals) -> None:
  """The loop over rounds, in ``out`` (already locked); ``stop`` holds the
  signals received so far."""
  mesh = run_mesh(exp)
  if not resume and writes:  # a resumed run keeps the files of its start
    write_run_files(cfg, exp, out, mesh)
  init, rnd, ev = programs.build_programs(exp, mesh)
  slot, shared = split_data(exp.data)
  test = jax.tree.map(jnp.asarray, chunk_test_set(
      exp.dataset.x_test, exp.dataset.y_test, config_lib.typed(cfg).exec.eval_batch))
  seed_keys, slot, shared, test = place(mesh, make_seed_keys(exp.seeds), slot, shared, test)
  init, rnd, ev = fit.fit(exp, (init, rnd, ev), seed_keys, slot, shared, mesh,
                          log=lambda m: print(m, file=sys.stderr, flush=True) if writes
                          else None)
  watched = step_confusion_rounds(cfg)
  step_rnd = None
  if watched:  # run.step_confusion: another round program, for these rounds only
    step_rnd = programs.build_step_program(exp)
    if isinstance(rnd, fit.Chunked):
      step_rnd = fit.Chunked(step_rnd, rnd.n, rnd.size, 3)
  _, _, mean, std = shared
  state = commit(init(seed_keys), mesh)
  c = config_lib.typed(cfg)
  R, every, ckpt_every = c.run.rounds, c.run.eval_every, c.run.checkpoint_every
  ckpt = checkpoint.Checkpointer(os.path.join(out, "checkpoints"))
  t = Tally(exp)
  if resume:
    state = t.restore(cfg, out, ckpt, state, writes)
  stop.agree()  # a signal during the start (data, compilation): no round
  if stop.signum:
    ckpt.close()
    if writes:
      then = (f"resume with: jsfl run --resume {out}" if resume
              else "nothing kept (a new run)")
      print(f"jsfl: stopped before round {t.start + 1}; {then}", file=sys.stderr, flush=True)
    raise Stopped(stop.signum, t.start, out)
  stop.watch(signal.SIGINT)
  if writes:
    note = note_session(out, t.start + 1, resume is not None)
    if note:
      print(note, file=sys.stderr, flush=True)
  writer = rundir.MetricsWriter(f"{out}/metrics.jsonl") if writes else rundir.NullWriter()
  bar = Progress(R, c.exec.progress and writes)
  trackers = make_trackers(cfg, exp, out, t.start, writes)
  profile = Profile(c.run.profile, out, writes)
  try:
    for r in range(t.start, R):
      profile.before(r)
      t0 = time.perf_counter()
      if step_rnd is not None and r + 1 in watched:
        state, m, sc = step_rnd(state, slot, round_keys(seed_keys, r), shared, test)
        if writes:
          write_step_confusion(out, exp, r, jax.device_get(sc))
      else:
        state, m = rnd(state, slot, round_keys(seed_keys, r), shared)
      m = jax.device_get(m)
      wall = time.perf_counter() - t0
      traffic = t.add_traffic(m)
      stopping = t.note_divergence(cfg, m, r, bar.enabled)
      acc = None
      if (r + 1) % every == 0 or r + 1 == R or stopping:
        e = jax.device_get(ev(state, test, mean, std))
        n = len(t.records)
        acc = t.record(cfg, exp, state, m, e, r, wall, traffic, writer)
        if writes:
          rundir.write_json_atomic(f"{out}/summary.json",
                                   summary(cfg, t.records, t.diverged_ids()))
          trackers.log(t.records[n:])
      profile.after(r)
      bar.update(r + 1, acc, float(np.sum(m["samples"])) / wall, final=r + 1 == R)
      stop.agree()  # every host stops after the same round
      if stopping:  # no checkpoint of a broken state
        raise diverged_error(cfg, out, t.diverged_ids(), r + 1, R)
      if r + 1 == R or stop.signum or (ckpt_every and (r + 1) % ckpt_every == 0):
        ckpt.save(r + 1, state, exp.seeds, t.cum_up, t.cum_down, extra=t.host_record())
      if stop.signum and r + 1 < R:
        if bar.enabled and bar.tty:
          sys.stderr.write("\n")  # end the progress line
        if writes:
          print(f"jsfl: stopped after round {r + 1}; resume with: jsfl run --resume {out}",
                file=sys.stderr, flush=True)
        raise Stopped(stop.signum, r + 1, out)
  finally:
    profile.stop()
    trackers.close()
    writer.close()
    ckpt.close()
  if jax.process_count() > 1:  # job logs show that every host agrees
    print(f"jsfl: process {jax.process_index()}/{jax.process_count()} finished: "
          f"accuracy {np.round(np.asarray(t.last_acc, np.float64), 4).tolist()}",
          file=sys.stderr, flush=True)
  if t.diverged:
    raise diverged_error(cfg, out, t.diverged_ids(), R, R)


def step_confusion_rounds(cfg: dict) -> set[int]:
  """The rounds (1-based) whose steps ``run.step_confusion`` records; empty
  when it is off."""
  run_ = config_lib.typed(cfg).run
  if not run_.step_confusion:
    return set()
  return set(run_.step_confusion_rounds or [run_.rounds])


def resume(run_dir: str, *, progress: bool | None = None) -> str:
  """Continues the run in ``run_dir`` from its newest checkpoint.

  Reads the run's ``config.json``, prepares it again (deterministic), restores
  the newest checkpoint (:mod:`jsfl.checkpoint` says what it holds and why
  that suffices), drops ``metrics.jsonl`` records of later rounds and trains
  the remaining rounds into the same directory; the result equals an
  uninterrupted run's bit for bit (except ``wall_s``) on the same machine,
  versions and code (``jsfl_source``; a resume on other code says so).
  Without a checkpoint the run starts again from round 0.  A finished run
  is left as it is.

  Args:
    run_dir: a directory ``jsfl run`` wrote.
    progress: overrides ``exec.progress`` (None: the run's own setting).

  Raises:
    ConfigError: ``run_dir`` is not a run directory, its config is no
      longer valid, or its records are archived (``metrics.jsonl.gz``).
    Stopped: as :func:`run`.
  """
  cfg, cells = read_run_config(run_dir, progress)
  rundir.check_globless(run_dir, "--resume")
  if finished(run_dir, cfg, cells):
    R = config_lib.typed(cfg).run.rounds
    print(f"jsfl: {run_dir} is finished ({R} of {R} rounds); nothing to resume",
          file=sys.stderr)
    return run_dir
  if reading.is_archived(run_dir):  # resuming would start its records anew
    raise config_lib.ConfigError(
        f"{run_dir!r} is archived (metrics.jsonl.gz); allowed: a run directory with "
        "plain records (gunzip its metrics.jsonl.gz and partition.json.gz to resume it)")
  return run(cfg, resume=run_dir, cells=cells)
