"""DenseNet-161 as jsfl's ``densenet161`` (84 stages), for the MultiSFL /
KoReA-SFL papers' TinyImageNet rows; their code holds no DenseNet.

torchvision's DenseNet-161 (growth rate 48, 96 initial features, bottleneck
4 x 48, blocks of 6, 12, 36 and 24 dense layers, transitions halving the
channels with ``c // 2``) with the small-image stem: conv3x3 stride 1 -
BatchNorm - relu and no max pool in place of conv7x7 stride 2 and the 3x3
stride-2 pool.  Stage 0 the stem; then each dense layer is a stage (BN -
relu - conv1x1 - BN - relu - conv3x3, its output concatenated after its
input), each transition too (BN - relu - conv1x1 - avgpool2); then norm5
(BN - relu) and the classifier (global average pool - dense).  ``width``
multiplies the growth rate and the initial features as jsfl does
(``max(1, int(c * width))``).  ``../torch_reference.py`` records what this
model computes for jsfl's test that the two are one function.
"""

import torch
from torch import nn

BLOCKS = (6, 12, 36, 24)


class DenseLayer(nn.Module):
  def __init__(self, cin, growth, bottleneck):
    super().__init__()
    self.norm1 = nn.BatchNorm2d(cin)
    self.conv1 = nn.Conv2d(cin, bottleneck, 1, bias=False)
    self.norm2 = nn.BatchNorm2d(bottleneck)
    self.conv2 = nn.Conv2d(bottleneck, growth, 3, 1, 1, bias=False)

  def forward(self, x):
    y = self.conv1(torch.relu(self.norm1(x)))
    y = self.conv2(torch.relu(self.norm2(y)))
    return torch.cat([x, y], 1)


class Classifier(nn.Module):
  def __init__(self, din, num_classes):
    super().__init__()
    self.fc = nn.Linear(din, num_classes)

  def forward(self, x):
    return self.fc(x.mean((2, 3)))


def stages(input_dim, output_dim, width=1.0, growth=48, init_features=96, bn_size=4):
  ch = lambda c: max(1, int(c * width))  # noqa: E731
  k, c = ch(growth), ch(init_features)
  out = [nn.Sequential(nn.Conv2d(input_dim, c, 3, 1, 1, bias=False), nn.BatchNorm2d(c),
                       nn.ReLU())]
  for b, n in enumerate(BLOCKS):
    for _ in range(n):
      out.append(DenseLayer(c, k, bn_size * k))
      c += k
    if b < len(BLOCKS) - 1:
      out.append(nn.Sequential(nn.BatchNorm2d(c), nn.ReLU(), nn.Conv2d(c, c // 2, 1, bias=False),
                               nn.AvgPool2d(2, 2)))
      c //= 2
  return out + [nn.Sequential(nn.BatchNorm2d(c), nn.ReLU()), Classifier(c, output_dim)]
