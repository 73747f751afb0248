"""Trackers, the profiler, the compilation cache and ``jsfl info``: what a
run writes for the tools outside it, read back with each tool's own reader."""

from __future__ import annotations

import glob
import gzip
import json
import os
import shutil
import re
import struct
import subprocess
import sys

import pytest

from jsfl import cli, rundir, trackers

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=160", "dataset.test_size=40", "model.width=4", "model.hidden=16",
       "partition.num_clients=4", "method.batch_size=16", "exec.progress=false"]


def _accuracy(out, seed):
  return [(r["round"], r["accuracy"]) for r in rundir.read_metrics(f"{out}/metrics.jsonl")
          if r["seed"] == seed]


def _same(got, want):
  """(step, value) pairs: equal steps, values equal to float32 precision."""
  assert [s for s, _ in got] == [s for s, _ in want]
  assert [v for _, v in got] == pytest.approx([v for _, v in want], rel=1e-6)


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
  """A 3-round, 2-seed run with every tracker on."""
  pytest.importorskip("tensorboard")
  pytest.importorskip("mlflow")
  pytest.importorskip("wandb")
  out = str(tmp_path_factory.mktemp("tracked") / "run")
  env = {k: os.environ.pop(k) for k in ("WANDB_MODE", "MLFLOW_TRACKING_URI") if k in os.environ}
  try:
    assert cli.main(["run", *SYN, "run.rounds=3", "run.seeds=2", "run.name=tracked",
                     "run.trackers=tensorboard,wandb,mlflow", f"run.dir={out}",
                     "--quiet"]) == 0
  finally:
    os.environ.update(env)
  return out


def test_tensorboard_reads_every_round_of_every_seed(tracked):
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  for seed in (0, 1):
    acc = EventAccumulator(f"{tracked}/tensorboard/seed{seed}")
    acc.Reload()
    _same([(e.step, e.value) for e in acc.Scalars("accuracy")], _accuracy(tracked, seed))
    assert {"loss", "train_loss", "pg", "lr", "bytes_up_total"} <= set(acc.Tags()["scalars"])
    config = json.loads(acc.Tensors("config")[0].tensor_proto.string_val[0])
    assert config["run"]["seeds"] == 2 and config["method"]["name"] == "sfl"


def test_mlflow_reads_one_run_per_seed_with_params_and_metrics(tracked):
  from mlflow.tracking import MlflowClient
  client = MlflowClient(tracking_uri=f"file:{tracked}/mlruns")
  exp = client.get_experiment_by_name("tracked")
  runs = {r.info.run_name: r for r in client.search_runs([exp.experiment_id])}
  assert set(runs) == {"tracked/seed0", "tracked/seed1"}
  for seed in (0, 1):
    r = runs[f"tracked/seed{seed}"]
    assert r.data.params["method.name"] == "sfl" and r.data.params["run.rounds"] == "3"
    assert r.data.tags["jsfl.seed"] == str(seed) and "jsfl.tag.synthetic" in r.data.tags
    hist = client.get_metric_history(r.info.run_id, "accuracy")
    _same(sorted((m.step, m.value) for m in hist), _accuracy(tracked, seed))
    assert r.info.status == "FINISHED"


def test_a_moved_run_resumes_into_its_own_mlflow_runs(tmp_path):
  """The tracker identity is the run's ``run_id`` (config.json), not its
  path: a copy of a run resumed elsewhere continues the same MLflow run of
  each seed (a path-based id started a second run per seed, holding the
  resumed rounds alone)."""
  pytest.importorskip("mlflow")
  out, moved = str(tmp_path / "run"), str(tmp_path / "elsewhere")
  env = {k: os.environ.pop(k) for k in ("MLFLOW_TRACKING_URI",) if k in os.environ}
  try:
    assert cli.main(["run", *SYN, "run.rounds=3", "run.seeds=2", "run.name=tracked",
                     "run.checkpoint_every=1", "run.trackers=mlflow", f"run.dir={out}",
                     "--quiet"]) == 0
    shutil.copytree(out, moved)
    shutil.rmtree(f"{moved}/checkpoints/3")  # resume from round 2's checkpoint
    assert cli.main(["run", "--resume", moved, "--quiet"]) == 0
  finally:
    os.environ.update(env)
  from mlflow.tracking import MlflowClient
  client = MlflowClient(tracking_uri=f"file:{moved}/mlruns")
  exp = client.get_experiment_by_name("tracked")
  runs = client.search_runs([exp.experiment_id])
  assert sorted(r.info.run_name for r in runs) == ["tracked/seed0", "tracked/seed1"]
  for r in runs:  # round 3 logged again, at its step, into the same run
    steps = sorted(m.step for m in client.get_metric_history(r.info.run_id, "accuracy"))
    assert steps == [1, 2, 3, 3]


