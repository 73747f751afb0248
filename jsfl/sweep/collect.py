"""One report over a sweep's cells, finished or still training (no jax)."""

from __future__ import annotations

import glob
import os

from jsfl import reading
from jsfl.sweep.format import Sweep
from jsfl.sweep.plan import BATCH_PREFIX, read_json, started

COLLECTED = "collected"


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
    block = read_json(side)
    d = side[:-len(".json")]
    if not isinstance(block, dict) or not os.path.isdir(d):
      continue
    names = set(block.get("cells", ()))
    if not any(started(c.dir) for c in sweep.cells if c.name in names):
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
