"""Readers of the image-file datasets: Tiny-ImageNet, CINIC-10, HAM10000.

Their images are JPEG or PNG files in the publisher's directory tree; they are
decoded with Pillow (a dependency of jsfl; no TensorFlow), converted to RGB
(a few images of each are greyscale) and written into the decoded cache
(:mod:`jsfl.data.cache`) by a pool of threads (Pillow's decoders release the
GIL).  An image of the wrong size, an unreadable or truncated image, a class
folder or label the dataset does not have, and a missing file are each a
:class:`~jsfl.data.idx.BadDataFile` or :class:`~jsfl.data.idx.DatasetNotFound`
naming the file.

* Tiny-ImageNet: ``tiny-imagenet-200/`` with ``wnids.txt``,
  ``train/<wnid>/images/*.JPEG`` and ``val/val_annotations.txt`` +
  ``val/images/``; the validation set is the test set (the release's test
  images carry no labels).  Labels index the sorted wnids (the order of a
  class-folder loader over ``train/``); the classes are those of
  ``wnids.txt`` (200 in the release).  Images are 64x64.
* CINIC-10: ``train/ valid/ test/``, each with one folder per CIFAR-10 class
  of 32x32 PNGs; ``with_valid`` adds ``valid/`` to the training set.
* HAM10000: ``HAM10000_metadata.csv`` (or the Dataverse ``.tab``) and the
  image folders ``HAM10000_images_part_1/ _part_2/`` of 600x450 JPEGs,
  resized to ``image_size`` squared with Pillow's bicubic filter (64 by
  default: the SFedKD paper does not state its resolution; SplitFed's
  HAM10000 code, the split-learning reference on this dataset, resizes to
  64x64 the same way).  The 7 classes are the ``dx`` codes in alphabetical
  order.  The 10,015 images carry no test split (ISIC 2018's test images
  are another download): ``test_fraction`` of the images, whole lesions
  (``lesion_id``) at a time so that no lesion is on both sides, are drawn
  with a fixed seed as the test set.
"""

from __future__ import annotations

import concurrent.futures
import csv
import io
import os
import pathlib

import numpy as np

from jsfl.data.cache import Plan, Writer
from jsfl.data.formats import bad, missing
from jsfl.errors import DataError

_CHUNK = 256  # images a thread decodes per task


def _pil():
  try:
    from PIL import Image
  except ImportError:
    raise DataError("decoding JPEG/PNG datasets needs Pillow, which is not installed; "
                    "allowed: `pip install pillow` (a dependency of jsfl)") from None
  return Image


def decode_image(path: pathlib.Path, expected: str, size=None, resize=None) -> np.ndarray:
  """One image as uint8 ``(H, W, 3)``.

  Args:
    path: the image file.
    expected: what the dataset's images are, for the error message.
    size: ``(W, H)`` the image must have, or None.
    resize: ``(W, H)`` to resize to (bicubic), or None.
  """
  Image = _pil()
  try:
    with Image.open(path) as im:
      rgb = im.convert("RGB")  # decodes the whole file
  except Image.DecompressionBombError as e:
    raise bad(path, f"not a usable image ({e})", expected) from None
  except (OSError, SyntaxError, ValueError) as e:  # UnidentifiedImageError is an OSError
    raise bad(path, f"damaged or not an image ({e})", expected) from None
  if size is not None and rgb.size != tuple(size):
    raise bad(path, f"is {rgb.size[0]}x{rgb.size[1]} pixels", expected)
  if resize is not None and rgb.size != tuple(resize):
    rgb = rgb.resize(tuple(resize), Image.Resampling.BICUBIC)
  return np.asarray(rgb, dtype=np.uint8)


