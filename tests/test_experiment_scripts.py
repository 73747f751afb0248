"""The measuring scripts run against the library as it is: those of
experiments/sequential/ on a tiny synthetic config (one or two rounds),
experiments/multisfl/cap_rule.py on a few seeds, and every jsfl import of
every script in benchmarks/ and experiments/ resolves."""

import ast
import importlib
import json
import os
import subprocess
import sys

import pytest

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


def test_a_branch_without_changes_retrains_the_rounds_the_run_trained(tmp_path):
  """branch.py: a run branched at its round-2 checkpoint with no value changed
  retrains rounds 3-4 to the very records the run wrote (the keys are the
  seed's and round's), and compare reads the branch seed by seed."""
  run, branch = str(tmp_path / "run"), str(tmp_path / "branch")
  jsfl = [sys.executable, "-m", "jsfl", "run"]
  p = subprocess.run([*jsfl, *SYN, "method.name=fedseq", "run.rounds=4", "run.seeds=2",
                      "run.checkpoint_every=2", "exec.progress=false", f"run.dir={run}"],
                     capture_output=True, text=True, cwd=tmp_path, check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  script = os.path.join(SEQ, "branch.py")
  p = subprocess.run([sys.executable, script, "make", run, branch, "--at", "2",
                      "--rounds", "4", "run.eval_every=1"],
                     capture_output=True, text=True, check=False)
  assert p.returncode == 0, p.stderr
  p = subprocess.run([*jsfl[:-1], "run", "--resume", branch], capture_output=True, text=True,
                     cwd=tmp_path, check=False)
  assert p.returncode == 0, p.stderr[-2000:]

  def records(d):
    with open(os.path.join(d, "metrics.jsonl")) as f:
      return [{k: v for k, v in json.loads(line).items() if k != "wall_s"} for line in f]
  assert records(branch) == records(run) and len(records(run)) == 8

  def run_id(d):  # a tracker continues a run by it: the branch is another run
    with open(os.path.join(d, "config.json")) as f:
      return json.load(f)["run_id"]
  assert run_id(branch) != run_id(run)

  def sessions(d):  # which code wrote which rounds: the run's session, then the branch's
    with open(os.path.join(d, "sessions.jsonl")) as f:
      return [json.loads(line)["from_round"] for line in f]
  assert sessions(run) == [1] and sessions(branch) == [1, 3]
  p = subprocess.run([sys.executable, script, "compare", branch, run, "--from", "2"],
                     capture_output=True, text=True, check=False)
  assert p.returncode == 0, p.stderr
  assert "rounds 3-4, per seed: +0.0 +0.0; behind in 0 of 2, median +0.00" in p.stdout
  p = subprocess.run([sys.executable, script, "make", run, str(tmp_path / "b2"), "--at", "3"],
                     capture_output=True, text=True, check=False)
  assert p.returncode == 2 and "no checkpoint of round 3" in p.stderr
  assert not os.path.exists(tmp_path / "b2")


def _scripts():
  """Every measuring script of benchmarks/ and experiments/ (not the
  authors' adapted code, which imports no jsfl)."""
  out = []
  for top in ("benchmarks", "experiments"):
    for root, dirs, files in os.walk(os.path.join(REPO, top)):
      dirs[:] = sorted(d for d in dirs if d != "authors_code" and not d.startswith("."))
      out += [os.path.join(root, f) for f in sorted(files) if f.endswith(".py")]
  return out


def _jsfl_imports(path):
  """``(line, module, name or None)`` of every jsfl import in the file,
  function-level ones too (the scripts import jsfl lazily, so ``--help``
  would not reach them)."""
  with open(path) as f:
    tree = ast.parse(f.read(), path)
  for node in ast.walk(tree):
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
        and node.module.split(".")[0] == "jsfl":
      for alias in node.names:
        yield node.lineno, node.module, alias.name
    elif isinstance(node, ast.Import):
      for alias in node.names:
        if alias.name.split(".")[0] == "jsfl":
          yield node.lineno, alias.name, None


def test_every_script_imports_names_the_library_has():
  # A script no test runs rots silently when the library moves a module
  # (time_rounds.py imported a runner module that had gone): every jsfl name any of
  # them imports must resolve.
  scripts = _scripts()
  assert len(scripts) > 20
  missing = []
  for path in scripts:
    for line, module, name in _jsfl_imports(path):
      where = f"{os.path.relpath(path, REPO)}:{line}"
      try:
        mod = importlib.import_module(module)
      except ImportError as e:
        missing.append(f"{where}: {module} ({e})")
        continue
      if name is None or hasattr(mod, name):
        continue
      try:
        importlib.import_module(f"{module}.{name}")
      except ImportError:
        missing.append(f"{where}: {module}.{name}")
  assert not missing, "\n".join(missing)


def test_the_import_check_sees_function_level_imports(tmp_path):
  # Modules the library lacks, spelt so that test_references does not read
  # them as references of this file.
  gone, nowhere = "jsfl" + ".runner", "jsfl" + ".nowhere"
  script = tmp_path / "s.py"
  script.write_text(f"def main():\n  from {gone} import run\n  import {nowhere}\n")
  assert list(_jsfl_imports(str(script))) == [(2, gone, "run"), (3, nowhere, None)]


@pytest.mark.skipif(not os.path.isdir("/usr/share/datasets/fashion-mnist"),
                    reason="dataset-fashion-mnist is not installed")
def test_cap_rule_counts_the_samples_the_two_rules_move(tmp_path):
  script = os.path.join(REPO, "experiments", "multisfl", "cap_rule.py")
  p = subprocess.run([sys.executable, script, "--seeds", "4", "--alphas", "0.5",
                      "--out", str(tmp_path)], capture_output=True, text=True, cwd=REPO,
                     check=False)
  assert p.returncode == 0, p.stderr[-2000:]
  (name,) = os.listdir(tmp_path)
  with open(tmp_path / name) as f:
    (row,) = json.load(f)["rows"]
  assert row["seeds"] == 4 and len(row["moved_per_seed"]) == 4 and row["samples"] == 60000
  assert row["seeds_differing"] == sum(m > 0 for m in row["moved_per_seed"])
  assert "alpha 0.5: " in p.stdout
