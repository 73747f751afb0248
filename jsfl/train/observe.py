"""What watches a run from outside the loop: experiment trackers
(``run.trackers``) and the JAX profiler (``run.profile``)."""

from __future__ import annotations

import json
import os
import sys

import jax

from jsfl import config as config_lib
from jsfl import trackers
from jsfl.train.lifecycle import CELL_ARTIFACTS
from jsfl.train.records import warn

PROFILE_DIR = "profile"


def make_trackers(cfg: dict, exp, out: str, start: int, writes: bool) -> trackers.Trackers:
  """One tracker run per slot (none where this process does not write the
  run).  A program of several cells writes each cell's tracker files under
  ``cells/<cell>/``, which the sweep moves into the cell's own run
  directory."""
  run = config_lib.typed(cfg).run
  # config.json's run_id: the same tracker runs after a resume, also of a
  # directory moved or reached by another path (runs from before it: the path)
  uid = run_id(out) if writes else None
  uid = uid or os.path.abspath(out)
  slots = [trackers.Slot(s.cell, s.seed, s.cfg, run.name,
                         out if s.cell is None else os.path.join(out, CELL_ARTIFACTS, s.cell),
                         uid=uid)
           for s in exp.slots]
  return trackers.Trackers(run.trackers if writes else [], slots, warn, start)


def run_id(out: str) -> str | None:
  """The ``run_id`` a run's config.json holds (None: a run from before it)."""
  try:
    with open(os.path.join(out, "config.json")) as f:
      meta = json.load(f)
  except (OSError, ValueError):
    return None
  return meta.get("run_id") if isinstance(meta, dict) else None


class Profile:
  """A JAX profiler trace of rounds ``first..last`` (1-based, ``run.profile``)
  into ``RUN_DIR/profile``: XProf / TensorBoard read its ``.xplane.pb``,
  Perfetto its ``.trace.json.gz``."""

  def __init__(self, rounds: list[int], out: str, enabled: bool):
    self.first, self.last = rounds if rounds and enabled else (0, -1)
    self.dir, self.on = os.path.join(out, PROFILE_DIR), False

  def before(self, r: int) -> None:
    """Before 0-based round ``r`` runs."""
    if not self.on and self.first <= r + 1 <= self.last:
      jax.profiler.start_trace(self.dir, create_perfetto_trace=True)
      self.on = True

  def after(self, r: int) -> None:
    """After round ``r``'s results are on the host (its work is finished)."""
    if self.on and r + 1 >= self.last:
      self.stop()
      print(f"jsfl: profile of rounds {self.first}-{self.last} in {self.dir}",
            file=sys.stderr, flush=True)

  def stop(self) -> None:
    if self.on:
      self.on = False
      jax.profiler.stop_trace()
