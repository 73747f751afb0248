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

Seed blocks: cells whose resolved configs differ only in ``run.seed`` /
``run.seeds`` and whose seed ranges are contiguous and disjoint (e.g. a grid
over ``run.seed = [0, 5, 10]`` with ``run.seeds = 5``) run as one program over
the union of their seeds (the seed axis of one compiled program) in
``out_dir/name/.batch-<hash>``; its records are then split back into the
cells' own directories by seed and the batch directory is removed.  Any other
difference (a learning rate, a method, a partition) is static to the compiled
round, so those cells compile one program each; they run in one process, so
the interpreter, jax and the compilation machinery start once.
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
from jsfl import rundir
from jsfl.errors import Diverged, RunDirError, UserError

SWEEP_KEYS = {"name": "the sweep's name (directory under out_dir)",
              "base": "base config TOML, relative to the sweep file",
              "out_dir": "parent of the sweep's directory (default 'runs')"}
TABLES = ("sweep", "base", "grid", "cells")
# The sweep decides where every cell's run directory lies.
RESERVED = ("run.dir", "run.out_dir")
DONE = ".done"
COLLECTED = "collected"
BATCH_PREFIX = ".batch-"
# Fields that say where or how visibly a run ran: ignored when comparing a
# cell's config with the one its directory holds, and when merging cells.
WHERE_FIELDS = (("run", "dir"), ("run", "name"), ("run", "out_dir"), ("exec", "progress"))
# Methods whose random draws would depend on the padded client width, so a
# merged run's wider table would change a seed's numbers: their seed blocks
# run one program each.  Empty since MultiSFL's replay pool draws per client
# row (tests/test_multisfl.py::test_class_pool_ignores_padding_width).
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

  @property
  def root(self) -> str:
    return os.path.join(self.out_dir, self.name)


@dataclasses.dataclass
class Unit:
  """What one call of the runner trains: one cell, or a seed block of cells."""

  cells: list[Cell]
  cfg: dict
  dir: str

  @property
  def batched(self) -> bool:
    return len(self.cells) > 1


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
    if not isinstance(v, str) or not v:
      raise SweepError(f"sweep {path}: sweep.{k}={v!r}; allowed: a non-empty string")
  name = head.get("name")
  if name is None:
    raise SweepError(f"sweep {path}: sweep.name is missing; allowed: a name of "
                     "letters, digits, '.', '_', '-'")
  if _safe(name) != name or "," in name or "=" in name or name.startswith("."):
    raise SweepError(f"sweep {path}: sweep.name={name!r}; allowed: letters, digits, "
                     "'.', '_', '-' (not starting with '.')")
  base = head.get("base")
  if base is not None:
    base = os.path.normpath(os.path.join(os.path.dirname(path), base))
    if not os.path.isfile(base):
      raise SweepError(f"sweep {path}: sweep.base={head['base']!r} ({base}) does not "
                       "exist; allowed: a config TOML path relative to the sweep file")
  out_dir = head.get("out_dir", "runs")
  if not isinstance(raw.get("base", {}), dict):
    raise SweepError(f"sweep {path}: base must be a table [base]")
  base_over = _flatten(raw.get("base", {}), "[base]", path)
  for k, v in base_over:
    _check_value(path, "[base]", k, v)

  grid = raw.get("grid", {})
  if not isinstance(grid, dict):
    raise SweepError(f"sweep {path}: grid must be a table [grid]")
  axes = _flatten(grid, "[grid]", path)
  for k, values in axes:
    if not isinstance(values, list) or not values:
      raise SweepError(f"sweep {path}: [grid] {k}={values!r}; allowed: a non-empty "
                       f"list of values, e.g. {k} = [1, 2]")
    for v in values:
      _check_value(path, "[grid]", k, v)
  extra = raw.get("cells", [])
  if not isinstance(extra, list) or not all(isinstance(c, dict) for c in extra):
    raise SweepError(f"sweep {path}: cells must be tables [[cells]]")
  if not axes and not extra:
    raise SweepError(f"sweep {path}: no cells; allowed: a [grid] of section.key = "
                     "[values] and/or [[cells]] tables")
  assigned = []
  if axes:
    keys = [k for k, _ in axes]
    assigned += [list(zip(keys, combo)) for combo in
                 itertools.product(*(values for _, values in axes))]
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
  return Sweep(path, name, base, out_dir, base_over, cells)


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


