"""End-to-end CLI runs and the promised config errors."""

import json
import os

import numpy as np
import pytest

from jsfl import cli
from jsfl.rundir import read_metrics

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=400", "dataset.test_size=100", "model.width=4", "model.hidden=16",
       "exec.progress=false"]


def load_json(path):
  with open(path) as f:
    return json.load(f)


def run_cli(tmp_path, *overrides):
  out = tmp_path / "r"
  code = cli.main(["run", *SYN, f"run.dir={out}", *overrides])
  return code, str(out)


def test_synthetic_run_writes_the_run_directory(tmp_path, capsys):
  code, out = run_cli(tmp_path, "run.rounds=3", "run.seeds=2", "partition.num_clients=4",
                      "method.order=cyclic", "partition.name=dominant_label", "partition.p=0.8")
  assert code == 0
  assert sorted(os.listdir(out)) == ["checkpoints", "config.json", "metrics.jsonl",
                                     "partition.json", "sessions.jsonl", "summary.json"]
  recs = read_metrics(f"{out}/metrics.jsonl")
  assert [(r["round"], r["seed"]) for r in recs] == [(1, 0), (1, 1), (2, 0), (2, 1), (3, 0), (3, 1)]
  for r in recs:
    assert len(r["per_label_accuracy"]) == 4 and 0 <= r["accuracy"] <= 100
    assert r["pg"] >= 0 and r["bytes_up"] > 0 and r["bytes_down"] > 0
    assert sorted(r["clients"]) == [0, 1, 2, 3]
    assert len(r["per_position_accuracy"]) == 4
  assert recs[0]["bw"] is None and recs[-1]["bw"] is not None
  summ = load_json(f"{out}/summary.json")
  assert summ["seeds"] == [0, 1]
  # the papers' statistic: per seed the median of the last 5 rounds, then over seeds
  acc = [np.median([r["accuracy"] for r in recs if r["seed"] == s]) for s in (0, 1)]
  assert summ["accuracy"]["median"] == pytest.approx(np.median(acc))
  cfg = load_json(f"{out}/config.json")
  assert cfg["config"]["method"]["order"] == "cyclic" and "jax" in cfg["versions"]
  part = load_json(f"{out}/partition.json")
  assert len(part["seeds"]) == 2 and np.array(part["seeds"][0]["label_counts"]).shape == (4, 4)
  # cyclic order: clients come grouped by dominant label in the run's label cycle
  dom = np.array(part["seeds"][0]["dominant"])
  order = recs[0]["label_order"]
  assert [int(dom[c]) for c in recs[0]["clients"]] == order
  assert out in capsys.readouterr().out


def test_partition_seed_draws_one_split_for_every_seed(tmp_path):
  # partition.seed = -1: each seed its own Dirichlet draw; >= 0: that one draw
  # (the Hydra authors' code splits once, with seed 2020, for every run).
  from jsfl.data import load_dataset
  from jsfl.partitions import label_counts, make_partition
  counts = {}
  for seed in (-1, 7):
    code, out = run_cli(tmp_path / str(seed), "run.rounds=1", "run.seeds=2",
                        "partition.num_clients=4", "partition.name=dirichlet",
                        "partition.alpha=0.5", f"partition.seed={seed}")
    assert code == 0
    seeds = load_json(f"{out}/partition.json")["seeds"]
    counts[seed] = [np.array(p["label_counts"]) for p in seeds]
  assert not np.array_equal(*counts[-1])
  np.testing.assert_array_equal(*counts[7])
  ds = load_dataset("synthetic", input_shape=[8, 8, 1], num_classes=4, train_size=400,
                    test_size=100)
  want = label_counts(make_partition("dirichlet", ds.y_train, 4, seed=7, num_classes=4,
                                     alpha=0.5), ds.y_train, 4)
  np.testing.assert_array_equal(counts[7][0], want)


