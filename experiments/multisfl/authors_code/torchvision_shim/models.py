"""Placeholder for ``torchvision.models`` (imported, never used, by the
authors' ``models/Nets.py`` on the Fashion-MNIST path)."""


def _unavailable(*_, **__):
  raise NotImplementedError("torchvision shim: torchvision.models is not available")


resnet18 = resnet50 = _unavailable
