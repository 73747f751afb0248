"""MobileNetV2 (Sandler et al. 2018), CIFAR variant, one block per stage.

The CIFAR variant (as in the common CIFAR ports, e.g. kuangliu/pytorch-cifar;
the MultiSFL authors' file differs and their code runs no MobileNetV2 cell,
docs/models.md) has a 3x3 stride-1 stem and
stride 1 in the second bottleneck group, so a 32x32 input reaches the
classifier at 4x4 (SAME padding everywhere, so a 28x28 input works too:
28 -> 14 -> 7 -> 4).

Stages (``w`` is the width multiplier; channels are ``max(1, int(c * w))``
except the last conv's 1280, which is only scaled when ``w > 1`` as in the
original; a cut ``c`` gives the client ``[0, c)``):
  0      stem:    conv3x3(32, stride 1) - norm - relu6
  1..17  block{k}: inverted residual (expansion t, channels c, stride s)
  18     conv_last: conv1x1(1280) - norm - relu6
  19     classifier: global average pool - dense(num_classes)
with the 17 blocks ``(t, c, s)``: (1,16,1); (6,24,1) x2; (6,32,2), (6,32,1) x2;
(6,64,2), (6,64,1) x3; (6,96,1) x3; (6,160,2), (6,160,1) x2; (6,320,1).

An inverted residual block is [conv1x1(t * cin) - norm - relu6, left out when
t = 1] - depthwise conv3x3(stride s) - norm - relu6 - conv1x1(c) - norm (no
activation: the linear bottleneck), plus the input when ``s == 1`` and
``cin == c`` (the original rule; the CIFAR ports' 1x1-projection shortcuts on
the other stride-1 blocks are not used).

Cuts (``CUTS``):

* ``"shallow" = 4`` (default): the client holds the stem and blocks 1-3 (the
  t = 1 block and the stride-1 24-channel group), i.e. its output is 24
  channels at 32x32; the server starts at the first stride-2 block.  Neither
  MultiSFL paper gives its MobileNetV2 cut; this is jsfl's choice, shallow
  like the papers' ResNet-18 cut (after the first residual stage) and VGG-16
  cut (after the second conv block).
* ``"mid" = 11``: the client holds up to the 64-channel group (8x8).
* ``"deep" = 18``: the server holds only conv_last and the classifier.

The default head cut (Hydra) is 18: heads are conv_last and the classifier.
``norm="none"`` gives every convolution a bias.
"""

from __future__ import annotations

import jax
from flax import nnx

from jsfl.models import layers
from jsfl.models.base import StagedModel, register

# (expansion t, channels c, repeats n, first stride s) of the bottleneck groups.
GROUPS = ((1, 16, 1, 1), (6, 24, 2, 1), (6, 32, 3, 2), (6, 64, 4, 2),
          (6, 96, 3, 1), (6, 160, 3, 2), (6, 320, 1, 1))
LAST_CHANNELS = 1280
CUTS = {"shallow": 4, "mid": 11, "deep": 18}


def blocks() -> tuple[tuple[int, int, int], ...]:
  """The 17 blocks' ``(t, c, s)`` in order."""
  out = []
  for t, c, n, s in GROUPS:
    out += [(t, c, s if i == 0 else 1) for i in range(n)]
  return tuple(out)


class InvertedResidual(nnx.Module):
  """Expand (1x1) - depthwise (3x3) - project (1x1, linear) [+ input]."""

  def __init__(self, cin, cout, expansion, stride, *, norm, conv_impl,
               depthwise_impl, rngs):
    bias = norm == "none"
    hidden = cin * expansion
    if expansion != 1:
      self.expand = layers.Conv(cin, hidden, 1, impl=conv_impl, use_bias=bias,
                                rngs=rngs)
      self.expand_norm = layers.Norm2d(hidden, norm, rngs=rngs)
    else:
      self.expand = self.expand_norm = None
    self.dw = layers.DepthwiseConv(hidden, 3, stride=stride, impl=depthwise_impl,
                                   rngs=rngs)
    self.dw_norm = layers.Norm2d(hidden, norm, rngs=rngs)
    self.project = layers.Conv(hidden, cout, 1, impl=conv_impl, use_bias=bias,
                               rngs=rngs)
    self.project_norm = layers.Norm2d(cout, norm, rngs=rngs)
    self.residual = stride == 1 and cin == cout

  def __call__(self, x, *, train=False, mask=None):
    y = x
    if self.expand is not None:
      y = jax.nn.relu6(self.expand_norm(self.expand(y), train=train, mask=mask))
    y = jax.nn.relu6(self.dw_norm(self.dw(y), train=train, mask=mask))
    y = self.project_norm(self.project(y), train=train, mask=mask)
    return x + y if self.residual else y


class Classifier(nnx.Module):
  """Global average pool - dense."""

  def __init__(self, din, num_classes, *, rngs):
    self.dense = layers.Dense(din, num_classes, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    return self.dense(layers.avg_pool_global(x))


def stage_names() -> tuple[str, ...]:
  """``("stem", "block1", ..., "block17", "conv_last", "classifier")``."""
  return (("stem",) + tuple(f"block{k}" for k in range(1, len(blocks()) + 1))
          + ("conv_last", "classifier"))


@register("mobilenet_v2")
def mobilenet_v2(input_shape, num_classes, *, norm: str = "batch",
                 conv_impl: str | None = None,
                 depthwise_impl: str | None = None,
                 width: float = 1.0) -> StagedModel:
  """Builds MobileNetV2 (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)`` of one sample (32x32x3 and 28x28x1 both work).
    num_classes: output width.
    norm: ``"batch"`` (the original), ``"group"`` or ``"none"``, after every
      convolution.
    conv_impl: ``"xla"`` or ``"im2col"`` for the dense (stem and 1x1)
      convolutions; None picks :func:`layers.default_conv_impl`.
    depthwise_impl: ``"grouped"`` or ``"shifts"``; None picks
      :func:`layers.default_depthwise_impl`.
    width: width multiplier (> 0); every channel count ``c`` becomes
      ``max(1, int(c * width))``; conv_last keeps 1280 channels unless
      ``width > 1`` (as in the original).

  Returns:
    The :class:`StagedModel` with 20 stages, default cut 4, default head cut
    18.
  """
  conv_impl, depthwise_impl = layers.resolve_options(
      "mobilenet_v2", input_shape, num_classes, norm, conv_impl, depthwise_impl, width)

  def ch(c):
    return max(1, int(c * width))

  cin = input_shape[2]
  last = ch(LAST_CHANNELS) if width > 1 else LAST_CHANNELS

  def build(rngs):
    stages = [layers.ConvNormAct(cin, ch(32), 3, act="relu6", norm=norm,
                                 conv_impl=conv_impl, rngs=rngs)]
    c = ch(32)
    for t, cout, stride in blocks():
      stages.append(InvertedResidual(c, ch(cout), t, stride, norm=norm,
                                     conv_impl=conv_impl,
                                     depthwise_impl=depthwise_impl, rngs=rngs))
      c = ch(cout)
    stages.append(layers.ConvNormAct(c, last, 1, act="relu6", norm=norm,
                                     conv_impl=conv_impl, rngs=rngs))
    stages.append(Classifier(last, num_classes, rngs=rngs))
    return stages

  return StagedModel("mobilenet_v2", build, tuple(input_shape), num_classes,
                     default_cut=CUTS["shallow"], default_head_cut=CUTS["deep"],
                     stage_names=stage_names())
