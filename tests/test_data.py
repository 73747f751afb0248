"""Tests of jsfl.data: IDX parsing and resolution, tfds, synthetic data.

Nothing here touches the network: downloads are served from ``file://`` URLs
or fail through a patched ``urlopen``, and tensorflow-datasets is a fake
module.
"""

import dataclasses
import gzip
import pathlib
import sys
import types
import urllib.error

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jsfl import data
from jsfl.data import idx, tfds_source

_SMALL = dataclasses.replace(idx.IDX_SOURCES["fashion_mnist"],
                             image_shape=(4, 5), train_size=12, test_size=6)


def _idx_bytes(arr: np.ndarray) -> bytes:
  codes = {np.dtype(np.uint8): 0x08, np.dtype(np.int32): 0x0C,
           np.dtype(np.float32): 0x0D}
  header = bytes([0, 0, codes[arr.dtype], arr.ndim])
  header += np.asarray(arr.shape, ">u4").tobytes()
  return header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


def _write_idx(path: pathlib.Path, arr: np.ndarray, gz: bool) -> None:
  b = _idx_bytes(arr)
  if gz:
    path = path.with_name(path.name + ".gz")
    b = gzip.compress(b)
  path.write_bytes(b)


def _write_set(directory: pathlib.Path, marker: int, gz: bool = True,
               skip=()) -> None:
  """A complete small IDX set whose images are all ``marker``."""
  directory.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(marker)
  arrays = {
      "x_train": np.full((12, 4, 5), marker, np.uint8),
      "y_train": rng.integers(0, 10, 12).astype(np.uint8),
      "x_test": np.full((6, 4, 5), marker, np.uint8),
      "y_test": rng.integers(0, 10, 6).astype(np.uint8),
  }
  for key, stem in idx.IDX_FILES.items():
    if key not in skip:
      _write_idx(directory / stem, arrays[key], gz)


@pytest.fixture
def small_fmnist(monkeypatch, tmp_path):
  """Fashion-MNIST shrunk to 12 + 6 images of 4x5, with private roots."""
  monkeypatch.setitem(idx.IDX_SOURCES, "fashion_mnist", _SMALL)
  system = tmp_path / "system"
  cache = tmp_path / "cache"
  monkeypatch.setenv("JSFL_SYSTEM_DATA", str(system))
  monkeypatch.setenv("JSFL_DATA", str(cache))
  return system / "fashion-mnist", cache / "fashion_mnist"


# ----------------------------------------------------------------- IDX parse


@pytest.mark.parametrize("gz", [False, True])
def test_read_idx_roundtrip(tmp_path, gz):
  img = np.arange(2 * 3 * 4, dtype=np.uint8).reshape(2, 3, 4)
  ints = np.array([[-5, 70000], [3, -1]], np.int32)
  floats = np.array([0.5, -2.25], np.float32)
  for name, arr in (("img", img), ("ints", ints), ("floats", floats)):
    _write_idx(tmp_path / name, arr, gz)
    got = idx.read_idx(tmp_path / (name + (".gz" if gz else "")))
    np.testing.assert_array_equal(got, arr)
    assert got.dtype == arr.dtype and got.dtype.isnative


def test_parse_idx_rejects_bad_files():
  good = _idx_bytes(np.zeros((2, 3), np.uint8))
  with pytest.raises(ValueError, match="not an IDX file"):
    idx.parse_idx(b"\x01" + good[1:])
  with pytest.raises(ValueError, match="type code 0x07"):
    idx.parse_idx(good[:2] + b"\x07" + good[3:])
  with pytest.raises(ValueError, match="17 bytes .* needs 18"):
    idx.parse_idx(good[:-1])


def test_find_idx_files_accepts_raw_gz_and_dotted_names(tmp_path):
  _write_set(tmp_path, 1, gz=False, skip=("y_test",))
  (tmp_path / "t10k-labels.idx1-ubyte.gz").write_bytes(b"")
  found, missing = idx.find_idx_files(tmp_path)
  assert missing == []
  assert found["x_train"].name == "train-images-idx3-ubyte"
  assert found["y_test"].name == "t10k-labels.idx1-ubyte.gz"


