"""Hostile but realistic input, every subcommand: one line, exit 2, nothing left.

Each case runs ``jsfl`` in a fresh, empty working directory, with its input
files prepared in a separate directory, and asserts what the CLI promises
for a bad key, type, value, file or directory: exit status 2, exactly one
line on stderr (``jsfl: error: ...``) that names the offending value or file,
no traceback, nothing new in the working directory, and the inputs as they
were.  A few cases run the real ``jsfl`` process too (exit status of the
process, not of ``cli.main``).
"""

from __future__ import annotations

import gzip
import json
import os
import re
import struct
import subprocess
import sys
import zlib

import numpy as np
import pytest

from jsfl import cli, rundir

SYN = ["dataset.name=synthetic", "dataset.input_shape=[8, 8, 1]", "dataset.num_classes=4",
       "dataset.train_size=200", "dataset.test_size=40", "model.width=4", "model.hidden=16",
       "partition.num_clients=4", "run.rounds=1", "exec.progress=false"]
IDX_FILES = {"x_train": ("train-images-idx3-ubyte", (40, 28, 28)),
             "y_train": ("train-labels-idx1-ubyte", (40,)),
             "x_test": ("t10k-images-idx3-ubyte", (10, 28, 28)),
             "y_test": ("t10k-labels-idx1-ubyte", (10,))}


def _idx_gz(shape) -> bytes:
  arr = np.arange(int(np.prod(shape)), dtype=np.uint8).reshape(shape) % 10
  head = b"\0\0\x08" + bytes([len(shape)]) + b"".join(struct.pack(">I", d) for d in shape)
  return gzip.compress(head + arr.tobytes())


