"""Every experiment runs through ``jsfl sweep``: each folder's sweep files
resolve every cell, and every committed config loads with every method the
folder's sweeps run.

The sweeps run one base config with ``method.name = ...`` for many methods,
so a method-specific key in a base config (``method.head``,
``method.head_cut``) breaks every other method's cell at start-up; this
caught ``cifar10_mobilenet.toml`` and ``cifar10_resnet18.toml``, whose
Hydra-only keys made the SplitFed cells of the Hydra experiments fail.
"""

from __future__ import annotations

import pathlib

import pytest

from jsfl import sweep as sweep_lib
from jsfl.config import load_config, read_toml

EXPERIMENTS = pathlib.Path(__file__).resolve().parent.parent / "experiments"
FOLDERS = sorted(p for p in EXPERIMENTS.iterdir() if p.is_dir())


def _is_sweep(path: pathlib.Path) -> bool:
  return "sweep" in read_toml(str(path))


SWEEPS = [p for f in FOLDERS for p in sorted(f.glob("*.toml")) if _is_sweep(p)]
CONFIGS = [p for f in FOLDERS for p in sorted(f.glob("*.toml")) if not _is_sweep(p)]


def _resolved(path):
  sw = sweep_lib.load_sweep(str(path))
  sweep_lib.resolve(sw)
  return sw


def _sweep_methods(folder: pathlib.Path) -> list[str]:
  return sorted({c.cfg["method"]["name"] for p in SWEEPS if p.parent == folder
                 for c in _resolved(p).cells})


def test_every_experiment_folder_runs_through_sweeps():
  for folder in FOLDERS:
    assert not list(folder.glob("*.sh")), f"{folder.name}: a bash driver; allowed: sweep files"
    if folder.name != "sweeps":
      assert any(p.parent == folder for p in SWEEPS), folder.name
  assert not (EXPERIMENTS / "collect.py").exists()
  assert {"hydra", "sfl", "splitnn"} <= set(_sweep_methods(EXPERIMENTS / "hydra"))
  assert {"multisfl", "fedavg", "splitfedv1"} <= set(_sweep_methods(EXPERIMENTS / "multisfl"))


@pytest.mark.parametrize("path", SWEEPS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_sweep_files_resolve(path):
  sw = _resolved(path)
  assert sw.cells and all(c.cfg for c in sw.cells)
  if sw.reference is not None:
    from jsfl import report
    rows, notes = report.read_reference(sw.reference)
    assert rows and notes  # figures, and a line saying where they come from


@pytest.mark.parametrize("config", [c for c in CONFIGS if c.parent.name != "sweeps"],
                         ids=lambda p: f"{p.parent.name}/{p.name}")
def test_config_loads_for_every_sweep_method(config):
  for method in _sweep_methods(config.parent):
    cfg = load_config(str(config), [f"method.name={method}"])
    assert cfg["method"]["name"] == method


def _programs(path):
  sw = _resolved(path)
  return sw, sweep_lib.plan(sw, sw.cells)


def test_multisfl_table1_is_one_program_per_method():
  # partitions (Dirichlet 0.1 / 0.3 / 0.5, IID) x seeds are slots
  for name in ("table1.toml", "table1_cifar10.toml"):
    sw, programs = _programs(EXPERIMENTS / "multisfl" / name)
    methods = [u.cells[0].cfg["method"]["name"] for u in programs]
    assert len(methods) == len(set(methods)) == len({c.cfg["method"]["name"] for c in sw.cells})
    assert all(len(u.cells) == 4 and len({c.cfg["partition"]["name"] for c in u.cells}) == 2
               for u in programs)


def test_hydra_table1_is_one_program_per_method_and_phi():
  # phi in the authors' meaning: batches per client turn, 10 clients
  for name in ("table1.toml", "table1_cifar10.toml"):
    sw, programs = _programs(EXPERIMENTS / "hydra" / name)
    keys = [(u.cells[0].cfg["method"]["name"], u.cells[0].cfg["method"]["order"],
             u.cells[0].cfg["method"]["batches_per_turn"]) for u in programs]
    assert all(c.cfg["partition"]["num_clients"] == 10 for u in programs for c in u.cells)
    assert len(keys) == len(set(keys)) == 8  # sfl, hydra x phi 1 / 5 / 10 and random
    assert all({c.cfg["partition"]["p"] for c in u.cells} == {0.6, 0.8} for u in programs)


def test_multisfl_authors_steps_spec_cell_is_spec_reading():
  # the sweep spells the paper's reading (docs/methods-multisfl.md#config-keys) out
  # option by option: it must stay the library's
  from jsfl.methods.multisfl import PAPER_READING
  sw = _resolved(EXPERIMENTS / "multisfl" / "authors_steps.toml")
  spec = [c.cfg["method"] for c in sw.cells if c.cfg["method"].get("p_rule") == "spec"]
  assert len(spec) == 1
  assert {k: spec[0][k] for k in PAPER_READING} == PAPER_READING
