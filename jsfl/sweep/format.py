"""Reading a sweep file and expanding its cells (no jax); the format is the
package docstring's."""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import math
import os
from dataclasses import field
from typing import Any

from jsfl import config as config_lib

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


# A cell's directory name: at most this long, of these characters (besides
# letters and digits).
NAME_LIMIT = 60
NAME_CHARS = "._=,+-"
# --collect's folder beside the cells (jsfl.sweep.collect.COLLECTED)
NOT_CELL_NAMES = ("collected",)


class SweepError(config_lib.ConfigError):
  """A sweep file, cell config or argument that is not allowed (exit code 2)."""


@dataclasses.dataclass
class Cell:
  """One config of the sweep and its run directory."""

  index: int                    # position in the expanded list (shards cut it)
  name: str
  assigned: list[tuple[str, Any]]  # the cell's own section.key values
  dir: str
  cfg: dict = field(default_factory=dict)  # resolved by :func:`resolve`

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


def flatten(table: dict, where: str, path: str) -> list[tuple[str, Any]]:
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


def check_value(path: str, where: str, key: str, v) -> None:
  try:
    toml_value(v)
  except SweepError as e:
    raise SweepError(f"sweep {path}: {where} {key}: {e}") from None


SHORT = {f"{s}.name": s for s in ("method", "dataset", "partition", "model")}


def name_value(v) -> str:
  if isinstance(v, bool):
    return "true" if v else "false"
  if isinstance(v, list):
    return "-".join(name_value(x) for x in v)
  return repr(v) if isinstance(v, float) else str(v)


def safe(text: str) -> str:
  return "".join(c if c.isalnum() or c in NAME_CHARS else "_" for c in text)


def check_name(path: str, where: str, name) -> str:
  """A name the sweep file gives (a ``[[cells]]`` name, a grid value's label).

  Raises:
    SweepError: unless it is 1 to NAME_LIMIT ASCII letters, digits and
      NAME_CHARS, not starting with '.'.
  """
  if (not isinstance(name, str) or not name or len(name) > NAME_LIMIT
      or name.startswith(".") or not all(c.isascii() and (c.isalnum() or c in NAME_CHARS)
                                         for c in name)):
    raise SweepError(f"sweep {path}: {where} name {name!r}; allowed: 1 to {NAME_LIMIT} "
                     "letters, digits and '.', '_', '-', ',', '=', '+' (not starting "
                     "with '.')")
  return name


def cell_name(assigned: list[tuple[str, Any]], parts: list | None = None) -> str:
  """``[("method.name", "sfl"), ("partition.alpha", 0.1)]`` ->
  ``method=sfl,partition.alpha=0.1``, safe as a file name.

  ``parts``: the name's parts where a grid axis names its values, each a
  label (str) or a ``(key, value)`` pair; default: the assigned pairs.  A
  name over NAME_LIMIT characters is cut and ends with a hash of the whole.
  """
  name = safe(",".join(p if isinstance(p, str) else f"{SHORT.get(p[0], p[0])}={name_value(p[1])}"
                       for p in (assigned if parts is None else parts)))
  name = name or "base"
  if name.startswith("."):
    name = "_" + name[1:]
  if len(name) > NAME_LIMIT:
    digest = hashlib.sha1(name.encode()).hexdigest()[:10]
    name = f"{name[:NAME_LIMIT - 11]}-{digest}"
  return name


