"""``jsfl sweep``: expansion, programs of slots, shards, validation, skipping, collect."""

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest

from jsfl import cli, reading, report, sweep, train
from jsfl.rundir import read_metrics
from jsfl.sweep import execute
from jsfl.sweep.plan import programs_on_disk
from jsfl.train import memory, programs
from jsfl.train.lifecycle import Progress
from jsfl.train.memory import memory_estimate
from jsfl.train.programs import build_programs

# The synthetic setup of test_cli.SYN, as a sweep's [base] table.
BASE = """
[base]
"dataset.name" = "synthetic"
"dataset.input_shape" = [8, 8, 1]
"dataset.num_classes" = 4
"dataset.train_size" = 400
"dataset.test_size" = 100
"model.width" = 4
"model.hidden" = 16
"exec.progress" = false
"run.rounds" = 2
"partition.num_clients" = 4
"""


def write_sweep(path, out_dir, body, name="t", base=BASE):
  path.write_text(f'[sweep]\nname = "{name}"\nout_dir = "{out_dir}"\n{base}\n{body}')
  return str(path)


def load(path):
  with open(path) as f:
    return json.load(f)


def tree(d):
  """Every file under ``d`` with its mtime."""
  return {os.path.join(r, f): os.stat(os.path.join(r, f)).st_mtime_ns
          for r, _, fs in os.walk(d) for f in fs}


def test_grid_expansion_order_and_names(tmp_path):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
[grid]
method.name = ["sfl", "fedavg"]
"optim.lr" = [0.1, 1e-05]
"dataset.input_shape" = [[8, 8, 1]]

[[cells]]
"method.name" = "hydra"
"method.groups" = 2

[[cells]]
"run.name" = "a/b c"
""")
  sw = sweep.load_sweep(path)
  names = [c.name for c in sw.cells]
  assert names == [
      "method=sfl,optim.lr=0.1,dataset.input_shape=8-8-1",
      "method=sfl,optim.lr=1e-05,dataset.input_shape=8-8-1",
      "method=fedavg,optim.lr=0.1,dataset.input_shape=8-8-1",
      "method=fedavg,optim.lr=1e-05,dataset.input_shape=8-8-1",
      "method=hydra,method.groups=2",
      "run.name=a_b_c"]
  assert [c.index for c in sw.cells] == list(range(6))
  assert sw.cells[1].dir == os.path.join(str(tmp_path / "out"), "t", names[1])
  # every cell resolves through load_config: [base], then the cell's values
  sweep.resolve(sw)
  c = sw.cells[1].cfg
  assert c["optim"]["lr"] == 1e-05 and c["method"]["name"] == "sfl"
  assert c["dataset"]["input_shape"] == [8, 8, 1] and c["run"]["rounds"] == 2
  assert c["run"]["dir"] == sw.cells[1].dir
  assert sw.cells[4].cfg["method"]["groups"] == 2
  assert sw.cells[5].cfg["run"]["name"] == "a/b c"


def test_long_names_stay_file_names():
  name = sweep.cell_name([("method.name", "x" * 300)])
  assert len(name) == sweep.format.NAME_LIMIT == 60 and name.startswith("method=xxx")
  assert sweep.cell_name([("method.name", "x" * 301)]) != name
  assert sweep.cell_name([("method.name", "x" * 300)]) == name  # stable
  short = [("method.name", "sfl"), ("method.order", "cyclic"), ("partition.p", 0.8)]
  assert sweep.cell_name(short) == "method=sfl,method.order=cyclic,partition.p=0.8"


def test_cells_and_grid_values_carry_names(tmp_path):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
[grid]
"method.order" = ["cyclic", "random"]

[grid.partition]
"dir0.1" = {name = "dirichlet", alpha = 0.1}
iid = {name = "iid"}

[[cells]]
name = "hydra-g2"
"method.name" = "hydra"
"method.groups" = 2

[[cells]]
"method.name" = "multisfl"
"method.p_rule" = "spec"
"method.score_update" = "eq2"
"method.min_request" = 0
"method.request_rounding" = "spec"
""")
  sw = sweep.load_sweep(path)
  names = [c.name for c in sw.cells]
  assert names[:5] == ["method.order=cyclic,dir0.1", "method.order=cyclic,iid",
                       "method.order=random,dir0.1", "method.order=random,iid", "hydra-g2"]
  # a generated name over 60 characters: cut, with a hash of the whole
  assert len(names[5]) == 60 and names[5].startswith("method=multisfl,method.p_rule=spec,")
  assert all(len(n) <= 60 for n in names)
  # a value's name stands for its keys in the cell's name, not in its config
  assert sw.cells[0].assigned == [("method.order", "cyclic"), ("partition.name", "dirichlet"),
                                  ("partition.alpha", 0.1)]
  assert "name" not in dict(sw.cells[4].assigned) and sw.cells[4].dir.endswith("hydra-g2")
  sweep.resolve(sw)
  assert sw.cells[0].cfg["partition"]["alpha"] == 0.1 and sw.cells[4].cfg["method"]["groups"] == 2
  # the same grid without names keeps the generated ones
  plain = write_sweep(tmp_path / "p.toml", tmp_path / "out",
                      '[grid]\n"method.order" = ["cyclic"]\n'
                      'partition = [{name = "dirichlet", alpha = 0.1}]')
  assert [c.name for c in sweep.load_sweep(plain).cells] == [
      "method.order=cyclic,partition=dirichlet,partition.alpha=0.1"]


