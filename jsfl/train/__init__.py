"""Training: a config (or a program of several cells) -> a run directory.

* :mod:`~jsfl.train.experiment`: data, model, partitions, setup and per-slot
  values, every option checked before anything is written (``prepare``);
* :mod:`~jsfl.train.programs`: the jitted init, round and evaluation
  programs over the slot axis, the per-backend execution defaults;
* :mod:`~jsfl.train.loop`: the round loop (``run``, ``resume``);
* :mod:`~jsfl.train.records`: ``metrics.jsonl`` records, the running tally,
  ``summary.json``;
* :mod:`~jsfl.train.lifecycle`: run files, signals, divergence, resume;
* :mod:`~jsfl.train.memory`: how many slots fit on a device;
* :mod:`~jsfl.train.evaluate`: whole-test-set evaluation;
* :mod:`~jsfl.train.landscape`: the loss landscape of a finished run
  (``jsfl landscape``);
* :mod:`~jsfl.train.observe`: experiment trackers and the profiler;
* :mod:`~jsfl.train.compile_cache`: the persistent XLA compilation cache;
* :mod:`~jsfl.train.info`: what ``jsfl info`` prints.
"""

from jsfl.train.experiment import Experiment, Slot, make_setup, prepare, setup_from
from jsfl.train.lifecycle import CELL_ARTIFACTS, Stopped
from jsfl.train.loop import resume, run
from jsfl.train.observe import PROFILE_DIR
from jsfl.train.records import summary

__all__ = ["CELL_ARTIFACTS", "PROFILE_DIR", "Experiment", "Slot", "Stopped", "make_setup",
           "prepare", "resume", "run", "setup_from", "summary"]
