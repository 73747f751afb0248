"""Device meshes: spec parsing, config errors, and results on an 8-device
(simulated CPU) mesh equal to the one-device run."""

import json
import os
import subprocess
import sys

import pytest
from conftest import xla_flags

from jsfl import cli
from jsfl.core import sharding

HERE = os.path.dirname(__file__)


def test_mesh_spec_parsing_and_errors():
  assert sharding.parse_mesh_spec("auto") is None
  assert sharding.parse_mesh_spec("seeds=4, clients=2") == {"seeds": 4, "clients": 2}
  for bad, msg in (("seeds=0", "allowed: an int >= 1"), ("gpus=2", "bad entry"),
                   ("seeds", "bad entry"), ("seeds=x", "allowed: an int >= 1")):
    with pytest.raises(ValueError, match=msg):
      sharding.parse_mesh_spec(bad)


@pytest.mark.parametrize("devices,seeds,n,shape", [
    (8, 8, 10, (8, 1)), (8, 2, 4, (2, 4)), (8, 3, 10, (1, 2)), (1, 10, 10, (1, 1)),
    (8, 1, 100, (1, 4))])
def test_auto_mesh_uses_the_devices_that_divide(devices, seeds, n, shape):
  assert sharding.mesh_shape("auto", devices, seeds, n) == shape


@pytest.mark.parametrize("spec,msg", [
    ("seeds=16", "needs 16 devices"), ("seeds=3", "does not divide run.seeds"),
    ("clients=3", "does not divide the 4 clients")])
def test_explicit_mesh_is_checked(spec, msg):
  with pytest.raises(ValueError, match=msg):
    sharding.mesh_shape(spec, 8, 4, 4)


def test_bad_mesh_is_a_config_error_before_anything_is_written(tmp_path, capsys):
  out = tmp_path / "r"
  code = cli.main(["run", "dataset.name=synthetic", "dataset.train_size=200",
                   "dataset.test_size=50", "exec.mesh=seeds=2,clients=2", f"run.dir={out}"])
  assert code == 2
  assert "exec.mesh" in capsys.readouterr().err
  assert not out.exists()


# One process per method, so the test runner spreads them over its workers.
# One method per engine in CI: FedSeq's sequential engine is SFedKD's, Hydra's
# split engine SFL's (constrain_clients lays every engine's client axis
# alike), so those two run in the slow suite.
@pytest.mark.parametrize("method", ["sfl", pytest.param("hydra", marks=pytest.mark.slow),
                                    "multisfl", pytest.param("fedseq", marks=pytest.mark.slow),
                                    "sfedkd"])
def test_eight_device_mesh_equals_one_device(method):
  """SFL, Hydra, MultiSFL and the sequential methods (FedSeq, SFedKD) on a
  2 (seeds) x 4 (clients) mesh of simulated devices, against one device."""
  env = {**os.environ, "XLA_FLAGS": xla_flags(8)}
  methods = [method]
  proc = subprocess.run([sys.executable, os.path.join(HERE, "sharding_check.py"), *methods],
                        env=env, capture_output=True, text=True, timeout=900)
  assert proc.returncode == 0, proc.stderr[-3000:]
  rows = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
  assert [r["method"] for r in rows] == methods
  for r in rows:
    assert r["devices"] == 8
    assert r["mesh"] == {"seeds": 2, "clients": 4}, r
    assert any("'seeds'" in s for s in r["state_specs"]), r  # state stays seed-sharded
    assert r["max_diff"] < 1e-4, r
