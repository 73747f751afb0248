"""The measuring scripts of experiments/sequential/ run against the library
as it is (each on a tiny synthetic config, one or two rounds)."""

import json
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SEQ = os.path.join(REPO, "experiments", "sequential")
SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=160", "dataset.test_size=40", "model.width=4", "model.hidden=16",
       "partition.num_clients=4", "method.batch_size=16", "method.clients_per_round=4"]


def _run(script, *args):
  p = subprocess.run([sys.executable, os.path.join(SEQ, script), "", *SYN, *args],
                     capture_output=True, text=True, cwd=REPO, check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  return p.stdout


def test_time_rounds_prints_a_round_time_per_method():
  out = _run("time_rounds.py", "--methods", "fedseq", "--rounds", "1")
  lines = [ln for ln in out.splitlines() if "round" in ln]
  assert [ln.split()[0] for ln in lines] == ["fedseq"] and "seeds=1" in lines[0]


def test_grad_norms_counts_the_steps_a_bound_would_clip(tmp_path):
  out = _run("grad_norms.py", "method.name=sfedkd", "method.num_teachers=2", "run.seeds=2",
             "--rounds", "2", "--bounds", "0,1e9", "--out", str(tmp_path))
  (name,) = os.listdir(tmp_path)
  assert name.startswith("grad_norms-sfedkd-") and f"wrote {tmp_path}" in out
  with open(tmp_path / name) as f:
    res = json.load(f)
  assert res["seeds"] == 2 and res["rounds"] == 2 and res["clip_norm"] is None
  # every norm is above 0 and none above 1e9
  assert res["steps"] > 0 and res["above"] == {"0": res["steps"], "1e+09": 0}
  q = res["quantiles"]
  assert 0 < q["0.5"] <= q["0.9"] <= q["0.99"] <= res["max"]
  assert res["machine"]["backend"] == "cpu"
