"""Reading run directories as docs/run-directory.md promises them.

Only ``config.json``, ``metrics.jsonl`` and ``partition.json`` are read, with
neither jax nor the training code imported.  A damaged ``metrics.jsonl`` does
not stop a reader: every line that cannot be used is named (``FILE:LINE:
why``) and the rest is returned.  An archived run (``metrics.jsonl.gz``,
``partition.json.gz``: ``gzip -9n`` of the files, docs/run-directory.md) reads
as the run it was.
"""

from __future__ import annotations

import dataclasses
import gzip
import json
import os
import zlib
from collections.abc import Iterable

ARCHIVED = ".gz"
# What reading a plain or gzipped record file can raise besides bad JSON.
READ_ERRORS = (OSError, EOFError, zlib.error, UnicodeDecodeError)

# Record keys that must be numbers (or null) for a line to be used.
NUMERIC_KEYS = ("accuracy", "loss", "pg", "bw", "train_loss", "bytes_up", "bytes_down",
                "bytes_up_total", "bytes_down_total")


@dataclasses.dataclass
class Run:
  """What a report or a plot needs from one run directory."""

  path: str
  config: dict              # config.json["config"]; {} when unreadable
  resolved: dict            # config.json["resolved"]
  records: list[dict]       # the usable metrics.jsonl lines, in file order
  partition: dict | None    # partition.json; None when missing or unreadable
  problems: list[str]       # "FILE[:LINE]: why" for everything skipped

  @property
  def name(self) -> str:
    return os.path.basename(os.path.normpath(self.path))


def is_number(v) -> bool:
  return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_record(rec) -> str | None:
  """Why a parsed metrics line cannot be used, or None."""
  if not isinstance(rec, dict):
    return f"not a JSON object ({type(rec).__name__})"
  for k in ("seed", "round"):
    if k not in rec:
      return f"no {k!r} key"
  if not isinstance(rec["round"], int) or isinstance(rec["round"], bool):
    return f"round={rec['round']!r} is not an int"
  if not isinstance(rec["seed"], int) or isinstance(rec["seed"], bool):
    return f"seed={rec['seed']!r} is not an int"
  for k in NUMERIC_KEYS:
    v = rec.get(k)
    if v is not None and not is_number(v):
      return f"{k}={v!r} is not a number"
  for k in ("per_label_accuracy", "per_position_accuracy"):
    v = rec.get(k)
    if v is not None and not (isinstance(v, list)
                              and all(x is None or is_number(x) for x in v)):
      return f"{k} is not a list of numbers"
  return None


def record_file(run_dir: str, name: str) -> str:
  """The path of a run's ``name`` (``metrics.jsonl``, ``partition.json``):
  the plain file, else its archived ``.gz`` where only that is there."""
  path = os.path.join(run_dir, name)
  if not os.path.exists(path) and os.path.exists(path + ARCHIVED):
    return path + ARCHIVED
  return path


def is_archived(run_dir: str) -> bool:
  """The run's records are archived (``metrics.jsonl.gz`` without a plain
  ``metrics.jsonl``): readable, not resumable as they are."""
  return record_file(run_dir, "metrics.jsonl").endswith(ARCHIVED)


def open_text(path: str, errors: str = "strict"):
  """``path`` opened for reading UTF-8 text, gunzipped where it ends in
  ``.gz``."""
  if path.endswith(ARCHIVED):
    return gzip.open(path, "rt", encoding="utf-8", errors=errors)
  return open(path, encoding="utf-8", errors=errors)


def read_metrics_checked(path: str) -> tuple[list[dict], list[str]]:
  """Reads ``metrics.jsonl``, keeping every usable line and naming the others.

  A line is skipped when it is not valid JSON (e.g. the half-written last line
  of a killed run), not an object, lacks ``seed`` or ``round``, has a
  non-numeric metric, or repeats a seed and round already read.

  Args:
    path: the metrics file (``.gz``: archived).

  Returns:
    ``(records, problems)``: the usable records in file order and one
    ``"PATH:LINE: why; line skipped"`` per skipped line (or ``"PATH: why"``
    when the file cannot be read at all).
  """
  records: list[dict] = []
  problems: list[str] = []
  first_line: dict = {}
  try:
    with open_text(path, errors="replace") as f:
      lines = f.readlines()
  except READ_ERRORS as e:
    return [], [f"{path}: cannot be read ({getattr(e, 'strerror', None) or e})"]
  for lineno, line in enumerate(lines, 1):
    if not line.strip():
      continue
    try:
      rec = json.loads(line.rstrip("\n"))
    except json.JSONDecodeError as e:
      problems.append(f"{path}:{lineno}: not valid JSON ({e.msg}); line skipped")
      continue
    why = _check_record(rec)
    if why is None:
      ident = (rec["seed"], rec["round"], rec.get("cell"))
      if ident in first_line:
        why = (f"seed {ident[0]} round {ident[1]}"
               + (f" of cell {ident[2]}" if ident[2] is not None else "")
               + f" already read at line {first_line[ident]}")
      else:
        first_line[ident] = lineno
    if why is not None:
      problems.append(f"{path}:{lineno}: {why}; line skipped")
      continue
    records.append(rec)
  if not records and not problems:
    problems.append(f"{path}: no records (no round evaluated yet)")
  return records, problems


