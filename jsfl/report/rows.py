"""A report's rows: the papers' statistic of every group, a reference column
and paired differences."""

from __future__ import annotations

import csv
import dataclasses
import math
import os
from collections.abc import Collection, Sequence
from typing import Any

import numpy as np

from jsfl.errors import UserError
from jsfl.reading import Run, find_run_dirs, is_number, load_runs
from jsfl.report.groups import Group, flat_config, group_runs, method_options
from jsfl.statistics import (
  across_seeds,
  best_ma_figures,
  check_last,
  collapsed_seeds,
  per_seed_figures,
)

# Metrics of the table: (record key, column title).
TABLE_METRICS = (("accuracy", "accuracy (%)"), ("pg", "PG (pp)"), ("bw", "BW (pp)"))


@dataclasses.dataclass
class Row:
  group: Group
  seeds: int
  rounds: str               # last evaluated round ("10" or "10-20" when pooled runs differ)
  stats: dict               # metric -> across_seeds(...) or None
  bytes_total: float | None  # median over seeds of the last bytes_up_total + bytes_down_total
  per_position: list | None  # median over seeds of the per-seed last-5 median per position
  per_seed: list[dict]       # one dict per (run, seed): run, seed, rounds, metrics, bytes,
                             # collapsed_from (first round of an unrecovered one-class collapse)


@dataclasses.dataclass
class Report:
  rows: list[Row]
  columns: list[str]
  shared: dict[str, Any]
  problems: list[str]
  last: int = 5
  paired_with: str = ""     # label of the reference row of ``paired`` ("" = none)
  paired: list | None = None  # per row: paired_difference(...) against it, or None
  best_ma: int = 0          # > 0: rows also carry stats["best_ma"] over this window
  reference: list | None = None  # per row: its reference figure (read_reference) or None
  reference_notes: list = dataclasses.field(default_factory=list)  # the CSV's # lines
  # columns the method fixes (groups.method_options): named once per method
  # in text, still columns of the CSV
  fixed: list = dataclasses.field(default_factory=list)


def find_row(rows: Sequence[Row], spec: str) -> int:
  """The index of the row ``spec`` names: its exact label, else the one row
  whose label contains ``spec``, else the one row holding a run whose path
  ends with ``spec``.

  Raises:
    ValueError: naming ``spec`` and the row labels when none or several match.
  """
  labels = [r.group.label for r in rows]
  for hits in ([i for i, lab in enumerate(labels) if lab == spec],
               [i for i, lab in enumerate(labels) if spec in lab],
               [i for i, r in enumerate(rows) if any(
                   os.path.normpath(run.path).endswith(os.path.normpath(spec))
                   for run in r.group.runs)]):
    if len(hits) == 1:
      return hits[0]
    if len(hits) > 1:
      raise ValueError(f"paired reference {spec!r} matches rows "
                       f"{[labels[i] for i in hits]}; allowed: one row's label or run")
  raise ValueError(f"paired reference {spec!r} matches no row; allowed: a row label "
                   f"({labels}) or a run directory of one")


REFERENCE_VALUES = ("reference", "reference_std")


def read_reference(path: str) -> tuple[list[dict], list[str]]:
  """A reference CSV: the published figure of every cell of a table.

  Lines starting with ``#`` are notes (the source: paper, table, setting),
  printed under the table.  The header names config fields (``section.key``)
  that identify a row, then ``reference`` (the published figure, accuracy
  in %) and optionally ``reference_std``; an empty field matches any value.

  Raises:
    ValueError: one line naming the file and what is wrong.
  """
  try:
    with open(path, newline="", encoding="utf-8") as f:
      lines = f.read().splitlines()
  except OSError as e:
    raise ValueError(f"--reference={path!r}: cannot be read ({e.strerror or e})") from None
  except UnicodeDecodeError:
    raise ValueError(f"--reference={path!r} is not UTF-8 text; allowed: a CSV file "
                     "(docs/reading-results.md)") from None
  notes = [ln.lstrip("#").strip() for ln in lines if ln.startswith("#")]
  numbered = [(n, ln) for n, ln in enumerate(lines, 1)
              if ln.strip() and not ln.startswith("#")]
  rows = list(csv.DictReader([ln for _, ln in numbered]))
  head = next(csv.reader([numbered[0][1]])) if numbered else []  # rows may be none yet
  keys = [k for k in head if k not in REFERENCE_VALUES]
  if "reference" not in head or not keys or any(k.count(".") != 1 for k in keys):
    raise ValueError(f"--reference={path!r}: header {head}; allowed: config fields "
                     "(section.key, e.g. method.name) then reference and optionally reference_std")
  out = []
  for (i, _), r in zip(numbered[1:], rows, strict=False):
    try:
      vals = {k: float(r[k]) if r.get(k) not in (None, "") else None
              for k in REFERENCE_VALUES}
    except ValueError:
      raise ValueError(f"--reference={path!r}: line {i}: reference={r.get('reference')!r}; "
                       "allowed: a number") from None
    out.append({"match": {k: r[k] for k in keys if r.get(k) not in (None, "")}, **vals,
                "line": i})
  return out, notes