def _fmnist_dir(root, damage=None):
  """A tiny Fashion-MNIST directory; ``damage`` breaks its train images."""
  d = root / f"fmnist_{damage or 'ok'}"
  d.mkdir()
  for key, (stem, shape) in IDX_FILES.items():
    data = _idx_gz(shape)
    if key == "x_train" and damage == "truncated":
      data = data[: len(data) // 2]
    elif key == "x_train" and damage == "crc":
      data = data[:-8] + struct.pack("<I", zlib.crc32(b"other")) + data[-4:]
    elif key == "x_train" and damage == "garbage":
      data = b"\x1f\x8b" + os.urandom(200)
    (d / (stem + ".gz")).write_bytes(data)
  return d


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
  """The inputs every case may name, made once: ``{name: path}``."""
  root = tmp_path_factory.mktemp("inputs")
  p = {"root": root}
  (root / "adir").mkdir()
  (root / "afile").write_text("not a directory\n")
  (root / "full").mkdir()
  (root / "full" / "x.txt").write_text("taken\n")
  (root / "latin1.toml").write_bytes(b"[run]\nname = \"caf\xe9\"\n")
  (root / "gzip.toml").write_bytes(gzip.compress(b"[run]\nrounds = 2\n"))
  (root / "syntax.toml").write_text("[run\nrounds = = 2\n")
  (root / "scalar_section.toml").write_text("run = 5\n")
  (root / "nul.toml").write_bytes(b"[run]\x00\n")
  (root / "bad_sweep.toml").write_text('[sweep]\nname = "s"\nbase = "nowhere.toml"\n')
  (root / "sweep_badcell.toml").write_text('[sweep]\nname = "s"\n[grid]\n'
                                           '"optim.lr" = [0.1, -1.0]\n')
  (root / "sweep_nancell.toml").write_text('[sweep]\nname = "s"\n[grid]\n'
                                           '"optim.momentum" = [0.5, nan]\n')
  (root / "sweep.toml").write_text('[sweep]\nname = "s"\n[grid]\n"run.rounds" = [1, 2]\n')
  for name in ("outfile", "alien", "cellfile", "glob"):
    out = {"outfile": root / "afile", "glob": root / "sw[1]"}.get(name, root / f"{name}_out")
    (root / f"sweep_{name}.toml").write_text(f'[sweep]\nname = "s"\nout_dir = "{out}"\n'
                                             '[grid]\n"run.rounds" = [1]\n')
  (root / "alien_out" / "s" / "run.rounds=1").mkdir(parents=True)
  (root / "alien_out" / "s" / "run.rounds=1" / "notes.txt").write_text("mine\n")
  (root / "cellfile_out" / "s").mkdir(parents=True)
  (root / "cellfile_out" / "s" / "run.rounds=1").write_text("a file\n")
  for damage in (None, "truncated", "crc", "garbage"):
    p[f"fmnist_{damage or 'ok'}"] = _fmnist_dir(root, damage)
  for name, cfg in {
      "edited_lr": {"optim": {"lr": -1.0}},
      "edited_method": {"method": {"name": "sfl9"}},
      "edited_nan": {"optim": {"momentum": float("nan")}},
      "edited_key": {"run": {"roundz": 3}},
  }.items():
    d = root / name
    d.mkdir()
    with open(d / "config.json", "w") as f:
      json.dump({"config": cfg}, f)  # json writes NaN as NaN, as an edit might
  (root / "not_json").mkdir()
  (root / "not_json" / "config.json").write_text("{config: oops")
  (root / "no_config").mkdir()
  (root / "no_config" / "metrics.jsonl").write_text("")
  (root / "locked").mkdir()
  return {k: str(v) for k, v in p.items()} | {
      n: str(root / n) for n in os.listdir(root)}


def _snapshot(root):
  out = {}
  for base, dirs, files in os.walk(root):
    for n in dirs + files:
      path = os.path.join(base, n)
      st = os.lstat(path)
      out[os.path.relpath(path, root)] = (st.st_size, st.st_mtime_ns)
  return out


# (id, argv with {name} for an input path, text the one line must contain)
CASES = [
    # 1. config files that are not TOML text
    ("config_is_dir", ["run", "{adir}"], "is a directory"),
    ("config_gzip", ["run", "{gzip.toml}"], "gzip"),
    ("config_latin1", ["run", "{latin1.toml}"], "not UTF-8"),
    ("config_missing", ["run", "nowhere.toml"], "'nowhere.toml' does not exist"),
    ("config_syntax", ["run", "{syntax.toml}"], "not valid TOML"),
    ("config_nul", ["run", "{nul.toml}"], "not valid TOML"),
    ("config_scalar_section", ["run", "{scalar_section.toml}"], "'run' must be a table"),
    ("sweep_is_dir", ["sweep", "{adir}"], "sweep file"),
    ("sweep_gzip", ["sweep", "{gzip.toml}"], "gzip"),
    ("sweep_missing", ["sweep", "nowhere.toml"], "nowhere.toml"),
    ("sweep_bad_base", ["sweep", "{bad_sweep.toml}"], "nowhere.toml"),
    ("override_malformed", ["run", "run.=3"], "run.=3"),
    ("override_no_section", ["run", "rounds=3"], "rounds=3"),
    ("override_empty_section", ["run", ".rounds=2"], "'.rounds=2'"),
    ("override_no_equals", ["run", *SYN, "run.rounds"], "'run.rounds'"),
    # 2. run directory problems
    ("run_dir_not_empty", ["run", *SYN, "run.dir={full}"], "not empty"),
    ("run_dir_is_file", ["run", *SYN, "run.dir={afile}"], "not a directory"),
    ("run_dir_under_file", ["run", *SYN, "run.dir={afile}/sub"], "afile"),
    ("out_dir_is_file", ["run", *SYN, "run.out_dir={afile}"], "run.out_dir="),
    ("out_dir_under_file", ["run", *SYN, "run.out_dir={afile}/runs"], "afile"),
    ("run_name_with_slash", ["run", *SYN, "run.out_dir=new", "run.name=a/b"], "run.name='a/b'"),
    ("run_name_dotdot", ["run", *SYN, "run.out_dir=new/deep", "run.name=.."], "run.name='..'"),
    ("run_dir_glob_class", ["run", *SYN, "run.dir=lr[0.1]/r"], "'[0.1]' in a directory name"),
    ("run_name_glob_class", ["run", *SYN, "run.name=x[8, 8, 1]"], "run.out_dir/run.name="),
    ("run_dir_locked", ["run", *SYN, "run.dir={locked}"], "in use by process"),
    # 3. data problems
    ("data_dir_missing", ["run", "dataset.data_dir=/no/such/dir", "run.rounds=1"],
     "/no/such/dir"),
    ("data_dir_is_file", ["run", "dataset.data_dir={afile}", "run.rounds=1"], "afile"),
    ("data_truncated_gz", ["run", "dataset.data_dir={fmnist_truncated}", "run.rounds=1"],
     "train-images-idx3-ubyte"),
    ("data_crc_gz", ["run", "dataset.data_dir={fmnist_crc}", "run.rounds=1"],
     "train-images-idx3-ubyte"),
    ("data_garbage_gz", ["run", "dataset.data_dir={fmnist_garbage}", "run.rounds=1"],
     "train-images-idx3-ubyte"),
    ("partition_data_missing", ["partition", "fashion_mnist", "iid", "--data-dir",
                                "/no/such/dir"], "/no/such/dir"),
    ("partition_data_is_file", ["partition", "fashion_mnist", "iid", "--data-dir",
                                "{afile}"], "afile"),
    ("partition_data_truncated", ["partition", "fashion_mnist", "iid", "--data-dir",
                                  "{fmnist_truncated}"], "train-images-idx3-ubyte"),
    ("input_too_small", ["run", *SYN, "dataset.input_shape=[1, 1, 1]"], "input"),
    ("dataset_unknown", ["run", "dataset.name=imagenet"], "dataset.name='imagenet'"),
    ("dataset_option_unknown", ["run", *SYN, "dataset.colour=1"], "colour"),
    ("train_subset_zero", ["run", *SYN, "dataset.train_subset=0"], "train_subset"),
    # 4. numbers
    ("lr_nan", ["run", *SYN, "optim.lr=nan"], "optim.lr=nan"),
    ("lr_inf", ["run", *SYN, "optim.lr=inf"], "optim.lr=inf"),
    ("lr_zero", ["run", *SYN, "optim.lr=0"], "optim.lr=0"),
    ("lr_min_nan", ["run", *SYN, "optim.lr_min=nan"], "optim.lr_min=nan"),
    ("lr_decay_zero", ["run", *SYN, "optim.lr_decay=0"], "optim.lr_decay=0"),
    ("lr_decay_above_one", ["run", *SYN, "optim.lr_decay=1.5"], "optim.lr_decay=1.5"),
    ("momentum_nan", ["run", *SYN, "optim.momentum=nan"], "optim.momentum=nan"),
    ("momentum_one", ["run", *SYN, "optim.momentum=1"], "optim.momentum=1"),
    ("weight_decay_nan", ["run", *SYN, "optim.weight_decay=nan"], "optim.weight_decay=nan"),
    ("weight_decay_neg_inf", ["run", *SYN, "optim.weight_decay=-inf"],
     "optim.weight_decay=-inf"),
    ("seed_huge", ["run", *SYN, "run.seed=99999999999999999999"], "run.seed="),
    ("seed_negative", ["run", *SYN, "run.seed=-1"], "run.seed=-1"),
    ("seed_plus_seeds", ["run", *SYN, "run.seed=2147483647", "run.seeds=2"], "run.seed="),
    ("seeds_huge", ["run", *SYN, "run.seeds=1000000000000"], "run.seeds="),
    ("batch_huge", ["run", *SYN, "method.batch_size=4294967296"], "method.batch_size="),
    ("batch_zero", ["run", *SYN, "method.batch_size=0"], "method.batch_size=0"),
    ("rounds_float", ["run", *SYN, "run.rounds=1.5"], "run.rounds=1.5"),
    ("rounds_text", ["run", *SYN, "run.rounds=ten"], "run.rounds='ten'"),
    ("clients_zero", ["run", *SYN, "partition.num_clients=0"], "partition.num_clients=0"),
    ("per_round_too_many", ["run", *SYN, "method.clients_per_round=9"],
     "method.clients_per_round=9"),
    ("fedprox_mu_negative", ["run", *SYN, "method.name=fedprox", "method.mu=-1"],
     "method.mu=-1"),
    ("fedprox_mu_nan", ["run", *SYN, "method.name=fedprox", "method.mu=nan"], "method.mu=nan"),
    ("sfedkd_temperature_zero", ["run", *SYN, "method.name=sfedkd", "method.temperature=0"],
     "method.temperature=0"),
    ("multisfl_gamma_one", ["run", *SYN, "method.name=multisfl", "method.gamma=1"],
     "method.gamma=1"),
    ("multisfl_p0_inf", ["run", *SYN, "method.name=multisfl", "method.p0=inf"],
     "method.p0=inf"),
    ("method_option_of_other_method", ["run", *SYN, "method.mu=0.1"], "method.mu"),
    ("model_option_unknown", ["run", *SYN, "model.depth=3"], "allowed:"),
    ("model_cut_out_of_range", ["run", *SYN, "model.cut=99"], "model.cut=99"),
    ("dirichlet_alpha_nan", ["run", *SYN, "partition.name=dirichlet", "partition.alpha=nan"],
     "alpha"),
    ("dirichlet_alpha_negative", ["run", *SYN, "partition.name=dirichlet",
                                  "partition.alpha=-1"], "alpha"),
    ("dominant_p_above_one", ["run", *SYN, "partition.name=dominant_label", "partition.p=2"],
     "p="),
    ("mesh_bad", ["run", *SYN, "exec.mesh=seeds=3"], "mesh"),
    ("on_divergence_bad", ["run", *SYN, "run.on_divergence=ignore"], "run.on_divergence"),
    ("unknown_section", ["run", *SYN, "bogus.key=1"], "'bogus'"),
    ("nested_table_value", ["run", *SYN, "model.width={a = 1}"], "model.width"),
    # 5. resume
    ("resume_missing", ["run", "--resume", "nowhere"], "'nowhere'"),
    ("resume_file", ["run", "--resume", "{afile}"], "afile"),
    ("resume_no_config", ["run", "--resume", "{no_config}"], "config.json"),
    ("resume_config_not_json", ["run", "--resume", "{not_json}"], "config.json"),
    ("resume_edited_lr", ["run", "--resume", "{edited_lr}"], "optim.lr=-1.0"),
    ("resume_edited_method", ["run", "--resume", "{edited_method}"], "sfl9"),
    ("resume_edited_nan", ["run", "--resume", "{edited_nan}"], "optim.momentum=nan"),
    ("resume_edited_key", ["run", "--resume", "{edited_key}"], "roundz"),
    ("resume_with_overrides", ["run", "--resume", "{edited_lr}", "optim.lr=0.1"],
     "--resume takes only RUN_DIR"),
    # 6. outputs and other arguments
    ("report_out_is_file", ["report", "{adir}", "--out", "{afile}"], "--out="),
    ("report_out_under_file", ["report", "{adir}", "--out", "{afile}/rep"], "afile"),
    ("report_nothing", ["report", "{adir}"], "no run with a usable metrics.jsonl"),
    ("report_last_zero", ["report", "{adir}", "--last", "0"], "--last=0"),
    ("report_paired_unknown", ["report", "{adir}", "--paired", "x"], "no run"),
    ("plot_out_is_file", ["plot", "{adir}", "--out", "{afile}"], "--out="),
    ("plot_last_zero", ["plot", "{adir}", "--last", "0"], "--last=0"),
    ("partition_out_missing_dir", ["partition", "synthetic", "iid", "--out",
                                   "nodir/counts.json"], "'nodir'"),
    ("partition_out_is_dir", ["partition", "synthetic", "iid", "--out", "{adir}"],
     "is a directory"),
    ("partition_clients_zero", ["partition", "synthetic", "iid", "--clients", "0"],
     "--clients=0"),
    ("partition_bad_option", ["partition", "synthetic", "dirichlet", "alpha=nan"], "alpha"),
    ("partition_option_no_equals", ["partition", "synthetic", "iid", "foo"],
     "option 'foo' is not KEY=VALUE"),
    ("partition_option_no_key", ["partition", "synthetic", "iid", "=1"],
     "option '=1' is not KEY=VALUE"),
    ("partition_dataset_option_no_equals", ["partition", "synthetic", "iid", "dataset.foo"],
     "option 'dataset.foo' is not KEY=VALUE"),
    ("partition_unknown_family", ["partition", "synthetic", "zipf"], "zipf"),
    ("sweep_shard_bad", ["sweep", "{sweep.toml}", "--shard", "3/2"], "3/2"),
    ("sweep_cell_bad", ["sweep", "{sweep_badcell.toml}"], "optim.lr=-1.0"),
    ("sweep_cell_nan", ["sweep", "{sweep_nancell.toml}", "--dry-run"], "optim.momentum=nan"),
    ("sweep_out_dir_is_file", ["sweep", "{sweep_outfile.toml}"], "is not a directory"),
    ("sweep_out_dir_is_file_dry", ["sweep", "{sweep_outfile.toml}", "--dry-run"],
     "is not a directory"),
    ("sweep_out_dir_glob_class", ["sweep", "{sweep_glob.toml}"],
     "the sweep directory (out_dir/name)="),
    ("sweep_cell_dir_not_a_run", ["sweep", "{sweep_alien.toml}"], "notes.txt"),
    ("sweep_cell_dir_is_file", ["sweep", "{sweep_cellfile.toml}"],
     "run.rounds=1' exists and is not a directory"),
    # 6b. model options of the wrong type, an empty run name, an existing
    # output directory nothing can be written in (/proc/self: not even root)
    ("model_option_list", ["run", *SYN, "model.width=[4, 8]"], "model.width=[4, 8] (list)"),
    ("model_option_float_for_int", ["run", *SYN, "model.hidden=1.5"], "model.hidden=1.5"),
    ("run_name_empty", ["run", *SYN, "run.name="], "run.name=''"),
    ("run_out_dir_unwritable", ["run", *SYN, "run.out_dir=/proc/self"], "is not writable"),
    ("report_out_unwritable", ["report", "{adir}", "--out", "/proc/self"], "is not writable"),
    ("plot_out_unwritable", ["plot", "{adir}", "--out", "/proc/self"], "is not writable"),
    ("sweep_out_dir_unwritable", ["sweep", "{sweep.toml}", "--out-dir", "/proc/self"],
     "is not writable"),
    ("plot_a_file", ["plot", "{afile}"], "afile' is neither a directory nor a metrics file"),
    # 7. the command line itself (argparse's errors, in the same one line)
    ("run_process_id_alone", ["run", *SYN, "--process-id", "3"],
     "--process-id without --distributed"),
    ("sweep_shard_negative", ["sweep", "{sweep.toml}", "--shard", "-1/2"], "--shard='-1/2'"),
    ("flag_bad_int", ["report", "{adir}", "--last", "abc"], "--last: invalid int value: 'abc'"),
    ("flag_unknown", ["run", *SYN, "--bogus"], "--bogus; see jsfl run --help"),
    ("flag_missing_value", ["landscape", "{adir}", "--grid"], "--grid"),
    ("command_unknown", ["bogus"], "'bogus'"),
    ("command_missing", [], "no command; allowed: run,"),
    ("argument_extra", ["config-reference", "extra"], "extra"),
]


def _fill(text, inputs):
  return re.sub(r"\{([\w.]+)\}", lambda m: inputs[m.group(1)], text)


def _argv(args, inputs):
  return [_fill(a, inputs) for a in args]


def test_there_are_enough_cases():
  assert len(CASES) >= 60
  assert len({c[0] for c in CASES}) == len(CASES)


@pytest.mark.parametrize("argv, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_leaves_nothing(argv, needle, inputs, tmp_path,
                                                         monkeypatch, capsys):
  work = tmp_path / "work"
  work.mkdir()
  monkeypatch.chdir(work)
  lock = rundir.RunLock(inputs["locked"]).acquire() if "{locked}" in " ".join(argv) else None
  try:
    before = _snapshot(inputs["root"])
    code = cli.main(_argv(argv, inputs))
    after = _snapshot(inputs["root"])
  finally:
    if lock is not None:
      lock.release()
  err = capsys.readouterr().err
  lines = err.splitlines()
  assert code == 2, err
  assert len(lines) == 1, err
  assert lines[0].startswith("jsfl: error: "), err
  assert "Traceback" not in err
  assert _fill(needle, inputs) in lines[0], lines[0]
  assert os.listdir(work) == []
  assert after == before


# Errors about a malformed value say what is allowed, in the form every
# option error uses: "<what is wrong>; allowed: <what would do>".
ALLOWED_FORM = ["override_malformed", "override_no_section", "override_empty_section",
                "override_no_equals", "data_dir_missing", "data_dir_is_file",
                "partition_data_missing", "partition_data_is_file", "unknown_section",
                "model_option_unknown", "model_option_list", "run_out_dir_unwritable",
                "run_process_id_alone", "sweep_shard_negative"]


@pytest.mark.parametrize("case", ALLOWED_FORM)
def test_malformed_values_say_what_is_allowed(case, inputs, tmp_path, monkeypatch, capsys):
  argv = next(c[1] for c in CASES if c[0] == case)
  monkeypatch.chdir(tmp_path)
  assert cli.main(_argv(argv, inputs)) == 2
  line = capsys.readouterr().err.strip()
  what, sep, allowed = line.partition("; allowed: ")
  assert sep and what.startswith("jsfl: error: ") and allowed.strip(), line


def test_the_lock_refusal_names_the_holder(inputs, tmp_path, capsys):
  d = tmp_path / "held"
  d.mkdir()
  lock = rundir.RunLock(str(d)).acquire()
  try:
    assert cli.main(["run", *SYN, f"run.dir={d}"]) == 2
  finally:
    lock.release()
  assert f"in use by process {os.getpid()}" in capsys.readouterr().err
  assert os.listdir(d) == []


@pytest.mark.parametrize("argv, needle", [
    (["run", "optim.lr=nan"], "optim.lr=nan"),
    (["run", "--resume", "{edited_lr}"], "optim.lr=-1.0"),
    (["sweep", "{gzip.toml}"], "gzip"),
])
def test_the_real_process_exits_2_with_one_line(argv, needle, inputs, tmp_path):
  env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
  proc = subprocess.run([sys.executable, "-m", "jsfl.cli", *_argv(argv, inputs)],
                        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
                        check=False)
  assert proc.returncode == 2, proc.stderr
  assert proc.stderr.splitlines() == [proc.stderr.strip()] and needle in proc.stderr
  assert os.listdir(tmp_path) == []


def test_a_bug_keeps_its_traceback_and_says_it_is_one(monkeypatch, tmp_path, capsys):
  from jsfl import config

  def broken(*a, **k):
    raise KeyError("internal")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setattr(config, "load_config", broken)
  with pytest.raises(KeyError, match="internal"):  # the traceback follows, as Python prints it
    cli.main(["run", "run.rounds=1"])
  assert "this is a bug in jsfl" in capsys.readouterr().err


def test_a_type_error_inside_a_model_is_a_bug_not_a_config_error(monkeypatch, tmp_path):
  from jsfl.models import base

  def broken(input_shape, num_classes, **options):
    raise TypeError("internal")
  monkeypatch.chdir(tmp_path)
  monkeypatch.setitem(base._REGISTRY, "small_cnn", broken)
  monkeypatch.setattr(base, "_CACHE", {})  # built models are kept by name
  with pytest.raises(TypeError, match="internal"):
    cli.main(["run", *SYN])


def test_a_bug_in_the_real_process_shows_the_traceback_after_the_line(tmp_path):
  script = ("import sys; from jsfl import cli, config\n"
            "def broken(*a, **k): raise KeyError('internal')\n"
            "config.load_config = broken\n"
            "sys.exit(cli.main(['run', 'run.rounds=1']))\n")
  proc = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True,
                        text=True, timeout=300, check=False)
  assert proc.returncode == 1
  first, *rest = proc.stderr.splitlines()
  assert "this is a bug in jsfl" in first
  assert rest[0].startswith("Traceback") and rest[-1] == "KeyError: 'internal'"