# ---------------------------------------------------------------- resolution


def _marker(ds: data.Dataset) -> int:
  return int(ds.x_train[0, 0, 0, 0])


def test_data_dir_beats_system_beats_cache(small_fmnist, tmp_path):
  system, cache = small_fmnist
  _write_set(system, 2)
  _write_set(cache, 3, gz=False)
  _write_set(tmp_path / "explicit", 1)
  ds = data.load_dataset("fashion_mnist", data_dir=tmp_path / "explicit",
                         download=False)
  assert _marker(ds) == 1
  assert _marker(data.load_dataset("fashion_mnist", download=False)) == 2
  for p in system.iterdir():
    p.unlink()
  assert _marker(data.load_dataset("fashion_mnist", download=False)) == 3


def test_cache_dir_argument_is_a_root(small_fmnist, tmp_path):
  _write_set(tmp_path / "other" / "fashion_mnist", 4)
  ds = data.load_dataset("fashion_mnist", cache_dir=tmp_path / "other",
                         download=False)
  assert _marker(ds) == 4
  chex.assert_shape([ds.x_train, ds.y_train, ds.x_test, ds.y_test],
                    [(12, 4, 5, 1), (12,), (6, 4, 5, 1), (6,)])
  assert ds.input_shape == (4, 5, 1) and ds.num_classes == 10
  np.testing.assert_allclose(ds.mean, [4 / 255], rtol=1e-6)
  np.testing.assert_allclose(ds.std, [1.0])  # constant channel


def test_missing_everywhere_names_three_fixes(small_fmnist):
  _, cache = small_fmnist
  with pytest.raises(data.DatasetNotFound) as e:
    data.load_dataset("fashion_mnist", download=False)
  msg = str(e.value)
  assert isinstance(e.value, FileNotFoundError)
  assert "dataset.data_dir=DIR" in msg  # the config's spelling, then Python's
  assert "apt-get install dataset-fashion-mnist" in msg
  assert "dataset.download = true" in msg and str(cache) in msg
  # Debian installs where Debian does, whatever $JSFL_SYSTEM_DATA reads
  assert f"installs into {data.idx.SYSTEM_DATA_ROOT}/fashion-mnist" in msg


def test_explicit_data_dir_missing_files_is_an_error(small_fmnist, tmp_path):
  system, _ = small_fmnist
  _write_set(system, 2)  # must not be used as a fallback
  _write_set(tmp_path / "explicit", 1, skip=("x_test",))
  with pytest.raises(data.DatasetNotFound, match="t10k-images-idx3-ubyte"):
    data.load_dataset("fashion_mnist", data_dir=tmp_path / "explicit")


def test_wrong_shape_in_files_is_a_value_error(small_fmnist, tmp_path):
  d = tmp_path / "explicit"
  _write_set(d, 1)
  _write_idx(d / idx.IDX_FILES["y_test"], np.zeros(5, np.uint8), gz=True)
  with pytest.raises(ValueError, match=r"needs uint8\[6\]"):
    data.load_dataset("fashion_mnist", data_dir=d)


def test_download_from_mirror_lands_verified_files(small_fmnist, monkeypatch,
                                                   tmp_path):
  _, cache = small_fmnist
  mirror = tmp_path / "mirror"
  _write_set(mirror, 7)
  bad = tmp_path / "bad"
  bad.mkdir()
  for stem in idx.IDX_FILES.values():  # a broken first mirror
    (bad / (stem + ".gz")).write_bytes(b"not gzip")
  src = dataclasses.replace(_SMALL, urls=(bad.as_uri() + "/",
                                          mirror.as_uri() + "/"))
  monkeypatch.setitem(idx.IDX_SOURCES, "fashion_mnist", src)
  ds = data.load_dataset("fashion_mnist")
  assert _marker(ds) == 7
  assert sorted(p.name for p in cache.iterdir()) == sorted(
      s + ".gz" for s in idx.IDX_FILES.values())  # no .part leftovers
  assert _marker(data.load_dataset("fashion_mnist", download=False)) == 7


