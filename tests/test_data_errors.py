"""Bad data, dataset options, partition options and input sizes are one-line
errors naming the file or ``key=value`` and what is allowed, never a
traceback of some other type (ZeroDivisionError, EOFError, zlib.error...).

Damaged files are built in ``tmp_path`` from tiny hand-made IDX files; one
test damages a copy of the real Fashion-MNIST (skipped where Debian's
``dataset-fashion-mnist`` is absent).  Nothing here downloads.
"""

import dataclasses
import gzip
import math
import pathlib
import shutil

import numpy as np
import pytest

from jsfl import cli, data
from jsfl.data import idx, synthetic
from jsfl.errors import DataError
from jsfl.models import base as model_base
from jsfl.models import get_model, layers
from jsfl.partitions import make_partition

_SMALL = dataclasses.replace(idx.IDX_SOURCES["fashion_mnist"],
                             image_shape=(4, 5), train_size=12, test_size=6)
_REAL = pathlib.Path("/usr/share/datasets/fashion-mnist")


def _idx_bytes(arr: np.ndarray) -> bytes:
  header = bytes([0, 0, 0x08, arr.ndim]) + np.asarray(arr.shape, ">u4").tobytes()
  return header + arr.tobytes()


def _write_set(directory: pathlib.Path) -> dict[str, pathlib.Path]:
  """A complete, valid gzipped set of the shrunk Fashion-MNIST."""
  directory.mkdir(parents=True, exist_ok=True)
  rng = np.random.default_rng(0)
  paths = {}
  for key, stem in idx.IDX_FILES.items():
    arr = rng.integers(0, 10, _SMALL.expected_shape(key)).astype(np.uint8)
    paths[key] = directory / (stem + ".gz")
    paths[key].write_bytes(gzip.compress(_idx_bytes(arr)))
  return paths


@pytest.fixture
def small_fmnist(monkeypatch, tmp_path):
  """Fashion-MNIST shrunk to 12 + 6 images of 4x5, with private roots."""
  monkeypatch.setitem(idx.IDX_SOURCES, "fashion_mnist", _SMALL)
  monkeypatch.setenv("JSFL_SYSTEM_DATA", str(tmp_path / "system"))
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  return tmp_path / "system" / "fashion-mnist", tmp_path / "cache" / "fashion_mnist"


def _one_line(err: BaseException) -> str:
  msg = str(err)
  assert "\n" not in msg and msg.strip() == msg and msg
  return msg


# ---------------------------------------------------- 1. data_dir not a dir


def test_missing_data_dir_is_a_data_error(small_fmnist, tmp_path):
  where = tmp_path / "nowhere"
  with pytest.raises(data.DatasetNotFound) as e:
    data.load_dataset("fashion_mnist", data_dir=where)
  assert isinstance(e.value, DataError) and isinstance(e.value, FileNotFoundError)
  msg = _one_line(e.value)
  assert f"data_dir={str(where)!r} does not exist" in msg
  assert "apt-get install dataset-fashion-mnist" in msg


def test_data_dir_that_is_a_file_is_a_data_error(small_fmnist, tmp_path):
  f = tmp_path / "afile"
  f.write_text("x")
  with pytest.raises(data.DatasetNotFound) as e:
    data.load_dataset("fashion_mnist", data_dir=f)
  assert isinstance(e.value, DataError)
  assert f"data_dir={str(f)!r} is not a directory" in _one_line(e.value)


def test_tfds_data_dir_that_is_a_file_is_a_data_error(tmp_path, monkeypatch):
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  f = tmp_path / "afile"
  f.write_text("x")
  with pytest.raises(data.DatasetNotFound) as e:
    data.load_dataset("cifar10", data_dir=f)
  assert f"data_dir={str(f)!r} is not a directory" in _one_line(e.value)


def test_data_dir_expands_the_home_directory(small_fmnist, tmp_path, monkeypatch):
  monkeypatch.setenv("HOME", str(tmp_path))
  _write_set(tmp_path / "fm")
  assert data.load_dataset("fashion_mnist", data_dir="~/fm").x_train.shape == (12, 4, 5, 1)


# ------------------------------------------------------- 2. damaged files


