"""CIFAR-10/100 and SVHN via tensorflow-datasets, or a prepared ``.npz``.

Resolution, first hit wins:

1. ``<data_dir>/<name>.npz`` when ``data_dir`` is given, else
   ``<cache root>/<name>/<name>.npz``: arrays ``x_train``, ``y_train``,
   ``x_test``, ``y_test`` (uint8 NHWC or NHW images, integer labels); for
   CIFAR-100 optionally ``y_train_coarse``/``y_test_coarse``.
2. ``tensorflow_datasets`` (the ``tfds`` extra, imported only here and only
   when needed) with ``data_dir`` = the given ``data_dir`` or
   ``<cache root>/tfds``, downloading there when ``download=True``.

Otherwise :class:`~jsfl.data.idx.DatasetNotFound` says how to fix it; an
``.npz`` that is there but unreadable or incomplete is a
:class:`~jsfl.data.idx.BadDataFile` naming it.
"""

from __future__ import annotations

import importlib
import pathlib
import zipfile
import zlib

import numpy as np

from jsfl.data.idx import BadDataFile, DatasetNotFound, default_cache_root

# jsfl name -> (tfds name, number of classes).
TFDS_SOURCES = {
    "cifar10": ("cifar10", 10),
    "cifar100": ("cifar100", 100),
    "svhn": ("svhn_cropped", 10),
}

LABEL_MODES = ("fine", "coarse")

# CIFAR-100 fine label -> superclass (the 20 "coarse" labels of the release,
# in its alphabetical order), for ``.npz`` files that only carry fine labels.
CIFAR100_COARSE = np.array([
    4, 1, 14, 8, 0, 6, 7, 7, 18, 3, 3, 14, 9, 18, 7, 11, 3, 9, 7, 11,
    6, 11, 5, 10, 7, 6, 13, 15, 3, 15, 0, 11, 1, 10, 12, 14, 16, 9, 11, 5,
    5, 19, 8, 8, 15, 13, 14, 17, 18, 10, 16, 4, 17, 4, 2, 0, 17, 4, 18, 17,
    10, 3, 2, 12, 12, 16, 12, 1, 9, 19, 2, 10, 0, 1, 16, 12, 9, 13, 15, 13,
    16, 19, 2, 4, 6, 19, 5, 5, 8, 19, 18, 1, 2, 15, 6, 0, 17, 8, 14, 13,
], dtype=np.int32)


def _images(x: np.ndarray, source: str) -> np.ndarray:
  x = np.asarray(x)
  if x.ndim == 3:
    x = x[..., None]
  if x.ndim != 4 or x.dtype != np.uint8:
    raise ValueError(f"{source}: images {x.dtype}{list(x.shape)}; allowed: "
                     "uint8 (N, H, W, C) or (N, H, W)")
  if x.shape[-1] not in (1, 3):  # channels first would load as 32 "channels"
    raise ValueError(f"{source}: images {list(x.shape)} have {x.shape[-1]} channels last; "
                     "allowed: (N, H, W, C) with C = 1 or 3 (a channels-first array, as "
                     "torchvision's SVHN.data: x.transpose(0, 2, 3, 1))")
  return x


def _read_npz(path: pathlib.Path, name: str, label_mode: str
              ) -> dict[str, np.ndarray]:
  # allow_pickle stays off: an .npz from elsewhere must not run code.
  z = np.load(path)
  if not isinstance(z, np.lib.npyio.NpzFile):
    raise BadDataFile(f"{path}: a single .npy array, not an .npz archive; "
                      "allowed: an .npz with arrays x_train, y_train, x_test, "
                      "y_test")
  with z:
    needed = ("x_train", "y_train", "x_test", "y_test")
    missing = [k for k in needed if k not in z.files]
    if missing:
      raise BadDataFile(f"{path}: lacks arrays {missing}; has {z.files}, "
                        f"needs {list(needed)}")
    out = {k: np.asarray(z[k]) for k in needed}
    if name == "cifar100" and label_mode == "coarse":
      if "y_train_coarse" in z.files and "y_test_coarse" in z.files:
        out["y_train"] = np.asarray(z["y_train_coarse"])
        out["y_test"] = np.asarray(z["y_test_coarse"])
      else:
        fine = [out[k] for k in ("y_train", "y_test")]
        if any(not np.issubdtype(y.dtype, np.integer) or y.ndim != 1
               or (y.size and not 0 <= y.min() <= y.max() < 100) for y in fine):
          raise BadDataFile(f"{path}: y_train/y_test are not CIFAR-100 fine "
                            "labels; allowed: 1-D integers in [0, 100)")
        out["y_train"] = CIFAR100_COARSE[out["y_train"].astype(np.int64)]
        out["y_test"] = CIFAR100_COARSE[out["y_test"].astype(np.int64)]
  return out


