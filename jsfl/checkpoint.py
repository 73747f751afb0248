"""Checkpoints of a run (orbax-checkpoint): what ``jsfl run --resume`` needs.

A checkpoint is ``RUN_DIR/checkpoints/<R>/``, written after round ``R`` (the
number of rounds completed); the last two are kept.  It holds:

* ``state``: the method state after round ``R``, every leaf with its leading
  seed axis, as a flat list of arrays in the state's tree order (typed PRNG
  key leaves as their raw key data, which orbax can store); the state's tree
  structure comes from the template the run builds with ``init``, so no
  container type (flax dataclass, optax state, empty tuples) has to survive
  orbax's tree handling.
* ``host`` (JSON): ``round`` (= R), ``seeds``, ``paths`` (each leaf's tree
  path, checked on restore), and the loop's host-side accumulators
  ``cum_up`` / ``cum_down`` (cumulative bytes per seed, exact: JSON writes
  floats with ``repr``).

Why this suffices to continue bit-identically:

* every PRNG key of a run is a pure function of the config: the per-seed keys
  are ``key(seed)`` (``runner.make_seed_keys``) and round ``r``'s key is
  ``fold_in(seed_key, r)`` (``runner.round_keys``), so nothing random is
  carried between rounds outside the state;
* the partitions, the synthetic data and ``train_subset`` draw from numpy
  Generators seeded from the config inside ``runner.prepare``, which resume
  runs again; no stateful generator (numpy, ``random``) lives on the loop's
  path;
* whatever a method carries from round to round (optimiser state, label
  cycle, MultiSFL's score vectors and sampling proportion, SFedKD's previous
  sequence, the round counter) is a leaf of the state;
* the loop's other host state, the per-seed per-label accuracy history (for
  BW) and the records (for ``summary.json``), is rebuilt from the
  ``metrics.jsonl`` records up to round ``R``, which are written before the
  checkpoint of their round.

Writes are atomic: orbax writes into ``<R>.orbax-checkpoint-tmp-*`` and
renames it to ``<R>`` only when complete (local file systems; a commit file
on GCS); a killed write leaves only the temporary directory, which is never
listed as a step (orbax usually removes it when the next
:class:`Checkpointer` opens the directory; a later save of that round works
either way).  Saves are synchronous: the next round donates the state's
buffers, so a save must be done with them before it starts.
"""

from __future__ import annotations

import os

import jax
import numpy as np

MAX_TO_KEEP = 2


def _is_key(x) -> bool:
  return jax.dtypes.issubdtype(getattr(x, "dtype", None), jax.dtypes.prng_key)


def _storable(leaf):
  return jax.random.key_data(leaf) if _is_key(leaf) else leaf


def _abstract(leaf):
  """What orbax restores ``leaf`` as: shape, dtype and the run's sharding."""
  leaf = _storable(leaf)
  return jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=leaf.sharding)


def _paths(tree) -> list[str]:
  return [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(tree)]


def _leaf_names(n: int) -> list[str]:
  return [f"{i:05d}" for i in range(n)]


def _manager(directory: str, create: bool):
  import orbax.checkpoint as ocp
  options = ocp.CheckpointManagerOptions(
      max_to_keep=MAX_TO_KEEP, create=create, cleanup_tmp_directories=create,
      enable_async_checkpointing=False)
  return ocp.CheckpointManager(os.path.abspath(directory), options=options)


def latest_round(directory: str) -> int | None:
  """The round of the newest complete checkpoint in ``directory``, or None."""
  if not os.path.isdir(directory):
    return None
  mngr = _manager(directory, create=False)
  try:
    return mngr.latest_step()
  finally:
    mngr.close()


