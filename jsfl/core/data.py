"""What a round reads besides its setup and state: the training set, one
slot's clients, and that slot's batchable values.

``RoundData`` is a flat typed tuple.  The training set (``x``, ``y``,
``mean``, ``std``) is shared by every slot of a program; ``table``,
``sizes``, ``dominant``, ``counts`` and ``hyper`` are the slot's own (the
train layer stacks them on a leading slot axis and maps the round over it).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
from flax import struct

from jsfl.data import normalize
from jsfl.data.augment import Augment, apply
from jsfl.options import options_of


@struct.dataclass
class Hyper:
  """One slot's batchable values: the learning-rate schedule and the method's
  option set, whose batchable fields may be traced scalars."""

  lr: Any
  lr_decay: Any
  lr_min: Any
  method: Any  # an instance of the method's option set (a pytree, options_pytree)


class RoundData(NamedTuple):
  """The arrays of one slot's round (see the module docstring)."""

  x: jax.Array          # (N, H, W, C) uint8 training images
  y: jax.Array          # (N,) labels
  mean: jax.Array       # (C,) per-channel mean of x / 255
  std: jax.Array        # (C,) its std
  table: jax.Array      # (K, max_n) each client's sample indices (padded)
  sizes: jax.Array      # (K,) its sample count
  dominant: jax.Array   # (K,) its most frequent label
  counts: jax.Array     # (K, L) its label counts
  hyper: Hyper | None = None  # None: the setup's own values (hyper())
  augment: Augment | None = None  # a training round's (training_data); None:
                                  # gather leaves the images as stored


SHARED_FIELDS = ("x", "y", "mean", "std")
SLOT_FIELDS = ("table", "sizes", "dominant", "counts", "hyper")


_PYTREES: set[type] = set()


def options_pytree(options):
  """``options`` (an option set instance) with its class registered as a
  pytree: the batchable fields are its leaves, the others its static part,
  so one instance per slot stacks on the slot axis."""
  cls = type(options)
  if cls not in _PYTREES:
    fields = options_of(cls)
    jax.tree_util.register_dataclass(
        cls, data_fields=[k for k, o in fields.items() if o.batchable],
        meta_fields=[k for k, o in fields.items() if not o.batchable])
    _PYTREES.add(cls)
  return options


def hyper_of(setup) -> Hyper:
  """The batchable values a concrete setup holds, as a :class:`Hyper`."""
  return Hyper(setup.lr, setup.lr_decay, setup.lr_min, options_pytree(setup.options))


def hyper(setup, data: RoundData) -> Hyper:
  """The round's batchable values: the slot's (``data.hyper``), else the
  setup's own (a direct call with a concrete setup)."""
  return data.hyper if data.hyper is not None else hyper_of(setup)


# The augmentation's stream of a round key: a fold, so the round's other
# draws (split from the same key) are the ones a run without it makes.
AUGMENT_STREAM = 0x617567


def training_data(setup, data: RoundData, key) -> RoundData:
  """``data`` as a training round reads it: with ``setup.augment`` (crop and
  flip, and rotation) it carries the round's :class:`Augment`, so every
  :func:`gather` of the round augments (one draw per sample and round: a
  sample's visits within a round, its local epochs, share it).  Each
  engine's round calls this once at its start."""
  if setup.augment == "none":
    return data
  return data._replace(augment=Augment(jax.random.fold_in(key, AUGMENT_STREAM),
                                       setup.augment))


def gather(data: RoundData, idx):
  """Normalised inputs and labels for an index array of any shape, augmented
  when ``data`` carries a round's :class:`Augment` (:func:`training_data`)."""
  x = data.x[idx]
  if data.augment is not None:
    x = apply(data.augment, idx, x)
  return normalize(x, data.mean, data.std), data.y[idx]


def round_options(setup, data: RoundData):
  """The method's option set as this round sees it: the static values the
  setup holds and the slot's batchable values (``data.hyper``)."""
  return hyper(setup, data).method