def shard(cells: list[Cell], i: int, n: int) -> list[Cell]:
  """Cells ``i, i + n, i + 2n, ...``: every cell in exactly one of n shards."""
  return cells[i::n]


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


def _comparable(cfg: dict, drop_seeds: bool = False) -> dict:
  cfg = copy.deepcopy(cfg)
  for s, k in WHERE_FIELDS + ((("run", "seed"), ("run", "seeds")) if drop_seeds else ()):
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


def _batch_dir(sweep: Sweep, cells: list[Cell]) -> str:
  digest = hashlib.sha1("\n".join(c.name for c in cells).encode()).hexdigest()[:12]
  return os.path.join(sweep.root, BATCH_PREFIX + digest)


def plan(sweep: Sweep, cells: list[Cell]) -> list[Unit]:
  """The runs that train the unfinished ``cells``, in cell order.

  Cells whose configs agree on everything but ``run.seed`` / ``run.seeds``
  (and where they run) merge when their seed ranges are contiguous and
  disjoint: sorted by first seed, each starts where the previous one ends.
  """
  groups: dict[str, list[Cell]] = {}
  for c in cells:
    if status(c) != "done":
      key = json.dumps(_comparable(c.cfg, drop_seeds=True), sort_keys=True, default=str)
      groups.setdefault(key, []).append(c)
  units = []
  for group in groups.values():
    chains: list[list[Cell]] = []
    for c in sorted(group, key=lambda c: (c.cfg["run"]["seed"], c.index)):
      prev = chains[-1][-1] if chains else None
      if (prev is not None and c.cfg["method"]["name"] not in UNBATCHABLE_METHODS
          and c.seeds.start == prev.seeds.stop):
        chains[-1].append(c)
      else:
        chains.append([c])
    for chain in chains:
      if len(chain) == 1:
        units.append(Unit(chain, chain[0].cfg, chain[0].dir))
        continue
      chain.sort(key=lambda c: c.seeds.start)
      d = _batch_dir(sweep, chain)
      cfg = copy.deepcopy(chain[0].cfg)
      cfg["run"]["seeds"] = chain[-1].seeds.stop - chain[0].seeds.start
      cfg["run"]["dir"] = d
      units.append(Unit(chain, cfg, d))
  units.sort(key=lambda u: min(c.index for c in u.cells))
  return units


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


def _filter_seeds(obj, seeds):
  """A method artifact or partition.json with only ``seeds``' entries."""
  if isinstance(obj, dict) and isinstance(obj.get("seeds"), list) and all(
      isinstance(e, dict) and "seed" in e for e in obj["seeds"]):
    return {**obj, "seeds": [e for e in obj["seeds"] if e["seed"] in seeds]}
  return obj


def split_batch(unit: Unit) -> None:
  """Writes each cell of a finished seed block into its own run directory.

  metrics.jsonl keeps the block's lines of the cell's seeds byte for byte;
  partition.json and method artifacts keep the cell's seeds; config.json gets
  the cell's run.seed / run.seeds / run.dir and a ``batched_with`` note;
  summary.json is recomputed as the runner computes it.  Each cell appears
  complete (with ``.done``) or not at all: it is built aside and renamed.
  """
  from jsfl.statistics import summarize
  src = unit.dir
  meta = _read_json(os.path.join(src, "config.json"))
  lines = []
  with open(os.path.join(src, "metrics.jsonl")) as f:
    for line in f:
      try:
        lines.append((json.loads(line)["seed"], line))
      except (ValueError, KeyError, TypeError):
        continue  # not a record (the runner writes none such; a tool might)
  files = sorted(n for n in os.listdir(src) if n.endswith(".json") and os.path.isfile(
      os.path.join(src, n)) and n not in ("config.json", "summary.json"))
  for cell in unit.cells:
    seeds = set(cell.seeds)
    tmp = f"{cell.dir}.split{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    os.makedirs(tmp)
    m = copy.deepcopy(meta)
    m["config"]["run"].update(seed=cell.seeds.start, seeds=len(cell.seeds), dir=cell.dir)
    m.setdefault("resolved", {})["seeds"] = list(cell.seeds)
    m["batched_with"] = {
        "cells": [c.name for c in unit.cells if c is not cell],
        "seed": unit.cfg["run"]["seed"], "seeds": unit.cfg["run"]["seeds"],
        "note": ("ran as one program over the seeds of these cells (jsfl sweep); "
                 "records split by seed; max_client_size and wall_s are the "
                 "merged run's")}
    rundir.write_json_atomic(os.path.join(tmp, "config.json"), m)
    for n in files:
      rundir.write_json_atomic(os.path.join(tmp, n),
                               _filter_seeds(_read_json(os.path.join(src, n)), seeds))
    mine = [line for s, line in lines if s in seeds]
    with open(os.path.join(tmp, "metrics.jsonl"), "w") as f:
      f.writelines(mine)
    records = [json.loads(line) for line in mine]
    rundir.write_json_atomic(os.path.join(tmp, "summary.json"), {
        "method": cell.cfg["method"]["name"],
        "rounds_evaluated": max(r["round"] for r in records),
        "seeds": sorted({r["seed"] for r in records}), **summarize(records)})
    _mark_done(tmp)
    if os.path.exists(cell.dir):
      shutil.rmtree(cell.dir)
    os.rename(tmp, cell.dir)


