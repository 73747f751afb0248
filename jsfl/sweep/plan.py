"""Cells -> programs: which cells train as the slots of one compiled
program, their status on disk, and shards of a sweep (no jax)."""

from __future__ import annotations

import copy
import dataclasses
import glob
import hashlib
import json
import math
import os

from jsfl import config, rundir, slots
from jsfl import config as config_lib
from jsfl.sweep.format import Cell, Sweep

DONE = ".done"
BATCH_PREFIX = ".batch-"


# Methods whose random draws would depend on the padded client width, so a
# program's wider table would change a slot's numbers: each of their cells
# runs alone.  Empty since MultiSFL's replay pool draws per client row
# (tests/test_multisfl.py::test_class_pool_ignores_padding_width).
UNBATCHABLE_METHODS: frozenset = frozenset()


@dataclasses.dataclass
class Unit:
  """What one training run trains: one cell, or several cells as the
  slots of one program."""

  cells: list[Cell]
  cfg: dict
  dir: str

  @property
  def batched(self) -> bool:
    return len(self.cells) > 1

  @property
  def slots(self) -> int:
    return sum(len(c.seeds) for c in self.cells)

  def cell_configs(self) -> list[tuple[str, dict]] | None:
    """``(name, config)`` of every cell for :func:`jsfl.train.run`; None for
    a single cell (it runs in its own directory, as ``jsfl run`` would)."""
    return [(c.name, c.cfg) for c in self.cells] if self.batched else None


def read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def finished_run(run_dir: str, rounds: int) -> bool:
  """``summary.json`` has evaluated the last round (a killed run may too)."""
  summ = read_json(os.path.join(run_dir, "summary.json"))
  return isinstance(summ, dict) and summ.get("rounds_evaluated") == rounds


def finished(run_dir: str, rounds: int) -> bool:
  """``.done`` is there and ``summary.json`` has evaluated the last round."""
  return os.path.exists(os.path.join(run_dir, DONE)) and finished_run(run_dir, rounds)


def started(run_dir: str) -> bool:
  return os.path.isdir(run_dir) and bool(os.listdir(run_dir))


def comparable(cfg: dict) -> dict:
  """``cfg`` without where, how visibly and how packed it runs, and how it
  evaluates (:data:`jsfl.slots.WHERE_FIELDS`, :data:`jsfl.slots.EVAL_HOW_FIELDS`):
  what a finished cell is compared on."""
  cfg = copy.deepcopy(cfg)
  for s, k in slots.WHERE_FIELDS + slots.EVAL_HOW_FIELDS:
    cfg.get(s, {}).pop(k, None)
  return cfg


def config_diff(run_dir: str, cfg: dict) -> list[str] | None:
  """Fields where a run directory's config.json differs from ``cfg``.

  Fields present on one side only (a key added to the schema since) do not
  count, except where the new default is not what the older run computed
  (:func:`jsfl.config.as_it_ran`).  None when config.json cannot be read.
  """
  meta = read_json(os.path.join(run_dir, "config.json"))
  if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
    return None
  return fields_differing(meta["config"], cfg)


def fields_differing(stored: dict, cfg: dict) -> list[str]:
  """:func:`config_diff` of a stored config (config.json's) against ``cfg``."""
  have, want = comparable(config.as_it_ran(stored)), comparable(cfg)
  return [f"{s}.{k}" for s in want for k in want[s]
          if k in have.get(s, {}) and have[s][k] != want[s][k]]


def status(cell: Cell) -> str:
  """``done``, ``partial`` (its directory has something) or ``todo``."""
  if finished(cell.dir, config_lib.typed(cell.cfg).run.rounds):
    return "done"
  return "partial" if started(cell.dir) else "todo"


@dataclasses.dataclass
class ProgramOnDisk:
  """A program directory of a sweep (``.batch-<hash>``) and what its side
  file says it holds."""

  dir: str
  cells: list[str]
  written: float  # mtime of its newest record file: which program wrote last

  @property
  def has_training(self) -> bool:
    return os.path.isdir(os.path.join(self.dir, "checkpoints")) or os.path.exists(
        os.path.join(self.dir, "metrics.jsonl"))


def programs_on_disk(root: str) -> list[ProgramOnDisk]:
  """Every program directory under a sweep's ``root`` with a readable side
  file, in name order.  Several may hold one cell: a plan changes with the
  grid, the cells' names, ``exec.max_slots``, ``--per-cell`` or a shard
  count, and the program of an earlier plan stays on disk."""
  out = []
  for side in sorted(glob.glob(os.path.join(glob.escape(root), BATCH_PREFIX + "*.json"))):
    block, d = read_json(side), side[:-len(".json")]
    if not isinstance(block, dict) or not os.path.isdir(d):
      continue
    stamps = [os.path.getmtime(f) for f in (os.path.join(d, "metrics.jsonl"),
                                            os.path.join(d, "config.json"), side)
              if os.path.exists(f)]
    out.append(ProgramOnDisk(d, [n for n in block.get("cells", ()) if isinstance(n, str)],
                             max(stamps)))
  return out