def _matches(config_value, text: str) -> bool:
  if config_value is None:
    return False
  if isinstance(config_value, bool):
    return text.lower() == str(config_value).lower()
  if isinstance(config_value, (int, float)):
    try:
      return math.isclose(float(text), float(config_value), rel_tol=1e-9)
    except ValueError:
      return False
  return str(config_value) == text


def attach_reference(rep: Report, path: str) -> None:
  """Gives every row the reference figure whose fields its config matches
  (``rep.reference``); reference lines no row matches, and rows two lines
  match, go to ``rep.problems``."""
  ref, notes = read_reference(path)
  rep.reference_notes = notes
  rep.reference = []
  used = set()
  for row in rep.rows:
    flat = flat_config(row.group.runs[0])
    hits = [i for i, r in enumerate(ref)
            if all(_matches(flat.get(k), v) for k, v in r["match"].items())]
    if len(hits) > 1:
      rep.problems.append(f"{path}: lines {[ref[h]['line'] for h in hits]} all match row "
                          f"{row.group.label!r}; the first is used")
    rep.reference.append(ref[hits[0]] if hits else None)
    used.update(hits[:1])
  unused = [r for i, r in enumerate(ref) if i not in used]
  if len(unused) == 1:
    where = ", ".join(f"{k}={v}" for k, v in unused[0]["match"].items())
    rep.problems.append(f"{path}: line {unused[0]['line']} ({where}) matches no run")
  elif unused:  # a whole paper table against the rows of one model, say
    rep.problems.append(f"{path}: {len(unused)} lines match no run (lines "
                        f"{unused[0]['line']}-{unused[-1]['line']})")


def _by_seed_number(row: Row, key: str) -> dict:
  out, seen = {}, set()
  for s in row.per_seed:
    # refused even where one of the two has no figure: which run's seed a
    # pairing meant would depend on which runs happen to have values
    if s["seed"] in seen:
      raise ValueError(f"row {row.group.label!r} holds seed {s['seed']} twice (pooled "
                       "runs); a paired comparison needs one figure per seed number")
    seen.add(s["seed"])
    if s[key] is not None:
      out[s["seed"]] = s[key]
  return out


def paired_difference(row: Row, ref: Row, key: str = "accuracy") -> dict | None:
  """Per-seed differences ``row - ref`` over the seed numbers both rows have.

  Methods run with the same seed number share the partition and the initial
  model, so the per-seed difference removes most of the seed-to-seed spread
  that the rows' own stds carry (the papers' paired reading of 5-10 seeds).

  Args:
    row, ref: report rows; each seed number must occur once per row.
    key: the per-seed figure compared (``accuracy``, ``pg``, ``bw``).

  Returns:
    ``{"median", "ahead", "behind", "seeds", "diffs"}``: the median of the
    differences, how many seeds have ``row`` above / below ``ref``, the
    shared seed numbers and their differences; None when no seed is shared.
  """
  a, b = _by_seed_number(row, key), _by_seed_number(ref, key)
  seeds = sorted(set(a) & set(b))
  if not seeds:
    return None
  diffs = [a[s] - b[s] for s in seeds]
  return {"median": float(np.median(diffs)), "ahead": sum(d > 0 for d in diffs),
          "behind": sum(d < 0 for d in diffs), "seeds": seeds, "diffs": diffs}


def _last_record_per_seed(records):
  last = {}
  for r in records:
    if r["seed"] not in last or r["round"] > last[r["seed"]]["round"]:
      last[r["seed"]] = r
  return last


def per_position_figures(records, last: int) -> tuple[dict, list | None]:
  """Per seed the median over its last evaluated rounds of each position."""
  check_last(last)
  by_seed: dict[Any, list] = {}
  for r in records:
    pp = r.get("per_position_accuracy")
    if pp and all(is_number(v) for v in pp):
      by_seed.setdefault(r["seed"], []).append((r["round"], pp))
  per_seed = {}
  for s, rows in by_seed.items():
    rows = [pp for _, pp in sorted(rows, key=lambda rp: rp[0])[-last:]]
    if len({len(pp) for pp in rows}) == 1:
      per_seed[s] = np.median(np.asarray(rows, float), axis=0)
  if not per_seed or len({len(v) for v in per_seed.values()}) != 1:
    return per_seed, None
  return per_seed, np.median(np.stack(list(per_seed.values())), axis=0).tolist()


