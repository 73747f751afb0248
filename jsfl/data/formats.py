"""Readers of the formats CIFAR, SVHN and FEMNIST are distributed in.

Each dataset has a ``locate_*`` function (where, under a user's path, its
files are; None if not there) and a ``plan_*`` function (the files to
decode and the decoder, a :class:`jsfl.data.cache.Plan`).  Decoders check
what they read and raise :class:`BadDataFile` naming the file and what was
expected: a missing member, a truncated archive, an array of the wrong shape,
a label outside the dataset's classes.  docs/setting.md#datasets lists the
files and where their publishers distribute them.

* CIFAR-10/100: ``cifar-10-python.tar.gz`` / ``cifar-100-python.tar.gz`` or
  their extracted folders of pickled batches.  The pickles are read with an
  unpickler that resolves only numpy's array reconstruction, so a file from
  elsewhere cannot run code.
* SVHN: ``train_32x32.mat``, ``test_32x32.mat`` (``extra_32x32.mat``),
  MATLAB v5 files read with ``scipy.io.loadmat`` (scipy is a dependency of
  JAX); ``X`` is ``(32, 32, 3, N)``, label 10 means digit 0.
* FEMNIST: LEAF's JSON shards (``train/*.json``, ``test/*.json``): per
  writer, ``x`` as flattened 28x28 floats in [0, 1] (stored as ``round(255
  x)``) and ``y`` in [0, 62); the writer of every training sample becomes its
  natural client id.
"""

from __future__ import annotations

import codecs
import dataclasses
import gzip
import importlib
import io
import json
import pathlib
import pickle
import struct
import tarfile
import zlib
from typing import BinaryIO

import numpy as np

from jsfl.data.cache import Plan, Writer
from jsfl.data.idx import BadDataFile, DatasetNotFound


def bad(path, problem: str, expected: str) -> BadDataFile:
  """The one-line error of a source file that is there but unusable."""
  return BadDataFile(f"{path}: {problem}; expected {expected}")


def missing(path, expected: str) -> DatasetNotFound:
  """The one-line error of a source file that is not there."""
  return DatasetNotFound(f"{path}: missing; expected {expected}")


def read_bytes(path: pathlib.Path, expected: str) -> bytes:
  try:
    return path.read_bytes()
  except OSError as e:
    raise bad(path, f"cannot be read ({e.strerror or e})", expected) from None


def check_labels(path, y, num_classes: int, expected: str, offset: int = 0) -> np.ndarray:
  """Integer labels in ``[offset, offset + num_classes)``, as int32 minus offset."""
  y = np.asarray(y)
  if y.ndim != 1 or not (np.issubdtype(y.dtype, np.integer) or
                         (np.issubdtype(y.dtype, np.floating) and
                          np.all(np.isfinite(y)) and np.all(y == np.round(y)))):
    raise bad(path, f"labels are {y.dtype}{list(y.shape)}, not integers", expected)
  if y.size and (y.min() < offset or y.max() >= offset + num_classes):
    out = y[(y < offset) | (y >= offset + num_classes)][0]
    raise bad(path, f"label {float(out):g} is not a class of the dataset",
              f"{expected}, labels in [{offset}, {offset + num_classes - 1}]")
  return (y.astype(np.int64) - offset).astype(np.int32)


# ------------------------------------------------------------------ CIFAR

@dataclasses.dataclass(frozen=True)
class _CifarLayout:
  archive: str
  folder: str
  train: tuple[str, ...]
  test: tuple[str, ...]
  classes: int


_CIFAR = {
    "cifar10": _CifarLayout("cifar-10-python.tar.gz", "cifar-10-batches-py",
                            tuple(f"data_batch_{i}" for i in range(1, 6)), ("test_batch",), 10),
    "cifar100": _CifarLayout("cifar-100-python.tar.gz", "cifar-100-python", ("train",),
                             ("test",), 100),
}

# numpy's array reconstruction under both of its module names (numpy 1 and 2
# pickles), dtype, and the bytes encoding of protocol-2 pickles: what a
# pickled uint8 array needs, and nothing that could run other code.
_RECONSTRUCT = np.zeros(1).__reduce__()[0]
_PICKLE_ALLOWED = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class _ArrayUnpickler(pickle.Unpickler):
  def find_class(self, module, name):
    found = _PICKLE_ALLOWED.get((module, name))
    if found is None:
      raise pickle.UnpicklingError(f"refers to {module}.{name}, which a CIFAR batch "
                                   "does not")
    return found


def cifar_expected(name: str) -> str:
  c = _CIFAR[name]
  return (f"{c.archive} or its folder {c.folder}/ ("
          + ", ".join(c.train + c.test) + ") as distributed")


