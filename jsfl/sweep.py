"""Sweeps: a grid of configs run as cells of one process (``jsfl sweep``).

A sweep file (TOML) names a base config, overrides for every cell, a grid
whose Cartesian product gives the cells, and optional explicit extra cells::

  [sweep]
  name = "fmnist_alpha"                      # out_dir/name/<cell> per cell
  base = "../core/fmnist_iid.toml"           # relative to this file; optional
  out_dir = "runs/sweeps"                    # relative to the working directory

  [base]                                     # every cell (optional)
  "run.rounds" = 50
  "run.seeds" = 5

  [grid]                                     # product, last key fastest
  "method.name" = ["sfl", "fedavg"]
  "partition.alpha" = [0.1, 0.5]

  [[cells]]                                  # extra cells, one per table
  "method.name" = "hydra"
  "method.groups" = 5

Keys are ``section.key`` (quoted, or TOML dotted keys: ``method.name = [...]``
is the same key).  A cell's name is its own assignments (its grid values, or
the keys of its ``[[cells]]`` table), e.g. ``method=sfl,partition.alpha=0.1``,
so adding a value to an axis never renames the cells already run.  Every cell
config is resolved by :func:`jsfl.config.load_config` (the base file plus
``section.key=value`` overrides, exactly as ``jsfl run`` takes them) before
anything runs.

A cell is finished when its directory holds ``summary.json`` with
``rounds_evaluated`` equal to its rounds and a ``.done`` marker written after
the run returned; a rerun skips finished cells, resumes a partial one that
has ``checkpoints/`` (where :func:`jsfl.runner.resume` exists) and reruns any
other partial one from scratch.

Programs: cells whose resolved configs agree on their static signature
(:mod:`jsfl.slots`: everything but seeds, batchable values such as the
learning rate or FedProx's mu, and partition options other than
``num_clients``) train as the slots of one compiled program in
``out_dir/name/.batch-<hash>``; its records carry their cell's name and are
split back into the cells' own directories when it finishes, and the batch
directory is removed.  Cells that differ in a static option (method, model,
cut, clients, heads, ...) form one program per signature.  ``exec.max_slots``
(or, at 0, an estimate of the device's memory) caps the slots of a program;
a larger group is cut into several programs, whole cells each.
"""

from __future__ import annotations

import copy
import dataclasses
import glob
import hashlib
import inspect
import itertools
import json
import math
import os
import shutil
import sys
import time
from typing import Any

from jsfl import config as config_lib
from jsfl import reading, rundir, slots
from jsfl.errors import Diverged, RunDirError, UserError

SWEEP_KEYS = {"name": "the sweep's name (directory under out_dir)",
              "base": "base config TOML, relative to the sweep file",
              "out_dir": "parent of the sweep's directory (default 'runs')",
              "reference": "the paper's figures (CSV, relative to the sweep file) that "
                           "--collect shows beside jsfl's (jsfl report --reference)",
              "by": "comma-separated config fields --collect groups rows by",
              "best_ma": "--collect adds the best W-round moving average of accuracy (an "
                         "int, the MultiSFL authors' figure at 10)"}
TABLES = ("sweep", "base", "grid", "cells")
# The sweep decides where every cell's run directory lies.
RESERVED = ("run.dir", "run.out_dir")
DONE = ".done"
COLLECTED = "collected"
BATCH_PREFIX = ".batch-"
# Methods whose random draws would depend on the padded client width, so a
# program's wider table would change a slot's numbers: each of their cells
# runs alone.  Empty since MultiSFL's replay pool draws per client row
# (tests/test_multisfl.py::test_class_pool_ignores_padding_width).
UNBATCHABLE_METHODS: frozenset = frozenset()
NAME_LIMIT = 200


class SweepError(config_lib.ConfigError):
  """A sweep file, cell config or argument that is not allowed (exit code 2)."""