def load_sweep(path: str, out_dir: str | None = None) -> Sweep:
  """Reads a sweep file and expands its cells (configs not yet resolved).

  Args:
    path: the sweep TOML file.
    out_dir: instead of the file's ``sweep.out_dir`` (e.g. the directory
      where a sweep's committed results live, to list or collect them).

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
  if safe(name) != name or "," in name or "=" in name or name.startswith("."):
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
  out_dir = out_dir or head.get("out_dir", "runs")
  reference = beside("reference", "CSV")
  by = [k.strip() for k in head["by"].split(",") if k.strip()] if "by" in head else None
  if not isinstance(raw.get("base", {}), dict):
    raise SweepError(f"sweep {path}: base must be a table [base]")
  base_over = flatten(raw.get("base", {}), "[base]", path)
  for k, v in base_over:
    check_value(path, "[base]", k, v)

  grid = raw.get("grid", {})
  if not isinstance(grid, dict):
    raise SweepError(f"sweep {path}: grid must be a table [grid]")
  # An axis over a whole section: ``partition = [{name = "iid"}, {name =
  # "dirichlet", alpha = 0.1}]``, each value a set of that section's keys
  # (and of others', quoted as ``"optim.lr"``); or with named values,
  # ``[grid.partition]`` ``iid = {name = "iid"}``, whose names stand for
  # those keys in the cells' names.
  sections = {k: v for k, v in grid.items() if "." not in k and isinstance(v, list)
              and v and all(isinstance(x, dict) for x in v)}
  named = {k: v for k, v in grid.items() if "." not in k and isinstance(v, dict)
           and any(isinstance(x, dict) for x in v.values())}
  for k, v in grid.items():
    if ("." not in k and isinstance(v, list) and k not in sections
        and (not v or any(isinstance(x, dict) for x in v))):  # a section axis gone wrong
      raise SweepError(f"sweep {path}: [grid] {k}={v!r}; allowed: a section axis of "
                       f"tables only, e.g. {k} = [{{name = \"iid\"}}, {{name = \"dirichlet\", "
                       "alpha = 0.1}], or section.key = [values]")
    if k in named and not all(isinstance(x, dict) for x in v.values()):
      raise SweepError(f"sweep {path}: [grid.{k}] mixes named value sets and keys; "
                       f"allowed: [grid.{k}] of named tables only, e.g. iid = {{name = "
                       "\"iid\"}, or section.key = [values] in [grid]")
  axes = flatten({k: v for k, v in grid.items() if k not in sections and k not in named},
                 "[grid]", path)
  for k, values in axes:
    if not isinstance(values, list) or not values:
      raise SweepError(f"sweep {path}: [grid] {k}={values!r}; allowed: a non-empty "
                       f"list of values, e.g. {k} = [1, 2], or a section = [{{key = "
                       "value, ...}, ...]")
    for v in values:
      check_value(path, "[grid]", k, v)
  # each axis: its key and its values, a value being (pairs, label or None)
  axes = [(k, [([(k, v)], None) for v in values]) for k, values in axes]
  labelled: dict[str, list[tuple[str | None, Any]]] = {
    s: [(None, t) for t in ts] for s, ts in sections.items()}
  labelled.update({s: list(ts.items()) for s, ts in named.items()})
  for section, tables in labelled.items():
    sets = []
    for label, t in tables:
      if label is not None:
        check_name(path, f"[grid.{section}]", label)
      # quoted section.key entries set other sections for this value set
      # (FedAvg without the others' weight decay, as the authors' code has it)
      own = {k: v for k, v in t.items() if "." not in k}
      pairs = flatten({section: own, **{k: v for k, v in t.items() if "." in k}},
                      "[grid]", path)
      for k, v in pairs:
        check_value(path, "[grid]", k, v)
      sets.append((pairs, label))
    axes.append((section, sets))
  order = [f"{k}.{k2}" if isinstance(v, dict) and k not in named else k
           for k, v in grid.items()
           for k2 in (v if isinstance(v, dict) and k not in named else [None])]
  axes.sort(key=lambda a: order.index(a[0]))  # the file's order: last key fastest
  extra = raw.get("cells", [])
  if not isinstance(extra, list) or not all(isinstance(c, dict) for c in extra):
    raise SweepError(f"sweep {path}: cells must be tables [[cells]]")
  if not axes and not extra:
    raise SweepError(f"sweep {path}: no cells; allowed: a [grid] of section.key = "
                     "[values] and/or [[cells]] tables")
  # every cell: its assigned pairs and its name (given, or the parts it is made of)
  assigned: list[tuple[list, str | None, list | None]] = []
  if axes:
    for combo in itertools.product(*(sets for _, sets in axes)):
      pairs = [pair for ps, _ in combo for pair in ps]
      keys = [k for k, _ in pairs]
      twice = sorted({k for k in keys if keys.count(k) > 1})
      if twice:  # two axes (a value set and a key axis) setting one field
        raise SweepError(f"sweep {path}: [grid] sets {', '.join(twice)} on more than one "
                         "axis (a cell would take the last); allowed: each key on one "
                         "axis, or in one value set")
      parts = ([p for ps, label in combo for p in ([label] if label else ps)]
               if any(label for _, label in combo) else None)
      assigned.append((pairs, None, parts))
  for i, table in enumerate(extra):
    where = f"[[cells]] #{i + 1}"
    table = dict(table)
    given = check_name(path, where, table.pop("name")) if "name" in table else None
    over = flatten(table, where, path)
    for k, v in over:
      check_value(path, where, k, v)
    assigned.append((over, given, None))

  root = os.path.join(out_dir, name)
  cells: list[Cell] = []
  seen: dict[str, int] = {}
  for i, (a, given, parts) in enumerate(assigned):
    n = given or cell_name(a, parts)
    if n in NOT_CELL_NAMES:
      raise SweepError(f"sweep {path}: cell {i} is named {n!r}; not allowed: --collect "
                       "writes its tables there")
    if n in seen:
      raise SweepError(f"sweep {path}: cell {n!r} appears twice (cells "
                       f"{seen.get(n, '?')} and {i}); allowed: distinct cells and names")
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
    ok = 0 <= i < n
  except ValueError:
    ok = False
  if not ok:
    raise SweepError(f"--shard={text!r}; allowed: i/n with integers 0 <= i < n, e.g. "
                     "--shard 0/8 (Slurm: --shard $SLURM_ARRAY_TASK_ID/8)")
  return i, n
