"""DenseNet-161 (Huang et al. 2017), small-image variant, one dense layer per
stage.

The MultiSFL / KoReA-SFL papers' TinyImageNet model (their Table 1 rows
"DenseNet161 / TinyImageNet").  Their code holds no DenseNet; jsfl takes
torchvision's DenseNet-161 (growth rate k = 48, 96 initial features,
bottleneck 4k, dense blocks of 6, 12, 36 and 24 layers, compression 0.5)
with one change for small images: the ImageNet stem (conv7x7 stride 2 and a
3x3 stride-2 max pool, a 4x reduction meant for 224x224 inputs) becomes a
conv3x3 stride 1 with no pool, as in Huang et al.'s own CIFAR DenseNets and
jsfl's CIFAR ResNets.  A 64x64 TinyImageNet image then reaches the
classifier at 8x8 (a 32x32 one at 4x4) instead of 2x2 (1x1), the same
ratio as the ImageNet model's 224 -> 7 (docs/models.md#densenet-161).

Stages (``w`` is the width multiplier on k and the initial features,
``max(1, int(c * w))``; a cut ``c`` gives the client ``[0, c)``, so cut ``c``
falls after stage ``c - 1``):
  0      stem:          conv3x3(2k) - norm - relu
  1..6   dense1_1..6:   dense layer (block 1)
  7      transition1:   norm - relu - conv1x1(c / 2) - avgpool2
  8..19  dense2_1..12:  dense layer (block 2)
  20     transition2
  21..56 dense3_1..36:  dense layer (block 3)
  57     transition3
  58..81 dense4_1..24:  dense layer (block 4)
  82     norm5:         norm - relu
  83     classifier:    global average pool - dense(num_classes)
with ``c`` the channels entering the transition (torchvision's ``c // 2``).
A dense layer is norm - relu - conv1x1(4k) - norm - relu - conv3x3(k), its k
new channels concatenated after its input, so a stage's output holds every
earlier feature of its block (what a cut there sends).  Channels at w = 1:
96 -> 384 (block 1) -> 192 -> 768 -> 384 -> 2112 -> 1056 -> 2208.

Cuts (``CUTS``), each after a transition, where the features are fewest
(the bottleneck rule the Hydra paper follows for its cuts):
  8   shallow, the default cut: the client holds the stem, block 1 and
      transition 1 (192 channels at 1/2 size: 49,152 values for a 32x32
      input, against 65,536 at MultiSFL's ResNet-18 cut, which likewise
      gives the client the stem and the first stage)
  21  mid: through transition 2 (384 channels at 1/4 size)
  58  deep: through transition 3 (1056 channels at 1/8 size)
The default head cut (Hydra) is 82: heads are norm5 and the classifier, the
last 2 stages, as ``resnet18``'s.

Every convolution has stride 1 and the pools pad nothing, so, unlike the
ResNets and MobileNets, ``model.padding`` does not change the function.
``norm="none"`` gives every convolution a bias.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx

from jsfl.models import layers
from jsfl.models.base import StagedModel, check_input_size, register

GROWTH = 48
INIT_FEATURES = 96
BN_SIZE = 4
BLOCKS = (6, 12, 36, 24)
CUTS = {"shallow": 8, "mid": 21, "deep": 58}


def avg_pool2(x):
  """2x2 average pool, stride 2, no padding: PyTorch's ``AvgPool2d(2)``,
  which leaves out the last row (column) of an odd size."""
  b, h, w, c = x.shape
  x = x[:, :h // 2 * 2, :w // 2 * 2]
  return x.reshape(b, h // 2, 2, w // 2, 2, c).mean((2, 4))


class DenseLayer(nnx.Module):
  """norm - relu - conv1x1 - norm - relu - conv3x3, concatenated after the
  input."""

  def __init__(self, cin, growth, bottleneck, *, norm, conv_impl, rngs):
    # Every conv output meets a norm next (the following layer's, the
    # transition's or norm5) before anything else, which cancels a bias.
    bias = norm == "none"
    self.norm1 = layers.Norm2d(cin, norm, rngs=rngs)
    self.conv1 = layers.Conv(cin, bottleneck, 1, impl=conv_impl,
                             use_bias=bias, rngs=rngs)
    self.norm2 = layers.Norm2d(bottleneck, norm, rngs=rngs)
    self.conv2 = layers.Conv(bottleneck, growth, 3, impl=conv_impl,
                             use_bias=bias, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    y = self.conv1(jax.nn.relu(self.norm1(x, train=train, mask=mask)))
    y = self.conv2(jax.nn.relu(self.norm2(y, train=train, mask=mask)))
    return jnp.concatenate([x, y], axis=-1)


class Transition(nnx.Module):
  """norm - relu - conv1x1 - avgpool2."""

  def __init__(self, cin, cout, *, norm, conv_impl, rngs):
    self.norm = layers.Norm2d(cin, norm, rngs=rngs)
    self.conv = layers.Conv(cin, cout, 1, impl=conv_impl,
                            use_bias=norm == "none", rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    return avg_pool2(self.conv(jax.nn.relu(self.norm(x, train=train, mask=mask))))


class Classifier(nnx.Module):
  """Global average pool - dense."""

  def __init__(self, din, num_classes, *, rngs):
    self.dense = layers.Dense(din, num_classes, rngs=rngs)

  def __call__(self, x, *, train=False, mask=None):
    return self.dense(layers.avg_pool_global(x))


def stage_names() -> tuple[str, ...]:
  """``("stem", "dense1_1", ..., "transition1", ..., "dense4_24", "norm5",
  "classifier")``."""
  names = ["stem"]
  for b, n in enumerate(BLOCKS, start=1):
    names += [f"dense{b}_{i}" for i in range(1, n + 1)]
    if b < len(BLOCKS):
      names.append(f"transition{b}")
  return tuple(names + ["norm5", "classifier"])


@register("densenet161")
def densenet161(input_shape, num_classes, *, norm: str = "batch",
                conv_impl: str | None = None, depthwise_impl: str | None = None,
                width: float = 1.0) -> StagedModel:
  """Builds DenseNet-161 (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)`` of one sample (64x64x3 for TinyImageNet,
      32x32x3 for CIFAR; at least 8x8).
    num_classes: output width.
    norm: ``"batch"`` (the original), ``"group"`` or ``"none"``, wherever
      the original has a BatchNorm.
    conv_impl: ``"xla"`` or ``"im2col"``; None picks
      :func:`layers.default_conv_impl`.
    depthwise_impl: unused (no depthwise layers); validated and accepted for a
      uniform factory interface.
    width: width multiplier (> 0) on the growth rate 48 and the 96 initial
      features: each becomes ``max(1, int(c * width))``; the bottleneck is 4
      growths wide and a transition keeps half its input, as at width 1.

  Returns:
    The :class:`StagedModel` with 84 stages, default cut 8, default head cut
    82.
  """
  conv_impl, depthwise_impl = layers.resolve_options(
      "densenet161", input_shape, num_classes, norm, conv_impl, depthwise_impl, width)
  # three transitions halve the side, flooring as PyTorch's pool does
  check_input_size("densenet161", input_shape, lambda s: s // 8)

  def ch(c):
    return max(1, int(c * width))

  growth, cin = ch(GROWTH), input_shape[2]

  def build(rngs):
    c = ch(INIT_FEATURES)
    stages = [layers.ConvNormAct(cin, c, 3, norm=norm, conv_impl=conv_impl, rngs=rngs)]
    for b, n in enumerate(BLOCKS, start=1):
      for _ in range(n):
        stages.append(DenseLayer(c, growth, BN_SIZE * growth, norm=norm,
                                 conv_impl=conv_impl, rngs=rngs))
        c += growth
      if b < len(BLOCKS):
        stages.append(Transition(c, c // 2, norm=norm, conv_impl=conv_impl,
                                 rngs=rngs))
        c //= 2
    stages += [layers.NormRelu(c, norm=norm, rngs=rngs),
               Classifier(c, num_classes, rngs=rngs)]
    return stages

  return StagedModel("densenet161", build, tuple(input_shape), num_classes,
                     default_cut=CUTS["shallow"], default_head_cut=82,
                     stage_names=stage_names())
