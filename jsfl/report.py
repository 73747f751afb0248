"""Tables from run directories: ``jsfl report`` and the table after ``jsfl run``.

Reading the directories is ``jsfl.reading``, the statistic
``jsfl.statistics``; this module groups runs and writes the tables.

A report reads only what docs/run-directory.md promises (``config.json``,
``metrics.jsonl``, ``partition.json``) and imports neither jax nor the
training code, so it runs anywhere the run directories were copied to.

The figures follow the papers (Hydra, SPEC 1.4): per seed the median of the
last 5 evaluated rounds, then the median and the (population) standard
deviation over seeds.  Runs are grouped by the config fields that differ
between them; runs whose configs agree on everything but their seeds (a sweep
split over several invocations) are pooled into one row, each (run, seed)
counting as one seed.

A damaged ``metrics.jsonl`` does not stop a report: every line that cannot be
used is named (``FILE:LINE: why``) and the rest is reported.

Example::

  rep = build_report(["runs/sweep"])
  print(to_markdown(rep))
  write_report(rep, "runs/sweep/report")   # report.md, report.csv, report_seeds.csv
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from jsfl.reading import Run, find_run_dirs, is_number, load_runs
from jsfl.statistics import (
  across_seeds,
  best_ma_figures,
  per_seed_figures,
  summarize,
)

# Metrics of the table: (record key, column title).
TABLE_METRICS = (("accuracy", "accuracy (%)"), ("pg", "PG (pp)"), ("bw", "BW (pp)"))
# Config fields that say how or where a run ran, not what it computed: they
# never split runs into groups (exec.* and the conv lowerings change speed,
# not the math; run.seed/seeds are what pooling merges).
IGNORED_FIELDS = frozenset({"run.name", "run.out_dir", "run.dir", "run.seed", "run.seeds",
                            "dataset.data_dir", "dataset.download", "model.conv_impl",
                            "model.depthwise_impl"})
IGNORED_SECTIONS = ("exec",)
MISSING = "-"  # a config field a run does not have (e.g. another method's option)


# ---------------------------------------------------------------------------
# Grouping


def _hashable(v):
  if isinstance(v, (list, tuple)):
    return json.dumps(v)
  if isinstance(v, dict):
    return json.dumps(v, sort_keys=True)
  return v


def flat_config(run: Run) -> dict[str, Any]:
  """``section.key -> value`` of the fields that define what a run computed.

  ``model.cut`` is the resolved cut (``-1`` means the model's default, so
  ``cut = -1`` and an explicit default cut are the same experiment).
  """
  if not run.config:
    return {"run.path": run.path}  # nothing to compare: the run is its own group
  flat = {}
  for section, values in run.config.items():
    if section in IGNORED_SECTIONS or not isinstance(values, dict):
      continue
    for k, v in values.items():
      key = f"{section}.{k}"
      if key not in IGNORED_FIELDS:
        flat[key] = _hashable(v)
  if "model.cut" in flat and isinstance(run.resolved.get("cut"), int):
    flat["model.cut"] = run.resolved["cut"]
  return flat


def short_names(keys: Sequence[str]) -> dict[str, str]:
  """Column titles: ``method.name -> method``, ``partition.p -> p`` where unique."""
  def short(k):
    section, _, field = k.partition(".")
    return section if field == "name" else field
  shorts = [short(k) for k in keys]
  return {k: (s if shorts.count(s) == 1 else k) for k, s in zip(keys, shorts)}


@dataclasses.dataclass
class Group:
  """Runs that agree on every compared config field, pooled."""

  values: dict[str, Any]    # the varying fields' values (the row's key)
  runs: list[Run]
  label: str = ""           # short text for tables and legends
  slug: str = ""            # file-name-safe label

  def records(self) -> list[dict]:
    """All records, the seed replaced by ``(run index, seed)`` so pooled runs
    that reuse a seed number stay apart."""
    return [{**r, "seed": (i, r["seed"])} for i, run in enumerate(self.runs)
            for r in run.records]

  def summary(self, keys=("accuracy", "loss", "pg", "bw"), last: int = 5) -> dict:
    return summarize(self.records(), keys, last)

  @property
  def config(self) -> dict:
    return self.runs[0].config


def _slug(text: str, limit: int = 60) -> str:
  out = "".join(c if c.isalnum() or c in "-." else "-" for c in text)
  while "--" in out:
    out = out.replace("--", "-")
  return out.strip("-")[:limit] or "run"


SECTION_ORDER = ("method", "dataset", "partition", "model", "run", "optim")


def _column_rank(key: str, keys: Sequence[str]) -> tuple:
  """Method first, then sections in SECTION_ORDER, each section's name first:
  a partition's options stand next to the partition."""
  section, _, field = key.partition(".")
  rank = SECTION_ORDER.index(section) if section in SECTION_ORDER else len(SECTION_ORDER)
  return (rank, field != "name", keys.index(key))