@pytest.mark.parametrize("override, message", [
    ("method.order=sideways", "method.order='sideways'; allowed: 'random', 'cyclic'"),
    ("method.ordr=cyclic", "unknown config key 'method.ordr' (did you mean 'order'?)"),
    ("run.rounds=ten", "run.rounds='ten': wrong type; allowed: an int"),
    ("run.rounds=0", "run.rounds=0; allowed: an int >= 1"),
    ("optim.lr=-1", "optim.lr=-1.0; allowed: a float > 0"),
    ("partition.name=dominant_label", "[partition]"),
    ("partition.p=2.0", "partition"),
    ("model.name=vgg99", "model='vgg99'; allowed"),
    ("model.cut=99", "model.cut=99"),
    ("method.clients_per_round=50", "method.clients_per_round=50"),
    ("bogus.key=1", "unknown config key 'bogus'"),
])
def test_bad_config_is_one_clear_line_and_exit_2(tmp_path, capsys, override, message):
  code, out = run_cli(tmp_path, "partition.num_clients=3", override)
  err = capsys.readouterr().err.strip()
  assert code == 2
  assert message in err, err
  assert len(err.splitlines()) == 1
  assert not os.path.exists(out)


def test_bad_config_file(tmp_path, capsys):
  bad = tmp_path / "bad.toml"
  bad.write_text("[run]\nrounds = [\n")
  assert cli.main(["run", str(bad)]) == 2
  assert "not valid TOML" in capsys.readouterr().err
  assert cli.main(["run", str(tmp_path / "missing.toml")]) == 2


def test_help_is_complete(capsys):
  with pytest.raises(SystemExit):
    cli.main(["run", "--help"])
  text = capsys.readouterr().out
  assert "section.key=value" in text and "run directory" in text
  with pytest.raises(SystemExit):
    cli.main(["--help"])
  text = capsys.readouterr().out
  for cmd in ("run", "partition"):
    assert cmd in text


def test_partition_command(tmp_path, capsys):
  out = tmp_path / "p.json"
  code = cli.main(["partition", "synthetic", "dominant_label", "--clients", "10", "p=0.8",
                   "--out", str(out)])
  assert code == 0
  counts = np.array(load_json(out)["label_counts"])
  assert counts.shape == (10, 10)
  np.testing.assert_array_equal(counts.argmax(1), np.arange(10))
  frac = counts.max(1) / counts.sum(1)
  assert np.all(np.abs(frac - 0.8) < 0.02)
  assert "client" in capsys.readouterr().out
  assert cli.main(["partition", "synthetic", "dominant_label", "--clients", "10", "p=7"]) == 2
  assert "p=7" in capsys.readouterr().err
  # the part each client trains on, as the Hydra authors' Flower paths keep it
  kept = tmp_path / "kept.json"
  assert cli.main(["partition", "synthetic", "flower_dirichlet", "--clients", "10",
                   "--seed", "42", "alpha=0.3", "--train-size", "0.8", "--out", str(kept)]) == 0
  got = load_json(kept)
  assert got["train_size"] == 0.8 and got["train_split_seed"] == 42
  from jsfl import data, partitions
  y = data.load_dataset("synthetic").y_train
  want = partitions.train_split(partitions.make_partition(
      "flower_dirichlet", y, 10, seed=42, alpha=0.3), 0.8, 42)
  assert got["sizes"] == [len(p) for p in want]
  for bad in ("1.5", "0"):
    assert cli.main(["partition", "synthetic", "iid", "--train-size", bad]) == 2
    assert f"train_size={float(bad)}; allowed: a float in (0, 1]" in capsys.readouterr().err


def test_partition_plot(tmp_path, capsys):
  """`jsfl partition --plot` draws the label counts (Hydra Fig. 8); a bad
  file name is one line, exit 2, nothing written."""
  pytest.importorskip("matplotlib")
  png = tmp_path / "fig8.png"
  assert cli.main(["partition", "synthetic", "dominant_label", "--clients", "10", "p=0.6",
                   "--plot", str(png)]) == 0
  assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  capsys.readouterr()
  bad = tmp_path / "fig8.jpg"
  assert cli.main(["partition", "synthetic", "dominant_label", "p=0.6",
                   "--plot", str(bad)]) == 2
  err = capsys.readouterr().err
  assert "--plot=" in err and ".png" in err and len(err.strip().splitlines()) == 1
  assert not bad.exists()


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="Debian's dataset-fashion-mnist is not installed")
def test_small_fashion_mnist_run(tmp_path):
  out = tmp_path / "fm"
  code = cli.main(["run", "run.rounds=2", "partition.num_clients=100",
                   "method.clients_per_round=3", "exec.progress=false", f"run.dir={out}",
                   "method.name=fedavg"])
  assert code == 0
  recs = read_metrics(f"{out}/metrics.jsonl")
  assert len(recs) == 2 and recs[-1]["accuracy"] > 30  # 2 rounds, 3 clients: well above 10%