def _train(unit: Unit, log) -> None:
  """Runs, resumes or finishes one unit and marks it done."""
  from jsfl import runner
  d, rounds = unit.dir, unit.cfg["run"]["rounds"]
  if unit.batched and finished(d, rounds):
    log("  seed block already trained; splitting it")
  else:
    resume = getattr(runner, "resume", None)
    resumed = False
    if (resume is not None and os.path.isdir(os.path.join(d, "checkpoints"))
        and config_diff(d, unit.cfg) == []):
      log(f"  resuming {d}")
      kwargs = ({"progress": False} if not unit.cfg["exec"]["progress"]
                and "progress" in inspect.signature(resume).parameters else {})
      try:
        resume(d, **kwargs)
        resumed = True
      except (RunDirError, Diverged):  # another process writes it / a real result
        raise
      except Exception as e:  # noqa: BLE001 - a broken checkpoint costs a rerun, not the sweep
        log(f"  resume failed ({type(e).__name__}: {e}); rerunning from scratch")
    if not resumed:
      if os.path.exists(d):
        rundir.RunLock(d).acquire().release()  # never delete a run another process writes
        shutil.rmtree(d)  # a partial run we cannot continue
      runner.run(unit.cfg)
    if not finished_run(d, rounds):
      raise RuntimeError(f"{d}: the run returned before evaluating round {rounds}")
    _mark_done(d)
  if unit.batched:
    split_batch(unit)
    shutil.rmtree(d)
    try:
      os.remove(d + ".json")
    except FileNotFoundError:
      pass


def _accuracy_text(run_dir: str) -> str:
  summ = _read_json(os.path.join(run_dir, "summary.json")) or {}
  acc = summ.get("accuracy") or {}
  if acc.get("median") is None:
    return "accuracy -"
  std = acc.get("std")
  spread = f" +- {std:.2f}" if std is not None and len(acc.get("per_seed", ())) > 1 else ""
  return f"accuracy {acc['median']:.2f}{spread}"


def validate_units(sweep: Sweep, units: list[Unit]) -> None:
  """Checks what only the data, model and method can check (their options)
  with :func:`jsfl.runner.prepare`, for every unit, before anything runs."""
  from jsfl import runner
  for u in units:
    try:
      runner.prepare(u.cfg)
    except UserError as e:
      names = ", ".join(c.name for c in u.cells)
      raise SweepError(f"sweep {sweep.path}, cell {names}: {e}") from None


def run_units(sweep: Sweep, units: list[Unit], log) -> list[str]:
  """Trains every unit; returns the names of the cells that failed."""
  os.makedirs(sweep.root, exist_ok=True)
  failed = []
  for i, u in enumerate(units):
    names = ", ".join(c.name for c in u.cells)
    log(f"[{i + 1}/{len(units)}] {names}: seeds {_seed_text(_unit_seeds(u))}")
    if u.batched:  # which cells a block holds, for --collect while it runs
      rundir.write_json_atomic(u.dir + ".json", {"cells": [c.name for c in u.cells]})
    try:
      _train(u, log)
    except UserError as e:  # a diverged cell, a locked directory: one line
      log(f"  FAILED {names}: {' '.join(str(e).split())}")
      failed += [c.name for c in u.cells]
      continue
    except Exception as e:  # noqa: BLE001 - one failing cell must not stop the others
      import traceback
      traceback.print_exc()
      log(f"  FAILED {names}: {type(e).__name__}: {e}")
      failed += [c.name for c in u.cells]
      continue
    for c in u.cells:
      log(f"  done {c.name}: {_accuracy_text(c.dir)} ({c.dir})")
  return failed