def _wandb_records(path):
  """The records of a W&B transaction log (``run-<id>.wandb``): the LevelDB
  log framing W&B writes, each payload one of W&B's own protobuf Records."""
  from wandb.proto import wandb_internal_pb2 as pb
  data = open(path, "rb").read()
  pos, block, records, part = 7, 32768, [], b""  # after W&B's 7-byte file header
  while pos + 7 <= len(data):
    room = block - pos % block
    if room < 7:
      pos += room
      continue
    _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
    if kind == 0 and length == 0:
      pos += room
      continue
    part += data[pos + 7:pos + 7 + length]
    pos += 7 + length
    if kind in (1, 4):  # FULL or LAST
      rec = pb.Record()
      rec.ParseFromString(part)
      records.append(rec)
      part = b""
  return records


def test_wandb_offline_run_holds_config_and_history(tracked):
  files = sorted(glob.glob(f"{tracked}/wandb/offline-run-*/run-*.wandb"))
  assert len(files) == 2
  by_seed = {}
  for f in files:
    recs = _wandb_records(f)
    run = next(r.run for r in recs if r.WhichOneof("record_type") == "run")
    config = {u.key: json.loads(u.value_json) for u in run.config.update}
    history = [{(i.key or "/".join(i.nested_key)): json.loads(i.value_json)
                for i in r.history.item}
               for r in recs if r.WhichOneof("record_type") == "history"]
    assert [r.history.step.num for r in recs
            if r.WhichOneof("record_type") == "history"] == [h["round"] for h in history]
    by_seed[int(run.display_name[-1])] = (run, config, history)
  for seed in (0, 1):
    run, config, history = by_seed[seed]
    assert run.display_name == f"tracked/seed{seed}" and run.run_group == "tracked"
    assert config["method"]["name"] == "sfl" and config["run"]["rounds"] == 3
    _same([(h["round"], h["accuracy"]) for h in history], _accuracy(tracked, seed))


class _Broken:
  def __init__(self, slots, start):
    pass

  def log(self, i, step, values):
    raise OSError(28, "No space left on device")

  def flush(self):
    pass

  def close(self):
    pass


def test_a_failing_or_missing_tracker_is_one_warning_and_changes_nothing(
    tmp_path, monkeypatch, capsys):
  plain, watched = str(tmp_path / "plain"), str(tmp_path / "watched")
  assert cli.main(["run", *SYN, "run.rounds=2", f"run.dir={plain}", "--quiet"]) == 0
  monkeypatch.setitem(trackers.BACKENDS, "tensorboard", _Broken)
  monkeypatch.setitem(sys.modules, "mlflow", None)  # as if not installed
  monkeypatch.setitem(sys.modules, "mlflow.tracking", None)
  capsys.readouterr()
  assert cli.main(["run", *SYN, "run.rounds=2", f"run.dir={watched}",
                   "run.trackers=tensorboard,mlflow", "--quiet"]) == 0
  err = [line for line in capsys.readouterr().err.splitlines() if line]
  assert len(err) == 2, err
  assert err[0].startswith("jsfl: warning: run.trackers: mlflow is not installed")
  assert err[1].startswith("jsfl: warning: tracker tensorboard failed while writing "
                           "(OSError: [Errno 28] No space left on device)")
  strip = lambda out: [{k: v for k, v in r.items() if k != "wall_s"}
                       for r in rundir.read_metrics(f"{out}/metrics.jsonl")]
  assert strip(watched) == strip(plain)
  assert not os.path.exists(f"{watched}/mlruns")


