"""VGG-16 (Simonyan & Zisserman 2014), CIFAR variant with BatchNorm, one conv
per stage.

The CIFAR variant (the one in the MultiSFL authors' code): 13 conv3x3 -
norm - relu layers in five blocks, a 2x2 max pool closing every block, then
three dense layers 512 - 256 - classes.  A 32x32 input reaches the dense
layers at 1x1; pools round up (ceil mode), so a 28x28 input does too
(28 -> 14 -> 7 -> 4 -> 2 -> 1).

Stages (``w`` is the width multiplier; channels and dense widths are
``max(1, int(c * w))``; a cut ``c`` gives the client ``[0, c)``):
  0  conv1_1: conv3x3(64)                      6  conv3_3: conv3x3(256) + pool
  1  conv1_2: conv3x3(64) + pool               7  conv4_1: conv3x3(512)
  2  conv2_1: conv3x3(128)                     8  conv4_2: conv3x3(512)
  3  conv2_2: conv3x3(128) + pool [cut 4]      9  conv4_3: conv3x3(512) + pool
  4  conv3_1: conv3x3(256)                     10 conv5_1: conv3x3(512)
  5  conv3_2: conv3x3(256)                     11 conv5_2: conv3x3(512)
  12 conv5_3: conv3x3(512) + pool              14 fc2: dense(256) - relu
  13 fc1: dense(512) - relu                    15 fc3: dense(num_classes)
(each conv is followed by norm - relu, then the pool where marked).

Cuts (``CUTS``): ``"shallow" = 4`` (default) is the MultiSFL authors' split:
the client holds the first two blocks (128 channels at 8x8 for a 32x32
input).  ``"mid" = 7`` puts block 3 at the client too, ``"deep" = 13`` all
convolutions.  The default head cut (Hydra) is 14: heads are fc2 and fc3.

Departure from the authors' model: their fc1 and fc2 are followed by dropout
(p = 0.5); jsfl's stages carry no random state, so there is no dropout.
``norm="none"`` gives every convolution a bias.
"""

from __future__ import annotations

import jax.numpy as jnp

from jsfl.models import layers
from jsfl.models.base import StagedModel, register

# Output channels of the 13 convolutions, and which of them close a block.
CONVS = (64, 64, 128, 128, 256, 256, 256, 512, 512, 512, 512, 512, 512)
POOL_AFTER = (1, 3, 6, 9, 12)
DENSE = (512, 256)
CUTS = {"shallow": 4, "mid": 7, "deep": 13}
_NAMES = ("conv1_1", "conv1_2", "conv2_1", "conv2_2", "conv3_1", "conv3_2",
          "conv3_3", "conv4_1", "conv4_2", "conv4_3", "conv5_1", "conv5_2",
          "conv5_3", "fc1", "fc2", "fc3")


def max_pool_ceil(x):
  """2x2 stride-2 max pool that keeps a last odd row/column (ceil mode)."""
  _, h, w, _ = x.shape
  if h % 2 or w % 2:
    x = jnp.pad(x, ((0, 0), (0, h % 2), (0, w % 2), (0, 0)),
                constant_values=-jnp.inf)
  return layers.max_pool(x, 2)


class ConvNormRelu(layers.ConvNormAct):
  """conv3x3 - norm - relu [- max pool]."""

  def __init__(self, cin, cout, *, pool, norm, conv_impl, rngs):
    super().__init__(cin, cout, 3, norm=norm, conv_impl=conv_impl, rngs=rngs)
    self.pool = pool

  def __call__(self, x, *, train=False, mask=None):
    x = super().__call__(x, train=train, mask=mask)
    return max_pool_ceil(x) if self.pool else x


def _spatial(size: int) -> int:
  for _ in POOL_AFTER:
    size = -(-size // 2)
  return size


@register("vgg16")
def vgg16(input_shape, num_classes, *, norm: str = "batch",
          conv_impl: str | None = None, depthwise_impl: str | None = None,
          width: float = 1.0) -> StagedModel:
  """Builds VGG-16 (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)`` of one sample (32x32x3 and 28x28x1 both work).
    num_classes: output width.
    norm: ``"batch"`` (the authors' model), ``"group"`` or ``"none"``, after
      every convolution.
    conv_impl: ``"xla"`` or ``"im2col"``; None picks
      :func:`layers.default_conv_impl`.
    depthwise_impl: unused (no depthwise layers); validated and accepted for a
      uniform factory interface.
    width: width multiplier (> 0) on every conv and hidden dense width.

  Returns:
    The :class:`StagedModel` with 16 stages, default cut 4, default head cut
    14.
  """
  conv_impl, depthwise_impl = layers.resolve_options(
      "vgg16", input_shape, num_classes, norm, conv_impl, depthwise_impl, width)

  def ch(c):
    return max(1, int(c * width))

  h, w, cin = input_shape
  flat = _spatial(h) * _spatial(w) * ch(CONVS[-1])

  def build(rngs):
    stages, c = [], cin
    for i, cout in enumerate(CONVS):
      stages.append(ConvNormRelu(c, ch(cout), pool=i in POOL_AFTER, norm=norm,
                                 conv_impl=conv_impl, rngs=rngs))
      c = ch(cout)
    stages += [layers.DenseRelu(flat, ch(DENSE[0]), rngs=rngs),
               layers.DenseRelu(ch(DENSE[0]), ch(DENSE[1]), rngs=rngs),
               layers.Dense(ch(DENSE[1]), num_classes, rngs=rngs)]
    return stages

  return StagedModel("vgg16", build, tuple(input_shape), num_classes,
                     default_cut=CUTS["shallow"], default_head_cut=14,
                     stage_names=_NAMES)
