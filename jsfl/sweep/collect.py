"""One report over a sweep's cells, finished or still training (no jax)."""

from __future__ import annotations

import os

from jsfl import reading
from jsfl.sweep.format import Sweep
from jsfl.sweep.plan import programs_on_disk

COLLECTED = "collected"


def collect(sweep: Sweep):
  """One report over every cell with metrics, finished or not.

  A cell is read from its own directory once it has one, else from the
  program on disk that holds it (still training, or killed), a run per
  cell; when several programs hold it (the plan changed since one started:
  :func:`jsfl.sweep.plan.programs_on_disk`), from the one written last,
  so no seed counts twice; the others are named among the problems.  Only
  the sweep's current cells are read.  Cells that differ only in run.seed /
  run.seeds pool into one row (as ``jsfl report`` pools them); every other
  cell is its own row.

  Returns:
    The :class:`jsfl.report.Report`; cells without a run are listed in its
    ``problems``.
  """
  from jsfl import report
  progs = programs_on_disk(sweep.root)
  paths, runs, notes = [], set(), []
  for c in sweep.cells:
    if any(os.path.exists(os.path.join(c.dir, m)) for m in reading.RUN_MARKERS):
      paths.append(c.dir)
      runs.add(os.path.normpath(c.dir))
      continue
    holders = [p for p in progs if c.name in p.cells]
    if not holders:
      notes.append(f"{c.dir}: cell {c.name} not started")
      continue
    src = max(holders, key=lambda p: p.written)
    runs.add(os.path.normpath(os.path.join(src.dir, c.name)))
    if src.dir not in paths:
      paths.append(src.dir)
    notes += [f"{p.dir}: its records of cell {c.name} are left out; {src.dir} trained "
              "that cell later (the sweep's plan changed; delete the older program to "
              "free its disk)" for p in holders if p is not src]
  rep = (report.build_report(paths, by=sweep.by, best_ma=sweep.best_ma,
                             reference=sweep.reference, only=runs) if paths
         else report.Report([], [], {}, []))
  rep.problems += notes
  return rep
