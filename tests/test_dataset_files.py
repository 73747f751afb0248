"""The papers' datasets read from the files their publishers distribute.

Every fixture is written here, tiny, in exactly the publisher's format (a
CIFAR tar of pickled batches, SVHN's MATLAB files, the Tiny-ImageNet and
CINIC-10 trees, LEAF's FEMNIST JSON shards, HAM10000's metadata and JPEG
folders); nothing is downloaded.  Checked: the arrays, labels and writer ids
come back as written; a second load reads the decoded cache; damaged input
is one line naming the file, exit status 2 from the command, and nothing left
in the cache; ``jsfl run``, ``jsfl partition`` and ``jsfl info`` work on
each.
"""

from __future__ import annotations

import io
import json
import os
import pathlib
import pickle
import shutil
import subprocess
import sys
import tarfile

import numpy as np
import pytest
import scipy.io
from PIL import Image

from jsfl import cli, data
from jsfl.data import cache, files, images
from jsfl.data.tfds_source import CIFAR100_COARSE
from jsfl.errors import DataError
from jsfl.partitions import make_partition


def _pixels(n, h, w, c=3, seed=0):
  return np.random.default_rng(seed).integers(0, 256, (n, h, w, c), dtype=np.uint8)


# ------------------------------------------------------------ the fixtures


