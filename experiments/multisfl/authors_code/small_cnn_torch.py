"""jsfl's small CNN with BatchNorm, cut 2, as the authors' split model pair.

Our own PyTorch port of ``jsfl/models/small_cnn.py`` (``norm="batch"``,
defaults ``width=16``, ``hidden=128``) for the MultiSFL authors' code;
``adapt.py`` copies it into their clone and ``main_fed.py`` builds it for
``--model small_cnn``.

jsfl's stages and the cut:

  0 conv1: conv3x3(1 -> 16, SAME, no bias) - BN - relu - maxpool2   \\ part-1
  1 conv2: conv3x3(16 -> 32, SAME, no bias) - BN - relu - maxpool2  / (client)
  ---- cut 2: features (32, 7, 7) for 28x28 inputs ----
  2 fc1:   dense(32*7*7 -> 128) - relu                              \\ part-2
  3 fc2:   dense(128 -> 10)                                         / (server)

Matching jsfl: convolutions have no bias (BN follows), BN eps 1e-5 and
momentum 0.1 (jsfl's 0.9 in Flax's convention), affine BN initialised to
scale 1 / bias 0.  The weights follow jsfl's ``model.init``, picked by the
environment variable ``SMALL_CNN_INIT`` (``run.sh``'s ``INIT``):

* ``torch`` (the default, as jsfl's): PyTorch's own layer defaults, i.e.
  what their code gives any model it does not initialise itself: conv and
  dense weights uniform in +-1/sqrt(fan_in), dense biases likewise.
* ``he_lecun`` (jsfl's ``model.init = "he_lecun"``): conv kernels He-normal
  on fan-in (jsfl ``_he_normal``), dense kernels truncated-normal LeCun
  (Flax ``nnx.Linear``'s default: std ``sqrt(1 / fan_in) / 0.8796``, cut at
  2 std) with zero biases.

Differences that remain: PyTorch flattens NCHW where jsfl flattens NHWC (a
fixed permutation of fc1's inputs, so the same function class), and
PyTorch's BN running variance uses the unbiased batch variance where Flax's
uses the biased one (the running variance differs by a factor
``n / (n - 1)``, ``n`` = batch x H x W: 1.0001 for a full batch of 50, at
most 1.005 for a single sample's 14x14 map).
"""

from __future__ import annotations

import math
import os

import torch
import torch.nn.functional as F
from torch import nn


class SmallCNNClient(nn.Module):
  """Part-1: jsfl stages 0-1 (conv1, conv2)."""

  def __init__(self, in_channels: int = 1, width: int = 16, init: str = "torch"):
    super().__init__()
    self.conv1 = nn.Conv2d(in_channels, width, 3, padding=1, bias=False)
    self.bn1 = nn.BatchNorm2d(width, eps=1e-5, momentum=0.1)
    self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1, bias=False)
    self.bn2 = nn.BatchNorm2d(2 * width, eps=1e-5, momentum=0.1)
    if _check_init(init) == "he_lecun":
      for conv in (self.conv1, self.conv2):
        nn.init.kaiming_normal_(conv.weight, mode="fan_in", nonlinearity="relu")

  def forward(self, x):
    x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
    return F.max_pool2d(F.relu(self.bn2(self.conv2(x))), 2)


INITS = ("torch", "he_lecun")


def _check_init(init: str) -> str:
  if init not in INITS:
    raise SystemExit(f"small_cnn_torch: init {init!r} is not one of {', '.join(INITS)}")
  return init


def _lecun_truncated(linear: nn.Linear) -> None:
  std = math.sqrt(1.0 / linear.in_features) / 0.87962566103423978
  nn.init.trunc_normal_(linear.weight, std=std, a=-2 * std, b=2 * std)
  nn.init.zeros_(linear.bias)


class SmallCNNServer(nn.Module):
  """Part-2: jsfl stages 2-3 (fc1, fc2)."""

  def __init__(self, num_classes: int = 10, features: int = 32 * 7 * 7,
               hidden: int = 128, init: str = "torch"):
    super().__init__()
    self.fc1 = nn.Linear(features, hidden)
    self.fc2 = nn.Linear(hidden, num_classes)
    if _check_init(init) == "he_lecun":
      _lecun_truncated(self.fc1)
      _lecun_truncated(self.fc2)

  def forward(self, x):
    return self.fc2(F.relu(self.fc1(torch.flatten(x, 1))))


def build(args):
  """``(complete, client, server)`` for the authors' main_fed.py.

  ``client`` / ``server`` are the split pair their MultiSFL and SFL train;
  ``complete`` is their ``Complete_Model`` (returns ``{'output': logits}``,
  which their FedAvg and ``test_img`` expect) over deep copies of the same
  pair, so all three methods start from the same weights for a given seed.
  ``SMALL_CNN_INIT`` picks the initialisation (module docstring).
  """
  import copy

  from models.SplitModel import Complete_Model  # the authors' wrapper
  in_ch = 1 if args.dataset in ("fashion-mnist", "mnist") else args.num_channels
  side = 28 if in_ch == 1 else 32
  init = os.environ.get("SMALL_CNN_INIT", "torch")
  client = SmallCNNClient(in_ch, init=init)
  server = SmallCNNServer(args.num_classes, 32 * (side // 4) ** 2, init=init)
  complete = Complete_Model(copy.deepcopy(client), copy.deepcopy(server))
  return complete, client, server


def state_bytes(module: nn.Module) -> int:
  """float32 bytes of a module's state_dict (parameters and BN buffers)."""
  return sum(4 * t.numel() for t in module.state_dict().values() if t.is_floating_point())


# Bytes per sample of the cut features (32 x 7 x 7 float32) and of the
# client portion: the authors' MultiSFL traffic counter needs both
# (`feature_size`, `model_size`; they set them for resnet / vgg only).
FEATURE_BYTES = 32 * 7 * 7 * 4
CLIENT_BYTES = state_bytes(SmallCNNClient(1))
