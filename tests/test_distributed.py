"""Multi-host: two local processes (2 simulated CPU devices each) run one
program over a 4-device mesh; they agree, only process 0 writes, and the
result equals the single-process run."""

import os
import re
import socket
import subprocess
import sys

import numpy as np
import pytest
from conftest import xla_flags

from jsfl.rundir import read_metrics

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=240", "dataset.test_size=40", "model.width=4", "model.hidden=16",
       "run.rounds=2", "run.seeds=2", "partition.num_clients=8",
       "method.clients_per_round=4", "method.batch_size=16", "run.checkpoint_every=0"]


def _free_port() -> int:
  with socket.socket() as s:
    s.bind(("localhost", 0))
    return s.getsockname()[1]


def _env(devices: int):
  return {**os.environ, "XLA_FLAGS": xla_flags(devices),
          "JAX_PLATFORMS": "cpu"}


def test_two_processes_agree_and_only_process_0_writes(tmp_path):
  port = _free_port()
  out = tmp_path / "runs"
  cmd = [sys.executable, "-m", "jsfl", "run", *SYN, f"run.out_dir={out}", "run.name=dist",
         "--quiet", "--distributed", "--coordinator", f"localhost:{port}",
         "--num-processes", "2"]
  procs = [subprocess.Popen(cmd + ["--process-id", str(i)], env=_env(2),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
           for i in range(2)]
  outs = [p.communicate(timeout=600) for p in procs]
  for p, (o, e) in zip(procs, outs):
    assert p.returncode == 0, e[-3000:]
  finals = [re.search(r"jsfl: process (\d)/2 finished: (.*)", e).groups() for _, e in outs]
  assert [f[0] for f in finals] == ["0", "1"]
  assert finals[0][1] == finals[1][1]  # same accuracies on both processes
  runs = os.listdir(out)
  assert len(runs) == 1  # process 1 wrote nothing
  run_dir = out / runs[0]
  import json
  cfg = json.load(open(run_dir / "config.json"))
  assert cfg["resolved"]["processes"] == 2
  assert cfg["resolved"]["mesh"] == {"seeds": 2, "clients": 2}

  single = tmp_path / "single"
  proc = subprocess.run([sys.executable, "-m", "jsfl", "run", *SYN, f"run.dir={single}",
                         "--quiet"], env=_env(1), capture_output=True, text=True, timeout=600)
  assert proc.returncode == 0, proc.stderr[-3000:]
  a = read_metrics(run_dir / "metrics.jsonl")
  b = read_metrics(single / "metrics.jsonl")
  assert [(r["round"], r["seed"]) for r in a] == [(r["round"], r["seed"]) for r in b]
  for ra, rb in zip(a, b):
    np.testing.assert_allclose(ra["accuracy"], rb["accuracy"], atol=1e-3)
    np.testing.assert_allclose(ra["train_loss"], rb["train_loss"], rtol=1e-4)


@pytest.mark.parametrize("flags, env, needle", [
    (["--coordinator", "nohostport", "--num-processes", "2", "--process-id", "0"], {},
     "--coordinator='nohostport'"),
    (["--coordinator", "h:99999", "--num-processes", "2", "--process-id", "0"], {},
     "--coordinator='h:99999'"),
    (["--num-processes", "0"], {}, "--num-processes=0"),
    (["--num-processes", "2", "--process-id", "2"], {}, "--process-id=2"),
    ([], {"JSFL_NUM_PROCESSES": "abc"}, "$JSFL_NUM_PROCESSES='abc'"),
    ([], {"JSFL_PROCESS_ID": "1.5"}, "$JSFL_PROCESS_ID='1.5'"),
])
def test_bad_distributed_arguments_are_one_line_before_jax_starts(flags, env, needle, tmp_path,
                                                                  monkeypatch, capsys):
  from jsfl import cli
  for k, v in env.items():
    monkeypatch.setenv(k, v)
  monkeypatch.chdir(tmp_path)
  assert cli.main(["run", "--distributed", *flags, *SYN]) == 2
  err = capsys.readouterr().err.splitlines()
  assert len(err) == 1 and err[0].startswith("jsfl: error: ") and needle in err[0], err
  assert "allowed:" in err[0] and os.listdir(tmp_path) == []


def test_no_cluster_to_join_is_one_line_naming_the_flags(tmp_path):
  env = {k: v for k, v in _env(1).items() if not k.startswith(("JSFL_", "SLURM_", "OMPI_"))}
  proc = subprocess.run([sys.executable, "-m", "jsfl", "run", "--distributed", "--num-processes",
                         "2", "--process-id", "0", *SYN], env=env, cwd=tmp_path,
                        capture_output=True, text=True, timeout=120, check=False)
  assert proc.returncode == 2, proc.stderr
  line, = proc.stderr.splitlines()
  assert line.startswith("jsfl: error: jax.distributed.initialize: ") and "--coordinator" in line
  assert os.listdir(tmp_path) == []
