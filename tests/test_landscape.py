"""``jsfl landscape``: the filter-normalised 2-D loss slice of a finished run
(jsfl/train/landscape.py, docs/analysis.md)."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jsfl import cli, plots
from jsfl import config as config_lib
from jsfl.rundir import read_metrics
from jsfl.train import landscape
from jsfl.train.evaluate import chunk_test_set, evaluate

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=200", "dataset.test_size=60", "model.width=4", "model.hidden=16",
       "exec.progress=false"]


def tree_listing(path):
  return sorted(os.path.relpath(os.path.join(d, f), path)
                for d, _, files in os.walk(path) for f in files)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
  """A one-round MultiSFL run of two seeds: a split model (part-1 + part-2)
  whose output is the master, the branch mean."""
  out = str(tmp_path_factory.mktemp("landscape") / "run")
  code = cli.main(["run", *SYN, "method.name=multisfl", "method.clients_per_round=2",
                   "partition.num_clients=4", "run.rounds=1", "run.seeds=2",
                   f"run.dir={out}", "--quiet"])
  assert code == 0
  return out


def test_filter_normalisation_by_hand():
  w = {"conv": jnp.asarray(np.arange(1.0, 13.0).reshape(1, 2, 2, 3)),  # (kh, kw, in, out)
       "dense": jnp.asarray([[3.0, 0.0], [4.0, 2.0]]),                  # (in, out)
       "bias": jnp.asarray([5.0, 6.0]), "scale": jnp.asarray(7.0)}
  d = {"conv": jnp.ones((1, 2, 2, 3)), "dense": jnp.asarray([[1.0, 1.0], [0.0, 0.0]]),
       "bias": jnp.asarray([1.0, 1.0]), "scale": jnp.asarray(1.0)}
  got = jax.tree.map(np.asarray, landscape.filter_normalize(d, w))
  conv = np.arange(1.0, 13.0).reshape(4, 3)  # the 4 weights of each of the 3 filters
  for j in range(3):
    want = np.ones(4) * np.sqrt(np.sum(conv[:, j] ** 2)) / 2.0  # |d_j| = sqrt(4) = 2
    np.testing.assert_allclose(got["conv"][..., j].ravel(), want, rtol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got["conv"][..., j]),
                               np.linalg.norm(conv[:, j]), rtol=1e-6)
  # dense filters: |w_0| = 5, |w_1| = 2; d's filters are (1, 0) and (1, 0)
  np.testing.assert_allclose(got["dense"], [[5.0, 2.0], [0.0, 0.0]], rtol=1e-6)
  np.testing.assert_array_equal(got["bias"], [0.0, 0.0])  # biases and BN held fixed
  assert got["scale"] == 0.0


def test_directions_are_the_seeds_and_filter_normalised():
  w = {"k": jax.random.normal(jax.random.key(1), (3, 3, 2, 5)), "b": jnp.ones(5)}
  draw = jax.jit(landscape.directions)
  d1, d2 = draw(landscape.direction_key(0), w)
  e1, _ = draw(landscape.direction_key(0), w)
  f1, _ = draw(landscape.direction_key(1), w)
  np.testing.assert_array_equal(d1["k"], e1["k"])
  assert not np.allclose(d1["k"], d2["k"]) and not np.allclose(d1["k"], f1["k"])
  for d in (d1, d2):
    np.testing.assert_allclose(np.linalg.norm(np.asarray(d["k"]).reshape(-1, 5), axis=0),
                               np.linalg.norm(np.asarray(w["k"]).reshape(-1, 5), axis=0),
                               rtol=1e-5)
    np.testing.assert_array_equal(d["b"], np.zeros(5))


def test_landscape_command_writes_the_file_and_plot_its_centre_the_runs_loss(run, capsys):
  code = cli.main(["landscape", run, "--seed", "1", "--grid", "3", "--data", "test",
                   "--samples", "0"])
  out = capsys.readouterr().out.split()
  assert code == 0
  path = os.path.join(run, "landscape", "landscape-seed1.json")
  assert out == [path, path.removesuffix(".json") + ".png"]
  assert sorted(os.listdir(os.path.join(run, "landscape"))) == [
      "landscape-seed1.json", "landscape-seed1.png"]
  with open(path) as f:
    obj = json.load(f)
  assert obj["seed"] == 1 and obj["round"] == obj["rounds"] == 1
  assert obj["method"] == "multisfl"
  assert obj["options"] == {"grid": 3, "span": 1.0, "data": "test", "samples": 60,
                            "samples_asked": 0, "points_per_step": 1}
  assert obj["x"] == obj["y"] == [-1.0, 0.0, 1.0]
  assert np.asarray(obj["loss"]).shape == np.asarray(obj["accuracy"]).shape == (3, 3)
  # The centre is the trained model: its loss on the whole test set is the
  # loss the run evaluated after its last round, for that seed.
  rec = [r for r in read_metrics(os.path.join(run, "metrics.jsonl"))
         if r["seed"] == 1 and r["round"] == 1][0]
  assert obj["center"]["loss"] == pytest.approx(rec["loss"], rel=1e-6)
  assert obj["center"]["accuracy"] == pytest.approx(rec["accuracy"], abs=1e-4)
  assert obj["loss"][1][1] == pytest.approx(obj["center"]["loss"], rel=1e-6)
  assert max(max(r) for r in obj["loss"]) > obj["center"]["loss"]  # the slice moves
  from test_plots import check_png
  check_png(path.removesuffix(".json") + ".png", "landscape")
  # jsfl plot draws the run's landscape beside its other plots
  pngs, _ = plots.plot_runs([run], os.path.join(run, "plots"))
  assert os.path.join(run, "plots", "landscape.png") in pngs
  check_png(os.path.join(run, "plots", "landscape.png"), "landscapes")
  shutil.rmtree(os.path.join(run, "plots"))


def test_the_grid_program_equals_a_python_loop(run):
  cfg, seed = landscape.check_run(run, None)
  assert seed == 0  # the run's first seed by default
  final = landscape.final_model(run, cfg, seed)
  exp = final.exp
  x, y = landscape.subset(np.asarray(exp.dataset.x_train), np.asarray(exp.dataset.y_train),
                          50, seed)
  assert len(y) == 50
  data = jax.tree.map(jnp.asarray, chunk_test_set(x, y, 20))  # 3 chunks, the last padded
  d1, d2 = jax.jit(landscape.directions)(landscape.direction_key(seed), final.params)
  coords = landscape.axes(3, 0.5)
  b, a = np.meshgrid(coords, coords, indexing="ij")
  points = jnp.asarray(np.stack([a.ravel(), b.ravel()], 1), jnp.float32)
  model, L = exp.setup.model, exp.setup.num_classes
  mean, std = exp.data.mean, exp.data.std
  for per_step in (1, 4):  # lax.map alone, and 4 points vmapped a step
    loss, acc = jax.jit(lambda p, s, u, v, pts, dat, step=per_step: landscape.grid_values(
        model, p, s, u, v, pts, dat, mean, std, L, step))(
            final.params, final.stats, d1, d2, points, data)
    one = jax.jit(lambda p: evaluate(model, p, final.stats, data, mean, std, L))
    for k, (pa, pb) in enumerate(np.asarray(points)):
      moved = jax.tree.map(lambda w, u, v, pa=pa, pb=pb: w + pa * u + pb * v,
                           final.params, d1, d2)
      e = one(moved)
      np.testing.assert_allclose(loss[k], e["loss"], rtol=1e-5)
      np.testing.assert_allclose(acc[k], e["accuracy"], atol=1e-4)


def _config_only(tmp_path, cfg):
  d = tmp_path / "cfg_only"
  d.mkdir()
  (d / "config.json").write_text(json.dumps({"config": cfg}))
  return str(d)


@pytest.mark.parametrize("case, message", [
    ("missing", "does not exist; allowed: a run directory"),
    ("not_a_run", "is not a run directory"),
    ("no_checkpoint", "has no checkpoint"),
    ("predict", "method 'splitfedv3' outputs no single model"),
    ("seed", "--seed=7: not a seed of"),
    ("grid", "--grid=2; allowed: an int in [3, 501]"),
    ("grid_huge", "--grid=100000; allowed: an int in [3, 501]"),
    ("span", "--span=0.0; allowed: a number > 0"),
    ("samples", "--samples=-1; allowed"),
    ("data", "--data='val'; allowed: train, test"),
])
def test_bad_input_is_one_line_exit_2_and_nothing_written(run, tmp_path, capsys, case,
                                                          message):
  target, args = run, []
  if case == "missing":
    target = str(tmp_path / "nowhere")
  elif case == "not_a_run":
    target = str(tmp_path)
  elif case == "no_checkpoint":
    with open(os.path.join(run, "config.json")) as f:
      target = _config_only(tmp_path, json.load(f)["config"])
  elif case == "predict":
    target = _config_only(tmp_path, config_lib.resolve({"method": {"name": "splitfedv3"}}))
  else:
    flag, value = {"seed": ("--seed", "7"), "grid": ("--grid", "2"), "span": ("--span", "0"),
                   "grid_huge": ("--grid", "100000"),
                   "samples": ("--samples", "-1"), "data": ("--data", "val")}[case]
    args = [flag, value]
  before = tree_listing(run), tree_listing(str(tmp_path))
  assert cli.main(["landscape", target, *args]) == 2
  err = capsys.readouterr().err.strip()
  assert message in err, err
  assert len(err.splitlines()) == 1 and err.startswith("jsfl: error: ")
  assert (tree_listing(run), tree_listing(str(tmp_path))) == before
  if target != run:  # (the run's own holds the file of the test above)
    assert not os.path.exists(os.path.join(target, "landscape"))


def test_landscapes_of_several_runs_side_by_side(tmp_path):
  """The plot reads only the written files (no JAX): Fig. 4's panels."""
  from test_plots import check_png
  from test_report import write_run
  runs = [write_run(tmp_path / "s" / "a"),
          write_run(tmp_path / "s" / "b", {"method.name": "fedavg"})]
  x = np.linspace(-1, 1, 5)
  for k, r in enumerate(runs):
    loss = 0.3 + (k + 1) * (x[None, :] ** 2 + 2 * x[:, None] ** 2)
    loss[0, 0] = np.nan  # a diverged corner is left blank
    os.makedirs(os.path.join(r, "landscape"))
    with open(os.path.join(r, "landscape", "landscape-seed0.json"), "w") as f:
      json.dump({"seed": 0, "round": 3, "x": x.tolist(), "y": x.tolist(),
                 "loss": [[None if np.isnan(v) else v for v in row] for row in loss],
                 "accuracy": (90 - 10 * loss).tolist(), "center": {"loss": 0.3},
                 "options": {"data": "train", "samples": 100}}, f)
  out = tmp_path / "plots"
  pngs, _ = plots.plot_runs([str(tmp_path / "s")], str(out))
  assert str(out / "landscape.png") in pngs
  check_png(str(out / "landscape.png"), "landscapes")
  one = plots.landscape_contour(os.path.join(runs[0], "landscape", "landscape-seed0.json"),
                                str(tmp_path / "one.png"))
  check_png(one, "landscape")
  bad = tmp_path / "bad.json"
  bad.write_text(json.dumps({"x": [0, 1], "y": [0, 1], "loss": [[1.0]], "accuracy": [[1.0]]}))
  with pytest.raises(ValueError, match="not a jsfl landscape file"):
    plots.read_landscape(str(bad))