def locate_cifar(name: str, where: pathlib.Path) -> pathlib.Path | None:
  """The archive or the batches folder at or directly under ``where`` (or
  the folder of the batch ``where`` names).

  An extracted folder wins over an archive beside it (it reads faster).
  """
  c = _CIFAR[name]
  if where.is_file() and where.name in c.train + c.test:
    where = where.parent  # one batch named: its folder, as for SVHN's files
  elif where.is_file():
    return where
  if not where.is_dir():
    return None
  if (where / c.folder).is_dir():
    return where / c.folder
  if (where / c.train[0]).is_file():
    return where
  if (where / c.archive).is_file():
    return where / c.archive
  return None


def _unpickle_batch(data: bytes, where: str, expected: str) -> dict:
  # A batch is ~31 MB already in memory; a MemoryError or OverflowError
  # unpickling it comes from a length field claiming far more than the file.
  try:
    obj = _ArrayUnpickler(io.BytesIO(data), encoding="bytes").load()
  except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError,
          KeyError, AttributeError, struct.error, UnicodeDecodeError, OverflowError,
          MemoryError, RecursionError) as e:
    raise bad(where, f"not a pickled CIFAR batch ({e or type(e).__name__})",
              expected) from None
  if not isinstance(obj, dict):
    raise bad(where, f"holds a {type(obj).__name__}, not a dict", expected)
  return {(k.decode("latin1") if isinstance(k, bytes) else k): v for k, v in obj.items()}


def _cifar_batch(name: str, data: bytes, where: str) -> dict[str, np.ndarray]:
  """Images (N, 32, 32, 3) and labels of one batch, checked."""
  c = _CIFAR[name]
  expected = f"a CIFAR batch: data uint8 (N, 3072), {c.classes}-class labels"
  d = _unpickle_batch(data, where, expected)
  label_keys = ("labels",) if name == "cifar10" else ("fine_labels", "coarse_labels")
  lacking = [k for k in ("data",) + label_keys if k not in d]
  if lacking:
    raise bad(where, f"lacks {lacking}", expected)
  x = d["data"]
  if not isinstance(x, np.ndarray) or x.dtype != np.uint8 or x.ndim != 2 \
      or x.shape[1] != 3072:
    shape = list(getattr(x, "shape", [])) or type(x).__name__
    raise bad(where, f"data is {getattr(x, 'dtype', '')}{shape}", expected)
  out = {"x": x.reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)}
  for k, classes in zip(label_keys, (c.classes, 20), strict=False):
    try:
      y = np.asarray(d[k])
    except (ValueError, TypeError):
      raise bad(where, f"{k} is not a list of integers", expected) from None
    if y.shape != (x.shape[0],):
      raise bad(where, f"{k} has {list(y.shape)} entries for {x.shape[0]} images",
                expected)
    out[k] = check_labels(where, y, classes, expected)
  return out


def _cifar_members(name: str, loc: pathlib.Path) -> dict[str, bytes]:
  """The bytes of every batch, from the folder or the archive."""
  c = _CIFAR[name]
  wanted = c.train + c.test
  expected = cifar_expected(name)
  if loc.is_dir():
    return {m: read_bytes(loc / m, expected) for m in wanted}
  found: dict[str, bytes] = {}
  try:
    with tarfile.open(loc, "r:*") as tar:
      for member in tar:
        base = member.name.rsplit("/", 1)[-1]
        if member.isfile() and base in wanted and base not in found:
          f = tar.extractfile(member)
          if f is not None:
            found[base] = f.read()
  except (tarfile.TarError, EOFError, zlib.error, gzip.BadGzipFile) as e:
    raise bad(loc, f"damaged archive ({e or 'truncated'})", expected) from None
  except OSError as e:
    raise bad(loc, f"cannot be read ({e.strerror or e})", expected) from None
  lacking = [m for m in wanted if m not in found]
  if lacking:
    raise bad(loc, f"the archive lacks {c.folder}/{lacking[0]}", expected)
  return found


