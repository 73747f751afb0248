"""The sweep files of the papers' tables and figures (experiments/*/paper/).

Each file must be accepted by ``jsfl sweep FILE --dry-run`` and give every
cell at least 10 seeds.  ``--dry-run`` resolves every cell's config
(``jsfl.config.load_config``: every key, type and range, and the method's
own options) but loads no data, so it does not check what only the dataset,
partition and model can (docs/sweeps.md#validation).  CI holds Fashion-MNIST
alone, so ``test_cells_build_without_data`` checks those too, without the
files: each dataset's options against its own checkers, the model, its cut
and the method's options by building the run's ``Setup`` for the dataset's
documented input shape and classes (``jsfl.train.experiment.setup_from``,
the no-data path the benchmarks use) and the method's ``validate``, and the
partition by drawing it, for every seed of the cell, over stand-in labels
with the class sizes of the dataset's training set (FEMNIST's natural split
needs the writers and is not drawn): a split a retried draw cannot make
(Dirichlet or ExDir with too few samples a client) fails here as it would
before the run.  Cells of two files that share a sweep directory must be
the same run.
"""

from __future__ import annotations

import functools
import glob
import json
import os

import numpy as np
import pytest

from jsfl import cli, sweep
from jsfl.data import DATASET_OPTIONS
from jsfl.data.files import FILE_SOURCES
from jsfl.methods.catalog import get_method
from jsfl.partitions import make_partition
from jsfl.train.experiment import setup_from

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FILES = sorted(glob.glob(os.path.join(ROOT, "experiments", "*", "paper", "*.toml")))

# docs/setting.md#datasets: input shape, classes and the training set's size,
# or its class sizes where they are far from equal (SVHN's digits 0-9;
# HAM10000's seven classes, 90% of the release's 10,015 images). HAM10000's
# input side is dataset.image_size.
DATASETS = {
    "fashion_mnist": ((28, 28, 1), 10, 60_000),
    "mnist": ((28, 28, 1), 10, 60_000),
    "cifar10": ((32, 32, 3), 10, 50_000),
    "cifar100": ((32, 32, 3), {"fine": 100, "coarse": 20}, 50_000),
    "svhn": ((32, 32, 3), 10, (4948, 13861, 10585, 8497, 7458, 6882, 5727, 5595, 5045, 4659)),
    "tiny_imagenet": ((64, 64, 3), 200, 100_000),
    "cinic10": ((32, 32, 3), 10, 90_000),
    "femnist": ((28, 28, 1), 62, None),
    "ham10000": (None, 7, (294, 462, 989, 103, 1001, 6034, 127)),
}


def rel(path):
  return os.path.relpath(path, ROOT)


@functools.cache
def cells(path):
  s = sweep.load_sweep(path)
  sweep.resolve(s)
  return s


def test_there_are_paper_sweeps():
  papers = {rel(p).split(os.sep)[1] for p in FILES}
  assert papers == {"hydra", "multisfl", "sequential"}


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_dry_run_accepts_the_file(path, capsys):
  assert cli.main(["sweep", path, "--dry-run"]) == 0, capsys.readouterr().err
  out = capsys.readouterr().out
  assert out.startswith(f"sweep {cells(path).name}: {len(cells(path).cells)} cells")


@pytest.mark.parametrize("path", FILES, ids=rel)
def test_every_cell_has_ten_seeds(path):
  few = [c.name for c in cells(path).cells if c.cfg["run"]["seeds"] < 10]
  assert not few, f"{rel(path)}: cells with fewer than 10 seeds: {few}"


def comparable(cfg):
  out = json.loads(json.dumps(cfg))
  out["exec"].pop("progress", None)
  return out


def test_cells_sharing_a_directory_are_the_same_run():
  seen = {}
  for path in FILES:
    for c in cells(path).cells:
      if c.dir in seen:
        other, cfg = seen[c.dir]
        assert comparable(c.cfg) == cfg, (
            f"{c.dir}: {rel(path)} and {rel(other)} give this cell different configs")
      else:
        seen[c.dir] = (path, comparable(c.cfg))


def test_every_reference_line_names_a_cell():
  """A paper's reference CSV (``sweep.reference``) is matched to the cells
  of the files that name it by exact config fields; a line that matches no
  cell would leave its published figure out of ``--collect`` unseen."""
  from jsfl.report.rows import _matches, read_reference
  by_ref: dict[str, list] = {}
  for path in FILES:
    s = cells(path)
    if s.reference:
      by_ref.setdefault(s.reference, []).extend(s.cells)
  assert len(by_ref) >= 3
  for ref, cs in by_ref.items():
    lines, _ = read_reference(ref)
    flats = [{f"{sec}.{k}": v for sec, vals in c.cfg.items() if isinstance(vals, dict)
              for k, v in vals.items()} for c in cs]
    missing = [line["line"] for line in lines
               if not any(all(_matches(f.get(k), v) for k, v in line["match"].items())
                          for f in flats)]
    assert not missing, f"{rel(ref)}: lines {missing} match no cell of the files naming it"


def options(cfg, section):
  from jsfl.config import extra_options
  return extra_options(cfg, section)


