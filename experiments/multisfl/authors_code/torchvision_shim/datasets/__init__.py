"""``torchvision.datasets`` for the shim: Fashion-MNIST from local IDX files.

``FashionMNIST(root, train, download, transform, target_transform)`` behaves
like torchvision's for the authors' code: ``data`` is a uint8 tensor
``(N, 28, 28)``, ``targets`` an int64 tensor, and ``dataset[i]`` returns
``(transform(image), int(label))``.  The images come from ``fmnist_idx``
(Debian's files or ``$FMNIST_DIR``), not from ``root``; ``download`` is
ignored, but ``root`` is created as torchvision does when it downloads (the
authors' ``get_dataset`` then writes its split json under ``data/``).  The
image handed to ``transform`` is the uint8 array itself, not a PIL image;
the shim's ``ToTensor`` gives the same tensor torchvision's gives for the PIL
image.
"""

import os

import torch
from torchvision.datasets.vision import VisionDataset


class FashionMNIST(VisionDataset):
  classes = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat", "Sandal",
             "Shirt", "Sneaker", "Bag", "Ankle boot")

  def __init__(self, root, train=True, transform=None, target_transform=None,
               download=False):
    super().__init__(root, transform=transform, target_transform=target_transform)
    import fmnist_idx  # our glue, copied next to the shim by adapt.py
    if download and root:
      os.makedirs(root, exist_ok=True)
    self.train = train
    x, y = fmnist_idx.load(train)
    self.data = torch.from_numpy(x)
    self.targets = torch.from_numpy(y)

  def __len__(self):
    return len(self.data)

  def __getitem__(self, index):
    img, target = self.data[index].numpy(), int(self.targets[index])
    if self.transform is not None:
      img = self.transform(img)
    if self.target_transform is not None:
      target = self.target_transform(target)
    return img, target


class _Unavailable(VisionDataset):
  def __init__(self, *args, **kwargs):
    raise NotImplementedError(f"torchvision shim: {type(self).__name__} is not "
                              "available (only FashionMNIST is)")


class MNIST(_Unavailable):
  pass


class SVHN(_Unavailable):
  pass


class CIFAR100(_Unavailable):
  pass


from torchvision.datasets.cifar import CIFAR10  # noqa: F401