def decode_images(out: np.ndarray, paths: list[pathlib.Path], expected: str, **kw) -> None:
  """Decodes ``paths[i]`` into ``out[i]`` on a few threads; the first bad
  image (in order) is the error."""
  n = len(paths)

  def work(start: int) -> None:
    for i in range(start, min(start + _CHUNK, n)):
      out[i] = decode_image(paths[i], expected, **kw)

  starts = range(0, n, _CHUNK)
  workers = max(1, min(8, os.cpu_count() or 1, len(starts)))
  if workers == 1:
    for s in starts:
      work(s)
    return
  with concurrent.futures.ThreadPoolExecutor(workers) as ex:
    futures = [ex.submit(work, s) for s in starts]
    try:
      for f in futures:
        f.result()
    except BaseException:
      for f in futures:
        f.cancel()
      raise


def _images_in(directory: pathlib.Path, suffixes: tuple[str, ...]) -> list[pathlib.Path]:
  return sorted(p for p in directory.iterdir()
                if p.suffix.lower() in suffixes and p.is_file())


def _read_text(path: pathlib.Path, expected: str) -> str:
  if not path.is_file():
    raise missing(path, expected)
  try:
    return path.read_text(encoding="utf-8-sig")  # a spreadsheet's byte-order mark too
  except OSError as e:
    raise bad(path, f"cannot be read ({e.strerror or e})", expected) from None
  except UnicodeDecodeError:
    raise bad(path, "is not UTF-8 text", expected) from None


def _class_dirs(split: pathlib.Path, classes, expected: str, what: str) -> None:
  """An unknown class folder in ``split`` is an error (a wrong or newer tree)."""
  known = set(classes)
  for p in sorted(split.iterdir()):
    if p.is_dir() and p.name not in known:
      raise bad(p, f"{what} {p.name!r} is not a class of the dataset", expected)


# ---------------------------------------------------------- Tiny-ImageNet

TINY_EXPECTED = ("the tiny-imagenet-200 tree: wnids.txt, train/<wnid>/images/*.JPEG, "
                 "val/val_annotations.txt and val/images/*.JPEG, 64x64 images")


def locate_tiny_imagenet(where: pathlib.Path) -> pathlib.Path | None:
  for d in (where, where / "tiny-imagenet-200"):
    if (d / "wnids.txt").is_file():
      return d
  return None


def plan_tiny_imagenet(loc: pathlib.Path) -> Plan:
  wnids_file = loc / "wnids.txt"
  wnids = [w.strip() for w in _read_text(wnids_file, TINY_EXPECTED).splitlines()]
  wnids = [w for w in wnids if w]
  if not wnids or len(set(wnids)) != len(wnids) or any(len(w.split()) != 1 for w in wnids):
    raise bad(wnids_file, "is not a list of distinct wnids, one a line", TINY_EXPECTED)
  classes = sorted(wnids)
  label = {w: i for i, w in enumerate(classes)}
  train_dir = loc / "train"
  if not train_dir.is_dir():
    raise missing(train_dir, TINY_EXPECTED)
  _class_dirs(train_dir, classes, TINY_EXPECTED, "class folder")
  train, y_train = [], []
  for w in classes:
    d = train_dir / w / "images"
    if not d.is_dir():
      raise missing(d, f"a folder of images for every wnid in wnids.txt; {TINY_EXPECTED}")
    imgs = _images_in(d, (".jpeg", ".jpg"))
    if not imgs:
      raise bad(d, "holds no .JPEG images", TINY_EXPECTED)
    train += imgs
    y_train += [label[w]] * len(imgs)
  ann = loc / "val" / "val_annotations.txt"
  test, y_test = [], []
  for n, line in enumerate(_read_text(ann, TINY_EXPECTED).splitlines(), 1):
    if not line.strip():
      continue
    fields = line.split("\t") if "\t" in line else line.split()
    if len(fields) < 2:
      raise bad(f"{ann}:{n}", "is not '<file>\\t<wnid>\\t...'", TINY_EXPECTED)
    fname, wnid = fields[0].strip(), fields[1].strip()
    if wnid not in label:
      raise bad(f"{ann}:{n}", f"class {wnid!r} is not in wnids.txt", TINY_EXPECTED)
    img = loc / "val" / "images" / fname
    if not img.is_file():
      raise missing(img, f"every image val_annotations.txt lists; {TINY_EXPECTED}")
    test.append(img)
    y_test.append(label[wnid])
  if not test:
    raise bad(ann, "lists no images", TINY_EXPECTED)

  def decode(w: Writer) -> None:
    for split, paths, y in (("train", train, y_train), ("test", test, y_test)):
      x = w.empty(f"x_{split}", (len(paths), 64, 64, 3), np.uint8)
      decode_images(x, paths, TINY_EXPECTED, size=(64, 64))
      w.put(f"y_{split}", np.asarray(y, np.int32))
    w.put("classes", np.asarray(classes, dtype=str))

  return Plan("tiny_imagenet", loc, [wnids_file, ann] + train + test, {},
              ("x_train", "y_train", "x_test", "y_test", "classes"), decode)