def plan_cifar(name: str, loc: pathlib.Path) -> Plan:
  c = _CIFAR[name]
  files = [loc] if loc.is_file() else [loc / m for m in c.train + c.test]
  for f in files:
    if not f.is_file():
      raise missing(f, cifar_expected(name))
  coarse = name == "cifar100"

  def decode(w: Writer) -> None:
    members = _cifar_members(name, loc)
    for split in ("train", "test"):
      parts = [_cifar_batch(name, members.pop(m),
                            str(loc / m) if loc.is_dir() else f"{loc}:{c.folder}/{m}")
               for m in getattr(c, split)]
      w.put(f"x_{split}", np.concatenate([p["x"] for p in parts]))
      key = "labels" if name == "cifar10" else "fine_labels"
      w.put(f"y_{split}", np.concatenate([p[key] for p in parts]))
      if coarse:
        w.put(f"y_{split}_coarse", np.concatenate([p["coarse_labels"] for p in parts]))

  arrays: tuple[str, ...] = ("x_train", "y_train", "x_test", "y_test")
  if coarse:
    arrays += ("y_train_coarse", "y_test_coarse")
  return Plan(name, loc, files, {}, arrays, decode)


# ------------------------------------------------------------------- SVHN

SVHN_FILES = {"train": "train_32x32.mat", "test": "test_32x32.mat",
              "extra": "extra_32x32.mat"}


def svhn_expected(extra: bool) -> str:
  names = [SVHN_FILES["train"], SVHN_FILES["test"]] + ([SVHN_FILES["extra"]] if extra else [])
  return (", ".join(names) + " (MATLAB files of X uint8 (32, 32, 3, N) and y in 1..10) "
          "as distributed")


def locate_svhn(where: pathlib.Path) -> pathlib.Path | None:
  """The directory holding ``train_32x32.mat`` (``where`` may name one of the
  files)."""
  if where.is_file() and where.name in SVHN_FILES.values():
    where = where.parent
  if where.is_dir() and (where / SVHN_FILES["train"]).is_file():
    return where
  return None


# MATLAB v5 data types (miINT8 .. miUTF32; 8, 10 and 11 are reserved).
_MAT_TYPES = frozenset({1, 2, 3, 4, 5, 6, 7, 9, 12, 13, 14, 15, 16, 17, 18})
_MAT_MATRIX, _MAT_COMPRESSED = 14, 15
_MAT_NUMERIC = (6, 15)  # mxDOUBLE_CLASS .. mxUINT64_CLASS


def mat_element_damage(f: BinaryIO) -> str | None:
  """Why the MATLAB v5 file ``f`` is not one of whole elements holding real
  numeric arrays (SVHN's X and y), or None.

  scipy's v5 reader trusts an uncompressed element's type and size and a
  matrix's class and complex flag (its docs: not hardened for untrusted
  input), and can crash the process on a damaged one, where an error line
  is owed; this walks the tags, and each uncompressed matrix's flags and
  elements, without reading the data.  A compressed element's inside is
  zlib's to check; a file that is not v5 (v7.3 is HDF5) is loadmat's to
  name.  Leaves ``f`` at 0.
  """
  try:
    head = f.read(128)
    order = {b"IM": "<", b"MI": ">"}.get(head[126:128])
    if len(head) < 128 or order is None or struct.unpack(order + "H", head[124:126])[0] != 0x0100:
      return None
    end = f.seek(0, io.SEEK_END)

    def tag(pos: int) -> tuple[int, int, int, int]:
      """Type, size, bytes held (tag included) and bytes to the next element
      of the element at ``pos``."""
      f.seek(pos)
      word, size = struct.unpack(order + "II", f.read(8))
      if word >> 16:  # a small element: type and size in one word, data in the other
        return word & 0xFFFF, word >> 16, 8, 8
      return word, size, 8 + size, 8 + size + (0 if word == _MAT_COMPRESSED else -size % 8)

    def flags(pos: int, size: int) -> str | None:
      """The array flags opening the matrix at ``pos`` of ``size`` bytes: a
      real numeric class."""
      if size < 16:  # the flags' tag and their two words: inside the matrix
        return f"matrix at byte {pos} holds {size} bytes, too few for its array flags"
      kind, size, _, _ = tag(pos + 8)
      if kind != 6 or size != 8:  # miUINT32, two words
        return f"matrix at byte {pos} opens with no array flags"
      f.seek(pos + 16)
      word = struct.unpack(order + "I", f.read(4))[0]
      cls, complex_ = word & 0xFF, word & 0x0800
      if not _MAT_NUMERIC[0] <= cls <= _MAT_NUMERIC[1] or complex_:
        return (f"matrix at byte {pos} is of class {cls}{' (complex)' * bool(complex_)}; "
                "expected a real numeric array")
      return None

    def damage(pos: int, stop: int, inside: bool) -> tuple[str | None, int]:
      """What is wrong with the element at ``pos`` within ``stop`` (inside
      a numeric matrix, or at the top), and the bytes to the next."""
      kind, size, held, step = tag(pos)
      if kind not in _MAT_TYPES or (inside and kind in (_MAT_MATRIX, _MAT_COMPRESSED)):
        what = "type {} inside a numeric matrix" if inside else "unknown type {}"
        return f"element at byte {pos} has {what.format(kind)}", step
      if held == 8 and size > 4:
        return f"element at byte {pos} claims {size} bytes in a small element", step
      if pos + held > stop:
        whose = "its matrix's end" if inside else "the end"
        return f"element at byte {pos} claims {size} bytes past {whose} at {stop}", step
      if kind == _MAT_MATRIX:
        return flags(pos, size) or walk(pos + 8, pos + 8 + size, True), step
      return None, step

    def walk(pos: int, stop: int, inside: bool) -> str | None:
      """The first damage among the elements from ``pos`` to ``stop``; a
      numeric matrix holds flags, dimensions, name and the real part."""
      while stop - pos >= 8:
        bad, step = damage(pos, stop, inside)
        if bad:
          return bad
        pos += step
      return None

    return walk(128, end, False)
  finally:
    f.seek(0)


