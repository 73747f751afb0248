"""AlexNet for 32x32 inputs, 8 layers (5 conv + 3 dense), as used by SFedKD
for CIFAR-10 / CINIC-10 ("an 8-layer AlexNet", Sec. 4.1; Krizhevsky et al.
2012).

The paper publishes no layer list; this is the CIFAR AlexNet common in FL
code: the ImageNet channel widths with 3x3 kernels and a stride-2 stem.

Stages (cut indices in brackets; a cut ``c`` gives the client ``[0, c)``):
  0 conv1: pad 1 - conv3x3(64, stride 2) - norm - relu - maxpool2  [cut 1]
  1 conv2: conv3x3(192) - norm - relu - maxpool2                   [cut 2, default]
  2 conv3: conv3x3(384) - norm - relu                              [cut 3]
  3 conv4: conv3x3(256) - norm - relu                              [cut 4]
  4 conv5: conv3x3(256) - norm - relu - maxpool2                   [cut 5]
  5 fc1:   dense(hidden) - relu                                    [cut 6]
  6 fc2:   dense(hidden) - relu                                    [cut 7, default head cut]
  7 fc3:   dense(num_classes)

Feature maps for 32x32: 32 -> 16 -> 8 -> 8 -> 4 -> 4 -> 4 -> 2, so fc1 sees
256 * 2 * 2 = 1024 features; a 28x28 input gives 28 -> 14 -> 7 -> 3 -> 1
(256 features).  conv2..conv5 pad SAME (1 pixel, as in the PyTorch models);
conv1 pads 1 pixel on every side, PyTorch's ``padding=1`` (XLA's SAME would
pad only after).

Departures: no dropout (stages are deterministic functions; the FL code
this follows has its dropout commented out); ``hidden`` (default 4096, the
ImageNet width) is configurable because the two 4096-wide dense layers hold
~21M of the ~23M parameters.
"""

from __future__ import annotations

import jax.numpy as jnp

from jsfl.models import layers
from jsfl.models.base import StagedModel, check_input_size, register


class ConvNormRelu(layers.ConvNormAct):
  """[pad] - conv3x3 - norm - relu [- maxpool2]."""

  def __init__(self, cin, cout, *, stride=1, pad=0, pool=False, norm, conv_impl,
               rngs):
    super().__init__(cin, cout, 3, stride=stride, padding="VALID" if pad else "SAME",
                     norm=norm, conv_impl=conv_impl, rngs=rngs)
    self.pad, self.pool = pad, pool

  def __call__(self, x, *, train=False, mask=None):
    if self.pad:
      p = self.pad
      x = jnp.pad(x, ((0, 0), (p, p), (p, p), (0, 0)))
    x = super().__call__(x, train=train, mask=mask)
    return layers.max_pool(x, 2) if self.pool else x


@register("alexnet")
def alexnet(input_shape, num_classes, *, norm: str = "none",
            conv_impl: str | None = None, hidden: int = 4096,
            depthwise_impl: str | None = None) -> StagedModel:
  """Builds the 8-layer CIFAR AlexNet (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)``; H and W at least 15.
    num_classes: output width.
    norm: ``"none"`` (default, as in the paper's family), ``"batch"`` or
      ``"group"`` after each convolution.
    conv_impl: ``"xla"`` or ``"im2col"``; None picks the backend default.
    hidden: width of fc1 and fc2.
    depthwise_impl: unused; accepted for a uniform factory interface.

  Returns:
    The :class:`StagedModel` with 8 stages, default cut 2, default head cut 7.
  """
  conv_impl, _ = layers.resolve_options("alexnet", input_shape, num_classes, norm,
                                        conv_impl, depthwise_impl)
  if not isinstance(hidden, int) or isinstance(hidden, bool) or hidden < 1:
    raise ValueError(f"alexnet: hidden={hidden!r}; allowed: an int >= 1")
  h, w, c = input_shape

  def spatial(s):
    return (((s + 2 - 3) // 2 + 1) // 2 // 2) // 2

  check_input_size("alexnet", input_shape, spatial)
  flat = spatial(h) * spatial(w) * 256
  kw = {"norm": norm, "conv_impl": conv_impl}

  def build(rngs):
    return [
        ConvNormRelu(c, 64, stride=2, pad=1, pool=True, rngs=rngs, **kw),
        ConvNormRelu(64, 192, pool=True, rngs=rngs, **kw),
        ConvNormRelu(192, 384, rngs=rngs, **kw),
        ConvNormRelu(384, 256, rngs=rngs, **kw),
        ConvNormRelu(256, 256, pool=True, rngs=rngs, **kw),
        layers.DenseRelu(flat, hidden, rngs=rngs),
        layers.DenseRelu(hidden, hidden, rngs=rngs),
        layers.Dense(hidden, num_classes, rngs=rngs),
    ]

  return StagedModel("alexnet", build, tuple(input_shape), num_classes,
                     default_cut=2, default_head_cut=7,
                     stage_names=("conv1", "conv2", "conv3", "conv4", "conv5",
                                  "fc1", "fc2", "fc3"))