# ---------------------------------------------------------------------------
# Collecting


def collect(sweep: Sweep):
  """One report over every cell with metrics, finished or not.

  Seed blocks still training are read from their batch directory.  Cells
  that differ only in run.seed / run.seeds pool into one row (as
  ``jsfl report`` pools them); every other cell is its own row.

  Returns:
    The :class:`jsfl.report.Report`; cells without a run are listed in its
    ``problems``.
  """
  from jsfl import reading, report
  paths, covered, notes = [], set(), []
  for side in sorted(glob.glob(os.path.join(glob.escape(sweep.root), BATCH_PREFIX + "*.json"))):
    block = _read_json(side)
    d = side[:-len(".json")]
    if not isinstance(block, dict) or not os.path.isdir(d):
      continue
    names = set(block.get("cells", ()))
    if not any(_started(c.dir) for c in sweep.cells if c.name in names):
      paths.append(d)  # still training (or killed): its seeds, not yet split
      covered |= names
  for c in sweep.cells:
    if any(os.path.exists(os.path.join(c.dir, m)) for m in reading.RUN_MARKERS):
      paths.append(c.dir)
    elif c.name not in covered:
      notes.append(f"{c.dir}: cell {c.name} not started")
  rep = (report.build_report(paths) if paths
         else report.Report([], [], {}, []))
  rep.problems += notes
  return rep


# ---------------------------------------------------------------------------
# The command


def main(path: str, shard_spec: str | None = None, collect_only: bool = False,
         dry_run: bool = False, quiet: bool = False) -> int:
  """``jsfl sweep``: runs (or lists, or collects) a sweep's cells.

  Args:
    path: the sweep file.
    shard_spec: ``"i/n"``: only cells ``i, i + n, ...``.
    collect_only: report every cell into ``out_dir/name/collected`` instead.
    dry_run: list the cells with their status and what would run.
    quiet: no progress bars.

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
    rep = collect(sweep)
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
  mine = shard(sweep.cells, i, n)
  if quiet:
    for c in mine:
      c.cfg["exec"]["progress"] = False
  units = plan(sweep, mine)
  if dry_run:
    _print_plan(sweep, mine, units, (i, n), log)
    return 0
  validate_units(sweep, units)
  for c in mine:
    if status(c) == "done":
      diff = config_diff(c.dir, c.cfg)
      if diff:
        print(f"jsfl: warning: cell {c.name} finished with another config ("
              f"{', '.join(diff)}); delete {c.dir} to rerun it", file=sys.stderr)
  done = len(mine) - sum(len(u.cells) for u in units)
  log(f"sweep {sweep.name}: {len(mine)} cells" + (f" (shard {i}/{n} of {len(sweep.cells)})"
                                                  if n > 1 else "")
      + f", {done} done, {len(units)} run{'s' * (len(units) != 1)} to go -> {sweep.root}")
  failed = run_units(sweep, units, log)
  if failed:
    print(f"jsfl: error: {len(failed)} cell{'s' * (len(failed) != 1)} failed: "
          + ", ".join(failed), file=sys.stderr)
    return 1
  return 0


def _print_plan(sweep, mine, units, shard_in, log) -> None:
  i, n = shard_in
  unit_of = {c.name: u for u in units for c in u.cells}
  log(f"sweep {sweep.name}: {len(sweep.cells)} cells"
      + (f", shard {i}/{n}: {len(mine)}" if n > 1 else "") + f" -> {sweep.root}")
  width = max(len(c.name) for c in mine) if mine else 0
  for c in mine:
    st = status(c)
    u = unit_of.get(c.name)
    note = ""
    if u is not None and u.batched:
      st = "partial" if _started(u.dir) else st
      note = (f"  batched: seeds {_seed_text(c.seeds)} of one run over "
              f"{_seed_text(_unit_seeds(u))} with {len(u.cells) - 1} other "
              f"cell{'s' * (len(u.cells) != 2)}")
    elif st == "partial" and os.path.isdir(os.path.join(c.dir, "checkpoints")):
      note = "  has checkpoints/ (resumed where jsfl.runner.resume exists)"
    log(f"  {st:<8} {c.name:<{width}}{note}".rstrip())
  log(f"{len(units)} run{'s' * (len(units) != 1)} to go")