@dataclasses.dataclass
class Cell:
  """One config of the sweep and its run directory."""

  index: int                    # position in the expanded list (shards cut it)
  name: str
  assigned: list[tuple[str, Any]]  # the cell's own section.key values
  dir: str
  cfg: dict | None = None       # resolved by :func:`resolve`

  @property
  def seeds(self) -> range:
    r = self.cfg["run"]
    return range(r["seed"], r["seed"] + r["seeds"])


@dataclasses.dataclass
class Sweep:
  path: str
  name: str
  base: str | None              # the base config file, or None for defaults
  out_dir: str
  base_overrides: list[tuple[str, Any]]
  cells: list[Cell]
  reference: str | None = None  # the paper's figures for --collect (a CSV path)
  by: list[str] | None = None   # --collect's grouping fields
  best_ma: int = 0              # --collect's best moving-average window

  @property
  def root(self) -> str:
    return os.path.join(self.out_dir, self.name)


@dataclasses.dataclass
class Unit:
  """What one call of the runner trains: one cell, or several cells as the
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
    """``(name, config)`` of every cell for :func:`jsfl.runner.run`; None for
    a single cell (it runs in its own directory, as ``jsfl run`` would)."""
    return [(c.name, c.cfg) for c in self.cells] if self.batched else None


# ---------------------------------------------------------------------------
# Reading and expanding a sweep file (no jax)


def _flatten(table: dict, where: str, path: str) -> list[tuple[str, Any]]:
  """``{"a.b": v}`` and ``{"a": {"b": v}}`` both to ``[("a.b", v)]``."""
  out = []
  for k, v in table.items():
    if isinstance(v, dict):
      for k2, v2 in v.items():
        if isinstance(v2, dict):
          raise SweepError(f"sweep {path}: {where} {k}.{k2} is a table; allowed: "
                           "section.key = value")
        out.append((f"{k}.{k2}", v2))
    elif k.count(".") == 1 and all(k.split(".")):
      out.append((k, v))
    else:
      raise SweepError(f"sweep {path}: {where} key {k!r}; allowed: section.key, "
                       "e.g. \"method.name\"")
  keys = [k for k, _ in out]
  for k in keys:
    if k in RESERVED:
      raise SweepError(f"sweep {path}: {where} sets {k}; not allowed: the sweep puts "
                       "each cell in out_dir/<sweep name>/<cell name>")
    if keys.count(k) > 1:
      raise SweepError(f"sweep {path}: {where} sets {k} twice")
  return out


def toml_value(v) -> str:
  """A value as TOML text, so it round-trips through ``parse_override``."""
  if isinstance(v, bool):
    return "true" if v else "false"
  if isinstance(v, int):
    return str(v)
  if isinstance(v, float):
    if math.isnan(v):
      return "nan"
    return repr(v) if math.isfinite(v) else ("inf" if v > 0 else "-inf")
  if isinstance(v, str):
    # JSON strings are TOML basic strings when non-ASCII stays literal
    # (TOML has no surrogate-pair escapes).
    return json.dumps(v, ensure_ascii=False)
  if isinstance(v, list):
    return "[" + ", ".join(toml_value(x) for x in v) + "]"
  raise SweepError(f"value {v!r} ({type(v).__name__}); allowed: a string, number, "
                   "boolean or list")


def _check_value(path: str, where: str, key: str, v) -> None:
  try:
    toml_value(v)
  except SweepError as e:
    raise SweepError(f"sweep {path}: {where} {key}: {e}") from None


SHORT = {f"{s}.name": s for s in ("method", "dataset", "partition", "model")}


def _name_value(v) -> str:
  if isinstance(v, bool):
    return "true" if v else "false"
  if isinstance(v, list):
    return "-".join(_name_value(x) for x in v)
  return repr(v) if isinstance(v, float) else str(v)


def _safe(text: str) -> str:
  return "".join(c if c.isalnum() or c in "._=,+-" else "_" for c in text)


def cell_name(assigned: list[tuple[str, Any]]) -> str:
  """``[("method.name", "sfl"), ("partition.alpha", 0.1)]`` ->
  ``method=sfl,partition.alpha=0.1``, safe as a file name."""
  name = _safe(",".join(f"{SHORT.get(k, k)}={_name_value(v)}" for k, v in assigned))
  name = name or "base"
  if name.startswith("."):
    name = "_" + name[1:]
  if len(name) > NAME_LIMIT:
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    name = f"{name[:NAME_LIMIT - 11]}-{digest}"
  return name


def load_sweep(path: str) -> Sweep:
  """Reads a sweep file and expands its cells (configs not yet resolved).

  Args:
    path: the sweep TOML file.

  Returns:
    The sweep, cells in order: the grid's product (last key fastest), then
    the ``[[cells]]`` tables.

  Raises:
    SweepError: naming the file and the first bad table, key or value.
  """
  try:
    raw = config_lib.read_toml(path)
  except config_lib.ConfigError as e:
    raise SweepError(str(e).replace("config file", "sweep file", 1)) from None
  for t in raw:
    if t not in TABLES:
      raise SweepError(f"sweep {path}: unknown table [{t}]; allowed: "
                       + ", ".join(f"[{x}]" for x in TABLES[:3]) + ", [[cells]]")
  head = raw.get("sweep")
  if not isinstance(head, dict):
    raise SweepError(f"sweep {path}: no [sweep] table; it needs name (and optionally "
                     "base, out_dir)")
  for k, v in head.items():
    if k not in SWEEP_KEYS:
      raise SweepError(f"sweep {path}: unknown key sweep.{k}; allowed: "
                       + ", ".join(SWEEP_KEYS))
    if k == "best_ma":
      if not isinstance(v, int) or isinstance(v, bool) or v < 0:
        raise SweepError(f"sweep {path}: sweep.best_ma={v!r}; allowed: an int >= 0")
    elif not isinstance(v, str) or not v:
      raise SweepError(f"sweep {path}: sweep.{k}={v!r}; allowed: a non-empty string")
  name = head.get("name")
  if name is None:
    raise SweepError(f"sweep {path}: sweep.name is missing; allowed: a name of "
                     "letters, digits, '.', '_', '-'")
  if _safe(name) != name or "," in name or "=" in name or name.startswith("."):
    raise SweepError(f"sweep {path}: sweep.name={name!r}; allowed: letters, digits, "
                     "'.', '_', '-' (not starting with '.')")
  def beside(key: str, what: str) -> str | None:
    """A [sweep] path relative to the sweep file, which must exist."""
    if head.get(key) is None:
      return None
    found = os.path.normpath(os.path.join(os.path.dirname(path), head[key]))
    if not os.path.isfile(found):
      raise SweepError(f"sweep {path}: sweep.{key}={head[key]!r} ({found}) does not "
                       f"exist; allowed: a {what} path relative to the sweep file")
    return found

  base = beside("base", "config TOML")
  out_dir = head.get("out_dir", "runs")
  reference = beside("reference", "CSV")
  by = [k.strip() for k in head["by"].split(",") if k.strip()] if "by" in head else None
  if not isinstance(raw.get("base", {}), dict):
    raise SweepError(f"sweep {path}: base must be a table [base]")
  base_over = _flatten(raw.get("base", {}), "[base]", path)
  for k, v in base_over:
    _check_value(path, "[base]", k, v)

  grid = raw.get("grid", {})
  if not isinstance(grid, dict):
    raise SweepError(f"sweep {path}: grid must be a table [grid]")
  # An axis over a whole section: ``partition = [{name = "iid"}, {name =
  # "dirichlet", alpha = 0.1}]``, each value a set of that section's keys.
  sections = {k: v for k, v in grid.items() if "." not in k and isinstance(v, list)
              and v and all(isinstance(x, dict) for x in v)}
  for k, v in grid.items():
    if ("." not in k and isinstance(v, list) and k not in sections
        and (not v or any(isinstance(x, dict) for x in v))):  # a section axis gone wrong
      raise SweepError(f"sweep {path}: [grid] {k}={v!r}; allowed: a section axis of "
                       f"tables only, e.g. {k} = [{{name = \"iid\"}}, {{name = \"dirichlet\", "
                       "alpha = 0.1}], or section.key = [values]")
  axes = _flatten({k: v for k, v in grid.items() if k not in sections}, "[grid]", path)
  for k, values in axes:
    if not isinstance(values, list) or not values:
      raise SweepError(f"sweep {path}: [grid] {k}={values!r}; allowed: a non-empty "
                       f"list of values, e.g. {k} = [1, 2], or a section = [{{key = "
                       "value, ...}, ...]")
    for v in values:
      _check_value(path, "[grid]", k, v)
  axes = [(k, [[(k, v)] for v in values]) for k, values in axes]
  for section, tables in sections.items():
    sets = []
    for t in tables:
      pairs = _flatten({section: t}, "[grid]", path)
      for k, v in pairs:
        _check_value(path, "[grid]", k, v)
      sets.append(pairs)
    axes.append((section, sets))
  order = [f"{k}.{k2}" if isinstance(v, dict) else k
           for k, v in grid.items() for k2 in (v if isinstance(v, dict) else [None])]
  axes.sort(key=lambda a: order.index(a[0]))  # the file's order: last key fastest
  extra = raw.get("cells", [])
  if not isinstance(extra, list) or not all(isinstance(c, dict) for c in extra):
    raise SweepError(f"sweep {path}: cells must be tables [[cells]]")
  if not axes and not extra:
    raise SweepError(f"sweep {path}: no cells; allowed: a [grid] of section.key = "
                     "[values] and/or [[cells]] tables")
  assigned = []
  if axes:
    assigned += [[pair for pairs in combo for pair in pairs] for combo in
                 itertools.product(*(sets for _, sets in axes))]
  for i, table in enumerate(extra):
    over = _flatten(table, f"[[cells]] #{i + 1}", path)
    for k, v in over:
      _check_value(path, f"[[cells]] #{i + 1}", k, v)
    assigned.append(over)

  root = os.path.join(out_dir, name)
  cells, seen = [], {}
  for i, a in enumerate(assigned):
    n = cell_name(a)
    if n in seen:
      raise SweepError(f"sweep {path}: cell {n!r} appears twice (cells "
                       f"{seen.get(n, '?')} and {i}); allowed: distinct cells")
    seen[n] = i
    cells.append(Cell(i, n, a, os.path.join(root, n)))
  return Sweep(path, name, base, out_dir, base_over, cells, reference, by,
               head.get("best_ma", 0))


def overrides(sweep: Sweep, cell: Cell, run_dir: str | None = None) -> list[str]:
  """The cell as ``jsfl run`` overrides: [base], its own values, run.dir."""
  items = sweep.base_overrides + cell.assigned
  return ([f"{k}={toml_value(v)}" for k, v in items]
          + [f"run.dir={toml_value(run_dir or cell.dir)}"])


def resolve(sweep: Sweep) -> None:
  """Resolves every cell's config with :func:`jsfl.config.load_config`.

  Raises:
    SweepError: naming the sweep file, the first bad cell and what is allowed.
  """
  for cell in sweep.cells:
    try:
      cell.cfg = config_lib.load_config(sweep.base, overrides(sweep, cell))
    except config_lib.ConfigError as e:
      raise SweepError(f"sweep {sweep.path}, cell {cell.name}: {e}") from None


def parse_shard(text: str) -> tuple[int, int]:
  """``"3/8"`` -> ``(3, 8)``.

  Raises:
    SweepError: unless it is ``i/n`` with ints ``0 <= i < n``.
  """
  try:
    i, n = (int(p) for p in text.split("/"))
  except ValueError:
    i = n = None
  if i is None or not 0 <= i < n:
    raise SweepError(f"--shard={text!r}; allowed: i/n with integers 0 <= i < n, e.g. "
                     "--shard 0/8 (Slurm: --shard $SLURM_ARRAY_TASK_ID/8)")
  return i, n


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
    units[big:big] = [_unit(u.cells[:half]), _unit(u.cells[half:])]
  return units[i::n]


# ---------------------------------------------------------------------------
# State on disk


def _read_json(path: str):
  try:
    with open(path) as f:
      return json.load(f)
  except (OSError, ValueError):
    return None


def finished_run(run_dir: str, rounds: int) -> bool:
  """``summary.json`` has evaluated the last round (a killed run may too)."""
  summ = _read_json(os.path.join(run_dir, "summary.json"))
  return isinstance(summ, dict) and summ.get("rounds_evaluated") == rounds


def finished(run_dir: str, rounds: int) -> bool:
  """``.done`` is there and ``summary.json`` has evaluated the last round."""
  return os.path.exists(os.path.join(run_dir, DONE)) and finished_run(run_dir, rounds)


def _started(run_dir: str) -> bool:
  return os.path.isdir(run_dir) and bool(os.listdir(run_dir))


def _comparable(cfg: dict) -> dict:
  """``cfg`` without where, how visibly and how packed it runs
  (:data:`jsfl.slots.WHERE_FIELDS`): what a finished cell is compared on."""
  cfg = copy.deepcopy(cfg)
  for s, k in slots.WHERE_FIELDS:
    cfg.get(s, {}).pop(k, None)
  return cfg


def config_diff(run_dir: str, cfg: dict) -> list[str] | None:
  """Fields where a run directory's config.json differs from ``cfg``.

  Fields present on one side only (a key added to the schema since) do not
  count.  None when config.json cannot be read.
  """
  meta = _read_json(os.path.join(run_dir, "config.json"))
  if not isinstance(meta, dict) or not isinstance(meta.get("config"), dict):
    return None
  have, want = _comparable(meta["config"]), _comparable(cfg)
  return [f"{s}.{k}" for s in want for k in want[s]
          if k in have.get(s, {}) and have[s][k] != want[s][k]]


def status(cell: Cell) -> str:
  """``done``, ``partial`` (its directory has something) or ``todo``."""
  if finished(cell.dir, cell.cfg["run"]["rounds"]):
    return "done"
  return "partial" if _started(cell.dir) else "todo"


def _batch_dir(root: str, cells: list[Cell]) -> str:
  digest = hashlib.sha1("\n".join(c.name for c in cells).encode()).hexdigest()[:12]
  return os.path.join(root, BATCH_PREFIX + digest)


def _unit(cells: list[Cell]) -> Unit:
  """The unit of ``cells``: a single cell in its own directory, several in a
  batch directory beside theirs, named by their names."""
  if len(cells) == 1:
    return Unit(cells, cells[0].cfg, cells[0].dir)
  d = _batch_dir(os.path.dirname(cells[0].dir), cells)
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
    key = (slots.signature(c.cfg) if c.cfg["method"]["name"] not in UNBATCHABLE_METHODS
           and not per_cell else f"alone:{c.index}")
    groups.setdefault(key, []).append(c)
  units = []
  for group in groups.values():
    cap = max_slots or group[0].cfg["exec"]["max_slots"] or math.inf
    chunk: list[Cell] = []
    for c in group:
      if chunk and sum(len(x.seeds) for x in chunk) + len(c.seeds) > cap:
        units.append(_unit(chunk))
        chunk = []
      chunk.append(c)
    units.append(_unit(chunk))
  units.sort(key=lambda u: min(c.index for c in u.cells))
  return units


def pending(units: list[Unit]) -> list[Unit]:
  """``units`` without their finished cells (a program whose cells are all
  done is dropped; one with some done trains the rest)."""
  out = []
  for u in units:
    todo = [c for c in u.cells if status(c) != "done"]
    if todo:
      out.append(u if len(todo) == len(u.cells) else _unit(todo))
  return out


# ---------------------------------------------------------------------------
# Running


def _unit_seeds(u: Unit) -> range:
  return range(u.cfg["run"]["seed"], u.cfg["run"]["seed"] + u.cfg["run"]["seeds"])


def _seed_text(seeds) -> str:
  seeds = list(seeds)
  return str(seeds[0]) if len(seeds) == 1 else f"{seeds[0]}-{seeds[-1]}"


def _mark_done(run_dir: str) -> None:
  with open(os.path.join(run_dir, DONE), "w") as f:
    f.write(time.strftime("%Y-%m-%dT%H:%M:%S%z") + "\n")


def split_batch(unit: Unit) -> list[str]:
  """Writes each cell of a finished program into its own run directory.

  metrics.jsonl keeps the program's lines of the cell byte for byte (they
  carry ``cell``); partition.json and method artifacts are the cell's;
  config.json is the cell's own config with a ``batched_with`` note;
  summary.json is computed as the runner computes it.  A cell whose slot
  diverged keeps the records before (with ``run.on_divergence = stop_run``
  only up to the round the divergence stopped it at), its summary names the
  seeds, and it gets no ``.done``.  Each cell appears complete or not at
  all: it is built aside and renamed.

  Returns:
    The names of the cells that diverged.
  """
  from jsfl import runner
  src = unit.dir
  meta = _read_json(os.path.join(src, "config.json"))
  summ = _read_json(os.path.join(src, "summary.json")) or {}
  own = {c["name"]: c["config"] for c in meta.get("cells", [])}
  lines = []
  with open(os.path.join(src, "metrics.jsonl")) as f:
    for line in f:
      try:
        lines.append((json.loads(line)["cell"], line))
      except (ValueError, KeyError, TypeError):
        continue  # not a record of a cell (the runner writes none such; a tool might)
  files = sorted(n for n in os.listdir(src) if n.endswith(".json") and os.path.isfile(
      os.path.join(src, n)) and n not in ("config.json", "summary.json"))
  diverged_cells = []
  for cell in unit.cells:
    diverged = {e["seed"]: e["round"] for e in summ.get("diverged", ())
                if e.get("cell") == cell.name}
    tmp = f"{cell.dir}.split{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
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
                               reading.cell_entries(_read_json(os.path.join(src, n)),
                                                    cell.name))
    art = os.path.join(src, runner.CELL_ARTIFACTS, cell.name)
    for n in sorted(os.listdir(art)) if os.path.isdir(art) else ():
      shutil.copyfile(os.path.join(art, n), os.path.join(tmp, n))
    mine = [line for c, line in lines if c == cell.name]
    if diverged and cell.cfg["run"]["on_divergence"] == "stop_run":
      stop = min(diverged.values())  # where a run of this cell alone would have stopped
      mine = [line for line in mine if json.loads(line)["round"] <= stop]
    with open(os.path.join(tmp, "metrics.jsonl"), "w") as f:
      f.writelines(mine)
    records = [{k: v for k, v in json.loads(line).items() if k != "cell"} for line in mine]
    rundir.write_json_atomic(os.path.join(tmp, "summary.json"),
                             runner._summary(cell.cfg, records, diverged))
    if diverged:
      diverged_cells.append(cell.name)
    else:
      _mark_done(tmp)
    if os.path.exists(cell.dir):
      shutil.rmtree(cell.dir)
    os.rename(tmp, cell.dir)
  return diverged_cells


def _train(unit: Unit, log) -> None:
  """Runs, resumes or finishes one unit and marks its cells done.

  Raises:
    Diverged: a slot diverged; in a program of several cells the others
      are split out and done first, and the message names the cells.
  """
  from jsfl import runner
  d, rounds = unit.dir, unit.cfg["run"]["rounds"]
  diverged = None
  if unit.batched and finished_run(d, rounds) and config_diff(d, unit.cfg) == [] \
      and _same_cells(d, unit):
    log("  program already trained; splitting it")
  else:
    resume = getattr(runner, "resume", None)
    resumed = False
    if (resume is not None and os.path.isdir(os.path.join(d, "checkpoints"))
        and config_diff(d, unit.cfg) == [] and _same_cells(d, unit)):
      log(f"  resuming {d}")
      kwargs = ({"progress": False} if not unit.cfg["exec"]["progress"]
                and "progress" in inspect.signature(resume).parameters else {})
      try:
        resume(d, **kwargs)
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
        runner.run(unit.cfg, cells=unit.cell_configs())
      except Diverged as e:
        if not unit.batched:
          raise
        diverged = e
    if diverged is None and not finished_run(d, rounds):
      raise RuntimeError(f"{d}: the run returned before evaluating round {rounds}")
    if not unit.batched:
      _mark_done(d)
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
                   "cells are done; allowed: a smaller optim.lr or a stabler method option",
                   (diverged.diverged if diverged is not None else {}), d)


def _same_cells(run_dir: str, unit: Unit) -> bool:
  """Whether a program's directory holds these cells with these configs."""
  meta = _read_json(os.path.join(run_dir, "config.json")) or {}
  have = meta.get("cells")
  if not unit.batched:
    return have is None
  if not isinstance(have, list) or [c.get("name") for c in have] != [
      c.name for c in unit.cells]:
    return False
  return all(_comparable(h["config"]) == _comparable(c.cfg) for h, c in zip(have, unit.cells))


