"""MobileNetV1 (Howard et al. 2017), CIFAR variant, one conv per stage.

The CIFAR variant keeps the ImageNet layer list but the stem has stride 1, so
a 32x32 input reaches the classifier at 2x2 (SAME padding everywhere, so a
28x28 input works too: 28 -> 14 -> 7 -> 4 -> 2).

Stages (``w`` is the width multiplier; channels are ``int(c * w)``; a cut
``c`` gives the client ``[0, c)``):
  0      stem:  conv3x3(32, stride 1) - norm - relu
  2k-1   dw{k}: depthwise conv3x3(stride s_k) - norm - relu,  k = 1..13
  2k     pw{k}: conv1x1(c_k) - norm - relu,                   k = 1..13
  27     classifier: global average pool - dense(num_classes)
with ``(c_k, s_k)`` = (64,1), (128,2), (128,1), (256,2), (256,1), (512,2),
(512,1) x5, (1024,2), (1024,1).

Mapping to the Hydra paper (Data Heterogeneity and Forgotten Labels in SFL,
Sec. 3 and App. G.4): the paper counts 26 layers but publishes no layer
list (presumably the 26 separable convolutions dw1, pw1, ..., dw13, pw13);
our 28 stages also count the stem (0) and the classifier (27).  The paper's
cut numbers are used as our stage indices:

* ``CUTS["shallow"] = 4`` (default cut, the paper's "layer 4"): the client
  holds stem, dw1, pw1 and dw2, i.e. its output is the stride-2 depthwise
  output with 64 channels at 16x16 for a 32x32 input (the bottleneck among
  the first stages); the server starts at pw2.
* ``CUTS["mid"] = 15``: the client holds up to pw7 (512 channels at 4x4).
* ``CUTS["deep"] = 23``: the client holds up to pw11 (512 channels at 4x4).
* ``HEAD_CUTS["small"] = 26`` (default head cut): heads are the last 2 stages,
  pw13 and the classifier, matching the paper's "heads = last 2 layers" (its
  second cut at layer 24 of 26).
* ``HEAD_CUTS["large"] = 20``: heads are stages 20..27 (pw10 to the
  classifier, 8 stages); the paper's large heads start at its layer 20, which
  it also calls "the last 6 layers" - that reading would be stage 22 here.

``norm="none"`` leaves the depthwise convolutions without bias (the pointwise
ones and the stem get one).
"""

from __future__ import annotations

import jax
from flax import nnx

from jsfl.models import layers
from jsfl.models.base import StagedModel, register

BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2),
          (512, 1), (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2),
          (1024, 1))
CUTS = {"shallow": 4, "mid": 15, "deep": 23}
HEAD_CUTS = {"small": 26, "large": 20}


class DepthwiseNormRelu(nnx.Module):
  """Depthwise conv3x3 - norm - relu."""

  def __init__(self, channels, stride, *, norm, depthwise_impl, rngs):
    self.conv = layers.DepthwiseConv(channels, 3, stride=stride,
                                     impl=depthwise_impl, rngs=rngs)
    self.norm = layers.Norm2d(channels, norm, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    return jax.nn.relu(self.norm(self.conv(x), train=train, mask=mask))


class Classifier(nnx.Module):
  """Global average pool - dense."""

  def __init__(self, din, num_classes, *, rngs):
    self.dense = layers.Dense(din, num_classes, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    return self.dense(layers.avg_pool_global(x))


def stage_names() -> tuple[str, ...]:
  """``("stem", "dw1", "pw1", ..., "dw13", "pw13", "classifier")``."""
  names = ["stem"]
  for k in range(1, len(BLOCKS) + 1):
    names += [f"dw{k}", f"pw{k}"]
  return tuple(names + ["classifier"])


@register("mobilenet_v1")
def mobilenet_v1(input_shape, num_classes, *, norm: str = "batch",
                 conv_impl: str | None = None,
                 depthwise_impl: str | None = None,
                 width: float = 1.0) -> StagedModel:
  """Builds MobileNetV1 (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)`` of one sample (32x32x3 and 28x28x1 both work).
    num_classes: output width.
    norm: ``"batch"`` (the original), ``"group"`` or ``"none"``, after every
      convolution.
    conv_impl: ``"xla"`` or ``"im2col"`` for the stem and pointwise convs;
      None picks :func:`layers.default_conv_impl`.
    depthwise_impl: ``"grouped"`` or ``"shifts"``; None picks
      :func:`layers.default_depthwise_impl`.
    width: width multiplier (> 0); every channel count ``c`` becomes
      ``max(1, int(c * width))``.

  Returns:
    The :class:`StagedModel` with 28 stages, default cut 4, default head cut
    26.
  """
  conv_impl, depthwise_impl = layers.resolve_options(
      "mobilenet_v1", input_shape, num_classes, norm, conv_impl, depthwise_impl, width)

  def ch(c):
    return max(1, int(c * width))

  cin = input_shape[2]

  def build(rngs):
    stages = [layers.ConvNormAct(cin, ch(32), 3, norm=norm, conv_impl=conv_impl,
                                 rngs=rngs)]
    c = ch(32)
    for cout, stride in BLOCKS:
      stages.append(DepthwiseNormRelu(c, stride, norm=norm,
                                      depthwise_impl=depthwise_impl,
                                      rngs=rngs))
      stages.append(layers.ConvNormAct(c, ch(cout), 1, norm=norm,
                                       conv_impl=conv_impl, rngs=rngs))
      c = ch(cout)
    stages.append(Classifier(c, num_classes, rngs=rngs))
    return stages

  return StagedModel("mobilenet_v1", build, tuple(input_shape), num_classes,
                     default_cut=CUTS["shallow"],
                     default_head_cut=HEAD_CUTS["small"],
                     head_cuts=tuple(HEAD_CUTS.items()),
                     stage_names=stage_names())
