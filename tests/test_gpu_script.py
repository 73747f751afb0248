"""``benchmarks/gpu.sh --smoke``: the accelerator benchmark command runs end
to end at toy sizes on the CPU and leaves one JSON per part it ran."""

import json
import os
import pathlib
import subprocess
import sys
import tarfile

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


# One call per part (as on a time-limited GPU machine), so the test runner
# spreads them over its workers.  The parts the next lease runs (fill,
# paper_run; vs_authors below) run in CI; the others, measured on a GPU
# already or not planned, in the slow suite (`make test-slow` before a lease
# that runs them).
@pytest.mark.parametrize("part", ["fill", "paper_run",
                                  pytest.param("seed_kernels", marks=pytest.mark.slow),
                                  pytest.param("profile_run", marks=pytest.mark.slow),
                                  pytest.param("throughput", marks=pytest.mark.slow),
                                  pytest.param("scaling", marks=pytest.mark.slow),
                                  pytest.param("sweep", marks=pytest.mark.slow),
                                  "vs_torch_resnet18"])
def test_gpu_script_smoke(tmp_path, part):
  env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path), "LIMIT": "300",
         "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--smoke", part],
                        env=env, capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  names = sorted(p.name for p in tmp_path.glob("*.json"))
  for p in tmp_path.glob("*.json"):
    res = json.loads(p.read_text())
    assert res["machine"]["backend"] == "cpu"
    # the scripts turn a failing cell into a row and go on (a GPU out of
    # memory must not end a lease): at toy sizes no cell may fail
    assert not list(_failures(res)), (p.name, list(_failures(res))[:3])
    rates = list(_values(res, "samples_per_s"))
    assert all(r > 0 for r in rates), (p.name, rates)
  # A finished run leaves its results, not the per-row file a time limit would.
  assert not any(n.endswith("-partial.json") for n in names), names
  if part == "vs_torch_resnet18":
    vs = (tmp_path / "vs_torch_resnet18.log").read_text()
    assert "skipped (torch is not installed)" in vs or any(
        n.startswith("vs_torch-") for n in names), vs[-2000:]
  else:
    assert any(n.startswith(f"{part}-") for n in names), names
  if part == "profile_run":  # the traced round read, its trace kept beside the JSON
    (res,) = [json.loads(p.read_text()) for p in tmp_path.glob("profile_run-*.json")]
    assert res["profiled_rounds"] == [2, 2] and res["round_program_ms"] > 0
    assert res["trace"]["window_ms_per_round"] >= res["round_program_ms"]
    assert (tmp_path / res["trace"]["file"]).stat().st_size > 0
  if part == "paper_run":  # the program ran to its end, its records in the tar
    (res,) = [json.loads(p.read_text()) for p in tmp_path.glob("paper_run-*.json")]
    (prog,) = res["programs"]
    assert prog["exit"] == 0 and not prog["stopped_at_deadline"], prog
    (cell,) = prog["cells"].values()
    assert cell["finished"] and cell["rounds_evaluated"] == cell["rounds"] == 3, cell
    assert cell["seeds"] == 2 and cell["round_s_median"] > 0 and cell["samples_per_s"] > 0
    with tarfile.open(tmp_path / res["records"]["file"]) as tar:
      names = sorted(tar.getnames())
    cell_dir = "fashion_mnist/method=fedseq,partition.alpha=0.5"
    assert names == [f"{cell_dir}/{f}" for f in (".done", "config.json", "metrics.jsonl.gz",
                                                 "partition.json.gz", "sessions.jsonl",
                                                 "summary.json")], names
  if part == "fill":  # every cell traced one more round, its trace kept and read
    (res,) = [json.loads(p.read_text()) for p in tmp_path.glob("fill-cpu-*.json")]
    assert {r["lowering"] for r in res["rows"]} == {"old", "bf16", "graphs"}
    with tarfile.open(tmp_path / "fill-traces.tar") as tar:
      members = set(tar.getnames())
    for row in res["rows"]:
      assert row["trace"]["rounds"] == 1 and row["trace"]["lanes"], row.get("error")
      archive, member = row["trace"]["file"].split(":")
      assert archive == "fill-traces.tar" and member in members
    assert not list(tmp_path.glob(".*.trace.json.gz"))  # archived, not left beside