def test_download_failure_ends_in_clear_error(small_fmnist, monkeypatch):
  _, cache = small_fmnist

  def offline(url, timeout=None):
    raise urllib.error.URLError("no network")

  monkeypatch.setattr(idx.urllib.request, "urlopen", offline)
  with pytest.raises(data.DatasetNotFound, match="no network") as e:
    data.load_dataset("fashion_mnist")
  assert "apt-get install dataset-fashion-mnist" in str(e.value)
  assert not list(cache.iterdir())


def test_download_rejects_wrong_shape(small_fmnist, monkeypatch, tmp_path):
  _, cache = small_fmnist
  mirror = tmp_path / "mirror"
  _write_set(mirror, 7)
  _write_idx(mirror / idx.IDX_FILES["y_test"], np.zeros(5, np.uint8), gz=True)
  monkeypatch.setitem(idx.IDX_SOURCES, "fashion_mnist", dataclasses.replace(
      _SMALL, urls=(mirror.as_uri() + "/",)))
  with pytest.raises(data.DatasetNotFound, match=r"shape \(5,\)"):
    data.load_dataset("fashion_mnist")
  assert not (cache / (idx.IDX_FILES["y_test"] + ".gz")).exists()
  assert not list(cache.glob("*.part"))


@pytest.mark.skipif(
    not pathlib.Path("/usr/share/datasets/fashion-mnist").is_dir(),
    reason="Debian's dataset-fashion-mnist is not installed")
def test_real_debian_fashion_mnist(monkeypatch, tmp_path):
  monkeypatch.delenv("JSFL_SYSTEM_DATA", raising=False)
  ds = data.load_dataset("fashion_mnist", cache_dir=tmp_path, download=False)
  chex.assert_shape([ds.x_train, ds.y_train, ds.x_test, ds.y_test],
                    [(60000, 28, 28, 1), (60000,), (10000, 28, 28, 1),
                     (10000,)])
  assert ds.x_train.dtype == np.uint8 and ds.y_train.dtype == np.int32
  assert ds.y_train.min() == 0 and ds.y_train.max() == 9
  np.testing.assert_array_equal(np.bincount(ds.y_test), [1000] * 10)
  # the published statistics of Fashion-MNIST
  np.testing.assert_allclose(ds.mean, [0.2860], atol=1e-4)
  np.testing.assert_allclose(ds.std, [0.3530], atol=1e-4)


# ---------------------------------------------------------------------- tfds


def _fake_tfds(calls, fail=False):
  def load(name, split, batch_size, data_dir, download):
    calls.append({"name": name, "split": split, "batch_size": batch_size,
                      "data_dir": data_dir, "download": download})
    if fail:
      raise RuntimeError("DatasetNotFoundError: not prepared")
    n = 8 if split == "train" else 4
    rng = np.random.default_rng(len(calls))
    return {"image": rng.integers(0, 256, (n, 32, 32, 3), dtype=np.uint8),
            "label": np.arange(n, dtype=np.int64) % 10,
            "coarse_label": (np.arange(n, dtype=np.int64) + 3) % 20}
  return types.SimpleNamespace(load=load, as_numpy=lambda d: d)


@pytest.fixture
def isolated_cache(monkeypatch, tmp_path):
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  return tmp_path / "cache"


def test_tfds_path_with_fake_module(monkeypatch, isolated_cache):
  calls = []
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds(calls))
  ds = data.load_dataset("cifar10", download=False)
  chex.assert_shape([ds.x_train, ds.y_train, ds.x_test, ds.y_test],
                    [(8, 32, 32, 3), (8,), (4, 32, 32, 3), (4,)])
  assert ds.num_classes == 10 and ds.y_train.dtype == np.int32
  assert [c["split"] for c in calls] == ["train", "test"]
  assert calls[0] == {"name": "cifar10", "split": "train", "batch_size": -1,
                          "data_dir": str(isolated_cache / "tfds"),
                          "download": False}
  calls.clear()
  ds = data.load_dataset("svhn", data_dir="/somewhere/tfds")
  assert calls[0]["name"] == "svhn_cropped"
  assert calls[0]["data_dir"] == "/somewhere/tfds" and calls[0]["download"]


