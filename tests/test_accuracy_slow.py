"""Accuracy on real Fashion-MNIST (slow: skipped by `make test`, run by `make test-slow`).

The full acceptance runs are experiments/core/core.toml (jsfl sweep; 20 rounds, 2 seeds);
these shorter versions guard against regressions of the science.
"""

import os

import numpy as np
import pytest

from jsfl import cli
from jsfl.rundir import read_metrics

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                       reason="Debian's dataset-fashion-mnist is not installed"),
]

CFG = os.path.join(os.path.dirname(__file__), "..", "experiments", "core")


def _run(tmp_path, name, cfg, *overrides):
  out = tmp_path / name
  assert cli.main(["run", os.path.join(CFG, cfg), f"run.dir={out}", "run.seeds=1",
                   "--quiet", *overrides]) == 0
  return read_metrics(f"{out}/metrics.jsonl")


@pytest.mark.parametrize("method", ["sfl", "fedavg"])
def test_iid_reaches_85_percent(tmp_path, method):
  recs = _run(tmp_path, method, "fmnist_iid.toml", f"method.name={method}", "run.rounds=6")
  assert max(r["accuracy"] for r in recs) >= 85.0


def test_dominant_label_cyclic_forgets(tmp_path):
  iid = _run(tmp_path, "iid", "fmnist_iid.toml", "run.rounds=6")
  dl = _run(tmp_path, "dl", "fmnist_dl80_cyclic.toml", "run.rounds=6")
  pg_iid = np.median([r["pg"] for r in iid[-3:]])
  pg_dl = np.median([r["pg"] for r in dl[-3:]])
  assert pg_dl > pg_iid + 5.0