def test_shards_are_disjoint_and_cover_the_grid(tmp_path, capsys):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
[grid]
"optim.lr" = [0.01, 0.02, 0.03]
"method.batch_size" = [8, 16, 32, 64]
""")
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  programs = sweep.plan(sw, sw.cells)
  # lr is batchable, the batch size static: one program of 3 lrs per batch size
  assert [[c.index for c in u.cells] for u in programs] == [[0, 4, 8], [1, 5, 9],
                                                             [2, 6, 10], [3, 7, 11]]
  for n in (1, 2, 3, 4, 5, 12, 13):
    shards = [[c.index for u in sweep.shard(programs, i, n) for c in u.cells]
              for i in range(n)]
    flat = sorted(i for s in shards for i in s)
    assert flat == list(range(12))  # every cell once
    if n <= 4:  # programs first: none is cut
      assert all(s == [k for p in programs[i::n] for k in (c.index for c in p.cells)]
                 for i, s in enumerate(shards))
    else:  # more shards than programs: the largest are cut, whole cells each
      assert all(shards) if n <= 12 else sum(map(bool, shards)) == 12
  # a shard does not depend on which cells have finished
  assert [c.index for u in sweep.shard(programs, 1, 5) for c in u.cells] == \
      [c.index for u in sweep.shard(sweep.plan(sw, sw.cells), 1, 5) for c in u.cells]
  assert cli.main(["sweep", path, "--dry-run", "--shard", "1/5"]) == 0
  out = capsys.readouterr().out
  listed = [line.split()[1] for line in out.splitlines() if line.startswith("  todo")]
  mine = [sw.cells[c.index].name for u in sweep.shard(programs, 1, 5) for c in u.cells]
  assert listed == mine and len(mine) >= 2
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("spec", ["5/5", "-1/3", "1", "a/b", "1/0", "1/2/3"])
def test_bad_shard_is_exit_2(tmp_path, capsys, spec):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", '[grid]\n"optim.lr" = [0.1]')
  assert cli.main(["sweep", path, f"--shard={spec}"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and "--shard" in err and "0 <= i < n" in err


@pytest.mark.parametrize("body, message", [
    ('[grid]\n"method.ordr" = ["cyclic"]',
     "cell method.ordr=cyclic: unknown config key 'method.ordr' (did you mean 'order'?)"),
    ('[grid]\n"method.order" = ["cyclic", "sideways"]',
     "cell method.order=sideways: method.order='sideways'; allowed: 'random'"),
    ('[grid]\n"run.rounds" = [2, 0]', "run.rounds=0; allowed: an int >= 1"),
    ('[grid]\n"optim.lr" = 0.1', "[grid] optim.lr=0.1; allowed: a non-empty list"),
    ('[grid]\n"optim.lr" = []', "allowed: a non-empty list"),
    ('[grid]\nlr = [0.1]', "[grid] key 'lr'; allowed: section.key"),
    ('[grid]\n"run.dir" = ["x"]', "[grid] sets run.dir; not allowed"),
    ('[[cells]]\n"method.name" = "nope"', "cell method=nope: method.name='nope'; allowed"),
    ('[[cells]]\n"method.groups" = 3', "unknown config key 'method.groups'"),
    ('[grid]\n"optim.lr" = [0.1]\n[[cells]]\n"optim.lr" = 0.1',
     "cell 'optim.lr=0.1' appears twice"),
    ('[grids]\n"optim.lr" = [0.1]', "unknown table [grids]; allowed: [sweep], [base], [grid]"),
    ("", "no cells"),
    ('[grid]\npartition = [{name = "iid"}, 3]', "allowed: a section axis of tables only"),
    ('[grid]\npartition = [{name = {x = 1}}]', "partition.name is a table"),
    ('[grid]\n"exec.max_slots" = [-1]', "exec.max_slots=-1; allowed: an int in"),
    ('[[cells]]\nname = "a/b"\n"optim.lr" = 0.1', "[[cells]] #1 name 'a/b'; allowed: 1 to 60"),
    ('[[cells]]\nname = "%s"\n"optim.lr" = 0.1' % ("x" * 61), "allowed: 1 to 60 letters"),
    ('[[cells]]\nname = ".x"\n"optim.lr" = 0.1', "(not starting with '.')"),
    ('[[cells]]\nname = 3\n"optim.lr" = 0.1', "[[cells]] #1 name 3; allowed"),
    ('[[cells]]\nname = "a"\n"optim.lr" = 0.1\n[[cells]]\nname = "a"\n"optim.lr" = 0.2',
     "cell 'a' appears twice (cells 0 and 1)"),
    ('[[cells]]\nname = "optim.lr=0.2"\n"optim.lr" = 0.1\n[[cells]]\n"optim.lr" = 0.2',
     "cell 'optim.lr=0.2' appears twice"),
    ('[[cells]]\nname = "collected"\n"optim.lr" = 0.1', "named 'collected'; not allowed"),
    ('[grid.partition]\n"a b" = {name = "iid"}', "[grid.partition] name 'a b'; allowed"),
    ('[grid.partition]\niid = {name = "iid"}\nalpha = [0.1]', "[grid.partition] mixes named"),
    # options the data, partition and model owners check (train.prepare)
    (('[grid]\n"method.name" = ["sfl"]\n[[cells]]\n"partition.name" = "dirichlet"\n'
      '"partition.alpha" = -1.0'),
     "cell partition=dirichlet,partition.alpha=-1.0: [partition]"),
    ('[grid]\n"model.name" = ["small_cnn", "vgg99"]', "cell model=vgg99: [model]"),
])
def test_bad_sweep_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, body, message):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", body)
  assert cli.main(["sweep", path, "--quiet"]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1, err
  assert err.startswith(f"jsfl: error: sweep {path}") and message in err, err
  assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("head, message", [
    ('[sweep]\nout_dir = "x"', "sweep.name is missing"),
    ('[sweep]\nname = "a/b"', "sweep.name='a/b'; allowed: letters"),
    ('[sweep]\nname = "a"\nbase = "missing.toml"', "sweep.base='missing.toml'"),
    ('[sweep]\nname = "a"\nreference = "missing.csv"', "sweep.reference='missing.csv'"),
    ('[sweep]\nname = "a"\nbest_ma = -1', "sweep.best_ma=-1; allowed: an int >= 0"),
    ('[sweep]\nname = "a"\nouts = "x"', "unknown key sweep.outs; allowed: name, base, out_dir"),
    ('[run]\nrounds = 2', "unknown table [run]"),
    ('[sweep\nname = "a"', "is not valid TOML"),
])
def test_bad_sweep_table(tmp_path, capsys, head, message):
  path = tmp_path / "s.toml"
  path.write_text(head + '\n[grid]\n"optim.lr" = [0.1]\n')
  assert cli.main(["sweep", str(path)]) == 2
  err = capsys.readouterr().err.strip()
  assert len(err.splitlines()) == 1 and message in err, err


def test_base_config_path_is_relative_to_the_sweep_file(tmp_path):
  (tmp_path / "cfg").mkdir()
  (tmp_path / "cfg" / "base.toml").write_text("[optim]\nlr = 0.3\n[run]\nrounds = 7\n")
  (tmp_path / "sweeps").mkdir()
  path = tmp_path / "sweeps" / "s.toml"
  path.write_text('[sweep]\nname = "a"\nbase = "../cfg/base.toml"\n'
                  '[grid]\n"method.name" = ["fedavg"]\n')
  sw = sweep.load_sweep(str(path))
  sweep.resolve(sw)
  assert sw.cells[0].cfg["optim"]["lr"] == 0.3 and sw.cells[0].cfg["run"]["rounds"] == 7
  assert sw.out_dir == "runs" and sw.root == os.path.join("runs", "a")


# ---------------------------------------------------------------------------
# Running


@pytest.fixture(scope="module")
def ran(tmp_path_factory):
  """A two-cell sweep (SFL and FedAvg, 2 rounds) run once through the CLI."""
  tmp = tmp_path_factory.mktemp("sweep")
  path = write_sweep(tmp / "s.toml", tmp / "out", '[grid]\n"method.name" = ["sfl", "fedavg"]')
  assert cli.main(["sweep", path, "--quiet"]) == 0
  return tmp, path, sweep.load_sweep(path)


def test_sweep_runs_every_cell(ran):
  _, _, sw = ran
  assert [c.name for c in sw.cells] == ["method=sfl", "method=fedavg"]
  for c in sw.cells:
    assert {"config.json", "metrics.jsonl", "partition.json", "summary.json",
            ".done"} <= set(os.listdir(c.dir))
    assert load(f"{c.dir}/summary.json")["rounds_evaluated"] == 2
    assert load(f"{c.dir}/config.json")["config"]["method"]["name"] == \
        c.assigned[0][1]
  assert sorted(n for n in os.listdir(sw.root) if n != "collected") == [
      "method=fedavg", "method=sfl"]


def _fake_run(calls):
  """A train.run that records its config and writes a finished run directory."""
  def run(cfg, exp=None, **kw):
    calls.append(cfg)
    d = cfg["run"]["dir"]
    os.makedirs(d)
    with open(f"{d}/config.json", "w") as f:
      json.dump({"config": cfg}, f)
    with open(f"{d}/summary.json", "w") as f:
      json.dump({"rounds_evaluated": cfg["run"]["rounds"]}, f)
    return d
  return run


def test_rerun_skips_finished_cells(ran, monkeypatch, capsys):
  _, path, sw = ran
  before = tree(sw.root)
  calls = []
  monkeypatch.setattr(train, "run", _fake_run(calls))
  assert cli.main(["sweep", path, "--quiet"]) == 0
  assert calls == [] and tree(sw.root) == before
  assert "2 cells, 2 done, 0 programs to go" in capsys.readouterr().out


def test_partial_cells_are_resumed_or_rerun(tmp_path, monkeypatch, capsys):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out",
                     '[grid]\n"method.name" = ["sfl", "fedavg", "splitfedv1"]')
  calls, resumed = [], []
  monkeypatch.setattr(train, "run", _fake_run(calls))
  assert cli.main(["sweep", path]) == 0
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  assert [c["run"]["dir"] for c in calls] == [c.dir for c in sw.cells]
  assert all(os.path.exists(f"{c.dir}/.done") for c in sw.cells)
  sfl, fedavg, _ = sw.cells
  # killed after the summary was written but before the marker: partial
  os.remove(f"{sfl.dir}/.done")
  # killed mid-run with checkpoints: resumed where train.resume exists
  os.remove(f"{fedavg.dir}/.done")
  os.makedirs(f"{fedavg.dir}/checkpoints")
  with open(f"{fedavg.dir}/summary.json", "w") as f:
    json.dump({"rounds_evaluated": 1}, f)

  def fake_resume(run_dir, progress=None):
    resumed.append((run_dir, progress))
    with open(f"{run_dir}/summary.json", "w") as f:
      json.dump({"rounds_evaluated": 2}, f)
    return run_dir

  monkeypatch.setattr(train, "resume", fake_resume)
  capsys.readouterr()
  assert cli.main(["sweep", path, "--dry-run"]) == 0
  out = capsys.readouterr().out
  assert "partial  method=sfl" in out and "partial  method=fedavg" in out
  assert "done     method=splitfedv1" in out
  calls.clear()
  assert cli.main(["sweep", path, "--quiet"]) == 0
  assert [c["run"]["dir"] for c in calls] == [sfl.dir]  # rerun from scratch
  assert resumed == [(fedavg.dir, False)]
  assert all(sweep.status(c) == "done" for c in sw.cells)
  # a partial cell whose checkpoints do not resume reruns from scratch
  def broken_resume(run_dir, progress=None):
    raise RuntimeError("checkpoint unreadable")

  monkeypatch.setattr(train, "resume", broken_resume)
  os.remove(f"{fedavg.dir}/.done")
  calls.clear()
  assert cli.main(["sweep", path, "--quiet"]) == 0
  assert [c["run"]["dir"] for c in calls] == [fedavg.dir]
  assert not os.path.exists(f"{fedavg.dir}/checkpoints")


def test_a_run_that_stops_early_is_not_marked_done(tmp_path, monkeypatch, capsys):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out",
                     '[grid]\n"method.name" = ["sfl", "fedavg"]')

  def short_run(cfg, exp=None, **kw):
    os.makedirs(cfg["run"]["dir"])
    with open(f"{cfg['run']['dir']}/summary.json", "w") as f:
      json.dump({"rounds_evaluated": 1}, f)
    return cfg["run"]["dir"]

  monkeypatch.setattr(train, "run", short_run)
  assert cli.main(["sweep", path, "--quiet"]) == 1
  captured = capsys.readouterr()
  assert "2 cells failed: method=sfl, method=fedavg" in captured.err
  assert not any(os.path.exists(f"{c.dir}/.done") for c in sweep.load_sweep(path).cells)


NUMERIC = ("accuracy", "loss", "pg", "bw", "train_loss", "bytes_up", "bytes_down",
           "bytes_up_total", "bytes_down_total", "samples", "lr")


def test_cells_of_one_program_equal_single_runs(tmp_path, monkeypatch):
  # Dirichlet clients of unequal sizes: the program pads every slot to the
  # widest client of all four seeds, a single run to its own two.
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
[grid]
"run.seed" = [0, 2]
""", base=BASE + '"run.seeds" = 2\n"partition.name" = "dirichlet"\n"partition.alpha" = 0.5\n'
      '"method.order" = "cyclic"\n')
  real_run, calls = train.run, []

  def counting_run(cfg, exp=None, **kw):
    calls.append((cfg, kw.get("cells")))
    return real_run(cfg, exp, **kw)

  monkeypatch.setattr(train, "run", counting_run)
  assert cli.main(["sweep", path, "--quiet"]) == 0
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  assert len(calls) == 1 and [n for n, _ in calls[0][1]] == ["run.seed=0", "run.seed=2"]
  assert sorted(os.listdir(sw.root)) == ["run.seed=0", "run.seed=2"]  # program removed
  cell = sw.cells[1]
  merged = read_metrics(f"{cell.dir}/metrics.jsonl")
  assert [(r["round"], r["seed"]) for r in merged] == [(1, 2), (1, 3), (2, 2), (2, 3)]
  assert {r["cell"] for r in merged} == {cell.name}

  single = tmp_path / "single"
  assert cli.main(["run", *sweep.overrides(sw, cell, str(single)), "--quiet"]) == 0
  alone = read_metrics(f"{single}/metrics.jsonl")
  assert len(alone) == len(merged)
  for a, m in zip(alone, merged):
    assert (a["round"], a["seed"], a["clients"]) == (m["round"], m["seed"], m["clients"])
    for k in NUMERIC:
      assert (a[k] is None and m[k] is None) or a[k] == pytest.approx(m[k], abs=1e-5, rel=0), k
    np.testing.assert_allclose(a["per_label_accuracy"], m["per_label_accuracy"], atol=1e-5)
    np.testing.assert_allclose(a["per_position_accuracy"], m["per_position_accuracy"],
                               atol=1e-5)
  s_alone = load(f"{single}/summary.json")
  s_merged = load(f"{cell.dir}/summary.json")
  assert s_merged["seeds"] == [2, 3] and s_merged["rounds_evaluated"] == 2
  for k in ("accuracy", "loss", "pg", "bw"):
    np.testing.assert_allclose(s_merged[k]["per_seed"], s_alone[k]["per_seed"], atol=1e-5)
  assert load(f"{cell.dir}/partition.json") == \
      load(f"{single}/partition.json")
  meta = load(f"{cell.dir}/config.json")
  assert meta["config"]["run"]["seed"] == 2 and meta["config"]["run"]["seeds"] == 2
  assert meta["config"]["run"]["dir"] == cell.dir and meta["resolved"]["seeds"] == [2, 3]
  assert meta["batched_with"]["cells"] == ["run.seed=0"] and meta["batched_with"]["slots"] == 4
  assert "cells" not in meta
  # the program's sessions: which code wrote the cell's rounds
  (session,) = [json.loads(x) for x in open(f"{cell.dir}/sessions.jsonl")]
  assert session["from_round"] == 1 and "jsfl_source" in session["versions"]
  assert sweep.config_diff(cell.dir, load(f"{single}/config.json")["config"]) == []
  assert all(sweep.status(c) == "done" for c in sw.cells)