def test_tensorboard_shows_each_round_once_after_a_resume(tmp_path):
  pytest.importorskip("tensorboard")
  from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
  cfg = {s: {} for s in ("run", "method", "dataset", "partition", "model")}
  cfg.update(run={"name": "r"}, method={"name": "sfl"}, dataset={"name": "d"},
             partition={"name": "iid"}, model={"name": "m"})
  slot = trackers.Slot(None, 0, cfg, "r", str(tmp_path), uid="u")
  first = trackers.Trackers(["tensorboard"], [slot], print)
  first.log([{"round": r, "seed": 0, "accuracy": float(r)} for r in (1,)])
  first.log([{"round": r, "seed": 0, "accuracy": float(r)} for r in (2,)])
  first.log([{"round": 3, "seed": 0, "accuracy": -1.0}])  # lost: no checkpoint after it
  first.close()
  again = trackers.Trackers(["tensorboard"], [slot], print, start=2)
  for r in (3, 4):
    again.log([{"round": r, "seed": 0, "accuracy": float(r)}])
  again.close()
  acc = EventAccumulator(str(tmp_path / "tensorboard" / "seed0"))
  acc.Reload()
  assert [(e.step, e.value) for e in acc.Scalars("accuracy")] == [
      (1, 1.0), (2, 2.0), (3, 3.0), (4, 4.0)]


def test_profile_writes_a_trace_of_the_chosen_rounds(tmp_path, capsys):
  out = str(tmp_path / "r")
  assert cli.main(["run", *SYN, "run.rounds=3", "run.profile=[2, 3]", f"run.dir={out}",
                   "--quiet"]) == 0
  assert f"jsfl: profile of rounds 2-3 in {out}/profile" in capsys.readouterr().err
  xplanes = glob.glob(f"{out}/profile/plugins/profile/*/*.xplane.pb")
  traces = glob.glob(f"{out}/profile/plugins/profile/*/*.trace.json.gz")
  assert len(xplanes) == 1 and os.path.getsize(xplanes[0]) > 0
  with gzip.open(traces[0]) as f:
    events = json.load(f)["traceEvents"]
  assert any("round" in str(e.get("name", "")) or "jit" in str(e.get("name", ""))
             for e in events)


def test_info_prints_the_backend_and_what_auto_resolves_to(capsys):
  assert cli.main(["info"]) == 0
  text = capsys.readouterr().out
  assert "backend: cpu" in text and "jax " in text and "compile cache:" in text
  assert cli.main(["info", *SYN, "run.seeds=3"]) == 0
  text = capsys.readouterr().out
  assert "exec.client_exec = auto -> unroll" in text
  assert "exec.seed_exec = auto -> map" in text
  assert "3 seeds" in text and "4 clients (4 per round)" in text
  # the compiled round's memory, and how many seeds fit this machine
  assert "round program at 3 seeds (XLA's memory analysis" in text
  fits = re.search(r"about (\d+) seeds fit in", text)
  assert fits and int(fits.group(1)) > 100, text
  assert "GPU allocator:" in text
  assert cli.main(["info", "run.seeds=0"]) == 2
  assert capsys.readouterr().err.startswith("jsfl: error: run.seeds=0")


def test_info_says_when_the_compile_cache_is_unusable(tmp_path, monkeypatch, capsys):
  """As a run would find it: a file where the directory should be."""
  (tmp_path / "file").write_text("")
  monkeypatch.setenv("JSFL_COMPILE_CACHE", str(tmp_path / "file"))
  assert cli.main(["info"]) == 0
  assert (f"compile cache: {tmp_path / 'file'} (unusable: it is not a directory; runs "
          "compile without it)") in capsys.readouterr().out


def test_the_cache_is_bounded_and_locked_unless_filelock_is_missing(tmp_path, monkeypatch):
  import jax

  from jsfl.train import compile_cache
  keys = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size",
          "jax_persistent_cache_min_compile_time_secs")
  before = {k: getattr(jax.config, k) for k in keys}
  try:
    compile_cache.enable(str(tmp_path / "a"))
    assert jax.config.jax_compilation_cache_max_size == compile_cache.MAX_BYTES
    monkeypatch.setattr(compile_cache, "_has_filelock", lambda: False)
    compile_cache.enable(str(tmp_path / "b"))  # JAX's own: unbounded, no lock
    assert jax.config.jax_compilation_cache_max_size == -1
  finally:
    for k, v in before.items():
      jax.config.update(k, v)


