"""Slots: the runs one compiled program trains side by side.

A *slot* is one run: its seed, its values of every batchable option and its
own partition draw.  Runs whose configs agree on everything else (the
*static signature*: dataset, model, cut, method and its static options,
clients, batch size, epochs, rounds, execution) are slots of one program.
The slot axis is a run's seed axis widened: per slot it carries the values a
round reads as traced scalars (``RoundData.hyper``, read through
:func:`jsfl.core.data.round_options`) and the client index tables drawn
host-side from each slot's partition options.

What is batchable is declared once, on the options themselves
(:class:`jsfl.options.Option` ``batchable``): the optimiser's ``lr``,
``lr_decay`` and ``lr_min`` and every option-set field marked so (FedProx
mu, MultiSFL alpha / gamma / p bounds, SFedKD temperature and weights, ...).
Partition options other than ``num_clients`` only shape the host-side index
tables, so they vary per slot too.

Importable without JAX (the sweep planner reads it).
"""

from __future__ import annotations

import copy
import json

from jsfl import config as config_lib
from jsfl.methods.catalog import METHODS

# Where and how visibly a run runs, and how a sweep packs it: never part of
# what it computes.
WHERE_FIELDS = (("run", "dir"), ("run", "name"), ("run", "out_dir"), ("exec", "progress"),
                ("exec", "max_slots"))
# How evaluation is lowered and chunked: the same accuracies (a loss summed in
# another order), so a finished or checkpointed cell is not redone for them.
# They still shape the evaluation program, so they stay in a program's key.
EVAL_HOW_FIELDS = (("exec", "eval_batch"), ("model", "eval_conv_impl"))
# The partition section's keys that fix array shapes; every other one only
# changes which samples a client holds.
PARTITION_STATIC = ("num_clients",)


def batchable_keys(cfg: dict) -> list[str]:
  """``section.key`` of every batchable option of ``cfg``'s method and
  optimiser, in a fixed order (the config schema's, then the option set's)."""
  keys = [f"optim.{k}" for k, opt in config_lib.SCHEMA["optim"].items() if opt.batchable]
  opts = METHODS[cfg["method"]["name"]].options
  return keys + [f"method.{k}" for k, opt in opts.items() if opt.batchable]


def hyper_values(cfg: dict) -> dict[str, float]:
  """The run's batchable values, as the per-slot pytree a round reads."""
  out = {}
  for key in batchable_keys(cfg):
    section, name = key.split(".")
    out[key] = float(cfg[section][name])
  return out


def static_config(cfg: dict) -> dict:
  """``cfg`` without what may differ between slots of one program: where it
  runs, its seeds, its batchable values and its partition draw."""
  out = copy.deepcopy(cfg)
  for s, k in WHERE_FIELDS + (("run", "seed"), ("run", "seeds")):
    out.get(s, {}).pop(k, None)
  for key in batchable_keys(cfg):
    section, name = key.split(".")
    out[section].pop(name, None)
  out["partition"] = {k: v for k, v in out.get("partition", {}).items()
                      if k in PARTITION_STATIC}
  return out


def signature(cfg: dict) -> str:
  """A key equal for exactly the configs that can be slots of one program."""
  return json.dumps(static_config(cfg), sort_keys=True, default=str)


def differences(a: dict, b: dict) -> list[str]:
  """The ``section.key`` fields where two configs' static parts differ."""
  sa, sb = static_config(a), static_config(b)
  return sorted(f"{s}.{k}" for s in set(sa) | set(sb)
                for k in set(sa.get(s, {})) | set(sb.get(s, {}))
                if sa.get(s, {}).get(k) != sb.get(s, {}).get(k))
