"""The scripts that set the MultiSFL authors' code beside jsfl (experiments/multisfl/authors_code/).

Their own runs stay outside the repository, so these check the scripts on
hand-made logs: parse.py's figures and curves.py's per-round medians.
"""

import importlib.util
import json
import pathlib

import pytest

HERE = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "multisfl" / "authors_code"


def _load(name):
  spec = importlib.util.spec_from_file_location(f"authors_code_{name}", HERE / f"{name}.py")
  mod = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(mod)
  return mod


def _authors_log(path, algorithm, seed, accs, p=None):
  with open(path, "w") as f:
    for t, a in enumerate(accs, 1):
      row = {"round": t, "algorithm": algorithm, "seed": seed, "accuracy": a, "train_s": 2.0,
             "samples": 100, "helper_samples": 0}
      if p is not None:
        row["p"] = p[t - 1]
      f.write(json.dumps(row) + "\n")


def test_parse_median_of_last5_and_best_ma(tmp_path):
  parse = _load("parse")
  logs = tmp_path / "logs"
  logs.mkdir()
  accs = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
  _authors_log(logs / "SFL_seed0.jsonl", "SFL", 0, accs)
  # a run restarted from round 1 appends to its log: the later lines win
  _authors_log(logs / "FL_seed0.jsonl", "FL", 0, [99.0, 99.0])
  with open(logs / "FL_seed0.jsonl", "a") as f, open(logs / "SFL_seed0.jsonl") as g:
    f.write(g.read().replace('"SFL"', '"FL"'))
  out = tmp_path / "a.json"
  assert parse.main([str(logs), "--out", str(out)]) in (0, None)
  fedavg, sfl = json.loads(out.read_text())["runs"]
  assert (fedavg["method"], sfl["method"]) == ("fedavg", "splitfedv1")
  for run in (fedavg, sfl):
    assert run["final"]["rounds_done"] == 6
    assert run["final"]["median_last5"] == 40.0               # median of 20..60
    # the best trailing 10-round mean, shorter first windows included: here all 6 rounds'
    assert run["final"]["best_ma10"] == pytest.approx(35.0)


def test_curves_medians_and_unfinished_runs_left_out(tmp_path):
  pytest.importorskip("matplotlib")
  curves = _load("curves")

  def rounds(accs, p=None):
    return [{"round": t, "accuracy": a, **({"p": p[t - 1]} if p else {})}
            for t, a in enumerate(accs, 1)]

  authors = {"runs": [
      {"method": "multisfl", "seed": 0, "rounds": rounds([50, 60, 70], [0.01, 0.02, 0.04]),
       "final": {"rounds_done": 3}},
      {"method": "multisfl", "seed": 1, "rounds": rounds([52, 64, 72], [0.01, 0.02, 0.01]),
       "final": {"rounds_done": 3}},
      {"method": "multisfl", "seed": 2, "rounds": rounds([99, 99]),  # unfinished: left out
       "final": {"rounds_done": 2}}]}
  (tmp_path / "authors.json").write_text(json.dumps(authors))
  run = tmp_path / "run"
  run.mkdir()
  (run / "config.json").write_text(json.dumps(
      {"config": {"method": {"name": "multisfl", "replay": "adaptive"}}}))
  with open(run / "metrics.jsonl", "w") as f:
    for seed, accs in ((0, [40, 50, 60]), (1, [44, 58, 66]), (2, [42, 54, 80])):
      f.writelines(json.dumps({"round": t, "seed": seed, "accuracy": a, "p": 0.01 * t}) + "\n"
                   for t, a in enumerate(accs, 1))
  ablation = tmp_path / "conf1"  # replay off: no counterpart in their code
  ablation.mkdir()
  (ablation / "config.json").write_text(json.dumps(
      {"config": {"method": {"name": "multisfl", "replay": "off"}}}))
  (ablation / "metrics.jsonl").write_text(
      json.dumps({"round": 1, "seed": 0, "accuracy": 1.0}) + "\n")
  png = tmp_path / "plots" / "c.png"
  assert curves.main([str(tmp_path / "authors.json"), str(run), str(ablation), "--out", str(png),
                      "--rounds", "3"]) == 0
  assert png.stat().st_size > 0
  data = json.loads((tmp_path / "plots" / "c.json").read_text())
  ours, theirs = data["multisfl.accuracy"]["jsfl"], data["multisfl.accuracy"]["authors' code"]
  assert ours["median"] == [42, 54, 66] and ours["low"] == [40, 50, 60]
  assert theirs["seeds"] == [0, 1] and theirs["median"] == [51, 62, 71]
  assert data["multisfl.p"]["authors' code"]["high"] == [0.01, 0.02, 0.04]
