"""A small CNN (two conv blocks + two dense layers) for 28x28 / 32x32 inputs.

Stages (cut indices in brackets; ``w`` = ``width``, default 16):
  0 conv1: conv3x3(w) - norm - relu - maxpool2       [cut 1 after it]
  1 conv2: conv3x3(2w) - norm - relu - maxpool2      [cut 2, default]
  2 fc1:   dense(128) - relu                         [cut 3, default head cut]
  3 fc2:   dense(num_classes)

Width 16 (not 32) by default: it trains at more than twice the speed of the
32/64-channel version on a CPU and both exceed 85% on Fashion-MNIST
(docs/models.md); ``width=32`` gives the larger one.
"""

from __future__ import annotations

from jsfl.models import layers
from jsfl.models.base import StagedModel, check_input_size, register


@register("small_cnn")
def small_cnn(input_shape, num_classes, *, norm: str = "none",
              conv_impl: str | None = None, width: int = 16, hidden: int = 128,
              depthwise_impl: str | None = None) -> StagedModel:
  """Builds the small CNN; ``norm`` in {"none", "batch", "group"}; H and W
  at least 4."""
  conv_impl, _ = layers.resolve_options("small_cnn", input_shape, num_classes, norm,
                                        conv_impl, depthwise_impl)
  for key, v in (("width", width), ("hidden", hidden)):
    if not isinstance(v, int) or isinstance(v, bool) or v < 1:
      raise ValueError(f"small_cnn: {key}={v!r}; allowed: an int >= 1 (channels / units)")
  check_input_size("small_cnn", input_shape, lambda s: s // 4)  # two max pools
  h, w, c = input_shape
  flat = (h // 4) * (w // 4) * 2 * width

  def build(rngs):
    return [
        layers.ConvPoolBlock(c, width, 3, norm=norm, conv_impl=conv_impl, rngs=rngs),
        layers.ConvPoolBlock(width, 2 * width, 3, norm=norm, conv_impl=conv_impl,
                             rngs=rngs),
        layers.DenseRelu(flat, hidden, rngs=rngs),
        layers.Dense(hidden, num_classes, rngs=rngs),
    ]

  return StagedModel("small_cnn", build, tuple(input_shape), num_classes,
                     default_cut=2, default_head_cut=3,
                     stage_names=("conv1", "conv2", "fc1", "fc2"))