def other_programs(unit: Unit) -> list[ProgramOnDisk]:
  """Programs on disk other than ``unit``'s own that hold training of one of
  its cells: an earlier plan's, which ``unit`` does not continue."""
  names = {c.name for c in unit.cells}
  root = os.path.dirname(unit.cells[0].dir)
  return [p for p in programs_on_disk(root) if os.path.normpath(p.dir) != os.path.normpath(
      unit.dir) and p.has_training and names & set(p.cells)]


def other_program_notes(unit: Unit) -> list[str]:
  """One line per :func:`other_programs` of ``unit``, for the sweep's log
  and ``--dry-run``."""
  names = {c.name for c in unit.cells}
  return [f"  note: {p.dir} holds training of {', '.join(n for n in p.cells if n in names)} "
          "from another plan of this sweep; not continued, --collect reads these cells "
          "from the newer program (delete it to free its disk)"
          for p in other_programs(unit)]


def batch_dir(root: str, cells: list[Cell]) -> str:
  digest = hashlib.sha1("\n".join(c.name for c in cells).encode()).hexdigest()[:12]
  return os.path.join(root, BATCH_PREFIX + digest)


def make_unit(cells: list[Cell]) -> Unit:
  """The unit of ``cells``: a single cell in its own directory, several in a
  batch directory beside theirs, named by their names."""
  if len(cells) == 1:
    return Unit(cells, cells[0].cfg, cells[0].dir)
  d = batch_dir(os.path.dirname(cells[0].dir), cells)
  cfg = copy.deepcopy(cells[0].cfg)
  cfg["run"]["dir"] = d
  return Unit(cells, cfg, d)


def plan(sweep: Sweep, cells: list[Cell], max_slots: int | None = None,
         per_cell: bool = False) -> list[Unit]:
  """The programs that train ``cells``, in cell order (status not read).

  Cells of one static signature (:func:`jsfl.slots.signature`) share a
  program; a program holds at most ``exec.max_slots`` slots (``max_slots``
  overrides it, e.g. from the memory estimate), so a larger group is cut
  into several, whole cells each (a cell with more seeds runs alone).
  ``per_cell``: every cell its own program.
  """
  groups: dict[str, list[Cell]] = {}
  for c in cells:
    key = (slots.signature(c.cfg) if config_lib.typed(c.cfg).method.name not in UNBATCHABLE_METHODS
           and not per_cell else f"alone:{c.index}")
    groups.setdefault(key, []).append(c)
  units = []
  for group in groups.values():
    cap = max_slots or config_lib.typed(group[0].cfg).exec.max_slots or math.inf
    chunk: list[Cell] = []
    for c in group:
      if chunk and sum(len(x.seeds) for x in chunk) + len(c.seeds) > cap:
        units.append(make_unit(chunk))
        chunk = []
      chunk.append(c)
    units.append(make_unit(chunk))
  units.sort(key=lambda u: min(c.index for c in u.cells))
  return units


def same_cells(run_dir: str, unit: Unit) -> bool:
  """Whether a program's directory holds these cells with these configs."""
  meta = read_json(os.path.join(run_dir, "config.json")) or {}
  have = meta.get("cells")
  if not unit.batched:
    return have is None
  if not isinstance(have, list) or [c.get("name") for c in have] != [
      c.name for c in unit.cells]:
    return False
  return all(isinstance(h.get("config"), dict) and not fields_differing(h["config"], c.cfg)
             for h, c in zip(have, unit.cells, strict=True))


def has_progress(unit: Unit) -> bool:
  """A program of several cells whose directory holds training to keep, for
  these cells as configured: a checkpoint to resume, or every round trained
  (killed while its cells were being split out)."""
  return unit.batched and (
      rundir.checkpointed_round(unit.dir) is not None
      or finished_run(unit.dir, config_lib.typed(unit.cfg).run.rounds)) and same_cells(
          unit.dir, unit)


def pending(units: list[Unit]) -> list[Unit]:
  """``units`` without their finished cells (a program whose cells are all
  done is dropped; one with some done trains the rest, unless its
  directory has progress to keep: then it goes on whole, and its done
  cells are not written again)."""
  out = []
  for u in units:
    todo = [c for c in u.cells if status(c) != "done"]
    if todo:
      out.append(u if len(todo) == len(u.cells) or has_progress(u) else make_unit(todo))
  return out


def shard(units: list[Unit], i: int, n: int) -> list[Unit]:
  """Shard ``i`` of ``n``: programs ``i, i + n, ...`` of :func:`plan` over
  every cell (finished or not, so shards never shift as cells finish).  With
  fewer programs than shards the largest are cut in halves, whole cells
  each, until every shard has one or no program is left to cut."""
  units = list(units)
  while len(units) < n:
    big = max(range(len(units)), key=lambda k: (len(units[k].cells) > 1, units[k].slots),
              default=None)
    if big is None or len(units[big].cells) < 2:
      break
    u = units.pop(big)
    half = len(u.cells) // 2
    units[big:big] = [make_unit(u.cells[:half]), make_unit(u.cells[half:])]
  return units[i::n]


def unit_seeds(u: Unit) -> range:
  run = config_lib.typed(u.cfg).run
  return range(run.seed, run.seed + run.seeds)


def seed_text(seeds) -> str:
  seeds = list(seeds)
  return str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"