def _read_mat(path: pathlib.Path, expected: str) -> tuple[np.ndarray, np.ndarray]:
  scipy_io = importlib.import_module("scipy.io")  # scipy ships no type stubs
  try:
    f = open(path, "rb")  # noqa: SIM115  (a read error of the file is not damage)
  except OSError as e:
    raise bad(path, f"cannot be read ({e.strerror or e})", expected) from None
  with f:
    damage = mat_element_damage(f)
    if damage:
      raise bad(path, f"damaged or not a MATLAB v5 file ({damage})", expected)
    try:
      m = scipy_io.loadmat(f, variable_names=("X", "y"))
    # loadmat reports damage by the parser's own errors (a short file is an
    # OSError); each means "not a whole MATLAB v5 file" (v7.3 files are HDF5:
    # NotImplementedError).
    except (OSError, ValueError, TypeError, KeyError, IndexError, EOFError, struct.error,
            zlib.error, NotImplementedError, scipy_io.matlab.MatReadError) as e:
      raise bad(path, f"damaged or not a MATLAB v5 file ({e or type(e).__name__})",
                expected) from None
  x, y = m.get("X"), m.get("y")
  if x is None or y is None:
    raise bad(path, f"lacks the variable {'X' if x is None else 'y'}", expected)
  if x.dtype != np.uint8 or x.ndim != 4 or x.shape[:3] != (32, 32, 3):
    raise bad(path, f"X is {x.dtype}{list(x.shape)}", expected)
  y = np.asarray(y).reshape(-1) if y.ndim == 2 and 1 in y.shape else y
  if y.shape != (x.shape[3],):
    raise bad(path, f"y is {list(np.shape(y))} for {x.shape[3]} images", expected)
  labels = check_labels(path, y, 10, expected, offset=1) + 1
  return x, np.where(labels == 10, 0, labels).astype(np.int32)


def plan_svhn(loc: pathlib.Path, extra: bool) -> Plan:
  expected = svhn_expected(extra)
  splits = ["train", "test"] + (["extra"] if extra else [])
  files = [loc / SVHN_FILES[s] for s in splits]
  for f in files:
    if not f.is_file():
      raise missing(f, expected)

  def decode(w: Writer) -> None:
    for split in ("train", "test"):
      x, y = _read_mat(loc / SVHN_FILES[split], expected)
      if split == "train" and extra:  # the extra images join the training set
        xe, ye = _read_mat(loc / SVHN_FILES["extra"], expected)
        n, ne = x.shape[3], xe.shape[3]
        out = w.empty("x_train", (n + ne, 32, 32, 3), np.uint8)
        out[:n] = x.transpose(3, 0, 1, 2)
        del x
        out[n:] = xe.transpose(3, 0, 1, 2)
        del xe
        w.put("y_train", np.concatenate([y, ye]))
        continue
      w.put(f"x_{split}", x.transpose(3, 0, 1, 2))
      w.put(f"y_{split}", y)

  return Plan("svhn", loc, files, {"extra": bool(extra)},
              ("x_train", "y_train", "x_test", "y_test"), decode)


# ---------------------------------------------------------------- FEMNIST

FEMNIST_CLASSES = 62
FEMNIST_EXPECTED = ("LEAF's FEMNIST shards train/*.json and test/*.json, each with users, "
                    "num_samples and user_data {user: {x: [784 floats in [0, 1]], y: "
                    "[labels in [0, 61]]}}")


def locate_femnist(where: pathlib.Path) -> pathlib.Path | None:
  """The directory with ``train/`` and ``test/`` (LEAF's ``femnist/data/``):
  ``where``, or its ``data/`` or ``femnist/data/``."""
  for d in (where, where / "data", where / "femnist" / "data"):
    if (d / "train").is_dir() and (d / "test").is_dir():
      return d
  return None