def _accuracy_text(run_dir: str) -> str:
  summ = _read_json(os.path.join(run_dir, "summary.json")) or {}
  acc = summ.get("accuracy") or {}
  if acc.get("median") is None:
    return "accuracy -"
  std = acc.get("std")
  spread = f" +- {std:.2f}" if std is not None and len(acc.get("per_seed", ())) > 1 else ""
  return f"accuracy {acc['median']:.2f}{spread}"


def validate_units(sweep: Sweep, units: list[Unit], log=None) -> list[Unit]:
  """Checks what only the data, model and method can check (their options)
  with :func:`jsfl.runner.prepare`, for every program, before anything
  runs; then the memory guard: a program whose slots would not fit the
  device (:func:`jsfl.runner.fitting_slots`; ``exec.max_slots`` set skips
  the estimate) is cut into programs that do, whole cells each.

  Returns:
    The programs to run.
  """
  from jsfl import runner
  out = []
  for u in units:
    try:
      exp = runner.prepare(u.cfg, u.cell_configs())
    except UserError as e:
      names = getattr(e, "cell", None) or ", ".join(c.name for c in u.cells)
      raise SweepError(f"sweep {sweep.path}, cell {names}: {e}") from None
    fit = u.slots if u.cfg["exec"]["max_slots"] else runner.fitting_slots(exp)
    if u.slots <= fit or not u.batched:
      out.append(u)
      continue
    parts = plan(sweep, u.cells, max_slots=max(fit, 1))
    if log is not None:
      log(f"memory guard: {u.slots} slots of {u.cells[0].name} and {len(u.cells) - 1} "
          f"more cells would not fit the device (about {fit} do: "
          f"{runner.memory_text(exp)}); running them as {len(parts)} programs; set "
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
        f"[{i + 1}/{len(units)}] {names}: seeds {_seed_text(_unit_seeds(u))}")
    if u.batched:  # which cells a program holds, for --collect while it runs
      rundir.write_json_atomic(u.dir + ".json", {"cells": [c.name for c in u.cells]})
    try:
      _train(u, log)
    except UserError as e:  # a diverged cell, a locked directory: one line
      log(f"  FAILED {names if not u.batched else 'program'}: {' '.join(str(e).split())}")
    except Exception as e:  # noqa: BLE001 - one failing cell must not stop the others
      import traceback
      traceback.print_exc()
      log(f"  FAILED {names}: {type(e).__name__}: {e}")
    for c in u.cells:
      if status(c) == "done":
        log(f"  done {c.name}: {_accuracy_text(c.dir)} ({c.dir})")
      else:
        failed.append(c.name)
  return failed


