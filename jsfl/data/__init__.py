"""Datasets as host arrays, ready to be put on the device whole.

:func:`load_dataset` returns a :class:`Dataset` of uint8 NHWC images and int32
labels plus the per-channel mean and std of ``x / 255`` over the training set.
Training code puts ``x_train`` on the device once, as uint8 (a quarter of the
float32 size), gathers batches by index there and calls :func:`normalize` on
each gathered batch, so no per-step host-to-device copy happens.

Sources (see the submodules for the resolution order of each):

* ``fashion_mnist``, ``mnist``: IDX files (:mod:`jsfl.data.idx`): explicit
  ``data_dir``, then ``/usr/share/datasets/<debian name>`` (Debian's
  ``dataset-fashion-mnist``), then the cache dir, then a download.
* ``cifar10``, ``cifar100``, ``svhn``, ``tiny_imagenet``, ``cinic10``,
  ``femnist``, ``ham10000``: the files their publishers distribute, decoded
  once into a memory-mapped cache (:mod:`jsfl.data.files`; the option
  ``path`` names them).  CIFAR and SVHN also load from a prepared
  ``<name>.npz`` or tensorflow-datasets (:mod:`jsfl.data.tfds_source`, the
  ``tfds`` extra) where the publisher's files are not found.
* ``synthetic``: generated (:mod:`jsfl.data.synthetic`), any shape.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from jsfl.data.files import FILE_SOURCES, load_file_dataset
from jsfl.data.idx import IDX_SOURCES, BadDataFile, DatasetNotFound, load_idx_dataset
from jsfl.data.synthetic import make_synthetic

DATASETS = ("fashion_mnist", "mnist", "cifar10", "cifar100", "svhn",
            "tiny_imagenet", "cinic10", "femnist", "ham10000", "synthetic")

# Dataset -> the keyword options load_dataset accepts for it.
DATASET_OPTIONS = {
    "fashion_mnist": (),
    "mnist": (),
    **{name: (*src.options, "path") for name, src in FILE_SOURCES.items()},
    "synthetic": ("input_shape", "num_classes", "train_size", "test_size",
                  "seed", "noise"),
}
# Options every dataset accepts.
COMMON_OPTIONS = ("train_subset",)


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """A train/test image classification dataset on the host.

  The arrays are made read-only: a dataset is shared by every client view and
  every seed of a run, so an in-place edit would silently leak between them.

  Attributes:
    name: dataset name (a member of :data:`DATASETS`).
    x_train: uint8 ``(N, H, W, C)`` training images.
    y_train: int32 ``(N,)`` training labels in ``[0, num_classes)``.
    x_test: uint8 ``(M, H, W, C)`` test images.
    y_test: int32 ``(M,)`` test labels.
    num_classes: number of labels L.
    mean: float32 ``(C,)`` per-channel mean of ``x_train / 255``.
    std: float32 ``(C,)`` per-channel std of ``x_train / 255`` (1 where a
      channel is constant, so :func:`normalize` never divides by 0).
    client_ids: int ``(N,)`` natural client (e.g. writer) id of each training
      sample where the dataset has them, else None.
  """

  name: str
  x_train: np.ndarray
  y_train: np.ndarray
  x_test: np.ndarray
  y_test: np.ndarray
  num_classes: int
  mean: np.ndarray
  std: np.ndarray
  client_ids: np.ndarray | None = None

  def __post_init__(self):
    for split in ("train", "test"):
      x, y = getattr(self, f"x_{split}"), getattr(self, f"y_{split}")
      if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 4:
        raise ValueError(f"{self.name}: x_{split} is "
                         f"{getattr(x, 'dtype', type(x))}"
                         f"{list(getattr(x, 'shape', ()))}; allowed: uint8 "
                         "numpy (N, H, W, C)")
      if not isinstance(y, np.ndarray) or y.dtype != np.int32 \
          or y.shape != x.shape[:1]:
        raise ValueError(f"{self.name}: y_{split} is "
                         f"{getattr(y, 'dtype', type(y))}"
                         f"{list(getattr(y, 'shape', ()))}; allowed: int32 "
                         f"numpy ({x.shape[0]},)")
      if y.size and (y.min() < 0 or y.max() >= self.num_classes):
        raise ValueError(f"{self.name}: y_{split} spans [{y.min()}, "
                         f"{y.max()}]; allowed: [0, {self.num_classes})")
    if self.x_test.shape[1:] != self.x_train.shape[1:]:
      raise ValueError(f"{self.name}: test images {self.x_test.shape[1:]} "
                       f"differ from train images {self.x_train.shape[1:]}")
    if self.client_ids is not None and \
        np.shape(self.client_ids) != self.y_train.shape:
      raise ValueError(f"{self.name}: client_ids shape "
                       f"{np.shape(self.client_ids)}; allowed: "
                       f"{self.y_train.shape}")
    for f in ("x_train", "y_train", "x_test", "y_test", "mean", "std",
              "client_ids"):
      a = getattr(self, f)
      if isinstance(a, np.ndarray):
        a.flags.writeable = False

  @property
  def input_shape(self) -> tuple[int, int, int]:
    """``(H, W, C)`` of one image."""
    h, w, c = (int(d) for d in self.x_train.shape[1:])
    return h, w, c


def channel_stats(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
  """Per-channel mean and std of ``x / 255``, exact and memory-light.

  A 256-bin histogram per channel gives both moments without a float copy of
  the whole training set (150 MB in float32 for CIFAR's 50k images).

  Args:
    x: uint8 ``(..., C)`` images.

  Returns:
    ``(mean, std)``, float32 ``(C,)`` each; std is 1 for a constant channel.
  """
  if x.dtype != np.uint8:
    raise ValueError(f"x dtype {x.dtype}; allowed: uint8")
  levels = np.arange(256, dtype=np.float64) / 255.0
  mean, std = [], []
  for c in range(x.shape[-1]):
    hist = np.bincount(x[..., c].ravel(), minlength=256).astype(np.float64)
    p = hist / max(hist.sum(), 1.0)
    m = float(p @ levels)
    v = float(p @ (levels - m) ** 2)
    mean.append(m)
    std.append(np.sqrt(v) if v > 0 else 1.0)
  return np.array(mean, np.float32), np.array(std, np.float32)


def make_dataset(name: str, x_train, y_train, x_test, y_test,
                 num_classes: int, client_ids=None) -> Dataset:
  """Builds a :class:`Dataset` from arrays, adding channels and statistics.

  Args:
    name: dataset name.
    x_train: uint8 ``(N, H, W, C)`` or ``(N, H, W)`` images.
    y_train: integer ``(N,)`` labels.
    x_test: uint8 test images, same layout.
    y_test: integer ``(M,)`` test labels.
    num_classes: number of labels.
    client_ids: optional natural client id per training sample.

  Returns:
    The dataset, with ``mean``/``std`` computed on ``x_train``.
  """
  x_train, x_test = np.asarray(x_train), np.asarray(x_test)
  if x_train.ndim == 3:
    x_train = x_train[..., None]
  if x_test.ndim == 3:
    x_test = x_test[..., None]
  if x_train.dtype != np.uint8 or x_test.dtype != np.uint8:
    raise ValueError(f"{name}: images are {x_train.dtype}/{x_test.dtype}; "
                     "allowed: uint8")
  y_train, y_test = np.asarray(y_train), np.asarray(y_test)
  for split, y in (("train", y_train), ("test", y_test)):
    if not np.issubdtype(y.dtype, np.integer):
      raise ValueError(f"{name}: y_{split} dtype {y.dtype}; allowed: integer")
  mean, std = channel_stats(x_train)
  return Dataset(
      name=name, x_train=x_train, y_train=y_train.astype(np.int32, copy=False),
      x_test=x_test, y_test=y_test.astype(np.int32, copy=False),
      num_classes=int(num_classes), mean=mean, std=std,
      client_ids=None if client_ids is None else np.asarray(client_ids))


def load_dataset(name: str, *, data_dir=None, cache_dir=None,
                 download: bool = True, **options) -> Dataset:
  """Loads a dataset by name.

  Args:
    name: one of :data:`DATASETS`.
    data_dir: an explicit directory holding the dataset's files (wins over
      every other location; an error if they are not there).
    cache_dir: the cache root (default ``$JSFL_DATA`` or ``~/.cache/jsfl``);
      each dataset uses ``<cache_dir>/<name>``, tensorflow-datasets
      ``<cache_dir>/tfds``.
    download: whether a dataset found nowhere may be downloaded into the
      cache.
    **options: dataset-specific options, see :data:`DATASET_OPTIONS`:
      ``path`` (every dataset of :data:`jsfl.data.files.FILE_SOURCES`): the
      publisher's archive, file or directory, or the directory holding it
      (docs/setting.md#datasets); ``cifar100``: ``label_mode`` in {"fine",
      "coarse"} (coarse = the 20 superclasses); ``svhn``: ``extra`` (add
      ``extra_32x32.mat`` to the training set); ``cinic10``: ``with_valid``
      (add ``valid/`` to the training set); ``ham10000``: ``image_size``
      (default 64) and ``test_fraction`` (default 0.1); ``synthetic``:
      ``input_shape``, ``num_classes``, ``train_size``, ``test_size``,
      ``seed``, ``noise`` (see :func:`jsfl.data.synthetic.make_synthetic`;
      ``data_dir``, ``cache_dir`` and ``download`` are ignored for it).  Every dataset takes
      ``train_subset``: keep this many training samples, drawn per label in
      proportion (fixed seed 0, so every seed of a run sees the same set);
      for CPU-sized experiments.  The test set is never subsampled.

  Returns:
    The :class:`Dataset`.

  Raises:
    ValueError: unknown name or options, or a bad option value (the message
      names ``key=value`` and what is allowed).
    BadDataFile: a dataset file that is unreadable, damaged or of the wrong
      shape (the message names the file and how to replace it); also a
      ValueError.
    DatasetNotFound: ``data_dir`` is not a directory, or the files are
      nowhere and could not be fetched; the message names the ways to fix
      it.
  """
  if name not in DATASETS:
    raise ValueError(f"dataset {name!r}; allowed: {DATASETS}")
  allowed = DATASET_OPTIONS[name] + COMMON_OPTIONS
  unknown = sorted(set(options) - set(allowed))
  if unknown:
    raise ValueError(f"unknown options {unknown} for dataset {name!r}; "
                     f"allowed: {allowed}")
  subset = options.pop("train_subset", None)
  if subset is not None and not _is_count(subset):
    # Before loading: the range check below needs the data, the type does not.
    raise ValueError(f"train_subset={subset!r}; allowed: an integer >= 1 (at "
                     "most the training set's size)")
  if name in IDX_SOURCES:
    arrays = load_idx_dataset(name, data_dir=data_dir, cache_dir=cache_dir,
                              download=download)
    num_classes = IDX_SOURCES[name].num_classes
  elif name in FILE_SOURCES:
    arrays, num_classes = load_file_dataset(
        name, data_dir=data_dir, cache_dir=cache_dir, download=download,
        **options)
  else:
    arrays = make_synthetic(**options)
    num_classes = options.get("num_classes", 10)
  if subset is not None:
    arrays = _train_subset(arrays, subset)
  return make_dataset(name, num_classes=num_classes, **arrays)


def _is_count(n) -> bool:
  # bool is an int subclass, but True as a sample count is a config mistake.
  return bool(isinstance(n, (int, np.integer)) and not isinstance(n, (bool, np.bool_))
              and n >= 1)


def _train_subset(arrays: dict, n) -> dict:
  """``n`` training samples, each label keeping its share (seed 0)."""
  y = np.asarray(arrays["y_train"])
  if not _is_count(n) or n > y.shape[0]:
    raise ValueError(f"train_subset={n!r}; allowed: an integer in "
                     f"[1, {y.shape[0]}] (the training set's size)")
  rng = np.random.default_rng(0)
  perm = rng.permutation(y.shape[0])
  labels, counts = np.unique(y, return_counts=True)
  quota = np.floor(counts * n / y.shape[0]).astype(int)
  rest = n - quota.sum()  # largest remainders get the leftover samples
  quota[np.argsort(-(counts * n / y.shape[0] - quota), kind="stable")[:rest]] += 1
  keep = np.concatenate([perm[y[perm] == lab][:q] for lab, q in zip(labels, quota, strict=True)])
  keep = np.sort(keep)
  out = dict(arrays)
  out["x_train"] = np.asarray(arrays["x_train"])[keep]
  out["y_train"] = y[keep]
  if arrays.get("client_ids") is not None:
    out["client_ids"] = np.asarray(arrays["client_ids"])[keep]
  return out


def normalize(x_uint8: jax.Array, mean, std) -> jax.Array:
  """``(x / 255 - mean) / std`` in float32, per channel; jit-able.

  Meant for batches gathered on the device from the uint8 training set.

  Args:
    x_uint8: uint8 ``(..., C)`` images.
    mean: ``(C,)`` per-channel mean of ``x / 255``.
    std: ``(C,)`` per-channel std of ``x / 255``.

  Returns:
    float32 array of the shape of ``x_uint8``.
  """
  x = jnp.asarray(x_uint8).astype(jnp.float32) * (1.0 / 255.0)
  return (x - jnp.asarray(mean, jnp.float32)) / jnp.asarray(std, jnp.float32)


__all__ = ["DATASETS", "DATASET_OPTIONS", "BadDataFile", "Dataset", "DatasetNotFound",
           "channel_stats", "load_dataset", "make_dataset", "normalize"]