def _truncated(b):
  return b[: len(b) // 2]


def _bad_crc(b):
  b = bytearray(b)
  b[-8] ^= 0xFF  # the CRC32 field of the gzip trailer
  return bytes(b)


def _garbage(b):
  b = bytearray(b)
  b[10:30] = bytes(range(200, 220))  # inside the deflate stream
  return bytes(b)


def _bomb(b):
  # Valid gzip that inflates far beyond any file of this shape.
  return gzip.compress(b"\0" * (8 << 20), compresslevel=1)


def _raw_truncated(b):
  return gzip.decompress(b)[:-3]


def _not_idx(b):
  return b"hello, this is not an IDX file"


@pytest.mark.parametrize("damage, reason", [
    (_truncated, "gzip stream ends early"),
    (_bad_crc, "corrupt gzip data"),
    (_garbage, "corrupt gzip data"),
    (_bomb, "decompresses to more than"),
    (_raw_truncated, "but the header"),
    (_not_idx, "not an IDX file"),
    (lambda b: b"", "not an IDX file"),
])
def test_damaged_idx_file_names_the_file(small_fmnist, tmp_path, damage, reason):
  paths = _write_set(tmp_path / "d")
  bad = paths["x_train"]  # the largest: its deflate stream has room to damage
  bad.write_bytes(damage(bad.read_bytes()))
  with pytest.raises(idx.BadDataFile) as e:
    data.load_dataset("fashion_mnist", data_dir=tmp_path / "d")
  assert isinstance(e.value, DataError) and isinstance(e.value, ValueError)
  msg = _one_line(e.value)
  assert msg.startswith(f"{bad}: damaged: ") and reason in msg
  assert msg.endswith("replace it with an intact copy")


def test_damaged_file_remedy_depends_on_where_it_is(small_fmnist):
  system, cache = small_fmnist
  for directory, remedy in ((system, "apt-get install --reinstall dataset-fashion-mnist"),
                            (cache, "delete it from the cache")):
    paths = _write_set(directory)
    paths["x_train"].write_bytes(_truncated(paths["x_train"].read_bytes()))
    with pytest.raises(idx.BadDataFile) as e:
      data.load_dataset("fashion_mnist", download=False)
    msg = _one_line(e.value)
    assert str(paths["x_train"]) in msg and remedy in msg
    shutil.rmtree(directory)


def test_hostile_idx_header_does_not_overflow():
  # (2**32 - 1)**3 wraps around in int64; the size check must still fail.
  data_ = bytes([0, 0, 0x08, 3]) + np.full(3, 2**32 - 1, ">u4").tobytes()
  with pytest.raises(ValueError, match="needs"):
    idx.parse_idx(data_ + b"\0" * 16, "hostile")


def test_read_idx_of_a_directory_is_a_bad_file(tmp_path):
  with pytest.raises(idx.BadDataFile, match=f"{tmp_path}: cannot be read"):
    idx.read_idx(tmp_path)


@pytest.mark.skipif(not _REAL.is_dir(), reason="dataset-fashion-mnist is not installed")
def test_damaged_copy_of_the_real_fashion_mnist(tmp_path, monkeypatch):
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  d = tmp_path / "fm"
  d.mkdir()
  for f in _REAL.iterdir():
    (d / f.name).symlink_to(f)  # the originals are never written
  bad = d / "t10k-labels-idx1-ubyte.gz"
  good = bad.resolve().read_bytes()
  bad.unlink()
  bad.write_bytes(good[:2000])
  with pytest.raises(idx.BadDataFile) as e:
    data.load_dataset("fashion_mnist", data_dir=d)
  assert _one_line(e.value).startswith(f"{bad}: damaged: the gzip stream ends early")


@pytest.mark.parametrize("content, reason", [
    (lambda good: good[: len(good) // 2], "damaged"),
    (lambda good: b"", "damaged"),
    (lambda good: b"PK\x03\x04" + bytes(200), "damaged"),
])
def test_damaged_npz_names_the_file(tmp_path, monkeypatch, content, reason):
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  rng = np.random.default_rng(0)
  f = tmp_path / "cifar10.npz"
  np.savez(f, x_train=rng.integers(0, 256, (6, 4, 4, 3), dtype=np.uint8),
           y_train=np.arange(6), x_test=np.zeros((2, 4, 4, 3), np.uint8),
           y_test=np.arange(2))
  f.write_bytes(content(f.read_bytes()))
  with pytest.raises(idx.BadDataFile) as e:
    data.load_dataset("cifar10", data_dir=tmp_path)
  msg = _one_line(e.value)
  assert msg.startswith(f"{f}: ") and reason in msg


def test_npy_or_pickle_instead_of_npz_is_a_bad_file(tmp_path, monkeypatch):
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  f = tmp_path / "cifar10.npz"
  with open(f, "wb") as fh:
    np.save(fh, np.zeros(3))
  with pytest.raises(idx.BadDataFile, match="not an .npz archive"):
    data.load_dataset("cifar10", data_dir=tmp_path)
  np.savez(f, x_train=np.array([{}], dtype=object), y_train=np.arange(1),
           x_test=np.zeros((1, 4, 4, 3), np.uint8), y_test=np.arange(1))
  with pytest.raises(idx.BadDataFile, match="allow_pickle"):
    data.load_dataset("cifar10", data_dir=tmp_path)


def test_cifar100_npz_with_labels_out_of_range(tmp_path, monkeypatch):
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  np.savez(tmp_path / "cifar100.npz", x_train=np.zeros((2, 4, 4, 3), np.uint8),
           y_train=np.array([0, 100]), x_test=np.zeros((1, 4, 4, 3), np.uint8),
           y_test=np.array([1]))
  with pytest.raises(idx.BadDataFile, match=r"not CIFAR-100 fine labels; allowed"):
    data.load_dataset("cifar100", data_dir=tmp_path, label_mode="coarse")


def test_channels_first_npz_is_refused_not_read_as_32_channels(tmp_path, monkeypatch):
  """torchvision's SVHN.data is (N, 3, 32, 32): saved as is it would load as
  3x32 images of 32 channels."""
  monkeypatch.setenv("JSFL_DATA", str(tmp_path / "cache"))
  np.savez(tmp_path / "svhn.npz", x_train=np.zeros((2, 3, 32, 32), np.uint8),
           y_train=np.array([0, 1]), x_test=np.zeros((1, 3, 32, 32), np.uint8),
           y_test=np.array([1]))
  with pytest.raises(ValueError, match=r"\[2, 3, 32, 32\] have 32 channels last; allowed: "
                     r"\(N, H, W, C\) with C = 1 or 3 .*transpose\(0, 2, 3, 1\)"):
    data.load_dataset("svhn", data_dir=tmp_path)


# ------------------------------------------------ 3. input too small for a model


@pytest.mark.parametrize("name, smallest", [
    ("small_cnn", 4), ("lenet5", 12), ("alexnet", 15),
])
def test_input_too_small_for_the_model(name, smallest):
  shape = (smallest - 1, 28, 1)
  with pytest.raises(ValueError) as e:
    get_model(name, shape, 10)
  msg = _one_line(e.value)
  assert msg.startswith(f"{name}: input_shape={shape!r} is too small")
  assert msg.endswith(f"allowed: H and W at least {smallest}")
  get_model(name, (smallest, smallest, 1), 10)  # the smallest that works


def test_models_without_dense_downsampling_take_any_size():
  for name in ("resnet18", "vgg16", "mobilenet_v1", "mobilenet_v2"):
    get_model(name, (1, 2, 1), 3, width=0.0625)


def test_a_dense_layer_without_inputs_is_caught_for_any_model():
  @model_base.register("_flat_only")
  def flat_only(input_shape, num_classes, **_):
    h, w, c = input_shape
    return model_base.StagedModel(
        "_flat_only", lambda rngs: [layers.Dense((h // 8) * (w // 8) * c, num_classes,
                                                 rngs=rngs)],
        tuple(input_shape), num_classes, default_cut=1, default_head_cut=1,
        stage_names=("fc",))
  try:
    with pytest.raises(ValueError) as e:
      get_model("_flat_only", (4, 4, 1), 3)
    msg = _one_line(e.value)
    assert msg.startswith("_flat_only: input_shape=(4, 4, 1) is too small")
    assert "0 input features" in msg
  finally:
    model_base._REGISTRY.pop("_flat_only")


# -------------------------------------------------- 4. dataset options


@pytest.mark.parametrize("key, value", [
    ("noise", math.nan), ("noise", math.inf), ("noise", -1.0), ("noise", 1e300),
    ("noise", True), ("noise", "1"),
    ("num_classes", 1), ("num_classes", 2.0), ("num_classes", True),
    ("num_classes", 2**31 - 1),
    ("train_size", 0), ("train_size", -3), ("train_size", math.nan),
    ("train_size", 2**31 - 1), ("test_size", 0), ("test_size", 1.5),
    ("seed", -1), ("seed", 0.5), ("seed", math.inf),
    ("input_shape", (0, 8, 1)), ("input_shape", (8, 8)), ("input_shape", "8x8"),
    ("input_shape", (True, 8, 1)), ("input_shape", (8.0, 8, 1)),
    ("input_shape", (100000, 100000, 3)),
])
def test_bad_synthetic_options(key, value):
  with pytest.raises(ValueError) as e:
    data.load_dataset("synthetic", **{"train_size": 10, "test_size": 10, key: value})
  msg = _one_line(e.value)
  assert f"{key}={value!r}" in msg and "allowed:" in msg


def test_synthetic_noise_bound_is_usable():
  d = synthetic.make_synthetic(input_shape=(4, 4, 1), train_size=4, test_size=2,
                               noise=synthetic.MAX_NOISE)
  assert d["x_train"].dtype == np.uint8


@pytest.mark.parametrize("value", [0, -1, 1.5, True, math.nan, "10", 10**12])
def test_bad_train_subset(value, small_fmnist, tmp_path):
  _write_set(tmp_path / "d")
  with pytest.raises(ValueError) as e:
    data.load_dataset("fashion_mnist", data_dir=tmp_path / "d", train_subset=value)
  msg = _one_line(e.value)
  assert msg.startswith(f"train_subset={value!r}; allowed: an integer")


def test_train_subset_type_is_checked_before_loading(small_fmnist, tmp_path):
  # No files at all: the option's own error comes first, not DatasetNotFound.
  with pytest.raises(ValueError, match=r"^train_subset=1.5; allowed"):
    data.load_dataset("fashion_mnist", data_dir=tmp_path / "nowhere", train_subset=1.5)


# ------------------------------------------------ 4. partition options

_Y = np.repeat(np.arange(10), 40)


@pytest.mark.parametrize("family, key, value", [
    *[("dirichlet", "alpha", v) for v in (math.nan, math.inf, -math.inf, -1.0, 0, 0.0,
                                          True, "0.5", None)],
    *[("dirichlet", "min_size", v) for v in (math.nan, math.inf, -1, 1.5, 10**12, True,
                                             None)],
    *[("dirichlet", "self_balancing", v) for v in (0, 1, "true", math.nan, None)],
    *[("dirichlet", "cap_rule", v) for v in ("above", "", 1, True, math.nan, None)],
    *[("dominant_label", "p", v) for v in (math.nan, math.inf, -0.5, 0, 1.5, 1e300,
                                           True, None)],
    *[("dominant_label", "phi", v) for v in (math.nan, 0, -1, 1.5, 2**31, True)],
    *[("sharding", "p", v) for v in (math.nan, -math.inf, 0.0, 2, False)],
    *[("sharding", "labels_per_client", v) for v in (0, -1, 10, 2**40, 1.0, math.nan,
                                                     None)],
    *[("sharding", "phi", v) for v in (0, -2, 10**9, math.inf, "1")],
    *[("exdir", "classes_per_client", v) for v in (0, -1, 11, 2**63, 2.0, math.nan,
                                                   None)],
    *[("exdir", "alpha", v) for v in (math.nan, math.inf, 0, -1e-9, "a", None)],
])
def test_bad_partition_options(family, key, value):
  with pytest.raises(ValueError) as e:
    make_partition(family, _Y, 10, seed=0, num_classes=10, **{key: value})
  msg = _one_line(e.value)
  assert f"{family}.{key}=" in msg and "allowed" in msg


@pytest.mark.parametrize("family, key, value", [
    ("dirichlet", "alpha", 1e300), ("exdir", "alpha", 1e300),
    ("dirichlet", "min_size", 0), ("dominant_label", "p", 1e-300),
])
def test_extreme_but_valid_partition_options(family, key, value):
  parts = make_partition(family, _Y, 10, seed=0, num_classes=10, **{key: value})
  assert sum(len(p) for p in parts) == len(_Y)


# ---------------------------------------------------------- the command


def test_command_reports_damaged_data_in_one_line(small_fmnist, tmp_path, capsys):
  paths = _write_set(tmp_path / "d")
  paths["y_test"].write_bytes(_bad_crc(paths["y_test"].read_bytes()))
  for data_dir, expected in ((tmp_path / "d", f"{paths['y_test']}: damaged: corrupt gzip"),
                             (tmp_path / "nowhere", "does not exist")):
    code = cli.main(["run", "dataset.name=fashion_mnist", f"dataset.data_dir={data_dir}",
                     f"run.dir={tmp_path / 'run'}", "run.rounds=1", "--quiet"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1, err
    assert err.startswith("jsfl: error: ") and expected in err
    assert "Traceback" not in err


def test_command_reports_a_too_small_input_in_one_line(tmp_path, capsys):
  code = cli.main(["run", "dataset.name=synthetic", "dataset.input_shape=[3, 3, 1]",
                   "dataset.train_size=20", "dataset.test_size=10",
                   f"run.dir={tmp_path / 'run'}", "run.rounds=1", "--quiet"])
  err = capsys.readouterr().err
  assert code == 2 and err.count("\n") == 1, err
  assert "small_cnn: input_shape=(3, 3, 1) is too small" in err
  assert "allowed: H and W at least 4" in err

