"""``jsfl sweep``: run, list (``--dry-run``) or collect a sweep's cells."""

from __future__ import annotations

import json
import os
import re
import sys

from jsfl import config as config_lib
from jsfl import rundir, slots
from jsfl.sweep.collect import COLLECTED, collect
from jsfl.sweep.execute import run_units, validate_units
from jsfl.sweep.format import SweepError, load_sweep, parse_shard, resolve
from jsfl.sweep.plan import (
  Unit,
  config_diff,
  other_program_notes,
  pending,
  plan,
  seed_text,
  shard,
  started,
  status,
)


def main(path: str, shard_spec: str | None = None, collect_only: bool = False,
         dry_run: bool = False, quiet: bool = False, per_cell: bool = False,
         out_dir: str | None = None) -> int:
  """``jsfl sweep``: runs (or lists, or collects) a sweep's cells.

  Args:
    path: the sweep file.
    shard_spec: ``"i/n"``: only programs ``i, i + n, ...`` (:func:`shard`).
    collect_only: report every cell into ``out_dir/name/collected`` instead.
    dry_run: list the cells with their status and what would run.
    quiet: no progress bars.
    per_cell: every cell its own program (no slots shared across cells).
    out_dir: instead of the file's ``sweep.out_dir``.

  Returns:
    The exit code: 0, or 1 when a cell failed (the others still ran).

  Raises:
    SweepError: a bad sweep file, cell config or argument; nothing was written.
  """
  def log(msg):
    print(msg, flush=True)

  sweep = load_sweep(path, out_dir)
  if collect_only:
    if shard_spec is not None:
      raise SweepError("--collect reads every cell; allowed: --collect without --shard")
    from jsfl import report
    try:
      rep = collect(sweep)
    except ValueError as e:  # a bad reference CSV
      raise SweepError(f"sweep {sweep.path}: {e}") from None
    if not rep.rows:
      raise SweepError(f"no cell of {sweep.path} has metrics yet under {sweep.root!r} "
                       f"({len(sweep.cells)} cells); allowed: --collect once a cell has "
                       "evaluated a round (jsfl sweep FILE runs them)")
    for p in rep.problems:
      print(f"jsfl: warning: {p}", file=sys.stderr)
    print(report.to_markdown(rep, title=f"jsfl sweep {sweep.name}"))
    for p in report.write_report(rep, os.path.join(sweep.root, COLLECTED)):
      log(f"wrote {p}")
    return 0
  i, n = parse_shard(shard_spec) if shard_spec is not None else (0, 1)
  resolve(sweep)
  if quiet:
    for c in sweep.cells:
      c.cfg["exec"]["progress"] = False
  programs = shard(plan(sweep, sweep.cells, per_cell=per_cell), i, n)
  mine = sorted((c for u in programs for c in u.cells), key=lambda c: c.index)
  check_dirs(sweep, programs, writing=not dry_run)
  if dry_run:
    print_plan(sweep, mine, programs, (i, n), log)
    return 0
  units = validate_units(sweep, pending(programs), log)
  for c in mine:
    if status(c) == "done":
      diff = config_diff(c.dir, c.cfg)
      if diff:
        print(f"jsfl: warning: cell {c.name} finished with another config ("
              f"{', '.join(diff)}); delete {c.dir} to rerun it", file=sys.stderr)
  done = sum(status(c) == "done" for c in mine)
  log(f"sweep {sweep.name}: {len(mine)} cells" + (f" (shard {i}/{n} of {len(sweep.cells)})"
                                                  if n > 1 else "")
      + f", {done} done, {len(units)} program{'s' * (len(units) != 1)} to go -> "
      f"{sweep.root}")
  failed = run_units(sweep, units, log)
  if failed:
    print(f"jsfl: error: {len(failed)} cell{'s' * (len(failed) != 1)} failed: "
          + ", ".join(failed), file=sys.stderr)
    return 1
  return 0


# What a killed atomic write leaves beside the file it was replacing
# (rundir's ``<name>.tmp<pid>``): a run's, not the user's.
_WRITE_LEFTOVER = re.compile(r".+\.tmp\d+$")