def test_cells_of_one_program_keep_their_step_confusion(tmp_path):
  """``run.step_confusion`` in a sweep: the program's ``confusion_steps.npz``
  is split with its cells, each keeping its own slots' matrices."""
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
[grid]
"run.seed" = [0, 2]
""", base=BASE + '"run.seeds" = 2\n"method.name" = "fedseq"\n"method.order" = "random"\n'
      '"run.step_confusion" = true\n"run.step_confusion_rounds" = [1, 2]\n')
  assert cli.main(["sweep", path, "--quiet"]) == 0
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  mats = {}
  for cell in sw.cells:
    with np.load(os.path.join(cell.dir, "confusion_steps.npz")) as d:
      assert d["cell"].tolist() == [cell.name] * 2
      assert d["seed"].tolist() == list(cell.seeds)
      assert d["confusion"].shape == (2, 2, 4, 4, 4) and d["round"].tolist() == [1, 2]
      mats[cell.name] = d["confusion"]
      last = read_metrics(f"{cell.dir}/metrics.jsonl")[-2:]  # round 2, both seeds
      for i, r in enumerate(last):
        cm = d["confusion"][1, i, d["steps"][1, i] - 1]
        np.testing.assert_allclose(r["accuracy"], 100 * np.trace(cm) / cm.sum(), atol=1e-4)
  assert not np.array_equal(mats["run.seed=0"], mats["run.seed=2"])


def test_plan_groups_cells_by_static_signature(tmp_path):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
[grid]
"optim.lr" = [0.1, 0.2]
"run.seed" = [0, 2, 6]
[[cells]]
"run.seed" = 1
"run.seeds" = 1
"partition.name" = "dirichlet"
"partition.alpha" = 0.3
[[cells]]
"run.seed" = 0
"method.name" = "multisfl"
"method.alpha" = 0.5
[[cells]]
"run.seed" = 0
"method.name" = "multisfl"
"method.replay" = "off"
[[cells]]
"method.batch_size" = 8
""", base=BASE + '"run.seeds" = 2\n')
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  units = sweep.plan(sw, sw.cells)
  got = [[c.index for c in u.cells] for u in units]
  # lrs, seeds (overlapping too) and partition draws share SFL's program;
  # MultiSFL's alpha is batchable, its replay mode and SFL's batch size static
  assert got == [[0, 1, 2, 3, 4, 5, 6], [7], [8], [9]]
  assert units[0].slots == 13 and units[0].batched
  assert os.path.basename(units[0].dir).startswith(".batch-")
  assert units[1].dir == sw.cells[7].dir and units[1].cfg is sw.cells[7].cfg
  assert units[1].cell_configs() is None
  # --per-cell: every cell its own program, as sweeps ran before slots
  assert [[c.index for c in u.cells] for u in sweep.plan(sw, sw.cells, per_cell=True)] == \
      [[i] for i in range(10)]
  # exec.max_slots cuts a program, whole cells each
  for c in sw.cells:
    c.cfg["exec"]["max_slots"] = 4
  capped = sweep.plan(sw, sw.cells)
  assert [[c.index for c in u.cells] for u in capped][:4] == [[0, 1], [2, 3], [4, 5], [6]]
  assert all(u.slots <= 4 for u in capped)
  # the program's directory is named by its cells
  assert len({u.dir for u in capped}) == len(capped)


