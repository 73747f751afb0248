"""Datasets read from the files their publishers distribute, without TensorFlow.

``cifar10``, ``cifar100``, ``svhn``, ``tiny_imagenet``, ``cinic10``,
``femnist`` and ``ham10000`` are read in the form each is distributed
(docs/setting.md#datasets lists the files and where to get them), decoded
once into the memory-mapped cache of :mod:`jsfl.data.cache` and read from it
afterwards.  Nothing is downloaded.

Where the files are, first match wins:

1. the dataset option ``path`` (``dataset.path`` in a config): the archive,
   file or directory as distributed, or the directory holding it; an error
   if the dataset is not there (a location the user named is never silently
   replaced by another);
2. ``data_dir``, a directory holding them;
3. ``<cache root>/<name>``, the root being ``cache_dir``, ``$JSFL_DATA`` or
   ``~/.cache/jsfl`` (where the decoded cache lives too).

For ``cifar10``, ``cifar100`` and ``svhn``, a ``data_dir`` or cache
directory without the publisher's files falls back to the older sources of
:mod:`jsfl.data.tfds_source` (a prepared ``<name>.npz``, or
tensorflow-datasets where installed).
"""

from __future__ import annotations

import dataclasses
import numbers
import os
import pathlib
from collections.abc import Callable
from typing import Any

import numpy as np

from jsfl.data import cache, formats, images
from jsfl.data.idx import DatasetNotFound, default_cache_root
from jsfl.data.tfds_source import LABEL_MODES, load_tfds_dataset

Arrays = dict[str, np.ndarray]


def _choice(key: str, allowed: tuple):
  def check(v):
    if v not in allowed:
      raise ValueError(f"{key}={v!r}; allowed: {', '.join(map(repr, allowed))}")
    return v
  return check


def _bool(key: str):
  def check(v):
    if not isinstance(v, (bool, np.bool_)):
      raise ValueError(f"{key}={v!r}; allowed: true or false")
    return bool(v)
  return check


def _int_in(key: str, low: int, high: int):
  def check(v):
    if not isinstance(v, numbers.Integral) or isinstance(v, (bool, np.bool_)) \
        or not low <= v <= high:
      raise ValueError(f"{key}={v!r}; allowed: an int in [{low}, {high}]")
    return int(v)
  return check


def _fraction(key: str):
  def check(v):
    if not isinstance(v, numbers.Real) or isinstance(v, (bool, np.bool_)) \
        or not 0 < v < 1:
      raise ValueError(f"{key}={v!r}; allowed: a float in (0, 1)")
    return float(v)
  return check


@dataclasses.dataclass(frozen=True)
class FileSource:
  """A dataset read from its publisher's files.

  Attributes:
    name: jsfl dataset name.
    files: the files it needs, for messages.
    publisher: where the publisher distributes them, for messages.
    options: option -> (checker, default).
    locate: where under a user's path the files are (None: not there).
    plan: ``(location, options) -> cache.Plan``.
    finish: ``(cached arrays, options) -> (arrays, num_classes)``.
    fallback: whether :mod:`jsfl.data.tfds_source` may serve it instead.
  """

  name: str
  files: str
  publisher: str
  options: dict[str, tuple[Callable[[Any], Any], Any]]
  locate: Callable[[pathlib.Path], pathlib.Path | None]
  plan: Callable[[pathlib.Path, dict], cache.Plan]
  finish: Callable[[Arrays, dict], tuple[Arrays, int]]
  fallback: bool = False


_SPLITS = ("x_train", "y_train", "x_test", "y_test")


def _same(num_classes: int):
  return lambda a, o: ({k: a[k] for k in _SPLITS}, num_classes)


def _cifar100_finish(a: Arrays, o: dict) -> tuple[Arrays, int]:
  if o["label_mode"] == "coarse":
    return {"x_train": a["x_train"], "y_train": a["y_train_coarse"],
            "x_test": a["x_test"], "y_test": a["y_test_coarse"]}, 20
  return {k: a[k] for k in _SPLITS}, 100


FILE_SOURCES: dict[str, FileSource] = {
    "cifar10": FileSource(
        "cifar10", formats.cifar_expected("cifar10"),
        "https://www.cs.toronto.edu/~kriz/cifar.html (CIFAR-10 python version)", {},
        lambda p: formats.locate_cifar("cifar10", p),
        lambda loc, o: formats.plan_cifar("cifar10", loc), _same(10), fallback=True),
    "cifar100": FileSource(
        "cifar100", formats.cifar_expected("cifar100"),
        "https://www.cs.toronto.edu/~kriz/cifar.html (CIFAR-100 python version)",
        {"label_mode": (_choice("label_mode", LABEL_MODES), "fine")},
        lambda p: formats.locate_cifar("cifar100", p),
        lambda loc, o: formats.plan_cifar("cifar100", loc), _cifar100_finish, fallback=True),
    "svhn": FileSource(
        "svhn", formats.svhn_expected(False),
        "http://ufldl.stanford.edu/housenumbers/ (format 2, cropped digits)",
        {"extra": (_bool("extra"), False)}, formats.locate_svhn,
        lambda loc, o: formats.plan_svhn(loc, o["extra"]), _same(10), fallback=True),
    "tiny_imagenet": FileSource(
        "tiny_imagenet", images.TINY_EXPECTED,
        "http://cs231n.stanford.edu/tiny-imagenet-200.zip (unzipped)", {},
        images.locate_tiny_imagenet, lambda loc, o: images.plan_tiny_imagenet(loc),
        lambda a, o: ({k: a[k] for k in _SPLITS}, len(a["classes"]))),
    "cinic10": FileSource(
        "cinic10", images.CINIC_EXPECTED,
        "https://datashare.ed.ac.uk/handle/10283/3192 (CINIC-10.tar.gz, extracted)",
        {"with_valid": (_bool("with_valid"), False)}, images.locate_cinic10,
        lambda loc, o: images.plan_cinic10(loc, o["with_valid"]), _same(10)),
    "femnist": FileSource(
        "femnist", formats.FEMNIST_EXPECTED,
        "LEAF, https://github.com/TalwalkarLab/leaf (data/femnist: ./preprocess.sh with "
        "a train/test split)", {},
        formats.locate_femnist, lambda loc, o: formats.plan_femnist(loc),
        lambda a, o: ({**{k: a[k] for k in _SPLITS}, "client_ids": a["client_ids"]},
                      formats.FEMNIST_CLASSES)),
    "ham10000": FileSource(
        "ham10000", images.HAM_EXPECTED,
        "https://doi.org/10.7910/DVN/DBW86T (Harvard Dataverse; also Kaggle's "
        "skin-cancer-mnist-ham10000)",
        {"image_size": (_int_in("image_size", 8, 600), 64),
         "test_fraction": (_fraction("test_fraction"), 0.1)},
        images.locate_ham10000, lambda loc, o: images.plan_ham10000(loc, o["image_size"]),
        lambda a, o: (images.ham10000_split(a, o["test_fraction"]),
                      len(images.HAM_CLASSES))),
}


