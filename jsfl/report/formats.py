"""A report as markdown and CSV, and the one-run table printed after
``jsfl run``."""

from __future__ import annotations

import csv
import json
import math
import os

from jsfl.reading import read_metrics_checked, record_file
from jsfl.report.groups import MISSING, short_names
from jsfl.report.rows import REFERENCE_VALUES, TABLE_METRICS, Report, Row
from jsfl.statistics import collapsed_seeds


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
    if abs(float(f"{n:.3g}")) >= scale:  # 999,950 B rounds to 1 MB, not to "1e+03 kB"
      shown = float(f"{n / scale:.3g}")
      return f"{shown:.3g} {unit}" if abs(shown) < 1000 else f"{shown:.0f} {unit}"
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
    by_method = {}
    for row in rep.rows:
      own = {k: row.group.values[k] for k in rep.fixed if row.group.values[k] != MISSING}
      if own:
        by_method[row.group.values["method.name"]] = own
    if by_method:
      names = short_names(rep.fixed)
      lines += ["Options their method fixes: " + "; ".join(
          f"{m}: " + ", ".join(f"{names[k]}={_fmt_value(v)}" for k, v in own.items())
          for m, own in by_method.items()) + ".", ""]
    shown = [c for c in rep.columns if c not in rep.fixed]
    figures = ["seeds", "rounds"] + [t for _, t in TABLE_METRICS] + ["communication"]
    names = short_names(shown, taken=figures)
    head = [names[c] for c in shown] + figures
    if rep.best_ma:
      head.append(f"accuracy, best {rep.best_ma}-round MA")
    if rep.paired is not None:
      head.append(f"paired accuracy vs {rep.paired_with}")
    if rep.reference is not None:
      head += ["reference accuracy (%)", "jsfl - reference"]
    lines += ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for i, row in enumerate(rep.rows):
      cells = [_fmt_value(row.group.values[c]) for c in shown] + \
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
      width = max(len(r.per_position or ()) for r in pos)
      lines += ["## Per-position accuracy (%)", "",
                ("Cyclic order: position k is the k-th label served in every batch step; "
                 f"per seed the median of the last {rep.last} evaluated rounds, then the "
                 "median over seeds."), "",
                "| row | " + " | ".join(str(k + 1) for k in range(width)) + " |",
                "| --- |" + " --- |" * width]
      for r in pos:
        per = r.per_position or []
        cells = [f"{v:.1f}" for v in per] + [""] * (width - len(per))
        lines.append(f"| {r.group.label} | " + " | ".join(cells) + " |")
      lines.append("")
    collapsed = [(r, [s for s in r.per_seed if s["collapsed_from"] is not None])
                 for r in rep.rows]
    if any(c for _, c in collapsed):
      lines += ["## Collapsed seeds", "",
                ("Seeds whose model gives (nearly) every test sample one label "
                 "(accuracy >= 99% on one label, <= 1% on every other) from the round "
                 "named to their last "
                 "evaluation. Their training loss is finite, so they are not diverged "
                 "seeds: their records are in the figures above."), ""]
      lines += [f"- {r.group.label}: " + ", ".join(
          f"seed {s['seed']} from round {s['collapsed_from']}" for s in c)
          + f" ({len(c)} of {len(r.per_seed)})" for r, c in collapsed if c]
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
    w.writerow(rep.columns + ["run", "seed", "rounds"] + metrics
               + ["bytes_total", "collapsed_from"])
    for row in rep.rows:
      for s in row.per_seed:
        w.writerow([_fmt_value(row.group.values[c]) for c in rep.columns]
                   + [s["run"], s["seed"], s["rounds"]] + [_num(s[k]) for k in metrics]
                   + [_num(s["bytes_total"]), _num(s["collapsed_from"])])


def write_report(rep: Report, out_dir: str) -> list[str]:
  """Writes ``report.md``, ``report.csv`` and ``report_seeds.csv``; returns their paths."""
  os.makedirs(out_dir, exist_ok=True)
  paths = [os.path.join(out_dir, n) for n in ("report.md", "report.csv", "report_seeds.csv")]

  def markdown(path):
    with open(path, "w") as f:
      f.write(to_markdown(rep))
  # Each file is written beside itself and renamed: a reader never sees half a table.
  for path, write in zip(paths, (markdown, lambda p: write_csv(rep, p),
                                 lambda p: write_seed_csv(rep, p)), strict=True):
    tmp = f"{path}.tmp{os.getpid()}"
    try:
      write(tmp)
      os.replace(tmp, path)
    finally:
      if os.path.exists(tmp):
        os.remove(tmp)
  return paths


# The one-run table printed after ``jsfl run``.
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
  records, _ = read_metrics_checked(record_file(run_dir, "metrics.jsonl"))
  collapsed = collapsed_seeds(records)
  if collapsed:  # finite losses, so the divergence check let them through
    lines += ["", "Collapsed (one predicted label to the last evaluation; in the figures): "
              + ", ".join(f"seed {k} from round {r}" for k, r in sorted(collapsed.items()))]
  return "\n".join(lines)
