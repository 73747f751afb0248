"""Faults during and around a run: a second writer, damaged checkpoints, an
edited config.json, divergence, a full disk.  Each ends in one line and exit 2,
keeps what the run had written, and never leaves a half-written file."""

from __future__ import annotations

import errno
import json
import os
import shutil
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from jsfl import checkpoint, cli, rundir
from jsfl.train import programs
from jsfl.train.programs import build_programs

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=160", "dataset.test_size=40", "model.width=4", "model.hidden=16",
       "partition.num_clients=4", "method.batch_size=16", "exec.progress=false"]


def _read(path):
  with open(path) as f:
    return f.read()


def _records(out):
  return [{k: v for k, v in r.items() if k != "wall_s"}
          for r in rundir.read_metrics(f"{out}/metrics.jsonl")]


def _edit_config(out, **changes):
  """Edits config.json as a user would: ``section__key=value``."""
  path = f"{out}/config.json"
  with open(path) as f:
    meta = json.load(f)
  for k, v in changes.items():
    section, key = k.split("__")
    meta["config"][section][key] = v
  with open(path, "w") as f:
    json.dump(meta, f)


def _one_error_line(capsys):
  err = capsys.readouterr().err
  lines = err.splitlines()
  assert len(lines) == 1 and lines[0].startswith("jsfl: error: "), err
  assert "Traceback" not in err
  return lines[0]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  """A 4-round run (checkpoint every round, so rounds 3 and 4 are kept) and
  an uninterrupted 6-round reference of the same config."""
  root = tmp_path_factory.mktemp("faults")
  four, six = str(root / "four"), str(root / "six")
  assert cli.main(["run", *SYN, "run.rounds=4", "run.checkpoint_every=1",
                   f"run.dir={four}", "--quiet"]) == 0
  assert cli.main(["run", *SYN, "run.rounds=6", "run.checkpoint_every=1",
                   f"run.dir={six}", "--quiet"]) == 0
  return {"four": four, "six": six}


@pytest.fixture
def run4(runs, tmp_path):
  """A copy of the 4-round run whose config.json now asks for 6 rounds: an
  unfinished run to resume."""
  out = str(tmp_path / "run")
  shutil.copytree(runs["four"], out)
  _edit_config(out, run__rounds=6)
  return out