def check_dirs(sweep, programs: list[Unit], writing: bool = True) -> None:
  """Raises :class:`SweepError` before anything runs where the sweep could
  not write (``writing``: not for ``--dry-run``), or would replace what is
  not a jsfl run: a sweep directory or a cell's that is a file, a cell
  directory holding files but no run (the sweep replaces a partial run it
  cannot resume, never other files; a killed write's leftovers are a
  run's)."""
  root, key = sweep.root, "the sweep directory (out_dir/name)"
  if os.path.lexists(root) and not os.path.isdir(root):
    raise SweepError(f"{key} {root!r} exists and is not a directory; allowed: a "
                     "directory, made if missing ([sweep] out_dir or --out-dir)")
  if writing:
    rundir.check_parent(root, key, error=SweepError)
  elif not os.path.isdir(above := rundir.existing_ancestor(root)):  # a plan under a file
    raise SweepError(f"{key} {root!r}: {above!r} is not a directory; allowed: a path "
                     "under a directory ([sweep] out_dir or --out-dir)")
  rundir.check_globless(root, key, error=SweepError)
  for u in programs:
    for d in dict.fromkeys([u.dir] + [c.dir for c in u.cells]):
      if not os.path.lexists(d):
        continue
      if not os.path.isdir(d):
        raise SweepError(f"{d!r} exists and is not a directory; allowed: nothing there "
                         "or a run directory of this sweep (move the file away)")
      alien = [n for n in rundir.listing(d) if not _WRITE_LEFTOVER.fullmatch(n)]
      if (alien and not os.path.exists(os.path.join(d, "config.json"))
          and not os.path.exists(os.path.join(d, "metrics.jsonl"))):
        raise SweepError(f"{d!r} holds files that are not a jsfl run "
                         f"({', '.join(sorted(alien)[:3])}); allowed: an empty directory or "
                         "a run directory of this sweep (move those files away)")


def print_plan(sweep, mine, programs, shard_in, log) -> None:
  """Cells -> programs: each program with its slots, each cell with its
  status and seeds."""
  i, n = shard_in
  log(f"sweep {sweep.name}: {len(sweep.cells)} cells in {len(programs)} program"
      f"{'s' * (len(programs) != 1)}" + (f" (shard {i}/{n}: {len(mine)} cells)" if n > 1
                                         else "") + f" -> {sweep.root}")
  width = max(len(c.name) for c in mine) if mine else 0
  to_go = pending(programs)
  for k, u in enumerate(programs):
    cfg = u.cells[0].cfg
    what = f"{cfg['method']['name']}, {cfg['model']['name']}, {cfg['dataset']['name']}"
    own = static_text(u, programs)
    log(f"program {k + 1}: {len(u.cells)} cell{'s' * (len(u.cells) != 1)}, {u.slots} "
        f"slot{'s' * (u.slots != 1)} ({what}{'; ' + own if own else ''})")
    rounds = config_lib.typed(u.cells[0].cfg).run.rounds
    for c in u.cells:
      st = status(c)
      note = f"  seeds {seed_text(c.seeds)}"
      if st != "done" and u.batched and started(u.dir):
        st = "partial"
        note += resume_text(u.dir, rounds)
      elif st == "partial" and os.path.isdir(os.path.join(c.dir, "checkpoints")):
        note += resume_text(c.dir, rounds)
      elif st == "done" and (diff := config_diff(c.dir, c.cfg)):
        note += f"  with another config ({', '.join(diff)}; delete it to rerun)"
      log(f"  {st:<8} {c.name:<{width}}{note}".rstrip())
    for line in other_program_notes(u):
      log(line)
  cap = {u.cells[0].cfg["exec"]["max_slots"] for u in programs}
  if cap == {0}:
    log("(exec.max_slots = 0: a program too large for the device's memory is cut when "
        "the sweep runs)")
  log(f"{len(to_go)} program{'s' * (len(to_go) != 1)} to go")


def resume_text(run_dir: str, rounds: int) -> str:
  """Where a partial run resumes and, at its recorded pace, how long the
  rest takes: ``has checkpoints/ (resumed at round 110 of 1000; ~13h21m
  left at 54 s a round)``."""
  r = rundir.checkpointed_round(run_dir)
  if r is None:
    return ""
  sec = rundir.round_seconds(run_dir)
  left = (f"; ~{rundir.duration_text(sec * (rounds - r))} left at {sec:,.0f} s a round"
          if sec is not None and r < rounds else "")
  return f"  has checkpoints/ (resumed at round {r} of {rounds}{left})"


def static_text(unit: Unit, programs: list[Unit]) -> str:
  """The static fields whose values tell this program from the other
  programs of its method, e.g. ``method.order=random, partition.num_clients=50``."""

  def flat(u):
    st = slots.static_config(u.cells[0].cfg)
    return {f"{sec}.{k}": v for sec, d in st.items() for k, v in d.items()}
  mine = flat(unit)
  peers = [flat(u) for u in programs if flat(u)["method.name"] == mine["method.name"]]
  keys = sorted(k for k in mine
                if len({json.dumps(f.get(k), sort_keys=True) for f in peers}) > 1)
  return ", ".join(f"{k}={mine[k]}" for k in keys)