def test_tfds_cifar100_label_modes(monkeypatch, isolated_cache):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds([]))
  fine = data.load_dataset("cifar100")
  coarse = data.load_dataset("cifar100", label_mode="coarse")
  assert fine.num_classes == 100 and coarse.num_classes == 20
  np.testing.assert_array_equal(fine.y_train, np.arange(8))
  np.testing.assert_array_equal(coarse.y_train, np.arange(8) + 3)
  with pytest.raises(ValueError, match="label_mode='mid'.*'fine', 'coarse'"):
    data.load_dataset("cifar100", label_mode="mid")


def test_tfds_failure_and_missing_extra(monkeypatch, isolated_cache):
  monkeypatch.setitem(sys.modules, "tensorflow_datasets",
                      _fake_tfds([], fail=True))
  with pytest.raises(data.DatasetNotFound, match="not prepared"):
    data.load_dataset("cifar10", download=False)
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # not there
  with pytest.raises(data.DatasetNotFound) as e:
    data.load_dataset("cifar10")
  assert "pip install 'jsfl[tfds]'" in str(e.value)
  assert "cifar10.npz" in str(e.value) and "data_dir=" in str(e.value)


def test_npz_beats_tfds(monkeypatch, tmp_path, isolated_cache):
  calls = []
  monkeypatch.setitem(sys.modules, "tensorflow_datasets", _fake_tfds(calls))
  rng = np.random.default_rng(0)
  fine_train, fine_test = np.array([0, 1, 2, 3, 4, 99]), np.array([8, 9])
  np.savez(tmp_path / "cifar100.npz",
           x_train=rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8),
           y_train=fine_train,
           x_test=rng.integers(0, 256, (2, 4, 4, 3), dtype=np.uint8),
           y_test=fine_test)
  ds = data.load_dataset("cifar100", data_dir=tmp_path, label_mode="coarse")
  assert calls == []
  # apple -> fruit & veg (4), aquarium fish -> fish (1), baby -> people (14),
  # bear -> large carnivores (8), beaver -> aquatic mammals (0),
  # worm -> non-insect invertebrates (13), bicycle, bottle -> 18, 3.
  np.testing.assert_array_equal(ds.y_train, [4, 1, 14, 8, 0, 13])
  np.testing.assert_array_equal(ds.y_test, [18, 3])
  assert ds.num_classes == 20 and ds.input_shape == (4, 4, 3)


def test_cifar100_coarse_table_has_five_fine_labels_per_superclass():
  counts = np.bincount(tfds_source.CIFAR100_COARSE, minlength=20)
  np.testing.assert_array_equal(counts, [5] * 20)
  assert len(tfds_source.CIFAR100_COARSE) == 100


# ------------------------------------------------------------ options / API


def test_train_subset_keeps_label_shares_and_the_test_set():
  full = data.load_dataset("synthetic", num_classes=4, train_size=403, test_size=50)
  sub = data.load_dataset("synthetic", num_classes=4, train_size=403, test_size=50,
                          train_subset=101)
  assert sub.x_train.shape[0] == 101 and sub.x_test.shape == full.x_test.shape
  share = np.bincount(full.y_train, minlength=4) * 101 / 403
  assert np.all(np.abs(np.bincount(sub.y_train, minlength=4) - share) < 1)
  # a subset of the training set, the same for every call
  rows = {r.tobytes() for r in full.x_train}
  assert all(r.tobytes() in rows for r in sub.x_train)
  again = data.load_dataset("synthetic", num_classes=4, train_size=403, test_size=50,
                            train_subset=101)
  np.testing.assert_array_equal(again.x_train, sub.x_train)
  with pytest.raises(ValueError, match=r"train_subset=404; allowed: an integer in \[1, 403\]"):
    data.load_dataset("synthetic", num_classes=4, train_size=403, train_subset=404)


