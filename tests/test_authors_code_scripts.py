"""The scripts that set the authors' code beside jsfl (experiments/multisfl/authors_code/,
experiments/hydra/authors_code/).

Their own runs stay outside the repository, so these check the scripts on
hand-made logs: parse.py's figures, curves.py's per-round medians, the Hydra
parse.py's seed and cell filters, orderings.py's check and trace_compare.py's distances.
"""

import json
import pathlib

import numpy as np
import pytest
from conftest import load_script

HERE = pathlib.Path(__file__).resolve().parents[1] / "experiments" / "multisfl" / "authors_code"


def _load(name):
  return load_script(HERE / f"{name}.py", f"authors_code_{name}")


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


def test_parse_reference_csv_and_init(tmp_path):
  parse = _load("parse")
  logs = tmp_path / "logs"
  logs.mkdir()
  (logs / "init").write_text("torch\n")
  for seed, last in enumerate((70.0, 80.0, 90.0)):
    _authors_log(logs / f"MultiSFL_seed{seed}.jsonl", "MultiSFL", seed, [last] * 5, p=[0.01] * 5)
    _authors_log(logs / f"SFL_seed{seed}.jsonl", "SFL", seed, [last - 10.0] * 5)
  out, csv = tmp_path / "a.json", tmp_path / "a.csv"
  assert parse.main([str(logs), "--out", str(out), "--csv", str(csv)]) == 0
  assert json.loads(out.read_text())["init"] == "torch"
  rows = [line for line in csv.read_text().splitlines() if not line.startswith("#")]
  assert rows[0] == "method.name,method.replay,reference,reference_std"
  # median over seeds 0-2 and the population std (sqrt(200 / 3))
  assert rows[1:] == ["multisfl,adaptive,80.00,8.16", "splitfedv1,,70.00,8.16"]


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


# ----------------------------------------- the Hydra recipe (experiments/hydra)
HYDRA = HERE.parents[1] / "hydra" / "authors_code"


def _load_hydra(name):
  return load_script(HYDRA / f"{name}.py", f"hydra_authors_{name}")


def _hydra_log(path, accs):
  with open(path, "w") as f:
    for t, a in enumerate(accs, 1):
      f.write(json.dumps({"round": t, "accuracy": a, "pg": 10.0, "per_label": [a] * 10,
                          "samples": 100, "train_s": 1.0, "train_cpu_s": 1.0,
                          "eval_s": 0.1}) + "\n")


def test_hydra_parse_keeps_the_seeds_and_cells_asked_for(tmp_path):
  parse = _load_hydra("parse")
  logs = tmp_path / "small_cnn"
  logs.mkdir()
  for seed in range(10):  # seed s: every round at 60 + s
    _hydra_log(logs / f"multihead_seed{seed}.jsonl", [60.0 + seed] * 6)
    _hydra_log(logs / f"splitfedv1_seed{seed}.jsonl", [70.0 + seed] * 6)
  first = parse.parse(str(tmp_path), "small_cnn", seeds=parse.seed_set("0-4"))
  assert first["cells"]["multihead"]["seeds"] == [0, 1, 2, 3, 4]
  assert first["cells"]["multihead"]["accuracy"]["median"] == 62.0
  every = parse.parse(str(tmp_path), "small_cnn", seeds=None, cells=["splitfedv1"])
  assert list(every["cells"]) == ["splitfedv1"]
  assert every["cells"]["splitfedv1"]["accuracy"]["median"] == 74.5
  assert parse.seed_set("1,3") == {1, 3}
  with pytest.raises(ValueError, match="allowed: a range A-B"):
    parse.seed_set("x")
  out = tmp_path / "ref.csv"
  assert parse.main([str(tmp_path), "--seeds", "5-9", "--csv", str(out)]) == 0
  lines = out.read_text().splitlines()
  assert "seeds 5, 6, 7, 8, 9." in lines[0]
  assert "multihead,,,,67.00,1.41" in lines and "splitfedv1,,,,77.00,1.41" in lines
  assert parse.main([str(tmp_path), "--seeds", "nine"]) == 2


