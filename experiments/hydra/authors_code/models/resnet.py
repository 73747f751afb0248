"""ResNet-18 as jsfl's ``resnet18`` (CIFAR variant, 12 stages): conv1, bn1 -
relu, eight BasicBlocks, global average pool, dense.  Only ``resnet18`` is
defined (their ``get_resnet_split`` also takes deeper names)."""

import torch.nn.functional as F
from torch import nn

import jsfl_glue
from models.staged import Staged

BLOCKS = ((64, 1), (64, 1), (128, 2), (128, 1), (256, 2), (256, 1), (512, 2), (512, 1))


class BasicBlock(nn.Module):
  def __init__(self, cin, cout, stride):
    super().__init__()
    self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
    self.norm1 = nn.BatchNorm2d(cout)
    self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
    self.norm2 = nn.BatchNorm2d(cout)
    self.proj = None
    if stride != 1 or cin != cout:
      self.proj = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout))

  def forward(self, x):
    y = F.relu(self.norm1(self.conv1(x)))
    y = self.norm2(self.conv2(y))
    return F.relu((x if self.proj is None else self.proj(x)) + y)


class GlobalAvgPool(nn.Module):
  def forward(self, x):
    return x.mean((2, 3))


def stages(input_dim, output_dim, width):
  ch = lambda c: max(1, int(c * width))  # noqa: E731
  out = [nn.Conv2d(input_dim, ch(64), 3, 1, 1, bias=False),
         nn.Sequential(nn.BatchNorm2d(ch(64)), nn.ReLU())]
  c = ch(64)
  for cout, stride in BLOCKS:
    out.append(BasicBlock(c, ch(cout), stride))
    c = ch(cout)
  return out + [GlobalAvgPool(), nn.Linear(c, output_dim)]


def get_resnet_split(input_dim, output_dim, start, end, model_name):
  if model_name != "resnet18":
    raise ValueError(f"model {model_name!r}: only resnet18 is defined here")
  return Staged(stages(input_dim, output_dim, jsfl_glue.WIDTH), start, end)