def group_runs(runs: Sequence[Run], by: Sequence[str] | None = None
               ) -> tuple[list[Group], list[str], dict[str, Any]]:
  """Groups runs by the config fields that differ between them.

  Args:
    runs: loaded runs.
    by: the fields to group by (``section.key``); default: every compared
      field whose value is not the same in all runs, plus ``method.name``.

  Returns:
    ``(groups, columns, shared)``: groups in the order their first run came,
    the grouping fields (``method.name`` first), and the fields every run
    shares with their common value.
  """
  flats = [flat_config(r) for r in runs]
  keys: list[str] = []
  for f in flats:
    keys += [k for k in f if k not in keys]
  if by:
    columns = list(by)
  else:
    columns = [k for k in keys
               if len({f.get(k, MISSING) for f in flats}) > 1 or k == "method.name"]
    columns.sort(key=lambda k: _column_rank(k, keys))
  shared = {k: flats[0][k] for k in keys if k not in columns
            and all(k in f and f[k] == flats[0][k] for f in flats)}
  names = short_names(columns)
  groups: dict[tuple, Group] = {}
  for run, f in zip(runs, flats):
    ident = tuple(f.get(k, MISSING) for k in columns)
    if ident not in groups:
      values = dict(zip(columns, ident))
      parts = [str(v) if k == "method.name" else f"{names[k]}={v}"
               for k, v in values.items() if v != MISSING]
      label = ", ".join(parts) or run.name
      groups[ident] = Group(values, [], label)
    groups[ident].runs.append(run)
  out = list(groups.values())
  for i, g in enumerate(out):
    g.slug = _slug(g.label) if len(out) == 1 else f"{i + 1:02d}_{_slug(g.label)}"
  return out, columns, shared


# ---------------------------------------------------------------------------
# The report


@dataclasses.dataclass
class Row:
  group: Group
  seeds: int
  rounds: str               # last evaluated round ("10" or "10-20" when pooled runs differ)
  stats: dict               # metric -> across_seeds(...) or None
  bytes_total: float | None  # median over seeds of the last bytes_up_total + bytes_down_total
  per_position: list | None  # median over seeds of the per-seed last-5 median per position
  per_seed: list[dict]       # one dict per (run, seed): run, seed, rounds, metrics, bytes


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
  for (i, _), r in zip(numbered[1:], rows):
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


def _fmt_reference(ref: dict | None) -> str:
  if ref is None or ref["reference"] is None:
    return "-"
  std = f" +- {ref['reference_std']:.2f}" if ref.get("reference_std") is not None else ""
  return f"{ref['reference']:.2f}{std}"


def _fmt_gap(row: Row, ref: dict | None) -> str:
  acc = (row.stats.get("accuracy") or {}).get("median")
  if ref is None or ref["reference"] is None or acc is None:
    return "-"
  return f"{acc - ref['reference']:+.2f}"