def test_unknown_dataset_and_options():
  with pytest.raises(ValueError, match="'imagenet'.*allowed.*'fashion_mnist'"):
    data.load_dataset("imagenet")
  with pytest.raises(ValueError, match=r"\['colour'\].*allowed: \('train_subset',\)"):
    data.load_dataset("fashion_mnist", colour=True)
  with pytest.raises(ValueError, match=r"\['size'\].*'train_size'"):
    data.load_dataset("synthetic", size=10)


def test_dataset_arrays_are_read_only_and_validated():
  ds = data.load_dataset("synthetic", input_shape=(4, 4, 1), num_classes=3,
                         train_size=9, test_size=3)
  with pytest.raises(ValueError, match="read-only"):
    ds.x_train[0] = 0
  with pytest.raises(ValueError, match=r"y_train spans \[0, 5\]"):
    data.make_dataset("t", ds.x_train, np.arange(9) % 6, ds.x_test,
                      ds.y_test, 3)
  with pytest.raises(ValueError, match="allowed: uint8"):
    data.make_dataset("t", ds.x_train.astype(np.float32), ds.y_train,
                      ds.x_test, ds.y_test, 3)


def test_normalize_and_channel_stats_match_numpy():
  ds = data.load_dataset("synthetic", input_shape=(6, 5, 3), train_size=50,
                         test_size=10, seed=3)
  x = ds.x_train.astype(np.float64) / 255
  np.testing.assert_allclose(ds.mean, x.mean(axis=(0, 1, 2)), rtol=1e-6)
  np.testing.assert_allclose(ds.std, x.std(axis=(0, 1, 2)), rtol=1e-5)
  assert ds.mean.dtype == np.float32 and ds.std.shape == (3,)
  out = jax.jit(data.normalize)(jnp.asarray(ds.x_test), ds.mean, ds.std)
  chex.assert_shape(out, ds.x_test.shape)
  chex.assert_type(out, jnp.float32)
  want = (ds.x_test / 255.0 - ds.mean) / ds.std
  np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)


# ----------------------------------------------------------------- synthetic


def _nearest_class_mean_accuracy(ds: data.Dataset) -> float:
  xt = ds.x_train.reshape(len(ds.x_train), -1).astype(np.float64)
  means = np.stack([xt[ds.y_train == l].mean(0)
                    for l in range(ds.num_classes)])
  xs = ds.x_test.reshape(len(ds.x_test), -1).astype(np.float64)
  d = (xs**2).sum(1)[:, None] - 2 * xs @ means.T + (means**2).sum(1)[None]
  return float(np.mean(d.argmin(1) == ds.y_test))


def test_synthetic_shapes_dtypes_determinism():
  kw = {"input_shape": (7, 9, 2), "num_classes": 4, "train_size": 41,
            "test_size": 13, "seed": 5}
  a = data.load_dataset("synthetic", **kw)
  b = data.load_dataset("synthetic", **kw)
  chex.assert_shape([a.x_train, a.y_train, a.x_test, a.y_test],
                    [(41, 7, 9, 2), (41,), (13, 7, 9, 2), (13,)])
  assert a.x_train.dtype == np.uint8 and a.y_train.dtype == np.int32
  assert a.num_classes == 4 and a.name == "synthetic"
  np.testing.assert_array_equal(a.x_train, b.x_train)
  np.testing.assert_array_equal(a.y_test, b.y_test)
  # balanced labels: 41 = 4 * 10 + 1
  np.testing.assert_array_equal(np.sort(np.bincount(a.y_train)),
                                [10, 10, 10, 11])
  c = data.load_dataset("synthetic", **{**kw, "seed": 6})
  assert not np.array_equal(a.x_train, c.x_train)
  # the test set does not depend on the train size
  d = data.load_dataset("synthetic", **{**kw, "train_size": 100})
  np.testing.assert_array_equal(a.x_test, d.x_test)
  # not degenerate: the pixels use a good part of the range
  assert a.x_train.std() > 20