def _fixes(src: FileSource, default_dir: pathlib.Path) -> str:
  """What is allowed instead, as the ``...; allowed: ...`` tail of an error."""
  return (f"allowed: path=... (dataset.path) naming {src.files}, or the directory holding "
          f"them; or them at {default_dir} ($JSFL_DATA sets the root); distributed at "
          f"{src.publisher} (docs/setting.md#datasets)")


def _check_path(path, data_dir) -> pathlib.Path | None:
  if path is None or path == "":
    return None
  if not isinstance(path, (str, os.PathLike)):
    raise ValueError(f"path={path!r}; allowed: a string naming a file or directory "
                     "(quote it in TOML)")
  if data_dir is not None:
    raise ValueError(f"path={str(path)!r} and data_dir={str(data_dir)!r} are both set; "
                     "allowed: one of them")
  return pathlib.Path(path).expanduser()


def load_file_dataset(name: str, *, path=None, data_dir=None, cache_dir=None,
                      download: bool = True, **options) -> tuple[Arrays, int]:
  """Resolves, decodes (once) and returns a dataset of :data:`FILE_SOURCES`.

  Args:
    name: a key of :data:`FILE_SOURCES`.
    path: the dataset as distributed (file or directory), or None.
    data_dir: a directory holding it, or None.
    cache_dir: the cache root, or None for the default.
    download: passed to the tensorflow-datasets fallback only.
    **options: the dataset's options (:attr:`FileSource.options`).

  Returns:
    ``({"x_train": uint8 (N, H, W, C), "y_train": int32 (N,), "x_test",
    "y_test"[, "client_ids"]}, num_classes)``; the arrays are read-only,
    memory-mapped from the cache where they are not a selection of it.

  Raises:
    ValueError: a bad option value (the message names it).
    DatasetNotFound: the files are not where they were looked for.
    BadDataFile: a file is there but unusable (the message names it and
      what was expected); nothing is left in the cache.
  """
  src = FILE_SOURCES[name]
  unknown = sorted(set(options) - set(src.options))
  if unknown:
    raise ValueError(f"unknown options {unknown} for dataset {name!r}; allowed: "
                     f"{tuple(src.options) + ('path', 'train_subset')}")
  opts = {k: check(options[k]) if k in options else default
          for k, (check, default) in src.options.items()}
  where = _check_path(path, data_dir)
  root = default_cache_root(cache_dir)
  default_dir = root / name
  if where is not None:
    if not where.exists():
      raise DatasetNotFound(f"path={str(path)!r} does not exist; " + _fixes(src, default_dir))
    loc = src.locate(where)
    if loc is None:
      raise DatasetNotFound(f"path={str(path)!r} holds no {name}; "
                            + _fixes(src, default_dir))
  else:
    where = pathlib.Path(data_dir).expanduser() if data_dir is not None else default_dir
    loc = src.locate(where) if where.is_dir() else None
    if loc is None:
      if src.fallback:
        return _fallback(src, opts, data_dir, cache_dir, download, default_dir)
      if data_dir is not None:
        what = ("does not exist" if not where.exists() else "is not a directory"
                if not where.is_dir() else f"holds no {name}")
        raise DatasetNotFound(f"data_dir={str(data_dir)!r} {what}; " + _fixes(src, default_dir))
      raise DatasetNotFound(f"{name}: no path given and none at {default_dir}; "
                            + _fixes(src, default_dir))
  arrays = cache.load(src.plan(loc, opts), root)
  return src.finish(arrays, opts)


def _fallback(src: FileSource, opts: dict, data_dir, cache_dir, download: bool,
              default_dir: pathlib.Path) -> tuple[Arrays, int]:
  """The ``.npz`` / tensorflow-datasets sources, for CIFAR and SVHN."""
  if opts.get("extra"):
    raise DatasetNotFound(f"svhn: extra=True needs the publisher's files; none at "
                          f"{data_dir if data_dir is not None else default_dir}; "
                          + _fixes(src, default_dir))
  kw = {"label_mode": opts["label_mode"]} if "label_mode" in opts else {}
  try:
    return load_tfds_dataset(src.name, data_dir=data_dir, cache_dir=cache_dir,
                             download=download, **kw)
  except DatasetNotFound as e:
    raise DatasetNotFound(f"{e}; or path=... (dataset.path) naming {src.files}, "
                          f"distributed at {src.publisher} (docs/setting.md#datasets)"
                          ) from e.__cause__
