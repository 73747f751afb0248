"""IDX datasets (Fashion-MNIST, MNIST): parsing, resolution and download.

A dataset resolves from, in order (first complete set of four files wins):

1. an explicit ``data_dir`` (an error if the files are not all there: a path
   the caller named must not be silently replaced by another copy),
2. the system directory ``<system root>/<debian name>``, where Debian's
   ``dataset-fashion-mnist`` package installs Fashion-MNIST; the root is
   ``$JSFL_SYSTEM_DATA`` or :data:`SYSTEM_DATA_ROOT`,
3. the cache directory ``<cache root>/<name>``; the root is the ``cache_dir``
   argument, else ``$JSFL_DATA``, else ``~/.cache/jsfl``,
4. a download from the dataset's official URLs into that cache directory when
   ``download=True``.

When all of these fail the error (:class:`DatasetNotFound`) names the three
ways to fix it.  Files may be gzipped (``.gz``) or raw.  A file that is there
but cannot be used (unreadable, truncated, corrupt, of the wrong shape) is a
:class:`BadDataFile` naming it and how to replace it.
"""

from __future__ import annotations

import dataclasses
import gzip
import http.client
import math
import os
import pathlib
import shutil
import tempfile
import urllib.request
import zlib
from typing import Any

import numpy as np

from jsfl.errors import DataError

SYSTEM_DATA_ROOT = "/usr/share/datasets"
"""Where Debian's ``dataset-*`` packages install; ``$JSFL_SYSTEM_DATA`` wins."""

DOWNLOAD_TIMEOUT_S = 20.0
"""Per-socket-operation timeout; short so that offline machines fail fast."""

# The IDX element type codes of LeCun's format; data are big-endian.
_IDX_DTYPES: dict[int, Any] = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"),
               0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"),
               0x0E: np.dtype(">f8")}

# Array name -> canonical file stem; both releases use the same names.
IDX_FILES = {
    "x_train": "train-images-idx3-ubyte",
    "y_train": "train-labels-idx1-ubyte",
    "x_test": "t10k-images-idx3-ubyte",
    "y_test": "t10k-labels-idx1-ubyte",
}


class DatasetNotFound(DataError, FileNotFoundError):
  """A dataset's files are nowhere to be found (and could not be fetched).

  Also a :class:`FileNotFoundError`, which it was before :mod:`jsfl.errors`.
  """


class BadDataFile(DataError, ValueError):
  """A dataset file that is there but unusable: unreadable, truncated,
  corrupt, not of its format, or of the wrong shape.

  Also a :class:`ValueError`, which malformed files raised before
  :mod:`jsfl.errors`.
  """


@dataclasses.dataclass(frozen=True)
class IdxSource:
  """Where an IDX dataset lives and what it must look like.

  Attributes:
    name: jsfl dataset name.
    debian_name: directory under the system root (Debian's naming).
    apt_package: the Debian package that installs it, if there is one.
    urls: base URLs of mirrors holding ``<stem>.gz``, tried in order.
    image_shape: ``(H, W)`` of one image.
    train_size: number of training samples.
    test_size: number of test samples.
    num_classes: number of labels.
  """

  name: str
  debian_name: str
  apt_package: str | None
  urls: tuple[str, ...]
  image_shape: tuple[int, int]
  train_size: int
  test_size: int
  num_classes: int

  def expected_shape(self, key: str) -> tuple[int, ...]:
    n = self.train_size if key.endswith("train") else self.test_size
    return (n, *self.image_shape) if key.startswith("x") else (n,)


IDX_SOURCES = {
    "fashion_mnist": IdxSource(
        name="fashion_mnist", debian_name="fashion-mnist",
        apt_package="dataset-fashion-mnist",
        urls=("http://fashion-mnist.s3-website.eu-central-1.amazonaws.com/",
              "https://storage.googleapis.com/tensorflow/tf-keras-datasets/"),
        image_shape=(28, 28), train_size=60000, test_size=10000,
        num_classes=10),
    "mnist": IdxSource(
        name="mnist", debian_name="mnist", apt_package=None,
        urls=("https://ossci-datasets.s3.amazonaws.com/mnist/",
              "https://storage.googleapis.com/cvdf-datasets/mnist/"),
        image_shape=(28, 28), train_size=60000, test_size=10000,
        num_classes=10),
}