def _by_seed_number(row: Row, key: str) -> dict:
  out = {}
  for s in row.per_seed:
    if s["seed"] in out:
      raise ValueError(f"row {row.group.label!r} holds seed {s['seed']} twice (pooled "
                       "runs); a paired comparison needs one figure per seed number")
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
  per_seed = []
  for s in sorted(final):
    run = group.runs[s[0]]
    per_seed.append({"run": run.path, "seed": s[1], "rounds": final[s]["round"],
                     **{k: figures[k].get(s) for k in keys},
                     "bytes_total": totals.get(s),
                     "per_position": (pos_seed[s].tolist() if s in pos_seed else None)})
  return Row(group, len(figures["accuracy"]),
             "-" if not rounds else (str(rounds[0]) if len(rounds) == 1
                                     else f"{rounds[0]}-{rounds[-1]}"),
             stats, float(np.median(list(totals.values()))) if totals else None, pos,
             per_seed)


def _load(paths: Sequence[str], by: Sequence[str] | None) -> tuple[list[Run], list[str]]:
  """The runs under ``paths`` that have records, and every problem met."""
  dirs, problems = find_run_dirs(paths)
  runs = [r for d in dirs for r in load_runs(d)]
  for r in runs:
    problems += r.problems
  runs = [r for r in runs if r.records]
  if runs and by:
    known = set().union(*(flat_config(r) for r in runs))
    problems += [f"--by {k}: no run has this config field (allowed: section.key, "
                 "e.g. method.name)" for k in by if k not in known]
  return runs, problems


def build_report(paths: Sequence[str], by: Sequence[str] | None = None,
                 last: int = 5, paired_with: str | None = None,
                 best_ma: int = 0, reference: str | None = None) -> Report:
  """Finds, reads, groups and summarises the runs under ``paths``.

  Args:
    paths: run directories and/or trees holding run directories.
    by: grouping fields (``section.key``); default: the fields that differ.
    last: evaluated rounds per seed that enter its median.
    paired_with: a row (:func:`find_row`) every other row's accuracy is
      compared with seed by seed (:func:`paired_difference`).
    best_ma: if > 0, also the MultiSFL authors' figure: per seed the best
      ``best_ma``-round moving average of accuracy, then median +- std over
      seeds (:func:`best_moving_average`).
    reference: a reference CSV (:func:`read_reference`): the paper's figure
      of every row, shown beside jsfl's.

  Returns:
    The report; ``rows`` is empty when no run has a usable record.

  Raises:
    ValueError: when ``paired_with`` names no row, or several; a bad
      reference CSV.
  """
  runs, problems = _load(paths, by)
  if not runs:
    return Report([], [], {}, problems, last)
  groups, columns, shared = group_runs(runs, by)
  rep = Report([_row(g, last, best_ma) for g in groups], columns, shared, problems, last,
               best_ma=best_ma)
  if paired_with:
    ref = rep.rows[find_row(rep.rows, paired_with)]
    rep.paired_with = ref.group.label
    rep.paired = [None if r is ref else paired_difference(r, ref) for r in rep.rows]
  if reference:
    attach_reference(rep, reference)
  return rep


def load_groups(paths: Sequence[str], by: Sequence[str] | None = None
                ) -> tuple[list[Group], list[str]]:
  """Runs under ``paths`` that have records, grouped; plus the problems met."""
  runs, problems = _load(paths, by)
  return (group_runs(runs, by)[0] if runs else []), problems


# ---------------------------------------------------------------------------
# Rendering


def _fmt_stat(entry, digits: int = 2) -> str:
  if not entry or entry.get("median") is None or not math.isfinite(entry["median"]):
    return "-"
  std = entry.get("std")
  # One seed has no spread to show: "+- 0.00" would claim a precision it lacks.
  if std is None or not math.isfinite(std) or len(entry.get("per_seed") or ()) == 1:
    return f"{entry['median']:.{digits}f}"
  return f"{entry['median']:.{digits}f} +- {std:.{digits}f}"


def format_bytes(n: float | None) -> str:
  """``1234567 -> '1.23 MB'`` (decimal units, as network traffic is counted)."""
  if n is None:
    return "-"
  for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
    if abs(n) >= scale:
      return f"{n / scale:.3g} {unit}"
  return f"{n:.0f} B"


