"""Running a sweep's programs: train (or resume) each, split a program of
several cells back into the cells' own run directories, mark them done."""

from __future__ import annotations

import copy
import json
import os
import shutil
import time

from jsfl import config as config_lib
from jsfl import reading, rundir
from jsfl.errors import Diverged, RunDirError, UserError
from jsfl.sweep.format import Sweep, SweepError
from jsfl.sweep.plan import (
  DONE,
  Unit,
  config_diff,
  finished,
  finished_run,
  has_progress,
  other_program_notes,
  plan,
  read_json,
  same_cells,
  seed_text,
  status,
  unit_seeds,
)


def mark_done(run_dir: str) -> None:
  with open(os.path.join(run_dir, DONE), "w") as f:
    f.write(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")


def split_batch(unit: Unit) -> list[str]:
  """Writes each cell of a finished program into its own run directory.

  metrics.jsonl keeps the program's lines of the cell byte for byte (they
  carry ``cell``); partition.json and method artifacts are the cell's;
  config.json is the cell's own config with a ``batched_with`` note;
  ``confusion_steps.npz`` (``run.step_confusion``) keeps the cell's slots;
  summary.json is computed as a run computes it.  A cell whose slot
  diverged keeps the records before (with ``run.on_divergence = stop_run``
  only up to the round the divergence stopped it at), its summary names the
  seeds, and it gets no ``.done``.  Each cell appears complete or not at
  all: it is built aside and renamed.

  Returns:
    The names of the cells that diverged.
  """
  from jsfl import train
  from jsfl.train.records import cell_step_confusion
  src = unit.dir
  meta = read_json(os.path.join(src, "config.json"))
  summ = read_json(os.path.join(src, "summary.json")) or {}
  own = {c["name"]: c["config"] for c in meta.get("cells", [])}
  lines = []
  with open(os.path.join(src, "metrics.jsonl")) as f:
    for line in f:
      try:
        lines.append((json.loads(line)["cell"], line))
      except (ValueError, KeyError, TypeError):
        continue  # not a record of a cell (a run writes none such; a tool might)
  files = sorted(n for n in os.listdir(src) if n.endswith(".json") and os.path.isfile(
      os.path.join(src, n)) and n not in ("config.json", "summary.json"))
  diverged_cells = []
  for cell in unit.cells:
    parent, base = os.path.split(cell.dir)
    for stale in os.listdir(parent):  # left by a split that was killed
      if stale.startswith(base + ".split"):
        shutil.rmtree(os.path.join(parent, stale), ignore_errors=True)
    if finished(cell.dir, config_lib.typed(cell.cfg).run.rounds):
      continue  # split out before a kill: the same files again
    diverged = {e["seed"]: e["round"] for e in summ.get("diverged", ())
                if e.get("cell") == cell.name}
    tmp = f"{cell.dir}.split{os.getpid()}"
    os.makedirs(tmp)
    m = copy.deepcopy(meta)
    m.pop("cells", None)
    m["config"] = own.get(cell.name, cell.cfg)
    m["config"]["run"]["dir"] = cell.dir
    m.setdefault("resolved", {})["seeds"] = list(cell.seeds)
    m["batched_with"] = {
        "cells": [c.name for c in unit.cells if c is not cell],
        "slots": unit.slots,
        "note": ("ran as slots of one program with these cells (jsfl sweep); records "
                 "split by cell; max_client_size and wall_s are the program's")}
    rundir.write_json_atomic(os.path.join(tmp, "config.json"), m)
    for n in files:
      rundir.write_json_atomic(os.path.join(tmp, n),
                               reading.cell_entries(read_json(os.path.join(src, n)),
                                                    cell.name))
    art = os.path.join(src, train.CELL_ARTIFACTS, cell.name)
    for n in sorted(os.listdir(art)) if os.path.isdir(art) else ():
      if os.path.isdir(os.path.join(art, n)):  # the cell's tracker files
        shutil.copytree(os.path.join(art, n), os.path.join(tmp, n))
      else:
        shutil.copyfile(os.path.join(art, n), os.path.join(tmp, n))
    sessions = os.path.join(src, rundir.SESSIONS)
    if os.path.isfile(sessions):  # the program's code is every cell's
      shutil.copyfile(sessions, os.path.join(tmp, rundir.SESSIONS))
    cell_step_confusion(src, tmp, cell.name)  # run.step_confusion's matrices, its slots
    if os.path.isdir(os.path.join(src, train.PROFILE_DIR)):  # one trace of all the cells
      shutil.copytree(os.path.join(src, train.PROFILE_DIR), os.path.join(tmp, train.PROFILE_DIR))
    mine = [line for c, line in lines if c == cell.name]
    if diverged and config_lib.typed(cell.cfg).run.on_divergence == "stop_run":
      stop = min(diverged.values())  # where a run of this cell alone would have stopped
      mine = [line for line in mine if json.loads(line)["round"] <= stop]
    with open(os.path.join(tmp, "metrics.jsonl"), "w") as f:
      f.writelines(mine)
    records = [{k: v for k, v in json.loads(line).items() if k != "cell"} for line in mine]
    rundir.write_json_atomic(os.path.join(tmp, "summary.json"),
                             train.summary(cell.cfg, records, diverged))
    if diverged:
      diverged_cells.append(cell.name)
    else:
      mark_done(tmp)
    if os.path.exists(cell.dir):
      shutil.rmtree(cell.dir)
    os.rename(tmp, cell.dir)
  return diverged_cells


def train_unit(unit: Unit, log) -> None:
  """Runs, resumes or finishes one unit and marks its cells done.

  Raises:
    Diverged: a slot diverged; in a program of several cells the others
      are split out and done first, and the message names the cells.
  """
  from jsfl import train
  d, rounds = unit.dir, config_lib.typed(unit.cfg).run.rounds
  diverged = None
  if unit.batched and finished_run(d, rounds) and config_diff(d, unit.cfg) == [] \
      and same_cells(d, unit):
    log("  program already trained; splitting it")
  else:
    resumed = False
    if (os.path.isdir(os.path.join(d, "checkpoints"))
        and config_diff(d, unit.cfg) == [] and same_cells(d, unit)):
      log(f"  resuming {d}")
      try:
        train.resume(d, progress=False if not config_lib.typed(unit.cfg).exec.progress else None)
        resumed = True
      except RunDirError:  # another process writes it
        raise
      except Diverged as e:
        if not unit.batched:
          raise
        diverged, resumed = e, True
      except Exception as e:  # noqa: BLE001 - a broken checkpoint costs a rerun, not the sweep
        log(f"  resume failed ({type(e).__name__}: {e}); rerunning from scratch")
    if not resumed:
      if os.path.exists(d):
        rundir.RunLock(d).acquire().release()  # never delete a run another process writes
        shutil.rmtree(d)  # a partial run we cannot continue
      try:
        train.run(unit.cfg, cells=unit.cell_configs())
      except Diverged as e:
        if not unit.batched:
          raise
        diverged = e
    if diverged is None and not finished_run(d, rounds):
      raise RuntimeError(f"{d}: the run returned before evaluating round {rounds}")
    if not unit.batched:
      mark_done(d)
      return
  bad = split_batch(unit)
  shutil.rmtree(d)
  try:
    os.remove(d + ".json")
  except FileNotFoundError:
    pass
  if bad:
    raise Diverged(f"cell{'s' * (len(bad) > 1)} {', '.join(bad)} diverged (non-finite "
                   "loss or parameters; see their summary.json); the program's other "
                   "cells are done; allowed: a smaller optim.lr, optim.clip_norm or a stabler "
                   "method option",
                   (diverged.diverged if diverged is not None else {}), d)


def accuracy_text(run_dir: str) -> str:
  summ = read_json(os.path.join(run_dir, "summary.json")) or {}
  acc = summ.get("accuracy") or {}
  if acc.get("median") is None:
    return "accuracy -"
  std = acc.get("std")
  spread = f" +- {std:.2f}" if std is not None and len(acc.get("per_seed", ())) > 1 else ""
  return f"accuracy {acc['median']:.2f}{spread}"


def validate_units(sweep: Sweep, units: list[Unit], log=None) -> list[Unit]:
  """Checks what only the data, model and method can check (their options)
  with :func:`jsfl.train.prepare`, for every program, before anything
  runs; then the memory guard: a program whose slots would not fit the
  device (:func:`jsfl.train.memory.fitting_slots`; ``exec.max_slots`` set skips
  the estimate) is cut into programs that do, whole cells each.

  Returns:
    The programs to run.
  """
  from jsfl.train import prepare
  from jsfl.train.memory import fitting_slots, memory_text
  out = []
  for u in units:
    try:
      exp = prepare(u.cfg, u.cell_configs())
    except UserError as e:
      names = getattr(e, "cell", None) or ", ".join(c.name for c in u.cells)
      raise SweepError(f"sweep {sweep.path}, cell {names}: {e}") from None
    fit = u.slots if config_lib.typed(u.cfg).exec.max_slots else fitting_slots(exp)
    if u.slots <= fit or not u.batched:
      out.append(u)
      continue
    if has_progress(u):  # planned so on another device
      if log is not None:
        log(f"memory guard: {u.slots} slots of {u.cells[0].name} and {len(u.cells) - 1} "
            f"more cells would not fit the device (about {fit} do: {memory_text(exp)}), "
            f"but {u.dir} has their training so far: going on with it (delete it to "
            "re-plan, or set exec.max_slots)")
      out.append(u)
      continue
    parts = plan(sweep, u.cells, max_slots=max(fit, 1))
    if log is not None:
      log(f"memory guard: {u.slots} slots of {u.cells[0].name} and {len(u.cells) - 1} "
          f"more cells would not fit the device (about {fit} do: "
          f"{memory_text(exp)}); running them as {len(parts)} programs; set "
          "exec.max_slots to choose")
    out += parts
  return out


def run_units(sweep: Sweep, units: list[Unit], log) -> list[str]:
  """Trains every unit; returns the names of the cells that failed."""
  os.makedirs(sweep.root, exist_ok=True)
  failed = []
  for i, u in enumerate(units):
    names = ", ".join(c.name for c in u.cells)
    log(f"[{i + 1}/{len(units)}] {len(u.cells)} cells ({u.slots} slots of one program): "
        f"{names}" if u.batched else
        f"[{i + 1}/{len(units)}] {names}: seeds {seed_text(unit_seeds(u))}")
    for line in other_program_notes(u):
      log(line)
    if u.batched:  # which cells a program holds, for --collect while it runs
      rundir.write_json_atomic(u.dir + ".json", {"cells": [c.name for c in u.cells]})
    try:
      train_unit(u, log)
    except UserError as e:  # a diverged cell, a locked directory: one line
      log(f"  FAILED {names if not u.batched else 'program'}: {' '.join(str(e).split())}")
    except Exception as e:  # noqa: BLE001 - one failing cell must not stop the others
      import traceback
      traceback.print_exc()
      log(f"  FAILED {names}: {type(e).__name__}: {e}")
    for c in u.cells:
      if status(c) == "done":
        log(f"  done {c.name}: {accuracy_text(c.dir)} ({c.dir})")
      else:
        failed.append(c.name)
  return failed
