"""LeNet-5 (LeCun et al. 1998) as used in split learning (Thapa et al. 2022).

Stages (cut indices in brackets; a cut ``c`` gives the client ``[0, c)``):
  0 conv1: conv5x5(6, SAME) - norm - relu - maxpool2    [cut 1 after it]
  1 conv2: conv5x5(16, VALID) - norm - relu - maxpool2  [cut 2, default]
  2 fc1:   dense(120) - relu                            [cut 3]
  3 fc2:   dense(84) - relu                             [cut 4, default head cut]
  4 fc3:   dense(num_classes)

The default cut 2 is Thapa et al.'s "after the 2nd layer (the 2-D MaxPool)"
(recalled in the Hydra paper, App. D.2): the client holds both conv blocks.
The default head cut 4 makes Hydra's heads the last dense layer.

Padding: conv1 pads SAME (2 pixels, the usual LeNet-for-MNIST choice) and
conv2 is VALID, so any input of at least 12x12 works.  A 28x28 input gives
the classic 28 -> 14 -> 10 -> 5 feature maps (16*5*5 = 400 features into
fc1); a 32x32 input gives 32 -> 16 -> 12 -> 6 (16*6*6 = 576 features).
``conv1_padding = "valid"`` leaves conv1 unpadded, as the LeNet-5 of
FedSeq's authors' code (Li & Lyu; docs/models.md): 28 -> 24 -> 12 -> 8 -> 4,
16*4*4 = 256 features into fc1, for inputs of at least 16x16.
"""

from __future__ import annotations

from jsfl.models import layers
from jsfl.models.base import StagedModel, check_input_size, register

CONV1_PADDINGS = ("same", "valid")


@register("lenet5")
def lenet5(input_shape, num_classes, *, norm: str = "none",
           conv_impl: str | None = None,
           depthwise_impl: str | None = None,
           conv1_padding: str = "same") -> StagedModel:
  """Builds LeNet-5 (stage numbering in the module docstring).

  Args:
    input_shape: ``(H, W, C)`` of one sample; H and W at least 12.
    num_classes: output width.
    norm: ``"none"`` (the original LeNet), ``"batch"`` or ``"group"``, applied
      after each convolution.
    conv_impl: ``"xla"`` or ``"im2col"``; None picks
      :func:`layers.default_conv_impl`.
    depthwise_impl: unused (no depthwise layers); validated and accepted for a
      uniform factory interface.
    conv1_padding: ``"same"`` (2 pixels) or ``"valid"`` (none: FedSeq's
      authors' LeNet-5).

  Returns:
    The :class:`StagedModel` with 5 stages, default cut 2, default head cut 4.
  """
  conv_impl, depthwise_impl = layers.resolve_options(
      "lenet5", input_shape, num_classes, norm, conv_impl, depthwise_impl)
  if conv1_padding not in CONV1_PADDINGS:
    raise ValueError(f"lenet5: conv1_padding={conv1_padding!r}; allowed: "
                     f"{', '.join(CONV1_PADDINGS)}")
  h, w, c = input_shape
  shrink = 4 if conv1_padding == "valid" else 0

  def spatial(s):
    # conv1 SAME keeps s (VALID removes 4); pool halves; conv2 VALID removes 4;
    # pool halves.
    return ((s - shrink) // 2 - 4) // 2

  check_input_size("lenet5", input_shape, spatial)
  flat = spatial(h) * spatial(w) * 16

  def build(rngs):
    return [
        layers.ConvPoolBlock(c, 6, 5, padding=conv1_padding.upper(), norm=norm,
                             conv_impl=conv_impl, rngs=rngs),
        layers.ConvPoolBlock(6, 16, 5, padding="VALID", norm=norm, conv_impl=conv_impl,
                      rngs=rngs),
        layers.DenseRelu(flat, 120, rngs=rngs),
        layers.DenseRelu(120, 84, rngs=rngs),
        layers.Dense(84, num_classes, rngs=rngs),
    ]

  return StagedModel("lenet5", build, tuple(input_shape), num_classes,
                     default_cut=2, default_head_cut=4,
                     stage_names=("conv1", "conv2", "fc1", "fc2", "fc3"))
