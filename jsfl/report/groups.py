"""Which runs make one row: runs grouped by the config fields that differ
between them, runs that differ only in their seeds pooled."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from jsfl.reading import Run
from jsfl.statistics import (
  summarize,
)

# Config fields that say how or where a run ran, not what it computed: they
# never split runs into groups (exec.* and the conv lowerings change speed,
# not the math; run.seed/seeds are what pooling merges).
# Fields that do not change what a healthy run computes (where it writes, how
# it is watched, when a failing seed is stopped), so runs that differ only in
# them, or predate them, are one group.
IGNORED_FIELDS = frozenset({"run.name", "run.out_dir", "run.dir", "run.seed", "run.seeds",
                            "run.trackers", "run.profile", "run.divergence_loss",
                            "run.on_divergence", "run.checkpoint_every",
                            "run.step_confusion", "run.step_confusion_rounds",
                            "run.step_confusion_steps",
                            "dataset.data_dir", "dataset.download", "dataset.path",
                            "model.conv_impl", "model.eval_conv_impl",
                            "model.depthwise_impl", "model.im2col_grad",
                            "model.im2col_narrow"})
IGNORED_SECTIONS = ("exec",)
# exec keys that change what a run computes, not only how it runs
COMPARED_EXEC_FIELDS = frozenset({"exec.precision"})
# keys added after runs were written, at the value those runs computed: a
# run with that value groups with the runs that do not have the key
ADDED_AT = {"exec.precision": "float32", "optim.name": "sgd",
            "optim.weight_decay_scope": "all",
            # ExDir's (Dirichlet's has always been written, at this default)
            "partition.min_size": 10}
MISSING = "-"  # a config field a run does not have (e.g. another method's option)


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
    if not isinstance(values, dict):
      continue
    for k, v in values.items():
      key = f"{section}.{k}"
      if section in IGNORED_SECTIONS and key not in COMPARED_EXEC_FIELDS:
        continue
      if key not in IGNORED_FIELDS and not (key in ADDED_AT and v == ADDED_AT[key]):
        flat[key] = _hashable(v)
  if "model.cut" in flat and isinstance(run.resolved.get("cut"), int):
    flat["model.cut"] = run.resolved["cut"]
  return flat


# Fields whose bare name reads as something else in a report: a table's
# "seed" is the run's seed, so partition.seed keeps its section.
QUALIFIED = ("seed",)


def short_names(keys: Sequence[str], taken: Sequence[str] = ()) -> dict[str, str]:
  """Column titles: ``method.name -> method``, ``partition.p -> p`` where unique
  among ``keys`` and not one of the table's own columns (``taken``: a table's
  "rounds" is the last evaluated round, so run.rounds keeps its section)."""
  def short(k):
    section, _, field = k.partition(".")
    if field in QUALIFIED:
      return k
    return section if field == "name" else field
  shorts = [short(k) for k in keys]
  return {k: (s if shorts.count(s) == 1 and s not in taken else k)
          for k, s in zip(keys, shorts, strict=True)}


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


# A plot file is <prefix>_NN_<slug>.png: "confusion_steps_" + "NN_" + 37 +
# ".png" keeps every name within a sweep cell's 60 characters.
SLUG_LIMIT = 37


def _slug(text: str, limit: int = SLUG_LIMIT) -> str:
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


def method_options(values: Sequence[dict], columns: Sequence[str]) -> list[str]:
  """The ``method.*`` columns that the method fixes: options only some
  methods have, or that every run of a method sets alike.  They split no
  group the method does not, so a table names them once per method (SFedKD's
  sixteen options beside FedSeq would be sixteen columns of ``-``)."""
  if "method.name" not in columns:
    return []
  out = []
  for k in columns:
    if not k.startswith("method.") or k == "method.name":
      continue
    per_method: dict = {}
    if all(per_method.setdefault(v.get("method.name"), v.get(k, MISSING)) == v.get(k, MISSING)
           for v in values):
      out.append(k)
  return out


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
    shares with their common value.  Without ``by``, a label leaves out the
    options its method fixes (:func:`method_options`).
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
  fixed = set() if by else set(method_options(flats, columns))
  groups: dict[tuple, Group] = {}
  for run, f in zip(runs, flats, strict=True):
    ident = tuple(f.get(k, MISSING) for k in columns)
    if ident not in groups:
      values = dict(zip(columns, ident, strict=True))
      parts = [str(v) if k == "method.name" else f"{names[k]}={v}"
               for k, v in values.items() if v != MISSING and k not in fixed]
      label = ", ".join(parts) or run.name
      groups[ident] = Group(values, [], label)
    groups[ident].runs.append(run)
  out = list(groups.values())
  for i, g in enumerate(out):
    g.slug = _slug(g.label) if len(out) == 1 else f"{i + 1:02d}_{_slug(g.label)}"
  return out, columns, shared