def system_data_root() -> pathlib.Path:
  """The system dataset root: ``$JSFL_SYSTEM_DATA`` or :data:`SYSTEM_DATA_ROOT`.

  Returns:
    The root directory (read at call time so tests can redirect it).
  """
  return pathlib.Path(os.environ.get("JSFL_SYSTEM_DATA") or SYSTEM_DATA_ROOT)


def default_cache_root(cache_dir: str | os.PathLike | None = None
                       ) -> pathlib.Path:
  """The cache root: ``cache_dir``, else ``$JSFL_DATA``, else ``~/.cache/jsfl``.

  Args:
    cache_dir: an explicit root, or None.

  Returns:
    The root under which each dataset gets a ``<name>`` subdirectory.
  """
  if cache_dir is not None:
    return pathlib.Path(cache_dir).expanduser()
  env = os.environ.get("JSFL_DATA")
  if env:
    return pathlib.Path(env).expanduser()
  return pathlib.Path.home() / ".cache" / "jsfl"


def parse_idx(data: bytes, source: str = "<bytes>") -> np.ndarray:
  """Parses the bytes of one (decompressed) IDX file.

  Args:
    data: the whole file content.
    source: a name for error messages.

  Returns:
    The array, in native byte order, of the shape the header declares.

  Raises:
    ValueError: a bad magic number, an unknown type code, or a payload whose
      length does not match the header.
  """
  if len(data) < 4 or data[0] != 0 or data[1] != 0:
    raise ValueError(f"{source}: not an IDX file (magic {data[:4]!r}; "
                     "allowed: 0x00 0x00 <type> <ndim>)")
  code, ndim = data[2], data[3]
  if code not in _IDX_DTYPES:
    raise ValueError(f"{source}: IDX type code 0x{code:02x}; allowed: "
                     + ", ".join(f"0x{c:02x}" for c in _IDX_DTYPES))
  header = 4 + 4 * ndim
  if len(data) < header:
    raise ValueError(f"{source}: truncated IDX header ({len(data)} bytes, "
                     f"need {header} for ndim={ndim})")
  shape = tuple(int(d) for d in np.frombuffer(data, ">u4", ndim, 4))
  dtype = np.dtype(_IDX_DTYPES[code])
  # Python ints: a hostile header's product must not wrap around in int64.
  expected = header + math.prod(shape) * dtype.itemsize
  if len(data) != expected:
    raise ValueError(f"{source}: {len(data)} bytes but the header {shape} "
                     f"of {dtype} needs {expected}")
  arr = np.frombuffer(data, dtype, offset=header).reshape(shape)
  return arr.astype(dtype.newbyteorder("="), copy=False)


def read_idx(path: str | os.PathLike, max_bytes: int | None = None
             ) -> np.ndarray:
  """Reads an IDX file, gzipped (by ``.gz`` suffix or magic) or raw.

  Args:
    path: the file.
    max_bytes: the most (decompressed) bytes a valid file can have, or None;
      a larger one is rejected before it is read whole, so a small
      compressed file cannot exhaust memory.

  Returns:
    The parsed array (see :func:`parse_idx`).

  Raises:
    BadDataFile: the file cannot be read, its compressed stream is
      truncated or corrupt, or its content is not a whole IDX file; the
      message names the path.
  """
  path = pathlib.Path(path)
  try:
    with open(path, "rb") as f:
      head = f.read(2)
      f.seek(0)
      if head == b"\x1f\x8b":
        with gzip.GzipFile(fileobj=f) as g:
          data = g.read(-1 if max_bytes is None else max_bytes + 1)
      else:
        data = f.read(-1 if max_bytes is None else max_bytes + 1)
  except EOFError:
    raise BadDataFile(f"{path}: damaged: the gzip stream ends early "
                      "(truncated file)") from None
  except (gzip.BadGzipFile, zlib.error) as e:
    raise BadDataFile(f"{path}: damaged: corrupt gzip data ({e})") from None
  except OSError as e:
    raise BadDataFile(f"{path}: cannot be read: {e.strerror or e}") from None
  if max_bytes is not None and len(data) > max_bytes:
    raise BadDataFile(f"{path}: damaged: decompresses to more than "
                      f"{max_bytes} bytes, the most a valid file may hold")
  try:
    return parse_idx(data, str(path))
  except ValueError as e:
    reason = str(e).removeprefix(f"{path}: ")
    raise BadDataFile(f"{path}: damaged: {reason}") from None


