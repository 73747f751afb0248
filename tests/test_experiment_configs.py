"""Every committed experiment config loads with every method its script runs.

The experiment scripts run one base config with ``method.name=...`` for many
methods, so a method-specific key in a base config (``method.head``,
``method.head_cut``) breaks every other method's cell at start-up.  This
caught ``cifar10_mobilenet.toml`` and ``cifar10_resnet18.toml``, whose
Hydra-only keys made the SplitFed cells of ``run_hydra.sh all`` fail.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from jsfl import sweep as sweep_lib
from jsfl.config import load_config
from jsfl.methods.registry import METHODS

EXPERIMENTS = pathlib.Path(__file__).resolve().parent.parent / "experiments"


def _script_methods(folder: pathlib.Path) -> list[str]:
  """Registered method names that appear in the folder's shell scripts."""
  words = set()
  for script in folder.glob("*.sh"):
    words |= set(re.findall(r"[a-z0-9_]+", script.read_text()))
  return sorted(words & set(METHODS))


def _cases():
  for folder in sorted(p for p in EXPERIMENTS.iterdir() if p.is_dir()):
    methods = _script_methods(folder)
    for config in sorted(folder.glob("*.toml")):
      if folder.name == "sweeps":
        continue
      for method in methods:
        yield pytest.param(config, method,
                           id=f"{folder.name}/{config.name}:{method}")


CASES = list(_cases())


def test_cases_cover_every_experiment_folder():
  folders = {c.values[0].parent.name for c in CASES}
  assert {"core", "hydra", "multisfl", "sequential"} <= folders
  # The scripts really name the methods of their papers.
  assert {"hydra", "sfl", "splitnn"} <= set(_script_methods(EXPERIMENTS / "hydra"))
  assert {"multisfl", "fedavg"} <= set(_script_methods(EXPERIMENTS / "multisfl"))


@pytest.mark.parametrize("config,method", CASES)
def test_config_loads_for_every_script_method(config, method):
  cfg = load_config(str(config), [f"method.name={method}"])
  assert cfg["method"]["name"] == method


@pytest.mark.parametrize("path", sorted((EXPERIMENTS / "sweeps").glob("*.toml")),
                         ids=lambda p: p.name)
def test_sweep_examples_resolve(path):
  sweep = sweep_lib.load_sweep(str(path))
  sweep_lib.resolve(sweep)
  assert sweep.cells and all(c.cfg for c in sweep.cells)
