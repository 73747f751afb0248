"""A memory-mapped cache of decoded datasets, written once, read many times.

Decoding a dataset from the form its publisher distributes (a tar of
pickles, MATLAB files, a tree of JPEGs, JSON shards) takes from seconds to
minutes; a run then reads the arrays from ``.npy`` files instead, memory-mapped
(``np.load(mmap_mode="r")``), so a second run starts at once and a large
training set is paged in, not copied.

Layout: ``<cache root>/<name>/decoded/<key>/`` holds one ``<array>.npy`` per
array and ``meta.json``; the cache root is the one every dataset uses
(:func:`jsfl.data.idx.default_cache_root`: ``cache_dir``, ``$JSFL_DATA`` or
``~/.cache/jsfl``).  ``<key>`` hashes the format version, the dataset, the
decode parameters, the resolved source location and every source file's
relative path, size and modification time, so an edited, replaced or added
source file is decoded again, and the superseded entry of the same source is
removed.

An entry is written into a temporary sibling directory (``.tmp-*``), each
file flushed to disk, and published with one ``os.replace`` of the
directory: a reader sees a whole entry or none, never a half-written one.
A decode that fails (a damaged source file, an interrupt) removes its
temporary directory and the directories it created, so nothing is left
behind.  A decode killed outright (SIGKILL, power loss) cannot clean up: its
temporary directory is named after its process and host, and the next decode
of the same entry on that host removes it once that process is gone.  Two
processes decoding the same source at once both succeed; the second to finish
discards its copy and reads the first's.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import math
import os
import pathlib
import shutil
import socket
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from jsfl.errors import DataError

FORMAT_VERSION = 1
"""Bumped when a decoder's output changes, so older entries are not read."""

META = "meta.json"


@dataclasses.dataclass
class Plan:
  """What to decode from where, as the cache needs it.

  Attributes:
    name: the dataset name (the cache subdirectory).
    root: the located source (a file or directory); part of the key.
    files: every source file the arrays are decoded from; their paths
      (relative to ``root``, or ``root`` itself), sizes and modification
      times are part of the key.
    params: decode parameters that change the arrays (JSON-able); part of
      the key.
    arrays: the array names the decoder writes.
    decode: fills a :class:`Writer` with every array of ``arrays``; raises
      :class:`jsfl.data.idx.BadDataFile` for a source it cannot use.
  """

  name: str
  root: pathlib.Path
  files: list[pathlib.Path]
  params: dict[str, Any]
  arrays: tuple[str, ...]
  decode: Callable[[Writer], None]


class Writer:
  """The arrays of one entry, written into its temporary directory."""

  def __init__(self, directory: pathlib.Path):
    self.directory = directory
    self._open: list[tuple[str, np.ndarray]] = []
    self.shapes: dict[str, list[int]] = {}

  def empty(self, name: str, shape: tuple[int, ...], dtype) -> np.ndarray:
    """A writable array backed by ``<name>.npy`` (a memory map), for
    decoders that fill a large array piece by piece."""
    shape = tuple(int(d) for d in shape)
    self.shapes[name] = list(shape)
    if math.prod(shape) == 0:  # an empty file cannot be memory-mapped
      arr = np.empty(shape, dtype)
      self._open.append((name, arr))
      return arr
    arr = np.lib.format.open_memmap(self.directory / f"{name}.npy", mode="w+",
                                    dtype=dtype, shape=shape)
    self._open.append((name, arr))
    return arr

  def put(self, name: str, array: np.ndarray) -> None:
    """Writes a whole array."""
    array = np.ascontiguousarray(array)
    if array.dtype.hasobject:
      raise ValueError(f"{name}: object arrays are not cached (they need pickle)")
    self.shapes[name] = list(array.shape)
    np.save(self.directory / f"{name}.npy", array, allow_pickle=False)

  def close(self) -> None:
    """Flushes the memory maps (and saves the empty arrays)."""
    for name, arr in self._open:
      if isinstance(arr, np.memmap):
        arr.flush()
      else:
        np.save(self.directory / f"{name}.npy", arr, allow_pickle=False)
    self._open.clear()


def _stat_list(root: pathlib.Path, files: Iterable[pathlib.Path]) -> list:
  out = []
  for f in files:
    st = f.stat()
    rel = "." if f == root else os.path.relpath(f, root)
    out.append([rel, st.st_size, st.st_mtime_ns])
  return out


def entry_key(plan: Plan) -> str:
  """The entry's name: a hash of everything its arrays depend on.

  Raises:
    OSError: a source file vanished since it was listed.
  """
  material = {"format": FORMAT_VERSION, "name": plan.name, "params": plan.params,
              "root": str(plan.root.resolve()),
              "files": _stat_list(plan.root, plan.files)}
  blob = json.dumps(material, sort_keys=True, separators=(",", ":")).encode()
  return hashlib.sha256(blob).hexdigest()[:20]


def _fsync(path: pathlib.Path) -> None:
  fd = os.open(path, os.O_RDONLY)
  try:
    os.fsync(fd)
  finally:
    os.close(fd)


def _read(entry: pathlib.Path, plan: Plan) -> dict[str, np.ndarray]:
  """The arrays of a published entry, memory-mapped (read-only)."""
  try:
    with open(entry / META) as f:
      meta = json.load(f)
    shapes = meta["shapes"]
    missing = [a for a in plan.arrays if a not in shapes]
    if missing:
      raise ValueError(f"lacks arrays {missing}")
    out = {}
    for a, shape in shapes.items():
      path = entry / f"{a}.npy"
      arr = (np.load(path, mmap_mode="r", allow_pickle=False) if math.prod(shape)
             else np.load(path, allow_pickle=False))  # an empty array has no map
      if list(arr.shape) != list(shape):
        raise ValueError(f"{a}.npy is {list(arr.shape)}, meta.json says {shape}")
      out[a] = arr
    return out
  except (OSError, ValueError, KeyError, TypeError, EOFError) as e:
    raise DataError(f"{entry}: damaged cache entry of {plan.name} ({e}); allowed: "
                    f"delete that directory (it is decoded again from {plan.root})"
                    ) from None