def _fmt_paired(p: dict | None) -> str:
  if not p:
    return "-"
  return f"{p['median']:+.2f} ({p['ahead']} of {len(p['seeds'])})"


def _fmt_value(v) -> str:
  if v is None:
    return "-"
  return '""' if v == "" else str(v)


def to_markdown(rep: Report, title: str = "jsfl report") -> str:
  """The report as markdown: the shared settings, the table, per-position
  accuracy of cyclic runs, the runs behind each row, and what was skipped."""
  lines = [f"# {title}", ""]
  if not rep.rows:
    lines += ["No run with a usable metrics.jsonl was found.", ""]
  else:
    nruns = sum(len(r.group.runs) for r in rep.rows)
    lines += [(f"{nruns} run{'s' * (nruns != 1)}, {len(rep.rows)} row"
               f"{'s' * (len(rep.rows) != 1)}. Per seed the median of the last {rep.last} "
               "evaluated rounds, then median +- std (population) over seeds; accuracy in "
               "%, PG and BW in percentage points; communication is bytes up + down per "
               "seed over the whole run."), ""]
    if rep.shared:
      names = short_names(list(rep.shared))
      lines += [("Config: " if len(rep.rows) == 1 else "Shared by every row: ") + ", ".join(
          f"{names[k]}={_fmt_value(v)}" for k, v in rep.shared.items()) + ".", ""]
    names = short_names(rep.columns)
    head = [names[c] for c in rep.columns] + ["seeds", "rounds"] + \
        [t for _, t in TABLE_METRICS] + ["communication"]
    if rep.best_ma:
      head.append(f"accuracy, best {rep.best_ma}-round MA")
    if rep.paired is not None:
      head.append(f"paired accuracy vs {rep.paired_with}")
    if rep.reference is not None:
      head += ["reference accuracy (%)", "jsfl - reference"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, row in enumerate(rep.rows):
      cells = [_fmt_value(row.group.values[c]) for c in rep.columns] + \
          [str(row.seeds), row.rounds] + [_fmt_stat(row.stats[k]) for k, _ in TABLE_METRICS] + \
          [format_bytes(row.bytes_total)]
      if rep.best_ma:
        cells.append(_fmt_stat(row.stats.get("best_ma")))
      if rep.paired is not None:
        cells.append(_fmt_paired(rep.paired[i]))
      if rep.reference is not None:
        cells += [_fmt_reference(rep.reference[i]), _fmt_gap(row, rep.reference[i])]
      lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    if rep.reference is not None:
      lines += ["Reference: " + " ".join(rep.reference_notes or ["the reference CSV's figures."]),
                ""]
    if rep.best_ma:
      lines += [(f"Best {rep.best_ma}-round MA: per seed the largest mean of "
                 f"{rep.best_ma} consecutive evaluated rounds' accuracy (shorter windows "
                 "at the start count), as the MultiSFL authors report a run; then median "
                 "+- std over seeds."), ""]
    if rep.paired is not None:
      lines += [(f"Paired: per seed number the row's accuracy minus {rep.paired_with}'s "
                 "(same partition and initial model), the median of those differences, "
                 "and in how many of the shared seeds the row is ahead."), ""]
    pos = [r for r in rep.rows if r.per_position]
    if pos:
      width = max(len(r.per_position) for r in pos)
      lines += ["## Per-position accuracy (%)", "",
                ("Cyclic order: position k is the k-th label served in every batch step; "
                 f"per seed the median of the last {rep.last} evaluated rounds, then the "
                 "median over seeds."), "",
                "| row | " + " | ".join(str(k + 1) for k in range(width)) + " |",
                "| --- |" + " --- |" * width]
      for r in pos:
        cells = [f"{v:.1f}" for v in r.per_position] + [""] * (width - len(r.per_position))
        lines.append(f"| {r.group.label} | " + " | ".join(cells) + " |")
      lines.append("")
    lines += ["## Runs", ""]
    for r in rep.rows:
      lines.append(f"- {r.group.label}: " + ", ".join(f"`{run.path}`" for run in r.group.runs))
    lines.append("")
  if rep.problems:
    lines += ["## Skipped", ""] + [f"- {p}" for p in rep.problems] + [""]
  return "\n".join(lines)


def _num(v) -> str:
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return ""
  return repr(v) if isinstance(v, float) else str(v)


def write_csv(rep: Report, path: str) -> None:
  """One row per table row: grouping fields, seeds, median and std per metric."""
  metrics = [k for k, _ in TABLE_METRICS] + ["loss"] + (["best_ma"] if rep.best_ma else [])
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    pair_cols = ([] if rep.paired is None else
                 ["paired_with", "paired_accuracy_median", "paired_ahead", "paired_seeds"])
    ref_cols = [] if rep.reference is None else list(REFERENCE_VALUES)
    w.writerow(rep.columns + ["seeds", "rounds"]
               + [f"{k}_{s}" for k in metrics for s in ("median", "std")]
               + ["bytes_total_median", "runs"] + pair_cols + ref_cols)
    for i, row in enumerate(rep.rows):
      pair = []
      if rep.paired is not None:
        p = rep.paired[i] or {}
        pair = [rep.paired_with, _num(p.get("median")), _num(p.get("ahead")),
                _num(len(p["seeds"]) if p else None)]
      w.writerow([_fmt_value(row.group.values[c]) for c in rep.columns]
                 + [row.seeds, row.rounds]
                 + [_num((row.stats[k] or {}).get(s)) for k in metrics for s in ("median", "std")]
                 + [_num(row.bytes_total), ";".join(run.path for run in row.group.runs)]
                 + pair + ([] if rep.reference is None else
                           [_num((rep.reference[i] or {}).get(k)) for k in REFERENCE_VALUES]))


def write_seed_csv(rep: Report, path: str) -> None:
  """One row per (run, seed): its figures before the median over seeds."""
  metrics = [k for k, _ in TABLE_METRICS] + ["loss"]
  with open(path, "w", newline="") as f:
    w = csv.writer(f)
    w.writerow(rep.columns + ["run", "seed", "rounds"] + metrics + ["bytes_total"])
    for row in rep.rows:
      for s in row.per_seed:
        w.writerow([_fmt_value(row.group.values[c]) for c in rep.columns]
                   + [s["run"], s["seed"], s["rounds"]] + [_num(s[k]) for k in metrics]
                   + [_num(s["bytes_total"])])


def write_report(rep: Report, out_dir: str) -> list[str]:
  """Writes ``report.md``, ``report.csv`` and ``report_seeds.csv``; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = [os.path.join(out_dir, n) for n in ("report.md", "report.csv", "report_seeds.csv")]

  def markdown(path):
    with open(path, "w") as f:
      f.write(to_markdown(rep))
  # Each file is written beside itself and renamed: a reader never sees half a table.
  for path, write in zip(paths, (markdown, lambda p: write_csv(rep, p),
                                 lambda p: write_seed_csv(rep, p))):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
      write(tmp)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  return paths


# ---------------------------------------------------------------------------
# The one-run table printed after ``jsfl run``


def _fmt(entry) -> str:
  return _fmt_stat(entry)


def summary_table(run_dir: str) -> str:
  """A markdown row of a run's summary: median +- std over seeds."""
  with open(os.path.join(run_dir, "summary.json")) as f:
    s = json.load(f)
  with open(os.path.join(run_dir, "config.json")) as f:
    c = json.load(f)["config"]
  cols = ("accuracy", "pg", "bw", "loss")
  label = (f"{c['method']['name']} / {c['partition']['name']} / "
           f"{c['dataset']['name']} / {c['model']['name']}")
  lines = ["| run | seeds | " + " | ".join(cols) + " |",
           "| --- | --- | " + " | ".join("---" for _ in cols) + " |",
           f"| {label} | {len(s['seeds'])} | "
           + " | ".join(_fmt(s.get(k)) for k in cols) + " |"]
  return "\n".join(lines)