def _read_json(path: str, problems: list[str], required: bool) -> dict | None:
  if not os.path.exists(path):
    if required:
      problems.append(f"{path}: missing")
    return None
  try:
    with open_text(path) as f:
      obj = json.load(f)
  except (*READ_ERRORS, json.JSONDecodeError) as e:
    problems.append(f"{path}: cannot be read ({e})")
    return None
  if not isinstance(obj, dict):
    problems.append(f"{path}: not a JSON object")
    return None
  return obj


def load_run(path: str) -> Run:
  """Reads a run directory; whatever is missing or damaged goes to ``problems``."""
  problems: list[str] = []
  meta = _read_json(os.path.join(path, "config.json"), problems, required=True) or {}
  config: dict = meta["config"] if isinstance(meta.get("config"), dict) else {}
  resolved: dict = meta["resolved"] if isinstance(meta.get("resolved"), dict) else {}
  metrics_path = record_file(path, "metrics.jsonl")
  if os.path.exists(metrics_path):
    records, more = read_metrics_checked(metrics_path)
    problems += more
  else:
    records = []
    problems.append(f"{metrics_path}: missing; run skipped")
  partition = _read_json(record_file(path, "partition.json"), problems, required=False)
  summary = _read_json(os.path.join(path, "summary.json"), [], required=False) or {}
  diverged = {(d.get("cell"), d.get("seed")): d.get("round")
              for d in summary.get("diverged") or () if isinstance(d, dict)}
  if diverged:  # a seed's rounds before it diverged are no result of the config
    # an entry without a cell is a one-cell run's, whose records may still
    # carry the cell of the program it was split out of (jsfl sweep)
    records = [r for r in records if (r.get("cell"), r["seed"]) not in diverged
               and (None, r["seed"]) not in diverged]
    problems += [f"{path}: seed {s}{f' of cell {c}' if c is not None else ''} diverged at "
                 f"round {r} (summary.json); its records are left out"
                 for (c, s), r in sorted(diverged.items(), key=str)]
  return Run(path, config, resolved, records, partition, problems)


def cell_entries(obj, name: str):
  """A per-slot file (``partition.json``) of a program of several cells with
  only cell ``name``'s entries, their ``cell`` key dropped; anything else as
  it is."""
  if isinstance(obj, dict) and isinstance(obj.get("seeds"), list) and all(
      isinstance(e, dict) and "seed" in e for e in obj["seeds"]):
    return {**obj, "seeds": [{k: v for k, v in e.items() if k != "cell"}
                             for e in obj["seeds"] if e.get("cell") == name]}
  return obj


def load_runs(path: str) -> list[Run]:
  """The runs of a run directory: itself, or for a program of several cells
  (``jsfl sweep`` slots, still training) one run per cell, with that
  cell's config and records, named ``PATH/CELL``."""
  run = load_run(path)
  meta = _read_json(os.path.join(path, "config.json"), [], required=False) or {}
  cells = meta.get("cells")
  if not isinstance(cells, list):
    return [run]
  out: list[Run] = []
  for c in cells:
    if not isinstance(c, dict) or not isinstance(c.get("config"), dict):
      continue
    name = str(c.get("name"))
    out.append(Run(os.path.join(path, name), c["config"], run.resolved,
                   [r for r in run.records if r.get("cell") == name],
                   cell_entries(run.partition, name),
                   list(run.problems) if not out else []))
  return out


METRICS_FILES = ("metrics.jsonl", "metrics.jsonl" + ARCHIVED)
RUN_MARKERS = (*METRICS_FILES, "config.json")


def metrics_file_dir(path: str) -> str | None:
  """The run directory a path to a run's metrics file stands for (None: the
  path is no metrics file)."""
  if os.path.isfile(path) and os.path.basename(path) in METRICS_FILES:
    return os.path.dirname(path) or "."
  return None


def find_run_dirs(paths: Iterable[str]) -> tuple[list[str], list[str]]:
  """Run directories named by ``paths``, searching trees where needed.

  A directory holding ``metrics.jsonl`` or ``metrics.jsonl.gz`` (or
  ``config.json``: a run that has not evaluated yet, reported as such) is a
  run directory; any other directory is searched recursively (a collected
  sweep), not descending into run directories.  A path to a metrics file
  stands for its directory.

  Returns:
    ``(run_dirs, problems)``: run directories in argument order, each tree's
    in sorted order, without duplicates; problems name paths that are not
    directories or hold no run.
  """
  found, problems, seen = [], [], set()

  def add(d):
    key = os.path.realpath(d)
    if key not in seen:
      seen.add(key)
      found.append(d)

  for p in paths:
    if (d := metrics_file_dir(p)) is not None:
      add(d)
      continue
    if not os.path.isdir(p):
      problems.append(f"{p}: no such directory")
      continue
    any_run = False
    for root, dirs, files in os.walk(p):
      if any(m in files for m in RUN_MARKERS):
        add(root)
        any_run = True
        dirs[:] = []
        continue
      dirs[:] = sorted(d for d in dirs if not d.startswith("."))
    if not any_run:
      problems.append(f"{p}: no run directory (no metrics.jsonl) in it")
  return found, problems
