"""Sweeps: a grid of configs run as cells of one process (``jsfl sweep``).

A sweep file (TOML) names a base config, overrides for every cell, a grid
whose Cartesian product gives the cells, and optional explicit extra cells::

  [sweep]
  name = "fmnist_alpha"                      # out_dir/name/<cell> per cell
  base = "../core/fmnist_iid.toml"           # relative to this file; optional
  out_dir = "runs/sweeps"                    # relative to the working directory

  [base]                                     # every cell (optional)
  "run.rounds" = 50
  "run.seeds" = 5

  [grid]                                     # product, last key fastest
  "method.name" = ["sfl", "fedavg"]
  "partition.alpha" = [0.1, 0.5]

  [[cells]]                                  # extra cells, one per table
  "method.name" = "hydra"
  "method.groups" = 5

Keys are ``section.key`` (quoted, or TOML dotted keys: ``method.name = [...]``
is the same key).  A cell's name (its directory) is the ``name`` of its
``[[cells]]`` table, or else its own assignments (its grid values, or the
keys of its ``[[cells]]`` table), e.g. ``method=sfl,partition.alpha=0.1``,
where a section axis written as ``[grid.partition]`` ``iid = {name = "iid"}``
puts its value's name (``iid``) in place of its keys; a generated name over
60 characters is cut and ends with a hash.  Adding a value to an axis never
renames the cells already run.  Every cell
config is resolved by :func:`jsfl.config.load_config` (the base file plus
``section.key=value`` overrides, exactly as ``jsfl run`` takes them) before
anything runs.

A cell is finished when its directory holds ``summary.json`` with
``rounds_evaluated`` equal to its rounds and a ``.done`` marker written after
the run returned; a rerun skips finished cells, resumes a partial one that
has ``checkpoints/`` (:func:`jsfl.train.resume`) and reruns any
other partial one from scratch.

Programs: cells whose resolved configs agree on their static signature
(:mod:`jsfl.slots`: everything but seeds, batchable values such as the
learning rate or FedProx's mu, and partition options other than
``num_clients``) train as the slots of one compiled program in
``out_dir/name/.batch-<hash>``; its records carry their cell's name and are
split back into the cells' own directories when it finishes, and the batch
directory is removed.  Cells that differ in a static option (method, model,
cut, clients, heads, ...) form one program per signature.  ``exec.max_slots``
(or, at 0, an estimate of the device's memory) caps the slots of a program;
a larger group is cut into several programs, whole cells each.
"""

from jsfl.sweep.collect import COLLECTED, collect
from jsfl.sweep.command import main
from jsfl.sweep.execute import run_units, split_batch, validate_units
from jsfl.sweep.format import (
  Cell,
  Sweep,
  SweepError,
  cell_name,
  load_sweep,
  overrides,
  parse_shard,
  resolve,
  toml_value,
)
from jsfl.sweep.plan import (
  BATCH_PREFIX,
  DONE,
  UNBATCHABLE_METHODS,
  Unit,
  config_diff,
  finished,
  finished_run,
  pending,
  plan,
  shard,
  status,
)

__all__ = ["BATCH_PREFIX", "COLLECTED", "DONE", "UNBATCHABLE_METHODS", "Cell", "Sweep",
           "SweepError", "Unit", "cell_name", "collect", "config_diff", "finished",
           "finished_run", "load_sweep", "main", "overrides", "parse_shard", "pending", "plan",
           "resolve", "run_units", "shard", "split_batch", "status", "toml_value",
           "validate_units"]
