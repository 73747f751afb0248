"""Input-size checks every model and layer shares; imports nothing of jsfl,
so the layers, the initialisers and the model base all stand on it."""

from __future__ import annotations

from collections.abc import Callable


class InputTooSmall(ValueError):
  """A layer whose input the model's downsampling has shrunk to nothing."""


def check_input_size(name: str, input_shape, spatial: Callable[[int], int]) -> None:
  """Raises a ValueError when ``input_shape`` is too small for the model.

  Args:
    name: model name, for the message.
    input_shape: ``(H, W, C)`` of one sample.
    spatial: the model's feature-map side at its dense layers as a function
      of the input side (non-decreasing); at least 1 for a usable input.

  Raises:
    ValueError: naming the model, the shape and the smallest H and W that
      work (where the model's downsampling would leave no pixels, which
      would otherwise end in a ZeroDivisionError while building it).
  """
  h, w = int(input_shape[0]), int(input_shape[1])
  fh, fw = spatial(h), spatial(w)
  if fh >= 1 and fw >= 1:
    return
  smallest = next(s for s in range(1, 1 << 16) if spatial(s) >= 1)
  raise ValueError(
      f"{name}: input_shape={tuple(input_shape)!r} is too small (its "
      f"downsampling leaves {max(fh, 0)}x{max(fw, 0)} pixels); allowed: H and "
      f"W at least {smallest}")