def read(directory: str, round_: int | None = None) -> tuple[dict, list[np.ndarray]]:
  """One checkpoint as saved, without the run's state template (inspection,
  tests).

  Args:
    directory: ``RUN_DIR/checkpoints``.
    round_: the checkpoint's round; None for the newest.

  Returns:
    ``(host, leaves)``: the JSON record (module docstring) and the state's
    leaves in tree order as numpy arrays (PRNG keys as their key data).

  Raises:
    FileNotFoundError: no such checkpoint.
  """
  import orbax.checkpoint as ocp
  mngr = _manager(directory, create=False) if os.path.isdir(directory) else None
  try:
    step = round_ if round_ is not None or mngr is None else mngr.latest_step()
    if mngr is None or step is None or step not in mngr.all_steps():
      raise FileNotFoundError(f"no checkpoint of round {step} in {directory}")
    got = mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(), host=ocp.args.JsonRestore()))
  finally:
    if mngr is not None:
      mngr.close()
  names = _leaf_names(len(got["host"]["paths"]))
  return got["host"], [np.asarray(got["state"][n]) for n in names]


class Checkpointer:
  """Saves and restores a run's checkpoints in one directory.

  Args:
    directory: ``RUN_DIR/checkpoints``; created if missing.
  """

  def __init__(self, directory: str):
    self.directory = directory
    self._mngr = _manager(directory, create=True)

  def latest_round(self) -> int | None:
    return self._mngr.latest_step()

  def save(self, round_: int, state, seeds, cum_up, cum_down) -> None:
    """Writes the checkpoint of round ``round_`` (rounds completed) and waits
    for it; older checkpoints beyond the last two are deleted.

    Args:
      round_: rounds completed.
      state: the method state after that round (leading seed axis).
      seeds: the run's seeds (checked on restore).
      cum_up, cum_down: per-seed cumulative bytes (numpy arrays).
    """
    import orbax.checkpoint as ocp
    leaves = [_storable(x) for x in jax.tree.leaves(state)]
    host = {"round": int(round_), "seeds": [int(s) for s in seeds],
            "paths": _paths(state),
            "cum_up": np.asarray(cum_up).tolist(),
            "cum_down": np.asarray(cum_down).tolist()}
    self._mngr.save(int(round_), force=True, args=ocp.args.Composite(
        state=ocp.args.StandardSave(dict(zip(_leaf_names(len(leaves)), leaves))),
        host=ocp.args.JsonSave(host)))
    self._mngr.wait_until_finished()

  def restore(self, template, seeds):
    """The newest checkpoint, laid out like ``template``.

    Args:
      template: a state of the run's method and config (e.g. ``init``'s
        output): its tree structure, dtypes and shardings are restored into.
      seeds: the run's seeds; they must be the checkpoint's.

    Returns:
      ``(round, state, cum_up, cum_down)``, or None without a checkpoint.

    Raises:
      ValueError: the checkpoint is of another state structure or seeds.
    """
    import orbax.checkpoint as ocp
    step = self._mngr.latest_step()
    if step is None:
      return None
    leaves, treedef = jax.tree.flatten(template)
    abstract = dict(zip(_leaf_names(len(leaves)), map(_abstract, leaves)))
    got = self._mngr.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract), host=ocp.args.JsonRestore()))
    host = got["host"]
    where = f"{self.directory}/{step}"
    if host["paths"] != _paths(template):
      raise ValueError(f"checkpoint {where} holds another state structure than "
                       "this run's method builds")
    if host["seeds"] != [int(s) for s in seeds]:
      raise ValueError(f"checkpoint {where} is of seeds {host['seeds']}, the run "
                       f"has {list(seeds)}")
    restored = [got["state"][name] for name in _leaf_names(len(leaves))]
    restored = [jax.random.wrap_key_data(x, impl=jax.random.key_impl(t)) if _is_key(t)
                else x for x, t in zip(restored, leaves)]
    # np.asarray keeps the saved element type: ints stay ints, floats floats.
    return (int(host["round"]), jax.tree.unflatten(treedef, restored),
            np.asarray(host["cum_up"]), np.asarray(host["cum_down"]))

  def close(self) -> None:
    self._mngr.close()