def find_idx_files(directory: str | os.PathLike
                   ) -> tuple[dict[str, pathlib.Path], list[str]]:
  """Looks for the four IDX files of a dataset in ``directory``.

  Accepts ``<stem>`` and ``<stem>.gz`` and the dotted variant
  (``train-images.idx3-ubyte``) some archives use.

  Args:
    directory: where to look.

  Returns:
    ``(found, missing)``: array name -> path, and the stems not found.
  """
  directory = pathlib.Path(directory)
  found, missing = {}, []
  for key, stem in IDX_FILES.items():
    dotted = stem.replace("-idx", ".idx")
    for cand in (stem + ".gz", stem, dotted + ".gz", dotted):
      if (directory / cand).is_file():
        found[key] = directory / cand
        break
    else:
      missing.append(stem)
  return found, missing


def _max_bytes(shape: tuple[int, ...]) -> int:
  """A bound on the decompressed size of a file meant to hold ``shape``.

  Twice the uint8 payload plus 1 MiB: a file of some other shape still gets
  the clearer shape message, while a small file that inflates to gigabytes
  (damage or a compression bomb) is refused before it exhausts memory.
  """
  return 2 * (4 + 4 * len(shape) + math.prod(shape)) + 2**20


def _load_dir(source: IdxSource, files: dict[str, pathlib.Path],
              remedy: str) -> dict[str, np.ndarray]:
  """Reads and shape-checks the four files; ``remedy`` ends the message of
  a bad one (it depends on where the file came from)."""
  out = {}
  for key, path in files.items():
    shape = source.expected_shape(key)
    try:
      arr = read_idx(path, max_bytes=_max_bytes(shape))
    except BadDataFile as e:
      raise BadDataFile(f"{e}; {remedy}") from None
    if arr.shape != shape or arr.dtype != np.uint8:
      raise BadDataFile(
          f"{path}: {arr.dtype}{list(arr.shape)}; {source.name} needs uint8"
          f"{list(shape)}; {remedy}")
    out[key] = arr
  return out


def _remedy(source: IdxSource, where: str) -> str:
  """How to replace a bad file found in ``where`` (data_dir, system, cache)."""
  if where == "system":
    if source.apt_package:
      return (f"reinstall it (`apt-get install --reinstall "
              f"{source.apt_package}`)")
    return "replace it with an intact copy"
  if where == "cache":
    return ("delete it from the cache (it is downloaded again while online, under "
            "dataset.download = true) or replace it with an intact copy")
  return "replace it with an intact copy"


def _fixes(source: IdxSource, cache: pathlib.Path) -> str:
  """What is allowed instead, as the ``...; allowed: ...`` tail of an error."""
  system = system_data_root() / source.debian_name
  if source.apt_package:
    debian = pathlib.Path(SYSTEM_DATA_ROOT) / source.debian_name
    sys_fix = (f"`apt-get install {source.apt_package}` (installs into {debian}"
               + ("" if system == debian else
                  f"; $JSFL_SYSTEM_DATA has jsfl read {system} instead") + ")")
  else:
    sys_fix = f"the files in {system}"
  files = ", ".join(f"{s}[.gz]" for s in IDX_FILES.values())
  return (f"allowed: dataset.data_dir=DIR (data_dir= in Python) naming a directory "
          f"holding {files}; or {sys_fix}; or dataset.download = true (download=True, "
          f"the default) while online; or the files in the cache dir {cache} "
          f"($JSFL_DATA, or cache_dir= in Python, sets its root)")


