"""Tables from run directories (``jsfl report`` builds on this)."""

from __future__ import annotations

import json
import os


def _fmt(entry) -> str:
  if not entry or entry.get("median") is None:
    return "-"
  std = entry.get("std")
  return f"{entry['median']:.2f} +- {std:.2f}" if std is not None else f"{entry['median']:.2f}"


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