# --------------------------------------------------------------- CINIC-10

CINIC_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                 "ship", "truck")
CINIC_EXPECTED = ("the CINIC-10 tree: train/, valid/, test/, each with the folders "
                  + ", ".join(CINIC_CLASSES) + " of 32x32 PNGs")


def locate_cinic10(where: pathlib.Path) -> pathlib.Path | None:
  for d in (where, where / "CINIC-10", where / "cinic-10"):
    if (d / "train").is_dir() and (d / "test").is_dir() and \
        (d / "train" / CINIC_CLASSES[0]).is_dir():
      return d
  return None


def plan_cinic10(loc: pathlib.Path, with_valid: bool) -> Plan:
  splits = {"train": ["train"] + (["valid"] if with_valid else []), "test": ["test"]}
  paths: dict[str, list[pathlib.Path]] = {"train": [], "test": []}
  labels: dict[str, list[int]] = {"train": [], "test": []}
  for split, folders in splits.items():
    for folder in folders:
      d = loc / folder
      if not d.is_dir():
        raise missing(d, CINIC_EXPECTED)
      _class_dirs(d, CINIC_CLASSES, CINIC_EXPECTED, "class folder")
      for c, cls in enumerate(CINIC_CLASSES):
        if not (d / cls).is_dir():
          raise missing(d / cls, CINIC_EXPECTED)
        imgs = _images_in(d / cls, (".png",))
        paths[split] += imgs
        labels[split] += [c] * len(imgs)
    if not paths[split]:
      raise bad(loc / folders[0], "holds no .png images", CINIC_EXPECTED)

  def decode(w: Writer) -> None:
    for split in ("train", "test"):
      x = w.empty(f"x_{split}", (len(paths[split]), 32, 32, 3), np.uint8)
      decode_images(x, paths[split], CINIC_EXPECTED, size=(32, 32))
      w.put(f"y_{split}", np.asarray(labels[split], np.int32))

  return Plan("cinic10", loc, paths["train"] + paths["test"], {"with_valid": bool(with_valid)},
              ("x_train", "y_train", "x_test", "y_test"), decode)


# --------------------------------------------------------------- HAM10000

HAM_CLASSES = ("akiec", "bcc", "bkl", "df", "mel", "nv", "vasc")
HAM_METADATA = ("HAM10000_metadata.csv", "HAM10000_metadata.tab", "HAM10000_metadata")
HAM_EXPECTED = ("HAM10000_metadata.csv (columns lesion_id, image_id, dx with dx in "
                + ", ".join(HAM_CLASSES) + ") and the folders HAM10000_images_part_1/ and "
                "_part_2/ of <image_id>.jpg")


def locate_ham10000(where: pathlib.Path) -> pathlib.Path | None:
  if where.is_file() and where.name in HAM_METADATA:
    where = where.parent
  if where.is_dir() and any((where / m).is_file() for m in HAM_METADATA):
    return where
  return None