def dataset_shape(cfg):
  """Input shape and classes of the cell's dataset, its options checked."""
  name = cfg["dataset"]["name"]
  given = options(cfg, "dataset")
  allowed = set(DATASET_OPTIONS[name]) | {"train_subset"}
  assert set(given) <= allowed, f"dataset {name}: options {sorted(given)}; allowed {allowed}"
  checked = {}
  for k, v in given.items():
    if name in FILE_SOURCES and k in FILE_SOURCES[name].options:
      checked[k] = FILE_SOURCES[name].options[k][0](v)
  shape, classes, size = DATASETS[name]
  if shape is None:  # ham10000
    side = checked.get("image_size", FILE_SOURCES[name].options["image_size"][1])
    shape = (side, side, 3)
  if isinstance(classes, dict):
    classes = classes[checked.get("label_mode", FILE_SOURCES[name].options["label_mode"][1])]
  return shape, classes, size


@functools.cache
def stand_in_labels(classes, size):
  """Labels of ``size`` samples, equal classes, or of the class sizes given."""
  if isinstance(size, tuple):
    return np.repeat(np.arange(classes), size)
  return np.arange(size) % classes


@functools.cache
def draw(classes, size, name, num_clients, seed, opts):
  return make_partition(name, stand_in_labels(classes, size), num_clients, seed=seed,
                        num_classes=classes, **dict(opts))


def test_cells_build_without_data():
  checked = set()
  for path in FILES:
    for c in cells(path).cells:
      cfg = c.cfg
      key = json.dumps({s: v for s, v in cfg.items() if s != "run"}, sort_keys=True)
      if key in checked:
        continue
      checked.add(key)
      where = f"{rel(path)}, cell {c.name}"
      shape, classes, size = dataset_shape(cfg)
      p = cfg["partition"]
      K = p["num_clients"]
      try:
        n = sum(size) if isinstance(size, tuple) else size or 100 * K
        setup = setup_from(json.loads(json.dumps(cfg)), shape, classes, max_size=n // K)
        method = get_method(cfg["method"]["name"])
        if method.validate is not None:
          method.validate(setup)
        if p["name"] != "natural":  # every seed's draw: a retried draw may fail for one
          r = cfg["run"]
          for seed in [p["seed"]] if p["seed"] >= 0 else range(r["seed"], r["seed"] + r["seeds"]):
            parts = draw(classes, size, p["name"], K, seed,
                         tuple(sorted(options(cfg, "partition").items())))
            assert len(parts) == K and all(len(x) for x in parts)
      except (ValueError, TypeError) as e:
        pytest.fail(f"{where}: {e}")


HYDRA_NORMALISATION = {  # the Hydra authors' transforms (get_data.py), per dataset
    "cifar10": ([0.4914, 0.4822, 0.4465], [0.2023, 0.1994, 0.2010]),
    "cifar100": ([0.5070751592371323, 0.48654887331495095, 0.4409178433670343],
                 [0.2673342858792401, 0.2564384629170883, 0.27615047132568404]),
    "svhn": ([0.5] * 3, [0.5] * 3),
    "tiny_imagenet": ([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])}
# Their Tiny-ImageNet transform: RandomResizedCrop(224), not made, then the flip.
HYDRA_AUGMENT = {"cifar10": "crop_flip", "cifar100": "crop_flip_rotate", "svhn": "none",
                 "tiny_imagenet": "flip"}
FLOWER = {"flower_dirichlet", "flower_shard", "flower_iid", "distribution"}


def test_hydra_cells_read_data_as_the_authors_code():
  """Every cell of experiments/hydra/paper/ trains on the data as the
  authors' code reads it on that cell's path (docs/methods-hydra.md): their
  transforms and constants, equal-weight means, and on a Flower partition
  the train side of each client's split in a fixed order, its last batch
  kept; on their own dominant-label path a reshuffled loader that drops the
  last batch.  IID rows are Flower's IID split on its paths, their own
  labelwise split at 1 / K of every label elsewhere."""
  checked = 0
  for path in FILES:
    if rel(path).split(os.sep)[1] != "hydra":
      continue
    for c in cells(path).cells:
      cfg, where = c.cfg, f"{rel(path)}: {c.name}"
      d, p, m = cfg["dataset"], cfg["partition"], cfg["method"]
      assert m["aggregation"] == "uniform", where
      assert (d["mean"], d["std"]) == HYDRA_NORMALISATION[d["name"]], where
      assert d["augment"] == HYDRA_AUGMENT[d["name"]], where
      flower_dataset = d["name"] in ("cifar10", "tiny_imagenet") or (
          d["name"] == "cifar100" and p["num_clients"] == 20)
      assert p["name"] != "iid", f"{where}: their IID is flower_iid or labelwise at 1 / K"
      if p["name"] in FLOWER:
        assert flower_dataset, where
        want = 0.9 if d["name"] == "cifar100" else 0.8
        assert (p["train_size"], m["shuffle"], m["drop_last"]) == (want, False, False), where
      else:
        assert (p["train_size"], m["shuffle"], m["drop_last"]) == (1.0, True, True), where
      checked += 1
  assert checked > 100