def _row(group: Group, last: int, best_ma: int = 0) -> Row:
  recs = group.records()
  keys = [k for k, _ in TABLE_METRICS] + ["loss"] + (["best_ma"] if best_ma else [])
  figures = {k: per_seed_figures(recs, k, last) for k in keys if k != "best_ma"}
  if best_ma:
    figures["best_ma"] = best_ma_figures(recs, best_ma)
  stats = {k: across_seeds(figures[k]) for k in keys}
  final = _last_record_per_seed(recs)
  totals = {s: r["bytes_up_total"] + r["bytes_down_total"] for s, r in final.items()
            if is_number(r.get("bytes_up_total")) and is_number(r.get("bytes_down_total"))}
  rounds = sorted({r["round"] for r in final.values()})
  pos_seed, pos = per_position_figures(recs, last)
  collapsed = collapsed_seeds(recs)
  per_seed = []
  for s in sorted(final):
    run = group.runs[s[0]]
    per_seed.append({"run": run.path, "seed": s[1], "rounds": final[s]["round"],
                     **{k: figures[k].get(s) for k in keys},
                     "bytes_total": totals.get(s),
                     "per_position": (pos_seed[s].tolist() if s in pos_seed else None),
                     "collapsed_from": collapsed.get(s)})
  return Row(group, len(figures["accuracy"]),
             "-" if not rounds else (str(rounds[0]) if len(rounds) == 1
                                     else f"{rounds[0]}-{rounds[-1]}"),
             stats, float(np.median(list(totals.values()))) if totals else None, pos,
             per_seed)


class UnknownField(UserError, ValueError):
  """A grouping field that no run's config has (a typo, most likely)."""


def _load(paths: Sequence[str], by: Sequence[str] | None,
          strict_by: bool = False,
          only: Collection[str] | None = None) -> tuple[list[Run], list[str]]:
  """The runs under ``paths`` that have records, and every problem met (with
  ``strict_by``, a ``by`` field no run has raises :class:`UnknownField`;
  ``only``: just the runs of these paths)."""
  dirs, problems = find_run_dirs(paths)
  runs = []
  for d in dirs:
    found = load_runs(d)  # a program's problems ride on its first cell's run
    kept = [r for r in found if only is None or os.path.normpath(r.path) in only]
    if kept:
      problems += [m for r in found for m in r.problems]
      runs += kept
  runs = [r for r in runs if r.records]
  if runs and by:
    known = set().union(*(flat_config(r) for r in runs))
    unknown = [k for k in by if k not in known]
    if unknown and strict_by:
      raise UnknownField(f"--by {unknown[0]}: no run has this config field; allowed: "
                         "a section.key of the runs' config, e.g. method.name")
    problems += [f"--by {k}: no run has this config field (allowed: section.key, "
                 "e.g. method.name)" for k in unknown]
  return runs, problems


def build_report(paths: Sequence[str], by: Sequence[str] | None = None,
                 last: int = 5, paired_with: str | None = None,
                 best_ma: int = 0, reference: str | None = None,
                 strict_by: bool = False, only: Collection[str] | None = None) -> Report:
  """Finds, reads, groups and summarises the runs under ``paths``.

  Args:
    paths: run directories and/or trees holding run directories.
    by: grouping fields (``section.key``); default: the fields that differ.
    last: evaluated rounds per seed that enter its median.
    paired_with: a row (:func:`find_row`) every other row's accuracy is
      compared with seed by seed (:func:`paired_difference`).
    best_ma: if > 0, also the MultiSFL authors' figure: per seed the best
      ``best_ma``-round moving average of accuracy, then median +- std over
      seeds (:func:`jsfl.statistics.best_moving_average`).
    reference: a reference CSV (:func:`read_reference`): the paper's figure
      of every row, shown beside jsfl's.
    strict_by: a ``by`` field that no run has raises (a typo on the command
      line) rather than being noted among the problems (a sweep's field
      whose cells have not started yet).
    only: normalised run paths (``os.path.normpath``; a cell of a program
      is ``PROGRAM/CELL``): report these runs of ``paths`` and no other
      (``jsfl sweep --collect``: each cell from one place).

  Returns:
    The report; ``rows`` is empty when no run has a usable record.

  Raises:
    ValueError: when ``paired_with`` names no row, or several; under
      ``strict_by``, a ``by`` field no run has; a bad
      reference CSV; a ``last`` below 1 (:func:`jsfl.statistics.per_seed_figures`).
  """
  runs, problems = _load(paths, by, strict_by, only)
  if not runs:
    return Report([], [], {}, problems, last)
  groups, columns, shared = group_runs(runs, by)
  rep = Report([_row(g, last, best_ma) for g in groups], columns, shared, problems, last,
               best_ma=best_ma,
               fixed=[] if by else method_options([g.values for g in groups], columns))
  if paired_with:
    ref = rep.rows[find_row(rep.rows, paired_with)]
    rep.paired_with = ref.group.label
    rep.paired = [None if r is ref else paired_difference(r, ref) for r in rep.rows]
  if reference:
    attach_reference(rep, reference)
  return rep


def load_groups(paths: Sequence[str], by: Sequence[str] | None = None,
                strict_by: bool = False) -> tuple[list[Group], list[str]]:
  """Runs under ``paths`` that have records, grouped; plus the problems met
  (``strict_by`` as :func:`build_report`'s)."""
  runs, problems = _load(paths, by, strict_by)
  return (group_runs(runs, by)[0] if runs else []), problems
