"""``Compose``, ``ToTensor`` and ``Normalize`` as torchvision defines them for
the inputs the shim's datasets produce (uint8 ``(H, W)`` / ``(H, W, C)``
arrays or tensors, or PIL images)."""

import numpy as np
import torch


class Compose:
  def __init__(self, transforms):
    self.transforms = list(transforms)

  def __call__(self, x):
    for t in self.transforms:
      x = t(x)
    return x


class ToTensor:
  """uint8 ``(H, W[, C])`` -> float32 ``(C, H, W)`` in [0, 1], as torchvision."""

  def __call__(self, pic):
    if not isinstance(pic, (np.ndarray, torch.Tensor)):  # a PIL image
      pic = np.array(pic, copy=True)
    t = torch.as_tensor(pic)
    if t.ndim == 2:
      t = t.unsqueeze(-1)
    t = t.permute(2, 0, 1).contiguous()
    return t.to(torch.float32).div(255) if t.dtype == torch.uint8 else t.to(torch.float32)


class Normalize:
  """``(x - mean) / std`` per channel of a ``(C, H, W)`` tensor."""

  def __init__(self, mean, std, inplace=False):
    self.mean = torch.as_tensor(mean, dtype=torch.float32).view(-1, 1, 1)
    self.std = torch.as_tensor(std, dtype=torch.float32).view(-1, 1, 1)

  def __call__(self, t):
    return (t - self.mean) / self.std
