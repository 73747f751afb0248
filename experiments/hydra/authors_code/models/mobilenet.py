"""MobileNetV1 as jsfl's ``mobilenet_v1`` (CIFAR variant, 28 stages).

Stage 0 the stem conv3x3(32, stride 1) - BN - relu; stages 2k-1 / 2k the
k-th depthwise conv3x3 - BN - relu and pointwise conv1x1 - BN - relu; stage
27 global average pool - dense.  Convolutions without bias, BatchNorm with
PyTorch's defaults.  ``width`` multiplies every channel count as jsfl does
(``max(1, int(c * width))``); the adapted scripts pass ``--width``.
Padding is PyTorch's ``kernel // 2``, jsfl's default ``model.padding =
"torch"``; ``../torch_reference.py`` records what this model computes for
jsfl's test that the two are one function.
"""

from torch import nn

import jsfl_glue
from models.staged import Staged

BLOCKS = ((64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1),
          (512, 1), (512, 1), (512, 1), (512, 1), (1024, 2), (1024, 1))


def conv_bn_relu(cin, cout, kernel, stride=1, groups=1):
  return nn.Sequential(nn.Conv2d(cin, cout, kernel, stride, kernel // 2, groups=groups,
                                 bias=False),
                       nn.BatchNorm2d(cout), nn.ReLU())


class Classifier(nn.Module):
  def __init__(self, din, num_classes):
    super().__init__()
    self.fc = nn.Linear(din, num_classes)

  def forward(self, x):
    return self.fc(x.mean((2, 3)))


def stages(input_dim, output_dim, width):
  ch = lambda c: max(1, int(c * width))  # noqa: E731
  out = [conv_bn_relu(input_dim, ch(32), 3)]
  c = ch(32)
  for cout, stride in BLOCKS:
    out += [conv_bn_relu(c, c, 3, stride, groups=c), conv_bn_relu(c, ch(cout), 1)]
    c = ch(cout)
  return out + [Classifier(c, output_dim)]


class MobileNetV1(Staged):
  def __init__(self, input_dim, output_dim, start, end):
    super().__init__(stages(input_dim, output_dim, jsfl_glue.WIDTH), start, end)