def _femnist_shards(loc: pathlib.Path) -> dict[str, list[pathlib.Path]]:
  out = {}
  for split in ("train", "test"):
    shards = sorted(p for p in (loc / split).iterdir() if p.suffix == ".json" and p.is_file())
    if not shards:
      raise missing(loc / split / "*.json", FEMNIST_EXPECTED)
    out[split] = shards
  return out


def _femnist_shard(path: pathlib.Path) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
  """``(users, x uint8 (n, 28, 28), y int32 (n,), user index (n,))`` of a shard."""
  try:
    with open(path, "rb") as f:
      obj = json.load(f)
  except OSError as e:
    raise bad(path, f"cannot be read ({e.strerror or e})", FEMNIST_EXPECTED) from None
  except (ValueError, UnicodeDecodeError) as e:  # JSONDecodeError is a ValueError
    raise bad(path, f"not whole JSON ({e})", FEMNIST_EXPECTED) from None
  if not isinstance(obj, dict) or not all(k in obj for k in ("users", "num_samples",
                                                             "user_data")):
    raise bad(path, "lacks users, num_samples or user_data", FEMNIST_EXPECTED)
  users, counts, data = obj["users"], obj["num_samples"], obj["user_data"]
  if (not isinstance(users, list) or not isinstance(counts, list) or
      not isinstance(data, dict) or len(users) != len(counts)):
    raise bad(path, "users and num_samples are not lists of one length", FEMNIST_EXPECTED)
  xs, ys, owner = [], [], []
  for i, (u, n) in enumerate(zip(users, counts, strict=True)):
    where = f"{path}: user {u!r}"
    if not isinstance(u, str) or u not in data or not isinstance(data[u], dict):
      raise bad(where, "has no entry in user_data", FEMNIST_EXPECTED)
    ux, uy = data[u].get("x"), data[u].get("y")
    try:
      x = np.asarray(ux, dtype=np.float64)
    except (ValueError, TypeError):
      raise bad(where, "x is not a list of 784-number lists", FEMNIST_EXPECTED) from None
    if x.size == 0:
      x = x.reshape(0, 784)
    if x.ndim != 2 or x.shape[1] != 784 or not isinstance(uy, list) or \
        len(uy) != x.shape[0] or x.shape[0] != n:
      raise bad(where, f"x is {list(x.shape)}, y has "
                f"{len(uy) if isinstance(uy, list) else '?'} labels, num_samples says {n}",
                FEMNIST_EXPECTED)
    if x.size and not (np.all(np.isfinite(x)) and x.min() >= 0 and x.max() <= 1):
      raise bad(where, "x has values outside [0, 1]", FEMNIST_EXPECTED)
    try:
      y = np.asarray(uy)
    except (ValueError, TypeError):
      raise bad(where, "y is not a list of integers", FEMNIST_EXPECTED) from None
    ys.append(check_labels(where, y if y.size else y.astype(np.int64), FEMNIST_CLASSES,
                           FEMNIST_EXPECTED))
    xs.append(np.rint(x * 255.0).astype(np.uint8).reshape(-1, 28, 28))
    owner.append(np.full(x.shape[0], i, np.int64))
  if not xs:
    return [], np.zeros((0, 28, 28), np.uint8), np.zeros(0, np.int32), np.zeros(0, np.int64)
  return list(users), np.concatenate(xs), np.concatenate(ys), np.concatenate(owner)


def plan_femnist(loc: pathlib.Path) -> Plan:
  shards = _femnist_shards(loc)

  def decode(w: Writer) -> None:
    for split in ("train", "test"):
      xs, ys, names = [], [], []
      for path in shards[split]:
        users, x, y, owner = _femnist_shard(path)
        xs.append(x)
        ys.append(y)
        names.append(np.asarray(users, dtype=str)[owner] if len(users) else
                     np.zeros(0, str))
      x, y = np.concatenate(xs), np.concatenate(ys)
      if not len(y):
        raise bad(loc / split, "the shards hold no samples", FEMNIST_EXPECTED)
      w.put(f"x_{split}", x)
      w.put(f"y_{split}", y)
      if split == "train":
        writers, ids = np.unique(np.concatenate(names), return_inverse=True)
        w.put("writers", writers)
        w.put("client_ids", ids.reshape(-1).astype(np.int32))

  files = shards["train"] + shards["test"]
  return Plan("femnist", loc, files, {},
              ("x_train", "y_train", "x_test", "y_test", "writers", "client_ids"), decode)