def _decode(plan: Plan, tmp: pathlib.Path) -> dict[str, list[int]]:
  """Runs the plan's decoder into ``tmp``; returns the arrays' shapes."""
  writer = Writer(tmp)
  plan.decode(writer)
  writer.close()
  missing = [a for a in plan.arrays if a not in writer.shapes]
  if missing:  # a decoder's bug, not the user's input
    raise RuntimeError(f"{plan.name} decoder wrote no {missing}")
  return writer.shapes


def _made_dirs(path: pathlib.Path) -> list[pathlib.Path]:
  """Creates ``path`` and its missing parents; returns those it created,
  deepest first, so a failed decode can remove exactly them."""
  made = []
  p = path
  while not p.exists():
    made.append(p)
    p = p.parent
  path.mkdir(parents=True, exist_ok=True)
  return made


def _remove_empty(dirs: list[pathlib.Path]) -> None:
  for d in dirs:
    with contextlib.suppress(OSError):
      d.rmdir()


def _drop_superseded(parent: pathlib.Path, plan: Plan, keep: str) -> None:
  """Removes older entries of the same source and parameters (their files
  changed since), so the cache holds one entry per source."""
  root = str(plan.root.resolve())
  for entry in parent.iterdir():
    if entry.name == keep or entry.name.startswith("."):
      continue
    try:
      with open(entry / META) as f:
        meta = json.load(f)
    except (OSError, ValueError):
      continue
    if meta.get("root") == root and meta.get("params") == plan.params:
      shutil.rmtree(entry, ignore_errors=True)


def _tmp_prefix(key: str, pid: int | None = None, host: str | None = None) -> str:
  """A temporary entry's name up to mkdtemp's random suffix (which has no
  '-'): the entry key, then the decoding process as ``pid@host``."""
  return f".tmp-{key}-{os.getpid() if pid is None else pid}@{host or socket.gethostname()}-"


def _alive(pid: int) -> bool:
  try:
    os.kill(pid, 0)
  except ProcessLookupError:
    return False
  except PermissionError:  # another user's process
    return True
  return True


def _drop_abandoned(parent: pathlib.Path, key: str) -> None:
  """Removes the temporary directories of ``key`` left by decodes on this
  host whose process no longer runs (a SIGKILL gives no chance to clean up);
  another host's, or a running process's, stay."""
  head, host = f".tmp-{key}-", socket.gethostname()
  for p in parent.glob(f"{head}*@*-*"):
    pid, _, rest = p.name[len(head):].partition("@")
    if pid.isdigit() and rest.rpartition("-")[0] == host and not _alive(int(pid)):
      shutil.rmtree(p, ignore_errors=True)


def load(plan: Plan, cache_root: pathlib.Path) -> dict[str, np.ndarray]:
  """The plan's arrays: from its cache entry, decoding them first if none.

  Args:
    plan: what to decode (see :class:`Plan`).
    cache_root: the cache root; the entry lives under
      ``<cache_root>/<plan.name>/decoded/``.

  Returns:
    ``{array name: read-only array}``, memory-mapped where not empty.

  Raises:
    BadDataFile: a source file the decoder cannot use (nothing is left
      behind).
    DataError: the cache directory cannot be written, or an entry is
      damaged.
  """
  try:
    key = entry_key(plan)
  except OSError as e:
    raise DataError(f"{e.filename}: cannot be read: {e.strerror or e}; allowed: the "
                    f"files of {plan.name} as listed in docs/setting.md#datasets"
                    ) from None
  parent = cache_root / plan.name / "decoded"
  entry = parent / key
  if (entry / META).is_file():
    return _read(entry, plan)
  made: list[pathlib.Path] = []
  tmp = None
  try:
    made = _made_dirs(parent)
    _drop_abandoned(parent, key)
    tmp = pathlib.Path(tempfile.mkdtemp(dir=parent, prefix=_tmp_prefix(key)))
    shapes = _decode(plan, tmp)
    meta = {"format": FORMAT_VERSION, "name": plan.name, "params": plan.params,
            "root": str(plan.root.resolve()), "files": len(plan.files), "shapes": shapes}
    with open(tmp / META, "w") as f:
      json.dump(meta, f, indent=1)
    for p in tmp.iterdir():
      _fsync(p)
    _fsync(tmp)
    try:
      os.replace(tmp, entry)
    except OSError:
      if not (entry / META).is_file():
        raise
      # another process published the same entry first: read that one
    else:
      tmp = None
      _fsync(parent)
      _drop_superseded(parent, plan, key)
  except OSError as e:
    if tmp is not None:
      shutil.rmtree(tmp, ignore_errors=True)
      tmp = None
    _remove_empty(made)
    where = e.filename if e.filename is not None else parent
    raise DataError(f"{where}: cannot write the decoded cache of {plan.name}: "
                    f"{e.strerror or e}; allowed: a writable cache directory "
                    "($JSFL_DATA or ~/.cache/jsfl)") from None
  finally:
    if tmp is not None:  # a failed decode: nothing half-written stays
      shutil.rmtree(tmp, ignore_errors=True)
      _remove_empty(made)
  return _read(entry, plan)
