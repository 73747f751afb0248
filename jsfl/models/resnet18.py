"""ResNet-18 (He et al. 2016), CIFAR variant, one residual block per stage.

The CIFAR variant has a 3x3 stride-1 stem and no max pool, so a 32x32 input
reaches the pool at 4x4 (SAME padding everywhere, so a 28x28 input works too:
28 -> 14 -> 7 -> 4).

Stages (``w`` is the width multiplier, channels ``int(c * w)``; a cut ``c``
gives the client ``[0, c)``):
  0  conv1:   conv3x3(64)                                    [cut 1]
  1  bn1:     norm - relu                                    [cut 2, shallow]
  2  block1:  BasicBlock(64)                                 [cut 3]
  3  block2:  BasicBlock(64)                                 [cut 4, default]
  4  block3:  BasicBlock(128, stride 2)                      [cut 5]
  5  block4:  BasicBlock(128)                                [cut 6, mid]
  6  block5:  BasicBlock(256, stride 2)                      [cut 7]
  7  block6:  BasicBlock(256)                                [cut 8]
  8  block7:  BasicBlock(512, stride 2)                      [cut 9]
  9  block8:  BasicBlock(512)                  [cut 10, deep, default head cut]
  10 avgpool: global average pool
  11 fc:      dense(num_classes)

A BasicBlock is conv3x3(stride) - norm - relu - conv3x3 - norm, plus the
input (through a conv1x1(stride) - norm projection when the shape changes),
then relu.

Mapping to the Hydra paper (Data Heterogeneity and Forgotten Labels in SFL,
App. G.4): it counts ResNet18 as 12 layers with each residual block a single
layer and uses cuts 2, 6 and 10 (``CUTS``); our 12 stages are those 12 layers
and the cut numbers are the same.  ``CUTS["shallow"] = 2`` puts conv1 and
its BatchNorm at the client (Thapa et al.'s cut after the BatchNorm).  The
default cut 4 (docs/setting.md#model-splits, MultiSFL's cut) puts the first residual stage (two
blocks, ``layer1`` in torchvision) at the client as well.  The default head
cut 10 makes Hydra's heads the last 2 stages, pool and fc, like its "small"
heads.
"""

from __future__ import annotations

import jax

from jsfl.models import layers
from jsfl.models.base import StagedModel, register

# (channels, stride) of the 8 BasicBlocks.
BLOCKS = ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
          (512, 1))
CUTS = {"shallow": 2, "mid": 6, "deep": 10}


class BasicBlock(layers.Residual):
  """Two 3x3 convs with an identity or 1x1-projection shortcut."""

  def __init__(self, cin, cout, stride, *, norm, conv_impl, rngs):
    # A bias in front of a normalisation would be cancelled by its mean.
    bias = norm == "none"
    self.conv1 = layers.Conv(cin, cout, 3, stride=stride, impl=conv_impl,
                             use_bias=bias, rngs=rngs)
    self.norm1 = layers.Norm2d(cout, norm, rngs=rngs)
    self.conv2 = layers.Conv(cout, cout, 3, impl=conv_impl, use_bias=bias,
                             rngs=rngs)
    self.norm2 = layers.Norm2d(cout, norm, rngs=rngs)
    self.init_shortcut(cin, cout, stride, norm=norm, conv_impl=conv_impl, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    y = jax.nn.relu(self.norm1(self.conv1(x), train=train, mask=mask))
    y = self.norm2(self.conv2(y), train=train, mask=mask)
    return jax.nn.relu(self.shortcut(x, train=train, mask=mask) + y)


def stage_names() -> tuple[str, ...]:
  """``("conv1", "bn1", "block1", ..., "block8", "avgpool", "fc")``."""
  return (("conv1", "bn1") + tuple(f"block{k}" for k in range(1, 9))
          + ("avgpool", "fc"))


@register("resnet18")
def resnet18(input_shape, num_classes, *, norm: str = "batch",
             conv_impl: str | None = None, depthwise_impl: str | None = None,
             width: float = 1.0) -> StagedModel:
  """Builds ResNet-18 (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)`` of one sample (32x32x3 and 28x28x1 both work).
    num_classes: output width.
    norm: ``"batch"`` (the original), ``"group"`` or ``"none"``, after every
      convolution.
    conv_impl: ``"xla"`` or ``"im2col"``; None picks
      :func:`layers.default_conv_impl`.
    depthwise_impl: unused (no depthwise layers); validated and accepted for a
      uniform factory interface.
    width: width multiplier (> 0) on the base width 64; every channel count
      ``c`` becomes ``max(1, int(c * width))``.

  Returns:
    The :class:`StagedModel` with 12 stages, default cut 4, default head cut
    10.
  """
  conv_impl, depthwise_impl = layers.resolve_options(
      "resnet18", input_shape, num_classes, norm, conv_impl, depthwise_impl, width)

  def ch(c):
    return max(1, int(c * width))

  cin = input_shape[2]

  def build(rngs):
    stages = [
        layers.Conv(cin, ch(64), 3, impl=conv_impl, use_bias=norm == "none",
                    rngs=rngs),
        layers.NormRelu(ch(64), norm=norm, rngs=rngs),
    ]
    c = ch(64)
    for cout, stride in BLOCKS:
      stages.append(BasicBlock(c, ch(cout), stride, norm=norm,
                               conv_impl=conv_impl, rngs=rngs))
      c = ch(cout)
    stages += [layers.GlobalAvgPool(), layers.Dense(c, num_classes, rngs=rngs)]
    return stages

  return StagedModel("resnet18", build, tuple(input_shape), num_classes,
                     default_cut=4, default_head_cut=CUTS["deep"],
                     stage_names=stage_names())