def _failures(obj):
  """Every ``error`` entry of a result file, at any depth."""
  if isinstance(obj, dict):
    if obj.get("error"):
      yield obj["error"]
    for v in obj.values():
      yield from _failures(v)
  elif isinstance(obj, list):
    for v in obj:
      yield from _failures(v)


def _values(obj, key):
  """Every number stored under ``key`` in a result file, at any depth."""
  if isinstance(obj, dict):
    for k, v in obj.items():
      if k == key and isinstance(v, (int, float)):
        yield v
      else:
        yield from _values(v, key)
  elif isinstance(obj, list):
    for v in obj:
      yield from _values(v, key)


def test_gpu_script_rejects_unknown_part(tmp_path):
  env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
  proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--smoke", "warp"],
                        env=env, capture_output=True, text=True, timeout=60, check=False)
  assert proc.returncode == 2
  assert "unknown part 'warp'; allowed:" in proc.stderr


def _authors_python() -> str:
  """The authors' side's Python: $PY, else the venv of
  experiments/hydra/authors_code/README.md's recipe, else python3."""
  venv = pathlib.Path("/work/authors/venv/bin/python")
  return os.environ.get("PY") or (str(venv) if venv.exists() else "python3")


def test_gpu_script_vs_authors_smoke(tmp_path):
  """Their scripts (the adapted clone in .gpu_carry) and jsfl on the
  small-CNN and MobileNetV1 cells, 1 round, 1 seed each, on the CPU."""
  carry = ROOT / ".gpu_carry"
  if not (carry / "Hydra/.jsfl_adapted").is_file() or not (carry / "fmnist").is_dir():
    pytest.skip("needs .gpu_carry/Hydra (the authors' adapted clone) and .gpu_carry/fmnist "
                "(benchmarks/README.md, \"The authors' code on a GPU\")")
  py = _authors_python()
  if subprocess.run([py, "-c", "import torch"], capture_output=True, check=False).returncode:
    pytest.skip(f"needs torch in the authors' Python ({py}; set PY)")
  env = {**os.environ, "PYTHON": sys.executable, "PY": py, "OUT": str(tmp_path),
         "LIMIT": "400", "JAX_PLATFORMS": "cpu"}
  proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--smoke", "vs_authors"],
                        env=env, capture_output=True, text=True, timeout=900, check=False)
  assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
  for model in ("small_cnn", "mobilenet"):
    (path,) = tmp_path.glob(f"hydra_vs_authors-{model}-*.json")
    res = json.loads(path.read_text())
    assert res["finished"] and res["machine"]["backend"] == "cpu", res["machine"]
    assert pathlib.Path(res["args"]["data_dir"]).resolve() == (carry / "fmnist").resolve()
    assert {r["side"] for r in res["rows"]} == {"authors", "jsfl"}
    (cell,) = res["summary"]
    assert cell["cell"] == "sfl_cyclic"
    assert min(cell["seed_runs_per_hour"].values()) > 0
    assert cell["seed_runs_per_hour_ratio"] > 0


def test_gpu_script_vs_authors_without_carry(tmp_path):
  """Without the clone: the smoke form skips, the GPU form stops before any
  work and names what to carry."""
  env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path),
         "CLONE": str(tmp_path / "none"), "FMNIST_DIR": str(tmp_path / "none"),
         "PY": sys.executable}
  gpu = ["bash", str(ROOT / "benchmarks/gpu.sh")]
  smoke = subprocess.run([*gpu, "--smoke", "vs_authors"], env=env, capture_output=True,
                         text=True, timeout=120, check=False)
  assert smoke.returncode == 0, smoke.stderr[-2000:]
  assert "vs_authors: skipped (missing: their adapted clone" in smoke.stdout
  full = subprocess.run([*gpu, "vs_authors"], env=env, capture_output=True, text=True,
                        timeout=120, check=False)
  assert full.returncode == 2
  assert "carry .gpu_carry" in full.stderr


def test_fill_rejects_a_bad_cell_before_anything_runs(tmp_path):
  proc = subprocess.run([sys.executable, str(ROOT / "benchmarks/fill.py"), "--cells",
                         "mobilenet_v1:16:new", "resnet18:8:graph", "--out", str(tmp_path)],
                        capture_output=True, text=True, timeout=60, check=False)
  assert proc.returncode == 2
  (line,) = [x for x in proc.stderr.splitlines() if "error:" in x]
  assert "'resnet18:8:graph'" in line and "graphs" in line, line
  assert not list(tmp_path.iterdir())