def _ham_rows(meta: pathlib.Path) -> list[tuple[int, str, str, str]]:
  """``(line, lesion_id, image_id, dx)`` of every row of the metadata."""
  text = _read_text(meta, HAM_EXPECTED)
  head = text.split("\n", 1)[0]
  reader = csv.DictReader(io.StringIO(text), delimiter="\t" if "\t" in head else ",")
  rows = []
  try:
    cols = [c.strip().strip('"') for c in (reader.fieldnames or [])]
    reader.fieldnames = cols
    lacking = [c for c in ("lesion_id", "image_id", "dx") if c not in cols]
    if lacking:
      raise bad(meta, f"lacks the column {lacking[0]!r}", HAM_EXPECTED)
    for row in reader:
      n = reader.line_num
      lesion, image, dx = (str(row.get(k) or "").strip() for k in ("lesion_id", "image_id",
                                                                     "dx"))
      if not lesion or not image:
        raise bad(f"{meta}:{n}", "has no lesion_id or image_id", HAM_EXPECTED)
      if dx not in HAM_CLASSES:
        raise bad(f"{meta}:{n}", f"dx {dx!r} is not a class of the dataset", HAM_EXPECTED)
      rows.append((n, lesion, image, dx))
  except csv.Error as e:
    # line_num counts the lines read whole; the bad one is the next
    raise bad(f"{meta}:{reader.line_num + 1}", f"not CSV ({e})", HAM_EXPECTED) from None
  if not rows:
    raise bad(meta, "lists no images", HAM_EXPECTED)
  return rows


def plan_ham10000(loc: pathlib.Path, image_size: int) -> Plan:
  meta = next(loc / m for m in HAM_METADATA if (loc / m).is_file())
  rows = _ham_rows(meta)
  folders = sorted(p for p in loc.iterdir()
                   if p.is_dir() and p.name.lower().startswith("ham10000_images"))
  if not folders:
    raise missing(loc / "HAM10000_images_part_1", HAM_EXPECTED)
  found: dict[str, pathlib.Path] = {}
  for d in folders:  # Kaggle's copy has each folder twice, upper and lower case
    for p in _images_in(d, (".jpg", ".jpeg")):
      found.setdefault(p.stem, p)
  paths, seen = [], set()
  for n, _, image, _ in rows:
    if image in seen:
      raise bad(f"{meta}:{n}", f"image_id {image!r} is listed twice", HAM_EXPECTED)
    seen.add(image)
    if image not in found:
      raise missing(folders[0] / f"{image}.jpg",
                    f"the image of {meta.name} line {n} in "
                    + " or ".join(d.name for d in folders) + f"; {HAM_EXPECTED}")
    paths.append(found[image])
  y = np.asarray([HAM_CLASSES.index(dx) for *_, dx in rows], np.int32)
  _, lesions = np.unique([lesion for _, lesion, _, _ in rows], return_inverse=True)

  def decode(w: Writer) -> None:
    x = w.empty("x", (len(paths), image_size, image_size, 3), np.uint8)
    decode_images(x, paths, HAM_EXPECTED, resize=(image_size, image_size))
    w.put("y", y)
    w.put("lesions", lesions.reshape(-1).astype(np.int32))

  return Plan("ham10000", loc, [meta] + paths, {"image_size": int(image_size)},
              ("x", "y", "lesions"), decode)


def ham10000_split(arrays: dict[str, np.ndarray], test_fraction: float
                   ) -> dict[str, np.ndarray]:
  """Train and test sets from the whole release: lesions in a fixed random
  order (seed 0) go to the test set until it holds ``test_fraction`` of the
  images (rounded), so the images of one lesion stay on one side."""
  x, y, lesions = arrays["x"], arrays["y"], np.asarray(arrays["lesions"])
  n = len(y)
  want = max(1, int(round(test_fraction * n)))
  order = np.random.default_rng(0).permutation(int(lesions.max()) + 1 if n else 0)
  sizes = np.bincount(lesions, minlength=len(order))
  cum = np.cumsum(sizes[order])
  k = int(np.searchsorted(cum, want)) + 1  # lesions until the count is reached
  is_test = np.zeros(len(order), bool)
  is_test[order[:k]] = True
  test = is_test[lesions]
  if test.all():
    raise DataError(f"ham10000: test_fraction={test_fraction} leaves no training images "
                    f"({n} images, {len(order)} lesions); allowed: a smaller test_fraction")
  return {"x_train": x[~test], "y_train": y[~test], "x_test": x[test], "y_test": y[test]}