def _damage(step_dir, part):
  """Overwrites every file under ``step_dir/part`` with bytes of its length."""
  for base, _, files in os.walk(os.path.join(step_dir, part)):
    for n in files:
      p = os.path.join(base, n)
      size = max(os.path.getsize(p), 16)
      with open(p, "wb") as f:
        f.write(b"\xde\xad" * (size // 2))


@pytest.mark.parametrize("part", ["state", "host"])
def test_resume_falls_back_to_the_newest_checkpoint_that_restores(run4, runs, part, capsys):
  _damage(f"{run4}/checkpoints/4", part)
  assert cli.main(["run", "--resume", run4, "--quiet"]) == 0
  err = capsys.readouterr().err
  assert f"checkpoint {run4}/checkpoints/4 does not restore" in err
  assert "resuming from checkpoint 3 instead" in err
  assert _records(run4) == _records(runs["six"])  # round 4 trained again, bit for bit
  assert sorted(int(n) for n in os.listdir(f"{run4}/checkpoints") if n.isdigit()) == [5, 6]


def test_no_checkpoint_restores_is_one_line_and_touches_nothing(run4, capsys):
  for step in ("3", "4"):
    _damage(f"{run4}/checkpoints/{step}", "state")
  before = {n: _read(f"{run4}/{n}") for n in ("metrics.jsonl", "summary.json")}
  assert cli.main(["run", "--resume", run4, "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert f"no checkpoint in {run4}/checkpoints restores" in line
  assert f"remove {run4}/checkpoints" in line
  assert {n: _read(f"{run4}/{n}") for n in before} == before
  assert not os.path.exists(f"{run4}/{rundir.RunLock.NAME}")


@pytest.mark.parametrize("edit, message", [
    ({"model__width": 8}, "has shape"),
    ({"method__name": "fedavg"}, "another state structure"),
    ({"run__seeds": 2}, "is of seeds [0], the run's config.json has [0, 1]"),
    ({"optim__lr": -0.5}, "optim.lr=-0.5; allowed: a float > 0"),
    ({"method__order": "sideways"}, "method.order='sideways'"),
])
def test_an_edited_config_is_checked_before_anything_is_touched(run4, edit, message, capsys):
  _edit_config(run4, **edit)
  before = {n: _read(f"{run4}/{n}") for n in ("metrics.jsonl", "summary.json")}
  steps = sorted(os.listdir(f"{run4}/checkpoints"))
  assert cli.main(["run", "--resume", run4, "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert message in line, line
  assert {n: _read(f"{run4}/{n}") for n in before} == before
  assert sorted(os.listdir(f"{run4}/checkpoints")) == steps


def test_a_second_writer_is_refused_with_the_holders_pid(run4, tmp_path, capsys):
  """Another process holds the run (as a running jsfl run would): both a
  second --resume and a new run into the same directory are refused."""
  ready = tmp_path / "ready"
  holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
      import time
      from jsfl import rundir
      rundir.RunLock({run4!r}).acquire()
      open({str(ready)!r}, "w").close()
      time.sleep(120)
  """)])
  try:
    deadline = time.time() + 60
    while not ready.exists():
      assert holder.poll() is None and time.time() < deadline
      time.sleep(0.05)
    before = _read(f"{run4}/metrics.jsonl")
    assert cli.main(["run", "--resume", run4, "--quiet"]) == 2
    line = _one_error_line(capsys)
    assert f"run directory {run4!r} is in use by process {holder.pid}" in line
    assert _read(f"{run4}/metrics.jsonl") == before
  finally:
    holder.kill()
    holder.wait()
  # the kernel frees the lock of a killed holder: the run resumes at once
  assert cli.main(["run", "--resume", run4, "--quiet"]) == 0


def _fake_divergence(monkeypatch, seed_index, from_call):
  """Marks one seed's round as non-finite from the ``from_call``-th round
  program call on, as if its loss had become NaN (a real NaN in one seed
  only is hard to provoke reliably)."""
  build = build_programs

  def patched(exp, mesh=None):
    init, rnd, ev = build(exp, mesh)
    calls = [0]

    def rnd_(state, *args):
      state, m = rnd(state, *args)
      calls[0] += 1
      if calls[0] >= from_call:
        m = {**m, "finite": m["finite"].at[seed_index].set(False)}
      return state, m
    return init, rnd_, ev
  monkeypatch.setattr(programs, "build_programs", patched)


def test_a_diverged_seed_stops_and_the_others_go_on(tmp_path, monkeypatch, capsys):
  out = str(tmp_path / "r")
  _fake_divergence(monkeypatch, 1, 2)
  assert cli.main(["run", *SYN, "run.rounds=3", "run.seeds=2", f"run.dir={out}",
                   "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert "training diverged: seed 1 at round 2" in line
  assert "the other seeds ran to round 3" in line and f"{out}/summary.json" in line
  recs = rundir.read_metrics(f"{out}/metrics.jsonl")
  assert [(r["round"], r["seed"]) for r in recs] == [(1, 0), (1, 1), (2, 0), (3, 0)]
  summ = json.loads(_read(f"{out}/summary.json"))
  assert summ["diverged"] == [{"seed": 1, "round": 2}]
  assert summ["seeds"] == [0] and summ["accuracy"]["seeds"] == [0]
  for k in ("accuracy", "loss", "pg", "bw"):
    assert set(summ[k]) == {"median", "std", "per_seed", "seeds"}
  # the report leaves the diverged seed out and says so
  from jsfl import report
  rep = report.build_report([out])
  assert any("seed 1 diverged at round 2" in p for p in rep.problems)
  assert [r.seeds for r in rep.rows] == [1]
  assert [d["seed"] for r in rep.rows for d in r.per_seed] == [0]
  # a resumed (extended) run remembers which seed diverged
  monkeypatch.undo()
  _edit_config(out, run__rounds=4)
  assert cli.main(["run", "--resume", out, "--quiet"]) == 2
  assert "seed 1 at round 2" in _one_error_line(capsys)
  recs = rundir.read_metrics(f"{out}/metrics.jsonl")
  assert [(r["round"], r["seed"]) for r in recs][-1] == (4, 0)
  assert all(r["seed"] == 0 for r in recs if r["round"] > 1)


def test_stop_run_ends_the_run_at_the_diverged_round(tmp_path, monkeypatch, capsys):
  out = str(tmp_path / "r")
  _fake_divergence(monkeypatch, 0, 2)
  assert cli.main(["run", *SYN, "run.rounds=4", "run.seeds=2", "run.on_divergence=stop_run",
                   f"run.dir={out}", "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert "seed 0 at round 2" in line and "the run stopped after round 2" in line
  recs = rundir.read_metrics(f"{out}/metrics.jsonl")
  assert [(r["round"], r["seed"]) for r in recs] == [(1, 0), (1, 1), (2, 1)]
  assert checkpoint.latest_round(f"{out}/checkpoints") is None  # no broken state saved


def test_a_huge_learning_rate_is_caught_not_logged_as_a_result(tmp_path, capsys):
  out = str(tmp_path / "r")
  assert cli.main(["run", *SYN, "optim.lr=1e30", "run.rounds=3", "run.seeds=2",
                   f"run.dir={out}", "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert "seed 0 at round 1, seed 1 at round 1" in line and "optim.lr=1e+30" in line
  assert "allowed: a smaller optim.lr, optim.clip_norm > 0 or a stabler" in line
  summ = json.loads(_read(f"{out}/summary.json"))
  assert summ["diverged"] == [{"seed": 0, "round": 1}, {"seed": 1, "round": 1}]
  assert summ["loss"] == {"median": None, "std": None, "per_seed": [], "seeds": []}
  assert os.path.getsize(f"{out}/metrics.jsonl") == 0


def test_a_clipped_run_that_diverges_is_not_told_to_clip(tmp_path, capsys):
  out = str(tmp_path / "r")
  assert cli.main(["run", *SYN, "optim.lr=1e30", "optim.clip_norm=1.0", "run.rounds=2",
                   f"run.dir={out}", "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert "allowed: a smaller optim.lr or a stabler method option" in line


# lr = 100 on the tiny synthetic model: round 1's training loss is ~1e10 but
# finite (accuracy at chance), round 2's is NaN.
@pytest.mark.parametrize("lr, limit, first_recorded", [
    (100.0, None, 0),     # the default bound catches round 1
    (100.0, 0.0, 1),      # the bound off: round 1 is a "result", round 2 non-finite
    (0.05, 1e-3, 0),      # a healthy loss above a bound set that low
])
def test_an_exploding_but_finite_loss_is_divergence_too(tmp_path, capsys, lr, limit,
                                                         first_recorded):
  out = str(tmp_path / "r")
  extra = [] if limit is None else [f"run.divergence_loss={limit}"]
  assert cli.main(["run", *SYN, f"optim.lr={lr}", "run.rounds=2",
                   f"run.dir={out}", "--quiet", *extra]) == 2
  line = _one_error_line(capsys)
  at = first_recorded + 1
  assert f"training diverged: seed 0 at round {at} (" in line
  assert "run.divergence_loss=" in line
  summ = json.loads(_read(f"{out}/summary.json"))
  assert summ["diverged"] == [{"seed": 0, "round": at}]
  recs = rundir.read_metrics(f"{out}/metrics.jsonl")
  assert [r["round"] for r in recs] == [1] * first_recorded
  assert all(np.isfinite(r["train_loss"]) and r["train_loss"] > 1e4 for r in recs)


def test_the_divergence_warning_names_the_exploded_loss(tmp_path, capsys):
  """With progress on, the round's warning says why: the loss and the bound."""
  out = str(tmp_path / "r")
  assert cli.main(["run", *SYN, "optim.lr=100", "run.rounds=1", f"run.dir={out}",
                   "exec.progress=true"]) == 2
  err = capsys.readouterr().err
  assert "diverged at round 1 (training loss" in err and "above run.divergence_loss=10000" \
      in err, err


def test_a_full_disk_during_a_checkpoint_is_one_line_and_resumable(
    tmp_path, monkeypatch, capsys, runs):
  import orbax.checkpoint as ocp
  out = str(tmp_path / "r")
  save = ocp.CheckpointManager.save

  def full(self, step, *args, **kwargs):
    if step == 3:
      raise OSError(errno.ENOSPC, "No space left on device", f"{out}/checkpoints/3")
    return save(self, step, *args, **kwargs)
  monkeypatch.setattr(ocp.CheckpointManager, "save", full)
  assert cli.main(["run", *SYN, "run.rounds=6", "run.checkpoint_every=1",
                   f"run.dir={out}", "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert "checkpoint of round 3 could not be written" in line
  assert "no space left on device" in line and f"jsfl run --resume {out}" in line
  assert checkpoint.latest_round(f"{out}/checkpoints") == 2
  monkeypatch.undo()
  assert cli.main(["run", "--resume", out, "--quiet"]) == 0
  assert _records(out) == _records(runs["six"])


class _Killed(BaseException):
  """A kill that no handler of the run sees (SIGKILL's effect, in process)."""


def test_a_kill_after_the_last_records_before_any_checkpoint_is_resumed(runs, tmp_path,
                                                                        monkeypatch):
  """Killed after writing the last round's records but before its summary
  and checkpoint, in a run too short for an earlier checkpoint: the records
  alone do not make it finished, so --resume trains it again from round 0
  and ends as the uninterrupted run does (it said "finished" and kept a
  summary one round short, and a sweep cell failed on every rerun)."""
  real = rundir.write_json_atomic

  def killing(path, obj):
    if path.endswith("summary.json") and obj.get("rounds_evaluated") == 6:
      raise _Killed
    return real(path, obj)
  out = str(tmp_path / "cut")
  monkeypatch.setattr(rundir, "write_json_atomic", killing)
  with pytest.raises(_Killed):
    cli.main(["run", *SYN, "run.rounds=6", "run.checkpoint_every=10", f"run.dir={out}",
              "--quiet"])
  monkeypatch.setattr(rundir, "write_json_atomic", real)
  assert {r["round"] for r in _records(out)} == set(range(1, 7))
  assert os.listdir(f"{out}/checkpoints") == []
  assert cli.main(["run", "--resume", out, "--quiet"]) == 0
  assert _records(out) == _records(runs["six"])
  summ = json.loads(_read(f"{out}/summary.json"))
  assert summ["rounds_evaluated"] == 6
  assert checkpoint.latest_round(f"{out}/checkpoints") == 6


def test_a_failed_start_leaves_no_directory(tmp_path, monkeypatch, capsys):
  """A fault between creating the run directory and the first record (here a
  full disk writing config.json) removes the directory and the parents made."""
  def full(path, obj):
    raise OSError(errno.ENOSPC, "No space left on device", path)
  monkeypatch.setattr(rundir, "write_json_atomic", full)
  monkeypatch.chdir(tmp_path)
  assert cli.main(["run", *SYN, "run.rounds=1", "run.out_dir=a/b/runs"]) == 2
  assert "No space left on device" in _one_error_line(capsys)
  assert os.listdir(tmp_path) == []


def test_a_run_directory_that_cannot_be_made_leaves_no_parents(tmp_path, monkeypatch,
                                                              capsys):
  """The parents are made, then the run directory itself fails (a full disk,
  a quota): the parents this start made go too, not those that were there."""
  real = os.mkdir

  def mkdir(path, *a, **k):
    if os.path.basename(path).startswith("t-"):
      raise OSError(errno.EDQUOT, "Disk quota exceeded", path)
    return real(path, *a, **k)
  monkeypatch.setattr(rundir.os, "mkdir", mkdir)
  monkeypatch.chdir(tmp_path)
  (tmp_path / "kept").mkdir()
  assert cli.main(["run", *SYN, "run.rounds=1", "run.name=t",
                   "run.out_dir=kept/a/b"]) == 2
  assert "Disk quota exceeded" in _one_error_line(capsys)
  assert os.listdir(tmp_path) == ["kept"] and os.listdir(tmp_path / "kept") == []


def test_the_lock_is_gone_after_a_run_and_free_after_a_kill(tmp_path):
  out = tmp_path / "r"
  proc = subprocess.Popen([sys.executable, "-m", "jsfl.cli", "run", *SYN, "run.rounds=200",
                           f"run.dir={out}", "--quiet"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  try:
    deadline = time.time() + 120
    while not (out / rundir.RunLock.NAME).exists():
      assert proc.poll() is None and time.time() < deadline
      time.sleep(0.05)
    assert rundir.RunLock(str(out)).holder() == str(proc.pid)
  finally:
    proc.kill()
    proc.wait()
  lock = rundir.RunLock(str(out)).acquire()  # no wait: SIGKILL freed it
  lock.release()
  assert not (out / rundir.RunLock.NAME).exists()


def test_summary_keeps_its_shape_after_one_evaluation(runs):
  summ = json.loads(_read(f"{runs['four']}/summary.json"))
  assert summ["diverged"] == []
  for k in ("accuracy", "loss", "pg", "bw"):
    assert set(summ[k]) == {"median", "std", "per_seed", "seeds"}
  assert np.isfinite(summ["accuracy"]["median"])


def test_a_disk_without_room_for_a_checkpoint_is_caught_before_writing(
    tmp_path, monkeypatch, capsys):
  out = str(tmp_path / "r")
  usage = shutil.disk_usage

  def nearly_full(path):
    got = usage(path)
    return got._replace(free=1000) if "checkpoints" in str(path) else got
  monkeypatch.setattr(checkpoint.shutil, "disk_usage", nearly_full)
  assert cli.main(["run", *SYN, "run.rounds=2", f"run.dir={out}", "--quiet"]) == 2
  line = _one_error_line(capsys)
  assert "checkpoint of round 2 could not be written" in line and "1,000 bytes free" in line
  assert os.listdir(f"{out}/checkpoints") == []  # nothing half-written
  assert len(rundir.read_metrics(f"{out}/metrics.jsonl")) == 2


def test_the_echoes_of_failed_writers_are_dropped_and_the_rest_kept():
  echo = ("Traceback (most recent call last):\n  File \"x.py\", line 1, in f\n"
          "    g()\nRuntimeError: Event loop is closed\n")
  other = "Traceback (most recent call last):\n  File \"y.py\", line 2\nValueError: real\n"
  assert checkpoint._without_echoes(echo + "a line\n" + echo + other + echo) == (
      "a line\n" + other)


def test_file_descriptor_2_is_replayed_after_a_save(tmp_path):
  """What C++ threads print to fd 2 during a save comes out after it, less the
  echoes; the descriptor is restored."""
  script = textwrap.dedent("""
      import os, sys
      from jsfl import checkpoint
      with checkpoint._quiet_writer_threads():
        os.write(2, b"kept\\n")
        os.write(2, b"Traceback (most recent call last):\\n  x\\n"
                    b"RuntimeError: Event loop is closed\\n")
      os.write(2, b"after\\n")
  """)
  proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                        timeout=120, check=False)
  assert proc.returncode == 0 and proc.stderr == "kept\nafter\n"


def _truncate_arrays(step_dir):
  """Cuts every array data file of the checkpoint to half its length."""
  for base, _, files in os.walk(os.path.join(step_dir, "state")):
    for n in files:
      if "/d" in base.replace(step_dir, ""):  # ocdbt data files
        p = os.path.join(base, n)
        with open(p, "r+b") as f:
          f.truncate(os.path.getsize(p) // 2)


def _garbage_metadata(step_dir):
  for p in (os.path.join(step_dir, "_CHECKPOINT_METADATA"),
            os.path.join(step_dir, "state", "_METADATA")):
    with open(p, "wb") as f:
      f.write(b"\x00garbage{\xff")


# A damaged newest checkpoint, resumed in a fresh process: stderr holds only
# jsfl's own lines, every time (orbax's absl errors and tensorstore's
# tracebacks stay off it).  CI runs each case once; JSFL_FAULT_REPEATS=20
# repeats it as often as asked.
@pytest.mark.parametrize("damage", [_truncate_arrays, _garbage_metadata],
                         ids=["truncated_arrays", "garbage_metadata"])
def test_a_damaged_checkpoint_prints_only_jsfl_lines_every_time(runs, tmp_path, damage):
  repeats = int(os.environ.get("JSFL_FAULT_REPEATS", "1"))
  for i in range(repeats):
    out = str(tmp_path / f"run{i}")
    shutil.copytree(runs["four"], out)
    _edit_config(out, run__rounds=5)
    damage(f"{out}/checkpoints/4")
    proc = subprocess.run([sys.executable, "-m", "jsfl", "run", "--resume", out, "--quiet"],
                          capture_output=True, text=True, timeout=300, check=False,
                          env={**os.environ, "JSFL_COMPILE_CACHE": "off"})
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0, proc.stderr
    assert lines and all(line.startswith("jsfl: ") for line in lines), proc.stderr
    assert any(f"checkpoint {out}/checkpoints/4 does not restore" in line for line in lines)
    assert _records(out) == _records(runs["six"])[:len(_records(out))]
