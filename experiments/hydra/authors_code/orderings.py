#!/usr/bin/env python3
"""Pairwise orderings of a `jsfl report` table with a reference column.

For every pair of rows whose reference medians differ by more than the
larger of the two rows' reference seed spreads (population std), checks
that jsfl orders the pair the same way.  Prints one line per such pair and
a summary; exit 1 when an ordering flips.

Usage: python3 orderings.py REPORT_CSV [REPORT_CSV ...]
       (the report.csv that `jsfl sweep FILE --collect` writes)
"""

from __future__ import annotations

import csv
import itertools
import sys

KEYS = ("method.name", "method.order", "method.batches_per_turn", "method.groups")


def label(row):
  return ", ".join(f"{k.split('.')[-1]}={row[k]}" for k in KEYS
                   if row.get(k) not in (None, "", "-"))


def main(paths):
  rows = [r for p in paths for r in csv.DictReader(open(p))
          if r.get("reference") not in (None, "")]
  checked = flipped = 0
  for a, b in itertools.combinations(rows, 2):
    ref = float(a["reference"]) - float(b["reference"])
    if abs(ref) <= max(float(a["reference_std"]), float(b["reference_std"])):
      continue
    ours = float(a["accuracy_median"]) - float(b["accuracy_median"])
    same = (ours > 0) == (ref > 0)
    checked += 1
    flipped += not same
    print(f"{'same ' if same else 'FLIP '} {label(a)} vs {label(b)}: "
          f"reference {ref:+.2f}, jsfl {ours:+.2f}")
  print(f"{checked} separated pairs, {flipped} flipped")
  return 1 if flipped else 0


if __name__ == "__main__":
  sys.exit(main(sys.argv[1:]))
