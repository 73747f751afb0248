"""Checkpoint and resume: a stopped or killed run continues bit-identically.

"Bit-identical" means every metrics.jsonl record equal to an uninterrupted
run's except ``wall_s`` (floats compared exactly), the same summary.json,
and the final checkpoint's state leaves and byte counters equal.  The
in-process runs and the ``python -m jsfl`` subprocesses compile the same
programs: the subprocesses get conftest's matmul precision through
``JAX_DEFAULT_MATMUL_PRECISION`` and its ``XLA_FLAGS`` through the
environment.  All of them share a persistent compilation cache in a temporary
directory, so each method compiles once (a fresh compile gives the same
executable; what is tested here is what a checkpoint carries).
"""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import struct

from jsfl import checkpoint, cli, train
from jsfl.rundir import read_metrics
from jsfl.train import lifecycle, loop
from jsfl.train.lifecycle import Progress

# 16 rounds, not fewer: a round of this config takes ~15 ms (plus a
# checkpoint every 2), and each signal must land before the run ends.
SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=400", "dataset.test_size=100", "model.width=4", "model.hidden=16",
       "exec.progress=false", "partition.num_clients=4", "run.seeds=2", "run.rounds=16",
       "run.checkpoint_every=2"]
ROUNDS = 16
ENV = dict(os.environ, JAX_DEFAULT_MATMUL_PRECISION="highest")


def config(method):
  return [*SYN, f"method.name={method}"]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
  """Uninterrupted runs, one per method, made on first use."""
  made = {}

  def get(method):
    if method not in made:
      out = str(tmp_path_factory.mktemp(f"ref-{method}") / "r")
      assert cli.main(["run", *config(method), f"run.dir={out}", "--quiet"]) == 0
      made[method] = out
    return made[method]
  return get


def rounds_written(run_dir) -> int:
  """The highest round in metrics.jsonl (a half-written last line skipped)."""
  best = 0
  try:
    with open(f"{run_dir}/metrics.jsonl") as f:
      for line in f:
        try:
          best = max(best, json.loads(line)["round"])
        except (ValueError, KeyError):
          pass
  except FileNotFoundError:
    pass
  return best


def read_text(path) -> str:
  with open(path) as f:
    return f.read()


def checkpoint_rounds(run_dir) -> list[int]:
  ck = f"{run_dir}/checkpoints"
  return sorted(int(n) for n in os.listdir(ck) if n.isdigit()) if os.path.isdir(ck) else []


def wait_until(cond, proc, what, timeout=240):
  start = time.monotonic()
  while not cond():
    if proc.poll() is not None:
      pytest.fail(f"the run ended (exit {proc.returncode}) before {what}: "
                  f"{proc.stderr.read()}")
    if time.monotonic() - start > timeout:
      proc.kill()
      pytest.fail(f"timed out waiting for {what}")
    time.sleep(0.01)