def test_collect_makes_one_row_per_cell(ran, capsys, tmp_path):
  tmp, _, sw = ran
  # the same sweep with one more method: its new cell has not run
  path = write_sweep(tmp / "s3.toml", tmp / "out",
                     '[grid]\n"method.name" = ["sfl", "fedavg", "splitfedv1"]')
  capsys.readouterr()
  assert cli.main(["sweep", path, "--collect"]) == 0
  captured = capsys.readouterr()
  table = [line for line in captured.out.splitlines()
           if line.startswith("| ") and "| --- |" not in line]
  rows = table[1:]
  assert len(rows) == 2 and {r.split("|")[1].strip() for r in rows} == {"sfl", "fedavg"}
  assert "# jsfl sweep t" in captured.out
  assert "cell method=splitfedv1 not started" in captured.out + captured.err
  collected = os.path.join(sw.root, "collected")
  assert sorted(os.listdir(collected)) == ["report.csv", "report.md", "report_seeds.csv"]
  # the collected table is no run directory: a second collect sees the same cells
  assert cli.main(["sweep", path, "--collect"]) == 0
  assert cli.main(["sweep", path, "--collect", "--shard", "0/2"]) == 2
  # no jax needed to collect
  code = (f"import sys; from jsfl import sweep; assert sweep.main({path!r}, collect_only=True)"
          " == 0; assert 'jax' not in sys.modules, 'jax imported'")
  proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                        check=False)
  assert proc.returncode == 0, proc.stderr
  # nothing collected yet: one line, exit 2, nothing written
  empty = write_sweep(tmp_path / "e.toml", tmp_path / "none", '[grid]\n"optim.lr" = [0.1]')
  capsys.readouterr()
  assert cli.main(["sweep", empty, "--collect"]) == 2
  out, err = capsys.readouterr()
  assert out == "" and len(err.splitlines()) == 1 and "has metrics yet" in err, err
  assert not os.path.exists(tmp_path / "none")


