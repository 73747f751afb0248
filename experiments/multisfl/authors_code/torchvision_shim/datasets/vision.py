"""``torchvision.datasets.vision.VisionDataset``, reduced to what the
datasets here and the authors' ``utils/mydata.py`` subclass from it."""

import torch.utils.data


class VisionDataset(torch.utils.data.Dataset):
  def __init__(self, root=None, transforms=None, transform=None, target_transform=None):
    self.root = root
    self.transform = transform
    self.target_transform = target_transform
    self.transforms = transforms