def _from_npz(path: pathlib.Path, name: str, label_mode: str
              ) -> dict[str, np.ndarray]:
  fix = "replace it with an intact copy"
  try:
    out = _read_npz(path, name, label_mode)
  except BadDataFile:
    raise
  except OSError as e:
    raise BadDataFile(f"{path}: cannot be read: {e.strerror or e}; {fix}") from None
  except (EOFError, zipfile.BadZipFile, zlib.error) as e:
    raise BadDataFile(f"{path}: damaged: {e or 'truncated'}; {fix}") from None
  except ValueError as e:  # numpy: not an .npz, or an array needing pickle
    raise BadDataFile(f"{path}: damaged or not an .npz archive ({e}); {fix}") from None
  out["x_train"] = _images(out["x_train"], str(path))
  out["x_test"] = _images(out["x_test"], str(path))
  return out


def _fixes(name: str, npz: pathlib.Path) -> str:
  """What is allowed instead, as the ``...; allowed: ...`` tail of an error."""
  return (f"allowed: dataset.data_dir=DIR (data_dir= in Python) naming a directory "
          f"holding {name}.npz (arrays x_train, y_train, x_test, y_test) or a "
          f"tensorflow-datasets data dir; or {name}.npz at {npz}; or `pip install "
          f"'jsfl[tfds]'` and dataset.download = true (download=True) while online")


def load_tfds_dataset(name: str, *, data_dir=None, cache_dir=None,
                      download: bool = True, label_mode: str = "fine"
                      ) -> tuple[dict[str, np.ndarray], int]:
  """Resolves and reads CIFAR-10, CIFAR-100 or SVHN (cropped digits).

  Args:
    name: a key of :data:`TFDS_SOURCES`.
    data_dir: a directory with ``<name>.npz``, or a tfds data dir; or None.
    cache_dir: the cache root, or None for the default.
    download: whether tfds may download.
    label_mode: CIFAR-100 only: ``"fine"`` (100 labels) or ``"coarse"``
      (the 20 superclasses, as Hydra uses).

  Returns:
    ``({"x_train": uint8 NHWC, "y_train", "x_test", "y_test"}, num_classes)``.

  Raises:
    ValueError: unknown name or label_mode, malformed arrays.
    BadDataFile: an ``.npz`` that is unreadable, damaged or lacks arrays.
    DatasetNotFound: ``data_dir`` is a file, or no ``.npz`` and tfds
      missing or failing.
  """
  if name not in TFDS_SOURCES:
    raise ValueError(f"tfds dataset {name!r}; allowed: {tuple(TFDS_SOURCES)}")
  if label_mode not in LABEL_MODES:
    raise ValueError(f"label_mode={label_mode!r}; allowed: {LABEL_MODES}")
  tfds_name, num_classes = TFDS_SOURCES[name]
  if name == "cifar100" and label_mode == "coarse":
    num_classes = 20
  cache = default_cache_root(cache_dir)
  if data_dir is not None:
    directory = pathlib.Path(data_dir).expanduser()
    # A missing data_dir is fine: tensorflow-datasets may download into it.
    if directory.exists() and not directory.is_dir():
      raise DatasetNotFound(
          f"data_dir={str(data_dir)!r} is not a directory; "
          + _fixes(name, cache / name / f"{name}.npz"))
    npz = directory / f"{name}.npz"
  else:
    npz = cache / name / f"{name}.npz"
  if npz.is_file():
    return _from_npz(npz, name, label_mode), num_classes
  try:
    tfds = importlib.import_module("tensorflow_datasets")
  except ImportError as e:
    raise DatasetNotFound(
        f"{name}: no {npz} and tensorflow-datasets is not installed; "
        + _fixes(name, cache / name / f"{name}.npz")) from e
  tfds_dir = str(data_dir if data_dir is not None else cache / "tfds")
  label_key = "coarse_label" if num_classes == 20 else "label"
  out = {}
  for split in ("train", "test"):
    try:
      d = tfds.as_numpy(tfds.load(tfds_name, split=split, batch_size=-1,
                                  data_dir=tfds_dir, download=download))
    except Exception as e:  # tfds raises many types; all mean "not here".
      raise DatasetNotFound(
          f"{name}: tensorflow-datasets could not load {tfds_name!r} split "
          f"{split!r} from {tfds_dir} (download={download}): {e!r}. "
          + _fixes(name, cache / name / f"{name}.npz")) from e
    out[f"x_{split}"] = _images(d["image"], f"tfds {tfds_name}")
    out[f"y_{split}"] = np.asarray(d[label_key])
  return out, num_classes