def test_config_reference_doc_is_current():
  """docs/config.md is generated (`jsfl config-reference > docs/config.md`)."""
  from jsfl import config
  path = os.path.join(os.path.dirname(__file__), "..", "docs", "config.md")
  with open(path) as f:
    assert f.read().strip() == config.markdown_reference().strip(), (
        "docs/config.md is stale: run `jsfl config-reference > docs/config.md`")


def test_config_choices_are_the_librarys():
  """Choices the config lists without importing the library (it stays
  light to import) are the library's own."""
  from jsfl import config
  from jsfl.core.optim import WEIGHT_DECAY_SCOPES
  from jsfl.core.setup import AGGREGATIONS, CLIENT_PASSES
  from jsfl.data.augment import AUGMENTS
  from jsfl.engine.schedule import RULES
  S = config.SCHEMA
  assert S["method"]["aggregation"].choices == AGGREGATIONS
  assert S["dataset"]["augment"].choices == AUGMENTS
  assert S["method"]["order_rule"].choices == RULES
  assert S["optim"]["weight_decay_scope"].choices == WEIGHT_DECAY_SCOPES
  assert S["exec"]["client_pass"].choices == ("auto",) + CLIENT_PASSES


def test_typed_config_sections_are_current_and_hold_the_config():
  """jsfl/config_types.py is generated from the schema (`python -m jsfl.config
  --write-types`), and a config's typed view holds every value of the dict
  it was resolved to: schema keys as attributes, an open section's other
  keys as its ``extra``."""
  import dataclasses

  from jsfl import config
  path = os.path.join(os.path.dirname(__file__), "..", config.TYPES_PATH)
  with open(path) as f:
    assert f.read() == config.types_source(), (
        "jsfl/config_types.py is stale: run `python -m jsfl.config --write-types`")
  cfg = config.load_config(None, ["run.rounds=7", "method.name=fedprox", "method.mu=0.3",
                                  "model.width=8", "exec.precision=bfloat16"])
  c = config.typed(cfg)
  assert c.run.rounds == 7 and c.exec.precision == "bfloat16" and c.optim.name == "sgd"
  assert c.method.extra == {"mu": 0.3} and c.model.extra == {"width": 8}
  for section in config.SCHEMA:
    values = dataclasses.asdict(getattr(c, section))
    extra = values.pop("extra", {})
    assert {**values, **extra} == cfg[section]
  with pytest.raises(dataclasses.FrozenInstanceError):
    c.run.rounds = 8  # type: ignore[misc]


def test_output_cut_short_by_its_reader_is_no_traceback(tmp_path):
  """``jsfl sweep FILE --dry-run | head``: the pipe closes early; jsfl ends
  quietly with SIGPIPE's status, not an 'internal error' traceback."""
  import subprocess
  import sys
  sweep = tmp_path / "s.toml"
  sweep.write_text('[sweep]\nname = "s"\n[grid]\n"run.seed" = [' + ", ".join(
      str(i) for i in range(3000)) + "]\n")
  proc = subprocess.Popen([sys.executable, "-m", "jsfl", "sweep", str(sweep), "--dry-run"],
                          cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
  proc.stdout.readline()
  proc.stdout.close()
  err = proc.stderr.read().decode()
  assert proc.wait(timeout=120) == 141, err
  assert err == ""


def test_the_no_command_line_names_every_command():
  assert cli.COMMANDS == tuple(cli._parser()._subparsers._group_actions[0].choices)
