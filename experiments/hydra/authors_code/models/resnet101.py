"""ResNet-101 as jsfl's ``resnet101`` (CIFAR variant, 37 stages): conv1,
bn1 - relu, 33 bottleneck blocks (groups of 3, 4, 23 and 3), global average
pool, dense.  Stage numbers are the Hydra paper's layer numbers (its cuts 2,
10, 33 and head cuts 33, 30).  The Hydra repository imports a
``models/resnet.py`` it does not hold; this follows He et al.'s ResNet-101
with the stride on the 3x3 conv (torchvision's) and the CIFAR stem of our
``resnet.py``.  ``width`` multiplies every channel count as jsfl does
(``max(1, int(c * width))``).  ``../torch_reference.py`` records what this
model computes for jsfl's test that the two are one function.
"""

import torch.nn.functional as F
from torch import nn

import jsfl_glue
from models.resnet import GlobalAvgPool
from models.staged import Staged

GROUPS = ((64, 3, 1), (128, 4, 2), (256, 23, 2), (512, 3, 2))  # (m, blocks, stride)


class Bottleneck(nn.Module):
  def __init__(self, cin, mid, cout, stride):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, mid, 1, bias=False)
    self.norm1 = nn.BatchNorm2d(mid)
    self.conv2 = nn.Conv2d(mid, mid, 3, stride, 1, bias=False)
    self.norm2 = nn.BatchNorm2d(mid)
    self.conv3 = nn.Conv2d(mid, cout, 1, bias=False)
    self.norm3 = nn.BatchNorm2d(cout)
    self.proj = None
    if stride != 1 or cin != cout:
      self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

  def forward(self, x):
    y = F.relu(self.norm1(self.conv1(x)))
    y = F.relu(self.norm2(self.conv2(y)))
    y = self.norm3(self.conv3(y))
    return F.relu((x if self.proj is None else self.proj(x)) + y)


def stages(input_dim, output_dim, width):
  ch = lambda c: max(1, int(c * width))  # noqa: E731
  out = [nn.Conv2d(input_dim, ch(64), 3, 1, 1, bias=False),
         nn.Sequential(nn.BatchNorm2d(ch(64)), nn.ReLU())]
  c = ch(64)
  for m, n, stride in GROUPS:
    for i in range(n):
      out.append(Bottleneck(c, ch(m), ch(4 * m), stride if i == 0 else 1))
      c = ch(4 * m)
  return out + [GlobalAvgPool(), nn.Linear(c, output_dim)]


def get_resnet101_split(input_dim, output_dim, start, end):
  """Stages ``[start, end)`` (the authors' ``-1`` conventions, ``Staged``)."""
  return Staged(stages(input_dim, output_dim, jsfl_glue.WIDTH), start, end)
