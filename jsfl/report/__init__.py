"""Tables from run directories: ``jsfl report`` and the table after ``jsfl run``.

Reading the directories is ``jsfl.reading``, the statistic
``jsfl.statistics``; this package groups runs
(:mod:`~jsfl.report.groups`), computes each group's row
(:mod:`~jsfl.report.rows`) and writes the tables
(:mod:`~jsfl.report.formats`).

A report reads only what docs/run-directory.md promises (``config.json``,
``metrics.jsonl``, ``partition.json``) and imports neither jax nor the
training code, so it runs anywhere the run directories were copied to.

The figures follow the papers (Hydra, docs/setting.md#metrics): per seed the median of the
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

from jsfl.report.formats import (
  format_bytes,
  summary_table,
  to_markdown,
  write_csv,
  write_report,
  write_seed_csv,
)
from jsfl.report.groups import (
  IGNORED_FIELDS,
  IGNORED_SECTIONS,
  MISSING,
  Group,
  flat_config,
  group_runs,
  method_options,
  short_names,
)
from jsfl.report.rows import (
  REFERENCE_VALUES,
  TABLE_METRICS,
  Report,
  Row,
  UnknownField,
  attach_reference,
  build_report,
  find_row,
  load_groups,
  paired_difference,
  per_position_figures,
  read_reference,
)

__all__ = [
  "IGNORED_FIELDS", "IGNORED_SECTIONS", "MISSING", "REFERENCE_VALUES", "TABLE_METRICS",
  "Group", "Report", "Row", "UnknownField", "attach_reference", "build_report", "find_row",
  "flat_config",
  "format_bytes", "group_runs", "load_groups", "method_options", "paired_difference",
  "per_position_figures",
  "read_reference", "short_names", "summary_table", "to_markdown", "write_csv",
  "write_report", "write_seed_csv",
]
