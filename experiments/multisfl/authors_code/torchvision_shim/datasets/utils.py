"""``torchvision.datasets.utils`` placeholders (imported by the authors'
``utils/mydata.py``; nothing may be downloaded here)."""


def check_integrity(fpath, md5=None):
  return False


def download_and_extract_archive(*args, **kwargs):
  raise NotImplementedError("torchvision shim: downloads are not available")
