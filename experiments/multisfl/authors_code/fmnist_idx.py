"""Fashion-MNIST from IDX files, normalised as jsfl normalises it.

Our own glue for running the MultiSFL authors' code (CodeFree-xzk/MultiSFL)
on Fashion-MNIST; ``adapt.py`` copies it into their clone.  The torchvision
shim's ``datasets.FashionMNIST`` reads the arrays through :func:`load`, and the
adapted ``utils/get_dataset.py`` normalises with :data:`MEAN` / :data:`STD`.

Files: ``$FMNIST_DIR`` if set, else ``/usr/share/datasets/fashion-mnist``
(Debian's ``dataset-fashion-mnist``), holding the four
``{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]`` files.

Normalisation: jsfl (``jsfl/data/__init__.py``: ``channel_stats`` and
``normalize``) feeds ``(x / 255 - mean) / std`` with the exact per-channel
mean and (population) std of ``x_train / 255`` over the whole 60k training
set; :func:`channel_stats` computes the same two numbers the same way
(0.28604 and 0.35302 for Fashion-MNIST).
"""

from __future__ import annotations

import gzip
import os

import numpy as np

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"
_DTYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"),
           0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}
_STEMS = {("train", "x"): "train-images-idx3-ubyte",
          ("train", "y"): "train-labels-idx1-ubyte",
          ("test", "x"): "t10k-images-idx3-ubyte",
          ("test", "y"): "t10k-labels-idx1-ubyte"}


def data_dir() -> str:
  return os.environ.get("FMNIST_DIR", DEFAULT_DIR)


def read_idx(path: str) -> np.ndarray:
  """One IDX array (gzipped or raw)."""
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "rb") as f:
    raw = f.read()
  if len(raw) < 4 or raw[0] != 0 or raw[1] != 0 or raw[2] not in _DTYPES:
    raise ValueError(f"{path}: not an IDX file")
  ndim = raw[3]
  shape = tuple(int.from_bytes(raw[4 + 4 * i: 8 + 4 * i], "big") for i in range(ndim))
  dt = np.dtype(_DTYPES[raw[2]])
  data = np.frombuffer(raw, dt, offset=4 + 4 * ndim)
  if data.size != int(np.prod(shape)):
    raise ValueError(f"{path}: {data.size} elements, header says {shape}")
  return data.reshape(shape).astype(dt.newbyteorder("="))


def _find(stem: str) -> str:
  d = data_dir()
  for name in (stem + ".gz", stem):
    p = os.path.join(d, name)
    if os.path.exists(p):
      return p
  raise FileNotFoundError(
      f"{stem}[.gz] not in {d}; install Debian's dataset-fashion-mnist "
      "(apt-get install dataset-fashion-mnist) or set FMNIST_DIR")


def load(train: bool) -> tuple[np.ndarray, np.ndarray]:
  """``(images uint8 (N, 28, 28), labels int64 (N,))``."""
  split = "train" if train else "test"
  x = read_idx(_find(_STEMS[(split, "x")]))
  y = read_idx(_find(_STEMS[(split, "y")])).astype(np.int64)
  if x.dtype != np.uint8 or x.ndim != 3 or len(x) != len(y):
    raise ValueError(f"fashion-mnist {split}: images {x.shape} {x.dtype}, labels {y.shape}")
  return x, y


def channel_stats(x: np.ndarray) -> tuple[float, float]:
  """Mean and population std of ``x / 255`` from a 256-bin histogram (as
  jsfl's ``channel_stats`` for one channel)."""
  levels = np.arange(256, dtype=np.float64) / 255.0
  hist = np.bincount(np.asarray(x, np.uint8).ravel(), minlength=256).astype(np.float64)
  p = hist / hist.sum()
  m = float(p @ levels)
  return m, float(np.sqrt(p @ (levels - m) ** 2))


_MEAN_STD = None


def mean_std() -> tuple[tuple[float], tuple[float]]:
  """jsfl's normalisation constants for Fashion-MNIST, ``((mean,), (std,))``,
  computed from the training images."""
  global _MEAN_STD
  if _MEAN_STD is None:
    m, s = channel_stats(load(train=True)[0])
    _MEAN_STD = ((m,), (s,))
  return _MEAN_STD