def test_dry_run_lists_statuses_and_writes_nothing(ran, capsys):
  tmp, _, sw = ran
  path = write_sweep(tmp / "s4.toml", tmp / "out",
                     '[grid]\n"method.name" = ["sfl", "fedavg", "splitfedv1"]')
  before = tree(sw.root)
  capsys.readouterr()
  assert cli.main(["sweep", path, "--dry-run"]) == 0
  lines = capsys.readouterr().out.splitlines()
  cells = [line.split()[:2] for line in lines if line.startswith("  ")]
  assert cells == [["done", "method=sfl"], ["done", "method=fedavg"],
                   ["todo", "method=splitfedv1"]]
  assert sum(line.startswith("program ") for line in lines) == 3
  assert lines[-1] == "1 program to go"
  assert "another config" not in "\n".join(lines)
  assert tree(sw.root) == before
  # a finished cell of another config says so (a real run warns and skips it)
  path = write_sweep(tmp / "s4b.toml", tmp / "out", '[grid]\n"method.name" = ["sfl"]',
                     base=BASE + '"optim.lr" = 0.07\n')
  assert cli.main(["sweep", path, "--dry-run"]) == 0
  line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  "))
  assert line.split()[:2] == ["done", "method=sfl"]
  assert line.endswith("with another config (optim.lr; delete it to rerun)")


def test_dry_run_says_where_a_partial_cell_resumes_and_its_time_left(tmp_path, capsys):
  """A long cell's line names its newest checkpoint and the rest's time at
  the median round time of its records (a process's compiling first round
  outnumbered), read without orbax or JAX."""
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", '[grid]\n"method.name" = ["sfl"]',
                     base=BASE.replace('"run.rounds" = 2', '"run.rounds" = 1000'))
  cell = tmp_path / "out" / "t" / "method=sfl"
  for name in ("100", "110", "120.orbax-checkpoint-tmp-7"):  # the last one unfinished
    (cell / "checkpoints" / name).mkdir(parents=True)
  walls = {5: 400.0, 10: 60.0, 15: 58.0, 20: 62.0, 105: 300.0, 110: 61.0}
  with open(cell / "metrics.jsonl", "w") as f:
    for r, w in walls.items():
      for seed in (0, 1):
        f.write(json.dumps({"round": r, "seed": seed, "wall_s": w}) + "\n")
    f.write("{damaged\n")
  capsys.readouterr()
  assert cli.main(["sweep", path, "--dry-run"]) == 0
  line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("  "))
  assert line.split()[:2] == ["partial", "method=sfl"]
  # median of 58, 60, 61, 62, 300, 400 = 61.5 s a round, 890 rounds left
  assert line.endswith("has checkpoints/ (resumed at round 110 of 1000; "
                       "~15h12m left at 62 s a round)")
  code = ("import sys; from jsfl import rundir, sweep; "
          f"print(rundir.checkpointed_round({str(cell)!r}), rundir.round_seconds({str(cell)!r})); "
          "assert 'jax' not in sys.modules")
  out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       check=True).stdout
  assert out.split() == ["110", "61.5"]


def test_out_dir_points_the_sweep_at_cells_elsewhere(ran, capsys):
  """--out-dir reads the same cells from another directory (committed results)."""
  tmp, _, sw = ran
  moved = tmp / "elsewhere"
  shutil.copytree(tmp / "out", moved)
  path = write_sweep(tmp / "s5.toml", tmp / "nowhere",
                     '[grid]\n"method.name" = ["sfl", "fedavg", "splitfedv1"]')
  capsys.readouterr()
  assert cli.main(["sweep", path, "--dry-run", "--out-dir", str(moved)]) == 0
  out = capsys.readouterr().out
  cells = [line.split()[:2] for line in out.splitlines() if line.startswith("  ")]
  assert cells == [["done", "method=sfl"], ["done", "method=fedavg"],
                   ["todo", "method=splitfedv1"]]
  assert str(moved / "t") in out and not (tmp / "nowhere").exists()


def test_memory_guard_cuts_a_program_in_whole_cells(tmp_path, monkeypatch, capsys):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out",
                     '[grid]\n"optim.lr" = [0.01, 0.02, 0.03]', base=BASE + '"run.seeds" = 2\n')
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  (program,) = sweep.plan(sw, sw.cells)
  assert program.slots == 6
  est = memory_estimate(train.prepare(program.cfg, program.cell_configs()))
  assert est["per_slot"] > 0 and est["shared"] > 0 and est["device"] > 0
  monkeypatch.setattr(memory, "fitting_slots", lambda exp: 4)  # a small device
  lines = []
  units = sweep.validate_units(sw, [program], lines.append)
  assert [[c.index for c in u.cells] for u in units] == [[0, 1], [2]]
  assert "memory guard: 6 slots" in lines[0] and "exec.max_slots" in lines[0]
  # exec.max_slots set: no estimate, the user's cap
  for c in sw.cells:
    c.cfg["exec"]["max_slots"] = 2
  assert [[c.index for c in u.cells] for u in sweep.plan(sw, sw.cells)] == [[0], [1], [2]]
  for c in sw.cells:
    c.cfg["exec"]["max_slots"] = 6
  (program,) = sweep.plan(sw, sw.cells)
  assert sweep.validate_units(sw, [program], lines.append) == [program]  # over the estimate