def test_synthetic_is_learnable_but_not_trivial():
  kw = {"input_shape": (16, 16, 3), "num_classes": 10, "train_size": 2000,
            "test_size": 1000, "seed": 0}
  acc = _nearest_class_mean_accuracy(data.load_dataset("synthetic", **kw))
  assert 0.3 < acc < 0.9  # chance is 0.1
  easy = _nearest_class_mean_accuracy(
      data.load_dataset("synthetic", noise=0.0, **kw))
  hard = _nearest_class_mean_accuracy(
      data.load_dataset("synthetic", noise=2.0, **kw))
  assert hard < acc < easy


@pytest.mark.parametrize("bad, match", [
    ({"input_shape": (8, 8)}, "input_shape=.*allowed: \\(H, W, C\\)"),
    ({"num_classes": 1}, "num_classes=1; allowed: an int >= 2"),
    ({"train_size": 0}, "train_size=0"),
    ({"test_size": 2.5}, "test_size=2.5"),
    ({"seed": -1}, "seed=-1"),
    ({"noise": -0.1}, "noise=-0.1"),
])
def test_synthetic_bad_options(bad, match):
  with pytest.raises(ValueError, match=match):
    data.load_dataset("synthetic", **bad)


def test_crop_flip_is_torchvisions_padded_crop_and_flip():
  """crop_flip against a plain NumPy RandomCrop(padding=4, fill 0) and
  RandomHorizontalFlip on the same draws; the draws are uniform offsets in
  [0, 8] and fair flips, one per sample and key whatever the batch's shape
  or order."""
  from jsfl.data.augment import crop_flip, crop_flip_draws
  rng = np.random.default_rng(0)
  x = rng.integers(1, 256, (6, 7, 5, 3), dtype=np.uint8)  # no black pixel: padding shows
  idx = np.array([3, 17, 5, 40, 2, 9])
  key = jax.random.key(4)
  got = np.asarray(crop_flip(key, jnp.asarray(idx), jnp.asarray(x)))
  dy, dx, flip = map(np.asarray, crop_flip_draws(key, jnp.asarray(idx)))
  for k in range(6):
    padded = np.pad(x[k], ((4, 4), (4, 4), (0, 0)))
    want = padded[dy[k]:dy[k] + 7, dx[k]:dx[k] + 5]
    np.testing.assert_array_equal(got[k], want[:, ::-1] if flip[k] else want)
  # the same sample gets the same draw in another batch shape and order
  got2 = np.asarray(crop_flip(key, jnp.asarray(idx[::-1].reshape(2, 3)),
                              jnp.asarray(x[::-1].reshape(2, 3, 7, 5, 3))))
  np.testing.assert_array_equal(got2.reshape(6, 7, 5, 3)[::-1], got)
  many = jnp.arange(20000)
  dy, dx, flip = map(np.asarray, crop_flip_draws(key, many))
  for d in (dy, dx):
    counts = np.bincount(d, minlength=9)
    assert len(counts) == 9 and np.all(np.abs(counts / 20000 - 1 / 9) < 0.01)
  assert abs(flip.mean() - 0.5) < 0.015
  assert (dy != dx).mean() > 0.8  # the two offsets are drawn apart
  assert not np.array_equal(crop_flip_draws(jax.random.key(5), many)[0], dy)


def test_flip_is_torchvisions_horizontal_flip_alone():
  """``flip``: each sample mirrored left-right by crop_flip's own flip draw,
  nothing cropped."""
  from jsfl.data.augment import Augment, apply, crop_flip_draws
  rng = np.random.default_rng(3)
  x = rng.integers(0, 256, (2, 4, 6, 5, 3), dtype=np.uint8)
  idx = np.arange(8).reshape(2, 4) * 7
  key = jax.random.key(6)
  got = np.asarray(apply(Augment(key, "flip"), jnp.asarray(idx), jnp.asarray(x)))
  _, _, f = map(np.asarray, crop_flip_draws(key, jnp.asarray(idx)))
  assert 0 < f.sum() < f.size  # both kinds in the batch
  for i in np.ndindex(idx.shape):
    np.testing.assert_array_equal(got[i], x[i][:, ::-1] if f[i] else x[i])


