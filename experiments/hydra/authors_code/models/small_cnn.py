"""jsfl's ``small_cnn`` (``norm = "none"``, width 16) in PyTorch.

Stages as ``jsfl/models/small_cnn.py``: 0 conv3x3(16) - relu - maxpool2,
1 conv3x3(32) - relu - maxpool2, 2 dense(128) - relu, 3 dense(classes); the
convolutions carry biases (no normalisation), padding 1 (= SAME for 3x3,
stride 1).
"""

from torch import nn

from models.staged import Staged


def stages(input_dim, output_dim, side=28, width=16, hidden=128):
  flat = (side // 4) * (side // 4) * 2 * width
  return [
      nn.Sequential(nn.Conv2d(input_dim, width, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)),
      nn.Sequential(nn.Conv2d(width, 2 * width, 3, 1, 1), nn.ReLU(), nn.MaxPool2d(2)),
      nn.Sequential(nn.Flatten(), nn.Linear(flat, hidden), nn.ReLU()),
      nn.Sequential(nn.Flatten(), nn.Linear(hidden, output_dim)),
  ]


class SmallCNN(Staged):
  def __init__(self, input_dim, output_dim, start, end, width=16):
    super().__init__(stages(input_dim, output_dim, width=width), start, end)