def test_a_diverged_slot_fails_its_cell_only(tmp_path, monkeypatch, capsys):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out",
                     '[grid]\n"optim.lr" = [0.01, 0.02]',
                     base=BASE.replace('"run.rounds" = 2', '"run.rounds" = 3')
                     + '"run.seeds" = 2\n"run.on_divergence" = "stop_run"\n')
  build = build_programs

  def patched(exp, mesh=None):  # slot 3 (cell lr=0.02, seed 1) diverges in round 2
    init, rnd, ev = build(exp, mesh)
    calls = [0]

    def rnd_(state, *args):
      state, m = rnd(state, *args)
      calls[0] += 1
      if calls[0] >= 2 and len(m["finite"]) == 4:
        m = {**m, "finite": m["finite"].at[3].set(False)}
      return state, m
    return init, rnd_, ev
  monkeypatch.setattr(programs, "build_programs", patched)
  assert cli.main(["sweep", path, "--quiet"]) == 1
  err = capsys.readouterr().err
  assert "1 cell failed: optim.lr=0.02" in err
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  ok, bad = sw.cells
  assert sweep.status(ok) == "done" and sweep.status(bad) == "partial"
  assert [r["round"] for r in read_metrics(f"{ok.dir}/metrics.jsonl")] == [1, 1, 2, 2, 3, 3]
  # stop_run: a run of that cell alone would have stopped after round 2
  assert [(r["round"], r["seed"]) for r in read_metrics(f"{bad.dir}/metrics.jsonl")] == [
      (1, 0), (1, 1), (2, 0)]
  summ = load(f"{bad.dir}/summary.json")
  assert summ["diverged"] == [{"seed": 1, "round": 2}] and summ["seeds"] == [0]
  assert not [n for n in os.listdir(sw.root) if n.startswith(".batch-")]
  # the split cell's records keep the program's ``cell`` key, its summary
  # names the seed alone: the reader leaves that seed out all the same
  run = reading.load_run(bad.dir)
  assert {r["seed"] for r in run.records} == {0}
  assert any("seed 1 diverged at round 2" in p for p in run.problems)
  (row,) = report.build_report([bad.dir]).rows
  assert row.seeds == 1


@pytest.mark.parametrize("device", ["same", "smaller"])
def test_a_killed_program_resumes_bit_identically(tmp_path, monkeypatch, capsys, device):
  """``smaller``: the rerun's device fits fewer slots than the program has
  (another GPU kind, another memory fraction); the program is still
  resumed from its checkpoints, not planned anew from round 0."""
  body = '[grid]\n"optim.lr" = [0.01, 0.02]'
  base = (BASE.replace('"run.rounds" = 2', '"run.rounds" = 3')
          + '"run.seeds" = 2\n"run.checkpoint_every" = 1\n')
  whole = write_sweep(tmp_path / "a.toml", tmp_path / "a", body, base=base)
  assert cli.main(["sweep", whole, "--quiet"]) == 0
  real_update = Progress.update

  def killed(self, r, *a, **kw):  # a SIGKILL in round 2, after its records, before
    real_update(self, r, *a, **kw)  # its checkpoint: the resume starts from round 1
    if r == 2:
      raise KeyboardInterrupt
  monkeypatch.setattr(Progress, "update", killed)
  cut = write_sweep(tmp_path / "b.toml", tmp_path / "b", body, base=base)
  assert cli.main(["sweep", cut, "--quiet"]) != 0
  monkeypatch.setattr(Progress, "update", real_update)
  sw = sweep.load_sweep(cut)
  sweep.resolve(sw)
  (batch,) = [n for n in os.listdir(sw.root) if n.startswith(".batch-") and "." not in n[1:]]
  assert os.path.isdir(f"{sw.root}/{batch}/checkpoints")
  assert cli.main(["sweep", cut, "--dry-run"]) == 0
  capsys.readouterr()
  # --collect reads the program while it trains: a row per cell
  assert cli.main(["sweep", cut, "--collect"]) == 0
  rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| sfl")]
  # 2 seeds each; the records of round 2 were written before the kill
  assert [r.split("|")[2].strip() for r in rows] == ["0.01", "0.02"]
  assert all("| 2 | 2 |" in r for r in rows)
  shutil.rmtree(os.path.join(sw.root, "collected"))
  if device == "smaller":
    monkeypatch.setattr(memory, "fitting_slots", lambda exp: 2)
  assert cli.main(["sweep", cut, "--quiet"]) == 0
  out = capsys.readouterr().out
  assert f"resuming {sw.root}/{batch}" in out  # from round 1
  assert ("has their training so far: going on with it" in out) == (device == "smaller")
  assert sorted(os.listdir(sw.root)) == ["optim.lr=0.01", "optim.lr=0.02"]
  for name in ("optim.lr=0.01", "optim.lr=0.02"):
    a = read_metrics(f"{tmp_path}/a/t/{name}/metrics.jsonl")
    b = read_metrics(f"{tmp_path}/b/t/{name}/metrics.jsonl")
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in a] == \
        [{k: v for k, v in r.items() if k != "wall_s"} for r in b]