def jsfl(*args):
  return subprocess.Popen([sys.executable, "-m", "jsfl", *args], env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def assert_same_run(got, want):
  def records(d):
    recs = read_metrics(f"{d}/metrics.jsonl")
    for r in recs:
      r.pop("wall_s")
    return recs
  a, b = records(got), records(want)
  assert len(a) == len(b) == 2 * ROUNDS
  for x, y in zip(a, b):
    assert x == y, {k: (x.get(k), y.get(k)) for k in set(x) | set(y) if x.get(k) != y.get(k)}
  with open(f"{got}/summary.json") as f, open(f"{want}/summary.json") as g:
    assert json.load(f) == json.load(g)
  assert checkpoint_rounds(got)[-1] == checkpoint_rounds(want)[-1] == ROUNDS
  host_a, leaves_a = checkpoint.read(f"{got}/checkpoints")
  host_b, leaves_b = checkpoint.read(f"{want}/checkpoints")
  assert host_a == host_b
  assert len(leaves_a) == len(leaves_b)
  for path, x, y in zip(host_a["paths"], leaves_a, leaves_b):
    assert x.dtype == y.dtype and np.array_equal(x, y), path


def test_sigterm_then_sigkill_then_resume_is_bit_identical(tmp_path, reference):
  """sfl: SIGTERM (exit 143, one line), resume killed by SIGKILL after a
  periodic checkpoint, resume again: the run an uninterrupted one makes."""
  out = str(tmp_path / "r")
  proc = jsfl("run", *config("sfl"), f"run.dir={out}", "--quiet")
  wait_until(lambda: rounds_written(out) >= 2, proc, "round 2")
  proc.send_signal(signal.SIGTERM)
  _, err = proc.communicate(timeout=120)
  assert proc.returncode == 128 + signal.SIGTERM, err
  lines = [line for line in err.splitlines() if line.startswith("jsfl:")]
  stopped = checkpoint_rounds(out)[-1]
  assert 2 <= stopped < ROUNDS
  assert lines == [f"jsfl: stopped after round {stopped}; resume with: jsfl run --resume {out}"]
  assert rounds_written(out) == stopped

  proc = jsfl("run", "--resume", out, "--quiet")
  wait_until(lambda: checkpoint_rounds(out)[-1] > stopped, proc, "a periodic checkpoint")
  proc.kill()
  proc.communicate(timeout=60)
  assert proc.returncode == -signal.SIGKILL
  assert checkpoint_rounds(out)[-1] < ROUNDS, "the run ended before SIGKILL"

  assert cli.main(["run", "--resume", out, "--quiet"]) == 0
  assert_same_run(out, reference("sfl"))


def test_multisfl_stop_and_crash_in_process(tmp_path, reference, monkeypatch, capsys):
  """multisfl, in-process: SIGINT in round 3 (exit 130, handlers restored),
  resume that crashes after round 7's records (checkpoint 6), resume again."""
  out = str(tmp_path / "r")
  update = Progress.update

  def hook(at, act):
    def patched(self, r, *args, **kwargs):
      update(self, r, *args, **kwargs)
      if r == at:
        act()
    monkeypatch.setattr(Progress, "update", patched)

  def crash():
    raise RuntimeError("crash")

  before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  hook(3, lambda: os.kill(os.getpid(), signal.SIGINT))
  with pytest.raises(SystemExit) as stop:
    cli.main(["run", *config("multisfl"), f"run.dir={out}", "--quiet"])
  assert stop.value.code == 128 + signal.SIGINT
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
  assert capsys.readouterr().err.strip() == (
      f"jsfl: stopped after round 3; resume with: jsfl run --resume {out}")
  assert checkpoint_rounds(out) == [2, 3]

  hook(7, crash)
  with pytest.raises(RuntimeError, match="crash"):
    cli.main(["run", "--resume", out, "--quiet"])
  assert checkpoint_rounds(out) == [4, 6] and rounds_written(out) == 7

  monkeypatch.setattr(Progress, "update", update)
  assert cli.main(["run", "--resume", out, "--quiet"]) == 0
  assert_same_run(out, reference("multisfl"))
  # one line per process, from the round it trained first, all on this code
  sessions = [json.loads(line) for line in read_text(f"{out}/sessions.jsonl").splitlines()]
  assert [s["from_round"] for s in sessions] == [1, 4, 7]
  assert {s["versions"]["jsfl_source"] for s in sessions} == {lifecycle.source_digest()}
  assert "other jsfl code" not in capsys.readouterr().err


def test_a_resume_on_other_code_says_so_and_each_session_names_its_code(tmp_path,
                                                                        monkeypatch):
  """The records of a run resumed on changed code are no longer those one
  code writes bit for bit (a changed rounding moves every seed): the resume
  says so in one note, and sessions.jsonl names each process's code; a run
  from before the digest, a restart from round 1 and the same code say
  nothing."""
  out = tmp_path / "r"
  out.mkdir()
  versions = {**lifecycle.versions(), "jsfl_source": "0123456789ab"}
  (out / "config.json").write_text(json.dumps({"config": {}, "versions": versions}))
  note = lifecycle.note_session(str(out), 9, True)
  assert note.startswith("jsfl: note: resuming at round 9 on other jsfl code than the "
                         "session from round 1 ran (source 0123456789ab -> "
                         f"{lifecycle.source_digest()})")
  assert lifecycle.note_session(str(out), 13, True) is None  # the last session's code
  monkeypatch.setattr(lifecycle, "source_digest", lambda: "ba9876543210")
  assert "session from round 13 ran" in lifecycle.note_session(str(out), 17, True)
  assert lifecycle.note_session(str(out), 1, True) is None
  lines = [json.loads(x) for x in (out / "sessions.jsonl").read_text().splitlines()]
  assert [x["from_round"] for x in lines] == [9, 13, 17, 1]
  assert lines[2]["versions"]["jsfl_source"] == "ba9876543210"
  # A session killed before its first checkpoint (the one from 17) is
  # replaced by the next from the same round: that one is compared with the
  # session that wrote round 16, whose code it runs again.
  monkeypatch.setattr(lifecycle, "source_digest", lambda: "fedcba987654")
  (out / "sessions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:3]))
  assert "session from round 13 ran (source" in lifecycle.note_session(str(out), 17, True)
  monkeypatch.undo()  # this code again
  (out / "sessions.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines[:3]))
  assert lifecycle.note_session(str(out), 17, True) is None
  old = tmp_path / "old"
  old.mkdir()
  (old / "config.json").write_text(json.dumps({"config": {}, "versions": {"jsfl": "0.1.0"}}))
  assert lifecycle.note_session(str(old), 5, True) is None


def test_a_sigterm_while_the_run_starts_stops_it_before_round_1(tmp_path, reference,
                                                                 monkeypatch, capsys):
  """A SIGTERM while the run loads its data or compiles (a cluster's
  preemption) stops it before its first round: one line, exit 143; a new
  run leaves nothing behind, a resumed one its directory as it was (the
  default handler killed the process and left a locked, half-written
  directory that a rerun refused)."""
  real_fit, update = loop.fit.fit, Progress.update

  def fit_then_sigterm(*args, **kwargs):
    compiled = real_fit(*args, **kwargs)
    os.kill(os.getpid(), signal.SIGTERM)  # lands while the run starts
    return compiled
  before = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
  monkeypatch.setattr(loop.fit, "fit", fit_then_sigterm)
  out = str(tmp_path / "new")
  with pytest.raises(SystemExit) as stop:
    cli.main(["run", *config("sfl"), f"run.dir={out}", "--quiet"])
  assert stop.value.code == 128 + signal.SIGTERM
  assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == before
  assert capsys.readouterr().err.strip() == (
      "jsfl: stopped before round 1; nothing kept (a new run)")
  assert not os.path.exists(out)

  # a run stopped after round 4, its resume stopped while it starts
  monkeypatch.setattr(loop.fit, "fit", real_fit)

  def sigterm_at_4(self, r, *args, **kwargs):
    update(self, r, *args, **kwargs)
    if r == 4:
      os.kill(os.getpid(), signal.SIGTERM)
  monkeypatch.setattr(Progress, "update", sigterm_at_4)
  with pytest.raises(SystemExit):
    cli.main(["run", *config("sfl"), f"run.dir={out}", "--quiet"])
  monkeypatch.setattr(Progress, "update", update)
  kept = {n: read_text(f"{out}/{n}") for n in ("metrics.jsonl", "summary.json")}
  capsys.readouterr()
  monkeypatch.setattr(loop.fit, "fit", fit_then_sigterm)
  with pytest.raises(SystemExit) as stop:
    cli.main(["run", "--resume", out, "--quiet"])
  assert stop.value.code == 128 + signal.SIGTERM
  assert capsys.readouterr().err.strip().endswith(
      f"jsfl: stopped before round 5; resume with: jsfl run --resume {out}")
  assert {n: read_text(f"{out}/{n}") for n in kept} == kept
  assert checkpoint_rounds(out) == [2, 4]
  monkeypatch.setattr(loop.fit, "fit", real_fit)
  assert cli.main(["run", "--resume", out, "--quiet"]) == 0
  assert_same_run(out, reference("sfl"))


def test_resume_of_a_finished_run_changes_nothing(reference, capsys):
  out = reference("sfl")
  files = {n: read_text(f"{out}/{n}") for n in ("metrics.jsonl", "summary.json")}
  rounds = checkpoint_rounds(out)
  capsys.readouterr()
  assert cli.main(["run", "--resume", out, "--quiet"]) == 0
  captured = capsys.readouterr()
  assert f"{out} is finished ({ROUNDS} of {ROUNDS} rounds)" in captured.err
  assert captured.out.strip() == out
  assert {n: read_text(f"{out}/{n}") for n in files} == files
  assert checkpoint_rounds(out) == rounds


def test_resume_without_a_checkpoint_starts_again_in_place(tmp_path, reference):
  """A run killed before its first checkpoint: round 0 again, same dir, its
  records dropped."""
  out = str(tmp_path / "r")
  shutil.copytree(reference("sfl"), out)
  shutil.rmtree(f"{out}/checkpoints")
  with open(f"{out}/metrics.jsonl") as f:
    lines = f.readlines()[:3]
  with open(f"{out}/metrics.jsonl", "w") as f:
    f.writelines(lines + ['{"round": 2, "se'])  # and a half-written line
  assert cli.main(["run", "--resume", out, "--quiet"]) == 0
  assert_same_run(out, reference("sfl"))


def _gzip_records(out):
  for name in ("metrics.jsonl", "partition.json"):
    subprocess.run(["gzip", "-9n", f"{out}/{name}"], check=True)


def test_an_archived_run_is_not_resumed_over_its_records(tmp_path, reference, capsys):
  """Archived records (docs/run-directory.md) are not what a resume appends
  to: resuming would begin metrics.jsonl anew beside the archive."""
  out = str(tmp_path / "r")
  shutil.copytree(reference("sfl"), out)
  shutil.rmtree(f"{out}/checkpoints/{ROUNDS}")  # a run stopped before its end
  _gzip_records(out)
  before = sorted(os.listdir(out)), sorted(os.listdir(f"{out}/checkpoints"))
  assert cli.main(["run", "--resume", out, "--quiet"]) == 2
  err = capsys.readouterr().err.strip().splitlines()
  assert err == [f"jsfl: error: {out!r} is archived (metrics.jsonl.gz); allowed: a run "
                 "directory with plain records (gunzip its metrics.jsonl.gz and "
                 "partition.json.gz to resume it)"]
  assert (sorted(os.listdir(out)), sorted(os.listdir(f"{out}/checkpoints"))) == before
  # a finished archived run, committed without its checkpoints, stays finished
  fin = str(tmp_path / "fin")
  shutil.copytree(reference("sfl"), fin, ignore=shutil.ignore_patterns("checkpoints"))
  _gzip_records(fin)
  assert cli.main(["run", "--resume", fin, "--quiet"]) == 0
  assert f"{fin} is finished ({ROUNDS} of {ROUNDS} rounds)" in capsys.readouterr().err


def test_resume_of_a_non_run_dir_exits_2(tmp_path, capsys):
  for path in (str(tmp_path), str(tmp_path / "missing")):
    assert cli.main(["run", "--resume", path]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"{path!r} is not a run directory: expected {path}/config.json" in err
  assert cli.main(["run", "--resume", str(tmp_path), "run.rounds=3"]) == 2
  assert "--resume takes only RUN_DIR" in capsys.readouterr().err


@struct.dataclass
class _State:
  params: tuple
  stats: tuple
  key: jax.Array
  opt: object
  round: jax.Array


def _state(scale):
  params = ({"w": jnp.arange(6.0).reshape(2, 3) * scale},)
  return _State(params, (), jax.random.split(jax.random.key(scale), 2),
                optax.sgd(0.1, momentum=0.9).init(params), jnp.full((2,), scale, jnp.int32))


def test_checkpointer_round_trip_keeps_keys_types_and_the_last_two(tmp_path):
  ck = checkpoint.Checkpointer(str(tmp_path / "checkpoints"))
  for r in (1, 2, 3):
    ck.save(r, _state(r), [0, 1], np.array([1.5, 2.25]) * r, np.array([3, 4]) * r)
  assert checkpoint_rounds(tmp_path) == [2, 3]
  got_round, state, up, down = ck.restore(_state(0), [0, 1])
  assert got_round == 3
  want = _state(3)
  assert jax.tree.structure(state) == jax.tree.structure(want)
  assert jax.dtypes.issubdtype(state.key.dtype, jax.dtypes.prng_key)
  for a, b in zip(jax.tree.leaves(jax.tree.map(_data, state)),
                  jax.tree.leaves(jax.tree.map(_data, want))):
    assert a.dtype == b.dtype and np.array_equal(a, b)
  assert up.dtype == np.float64 and up.tolist() == [4.5, 6.75]
  assert down.dtype.kind == "i" and down.tolist() == [9, 12]
  with pytest.raises(ValueError, match="seeds"):
    ck.restore(_state(0), [0, 2])
  with pytest.raises(ValueError, match="structure"):
    ck.restore({"other": jnp.zeros(2)}, [0, 1])
  ck.close()
  assert checkpoint.latest_round(str(tmp_path / "nowhere")) is None


def test_a_checkpoint_orbax_cannot_index_is_an_error_not_a_silent_loss(tmp_path):
  """Below a '[...]' name orbax's glob finds none of the pieces it merges
  into the index: the step looks saved and never restores.  jsfl refuses
  such run directories up front; a save that ends so anyway raises."""
  from jsfl.errors import CheckpointError
  ck = checkpoint.Checkpointer(str(tmp_path / "x=[8, 8, 1]" / "checkpoints"))
  with pytest.raises(CheckpointError, match="without its index"):
    ck.save(1, _state(1), [0, 1], np.zeros(2), np.zeros(2))
  ck.close()
  ok = checkpoint.Checkpointer(str(tmp_path / "x=[8" / "checkpoints"))  # no class: fine
  ok.save(1, _state(1), [0, 1], np.zeros(2), np.zeros(2))
  assert ok.restore(_state(0), [0, 1])[0] == 1
  ok.close()


def _data(x):
  return jax.random.key_data(x) if jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key) else x


def test_a_write_killed_before_it_is_final_is_never_restored(tmp_path):
  """orbax writes into <R>.orbax-checkpoint-tmp and renames when complete: a
  process killed in that last step leaves checkpoint 1 as the newest."""
  d = tmp_path / "checkpoints"
  script = textwrap.dedent(f"""
      import time
      import jax.numpy as jnp, numpy as np
      from orbax.checkpoint._src.path import atomicity
      from jsfl import checkpoint
      ck = checkpoint.Checkpointer({str(d)!r})
      ck.save(1, {{"w": jnp.ones(4)}}, [0], np.zeros(1), np.zeros(1))
      final = atomicity.AtomicRenameTemporaryPath.finalize
      async def stall(self):
        open({str(tmp_path / "finalizing")!r}, "w").close()
        time.sleep(600)
      atomicity.AtomicRenameTemporaryPath.finalize = stall
      ck.save(2, {{"w": jnp.full(4, 2.0)}}, [0], np.ones(1), np.ones(1))
  """)
  proc = subprocess.Popen([sys.executable, "-c", script], env=ENV,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  wait_until(lambda: (tmp_path / "finalizing").exists(), proc, "the second save")
  proc.kill()
  proc.communicate(timeout=60)
  assert any(n.startswith("2.orbax-checkpoint-tmp") for n in os.listdir(d))
  assert checkpoint.latest_round(str(d)) == 1
  ck = checkpoint.Checkpointer(str(d))
  got_round, state, up, _ = ck.restore({"w": jnp.zeros(4)}, [0])
  assert got_round == 1 and np.array_equal(state["w"], np.ones(4)) and up.tolist() == [0.0]
  ck.save(2, {"w": jnp.full(4, 2.0)}, [0], np.ones(1), np.ones(1))  # the round again
  assert ck.restore({"w": jnp.zeros(4)}, [0])[0] == 2
  ck.close()


@pytest.mark.parametrize("started_with", ["map", "vmap"])
def test_resume_keeps_the_client_loop_the_run_started_with(tmp_path, monkeypatch,
                                                           started_with):
  """``client_exec = auto`` resolves per machine and jsfl version; a resumed
  run keeps the loop recorded at its start, so it continues bit for bit."""
  from jsfl import config
  cfg = config.resolve({})
  assert cfg["exec"]["client_exec"] == "auto"
  (tmp_path / "config.json").write_text(json.dumps(
      {"config": cfg, "resolved": {"client_exec": started_with}}))
  seen = {}
  monkeypatch.setattr(loop, "run", lambda c, resume=None, **kw: seen.update(cfg=c) or resume)
  train.resume(str(tmp_path))
  assert seen["cfg"]["exec"]["client_exec"] == started_with


# Methods whose state carries more than models and optimiser state, one per
# engine: Hydra's heads (split), FedMut's previous part-1 (SFL family),
# SFedKD's teachers and CWC's Fisher sums (sequential; CWC in the slow suite).
STATEFUL = {"hydra": [], "sfl_fedmut": [], "sfedkd": ["method.num_teachers=2"], "cwc": []}


@pytest.mark.parametrize("method", [pytest.param(m, marks=pytest.mark.slow) if m == "cwc"
                                    else m for m in STATEFUL])
def test_a_crash_after_records_before_the_checkpoint_resumes_bit_identically(
    method, tmp_path, monkeypatch):
  """Crashed after round 3's records (checkpoint 2 kept), resumed: records,
  summary and final state equal an uninterrupted run's (sfl and multisfl:
  the tests above)."""
  short = [*config(method), *STATEFUL[method], "run.rounds=4"]
  want, got = str(tmp_path / "want"), str(tmp_path / "got")
  assert cli.main(["run", *short, f"run.dir={want}", "--quiet"]) == 0
  update = Progress.update

  def crash(self, r, *args, **kwargs):
    update(self, r, *args, **kwargs)
    if r == 3:
      raise RuntimeError("crash")
  monkeypatch.setattr(Progress, "update", crash)
  with pytest.raises(RuntimeError, match="crash"):
    cli.main(["run", *short, f"run.dir={got}", "--quiet"])
  assert checkpoint_rounds(got) == [2] and rounds_written(got) == 3
  monkeypatch.setattr(Progress, "update", update)
  assert cli.main(["run", "--resume", got, "--quiet"]) == 0
  strip = lambda d: [{k: v for k, v in r.items() if k != "wall_s"}
                     for r in read_metrics(f"{d}/metrics.jsonl")]
  assert strip(got) == strip(want) and len(strip(want)) == 8
  assert read_text(f"{got}/summary.json") == read_text(f"{want}/summary.json")
  (host_a, leaves_a), (host_b, leaves_b) = (checkpoint.read(f"{d}/checkpoints")
                                            for d in (got, want))
  assert host_a == host_b and host_a["round"] == 4
  for path, x, y in zip(host_a["paths"], leaves_a, leaves_b, strict=True):
    assert x.dtype == y.dtype and np.array_equal(x, y), path