# ---------------------------------------------------------------------------
# Collecting


def collect(sweep: Sweep):
  """One report over every cell with metrics, finished or not.

  Programs still training are read from their batch directory, a run per
  cell.  Cells that differ only in run.seed / run.seeds pool into one row
  (as ``jsfl report`` pools them); every other cell is its own row.

  Returns:
    The :class:`jsfl.report.Report`; cells without a run are listed in its
    ``problems``.
  """
  from jsfl import report
  paths, covered, notes = [], set(), []
  for side in sorted(glob.glob(os.path.join(glob.escape(sweep.root), BATCH_PREFIX + "*.json"))):
    block = _read_json(side)
    d = side[:-len(".json")]
    if not isinstance(block, dict) or not os.path.isdir(d):
      continue
    names = set(block.get("cells", ()))
    if not any(_started(c.dir) for c in sweep.cells if c.name in names):
      paths.append(d)  # still training (or killed): its cells, not yet split
      covered |= names
  for c in sweep.cells:
    if any(os.path.exists(os.path.join(c.dir, m)) for m in reading.RUN_MARKERS):
      paths.append(c.dir)
    elif c.name not in covered:
      notes.append(f"{c.dir}: cell {c.name} not started")
  rep = (report.build_report(paths, by=sweep.by, best_ma=sweep.best_ma,
                             reference=sweep.reference) if paths
         else report.Report([], [], {}, []))
  rep.problems += notes
  return rep