def test_collect_reads_a_cell_from_the_program_that_trained_it_last(tmp_path, monkeypatch,
                                                                    capsys):
  """The grid edited while a program was killed: the new plan's program
  holds the same cells under another directory, and the old one stays on
  disk.  The sweep says so when it starts the new program, and --collect
  reads each cell once, from the program written last (the old one's
  seeds counted twice before)."""
  base = (BASE.replace('"run.rounds" = 2', '"run.rounds" = 3')
          + '"run.seeds" = 2\n"run.checkpoint_every" = 1\n')
  real_update = Progress.update

  def kill_at(r_kill):
    def killed(self, r, *a, **kw):  # a kill after round r_kill's records
      real_update(self, r, *a, **kw)
      if r == r_kill:
        raise KeyboardInterrupt
    monkeypatch.setattr(Progress, "update", killed)

  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", '[grid]\n"optim.lr" = [0.01, 0.02]',
                     base=base)
  kill_at(2)
  assert cli.main(["sweep", path, "--quiet"]) != 0
  sw = sweep.load_sweep(path)
  (old,) = [p.dir for p in programs_on_disk(sw.root)]
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out",
                     '[grid]\n"optim.lr" = [0.01, 0.02, 0.03]', base=base)
  kill_at(1)
  capsys.readouterr()
  assert cli.main(["sweep", path, "--quiet"]) != 0
  out = capsys.readouterr().out
  assert f"note: {old} holds training of optim.lr=0.01, optim.lr=0.02 from another plan" in out
  monkeypatch.setattr(Progress, "update", real_update)
  assert len(programs_on_disk(sw.root)) == 2
  assert cli.main(["sweep", path, "--dry-run"]) == 0
  assert (f"note: {old} holds training of optim.lr=0.01, optim.lr=0.02 from another plan of "
          "this sweep; not continued") in capsys.readouterr().out
  assert cli.main(["sweep", path, "--collect"]) == 0
  out = capsys.readouterr().out
  rows = [line.split("|") for line in out.splitlines() if line.startswith("| sfl")]
  # each cell 2 seeds at round 1, the new program's; the old one's round 2 left out
  assert [(r[2].strip(), r[3].strip(), r[4].strip()) for r in rows] == [
      ("0.01", "2", "1"), ("0.02", "2", "1"), ("0.03", "2", "1")]
  assert f"{old}: its records of cell optim.lr=0.01 are left out" in out


def test_a_kill_while_cells_are_split_out_is_finished_without_training(tmp_path,
                                                                       monkeypatch, capsys):
  """Killed after the first cell of a trained program was split out: the
  rerun splits the rest from the program's records (no training), leaves
  the first as it was, and no directory behind."""
  body = '[grid]\n"optim.lr" = [0.01, 0.02, 0.03]'
  whole = write_sweep(tmp_path / "a.toml", tmp_path / "a", body)
  assert cli.main(["sweep", whole, "--quiet"]) == 0
  real = execute.mark_done
  calls = []

  def dying(d):
    calls.append(d)
    if len(calls) == 2:
      raise KeyboardInterrupt
    real(d)
  monkeypatch.setattr(execute, "mark_done", dying)
  cut = write_sweep(tmp_path / "b.toml", tmp_path / "b", body)
  assert cli.main(["sweep", cut, "--quiet"]) != 0
  monkeypatch.setattr(execute, "mark_done", real)
  root = tmp_path / "b" / "t"
  first = tree(root / "optim.lr=0.01")
  assert any(".split" in n for n in os.listdir(root))
  monkeypatch.setattr(programs, "build_programs", None)  # no training this time
  capsys.readouterr()
  assert cli.main(["sweep", cut, "--quiet"]) == 0
  out = capsys.readouterr().out
  assert "1 done" in out and "program already trained; splitting it" in out
  assert sorted(os.listdir(root)) == ["optim.lr=0.01", "optim.lr=0.02", "optim.lr=0.03"]
  assert tree(root / "optim.lr=0.01") == first
  for name in ("optim.lr=0.01", "optim.lr=0.02", "optim.lr=0.03"):
    a, b = (read_metrics(f"{d}/{name}/metrics.jsonl") for d in (tmp_path / "a" / "t", root))
    assert [{k: v for k, v in r.items() if k != "wall_s"} for r in a] == \
        [{k: v for k, v in r.items() if k != "wall_s"} for r in b]
    assert os.path.exists(root / name / sweep.DONE)


def test_a_grid_axis_over_a_whole_section(tmp_path):
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
[grid]
"method.name" = ["sfl", "multisfl"]
partition = [{name = "dirichlet", alpha = 0.1, min_size = 2}, {name = "iid"}]
""")
  sw = sweep.load_sweep(path)
  names = [c.name for c in sw.cells]
  assert names[1::2] == ["method=sfl,partition=iid", "method=multisfl,partition=iid"]
  # 71 and 76 characters in full: cut, with a hash
  assert names[0].startswith("method=sfl,partition=dirichlet,partition.alpha=0.")
  assert names[2].startswith("method=multisfl,partition=dirichlet,partitio")
  assert len(names[0]) == len(names[2]) == 60
  sweep.resolve(sw)
  assert "min_size" not in sw.cells[1].cfg["partition"]
  # partitions are per-slot: one program per method
  assert [[c.index for c in u.cells] for u in sweep.plan(sw, sw.cells)] == [[0, 1], [2, 3]]


def test_a_named_value_set_may_set_keys_of_other_sections(tmp_path, capsys):
  """``fedavg = {name = "fedavg", "optim.weight_decay" = 0.0}``: that value
  set alone changes the optimiser; the cell keeps the value's name."""
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", """
"optim.weight_decay" = 1e-4
[grid.method]
fedavg = {name = "fedavg", "optim.weight_decay" = 0.0}
sfl = {name = "sfl"}
""")
  sw = sweep.load_sweep(path)
  assert [c.name for c in sw.cells] == ["fedavg", "sfl"]
  sweep.resolve(sw)
  assert [(c.cfg["method"]["name"], c.cfg["optim"]["weight_decay"]) for c in sw.cells] == [
      ("fedavg", 0.0), ("sfl", 1e-4)]
  bad = write_sweep(tmp_path / "b.toml", tmp_path / "out", """
[grid.method]
fedavg = {name = "fedavg", "method.name" = "sfl"}
""")
  assert cli.main(["sweep", bad, "--dry-run"]) == 2
  assert "sets method.name twice" in capsys.readouterr().err
  clash = write_sweep(tmp_path / "c.toml", tmp_path / "out", """
