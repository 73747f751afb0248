"""Slots: cells that differ in batchable values and partition draws train as
one program whose records equal the cells' own runs (jsfl.slots)."""

import json
import os

import numpy as np
import pytest

from jsfl import config as config_lib
from jsfl import slots, train
from jsfl.rundir import read_metrics

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=320", "dataset.test_size=80", "model.width=4", "model.hidden=16",
       "exec.progress=false", "run.rounds=2", "exec.eval_batch=80", "exec.client_exec=vmap", "partition.num_clients=8",
       "method.clients_per_round=4", "method.batch_size=16", "partition.name=dirichlet"]
# Per method: its static options, then each cell's batchable values.  Cell b
# repeats seed 1 of cell a with another partition draw and learning rate.
CASES = {
    "sfl": ([], ["optim.lr=0.05"], ["optim.lr=0.1", "optim.lr_decay=0.9"]),
    "hydra": (["method.groups=2", "method.superclasses=consecutive"], ["optim.lr=0.05"], ["optim.lr=0.02"]),
    "multisfl": (["method.min_request=0"], ["method.alpha=0.1", "method.gamma=0.5"],
                 ["method.alpha=0.5", "method.gamma=0.9", "optim.lr=0.02"]),
    "fedseq": ([], ["optim.lr=0.05"], ["optim.lr=0.1"]),
    "sfedkd": (["method.num_teachers=2"], ["method.temperature=4.0"],
               ["method.temperature=2.0", "method.alpha_t=0.5", "optim.lr=0.02"]),
}
CELLS = {"a": ["partition.alpha=0.1", "run.seed=0", "run.seeds=2"],
         "b": ["partition.alpha=1.0", "run.seed=1", "run.seeds=2"]}


def cell_configs(method, out):
  static, a, b = CASES[method]
  own = {"a": a, "b": b}
  return [(name, config_lib.load_config(None, SYN + [f"method.name={method}", *static,
                                                     *CELLS[name], *own[name],
                                                     f"run.dir={out}/{name}"]))
          for name in CELLS]


def by_run(path):
  return {(r.get("cell"), r["seed"], r["round"]): r for r in read_metrics(path)}


# One method per engine in CI: FedSeq's sequential engine is SFedKD's, Hydra's
# split engine SFL's; those two run in the slow suite.
@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow)
                                    if m in ("fedseq", "hydra") else m for m in CASES])
def test_slotted_program_equals_cell_runs(method, tmp_path):
  cells = cell_configs(method, tmp_path)
  assert len({slots.signature(c) for _, c in cells}) == 1
  alone = {}
  for name, cfg in cells:
    d = train.run(cfg)
    alone.update({(name, s, r): rec for (_, s, r), rec in by_run(f"{d}/metrics.jsonl").items()})
  prog = json.loads(json.dumps(cells[0][1]))
  prog["run"]["dir"] = str(tmp_path / "program")
  d = train.run(prog, cells=cells)
  together = by_run(f"{d}/metrics.jsonl")
  assert set(together) == set(alone)  # every cell's seeds and rounds, seed 1 twice
  for k, rec in alone.items():
    got = together[k]
    for field in ("accuracy", "loss", "train_loss", "pg", "bytes_up", "bytes_down", "lr"):
      np.testing.assert_allclose(got[field], rec[field], rtol=2e-4, atol=2e-3,
                                 err_msg=f"{method} {k} {field}")
    assert got["clients"] == rec["clients"]
  # The draws differ where the cells do: cell b's seed 1 is not cell a's seed 1.
  assert together[("a", 1, 2)]["loss"] != together[("b", 1, 2)]["loss"]
  written = json.load(open(os.path.join(d, "config.json")))
  assert [c["name"] for c in written["cells"]] == ["a", "b"]
  parts = json.load(open(os.path.join(d, "partition.json")))["seeds"]
  assert [(p["cell"], p["seed"]) for p in parts] == [("a", 0), ("a", 1), ("b", 1), ("b", 2)]