def test_a_users_jax_cache_settings_are_kept(tmp_path, monkeypatch):
  """A cache the user already keeps through JAX's own variables is the one
  ``auto`` uses, with their size and smallest-program settings (jsfl
  replaced all three with its own)."""
  import jax

  from jsfl.train import compile_cache
  monkeypatch.delenv("JSFL_COMPILE_CACHE", raising=False)
  monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", str(tmp_path / "theirs"))
  assert compile_cache.cache_dir("auto") == str(tmp_path / "theirs")
  monkeypatch.setenv("JSFL_COMPILE_CACHE", "off")  # jsfl's own variable still rules
  assert compile_cache.cache_dir("auto") is None
  keys = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size",
          "jax_persistent_cache_min_compile_time_secs")
  before = {k: getattr(jax.config, k) for k in keys}
  try:
    jax.config.update("jax_compilation_cache_max_size", 123)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 7.0)
    monkeypatch.setenv("JAX_COMPILATION_CACHE_MAX_SIZE", "123")
    monkeypatch.setenv("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "7")
    assert compile_cache.enable(str(tmp_path / "c")) == str(tmp_path / "c")
    assert jax.config.jax_compilation_cache_max_size == 123
    assert jax.config.jax_persistent_cache_min_compile_time_secs == 7.0
  finally:
    for k, v in before.items():
      jax.config.update(k, v)


def test_a_rejected_run_makes_no_cache_directory_and_a_bad_one_is_one_warning(
    tmp_path, capsys):
  """JAX makes the cache directory at its first compilation: a run rejected
  before that leaves none, and a path that cannot be a directory is a
  warning once, the run going on without the cache."""
  import jax

  from jsfl.train import compile_cache
  keys = ("jax_compilation_cache_dir", "jax_compilation_cache_max_size",
          "jax_persistent_cache_min_compile_time_secs")
  before = {k: getattr(jax.config, k) for k in keys}
  try:
    cache = tmp_path / "cc" / "xla"
    assert cli.main(["run", *SYN, f"run.dir={tmp_path / 'r'}",
                     f"exec.compile_cache={cache}", "model.cut=99"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
    assert os.listdir(tmp_path) == []
    afile = tmp_path / "afile"
    afile.write_text("x")
    assert compile_cache.unusable(str(afile)) == "it is not a directory"
    assert "not a directory" in compile_cache.unusable(str(afile / "sub"))
    assert compile_cache.unusable(str(tmp_path / "new" / "deeper")) is None
    for _ in range(2):
      assert compile_cache.enable(str(afile)) is None
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and "afile" in err[0] and "not a directory" in err[0], err
    assert os.listdir(tmp_path) == ["afile"]
  finally:
    for k, v in before.items():
      jax.config.update(k, v)


def test_the_compile_cache_is_filled_once_and_hit_after(tmp_path):
  """Two starts of one config in fresh processes: the first fills the cache,
  the second (and a resume) compile nothing new; ``off`` writes none."""
  cache = tmp_path / "xla"
  # every program cached: under jsfl's 0.2 s floor one compiled in about that
  # time is kept by one start and not the other as the machine's load varies
  env = {**os.environ, "JSFL_COMPILE_CACHE": str(cache),
         "JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS": "0"}
  run = lambda *extra: subprocess.run(
      [sys.executable, "-m", "jsfl", "run", *SYN, "run.rounds=2", "--quiet", *extra],
      env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False)
  first = run(f"run.dir={tmp_path / 'a'}")
  assert first.returncode == 0, first.stderr
  entries = set(os.listdir(cache))
  programs = {e for e in entries if e.endswith("-cache")}
  assert len(programs) >= 2  # the round and the evaluation at least
  # bounded (compile_cache.MAX_BYTES): LRU access times and the lock that
  # keeps concurrent runs from reading a half-written entry
  assert ".lockfile" in entries
  assert {e.removesuffix("-cache") + "-atime" for e in programs} <= entries
  second = run(f"run.dir={tmp_path / 'b'}")
  assert second.returncode == 0, second.stderr
  assert set(os.listdir(cache)) == entries
  off = run(f"run.dir={tmp_path / 'c'}", "exec.compile_cache=off")
  assert off.returncode == 0 and set(os.listdir(cache)) == entries