[grid]
"optim.weight_decay" = [0.001, 0.002]
[grid.method]
fedavg = {name = "fedavg", "optim.weight_decay" = 0.0}
""")
  assert cli.main(["sweep", clash, "--dry-run"]) == 2
  err = capsys.readouterr().err
  assert "sets optim.weight_decay on more than one axis" in err and len(err.splitlines()) == 1


def test_what_a_killed_write_leaves_is_a_runs_not_the_users(tmp_path, capsys):
  """A cell directory holding only ``config.json.tmp<pid>`` (a kill during
  the run's first write) or a lock is the sweep's to replace; --dry-run
  plans under a directory it could not write."""
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", '[grid]\n"optim.lr" = [0.1]')
  cell = tmp_path / "out" / "t" / "optim.lr=0.1"
  cell.mkdir(parents=True)
  (cell / "config.json.tmp4242").write_text("{")
  (cell / ".lock").write_text("")
  assert cli.main(["sweep", path, "--dry-run"]) == 0
  (cell / "notes.txt").write_text("mine")
  assert cli.main(["sweep", path, "--dry-run"]) == 2
  assert "notes.txt" in capsys.readouterr().err


def test_config_diff_leaves_out_how_evaluation_is_lowered_and_chunked(tmp_path):
  """A cell finished or checkpointed before ``exec.eval_batch`` became 0 (the
  backend's chunk) and ``model.eval_conv_impl`` existed is not redone for
  them; any field of what it trains still counts."""
  from jsfl import config as config_lib
  cfg = config_lib.load_config(None, [])
  old = json.loads(json.dumps(cfg))
  old["exec"]["eval_batch"] = 1000
  del old["model"]["eval_conv_impl"]
  run = tmp_path / "cell"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"config": old}))
  assert sweep.config_diff(str(run), cfg) == []
  cfg["model"]["eval_conv_impl"] = "same"
  assert sweep.config_diff(str(run), cfg) == []
  old["optim"]["lr"] = 0.01
  (run / "config.json").write_text(json.dumps({"config": old}))
  assert sweep.config_diff(str(run), cfg) == ["optim.lr"]


def stored_before(tmp_path, cfg: dict, section: str, key: str):
  """A run directory whose config.json is ``cfg`` written before
  ``section.key`` existed (the key left out)."""
  old = json.loads(json.dumps(cfg))
  del old[section][key]
  run = tmp_path / "cell"
  run.mkdir()
  (run / "config.json").write_text(json.dumps({"config": old}))
  return run


@pytest.mark.parametrize("model,ran", [("mobilenet_v1", "same"), ("resnet18", "same"),
                                       ("small_cnn", "torch")])
def test_a_config_from_before_model_padding_is_read_as_it_ran(tmp_path, model, ran):
  """Runs written before ``model.padding`` padded with XLA's SAME: on the
  models where that is another function (config.PADDING_SENSITIVE_MODELS)
  a finished cell differs from today's default and a resumed run keeps
  SAME; elsewhere the two conventions agree and nothing is redone."""
  from jsfl import config as config_lib
  from jsfl.train import lifecycle
  cfg = config_lib.load_config(None, [f"model.name={model}"])
  run = stored_before(tmp_path, cfg, "model", "padding")
  assert sweep.config_diff(str(run), cfg) == ([] if ran == "torch" else ["model.padding"])
  cfg["model"]["padding"] = "same"
  assert sweep.config_diff(str(run), cfg) == []  # the same function either way
  resumed, _ = lifecycle.read_run_config(str(run), None)
  assert resumed["model"]["padding"] == ran
  assert "padding" not in json.loads((run / "config.json").read_text())["config"]["model"]


def test_a_config_from_before_optim_clip_norm_clipped_nothing(tmp_path):
  """A cell asking for clipping is not the unclipped run a stored config
  from before ``optim.clip_norm`` describes; asking for none, it is."""
  from jsfl import config as config_lib
  from jsfl.train import lifecycle
  cfg = config_lib.load_config(None, ["optim.clip_norm=50.0"])
  run = stored_before(tmp_path, cfg, "optim", "clip_norm")
  assert sweep.config_diff(str(run), cfg) == ["optim.clip_norm"]
  cfg["optim"]["clip_norm"] = 0.0
  assert sweep.config_diff(str(run), cfg) == []
  resumed, _ = lifecycle.read_run_config(str(run), None)
  assert resumed["optim"]["clip_norm"] == 0.0


def test_a_self_balancing_dirichlet_from_before_cap_rule_capped_above_the_share(tmp_path):
  """A self-balancing Dirichlet run stored before ``partition.cap_rule``
  closed a client only above N/K: it is not a run of today's default (the
  MultiSFL authors' rule, written into every new config) and resumes with
  the rule it ran; other partitions are left alone."""
  from jsfl import config as config_lib
  from jsfl.train import lifecycle
  cfg = config_lib.load_config(None, ["partition.name=dirichlet", "partition.self_balancing=true"])
  assert cfg["partition"]["cap_rule"] == "reached"
  run = stored_before(tmp_path, cfg, "partition", "cap_rule")
  assert sweep.config_diff(str(run), cfg) == ["partition.cap_rule"]
  resumed, _ = lifecycle.read_run_config(str(run), None)
  assert resumed["partition"]["cap_rule"] == "exceeded"
  cfg["partition"]["cap_rule"] = "exceeded"
  assert sweep.config_diff(str(run), cfg) == []
  for overrides in (["partition.name=dirichlet"], ["partition.name=flower_dirichlet",
                                                   "partition.self_balancing=true"]):
    plain = config_lib.load_config(None, overrides)
    assert "cap_rule" not in plain["partition"]
    assert "cap_rule" not in config_lib.as_it_ran(plain)["partition"]


def test_a_program_has_progress_only_with_a_checkpoint_of_these_cells(tmp_path):
  """An empty checkpoints/ (made at the start, before round 1's save) is no
  progress, nor is one of cells configured otherwise: such a program is
  planned anew, its done cells not trained again."""
  from jsfl.sweep.plan import has_progress
  path = write_sweep(tmp_path / "s.toml", tmp_path / "out", '[grid]\n"optim.lr" = [0.1, 0.2]')
  sw = sweep.load_sweep(path)
  sweep.resolve(sw)
  (unit,) = sweep.plan(sw, sw.cells)
  assert unit.batched
  os.makedirs(os.path.join(unit.dir, "checkpoints"))
  cells = [{"name": c.name, "config": c.cfg} for c in unit.cells]
  with open(os.path.join(unit.dir, "config.json"), "w") as f:
    json.dump({"config": unit.cfg, "cells": cells}, f)
  assert not has_progress(unit)
  os.makedirs(os.path.join(unit.dir, "checkpoints", "3"))
  assert has_progress(unit)
  cells[1]["config"] = {**cells[1]["config"], "optim": {**cells[1]["config"]["optim"],
                                                        "lr": 0.3}}
  with open(os.path.join(unit.dir, "config.json"), "w") as f:
    json.dump({"config": unit.cfg, "cells": cells}, f)
  assert not has_progress(unit)