# ---------------------------------------------------------------------------
# The command


def main(path: str, shard_spec: str | None = None, collect_only: bool = False,
         dry_run: bool = False, quiet: bool = False, per_cell: bool = False) -> int:
  """``jsfl sweep``: runs (or lists, or collects) a sweep's cells.

  Args:
    path: the sweep file.
    shard_spec: ``"i/n"``: only programs ``i, i + n, ...`` (:func:`shard`).
    collect_only: report every cell into ``out_dir/name/collected`` instead.
    dry_run: list the cells with their status and what would run.
    quiet: no progress bars.
    per_cell: every cell its own program (no slots shared across cells).

  Returns:
    The exit code: 0, or 1 when a cell failed (the others still ran).

  Raises:
    SweepError: a bad sweep file, cell config or argument; nothing was written.
  """
  def log(msg):
    print(msg, flush=True)

  sweep = load_sweep(path)
  if collect_only:
    if shard_spec is not None:
      raise SweepError("--collect reads every cell; allowed: --collect without --shard")
    from jsfl import report
    try:
      rep = collect(sweep)
    except ValueError as e:  # a bad reference CSV
      raise SweepError(f"sweep {sweep.path}: {e}") from None
    for p in rep.problems:
      print(f"jsfl: warning: {p}", file=sys.stderr)
    print(report.to_markdown(rep, title=f"jsfl sweep {sweep.name}"))
    if not rep.rows:
      print(f"jsfl: no cell of {sweep.path} has metrics yet", file=sys.stderr)
      return 1
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
  if dry_run:
    _print_plan(sweep, mine, programs, (i, n), log)
    return 0
  units = validate_units(sweep, pending(programs), log)
  for c in mine:
    if status(c) == "done":
      diff = config_diff(c.dir, c.cfg)
      if diff:
        print(f"jsfl: warning: cell {c.name} finished with another config ("
              f"{', '.join(diff)}); delete {c.dir} to rerun it", file=sys.stderr)
  done = len(mine) - sum(len(u.cells) for u in units)
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


def _print_plan(sweep, mine, programs, shard_in, log) -> None:
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
    own = _static_text(u, programs)
    log(f"program {k + 1}: {len(u.cells)} cell{'s' * (len(u.cells) != 1)}, {u.slots} "
        f"slot{'s' * (u.slots != 1)} ({what}{'; ' + own if own else ''})")
    for c in u.cells:
      st = status(c)
      note = f"  seeds {_seed_text(c.seeds)}"
      if st != "done" and u.batched and _started(u.dir):
        st = "partial"
      elif st == "partial" and os.path.isdir(os.path.join(c.dir, "checkpoints")):
        note += "  has checkpoints/ (resumed)"
      log(f"  {st:<8} {c.name:<{width}}{note}".rstrip())
  cap = {u.cells[0].cfg["exec"]["max_slots"] for u in programs}
  if cap == {0}:
    log("(exec.max_slots = 0: a program too large for the device's memory is cut when "
        "the sweep runs)")
  log(f"{len(to_go)} program{'s' * (len(to_go) != 1)} to go")


def _static_text(unit: Unit, programs: list[Unit]) -> str:
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