def _download(source: IdxSource, cache: pathlib.Path, timeout: float,
              have: dict[str, pathlib.Path]) -> dict[str, pathlib.Path]:
  """Fetches the files not in ``have`` into ``cache``, verifying each.

  A file is written to a temporary name in the same directory, parsed and
  shape-checked, and only then renamed (``os.replace`` is atomic), so an
  interrupted or truncated download never leaves a file that looks complete.
  """
  cache.mkdir(parents=True, exist_ok=True)
  paths, errors = dict(have), []
  for key, stem in IDX_FILES.items():
    if key in paths:
      continue
    target = cache / (stem + ".gz")
    for base in source.urls:
      url = base + stem + ".gz"
      fd, tmp = tempfile.mkstemp(dir=cache, prefix="." + stem, suffix=".part")
      try:
        with os.fdopen(fd, "wb") as f, urllib.request.urlopen(
            url, timeout=timeout) as resp:
          shutil.copyfileobj(resp, f)
          declared = resp.headers.get("Content-Length")
        size = os.path.getsize(tmp)
        if declared is not None and int(declared) != size:
          raise OSError(f"got {size} bytes, Content-Length says {declared}")
        shape = source.expected_shape(key)
        arr = read_idx(tmp, max_bytes=_max_bytes(shape))
        if arr.shape != shape:
          raise OSError(f"shape {arr.shape}, expected {shape}")
        os.replace(tmp, target)
        paths[key] = target
        break
      except (OSError, ValueError, http.client.HTTPException) as e:
        errors.append(f"{url}: {e}")
      finally:
        if os.path.exists(tmp):
          os.remove(tmp)
    else:
      raise OSError("; ".join(errors))
  return paths


def load_idx_dataset(name: str, *, data_dir=None, cache_dir=None,
                     download: bool = True,
                     timeout: float | None = None) -> dict[str, np.ndarray]:
  """Resolves and reads an IDX dataset (see the module docstring for order).

  Args:
    name: a key of :data:`IDX_SOURCES`.
    data_dir: an explicit directory with the four files, or None.
    cache_dir: the cache root, or None for the default.
    download: whether a missing dataset may be fetched into the cache.
    timeout: socket timeout of the download in seconds
      (default :data:`DOWNLOAD_TIMEOUT_S`).

  Returns:
    ``{"x_train": uint8 (N, H, W), "y_train": uint8 (N,), "x_test": ...,
    "y_test": ...}``.

  Raises:
    ValueError: unknown ``name``.
    BadDataFile: a file is unreadable, damaged or of the wrong shape (the
      message names it and how to replace it).
    DatasetNotFound: ``data_dir`` is not a directory or lacks files, or no
      complete set of files anywhere and none fetched.
  """
  if name not in IDX_SOURCES:
    raise ValueError(f"IDX dataset {name!r}; allowed: {tuple(IDX_SOURCES)}")
  source = IDX_SOURCES[name]
  cache = default_cache_root(cache_dir) / name
  if data_dir is not None:
    directory = pathlib.Path(data_dir).expanduser()
    if not directory.is_dir():
      what = "is not a directory" if directory.exists() else "does not exist"
      raise DatasetNotFound(
          f"data_dir={str(data_dir)!r} {what}; " + _fixes(source, cache))
    found, missing = find_idx_files(directory)
    if missing:
      raise DatasetNotFound(
          f"data_dir={str(data_dir)!r} lacks {missing} for {name}; "
          + _fixes(source, cache))
    return _load_dir(source, found, _remedy(source, "data_dir"))
  system = system_data_root() / source.debian_name
  for directory, where in ((system, "system"), (cache, "cache")):
    found, missing = find_idx_files(directory)
    if not missing:
      return _load_dir(source, found, _remedy(source, where))
  # ``found`` is now the cache's partial set: only the rest is fetched.
  if not download:
    raise DatasetNotFound(
        f"{name} not found in {system} nor in {cache}, and download=False; "
        + _fixes(source, cache))
  try:
    found = _download(source, cache,
                      DOWNLOAD_TIMEOUT_S if timeout is None else timeout, found)
  except OSError as e:
    raise DatasetNotFound(
        f"{name} not found locally and the download failed ({e}); "
        + _fixes(source, cache)) from e
  return _load_dir(source, found, _remedy(source, "cache"))