def write_cifar(root: pathlib.Path, name: str, archive: bool = True, *, n_train=4,
                n_test=10, damage=None) -> dict:
  """CIFAR-10 (5 batches of ``n_train``) or CIFAR-100 (one ``train``) as the
  Toronto page distributes it: protocol-2 pickles of dicts with bytes keys,
  data uint8 (N, 3072) in CHW order, in a gzipped tar or its folder."""
  folder = "cifar-10-batches-py" if name == "cifar10" else "cifar-100-python"
  members = ([f"data_batch_{i}" for i in range(1, 6)] if name == "cifar10" else ["train"])
  classes = 10 if name == "cifar10" else 100
  blobs, xs, ys = {}, {"train": [], "test": []}, {"train": [], "test": []}
  for i, m in enumerate(members + ["test_batch" if name == "cifar10" else "test"]):
    split = "test" if m.startswith("test") else "train"
    n = n_test if split == "test" else n_train * (5 if name == "cifar100" else 1)
    x = _pixels(n, 32, 32, seed=i)
    y = (np.arange(n) + 3 * i) % classes
    d = {b"data": x.transpose(0, 3, 1, 2).reshape(n, 3072), b"batch_label": m.encode(),
         b"filenames": [f"img_{i}_{k}.png".encode() for k in range(n)]}
    if name == "cifar10":
      d[b"labels"] = [int(v) for v in y]
    else:
      d[b"fine_labels"] = [int(v) for v in y]
      d[b"coarse_labels"] = [int(v) for v in CIFAR100_COARSE[y]]
    if damage == "shape" and i == 1:
      d[b"data"] = d[b"data"][:, :3000]
    if damage == "label" and i == 1:
      d[b"labels" if name == "cifar10" else b"fine_labels"][0] = classes
    blobs[m] = pickle.dumps(d, protocol=2)
    if damage == "pickle" and i == 0:
      blobs[m] = b"\x80\x02cos\nsystem\nq\x00X\x04\x00\x00\x00truer\x85R."
    if damage == "huge_claim" and i == 0:  # a damaged length: more bytes than exist
      blobs[m] = b"\x80\x05\x96" + (2**63 + 5).to_bytes(8, "little")
    xs[split].append(x)
    ys[split].append(y)
  meta = {b"label_names": [f"c{k}".encode() for k in range(classes)]}
  blobs["batches.meta" if name == "cifar10" else "meta"] = pickle.dumps(meta, protocol=2)
  if damage == "missing":
    del blobs[members[-1] if name == "cifar100" else "data_batch_3"]
  root.mkdir(parents=True, exist_ok=True)
  if archive:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
      for m, blob in blobs.items():
        info = tarfile.TarInfo(f"{folder}/{m}")
        info.size = len(blob)
        tar.addfile(info, io.BytesIO(blob))
    raw = buf.getvalue()
    if damage == "truncated":
      raw = raw[: len(raw) // 2]
    target = root / ("cifar-10-python.tar.gz" if name == "cifar10" else "cifar-100-python.tar.gz")
    target.write_bytes(raw)
  else:
    (root / folder).mkdir(exist_ok=True)
    for m, blob in blobs.items():
      (root / folder / m).write_bytes(blob)
  out = {f"x_{s}": np.concatenate(xs[s]) for s in xs} | {
      f"y_{s}": np.concatenate(ys[s]) for s in ys}
  if name == "cifar100":
    out["y_train_coarse"] = CIFAR100_COARSE[out["y_train"]]
    out["y_test_coarse"] = CIFAR100_COARSE[out["y_test"]]
  return out


def write_svhn(root: pathlib.Path, damage=None, extra: bool = False) -> dict:
  """``train_32x32.mat`` etc. as MATLAB v5 files: X (32, 32, 3, N), y (N, 1)
  in 1..10 where 10 is the digit 0; the test file compressed, as the
  distributed files are, the others not."""
  root.mkdir(parents=True, exist_ok=True)
  out = {}
  for i, (split, n) in enumerate((("train", 20), ("test", 10), ("extra", 5))):
    if split == "extra" and not extra:
      continue
    x = _pixels(n, 32, 32, seed=10 + i)
    digit = (np.arange(n) + i) % 10
    y = np.where(digit == 0, 10, digit).astype(np.uint8)[:, None]
    mx = x.transpose(1, 2, 3, 0)
    if damage == "shape" and split == "train":
      mx = mx[:, :30]
    if damage == "label" and split == "test":
      y[2] = 11
    path = root / f"{split}_32x32.mat"
    # the distributed files are compressed; the others read the plain layout
    scipy.io.savemat(path, {"X": mx, "y": y}, do_compression=split == "test")
    if damage == "truncated" and split == "train":
      path.write_bytes(path.read_bytes()[:3000])
    if damage == "complex" and split == "train":  # X's array flags (byte 145) say complex
      raw = bytearray(path.read_bytes())
      raw[145] |= 0x08
      path.write_bytes(bytes(raw))
    if damage == "element" and split == "train":
      # X's data element after its name (a small miINT8 element "X") gets a
      # type MATLAB does not have, which scipy's reader trusts
      raw = bytearray(path.read_bytes())
      at = raw.index(b"\x01\x00\x01\x00X\x00\x00\x00") + 8
      raw[at:at + 4] = (60).to_bytes(4, "little")
      path.write_bytes(bytes(raw))
    out[split] = (x, digit)
  if damage == "missing":
    (root / "test_32x32.mat").unlink()
  x_train, y_train = out["train"]
  if extra:
    x_train = np.concatenate([x_train, out["extra"][0]])
    y_train = np.concatenate([y_train, out["extra"][1]])
  return {"x_train": x_train, "y_train": y_train, "x_test": out["test"][0],
          "y_test": out["test"][1]}


def _write_jpeg(path: pathlib.Path, size, seed: int) -> np.ndarray:
  """A smooth image saved as JPEG; returns what Pillow decodes from the file."""
  w, h = size
  rng = np.random.default_rng(seed)
  base = rng.integers(40, 216, 3)
  ramp = np.linspace(-30, 30, w)[None, :, None] + np.linspace(-20, 20, h)[:, None, None]
  img = np.clip(base + ramp, 0, 255).astype(np.uint8)
  Image.fromarray(img).save(path, quality=95)
  with Image.open(path) as im:
    return np.asarray(im.convert("RGB"))


TINY_WNIDS = ["n01443537", "n01629819", "n01641577", "n01644900", "n01698640",
              "n01742172", "n01768244"]


def write_tiny_imagenet(root: pathlib.Path, damage=None) -> dict:
  """The ``tiny-imagenet-200`` tree with 7 wnids, 2 or 3 training images each
  and one validation image for each of 6 (64x64 JPEGs): 15 and 6 images, as
  many as the HAM10000 fixture's split, so that their runs share a program."""
  t = root / "tiny-imagenet-200"
  wnids = TINY_WNIDS[::-1]  # the file's order is not the label order
  (t / "val" / "images").mkdir(parents=True)
  (t / "test" / "images").mkdir(parents=True)
  (t / "wnids.txt").write_text("\n".join(wnids) + "\n")
  (t / "words.txt").write_text("".join(f"{w}\tthing {w}\n" for w in wnids))
  xs, ys = {"train": [], "test": []}, {"train": [], "test": []}
  for c, w in enumerate(sorted(wnids)):
    d = t / "train" / w / "images"
    d.mkdir(parents=True)
    (t / "train" / w / f"{w}_boxes.txt").write_text("")
    for k in range(3 if w == TINY_WNIDS[0] else 2):
      xs["train"].append(_write_jpeg(d / f"{w}_{k}.JPEG", (64, 64), 10 * c + k))
      ys["train"].append(sorted(wnids).index(w))
  lines = []
  for i, w in enumerate(wnids[:6]):
    xs["test"].append(_write_jpeg(t / "val" / "images" / f"val_{i}.JPEG", (64, 64), 5000 + i))
    ys["test"].append(sorted(wnids).index(w))
    lines.append(f"val_{i}.JPEG\t{w}\t0\t0\t63\t63")
  _write_jpeg(t / "test" / "images" / "test_0.JPEG", (64, 64), 9)
  if damage == "unknown_class":
    lines[3] = lines[3].replace(wnids[3], "n99999999")
  if damage == "missing":
    (t / "val" / "images" / "val_2.JPEG").unlink()
  if damage == "shape":
    _write_jpeg(t / "train" / sorted(wnids)[1] / "images" / f"{sorted(wnids)[1]}_0.JPEG",
                (32, 32), 1)
  if damage == "truncated":
    f = t / "val" / "images" / "val_4.JPEG"
    f.write_bytes(f.read_bytes()[:300])
  if damage == "unknown_folder":
    (t / "train" / "n00000001" / "images").mkdir(parents=True)
  (t / "val" / "val_annotations.txt").write_text("\n".join(lines) + "\n")
  return {"x_train": np.stack(xs["train"]), "y_train": np.array(ys["train"]),
          "x_test": np.stack(xs["test"]), "y_test": np.array(ys["test"])}


def write_cinic10(root: pathlib.Path, damage=None) -> dict:
  """``train/ valid/ test/`` with a folder of 32x32 PNGs per class, named as
  CINIC names them (CIFAR's and ImageNet's images side by side)."""
  out = {}
  for s, split in enumerate(("train", "valid", "test")):
    xs, ys = [], []
    for c, cls in enumerate(images.CINIC_CLASSES):
      d = root / split / cls
      d.mkdir(parents=True)
      names = [f"n0{2690373 + c}_{s}{c}.png", f"cifar10-{split}-{100 * s + c}.png"]
      written = []
      for k, name in enumerate(names[: 2 if split != "test" else 1]):
        img = Image.fromarray(_pixels(1, 32, 32, seed=100 * s + 10 * c + k)[0])
        if c == 3 and k == 0:  # CINIC has greyscale images too
          img = img.convert("L")
        img.save(d / name)
        written.append((name, np.asarray(img.convert("RGB"))))
      for _, x in sorted(written, key=lambda t: t[0]):  # the loader reads in name order
        xs.append(x)
        ys.append(c)
    out[split] = (np.stack(xs), np.array(ys))
  if damage == "unknown_class":
    (root / "test" / "unicorn").mkdir()
  if damage == "shape":
    bad = next((root / "test" / "cat").iterdir())
    Image.fromarray(_pixels(1, 31, 32)[0]).save(bad, format="PNG")
  if damage == "missing":
    for f in (root / "train" / "frog").iterdir():
      f.unlink()
    (root / "train" / "frog").rmdir()
  return out


FEMNIST_WRITERS = ["f0003_14", "f0001_41", "f0002_07", "f0000_22", "f0004_30"]


def write_femnist(root: pathlib.Path, damage=None) -> dict:
  """LEAF's ``data/train/*.json`` and ``data/test/*.json``: per writer, x as
  784 floats k / 255 and y in [0, 62)."""
  d = root / "femnist" / "data"
  out = {"x_train": [], "y_train": [], "writer": [], "x_test": [], "y_test": []}
  for split, shards in (("train", [FEMNIST_WRITERS[:3], FEMNIST_WRITERS[3:]]),
                        ("test", [FEMNIST_WRITERS])):
    (d / split).mkdir(parents=True)
    for s, users in enumerate(shards):
      doc = {"users": users, "num_samples": [], "user_data": {}}
      for u in users:
        n = 3 if split == "train" else 1
        seed = FEMNIST_WRITERS.index(u) + 10 * (split == "test")
        px = _pixels(n, 28, 28, 1, seed=seed)[..., 0]
        y = (np.arange(n) * 7 + FEMNIST_WRITERS.index(u) * 13) % 62
        doc["num_samples"].append(n)
        doc["user_data"][u] = {"x": (px.reshape(n, 784) / 255.0).tolist(),
                               "y": [int(v) for v in y]}
        out[f"x_{split}"].append(px)
        out[f"y_{split}"].append(y)
        if split == "train":
          out["writer"] += [u] * n
      if damage == "label" and split == "train" and s == 1:
        doc["user_data"][users[0]]["y"][1] = 62
      if damage == "shape" and split == "test":
        doc["user_data"][users[2]]["x"][0] = doc["user_data"][users[2]]["x"][0][:783]
      text = json.dumps(doc)
      if damage == "truncated" and split == "train" and s == 0:
        text = text[: len(text) // 2]
      (d / split / f"all_data_{s}_niid_0_keep_0_{split}_9.json").write_text(text)
  if damage == "missing":
    for f in (d / "test").iterdir():
      f.unlink()
  return {k: np.concatenate(v) if k != "writer" else np.array(v) for k, v in out.items()}


def write_ham10000(root: pathlib.Path, damage=None) -> dict:
  """``HAM10000_metadata.csv`` and the two image folders (small JPEGs; the
  release's are 600x450), 3 images of each of the 7 classes, some lesions
  photographed twice."""
  (root / "HAM10000_images_part_1").mkdir(parents=True)
  (root / "HAM10000_images_part_2").mkdir()
  rows = ["lesion_id,image_id,dx,dx_type,age,sex,localization"]
  xs, ys, lesions = [], [], []
  k = 0
  for c, dx in enumerate(images.HAM_CLASSES):
    for j in range(3):
      image_id = f"ISIC_{24306 + k:07d}"
      lesion = f"HAM_{(k if j != 1 else k - 1):07d}"
      part = root / ("HAM10000_images_part_1" if k % 2 else "HAM10000_images_part_2")
      _write_jpeg(part / f"{image_id}.jpg", (60, 45), 700 + k)
      with Image.open(part / f"{image_id}.jpg") as im:
        xs.append(np.asarray(im.convert("RGB").resize((16, 16), Image.Resampling.BICUBIC)))
      ys.append(c)
      lesions.append(lesion)
      rows.append(f"{lesion},{image_id},{dx},histo,{40 + k}.0,male,back")
      k += 1
  if damage == "unknown_class":
    rows[5] = rows[5].replace(",bcc,", ",melanoma,")
  if damage == "long_field":  # past Python's csv field limit (131,072 characters)
    rows[3] = rows[3].replace(",histo,", "," + "x" * 140_000 + ",")
  if damage == "long_header":
    rows[0] += "," + "h" * 140_000
  if damage == "missing":
    next((root / "HAM10000_images_part_2").iterdir()).unlink()
  if damage == "truncated":
    f = sorted((root / "HAM10000_images_part_1").iterdir())[2]
    f.write_bytes(f.read_bytes()[:200])
  bom = "\ufeff" if damage == "bom" else ""  # as a spreadsheet saves UTF-8 CSV
  (root / "HAM10000_metadata.csv").write_text(bom + "\n".join(rows) + "\n", encoding="utf-8")
  return {"x": np.stack(xs), "y": np.array(ys), "lesion": np.array(lesions)}


# ------------------------------------------------------- shared set-up


@pytest.fixture
def cache_root(monkeypatch, tmp_path):
  """A private cache root; nothing else may be written anywhere."""
  root = tmp_path / "cache"
  monkeypatch.setenv("JSFL_DATA", str(root))
  monkeypatch.setenv("JSFL_SYSTEM_DATA", str(tmp_path / "system"))
  return root


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
  """One intact fixture of each dataset, written once: ``{name: (path,
  expected)}``; tests must not change them."""
  root = tmp_path_factory.mktemp("publishers")
  out = {}
  out["cifar10"] = (root / "c10", write_cifar(root / "c10", "cifar10"))
  out["cifar10_folder"] = (root / "c10f" / "cifar-10-batches-py",
                           write_cifar(root / "c10f", "cifar10", archive=False))
  out["cifar100"] = (root / "c100" / "cifar-100-python.tar.gz",
                     write_cifar(root / "c100", "cifar100"))
  out["svhn"] = (root / "svhn", write_svhn(root / "svhn", extra=True))
  out["tiny_imagenet"] = (root / "tiny", write_tiny_imagenet(root / "tiny"))
  out["cinic10"] = (root / "cinic", write_cinic10(root / "cinic"))
  out["femnist"] = (root / "leaf", write_femnist(root / "leaf"))
  out["ham10000"] = (root / "ham", write_ham10000(root / "ham"))
  return out


def _listing(root: pathlib.Path) -> list[str]:
  if not root.exists():
    return []
  return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# ------------------------------------------- 1. arrays come back as written


def _same(ds, expected):
  np.testing.assert_array_equal(ds.x_train, expected["x_train"])
  np.testing.assert_array_equal(ds.y_train, expected["y_train"])
  np.testing.assert_array_equal(ds.x_test, expected["x_test"])
  np.testing.assert_array_equal(ds.y_test, expected["y_test"])
  assert ds.y_train.dtype == np.int32 and ds.x_train.dtype == np.uint8


def test_cifar10_archive_and_folder(fixtures, cache_root):
  for key in ("cifar10", "cifar10_folder"):
    path, expected = fixtures[key]
    ds = data.load_dataset("cifar10", path=str(path))
    _same(ds, expected)
    assert ds.num_classes == 10 and ds.input_shape == (32, 32, 3)
  # the archive given as the file itself, or in data_dir, reads the same
  path, expected = fixtures["cifar10"]
  _same(data.load_dataset("cifar10", path=str(path / "cifar-10-python.tar.gz")), expected)
  _same(data.load_dataset("cifar10", data_dir=str(path)), expected)
  # one batch of the folder named: its folder, as SVHN takes one of its files
  path, expected = fixtures["cifar10_folder"]
  batch = next(path.rglob("data_batch_1"))
  _same(data.load_dataset("cifar10", path=str(batch)), expected)


class _Python2Pickler(pickle._Pickler):
  """Pickles as the CIFAR release's Python 2 cPickle wrote them: every str
  and bytes a Python 2 string (BINSTRING opcodes, no _codecs.encode), numpy
  arrays rebuilt by numpy.core.multiarray._reconstruct, no protocol-3 opcodes."""
  dispatch = dict(pickle._Pickler.dispatch)

  def save_py2_string(self, obj):
    raw = obj.encode("latin-1") if isinstance(obj, str) else obj
    head = (pickle.SHORT_BINSTRING + bytes([len(raw)]) if len(raw) < 256
            else pickle.BINSTRING + len(raw).to_bytes(4, "little"))
    self.write(head + raw)

  def save_global(self, obj, name=None):
    module = obj.__module__.replace("numpy._core", "numpy.core")
    self.write(pickle.GLOBAL + f"{module}\n{name or obj.__qualname__}\n".encode())

  dispatch[str] = dispatch[bytes] = save_py2_string
  dispatch[type] = save_global


def test_cifar_batches_pickled_by_python_2_read_as_python_3_ones():
  """The Toronto files are Python 2 pickles, not what pickle.dumps writes
  for the other fixtures: the reader takes both the same."""
  from jsfl.data import formats
  x = _pixels(7, 32, 32, seed=3)
  flat = x.transpose(0, 3, 1, 2).reshape(7, 3072)
  for name, labels in (("cifar10", {"labels": [3, 1, 4, 1, 5, 9, 2]}),
                       ("cifar100", {"fine_labels": [99, 0, 4, 1, 5, 9, 2],
                                     "coarse_labels": [int(CIFAR100_COARSE[v])
                                                       for v in (99, 0, 4, 1, 5, 9, 2)]})):
    buf = io.BytesIO()
    _Python2Pickler(buf, protocol=2).dump({"batch_label": "training batch 1 of 5",
                                           "data": flat, "filenames": ["a.png"] * 7, **labels})
    blob = buf.getvalue()
    assert b"numpy.core.multiarray" in blob and b"_codecs" not in blob
    got = formats._cifar_batch(name, blob, "py2")
    np.testing.assert_array_equal(got["x"], x)
    for k, v in labels.items():
      np.testing.assert_array_equal(got[k], v)


def test_cifar100_fine_and_coarse(fixtures, cache_root):
  path, expected = fixtures["cifar100"]
  fine = data.load_dataset("cifar100", path=str(path))
  _same(fine, expected)
  assert fine.num_classes == 100
  coarse = data.load_dataset("cifar100", path=str(path), label_mode="coarse")
  np.testing.assert_array_equal(coarse.y_train, expected["y_train_coarse"])
  np.testing.assert_array_equal(coarse.y_test, expected["y_test_coarse"])
  assert coarse.num_classes == 20
  # one decode serves both label sets
  assert len(os.listdir(cache_root / "cifar100" / "decoded")) == 1


def test_svhn_label_10_is_digit_0_and_extra(fixtures, cache_root):
  path, expected = fixtures["svhn"]
  ds = data.load_dataset("svhn", path=str(path), extra=True)
  _same(ds, expected)
  assert 0 in ds.y_train and ds.y_train.max() == 9
  plain = data.load_dataset("svhn", path=str(path / "train_32x32.mat"))
  np.testing.assert_array_equal(plain.x_train, expected["x_train"][:20])
  np.testing.assert_array_equal(plain.y_train, expected["y_train"][:20])


def test_tiny_imagenet(fixtures, cache_root):
  path, expected = fixtures["tiny_imagenet"]
  ds = data.load_dataset("tiny_imagenet", path=str(path))
  _same(ds, expected)
  assert ds.num_classes == 7 and ds.input_shape == (64, 64, 3)


def test_cinic10_with_and_without_valid(fixtures, cache_root):
  path, expected = fixtures["cinic10"]
  ds = data.load_dataset("cinic10", path=str(path))
  x_train, y_train = expected["train"]
  _same(ds, {"x_train": x_train, "y_train": y_train, "x_test": expected["test"][0],
             "y_test": expected["test"][1]})
  both = data.load_dataset("cinic10", path=str(path), with_valid=True)
  np.testing.assert_array_equal(both.x_train, np.concatenate([x_train, expected["valid"][0]]))
  np.testing.assert_array_equal(both.y_train, np.concatenate([y_train, expected["valid"][1]]))


def test_femnist_arrays_and_writers(fixtures, cache_root):
  path, expected = fixtures["femnist"]
  ds = data.load_dataset("femnist", path=str(path))
  _same(ds, {k: v[..., None] if k.startswith("x") else v for k, v in expected.items()})
  assert ds.num_classes == 62 and ds.input_shape == (28, 28, 1)
  writers = np.array(sorted(FEMNIST_WRITERS))
  np.testing.assert_array_equal(writers[ds.client_ids], expected["writer"])
  sub = data.load_dataset("femnist", path=str(path / "femnist"), train_subset=10)
  assert len(sub.client_ids) == 10 and sub.client_ids.dtype == ds.client_ids.dtype


def test_femnist_writers_become_clients(fixtures, cache_root):
  path, expected = fixtures["femnist"]
  ds = data.load_dataset("femnist", path=str(path))
  writer = expected["writer"]
  parts = make_partition("natural", ds.y_train, 5, seed=0, client_ids=ds.client_ids)
  assert [set(writer[p]) for p in parts] == [{w} for w in sorted(FEMNIST_WRITERS)]
  assert sorted(np.concatenate(parts)) == list(range(len(writer)))
  # a group of writers a client: every sample held, each writer at one client
  groups = make_partition("natural", ds.y_train, 2, seed=3, client_ids=ds.client_ids,
                          group=True)
  held = [set(writer[p]) for p in groups]
  assert sorted(len(h) for h in held) == [2, 3] and not held[0] & held[1]
  for p, h in zip(groups, held, strict=True):
    np.testing.assert_array_equal(p, np.flatnonzero(np.isin(writer, list(h))))
  # drawn writers (no group): 2 of the 5, whole
  drawn = make_partition("natural", ds.y_train, 2, seed=3, client_ids=ds.client_ids)
  assert all(len(set(writer[p])) == 1 for p in drawn)


def test_ham10000_resized_and_split_by_lesion(fixtures, cache_root):
  path, expected = fixtures["ham10000"]
  ds = data.load_dataset("ham10000", path=str(path), image_size=16, test_fraction=0.3)
  assert ds.num_classes == 7 and ds.input_shape == (16, 16, 3)
  x, y, lesion = expected["x"], expected["y"], expected["lesion"]
  assert len(ds.y_train) + len(ds.y_test) == len(y)
  # every image is on exactly one side, lesions whole, about 30% in the test set
  rows = {x[i].tobytes(): i for i in range(len(y))}
  train = [rows[im.tobytes()] for im in ds.x_train]
  test = [rows[im.tobytes()] for im in ds.x_test]
  assert sorted(train + test) == list(range(len(y)))
  np.testing.assert_array_equal(ds.y_train, y[train])
  np.testing.assert_array_equal(ds.y_test, y[test])
  assert not set(lesion[train]) & set(lesion[test])
  assert 6 <= len(test) <= 8
  default = data.load_dataset("ham10000", path=str(path / "HAM10000_metadata.csv"))
  assert default.input_shape == (64, 64, 3) and len(default.y_test) in (2, 3)


def test_ham10000_metadata_saved_with_a_byte_order_mark(tmp_path, cache_root):
  expected = write_ham10000(tmp_path / "ham", damage="bom")
  assert (tmp_path / "ham" / "HAM10000_metadata.csv").read_bytes()[:3] == b"\xef\xbb\xbf"
  ds = data.load_dataset("ham10000", path=str(tmp_path / "ham"), image_size=16,
                         test_fraction=0.3)
  assert sorted(np.concatenate([ds.y_train, ds.y_test])) == sorted(expected["y"])


def test_normalisation_and_subset_as_for_fashion_mnist(fixtures, cache_root):
  path, _ = fixtures["cifar10"]
  ds = data.load_dataset("cifar10", path=str(path), train_subset=10)
  assert len(ds.y_train) == 10
  mean, std = data.channel_stats(np.asarray(ds.x_train))
  np.testing.assert_allclose(ds.mean, mean)
  np.testing.assert_allclose(ds.std, std)
  with pytest.raises(ValueError, match=r"train_subset=21; allowed"):
    data.load_dataset("cifar10", path=str(path), train_subset=21)


# --------------------------------------------------- 2. decoded once


def test_second_load_reads_the_cache(fixtures, cache_root, monkeypatch):
  decodes = []
  real = cache._decode
  monkeypatch.setattr(cache, "_decode", lambda plan, tmp: decodes.append(plan.name)
                      or real(plan, tmp))
  path, expected = fixtures["tiny_imagenet"]
  data.load_dataset("tiny_imagenet", path=str(path))
  entries = list((cache_root / "tiny_imagenet" / "decoded").iterdir())
  assert len(entries) == 1 and (entries[0] / "meta.json").is_file()
  stamp = {p.name: p.stat().st_mtime_ns for p in entries[0].iterdir()}
  again = data.load_dataset("tiny_imagenet", path=str(path))
  assert decodes == ["tiny_imagenet"]
  assert {p.name: p.stat().st_mtime_ns for p in entries[0].iterdir()} == stamp
  _same(again, expected)
  assert isinstance(again.x_train.base, np.memmap) or isinstance(again.x_train, np.memmap)


def test_a_killed_decodes_temporary_directory_is_removed_by_the_next(fixtures, cache_root):
  path, expected = fixtures["tiny_imagenet"]
  data.load_dataset("tiny_imagenet", path=str(path))
  decoded = cache_root / "tiny_imagenet" / "decoded"
  (entry,) = decoded.iterdir()
  shutil.rmtree(entry)
  dead = subprocess.Popen(["true"])
  dead.wait()
  left = {
      "dead_here": cache._tmp_prefix(entry.name, pid=dead.pid) + "abc_1",
      "alive_here": cache._tmp_prefix(entry.name) + "abc_2",
      "dead_elsewhere": cache._tmp_prefix(entry.name, pid=dead.pid, host="other-host") + "abc3",
      "other_key": cache._tmp_prefix("0" * len(entry.name), pid=dead.pid) + "abc4",
  }
  for name in left.values():
    (decoded / name).mkdir()
    (decoded / name / "x_train.npy").write_bytes(b"half")
  _same(data.load_dataset("tiny_imagenet", path=str(path)), expected)
  assert sorted(p.name for p in decoded.iterdir()) == sorted(
      [entry.name, *(left[k] for k in ("alive_here", "dead_elsewhere", "other_key"))])


def test_a_changed_source_file_is_decoded_again(tmp_path, cache_root, monkeypatch):
  decodes = []
  real = cache._decode
  monkeypatch.setattr(cache, "_decode", lambda plan, tmp: decodes.append(plan.name)
                      or real(plan, tmp))
  expected = write_femnist(tmp_path / "leaf")
  data.load_dataset("femnist", path=str(tmp_path / "leaf"))
  shard = next((tmp_path / "leaf" / "femnist" / "data" / "train").iterdir())
  os.utime(shard, ns=(shard.stat().st_atime_ns, shard.stat().st_mtime_ns + 10**9))
  ds = data.load_dataset("femnist", path=str(tmp_path / "leaf"))
  assert decodes == ["femnist", "femnist"]
  np.testing.assert_array_equal(ds.y_train, expected["y_train"])
  # the superseded entry is gone: one entry per source
  assert len(list((cache_root / "femnist" / "decoded").iterdir())) == 1


# ------------------------------------------ 3. damaged input: one line, nothing left

DAMAGED = [
    # (id, writer(root, damage), dataset, options, damage, text the line names)
    ("cifar10_truncated", lambda r, d: write_cifar(r, "cifar10", damage=d), "cifar10", {},
     "truncated", "cifar-10-python.tar.gz: damaged archive"),
    ("cifar10_missing_batch", lambda r, d: write_cifar(r, "cifar10", archive=False, damage=d),
     "cifar10", {}, "missing", "data_batch_3: missing; expected"),
    ("cifar10_missing_member", lambda r, d: write_cifar(r, "cifar10", damage=d), "cifar10",
     {}, "missing", "lacks cifar-10-batches-py/data_batch_3"),
    ("cifar10_wrong_shape", lambda r, d: write_cifar(r, "cifar10", damage=d), "cifar10", {},
     "shape", "data_batch_2: data is uint8[4, 3000]"),
    ("cifar10_unknown_class", lambda r, d: write_cifar(r, "cifar10", damage=d), "cifar10",
     {}, "label", "data_batch_2: label 10 is not a class"),
    ("cifar10_hostile_pickle", lambda r, d: write_cifar(r, "cifar10", archive=False,
                                                        damage=d),
     "cifar10", {}, "pickle", "data_batch_1: not a pickled CIFAR batch"),
    ("cifar10_huge_claim", lambda r, d: write_cifar(r, "cifar10", archive=False, damage=d),
     "cifar10", {}, "huge_claim", "data_batch_1: not a pickled CIFAR batch (BYTEARRAY8"),
    ("cifar100_unknown_class", lambda r, d: write_cifar(r, "cifar100", damage=d),
     "cifar100", {}, "label", "test: label 100 is not a class"),
    ("svhn_truncated", write_svhn, "svhn", {}, "truncated",
     "train_32x32.mat: damaged or not a MATLAB v5 file"),
    ("svhn_bad_element", write_svhn, "svhn", {}, "element",
     "train_32x32.mat: damaged or not a MATLAB v5 file (element at byte 184 has type 60 "
     "inside a numeric matrix)"),
    ("svhn_complex", write_svhn, "svhn", {}, "complex",
     "train_32x32.mat: damaged or not a MATLAB v5 file (matrix at byte 128 is of class 9 "
     "(complex); expected a real numeric array)"),
    ("svhn_missing", write_svhn, "svhn", {}, "missing", "test_32x32.mat: missing"),
    ("svhn_wrong_shape", write_svhn, "svhn", {}, "shape", "X is uint8[32, 30, 3, 20]"),
    ("svhn_unknown_class", write_svhn, "svhn", {}, "label",
     "test_32x32.mat: label 11 is not a class"),
    ("tiny_unknown_class", write_tiny_imagenet, "tiny_imagenet", {}, "unknown_class",
     "val_annotations.txt:4: class 'n99999999' is not in wnids.txt"),
    ("tiny_unknown_folder", write_tiny_imagenet, "tiny_imagenet", {}, "unknown_folder",
     "n00000001: class folder 'n00000001' is not a class"),
    ("tiny_missing", write_tiny_imagenet, "tiny_imagenet", {}, "missing",
     "val_2.JPEG: missing"),
    ("tiny_wrong_shape", write_tiny_imagenet, "tiny_imagenet", {}, "shape",
     "_0.JPEG: is 32x32 pixels; expected"),
    ("tiny_truncated", write_tiny_imagenet, "tiny_imagenet", {}, "truncated",
     "val_4.JPEG: damaged or not an image"),
    ("cinic_unknown_class", write_cinic10, "cinic10", {}, "unknown_class",
     "unicorn: class folder 'unicorn' is not a class"),
    ("cinic_wrong_shape", write_cinic10, "cinic10", {}, "shape", ".png: is 32x31 pixels"),
    ("cinic_missing_class", write_cinic10, "cinic10", {}, "missing", "train/frog: missing"),
    ("femnist_truncated", write_femnist, "femnist", {}, "truncated",
     "all_data_0_niid_0_keep_0_train_9.json: not whole JSON"),
    ("femnist_unknown_class", write_femnist, "femnist", {}, "label",
     "user 'f0000_22': label 62 is not a class"),
    ("femnist_wrong_shape", write_femnist, "femnist", {}, "shape",
     "user 'f0002_07': x is [1, 783]"),
    ("femnist_missing", write_femnist, "femnist", {}, "missing", "test/*.json: missing"),
    ("ham_unknown_class", write_ham10000, "ham10000", {}, "unknown_class",
     "HAM10000_metadata.csv:6: dx 'melanoma' is not a class"),
    ("ham_long_header", write_ham10000, "ham10000", {}, "long_header",
     "HAM10000_metadata.csv:1: not CSV (field larger than field limit"),
    ("ham_long_field", write_ham10000, "ham10000", {}, "long_field",
     "HAM10000_metadata.csv:4: not CSV (field larger than field limit"),
    ("ham_missing", write_ham10000, "ham10000", {}, "missing", ".jpg: missing; expected the "
     "image of HAM10000_metadata.csv line"),
    ("ham_truncated", write_ham10000, "ham10000", {"image_size": 8}, "truncated",
     ".jpg: damaged or not an image"),
]


@pytest.mark.parametrize("writer, name, options, damage, needle",
                         [c[1:] for c in DAMAGED], ids=[c[0] for c in DAMAGED])
def test_damaged_input_is_one_line_and_leaves_nothing(writer, name, options, damage,
                                                      needle, tmp_path, cache_root, capsys):
  src = tmp_path / "src"
  writer(src, damage)
  before = _listing(src)
  with pytest.raises(DataError) as e:
    data.load_dataset(name, path=str(src), **options)
  msg = str(e.value)
  assert "\n" not in msg and needle in msg, msg
  assert "expected" in msg or "allowed" in msg, msg
  assert _listing(cache_root) == [] and _listing(src) == before
  # the command: exit 2, the same one line, nothing left
  argv = ["partition", name, "iid", "--clients", "2", f"dataset.path={src}"] + [
      f"dataset.{k}={v}" for k, v in options.items()]
  assert cli.main(argv) == 2
  err = capsys.readouterr().err
  assert err.splitlines() == [f"jsfl: error: {msg}"]
  assert _listing(cache_root) == [] and _listing(src) == before
  run = tmp_path / "run"
  assert cli.main(["run", f"dataset.name={name}", f"dataset.path={src}", f"run.dir={run}"]
                  + [f"dataset.{k}={v}" for k, v in options.items()]) == 2
  assert capsys.readouterr().err.splitlines() == [f"jsfl: error: [dataset] {msg}"]
  assert not run.exists() and _listing(cache_root) == [] and _listing(src) == before


def test_a_failed_decode_removes_its_partial_entry(fixtures, cache_root, monkeypatch):
  """An interrupt in the middle of writing leaves no entry and no temp dir."""
  def stop(*a, **k):
    raise KeyboardInterrupt

  monkeypatch.setattr(images, "decode_image", stop)
  path, _ = fixtures["cinic10"]
  with pytest.raises(KeyboardInterrupt):
    data.load_dataset("cinic10", path=str(path))
  assert _listing(cache_root) == []


@pytest.mark.parametrize("name, path, needle", [
    ("tiny_imagenet", "nowhere", "path='{tmp}/nowhere' does not exist; allowed: "),
    ("femnist", "empty", "path='{tmp}/empty' holds no femnist; allowed: "),
    ("ham10000", "empty", "HAM10000_metadata.csv"),
    ("cinic10", None, "cinic10: no path given and none at {tmp}/cache/cinic10; allowed"),
])
def test_missing_dataset_names_the_files_and_publisher(name, path, needle, tmp_path,
                                                       cache_root):
  (tmp_path / "empty").mkdir()
  with pytest.raises(data.DatasetNotFound) as e:
    data.load_dataset(name, **({"path": str(tmp_path / path)} if path else {}))
  msg = str(e.value)
  assert needle.format(tmp=tmp_path) in msg and "docs/setting.md#datasets" in msg
  assert files.FILE_SOURCES[name].publisher in msg
  assert _listing(cache_root) == []


def test_cifar_without_publisher_files_still_falls_back(tmp_path, cache_root, monkeypatch):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)
  with pytest.raises(data.DatasetNotFound) as e:
    data.load_dataset("cifar10")
  msg = str(e.value)
  assert "pip install 'jsfl[tfds]'" in msg and "cifar-10-python.tar.gz" in msg
  with pytest.raises(ValueError, match="both set"):
    data.load_dataset("cifar10", path=str(tmp_path), data_dir=str(tmp_path))
  with pytest.raises(ValueError, match=r"label_mode='mid'; allowed"):
    data.load_dataset("cifar100", path=str(tmp_path), label_mode="mid")
  with pytest.raises(ValueError, match=r"image_size=2; allowed"):
    data.load_dataset("ham10000", path=str(tmp_path), image_size=2)


def test_unwritable_cache_is_one_line(fixtures, tmp_path, monkeypatch):
  afile = tmp_path / "afile"
  afile.write_text("not a directory\n")
  monkeypatch.setenv("JSFL_DATA", str(afile / "cache"))
  with pytest.raises(DataError, match="cannot write the decoded cache of svhn.*allowed: a "
                     "writable cache directory"):
    data.load_dataset("svhn", path=str(fixtures["svhn"][0]))
  assert sorted(os.listdir(tmp_path)) == ["afile"]


# ----------------------------------------- 4. the commands on each dataset

# Small enough that a run compiles in seconds (a narrow small_cnn, two
# clients, tiny batches); the fixtures of cifar10, svhn and cinic10 (20 + 10
# images of 32x32x3, 10 classes) and of tiny_imagenet and ham10000 (15 + 6 of
# 64x64x3, 7 classes) have the same shapes, so each group compiles once and
# the others read the compiled programs from the cache.
SMALL = ["model.width=2", "model.hidden=8", "partition.num_clients=2", "method.batch_size=8",
         "run.rounds=2", "exec.progress=false", "run.checkpoint_every=0", "method.name=fedavg"]
RUNS = {
    "cifar10": [],
    "cifar100": ["dataset.label_mode=coarse"],
    "svhn": [],
    "tiny_imagenet": [],
    "cinic10": [],
    "femnist": ["partition.name=natural", "partition.group=true"],
    "ham10000": ["dataset.image_size=64", "dataset.test_fraction=0.3"],
}


@pytest.mark.parametrize("name", list(RUNS))
def test_run_partition_and_info_on_each(name, fixtures, cache_root, tmp_path, capsys):
  path, _ = fixtures[name]
  out = tmp_path / "run"
  argv = ["run", f"dataset.name={name}", f"dataset.path={path}", *SMALL, *RUNS[name],
          f"run.dir={out}", "--quiet"]
  assert cli.main(argv) == 0, capsys.readouterr().err
  recs = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
  assert [r["round"] for r in recs] == [1, 2]
  if name == "femnist":  # each client the samples of its group of writers
    # (two clients keep the run's program small; a writer a client:
    # test_femnist_writers_become_clients)
    seed = json.loads((out / "partition.json").read_text())["seeds"][0]
    expected = fixtures[name][1]
    writer = expected["writer"]
    ds = data.load_dataset(name, path=str(path))
    groups = make_partition("natural", ds.y_train, 2, seed=0, client_ids=ds.client_ids,
                            group=True)
    held = [set(writer[g]) for g in groups]
    assert not held[0] & held[1] and held[0] | held[1] == set(FEMNIST_WRITERS)
    want = [np.bincount(expected["y_train"][np.isin(writer, list(h))], minlength=62)
            for h in held]
    np.testing.assert_array_equal(seed["label_counts"], want)
  capsys.readouterr()
  opts = [o.removeprefix("partition.") for o in RUNS[name] if not o.startswith("partition.name")]
  part = "natural" if name == "femnist" else "iid"
  assert cli.main(["partition", name, part, "--clients", "2", f"dataset.path={path}",
                   *opts]) == 0
  table = capsys.readouterr().out.splitlines()
  assert table[0].startswith("client") and len(table) == 3
  assert cli.main(["info", f"dataset.name={name}", f"dataset.path={path}", "--no-compile"]) == 0
  assert f"on {name}," in capsys.readouterr().out


def test_the_mat_walk_never_raises_on_a_damaged_file():
  """The check before scipy's reader names damage and raises nothing itself:
  every truncation of a file, a matrix too short for its flags, and random
  byte changes (none of which may crash it either)."""
  import random
  import struct

  from jsfl.data import formats
  buf = io.BytesIO()
  scipy.io.savemat(buf, {"X": _pixels(2, 32, 32, seed=1).transpose(1, 2, 3, 0),
                         "y": np.ones((2, 1), np.uint8)})
  base = buf.getvalue()
  assert formats.mat_element_damage(io.BytesIO(base)) is None
  for n in range(128, len(base), 5):
    formats.mat_element_damage(io.BytesIO(base[:n]))
  short = base[:128] + struct.pack("<II", 14, 8) + bytes(8)
  assert formats.mat_element_damage(io.BytesIO(short)) == (
      "matrix at byte 128 holds 8 bytes, too few for its array flags")
  rng = random.Random(0)
  for _ in range(500):
    raw = bytearray(base)
    for _ in range(rng.randint(1, 3)):
      raw[rng.randrange(120, len(raw))] = rng.randrange(256)
    formats.mat_element_damage(io.BytesIO(bytes(raw)))
