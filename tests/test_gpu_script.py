"""``benchmarks/gpu.sh --smoke``: the accelerator benchmark command runs end
to end at toy sizes on the CPU and leaves one JSON per part it ran."""

import json
import os
import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]


# One call per part (as on a time-limited GPU machine), so the test runner
# spreads them over its workers.
@pytest.mark.parametrize("part", ["fill", "seed_kernels", "throughput", "scaling", "sweep",
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
  # A finished run leaves its results, not the per-row file a time limit would.
  assert not any(n.endswith("-partial.json") for n in names), names
  if part == "vs_torch_resnet18":
    vs = (tmp_path / "vs_torch_resnet18.log").read_text()
    assert "skipped (torch is not installed)" in vs or any(
        n.startswith("vs_torch-") for n in names), vs[-2000:]
  else:
    assert any(n.startswith(f"{part}-") for n in names), names


def test_gpu_script_rejects_unknown_part(tmp_path):
  env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path)}
  proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu.sh"), "--smoke", "warp"],
                        env=env, capture_output=True, text=True, timeout=60, check=False)
  assert proc.returncode == 2
  assert "unknown part 'warp'; allowed:" in proc.stderr