def test_dataset_mean_and_std_replace_the_training_sets_own(tmp_path, capsys):
  """dataset.mean / dataset.std (a paper's constants) normalise training and
  evaluation alike; they come together, one value a channel, or the run
  stops before anything is written."""
  from jsfl import cli
  from jsfl import config as config_lib
  from jsfl.train import experiment
  syn = ["dataset.name=synthetic", "dataset.input_shape=[4, 4, 3]", "dataset.num_classes=4",
         "dataset.train_size=64", "partition.num_clients=2", "run.seeds=1"]
  exp = experiment.prepare(config_lib.load_config(None, syn))
  own = np.asarray(exp.data.mean)
  exp = experiment.prepare(config_lib.load_config(
      None, syn + ["dataset.mean=[0.4914, 0.4822, 0.4465]", "dataset.std=[0.2023, 0.1994, 0.201]"]))
  np.testing.assert_allclose(exp.data.mean, [0.4914, 0.4822, 0.4465], rtol=1e-6)
  np.testing.assert_allclose(exp.data.std, [0.2023, 0.1994, 0.201], rtol=1e-6)
  assert not np.allclose(own, exp.data.mean)
  for bad in (["dataset.mean=[0.5, 0.5, 0.5]"],
              ["dataset.mean=[0.5, 0.5]", "dataset.std=[0.5, 0.5]"]):
    assert cli.main(["run", *syn, *bad, f"run.dir={tmp_path}/r"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "allowed: both [] or both of length 3" in err[0], err
    assert not (tmp_path / "r").exists()


def test_rotation_is_pils_nearest_rotate():
  """RandomRotation(15) of the Hydra authors' CIFAR-100 transform, as PIL
  rotates (nearest pixel, black corners): all but the odd pixel whose
  source lies on a pixel edge (PIL steps in fixed point) equal PIL's; the
  angles are uniform in [-15, 15], a stream apart from the crop's."""
  from PIL import Image  # a dependency of jsfl (its image readers)
  from jsfl.data.augment import Augment, apply, crop_flip, rotate_angles, rotate_image
  rng = np.random.default_rng(1)
  worst = 1.0
  for t in range(12):
    H, W = (32, 32) if t % 2 else (28, 20)
    img = rng.integers(1, 256, (H, W, 3), dtype=np.uint8)
    angle = float(rng.uniform(-15, 15))
    want = np.asarray(Image.fromarray(img).rotate(angle, resample=Image.NEAREST))
    got = np.asarray(rotate_image(jnp.asarray(img), jnp.float32(angle)))
    worst = min(worst, (got == want).all(-1).mean())
    assert (got[want.sum(-1) == 0] == 0).all()  # PIL's black corners are black here
  assert worst > 0.99
  key = jax.random.key(2)
  angles = np.asarray(rotate_angles(key, jnp.arange(20000)))
  assert angles.min() >= -15 and angles.max() <= 15
  assert np.all(np.abs(np.histogram(angles, 6, (-15, 15))[0] / 20000 - 1 / 6) < 0.015)
  x = jnp.asarray(rng.integers(1, 256, (4, 32, 32, 3), dtype=np.uint8))
  idx = jnp.arange(4)
  both = np.asarray(apply(Augment(key, "crop_flip_rotate"), idx, x))
  cropped = np.asarray(apply(Augment(key, "crop_flip"), idx, x))
  np.testing.assert_array_equal(cropped, np.asarray(crop_flip(key, idx, x)))
  for k in range(4):  # rotated after the crop and flip
    np.testing.assert_array_equal(both[k], np.asarray(rotate_image(
        jnp.asarray(cropped[k]), rotate_angles(key, idx)[k])))
