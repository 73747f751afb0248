"""ResNet-101 (He et al. 2016), CIFAR variant, one residual block per stage.

The Hydra paper's second model (Data Heterogeneity and Forgotten Labels in
SFL: Tables 1, 5-8, Figs. 6, 13, 18), on CIFAR-10/100 and SVHN (32x32) and
TinyImageNet.  As jsfl's ``resnet18`` it is the CIFAR variant: a 3x3
stride-1 stem and no max pool, so a 32x32 input reaches the pool at 4x4 and
a 64x64 TinyImageNet one at 8x8 (the stride-2 blocks halve it three times;
any side works, 28 -> 14 -> 7 -> 4).  The residual part is He et al.'s
ResNet-101 unchanged: bottleneck blocks in four groups of 3, 4, 23 and 3.

Stages (``w`` is the width multiplier, channels ``max(1, int(c * w))``; a cut
``c`` gives the client ``[0, c)``, so cut ``c`` falls after stage ``c - 1``):
  0      conv1:   conv3x3(64)
  1      bn1:     norm - relu
  2..4   block1..block3:   Bottleneck(64 -> 256)                  (conv2_x)
  5..8   block4..block7:   Bottleneck(128 -> 512), block4 stride 2 (conv3_x)
  9..31  block8..block30:  Bottleneck(256 -> 1024), block8 stride 2 (conv4_x)
  32..34 block31..block33: Bottleneck(512 -> 2048), block31 stride 2 (conv5_x)
  35     avgpool: global average pool
  36     fc:      dense(num_classes)
with the cuts (``CUTS``, ``HEAD_CUTS``):
  2   shallow, the default cut: after bn1 (64 channels at full size)
  10  mid: after block8, the first conv4_x block (1024 channels at 1/4 size)
  30  large heads: after block28
  33  deep, and small heads, the default head cut: after block31, the first
      conv5_x block (2048 channels at 1/8 size)

A Bottleneck(m -> 4m) is conv1x1(m) - norm - relu - conv3x3(m, stride) -
norm - relu - conv1x1(4m) - norm, plus the input (through a conv1x1(4m,
stride) - norm projection when the shape changes: the first block of each
group), then relu.  The stride sits on the 3x3 conv, as in torchvision's
ResNet-101 and in the ResNet of the Hydra authors' earlier split-learning
code; in He et al.'s original it is on the first 1x1 conv.

Mapping to the Hydra paper (App. G.4): it counts ResNet-101 as 37 layers
with each residual block a single layer, as it counts ResNet-18 as 12 (see
``resnet18``), and uses cuts 2, 10 and 33 (``CUTS``); our 37 stages are those
37 layers and the cut numbers are the same.  The shallow cut 2 (the paper's
default, "layer 2 ... in ResNet101") puts conv1 and its BatchNorm at the
client.  Hydra's second cut is at layer 33 for small heads and 30 for large
ones (``HEAD_CUTS``): small heads are the last two residual blocks with the
pool and fc (the paper's "heads of 2 layers" counts the 35 layers before the
pool), large heads the last five blocks with them.  The paper also says "35
in total" once, the same count without pool and fc; every cut it names is
before the pool, where both counts agree.

The Hydra repository does not hold its ResNet definition
(``models/resnet.py``); docs/models.md#resnet-101 says what
jsfl follows instead.
"""

from __future__ import annotations

import jax

from jsfl.models import layers
from jsfl.models.base import StagedModel, register

# (bottleneck width m, blocks, first stride) of the four groups; each block
# outputs 4m channels.
GROUPS = ((64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 2))
EXPANSION = 4
CUTS = {"shallow": 2, "mid": 10, "deep": 33}
HEAD_CUTS = {"small": 33, "large": 30}


def blocks() -> tuple[tuple[int, int], ...]:
  """The 33 blocks' ``(m, stride)`` in order."""
  out = []
  for m, n, s in GROUPS:
    out += [(m, s if i == 0 else 1) for i in range(n)]
  return tuple(out)


class Bottleneck(layers.Residual):
  """conv1x1 - conv3x3(stride) - conv1x1 with an identity or 1x1-projection
  shortcut."""

  def __init__(self, cin, mid, cout, stride, *, norm, conv_impl, rngs):
    # A bias in front of a normalisation would be cancelled by its mean.
    bias = norm == "none"
    self.conv1 = layers.Conv(cin, mid, 1, impl=conv_impl, use_bias=bias,
                             rngs=rngs)
    self.norm1 = layers.Norm2d(mid, norm, rngs=rngs)
    self.conv2 = layers.Conv(mid, mid, 3, stride=stride, impl=conv_impl,
                             use_bias=bias, rngs=rngs)
    self.norm2 = layers.Norm2d(mid, norm, rngs=rngs)
    self.conv3 = layers.Conv(mid, cout, 1, impl=conv_impl, use_bias=bias,
                             rngs=rngs)
    self.norm3 = layers.Norm2d(cout, norm, rngs=rngs)
    self.init_shortcut(cin, cout, stride, norm=norm, conv_impl=conv_impl, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    y = jax.nn.relu(self.norm1(self.conv1(x), train=train, mask=mask))
    y = jax.nn.relu(self.norm2(self.conv2(y), train=train, mask=mask))
    y = self.norm3(self.conv3(y), train=train, mask=mask)
    return jax.nn.relu(self.shortcut(x, train=train, mask=mask) + y)


def stage_names() -> tuple[str, ...]:
  """``("conv1", "bn1", "block1", ..., "block33", "avgpool", "fc")``."""
  return (("conv1", "bn1") + tuple(f"block{k}" for k in range(1, len(blocks()) + 1))
          + ("avgpool", "fc"))


@register("resnet101")
def resnet101(input_shape, num_classes, *, norm: str = "batch",
              conv_impl: str | None = None, depthwise_impl: str | None = None,
              width: float = 1.0) -> StagedModel:
  """Builds ResNet-101 (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)`` of one sample (32x32x3 for CIFAR and SVHN,
      64x64x3 for TinyImageNet; any size works).
    num_classes: output width.
    norm: ``"batch"`` (the original), ``"group"`` or ``"none"``, after every
      convolution.
    conv_impl: ``"xla"`` or ``"im2col"``; None picks
      :func:`layers.default_conv_impl`.
    depthwise_impl: unused (no depthwise layers); validated and accepted for a
      uniform factory interface.
    width: width multiplier (> 0) on every channel count (stem 64, bottleneck
      widths 64..512 and outputs 256..2048): ``c`` becomes
      ``max(1, int(c * width))``.

  Returns:
    The :class:`StagedModel` with 37 stages, default cut 2, default head cut
    33 (``head_cuts``: ``small`` 33, ``large`` 30).
  """
  conv_impl, depthwise_impl = layers.resolve_options(
      "resnet101", input_shape, num_classes, norm, conv_impl, depthwise_impl, width)

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
    for m, stride in blocks():
      cout = ch(EXPANSION * m)
      stages.append(Bottleneck(c, ch(m), cout, stride, norm=norm,
                               conv_impl=conv_impl, rngs=rngs))
      c = cout
    stages += [layers.GlobalAvgPool(), layers.Dense(c, num_classes, rngs=rngs)]
    return stages

  return StagedModel("resnet101", build, tuple(input_shape), num_classes,
                     default_cut=CUTS["shallow"],
                     default_head_cut=HEAD_CUTS["small"],
                     head_cuts=tuple(HEAD_CUTS.items()),
                     stage_names=stage_names())