def test_hydra_orderings_flag_a_flipped_pair(tmp_path, capsys):
  orderings = _load_hydra("orderings")
  head = ("method.name,method.order,method.batches_per_turn,method.groups,"
          "accuracy_median,reference,reference_std\n")
  rows = ["sfl,cyclic,1,-,77.0,77.2,0.4", "hydra,cyclic,1,0,74.1,74.4,0.5",
          "multihead,cyclic,1,-,74.5,74.3,3.0"]  # within multihead's spread: not checked
  good = tmp_path / "good.csv"
  good.write_text(head + "\n".join(rows) + "\n")
  assert orderings.main([str(good)]) == 0
  assert "1 separated pairs, 0 flipped" in capsys.readouterr().out
  bad = tmp_path / "bad.csv"
  bad.write_text(head + "\n".join([rows[0], "hydra,cyclic,1,0,78.0,74.4,0.5"]) + "\n")
  assert orderings.main([str(bad)]) == 1
  assert "FLIP" in capsys.readouterr().out


def test_trace_compare_scales_by_the_step_and_skips_still_tensors(tmp_path, capsys):
  tc = _load_hydra("trace_compare")
  init = {"init:4/conv/kernel": np.zeros((2, 2)), "init:4/norm/norm/mean": np.ones(3)}
  ref = {"k1:4/conv/kernel": np.full((2, 2), 2.0), "k1:4/norm/norm/mean": np.ones(3)}
  other = {"k1:4/conv/kernel": np.full((2, 2), 2.0) + np.eye(2) * 1e-3,
           "k1:4/norm/norm/mean": np.full(3, 5.0)}
  np.savez(tmp_path / "ref.npz", steps=np.array([1]), **init, **ref)
  np.savez(tmp_path / "other.npz", **other)
  out = tmp_path / "trace.json"
  tc.main([str(out), f"a={tmp_path / 'ref.npz'}", f"b={tmp_path / 'other.npz'}"])
  got = json.loads(out.read_text())
  row = got["pairs"]["b"]["step 1"]
  # the kernel moved by |2 * ones(2, 2)| = 4 and differs by sqrt(2) * 1e-3;
  # the mean did not move in the reference, so it is left out
  assert row["tensors"] == 1
  assert row["median"] == pytest.approx(np.sqrt(2) * 1e-3 / 4.0)
  assert row["of_value_max"] == pytest.approx(np.sqrt(2) * 1e-3 / 4.0)  # |2 * ones| = 4 too
  assert got["reference"] == "a" and got["steps"] == [1]
  assert "step 1" in capsys.readouterr().out


def test_seed_test_matches_cells_and_tells_separated_seeds(tmp_path, capsys):
  st = _load_hydra("seed_test")
  seeds = tmp_path / "report_seeds.csv"
  with open(seeds, "w") as f:
    f.write("method.name,method.order,method.batches_per_turn,method.groups,run,seed,accuracy\n")
    for s in range(5):
      f.write(f"sfl,cyclic,1,-,r,{s},{60 + s}\n")     # far above theirs
      f.write(f"multihead,cyclic,1,-,r,{s},{20 + s}\n")  # the same as theirs
  runs = [{"cell": c, "seed": s, "final": {"accuracy": a}}
          for s in range(5) for c, a in (("sfl_cyclic", 40 + s), ("multihead", 20 + s))]
  cells = {"sfl_cyclic": {"config": {"method.name": "sfl", "method.order": "cyclic",
                                     "method.batches_per_turn": 1, "method.groups": ""}},
           "multihead": {"config": {"method.name": "multihead", "method.order": "",
                                    "method.batches_per_turn": "", "method.groups": ""}}}
  theirs = tmp_path / "authors.json"
  theirs.write_text(json.dumps({"runs": runs, "cells": cells}))
  out = tmp_path / "test.json"
  st.main(["--jsfl", str(seeds), "--authors", str(theirs), "--out", str(out)])
  rows = {r["cell"]["method.name"]: r for r in json.loads(out.read_text())}
  assert rows["sfl"]["gap"] == 20.0 and rows["sfl"]["p"] < 0.05
  # their baseline leaves the order empty: it still pairs with jsfl's cyclic row
  assert rows["multihead"]["gap"] == 0.0 and rows["multihead"]["p"] == 1.0
  assert "multihead" in capsys.readouterr().out
