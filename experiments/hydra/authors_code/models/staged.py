"""A model as a list of stages, of which a ``[start, end)`` range is built."""

from torch import nn


class Staged(nn.Sequential):
  """Stages ``[start, end)`` of ``stages``, the authors' ``(start, end)``
  convention: ``-1`` as start is the first stage, ``-1`` as end the last, so
  ``(-1, cut)`` is part-1 and ``(cut, -1)`` the server's part."""

  def __init__(self, stages, start, end):
    lo = 0 if start == -1 else start
    hi = len(stages) if end == -1 else end
    if not 0 <= lo < hi <= len(stages):
      raise ValueError(f"stages [{start}, {end}) of a {len(stages)}-stage model")
    super().__init__(*stages[lo:hi])
