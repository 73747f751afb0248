"""A minimal stand-in for torchvision (our own code, not torchvision's).

No usable torchvision wheel matches the CPU torch 2.13.0 installed for the
authors' MultiSFL code, and their Fashion-MNIST path needs very little of it.
``adapt.py`` copies this folder into their clone as ``torchvision/``.  It
provides every name their code imports from torchvision:

* ``torchvision.datasets.FashionMNIST`` (read from local IDX files by
  ``fmnist_idx``; ``download`` is ignored), and placeholders ``MNIST``,
  ``CIFAR10``, ``CIFAR100``, ``SVHN`` that raise when constructed;
* ``torchvision.datasets.vision.VisionDataset``,
  ``torchvision.datasets.utils.check_integrity`` /
  ``download_and_extract_archive``, ``torchvision.datasets.cifar.CIFAR10``
  (imported at module level by their ``utils/mydata.py``; unused on this path);
* ``torchvision.transforms.Compose`` / ``ToTensor`` / ``Normalize``;
* ``torchvision.models`` (imported by their ``models/Nets.py``; its
  ``resnet18`` / ``resnet50`` raise when called).
"""

from torchvision import datasets, models, transforms  # noqa: F401

__version__ = "0.0-shim"
